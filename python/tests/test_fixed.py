"""Routes prebuilt at data time, the fixed-capacity exchange, the custom ops and
torch.compile (sparsecp.torch._prebuilt, ops, _compiled)."""
from __future__ import annotations

import pickle
import random

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


def test_a_replay_of_the_fixed_path_moves_nothing_and_checks_its_routes():
    """Replay + routes=: the recorded ids with no collective; another batch's routes raise
    in a replay as outside one (the replay ignored them)."""
    results = results_or_raise(pool_of(4).run(fixed_tasks.replay_with_routes, "spill", {}, 17))
    for result in results:
        assert result["equal"] == [True, True] and result["replay_collectives"] == 0
        assert result["without_routes_equal"]
        assert result["stale"] is not None and "prebuilt for other inputs" in result["stale"]
