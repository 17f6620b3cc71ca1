"""Per-rank tasks of the multi-rank tests (run by multirank.RankPool on gloo ranks).

Every rank builds the same global batch from a seed (self-verifying payloads: any rank
can recompute any row), takes its own contiguous shard, and checks its results locally;
tasks return plain data for the test process to assert on.

Values are small integers (bf16 qr, Wq_b and keys; fp32 weights and RoPE factors in
{-1, 0, 1}), so every dot product is exact and a row's top-k is the same bit for bit
wherever and with whichever kernel it is computed, ties included.
"""
from __future__ import annotations

import contextlib
import os
import random
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import sparsecp.torch as indexer_balance
from sparsecp.torch import IndexerSelector

HEADS, HEAD_DIM, ROPE_DIM, Q_RANK, TOPK, RATIO = 4, 8, 4, 16, 8, 4


def batch_lengths(seed: int, size: int, tokens_per_rank: int) -> tuple[int, ...]:
    """Document lengths (1 to ~3 shards, many short ones) summing to size * tokens_per_rank."""
    rng = random.Random(seed)
    total, lengths = size * tokens_per_rank, []
    while sum(lengths) < total:
        kind = rng.random()
        length = rng.randint(1, 5) if kind < 0.3 else rng.randint(2, tokens_per_rank) if kind < 0.85 \
            else rng.randint(tokens_per_rank, 3 * tokens_per_rank)
        lengths.append(min(length, total - sum(lengths)))
    return tuple(lengths)


@dataclass
class Case:
    lengths: tuple[int, ...]
    qr: torch.Tensor  # [1, local, Q_RANK]
    weights: torch.Tensor  # [1, local, HEADS]
    cos: torch.Tensor  # [1, local, ROPE_DIM // 2]
    sin: torch.Tensor
    selector: IndexerSelector

    @property
    def inputs(self) -> tuple:
        return self.qr, self.weights, (self.cos, self.sin)

    def input_row_bytes(self) -> int:
        return sum(t.shape[-1] * t.element_size() for t in (self.qr, self.weights, self.cos, self.sin))


def make_case(rank: int, size: int, seed: int, tokens_per_rank: int = 48, dtype: torch.dtype = torch.bfloat16,
              lengths: tuple[int, ...] | None = None) -> Case:
    lengths = lengths or batch_lengths(seed, size, tokens_per_rank)
    total = sum(lengths)
    generator = torch.Generator().manual_seed(seed)

    def integers(low: int, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(low, high + 1, shape, generator=generator).float()

    qr = integers(-2, 2, total, Q_RANK).to(dtype)
    weights = integers(-2, 2, total, HEADS)
    cos = integers(-1, 1, total, ROPE_DIM // 2)
    sin = integers(-1, 1, total, ROPE_DIM // 2)
    wq_b = integers(-1, 1, HEADS * HEAD_DIM, Q_RANK).to(dtype)
    keys = integers(-2, 2, sum(n // RATIO for n in lengths), HEAD_DIM).to(dtype)
    local = total // size
    shard = slice(rank * local, (rank + 1) * local)
    return Case(lengths, qr[shard][None], weights[shard][None], cos[shard][None], sin[shard][None],
                IndexerSelector(wq_b, keys, RATIO, TOPK, head_dim=HEAD_DIM, rope_dim=ROPE_DIM, threads=1))


@contextlib.contextmanager
def torch_path(enabled: bool):
    """Send CPU tensors through the pure-torch kernels (the other-device path) while inside."""
    saved = os.environ.get("SPARSECP_TORCH_PATH")
    if enabled:
        os.environ["SPARSECP_TORCH_PATH"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("SPARSECP_TORCH_PATH", None)
        else:
            os.environ["SPARSECP_TORCH_PATH"] = saved


def local_reference(case: Case, rank: int, size: int) -> torch.Tensor:
    """This rank's own rows selected where they are ('none' route: nothing moves)."""
    route = indexer_balance.indexer_route(case.lengths, size, rank, RATIO, "none")
    return case.selector(case.qr, case.weights, (case.cos, case.sin), route.segments)


def balanced_select(rank: int, size: int, seed: int, mode: str, options: dict, dtype_name: str = "bfloat16",
                    use_torch_path: bool = False) -> dict:
    """balanced_indexer_select and the overlapped handles against local selection."""
    case = make_case(rank, size, seed, dtype=getattr(torch, dtype_name))
    group = dist.group.WORLD
    with torch_path(use_torch_path):
        reference = local_reference(case, rank, size)
        indexer_balance.reset_exchange_stats()
        balanced = indexer_balance.balanced_indexer_select(*case.inputs[:2], case.inputs[2], case.selector,
                                                           case.lengths, RATIO, mode, group, **options)
        stats = indexer_balance.exchange_stats()
        route = indexer_balance.indexer_route(case.lengths, size, rank, RATIO, mode, **options)
        expected = indexer_balance.expected_exchange_bytes(route, case.input_row_bytes(), TOPK)

        indexer_balance.reset_exchange_stats()
        exchange = indexer_balance.launch_indexer_inputs(case.qr, case.weights, (case.cos, case.sin), case.lengths,
                                                         RATIO, mode, group, **options)
        qr, weights, cos, sin = exchange.wait()
        second_input_wait = _error_of(exchange.wait)
        selected = case.selector(qr, weights, (cos, sin), exchange.route.segments)[0]
        pending = exchange.launch_result(selected)
        overlapped = pending.wait()
        second_result_wait = _error_of(pending.wait)
        overlapped_stats = indexer_balance.exchange_stats()
    return {
        "balanced_equal": bool(torch.equal(balanced, reference)),
        "overlapped_equal": bool(torch.equal(overlapped.unsqueeze(0), reference)),
        "shape": tuple(balanced.shape),
        "dtype": str(balanced.dtype),
        "bytes": (stats["bytes_sent"], stats["bytes_received"]),
        "exchanges": stats["exchanges"],
        "expected_bytes": (expected.sent, expected.received),
        "overlapped_bytes": (overlapped_stats["bytes_sent"], overlapped_stats["bytes_received"]),
        "worker_rows": (qr.shape[1], route.query_count, exchange.owner_queries),
        "worker_dtypes": tuple(str(t.dtype) for t in (qr, weights, cos, sin)),
        "second_input_wait": second_input_wait,
        "second_result_wait": second_result_wait,
        "rows_moved": len(route.send_rows),
        "reference_checksum": int(reference.long().sum()),
    }


def _error_of(call) -> tuple[str, str] | None:
    try:
        call()
    except Exception as error:
        return type(error).__name__, str(error)
    return None


def mismatched(rank: int, size: int, kind: str, path: str = "select") -> tuple[str, str] | None:
    """One rank (the last) is given different inputs; returns this rank's error."""
    odd = rank == size - 1
    case = make_case(rank, size, seed=7)
    lengths, mode, options = case.lengths, "zigzag", {}
    qr, weights, cos, sin, selector = case.qr, case.weights, case.cos, case.sin, case.selector
    if odd and kind == "lengths":  # same total, different split
        lengths = (lengths[0] + lengths[1], *lengths[2:])
    elif odd and kind == "mode":
        mode = "spill"
    elif odd and kind == "bad_mode":
        mode = "zig-zag"
    elif odd and kind == "width":
        qr = torch.cat([qr, qr[..., :2]], dim=-1)
    elif odd and kind == "dtype":
        cos, sin = cos.double(), sin.double()
    elif odd and kind == "batch":
        qr = qr.expand(2, -1, -1)
    elif odd and kind == "block":
        mode, options = "greedy", {"block_size": 5}
    if kind == "block" and not odd:
        mode, options = "greedy", {"block_size": 4}
    if kind == "node_map":  # spill with a node map on the last rank only
        mode, options = "spill", ({"ranks_per_node": 1} if odd else {})

    def failing_selector(*args: Any) -> Any:
        raise RuntimeError("selector failed on purpose")

    if odd and kind == "selector":
        selector = failing_selector
    group = dist.group.WORLD
    if path == "select":
        return _error_of(lambda: indexer_balance.balanced_indexer_select(
            qr, weights, (cos, sin), selector, lengths, RATIO, mode, group, **options))

    def overlapped() -> None:
        exchange = indexer_balance.launch_indexer_inputs(qr, weights, (cos, sin), lengths, RATIO, mode, group,
                                                         **options)
        worker = exchange.wait()
        selected = selector(*worker[:2], worker[2:], exchange.route.segments)[0]
        if odd and kind == "topk":
            selected = selected[:, :TOPK - 1]
        exchange.launch_result(selected).wait()

    return _error_of(overlapped)


def still_works(rank: int, size: int) -> bool:
    """After errors, the group still exchanges correctly."""
    return balanced_select(rank, size, 3, "zigzag", {})["balanced_equal"]


# --------------------------------------------------------------------------------------
# Sequence dispatch and gather.


def _dispatch_routes(kind: str, size: int, boundaries: tuple, local: int) -> list:
    if kind == "swa":
        return [indexer_balance.sliding_window_route(boundaries, local, size, r, 5) for r in range(size)]
    return [indexer_balance.document_prefix_route(boundaries, local, size, r, int(kind[-1])) for r in range(size)]


def _bank_extents(kind: str, routes: list) -> list[tuple[int, int]]:
    return [(route.local_start, route.local_start + route.local_length) for route in routes]


class _AverageGradient(torch.autograd.Function):
    """Identity whose backward averages the gradient over the group: makes a function of a
    replicated input, computed collectively, checkable by gradcheck on every rank."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=dist.group.WORLD)
        return grad / dist.get_world_size()


def dispatch_gradcheck(rank: int, size: int, kind: str, seed: int) -> dict:
    """gradcheck (float64) of sequence_dispatch, and its forward/backward against a
    single-process reference built by slicing the global bank."""
    for attempt in range(100):  # the first batch from `seed` on whose routes some rank receives rows
        lengths = batch_lengths(seed + 1000 * attempt, size, 5)
        local = sum(lengths) // size
        boundaries = (0, *[sum(lengths[:i + 1]) for i in range(len(lengths))])
        routes = _dispatch_routes(kind, size, boundaries, local)
        if size == 1 or any(r.exchange_needed for r in routes):
            break
    extents = _bank_extents(kind, routes)
    bank_rows = extents[-1][1]
    generator = torch.Generator().manual_seed(seed)
    width, dim = 1, 1
    bank = torch.randint(-3, 4, (2, bank_rows, width), generator=generator).double()  # [2, bank, width], dim 1
    route = routes[rank]
    begin, end = extents[rank]

    def distributed(global_bank: torch.Tensor) -> torch.Tensor:
        mine = _AverageGradient.apply(global_bank)[:, begin:end]
        block = indexer_balance.sequence_dispatch(mine, dim, route, dist.group.WORLD)
        return indexer_balance.sequence_gather(_pad_rows(block, dim, max(r.block_rows for r in routes)), dim,
                                               dist.group.WORLD)

    def reference(global_bank: torch.Tensor) -> torch.Tensor:
        blocks = [global_bank[:, r.global_start:r.global_end] for r in routes]
        most = max(r.block_rows for r in routes)
        return torch.cat([_pad_rows(b, dim, most) for b in blocks], dim=dim)

    probe = bank.clone().requires_grad_()
    out = distributed(probe)
    ref_input = bank.clone().requires_grad_()
    ref = reference(ref_input)
    grad_out = torch.randint(-3, 4, out.shape, generator=generator).double()
    out.backward(grad_out)
    ref.backward(grad_out)
    passed = torch.autograd.gradcheck(distributed, (bank.clone().requires_grad_(),), eps=1e-6, atol=1e-8)
    return {"forward_equal": bool(torch.equal(out, ref)),
            "backward_equal": bool(torch.equal(probe.grad, ref_input.grad)), "gradcheck": bool(passed),
            "exchange": bool(route.exchange_needed), "block_rows": route.block_rows}


def _pad_rows(tensor: torch.Tensor, dim: int, rows: int) -> torch.Tensor:
    pad = rows - tensor.shape[dim]
    if not pad:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = pad
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=dim)


def gather_gradcheck(rank: int, size: int, seed: int) -> dict:
    """gradcheck (float64) of sequence_gather on a replicated input, and its backward (a SUM
    reduce-scatter) against the sum of every rank's upstream gradient."""
    generator = torch.Generator().manual_seed(seed)
    local, width = 2, 2
    bank = torch.randint(-3, 4, (width, size * local), generator=generator).double()  # gather along dim -1

    def distributed(global_bank: torch.Tensor) -> torch.Tensor:
        mine = _AverageGradient.apply(global_bank)[:, rank * local:(rank + 1) * local]
        return indexer_balance.sequence_gather(mine, -1, dist.group.WORLD)

    passed = torch.autograd.gradcheck(distributed, (bank.clone().requires_grad_(),), eps=1e-6, atol=1e-8)
    mine = bank[:, rank * local:(rank + 1) * local].clone().requires_grad_()
    out = indexer_balance.sequence_gather(mine, -1, dist.group.WORLD)
    grads = [torch.randint(-3, 4, out.shape, generator=torch.Generator().manual_seed(seed * 100 + r)).double()
             for r in range(size)]
    out.backward(grads[rank])
    expected = sum(grads)[:, rank * local:(rank + 1) * local]
    return {"forward_equal": bool(torch.equal(out, bank)), "backward_equal": bool(torch.equal(mine.grad, expected)),
            "gradcheck": bool(passed)}


def selection_time_refit(rank: int, size: int, seed: int) -> dict:
    """The handle's selection time and step_cost_samples feeding a CostModelRefit."""
    import sparsecp
    import sparsecp.torch as sct

    case = make_case(rank, size, seed, tokens_per_rank=256)
    group = dist.group.WORLD
    refit = sparsecp.CostModelRefit(sparsecp.CostModel.linear(0, 1, 0, TOPK), 4)
    steps = []
    for _ in range(2):
        exchange = indexer_balance.launch_indexer_inputs(case.qr, case.weights, (case.cos, case.sin), case.lengths,
                                                         RATIO, "spill", group, cost_model=refit.model)
        before_wait = exchange.selection_seconds
        qr, weights, cos, sin = exchange.wait()
        before_launch = exchange.selection_seconds
        for _ in range(3):  # enough CPU work to be timed
            selected = case.selector(qr, weights, (cos, sin), exchange.route.segments)[0]
        pending = exchange.launch_result(selected)
        pending.wait()
        seconds = exchange.selection_seconds
        samples = sct.step_cost_samples(exchange, RATIO, TOPK, group)
        refit.add_step(samples)
        route = exchange.route
        tasks = [(i, (s[3] - s[2]) * RATIO + s[4] - (s[1] - s[0]), (s[3] - s[2]) * RATIO + s[4])
                 for i, s in enumerate(route.segments)]
        steps.append({"before": (before_wait, before_launch), "seconds": seconds, "samples": samples,
                      "own_sums": tuple(float(v) for v in sparsecp.cost_sample(tasks, RATIO, TOPK))})
    return {"steps": steps, "unit": refit.model.unit, "kept_previous": refit.kept_previous,
            "refit_samples": refit.samples}


def handles(rank: int, size: int) -> dict:
    """Single-use gather handles and the deferred launch."""
    group = dist.group.WORLD
    tensor = torch.full((2, 3), float(rank))
    launches = []

    def launcher() -> indexer_balance.SequenceGatherHandle:
        launches.append(1)
        return indexer_balance.launch_sequence_gather(tensor, 0, group)

    deferred = indexer_balance.DeferredBankLaunch(launcher)
    first = deferred.start()
    same = deferred.start() is first and deferred.launcher is None
    gathered = deferred.wait()
    second = _error_of(deferred.wait)
    expected = torch.cat([torch.full((2, 3), float(r)) for r in range(size)])
    return {"same_handle": same, "launches": len(launches), "equal": bool(torch.equal(gathered, expected)),
            "second_wait": second}


def dispatch_errors(rank: int, size: int) -> dict:
    """Seed texts of sequence_dispatch's checks, and a rank with a bad tensor."""
    lengths = batch_lengths(11, size, 6)
    local = sum(lengths) // size
    boundaries = (0, *[sum(lengths[:i + 1]) for i in range(len(lengths))])
    route = indexer_balance.sliding_window_route(boundaries, local, size, rank, 3)
    group = dist.group.WORLD
    result = {"dim": _error_of(lambda: indexer_balance.sequence_dispatch(torch.zeros(local, 2), 2, route, group))}
    if route.exchange_needed:
        rows = local + 1 if rank == size - 1 else local
        result["one_bad"] = _error_of(lambda: indexer_balance.sequence_dispatch(torch.zeros(rows, 2), 0, route, group))
    return result


def dispatch_disagreements(rank: int, size: int) -> dict:
    """Rank 0 builds its KV route from other inputs than its peers (window, boundaries,
    ratio, one rank needing no exchange, a deferred launch, gather shard lengths); after
    each case an unrelated all_reduce must still pair correctly."""
    group = dist.group.WORLD
    local = 16
    one_document = (0, size * local)
    rows = torch.arange(local * 2, dtype=torch.float64).reshape(local, 2) + rank * 100

    def intact() -> list:
        values = torch.tensor([100, 200 + rank, 300], dtype=torch.int64)
        dist.all_reduce(values, group=group)
        return values.tolist()

    def case(run: Any) -> dict:
        return {"error": _error_of(run), "after": intact()}

    window = indexer_balance.sliding_window_route(one_document, local, size, rank, 4 if rank == 0 else 12)
    cut = indexer_balance.sliding_window_route((0, 5 if rank == 0 else 9, size * local), local, size, rank, 8)
    ratio = 1 if rank == 0 else 2
    prefix = indexer_balance.document_prefix_route(one_document, local, size, rank, ratio)
    owners = indexer_balance.compressed_owner_offsets(one_document, ratio, local)
    compressed = torch.zeros(owners[rank + 1] - owners[rank], 2, dtype=torch.float64)
    per_shard = tuple(r * local for r in range(size + 1))
    lone = indexer_balance.sliding_window_route(per_shard if rank == 0 else one_document, local, size, rank, 8)
    deferred = indexer_balance.DeferredBankLaunch(
        lambda: indexer_balance.launch_sequence_dispatch(rows, 0, window, group))
    gather_rows = torch.zeros(local + (1 if rank == 0 else 0), 2, dtype=torch.float64)
    return {
        "window": case(lambda: indexer_balance.sequence_dispatch(rows, 0, window, group)),
        "boundaries": case(lambda: indexer_balance.sequence_dispatch(rows, 0, cut, group)),
        "ratio": case(lambda: indexer_balance.sequence_dispatch(compressed, 0, prefix, group)),
        "lone": case(lambda: indexer_balance.sequence_dispatch(rows, 0, lone, group)),
        "lone_exchange": lone.exchange_needed,
        "deferred": case(deferred.wait),
        "gather": case(lambda: indexer_balance.sequence_gather(gather_rows, 0, group)),
    }


# --------------------------------------------------------------------------------------
# The indexer training step (python/examples/train_indexer_step.py).


def _train_example() -> Any:
    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import train_indexer_step

    return train_indexer_step


def train_indexer_step(rank: int, size: int, mode: str, seed: int, config: dict,
                       owner_load: tuple[float, ...] | None = None) -> dict:
    """One training step of the example's indexer layer (spill / auto planned with
    ``owner_load`` when given); tensors come back as numpy arrays."""
    example = _train_example()
    result = example.rank_step(rank, size, example.IndexerConfig(**config), mode, seed, owner_load)
    return {"loss": result.loss, "topk": result.topk.numpy(), "rows_selected": result.rows_selected,
            "grads": {name: g.numpy() for name, g in result.grads.items()},
            "params": {name: p.numpy() for name, p in result.params.items()}}
