"""Per-rank tasks of the prebuilt-routes / fixed-capacity / torch.compile tests
(test_fixed.py), run by multirank.RankPool on gloo ranks. Batches and payloads come from
rank_tasks (small integers: every dot product exact, so ids are bit-identical whatever
the path)."""
from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist
from rank_tasks import HEAD_DIM, HEADS, RATIO, ROPE_DIM, batch_lengths, make_case

import sparsecp
import sparsecp.torch as sct
from sparsecp.torch import IndexerSelector
from sparsecp.torch.select import _project_torch

TOKENS_PER_RANK = 48
KL_TOPK = 32  # >= every batch's key count (sum(n // RATIO) <= 2 * 48 / 4): the KL's TopK rule


class CollectiveLog:
    """Records (output shape, input shape, output data_ptr, input data_ptr) of every
    ``dist.all_to_all_single`` while active."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._original = dist.all_to_all_single

    def __enter__(self) -> CollectiveLog:
        original = self._original

        def recording(output: torch.Tensor, input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((tuple(output.shape), tuple(input.shape), output.data_ptr(), input.data_ptr()))
            return original(output, input, *args, **kwargs)

        dist.all_to_all_single = recording
        return self

    def __exit__(self, *exc: Any) -> None:
        dist.all_to_all_single = self._original


def fixed_steps(rank: int, size: int, mode: str, options: dict, seed: int, steps: int) -> dict:
    """``steps`` different batches at one capacity: the collective tensors of every step,
    the results against the dynamic path, planning calls during the prebuilt launches."""
    group = dist.group.WORLD
    batches = [batch_lengths(seed + step, size, TOKENS_PER_RANK) for step in range(steps)]
    capacity = sct.fixed_capacity(batches, size, [RATIO], mode, **options)
    signatures, equal, overlapped_equal, planning_calls, moved = [], [], [], [], []
    for step, lengths in enumerate(batches):
        case = make_case(rank, size, seed + step, lengths=lengths)
        # Built as a data-loader worker would, handed over pickled.
        prebuilt = sct.prebuild(lengths, size, rank, [RATIO], mode, **options, capacity=capacity)
        routes = pickle.loads(pickle.dumps(prebuilt))
        moved.append(routes.layer(RATIO).rows_moved)
        dynamic = sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO, mode,
                                              group, **options)
        before = sct.indexer_route.cache_info()
        with CollectiveLog() as log:
            fixed = sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO,
                                                mode, group, routes=routes, **options).clone()
            exchange = sct.launch_indexer_inputs(case.qr, case.weights, (case.cos, case.sin), lengths, RATIO, mode,
                                                 group, routes=routes, **options)
            qr, weights, cos, sin = exchange.wait()
            selected = case.selector(qr, weights, (cos, sin), exchange.route.segments)[0]
            overlapped = exchange.launch_result(selected).wait().clone()
        after = sct.indexer_route.cache_info()
        planning_calls.append((after.hits + after.misses) - (before.hits + before.misses))
        signatures.append(log.calls)
        equal.append(bool(torch.equal(fixed, dynamic)))
        overlapped_equal.append(bool(torch.equal(overlapped.unsqueeze(0), dynamic)))
    return {"capacity": capacity, "signatures": signatures, "equal": equal, "overlapped_equal": overlapped_equal,
            "planning_calls": planning_calls, "rows_moved": moved}


def over_capacity(rank: int, size: int, mode: str, options: dict, seed: int) -> dict:
    """A batch needing more rows than the capacity; ranks given different capacities."""
    group = dist.group.WORLD
    lengths = batch_lengths(seed, size, TOKENS_PER_RANK)
    needed = sct.prebuild(lengths, size, rank, [RATIO], mode, **options).rows_needed
    out: dict[str, Any] = {"needed": needed}
    try:
        sct.prebuild(lengths, size, rank, [RATIO], mode, **options, capacity=needed - 1)
        out["over"] = None
    except ValueError as error:
        out["over"] = str(error)
    case = make_case(rank, size, seed, lengths=lengths)
    routes = sct.prebuild(lengths, size, rank, [RATIO], mode, **options, capacity=needed + (8 if rank == 0 else 16))
    try:
        sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO, mode, group,
                                    routes=routes, **options)
        out["disagree"] = None
    except ValueError as error:
        out["disagree"] = str(error)
    other = sct.prebuild(lengths, size, rank, [RATIO], mode, **options, capacity=needed)
    try:  # routes of another batch than the call's
        sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector, lengths[::-1], RATIO, mode,
                                    group, routes=other, **options)
        out["other_batch"] = None
    except ValueError as error:
        out["other_batch"] = str(error)
    # A second launch on the same staging before the first is waited on: raises everywhere.
    routes = sct.prebuild(lengths, size, rank, [RATIO], mode, **options, capacity=needed)
    launch = (case.qr, case.weights, (case.cos, case.sin), lengths, RATIO, mode, group)
    first = sct.launch_indexer_inputs(*launch, routes=routes, **options)
    try:
        sct.launch_indexer_inputs(*launch, routes=routes, **options)
        out["in_flight"] = None
    except RuntimeError as error:
        out["in_flight"] = str(error)
    qr, weights, cos, sin = first.wait()
    first.launch_result(case.selector(qr, weights, (cos, sin), first.route.segments)[0]).wait()
    # The group still works afterwards.
    routes = sct.prebuild(lengths, size, rank, [RATIO], mode, **options, capacity=needed)
    result = sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO, mode,
                                         group, routes=routes, **options)
    reference = sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO, mode,
                                            group, **options)
    out["after_equal"] = bool(torch.equal(result, reference))
    return out


def kl_inputs(rank: int, owner_rows: int, keys: int, seed: int) -> tuple[torch.Tensor, ...]:
    """The owner-side KL inputs (index Q, K bank, weights as leaves; teacher Q, K, sinks)."""
    generator = torch.Generator().manual_seed(1000 * seed + rank)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator)

    heads_main, dim_main = 2, 8
    return (normal(1, owner_rows, HEADS, HEAD_DIM).requires_grad_(), normal(1, keys, HEAD_DIM).requires_grad_(),
            normal(1, owner_rows, HEADS).requires_grad_(), normal(1, heads_main, owner_rows, dim_main),
            normal(1, keys, dim_main), normal(heads_main))


def compiled_step(rank: int, size: int, mode: str, options: dict, seed: int, backend: str) -> dict:
    """launch -> select -> result -> KL -> backward, eager and torch.compile(fullgraph=True)."""
    import torch._dynamo

    group = dist.group.WORLD
    lengths = batch_lengths(seed, size, TOKENS_PER_RANK)
    case = make_case(rank, size, seed, lengths=lengths)
    capacity = sct.fixed_capacity([lengths], size, [RATIO], mode, **options)
    routes = sct.prebuild(lengths, size, rank, [RATIO], mode, **options, capacity=capacity)
    from sparsecp.torch import _prebuilt

    staging_before = len(_prebuilt._STAGING)
    index = sct.fixed_step_indices(case.qr, case.weights, (case.cos, case.sin), lengths, RATIO, mode, group,
                                   routes=routes, **options)
    layer = routes.layer(RATIO)
    assert layer.indices is not None
    worker_rows, owner_rows = layer.indices.worker_rows, layer.indices.owner_rows
    wq_b, key = case.selector.wq_b, case.selector.key

    def step(qr: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             index: sct.FixedIndexTensors, kl: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        worker_qr, worker_weights, worker_cos, worker_sin = sct.fixed_inputs_to_workers(
            [qr, weights, cos, sin], index, worker_rows, group)
        query = _project_torch(worker_qr, wq_b, worker_cos, worker_sin, HEAD_DIM, ROPE_DIM)
        ids = torch.ops.sparsecp.select_rows(query, key, worker_weights, index.key_begin, index.visible, KL_TOPK)
        owner_ids = sct.fixed_results_to_owners(ids, index, owner_rows, group)
        loss = sct.shared_compressed_indexer_kl_loss(*kl[:3], kl[3], kl[4], owner_ids[None], kl[5],
                                                     attention_scale=8 ** -0.5, loss_coeff=1.0)
        return loss, owner_ids

    def run(function: Any) -> tuple[torch.Tensor, ...]:
        kl = kl_inputs(rank, owner_rows, key.shape[0], seed)
        loss, ids = function(case.qr, case.weights, case.cos, case.sin, index, kl)
        loss.backward()
        return (loss.detach(), ids, *(tensor.grad for tensor in kl[:3]))

    eager = run(step)
    torch._dynamo.reset()
    compiled = run(torch.compile(step, fullgraph=True, backend=backend))
    selector = IndexerSelector(wq_b, key, RATIO, KL_TOPK, head_dim=HEAD_DIM, rope_dim=ROPE_DIM, threads=1)
    dynamic = sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], selector, lengths, RATIO, mode, group,
                                          **options)
    return {"equal": [bool(torch.equal(a, b)) for a, b in zip(eager, compiled)],
            "dynamic_equal": bool(torch.equal(eager[1], dynamic[0])),
            "staging_made": len(_prebuilt._STAGING) - staging_before,  # the functional path needs none
            "loss": float(eager[0]), "ids_checksum": int(eager[1].long().sum())}


def run_readme(rank: int, size: int, snippets: list[str]) -> dict:
    """The README's PyTorch snippets, then its training-loop ones, in one namespace (their
    asserts are the checks)."""
    import functools

    namespace: dict[str, Any] = {"__name__": "readme"}
    original = torch.compile
    # As written, but on the aot_eager backend (tracing, fake kernels, AOT autograd, no
    # inductor codegen): inductor on CPU takes minutes here. benchmarks/compiled_step.py
    # runs inductor.
    torch.compile = functools.partial(original, backend="aot_eager")  # type: ignore[assignment]
    try:
        for index, snippet in enumerate(snippets):
            exec(compile(snippet, f"README.md snippet {index + 1}", "exec"), namespace)  # noqa: S102 (the README)
    finally:
        torch.compile = original  # type: ignore[assignment]
    return {"capacity": namespace["capacity"], "compiled_loss": float(namespace["compiled_loss"]),
            "loss": float(namespace["loss"])}


def shared_staging(rank: int, size: int, mode: str, options: dict, seed: int) -> dict:
    """Two layers on one batch and capacity share the staging buffers: layer B launched
    while layer A's result is pending (would overwrite A's result rows and index tensors)
    raises on every rank, A's result stays its own, and B runs once A is finished; a
    dropped unfinished step frees the buffers."""
    group = dist.group.WORLD
    lengths = batch_lengths(seed, size, TOKENS_PER_RANK)
    first, second = make_case(rank, size, seed, lengths=lengths), make_case(rank, size, seed + 1, lengths=lengths)
    capacity = sct.fixed_capacity([lengths], size, [RATIO], mode, **options)
    routes = sct.prebuild(lengths, size, rank, [RATIO], mode, **options, capacity=capacity)

    def launch(case: Any) -> Any:
        return sct.launch_indexer_inputs(case.qr, case.weights, (case.cos, case.sin), lengths, RATIO, mode, group,
                                         routes=routes, **options)

    def select(case: Any, exchange: Any) -> torch.Tensor:
        qr, weights, cos, sin = exchange.wait()
        return case.selector(qr, weights, (cos, sin), exchange.route.segments)[0]

    def dynamic(case: Any) -> torch.Tensor:
        return sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO, mode,
                                           group, **options)[0]

    out: dict[str, Any] = {}
    exchange_a = launch(first)
    pending_a = exchange_a.launch_result(select(first, exchange_a))
    try:
        exchange_b = launch(second)
        pending_b = exchange_b.launch_result(select(second, exchange_b))
        out["second_launch"] = None
    except RuntimeError as error:
        out["second_launch"], pending_b = str(error), None
    out["first_equal"] = bool(torch.equal(pending_a.wait(), dynamic(first)))
    if pending_b is None:
        exchange_b = launch(second)
        pending_b = exchange_b.launch_result(select(second, exchange_b))
    out["second_equal"] = bool(torch.equal(pending_b.wait(), dynamic(second)))
    abandoned = launch(first)  # inputs waited, result never launched: dropping it frees the buffers
    abandoned.wait()
    del abandoned
    exchange = launch(second)
    out["after_drop_equal"] = bool(torch.equal(exchange.launch_result(select(second, exchange)).wait(),
                                               dynamic(second)))
    return out


def dropped_unwaited_launch(rank: int, size: int, mode: str, options: dict, seed: int) -> dict:
    """Issue 30: a fixed-capacity launch whose handles are dropped before ``wait()`` (an
    exception while rows travel, caught by a loop that skips the batch) left the buffers in
    flight: every later launch raised "has not been waited on". Now the next launch waits for
    what the dropped step left travelling and runs; so does one dropped after its result was
    launched."""
    group = dist.group.WORLD
    lengths = batch_lengths(seed, size, TOKENS_PER_RANK)
    first, second = make_case(rank, size, seed, lengths=lengths), make_case(rank, size, seed + 1, lengths=lengths)
    capacity = sct.fixed_capacity([lengths], size, [RATIO], mode, **options)
    routes = sct.prebuild(lengths, size, rank, [RATIO], mode, **options, capacity=capacity)

    def launch(case: Any) -> Any:
        return sct.launch_indexer_inputs(case.qr, case.weights, (case.cos, case.sin), lengths, RATIO, mode, group,
                                         routes=routes, **options)

    def step(case: Any) -> torch.Tensor:
        exchange = launch(case)
        qr, weights, cos, sin = exchange.wait()
        return exchange.launch_result(case.selector(qr, weights, (cos, sin), exchange.route.segments)[0]).wait()

    def dynamic(case: Any) -> torch.Tensor:
        return sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO, mode,
                                           group, **options)[0]

    def failing_layer(case: Any, result_launched: bool) -> None:
        exchange = launch(case)
        if result_launched:  # the result launched too, never waited for
            qr, weights, cos, sin = exchange.wait()
            exchange.launch_result(case.selector(qr, weights, (cos, sin), exchange.route.segments)[0])
        raise KeyError("a failure while the rows travel")

    out: dict[str, Any] = {"skipped": 0, "errors": []}
    for attempt in range(2):
        try:
            failing_layer(first, attempt == 1)
        except KeyError:
            out["skipped"] += 1  # the loop skips the batch; the layer's handles are gone
        try:
            out[f"next_equal_{attempt}"] = bool(torch.equal(step(second), dynamic(second)))
        except RuntimeError as error:
            out["errors"].append(str(error))
    # Handles the loop still holds: abort() frees the buffers (inputs in flight, then a
    # launched result).
    exchange = launch(first)
    exchange.abort()
    out["after_abort_equal"] = bool(torch.equal(step(second), dynamic(second)))
    exchange = launch(first)
    qr, weights, cos, sin = exchange.wait()
    pending = exchange.launch_result(first.selector(qr, weights, (cos, sin), exchange.route.segments)[0])
    pending.abort()
    out["after_result_abort_equal"] = bool(torch.equal(step(second), dynamic(second)))
    return out


def one_rank_rejects_its_routes(rank: int, size: int, mode: str, options: dict, seed: int) -> tuple[str, str] | None:
    """The last rank passes another batch's prebuilt routes: it raises its own error, and its
    peers name it and its reason (they reported a difference made up from an empty
    fingerprint: "rank 1 has 0 documents ... CP size 1 ... mode 'none'")."""
    group = dist.group.WORLD
    lengths = batch_lengths(seed, size, TOKENS_PER_RANK)
    case = make_case(rank, size, seed, lengths=lengths)
    given = lengths[::-1] if rank == size - 1 else lengths
    routes = sct.prebuild(given, size, rank, [RATIO], mode, **options)
    try:
        sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO, mode, group,
                                    routes=routes, **options)
    except ValueError as error:
        return type(error).__name__, str(error)
    return None


def cost_model_routes_pickle_and_replay(rank: int, size: int, seed: int) -> dict:
    """Issue 30 item 1: routes prebuilt with a CostModel did not pickle (the README says they
    pickle for data-loader workers), and an equal but distinct model failed the prebuilt and
    replay checks ("differ in params"). Prebuild with one model, hand the routes over pickled,
    run and record with an equal model made apart, replay with a third."""
    group = dist.group.WORLD
    lengths = batch_lengths(seed, size, TOKENS_PER_RANK)
    case = make_case(rank, size, seed, lengths=lengths)

    def model() -> Any:
        return sparsecp.CostModel.linear(5.0, 1.0, 0.5, 32)

    capacity = sct.fixed_capacity([lengths], size, [RATIO], "spill", cost_model=model())
    routes = pickle.loads(pickle.dumps(sct.prebuild(lengths, size, rank, [RATIO], "spill", capacity=capacity,
                                                    cost_model=model())))
    select_args = (*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO, "spill", group)
    replay = sct.SelectionReplay()
    with replay.record():
        recorded = sct.balanced_indexer_select(*select_args, routes=routes, cost_model=model())
    with replay.replay():
        replayed = sct.balanced_indexer_select(*select_args, routes=routes, cost_model=model())
    planned = sct.balanced_indexer_select(*select_args, cost_model=model())
    return {"replay_equal": bool(torch.equal(recorded, replayed)),
            "planned_equal": bool(torch.equal(recorded, planned))}


def replay_with_routes(rank: int, size: int, mode: str, options: dict, seed: int) -> dict:
    """Record the fixed-capacity path (both entry points), replay it: the recorded ids, no
    collective; a replay given another batch's routes raises as outside a replay (at the
    step's verify_replays)."""
    group = dist.group.WORLD
    lengths = batch_lengths(seed, size, TOKENS_PER_RANK)
    case = make_case(rank, size, seed, lengths=lengths)
    capacity = sct.fixed_capacity([lengths], size, [RATIO], mode, **options)
    routes = sct.prebuild(lengths, size, rank, [RATIO], mode, **options, capacity=capacity)
    stale = sct.prebuild(lengths[::-1], size, rank, [RATIO], mode, **options, capacity=2 * capacity)
    select_args = (*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO, mode, group)

    def overlapped(routes: Any) -> torch.Tensor:
        exchange = sct.launch_indexer_inputs(case.qr, case.weights, (case.cos, case.sin), lengths, RATIO, mode,
                                             group, routes=routes, **options)
        qr, weights, cos, sin = exchange.wait()
        return exchange.launch_result(case.selector(qr, weights, (cos, sin), exchange.route.segments)[0]).wait()

    replay = sct.SelectionReplay()
    with replay.record():
        recorded = (sct.balanced_indexer_select(*select_args, routes=routes, **options), overlapped(routes))
    out: dict[str, Any] = {}
    with CollectiveLog() as log, replay.replay():
        again = (sct.balanced_indexer_select(*select_args, routes=routes, **options), overlapped(routes))
    out["equal"] = [bool(torch.equal(a, b)) for a, b in zip(recorded, again)]
    out["replay_collectives"] = len(log.calls)
    with replay.replay():  # the ids do not depend on the routes: a replay may drop them
        out["without_routes_equal"] = bool(torch.equal(sct.balanced_indexer_select(*select_args, **options),
                                                       recorded[0]))
    try:
        with replay.replay():
            sct.balanced_indexer_select(*select_args, routes=stale, **options)  # held: no collective
        sct.verify_replays(group)  # the step's agreement raises it, on every rank
        out["stale"] = None
    except ValueError as error:
        out["stale"] = str(error)
    return out


def compiled_step_other_layout(rank: int, size: int, seed: int, backend: str) -> dict:
    """Issue 35 item 8: a compiled fixed-capacity step given another layout's numbers on one
    rank (the last passes worker_rows of a capacity 8 rows larger, and another owner_rows):
    that rank raised "key_begin must be int64 [W + 8]" after the first all-to-all and its peer
    waited in the second ("connection closed" when it exited). The compiled functions take the
    layout from the agreed index: every rank's ids are the dynamic path's."""
    group = dist.group.WORLD
    lengths = batch_lengths(seed, size, TOKENS_PER_RANK)
    case = make_case(rank, size, seed, lengths=lengths)
    capacity = sct.fixed_capacity([lengths], size, [RATIO], "spill")
    routes = sct.prebuild(lengths, size, rank, [RATIO], "spill", capacity=capacity)
    index = sct.fixed_step_indices(case.qr, case.weights, (case.cos, case.sin), lengths, RATIO, "spill", group,
                                   routes=routes)
    other = sct.prebuild(lengths, size, rank, [RATIO], "spill", capacity=capacity + 8).layer(RATIO).indices
    layout = routes.layer(RATIO).indices
    assert other is not None and layout is not None
    odd = rank == size - 1
    worker_rows = other.worker_rows if odd else layout.worker_rows
    owner_rows = layout.owner_rows + 3 if odd else layout.owner_rows
    wq_b, key = case.selector.wq_b, case.selector.key

    def step(qr: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             index: sct.FixedIndexTensors) -> torch.Tensor:
        worker_qr, worker_weights, worker_cos, worker_sin = sct.fixed_inputs_to_workers(
            [qr, weights, cos, sin], index, worker_rows, group)
        query = _project_torch(worker_qr, wq_b, worker_cos, worker_sin, HEAD_DIM, ROPE_DIM)
        ids = torch.ops.sparsecp.select_rows(query, key, worker_weights, index.key_begin, index.visible, KL_TOPK)
        return sct.fixed_results_to_owners(ids, index, owner_rows, group)

    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend)(case.qr, case.weights, case.cos, case.sin, index)
    eager = step(case.qr, case.weights, case.cos, case.sin, index)
    selector = IndexerSelector(wq_b, key, RATIO, KL_TOPK, head_dim=HEAD_DIM, rope_dim=ROPE_DIM, threads=1)
    dynamic = sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], selector, lengths, RATIO, "spill", group)
    return {"compiled_equal": bool(torch.equal(compiled, dynamic[0])),
            "eager_equal": bool(torch.equal(eager, dynamic[0])),
            "layout": (index.worker_rows, index.owner_rows, index.slots), "given": (worker_rows, owner_rows)}


def absurd_staging_on_one_rank(rank: int, size: int, seed: int) -> dict:
    """Issue 35 item 8: a capacity whose exchange buffers a rank cannot hold (here: the last
    rank's memory limit lowered to 64 KiB) is refused before anything is allocated, naming the
    capacity and the bytes, on every rank (the launch's agreement: the peers name the rank
    and its reason); the group works on."""
    from sparsecp.torch import _prebuilt

    group = dist.group.WORLD
    lengths = batch_lengths(seed, size, TOKENS_PER_RANK)
    case = make_case(rank, size, seed, lengths=lengths)
    capacity = 4096  # index arrays 8 * (2 * P * C + 2 * Q + 2 * W) bytes: about 200 KiB a rank at P = 2
    routes = sct.prebuild(lengths, size, rank, [RATIO], "spill", capacity=capacity)
    limit = _prebuilt.memory_limit
    if rank == size - 1:
        _prebuilt.memory_limit = lambda device: 64 << 10  # type: ignore[assignment]
    out: dict[str, Any] = {"staging made": len(_prebuilt._STAGING)}
    try:
        sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO, "spill", group,
                                    routes=routes)
        out["error"] = None
    except ValueError as error:
        out["error"] = str(error)
    finally:
        _prebuilt.memory_limit = limit  # type: ignore[assignment]
    out["staging made"] = len(_prebuilt._STAGING) - out["staging made"]
    out["after_equal"] = bool(torch.equal(
        sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO, "spill", group),
        sct.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector, lengths, RATIO, "spill", group,
                                    routes=sct.prebuild(lengths, size, rank, [RATIO], "spill", capacity=64))))
    return out
