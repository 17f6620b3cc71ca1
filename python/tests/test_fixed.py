"""Routes prebuilt at data time, the fixed-capacity exchange, the custom ops and
torch.compile (sparsecp.torch._prebuilt, ops, _compiled)."""
from __future__ import annotations

import pickle
import random
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fixed_tasks  # noqa: E402
from multirank import pool_of, results_or_raise  # noqa: E402
from rank_tasks import RATIO, batch_lengths  # noqa: E402

import sparsecp.torch as sct  # noqa: E402


def test_prebuild_is_host_integers_equal_to_the_planned_routes():
    lengths = batch_lengths(3, 4, 48)
    routes = sct.prebuild(lengths, 4, 2, [4, 128], "spill", capacity=64)
    restored = pickle.loads(pickle.dumps(routes))  # crosses a data-loader worker's pipe
    for ratio in (4, 128):
        assert restored.route(ratio) == sct.indexer_route(lengths, 4, 2, ratio, "spill")
        layer = restored.layer(ratio)
        indices = layer.indices
        assert indices is not None and indices.capacity == 64 and indices.owner_rows == 48
        assert indices.worker_rows == 48 + 3 * 64
        for name in ("send_rows", "receive_rows", "keep_from", "keep_to", "key_begin", "visible"):
            assert getattr(indices, name).dtype == np.int64
        route = layer.route
        real = indices.send_rows[indices.send_rows < indices.owner_rows]
        assert sorted(real.tolist()) == sorted(route.send_rows)
        assert set(indices.keep_from[:len(route.local_sources)].tolist()) == set(route.local_sources)
        assert (indices.visible[route.query_count:] == 0).all()
    with pytest.raises(ValueError, match="no route was prebuilt for ratio 16"):
        routes.layer(16)


def test_fixed_capacity_and_over_capacity_raise_naming_both():
    batches = [batch_lengths(seed, 4, 48) for seed in range(5)]
    capacity = sct.fixed_capacity(batches, 4, [RATIO], "greedy", block_size=16, multiple=1)
    needed = [sct.prebuild(lengths, 4, 0, [RATIO], "greedy", block_size=16).rows_needed for lengths in batches]
    assert capacity == max(needed)
    assert sct.fixed_capacity(batches, 4, [RATIO], "greedy", block_size=16, multiple=8) % 8 == 0
    worst = batches[needed.index(max(needed))]
    with pytest.raises(ValueError, match=rf"needs {max(needed)} rows .* capacity of {max(needed) - 1} rows"):
        sct.prebuild(worst, 4, 1, [RATIO], "greedy", block_size=16, capacity=max(needed) - 1)
    routes = sct.prebuild(worst, 4, 1, [RATIO], "greedy", block_size=16, capacity=capacity)
    padding = sct.padding_bytes(routes, input_row_bytes=100, topk=8)
    slots = 3 * capacity * (100 + 8 * 4)
    assert padding["padding"] + padding["payload"] == slots


@pytest.mark.parametrize("headroom", [float("inf"), float("-inf"), float("nan"), 0.5, "2", True, None])
def test_fixed_capacity_refuses_a_headroom_that_is_not_a_finite_number_from_one(headroom):
    """Issue 35 item 8: headroom=inf raised "cannot convert float infinity to integer"."""
    with pytest.raises(ValueError, match=rf"headroom must be a finite number of at least 1\.0, got "
                                         rf"{re.escape(repr(headroom))}$"):
        sct.fixed_capacity([batch_lengths(3, 2, 48)], 2, [RATIO], "spill", headroom=headroom)
    assert sct.fixed_capacity([batch_lengths(3, 2, 48)], 2, [RATIO], "spill", headroom=np.float32(1.5)) >= 8


@pytest.mark.parametrize("capacity", [2**31, 2**45])
def test_an_absurd_capacity_is_refused_naming_it_and_its_bytes_before_allocating(capacity):
    """Issue 35 item 8: capacity=2**31 failed allocating 32 GiB in prebuild without naming the
    capacity. The padded index arrays' bytes are counted first (8 * (2 P C + 2 Q + 2 W) a
    ratio) and a capacity over half the host's memory is refused naming both."""
    from sparsecp.torch import _prebuilt

    lengths, size = batch_lengths(3, 2, 48), 2
    nbytes = 2 * _prebuilt.index_bytes(size, capacity, 48)  # two ratios
    limit = _prebuilt.memory_limit(None)
    if limit is None or nbytes <= limit:
        pytest.skip(f"this host holds {nbytes} bytes of index arrays")
    with pytest.raises(ValueError, match=rf"^Indexer fixed-capacity exchange: capacity {capacity} rows per peer "
                                         rf"would allocate {nbytes} bytes \([0-9.]+ GiB\) of padded index arrays on "
                                         r"this host, more than half of its [0-9.]+ GiB of memory; this batch's ranks "
                                         r"hold 48 rows each"):
        sct.prebuild(lengths, size, 0, [RATIO, 2 * RATIO], "spill", capacity=capacity)


def test_exchange_buffers_one_rank_cannot_hold_are_refused_on_every_rank():
    results = results_or_raise(pool_of(2).run(fixed_tasks.absurd_staging_on_one_rank, 41, timeout=60))
    own = results[1]["error"]
    assert own is not None and own.startswith("Indexer fixed-capacity exchange: capacity 4096 rows per peer would "
                                              "allocate "), own
    assert " MiB) of exchange buffers on this host, more than half of its 128.0 KiB of memory" in own, own
    assert results[0]["error"] == f"Indexer input exchange aborted: rank 1 rejected its inputs: {own}", results[0]
    for result in results:
        assert result["staging made"] == 0 and result["after_equal"], result


def test_a_compiled_step_given_another_layout_on_one_rank_takes_the_agreed_one():
    results = results_or_raise(pool_of(2).run(fixed_tasks.compiled_step_other_layout, 43, "aot_eager", timeout=240))
    assert results[0]["layout"] == results[1]["layout"]
    assert results[1]["given"] != results[1]["layout"][:2]
    for result in results:
        assert result["compiled_equal"] and result["eager_equal"], result


@pytest.mark.parametrize("mode, options", [("spill", {}), ("greedy", {"block_size": 16})])
def test_ten_batches_one_capacity_same_collective_tensors_and_results(mode, options):
    seed = random.randrange(1 << 16)
    print(f"seed {seed}")
    results = results_or_raise(pool_of(4).run(fixed_tasks.fixed_steps, mode, options, seed, 10))
    for rank, result in enumerate(results):
        assert all(result["equal"]), (rank, result["equal"])
        assert all(result["overlapped_equal"]), (rank, result["overlapped_equal"])
        assert result["planning_calls"] == [0] * 10  # the prebuilt launches plan nothing
        first = result["signatures"][0]
        # Inputs (two dtype groups: bf16 qr, fp32 weights/cos/sin) then the result ids,
        # twice per step (balanced_indexer_select, then the overlapped handles).
        assert len(first) == 6
        for shape_out, shape_in, _, _ in first:
            assert shape_out == shape_in and shape_out[0] == 4 * result["capacity"]
        assert all(signature == first for signature in result["signatures"]), rank
    assert sum(sum(result["rows_moved"]) for result in results) > 0  # rows did travel


def test_over_capacity_and_mismatched_routes_raise_on_every_rank():
    results = results_or_raise(pool_of(4).run(fixed_tasks.over_capacity, "greedy", {"block_size": 16}, 11))
    needed = results[0]["needed"]
    for result in results:
        assert result["needed"] == needed
        assert f"needs {needed} rows" in result["over"] and f"capacity of {needed - 1} rows" in result["over"]
        assert "fixed capacity" in result["disagree"]
        assert "prebuilt for other inputs" in result["other_batch"] or "aborted" in result["other_batch"]
        assert "has not been waited on" in result["in_flight"]
        assert result["after_equal"]


def _selection_inputs(seed: int, rows: int = 12, keys: int = 10, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randint(-2, 3, (rows, 2, 8), generator=generator).to(dtype)
    key = torch.randint(-2, 3, (keys, 8), generator=generator).to(dtype)
    weights = torch.randint(-2, 3, (rows, 2), generator=generator).float()
    key_begin = torch.randint(0, 4, (rows,), generator=generator)
    visible = torch.minimum(torch.randint(0, 8, (rows,), generator=generator), keys - key_begin)
    return query, key, weights, key_begin, visible


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_select_rows_equals_select_indices_on_both_paths(dtype, monkeypatch):
    query, key, weights, key_begin, visible = _selection_inputs(5, dtype=dtype)
    expected = torch.full((12, 6), -1, dtype=torch.int32)
    for row in range(12):
        count = int(visible[row])
        if count:
            begin = int(key_begin[row])
            expected[row] = sct.select_indices(query[row:row + 1], key, weights[row:row + 1],
                                               [(0, 1, begin, begin + count, 0)], 1, 6)[0]
    assert torch.equal(torch.ops.sparsecp.select_rows(query, key, weights, key_begin, visible, 6), expected)
    monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")  # the dense device path, on CPU
    assert torch.equal(torch.ops.sparsecp.select_rows(query, key, weights, key_begin, visible, 6), expected)


def test_opcheck_select_rows(monkeypatch):
    args = (*_selection_inputs(7), 6)
    torch.library.opcheck(torch.ops.sparsecp.select_rows, args)
    monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")
    torch.library.opcheck(torch.ops.sparsecp.select_rows, args)


# Issue 30 item 5: the dense path (any device but CPU, or SPARSECP_TORCH_PATH=1) accepted what
# the CPU path refuses; each case: (what to change, the text both paths give).
_SELECT_ROWS_BAD = {
    "keys past the bank": ({"key_begin": torch.full((12,), 6), "visible": torch.full((12,), 5)},
                           "row 0 sees keys [6, 6 + 5), outside the bank of 10 keys"),
    "visible 2^63 - 1": ({"visible": torch.full((12,), 2**63 - 1)}, "outside the bank of 10 keys"),
    "negative begin": ({"key_begin": torch.full((12,), -1), "visible": torch.zeros(12, dtype=torch.int64)},
                       "row 0 sees keys [-1, -1 + 0)"),
    "float64 query": ({"query": "float64"}, "Indexer query must be float32 or bfloat16, got torch.float64"),
    "float16 query": ({"query": "float16"}, "Indexer query must be float32 or bfloat16, got torch.float16"),
    "int query": ({"query": "int32"}, "Indexer query must be float32 or bfloat16, got torch.int32"),
    "topk 0": ({"topk": 0}, "Indexer topk must be a positive integer, got 0"),
    "int32 visible": ({"visible": "int32"}, "Indexer select_rows visible must be int64 [12], got torch.int32"),
    "short key_begin": ({"key_begin": torch.zeros(11, dtype=torch.int64)},
                        "Indexer select_rows key_begin must be int64 [12], got torch.int64 (11,)"),
}


@pytest.mark.parametrize("case", sorted(_SELECT_ROWS_BAD))
def test_select_rows_refuses_the_same_bad_inputs_on_every_path(case, monkeypatch):
    changes, text = _SELECT_ROWS_BAD[case]
    query, key, weights, key_begin, visible = _selection_inputs(5)
    arguments = {"query": query, "key": key, "weights": weights, "key_begin": key_begin, "visible": visible,
                 "topk": 6}
    for name, value in changes.items():
        arguments[name] = arguments[name].to(getattr(torch, value)) if isinstance(value, str) else value
    for path in ("0", "1"):  # the CPU kernel, then the dense device path
        monkeypatch.setenv("SPARSECP_TORCH_PATH", path)
        with pytest.raises(ValueError) as raised:
            torch.ops.sparsecp.select_rows(*arguments.values())
        assert text in str(raised.value), (path, str(raised.value))


@pytest.mark.parametrize("path", ["0", "1"])
def test_select_rows_records_and_replays_on_every_path(path, monkeypatch):
    """Issue 30 item 5: select_rows was recorded and replayed on CPU only (it called
    select_indices there), not on the dense path: RL with the compiled fixed path on a GPU
    selected anew."""
    monkeypatch.setenv("SPARSECP_TORCH_PATH", path)
    query, key, weights, key_begin, visible = _selection_inputs(5)
    replay = sct.SelectionReplay()
    with replay.record():
        recorded = torch.ops.sparsecp.select_rows(query, key, weights, key_begin, visible, 6)
    assert replay.calls() == ("select_rows",)
    fresh = torch.ops.sparsecp.select_rows(-query, key, weights, key_begin, visible, 6)
    assert not torch.equal(fresh, recorded)
    with replay.replay():  # other activations: the recorded ids
        assert torch.equal(torch.ops.sparsecp.select_rows(-query, key, weights, key_begin, visible, 6), recorded)
    with replay.replay(), pytest.raises(ValueError, match="topk 6 recorded, 5 now"):
        torch.ops.sparsecp.select_rows(query, key, weights, key_begin, visible, 5)


def test_select_indices_and_indexer_selector_compile_fullgraph_and_equal_eager():
    """Issue 30 item 7: torch.compile(fullgraph=True) over a function calling the seed's
    selection API (select_indices, IndexerSelector) stopped with "call to a callable object with
    no traceable __call__"; now they go through custom ops, with segments given as the seed's
    tuples, an IndexerRoute's segments or a numpy table. A replay inside the compiled function
    returns the recording."""
    generator = torch.Generator().manual_seed(31)
    lengths, ratio, topk, heads, head_dim, q_rank = (40, 16, 8), 2, 6, 2, 8, 12
    route = sct.indexer_route(lengths, 2, 1, ratio, "greedy", 8)
    rows, keys = route.query_count, sum(n // ratio for n in lengths)
    query = torch.randn(rows, heads, head_dim, generator=generator)
    key = torch.randn(keys, head_dim, generator=generator)
    weights = torch.rand(rows, heads, generator=generator)
    qr, cos, sin = (torch.randn(1, rows, width, generator=generator) for width in (q_rank, 2, 2))
    selector = sct.IndexerSelector(torch.randn(heads * head_dim, q_rank, generator=generator), key, ratio, topk,
                                   head_dim=head_dim, rope_dim=4)
    as_tuples = tuple(route.segments)
    as_array = np.array(route.segments.array)  # a numpy table of its own (dynamo cannot trace views of C++ memory)

    def layer(q: torch.Tensor, w: torch.Tensor, qr: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (sct.select_indices(q, key, w, route.segments, ratio, topk),
                sct.select_indices(q, key, w, as_tuples, ratio, topk),
                sct.select_indices(q, key, w, as_array, ratio, topk),
                selector(qr, w[None], (cos, sin), route.segments))

    compiled = torch.compile(layer, fullgraph=True)
    eager = layer(query, weights, qr)
    assert all(torch.equal(a, b) for a, b in zip(compiled(query, weights, qr), eager))
    assert all(torch.equal(a, eager[0]) for a in eager[1:3])
    replay = sct.SelectionReplay()
    with replay.record():
        recorded = layer(query, weights, qr)
    with replay.replay():
        replayed = compiled(-query, weights, qr)
    assert all(torch.equal(a, b) for a, b in zip(replayed[:3], recorded[:3]))
    assert not torch.equal(compiled(-query, weights, qr)[0], recorded[0])


def test_opcheck_the_selection_ops():
    query, key, weights, _, _ = _selection_inputs(7)
    segments = [0, 6, 0, 4, 1, 6, 12, 4, 10, 0]
    torch.library.opcheck(torch.ops.sparsecp.select_indices, (query, key, weights, segments, 2, 5, 1))
    generator = torch.Generator().manual_seed(3)
    qr, cos, sin = torch.randn(12, 6, generator=generator), torch.rand(12, 2), torch.rand(12, 2)
    wq_b = torch.randn(16, 6, generator=generator)
    torch.library.opcheck(torch.ops.sparsecp.select_worker_rows,
                          (qr, weights, cos, sin, wq_b, key, segments, 2, 8, 4, 2, 5, True, 1))


def _kl_args(dtype=torch.float32):
    generator = torch.Generator().manual_seed(2)
    rows, keys = 6, 8

    def normal(*shape, grad=False):
        return torch.randn(shape, generator=generator, dtype=dtype).requires_grad_(grad)

    ids = torch.stack([torch.randperm(keys, generator=generator) for _ in range(rows)])[None].int()
    ids[0, 0, 5:] = -1
    return (normal(1, rows, 2, 4, grad=True), normal(1, keys, 4, grad=True), normal(1, rows, 2, grad=True),
            normal(1, 2, rows, 8), normal(1, keys, 8), ids, normal(2), 8 ** -0.5, 0.5, 0, 256, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_indexer_kl_loss_and_same_as_eager(dtype):
    args = _kl_args(dtype)
    torch.library.opcheck(torch.ops.sparsecp.indexer_kl_loss, args)
    loss = sct.ops.indexer_kl_loss(*args[:7], attention_scale=args[7], loss_coeff=args[8])
    (loss * 3).backward()
    grads = [tensor.grad.clone() for tensor in args[:3]]
    fresh = _kl_args(dtype)
    reference = sct.shared_compressed_indexer_kl_loss(*fresh[:7], attention_scale=args[7], loss_coeff=args[8])
    (reference * 3).backward()
    assert torch.equal(loss, reference)
    for grad, tensor in zip(grads, fresh[:3]):
        assert torch.equal(grad, tensor.grad)


def test_compiled_step_fullgraph_equals_eager_on_two_gloo_ranks():
    results = results_or_raise(pool_of(2).run(fixed_tasks.compiled_step, "spill", {}, 5, "aot_eager", timeout=240))
    for result in results:
        assert all(result["equal"]), result["equal"]  # loss, ids, three gradients
        assert result["dynamic_equal"]
        assert result["ids_checksum"] != 0
        assert result["staging_made"] == 0  # fixed_step_indices allocated the eager path's buffers


def _training_loop_snippets(*titles: str) -> list[str]:
    import readme_snippets

    return readme_snippets.training_snippets(*titles)  # docs/guide/training.md


def test_readme_prebuilt_and_compile_snippets_run_on_two_ranks():
    import readme_snippets

    mine = _training_loop_snippets("Prebuilt routes and fixed capacity", "torch.compile")
    assert len(mine) == 2
    snippets = readme_snippets.pytorch_snippets() + mine
    results = results_or_raise(pool_of(2).run(fixed_tasks.run_readme, snippets, timeout=300))
    for result in results:
        assert result["capacity"] >= 8 and result["compiled_loss"] == pytest.approx(result["loss"])


def _gpu_check(*args: str):
    import os
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "..", "examples", "gpu_check.py")
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_gpu_check_without_cuda_fails_clearly():
    run = _gpu_check()
    assert run.returncode == 2 and "no CUDA device" in run.stdout, run.stdout + run.stderr


def test_gpu_check_dry_run_on_cpu_passes():
    run = _gpu_check("--cpu", "--no-compile", "--tokens", "512")  # the script's code, no capture, no compile
    assert run.returncode == 0 and "3 passed, 0 failed" in run.stdout, run.stdout + run.stderr


def test_a_launch_on_staging_still_in_use_raises_and_results_stay_their_own():
    """Two layers of one ratio share the staging: the second launching while the first's
    result is pending raised nowhere and handed the first layer the second's ids."""
    results = results_or_raise(pool_of(4).run(fixed_tasks.shared_staging, "spill", {}, 13))
    for result in results:
        assert result["second_launch"] is not None and "has not been waited on" in result["second_launch"]
        assert result["first_equal"] and result["second_equal"] and result["after_drop_equal"]


def test_a_dropped_unwaited_fixed_launch_leaves_the_next_one_working():
    """Issue 30: handles dropped before wait() left the staging buffers stuck in flight."""
    results = results_or_raise(pool_of(3).run(fixed_tasks.dropped_unwaited_launch, "spill", {}, 23))
    for result in results:
        assert result["errors"] == [] and result["skipped"] == 2
        assert result["next_equal_0"] and result["next_equal_1"]
        assert result["after_abort_equal"] and result["after_result_abort_equal"]


def test_peers_of_a_rank_rejecting_its_routes_report_its_reason():
    """Issue 30 item 6: the peers named a made-up difference, not the rank and its reason."""
    errors = pool_of(3).run(fixed_tasks.one_rank_rejects_its_routes, "spill", {}, 29)
    reason = "routes were prebuilt for other inputs than this call's (they differ in lengths)"
    assert errors[2] == ("ValueError", reason), errors
    for rank in range(2):
        assert errors[rank] == ("ValueError", f"Indexer input exchange aborted: rank 2 rejected its inputs: {reason}")


def test_routes_prebuilt_with_a_cost_model_pickle_and_replay():
    results = results_or_raise(pool_of(2).run(fixed_tasks.cost_model_routes_pickle_and_replay, 37))
    assert all(result == {"replay_equal": True, "planned_equal": True} for result in results), results


def test_a_replay_of_the_fixed_path_moves_nothing_and_checks_its_routes():
    """Replay + routes=: the recorded ids with no collective; another batch's routes raise
    in a replay as outside one (the replay ignored them)."""
    results = results_or_raise(pool_of(4).run(fixed_tasks.replay_with_routes, "spill", {}, 17))
    for result in results:
        assert result["equal"] == [True, True] and result["replay_collectives"] == 0
        assert result["without_routes_equal"]
        assert result["stale"] is not None and "prebuilt for other inputs" in result["stale"]
