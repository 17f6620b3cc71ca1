"""KV routes with autograd over gloo: sequence_dispatch (sliding-window halo, compressed
document prefixes at ratio 1 and 2) and sequence_gather. Each is checked three ways on
every rank: forward and backward equal a single-process reference built by slicing the
global bank (exact on small-integer float64 values), and torch.autograd.gradcheck in
float64 passes on a replicated input (an identity whose backward averages over the group
makes the collective function an ordinary function of that input on every rank)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import rank_tasks  # noqa: E402
from multirank import pool_of, results_or_raise  # noqa: E402

import sparsecp.torch as indexer_balance  # noqa: E402


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["swa", "prefix1", "prefix2"])
def test_sequence_dispatch_gradients(size, kind):
    seed = 20 + size
    print(f"seed {seed}")
    results = results_or_raise(pool_of(size).run(rank_tasks.dispatch_gradcheck, kind, seed, timeout=240))
    for rank, result in enumerate(results):
        assert result["forward_equal"] and result["backward_equal"] and result["gradcheck"], (rank, result)
    if size > 1:
        assert any(r["exchange"] for r in results), "the batch should need an exchange"


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_sequence_gather_gradients(size):
    results = results_or_raise(pool_of(size).run(rank_tasks.gather_gradcheck, 30 + size, timeout=240))
    for rank, result in enumerate(results):
        assert result["forward_equal"] and result["backward_equal"] and result["gradcheck"], (rank, result)


@pytest.mark.parametrize("size", [1, 3])
def test_handles_are_single_use_and_deferred_launch_starts_once(size):
    for result in results_or_raise(pool_of(size).run(rank_tasks.handles)):
        assert result["same_handle"] and result["launches"] == 1 and result["equal"], result
        assert result["second_wait"] == ("RuntimeError", "Sequence gather handle cannot be consumed twice")


@pytest.mark.parametrize("size", [2, 4])
def test_dispatch_errors(size):
    results = results_or_raise(pool_of(size).run(rank_tasks.dispatch_errors, timeout=60))
    for rank, result in enumerate(results):
        assert result["dim"] == ("ValueError", "sequence dispatch dimension is outside the input tensor dimensions")
        if "one_bad" in result:
            if rank == size - 1:
                assert result["one_bad"] == ("ValueError",
                                             "sequence dispatch owner length does not match the bank's physical layout")
            else:
                assert result["one_bad"] == ("ValueError",
                                             f"Sequence dispatch aborted: rank {size - 1} rejected its inputs: "
                                             "sequence dispatch owner length does not match the bank's physical "
                                             "layout")


@pytest.mark.parametrize("size", [2, 3])
def test_disagreeing_routes_raise_on_every_rank(size):
    """Window, boundaries, ratio, one rank needing no exchange, a deferred launch and the
    gather's shard length: every rank raises naming the difference, and the next
    all_reduce still pairs (it used to return a mix of agreement messages)."""
    results = results_or_raise(pool_of(size).run(rank_tasks.dispatch_disagreements, timeout=60))
    after = [100 * size, 200 * size + size * (size - 1) // 2, 300 * size]
    expected = {
        "window": "window differs: rank 1 has 12, rank 0 has 4",
        "boundaries": "document lengths differ at document 0: rank 1 has 9, rank 0 has 5",
        "ratio": "ratio differs: rank 1 has 2, rank 0 has 1",
        "lone": "document lengths differ at document 0",
        "deferred": "window differs: rank 1 has 12, rank 0 has 4",
        "gather": "local length differs",
    }
    for rank, result in enumerate(results):
        assert result["lone_exchange"] == (rank != 0)
        for name, needle in expected.items():
            error = result[name]["error"]
            assert error is not None and error[0] == "ValueError", (rank, name, error)
            assert "CP ranks disagree" in error[1] and needle in error[1], (rank, name, error)
            assert result[name]["after"] == after, (rank, name, result[name])


def test_route_texts_and_values():
    boundaries = (0, 5, 12, 16)
    with pytest.raises(ValueError, match="^SWA dispatch requires positive dimensions and a valid CP rank$"):
        indexer_balance.sliding_window_route(boundaries, 4, 4, 4, 3)
    with pytest.raises(ValueError, match="^SWA document boundaries must span the full contiguous CP sequence$"):
        indexer_balance.sliding_window_route((0, 5, 12, 15), 4, 4, 1, 3)
    with pytest.raises(ValueError,
                       match="^Main KV dispatch requires a supported ratio and equal positive raw CP shards$"):
        indexer_balance.document_prefix_route(boundaries, 4, 4, 1, 4)
    with pytest.raises(ValueError, match="^Main KV document boundaries must span the complete contiguous CP sequence$"):
        indexer_balance.document_prefix_route((0, 12, 5, 16), 4, 4, 1, 2)
    route = indexer_balance.sliding_window_route(boundaries, 4, 4, 2, 3)
    # rank 2 owns raw rows [8, 12); its first token is in document [5, 12): halo [6, 8)
    assert (route.global_start, route.global_end, route.local_start, route.local_length) == (6, 12, 8, 4)
    assert route.receive_splits == [0, 2, 0, 0] and route.exchange_needed
    assert indexer_balance.compressed_document_offsets(boundaries, 2) == (0, 2, 5, 7)
    assert indexer_balance.compressed_owner_offsets(boundaries, 2, 4) == (0, 2, 3, 5, 7)
