"""Balanced selection over gloo on 1-4 ranks: balanced_indexer_select and the overlapped
handles (launch_indexer_inputs -> wait -> launch_result -> wait) equal each rank's local
selection bit for bit, for every seed mode, 'none', spill and auto; the bytes handed to
all_to_all_single equal the route's prediction; second waits raise the seed's texts;
ranks given different or invalid inputs all raise (every task runs under a timeout, so a
hang fails)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

import rank_tasks  # noqa: E402
from multirank import pool_of, results_or_raise  # noqa: E402

MODES = [
    ("none", {}),
    ("zigzag", {}),
    ("greedy", {"block_size": 8}),
    ("hybrid", {"block_size": 8, "zigzag_min_length": 48}),
    ("spill", {}),
    ("spill", {"target_imbalance": 1.05}),
    ("auto", {}),
]


def _check_balanced(results: list, size: int, label: str) -> None:
    for rank, result in enumerate(results):
        where = f"{label}, rank {rank} of {size}"
        assert result["balanced_equal"], where
        assert result["overlapped_equal"], where
        assert result["shape"] == (1, 48, rank_tasks.TOPK) and result["dtype"] == "torch.int32", where
        assert result["bytes"] == result["expected_bytes"], where
        # one all-to-all per dtype group (bf16 qr; fp32 weights, cos, sin), one for the results
        expected_groups = 1 if result["worker_dtypes"][0] == "torch.float32" else 2
        assert result["exchanges"] == expected_groups + 1, where
        assert result["overlapped_bytes"] == result["expected_bytes"], where
        assert result["worker_rows"][0] == result["worker_rows"][1], where
        assert result["worker_rows"][2] == 48, where
        assert result["second_input_wait"] == ("RuntimeError", "Indexer input exchange cannot be consumed twice")
        assert result["second_result_wait"] == ("RuntimeError",
                                                "Indexer communication handle cannot be consumed twice")


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("mode,options", MODES,
                         ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())))
def test_balanced_equals_local_selection(size, mode, options):
    seed = 100 + size
    print(f"seed {seed}")
    results = results_or_raise(pool_of(size).run(rank_tasks.balanced_select, seed, mode, options))
    _check_balanced(results, size, f"mode {mode} {options}, seed {seed}")
    if size > 1 and mode not in ("none",):
        moved = sum(r["rows_moved"] for r in results)
        assert moved > 0 or mode.startswith("spill") or mode == "auto", "the batch should move rows"
    if mode == "none":
        assert all(r["bytes"] == (0, 0) for r in results)


@pytest.mark.parametrize("size,per_node", [(2, 1), (4, 2)])
def test_spill_with_a_node_map_equals_local_selection(size, per_node):
    """spill planned with a node map (``ranks_per_node``) end to end over gloo."""
    seed = 120 + size
    print(f"seed {seed}")
    options = {"ranks_per_node": per_node}
    results = results_or_raise(pool_of(size).run(rank_tasks.balanced_select, seed, "spill", options))
    _check_balanced(results, size, f"spill {options}, seed {seed}")


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("mode,options", [("hybrid", {"block_size": 8, "zigzag_min_length": 48}), ("spill", {})],
                         ids=["hybrid", "spill"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_torch_path_over_gloo(size, mode, options, dtype):
    """The other-device path (pure torch kernels), run on CPU tensors: same results."""
    results = results_or_raise(pool_of(size).run(rank_tasks.balanced_select, 5, mode, options, dtype, True))
    _check_balanced(results, size, f"torch path, mode {mode}, {dtype}")
    cpu = results_or_raise(pool_of(size).run(rank_tasks.balanced_select, 5, mode, options, dtype, False))
    assert [r["reference_checksum"] for r in results] == [r["reference_checksum"] for r in cpu]


DIFFERENCES = [
    ("lengths", "document lengths differ"),
    ("mode", "mode differs"),
    ("width", "qr width differs"),
    ("dtype", "cos dtype differs"),
    ("block", "block size differs"),
    ("node_map", "ranks_per_node differs"),
]


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("kind,named", DIFFERENCES, ids=[kind for kind, _ in DIFFERENCES])
@pytest.mark.parametrize("path", ["select", "overlapped"])
def test_ranks_with_different_inputs_all_raise(size, kind, named, path):
    pool = pool_of(size)
    errors = pool.run(rank_tasks.mismatched, kind, path, timeout=60)
    for rank, error in enumerate(errors):
        assert error is not None, f"rank {rank} did not raise"
        type_name, message = error
        assert type_name == "ValueError", (rank, error)
        assert "Indexer input exchange: CP ranks disagree on the planning inputs" in message, (rank, message)
        assert named in message, (rank, message)
    assert all(results_or_raise(pool.run(rank_tasks.still_works)))


@pytest.mark.parametrize("size", [2, 4])
def test_invalid_input_on_one_rank_raises_everywhere(size):
    pool = pool_of(size)
    errors = pool.run(rank_tasks.mismatched, "batch", "select", timeout=60)
    odd = size - 1
    assert errors[odd] == ("ValueError", "Indexer balance requires batch one and equal contiguous source query shards")
    for rank in range(odd):
        assert errors[rank] == ("ValueError", f"Indexer input exchange aborted: rank {odd} rejected its inputs: "
                                              "Indexer balance requires batch one and equal contiguous source query "
                                              "shards")
    errors = pool.run(rank_tasks.mismatched, "bad_mode", "overlapped", timeout=60)
    assert all(e is not None and e[0] == "ValueError" for e in errors)
    assert "indexer_load_balance must be 'none', 'zigzag', 'greedy' or 'hybrid'" in errors[odd][1]
    assert all(results_or_raise(pool.run(rank_tasks.still_works)))


@pytest.mark.parametrize("size", [2, 3])
def test_selector_failure_and_topk_mismatch_raise_everywhere(size):
    pool = pool_of(size)
    odd = size - 1
    errors = pool.run(rank_tasks.mismatched, "selector", "select", timeout=60)
    assert errors[odd] == ("RuntimeError", "selector failed on purpose")
    for rank in range(odd):
        assert errors[rank] == ("ValueError", f"Indexer result exchange aborted: rank {odd} rejected its inputs: "
                                              "RuntimeError: selector failed on purpose")
    errors = pool.run(rank_tasks.mismatched, "topk", "overlapped", timeout=60)
    for error in errors:
        assert error is not None and error[0] == "ValueError" and "topk differs" in error[1], error
    assert all(results_or_raise(pool.run(rank_tasks.still_works)))


def test_the_handle_times_the_worker_and_its_samples_refit_the_cost_model() -> None:
    """selection_seconds is None until launch_result, then this rank's CPU time; the gathered
    samples are every rank's own sums and time, in rank order, and refit the model."""
    size = 2
    results = results_or_raise(pool_of(size).run(rank_tasks.selection_time_refit, 11))
    for rank, result in enumerate(results):
        for step, figures in enumerate(result["steps"]):
            assert figures["before"] == (None, None), (rank, step)
            assert figures["seconds"] > 0, (rank, step)
            samples = figures["samples"]
            assert len(samples) == size
            assert samples == results[0]["steps"][step]["samples"]  # every rank holds the same list
            own = results[rank]["steps"][step]["own_sums"]  # rows, widths, capped, heap
            assert samples[rank][:3] == own[:3] and samples[rank][4] == own[3]
            assert samples[rank][3] == figures["seconds"]
        # The window holds both steps; a fit (ns) unless this machine's noise got it refused.
        assert result["refit_samples"] == 2 * size
        assert result["unit"] == "ns" or result["kept_previous"]
