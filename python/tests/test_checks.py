"""One integer rule for every public entry point (sparsecp._checks): Python int or numpy
integer, never bool, float or string; every error names the parameter and the value.
Table-driven: each row calls one entry point with one bad argument."""
from __future__ import annotations

import re
import time

import numpy as np
import pytest

import sparsecp
from sparsecp._checks import IntegerArgumentError

LENGTHS = [40, 24, 32, 32]  # 128 tokens on 4 ranks
BOUNDARIES = (0, 40, 64, 96, 128)

# (entry point, call, expected message pattern)
PLANNING_CASES = [
    ("plan cp", lambda: sparsecp.plan(LENGTHS, True, 4), r"cp=True: expected an integer"),
    ("plan cp float", lambda: sparsecp.plan(LENGTHS, 4.0, 4), r"cp=4\.0: expected an integer"),
    ("plan ratio", lambda: sparsecp.plan(LENGTHS, 4, True), r"ratio=True: expected an integer"),
    ("plan ratio str", lambda: sparsecp.plan(LENGTHS, 4, "4"), r"ratio='4': expected an integer"),
    ("plan lengths float", lambda: sparsecp.plan([40, 24, 32.7, 31], 4, 4), r"lengths\[2\]=32\.7: expected"),
    ("plan lengths str", lambda: sparsecp.plan([40, "8", 32, 48], 4, 4), r"lengths\[1\]='8': expected"),
    ("plan lengths bool", lambda: sparsecp.plan([True, 127], 4, 4), r"lengths\[0\]=True: expected"),
    ("plan block bool", lambda: sparsecp.plan(LENGTHS, 4, 4, "greedy", block_size=True),
     r"block_size=True: expected an integer"),
    ("plan block float", lambda: sparsecp.plan(LENGTHS, 4, 4, "greedy", block_size=10.0),
     r"block_size=10\.0: expected an integer"),
    ("plan block huge", lambda: sparsecp.plan(LENGTHS, 4, 4, "greedy", block_size=2**70),
     r"block_size=1180591620717411303424: must be a 64-bit integer"),
    ("plan threshold", lambda: sparsecp.plan(LENGTHS, 4, 4, "hybrid", zigzag_min_length=8.5),
     r"zigzag_min_length=8\.5: expected"),
    ("plan window", lambda: sparsecp.plan(LENGTHS, 4, 4, "lpt-search", window=True), r"window=True: expected"),
    ("plan target", lambda: sparsecp.plan(LENGTHS, 4, 4, "spill", target_imbalance=True),
     r"target_imbalance=True: expected a number"),
    ("route rank", lambda: sparsecp.route("zigzag", LENGTHS, 4, True, 4), r"rank=True: expected"),
    ("route ratio", lambda: sparsecp.route("zigzag", LENGTHS, 4, 0, 4.0), r"ratio=4\.0: expected"),
    ("strategy_params", lambda: sparsecp.strategy_params(snake_block=2.0), r"snake_block=2\.0: expected"),
    ("sliding_window_route window", lambda: sparsecp.sliding_window_route(BOUNDARIES, 32, 4, 1, True),
     r"window=True: expected"),
    ("sliding_window_route boundaries", lambda: sparsecp.sliding_window_route((0, 40.5, 128), 32, 4, 1, 8),
     r"boundaries\[1\]=40\.5: expected"),
    ("document_prefix_route ratio", lambda: sparsecp.document_prefix_route(BOUNDARIES, 32, 4, 1, True),
     r"ratio=True: expected"),
    ("compressed_document_offsets", lambda: sparsecp.compressed_document_offsets(BOUNDARIES, 2.0),
     r"ratio=2\.0: expected"),
    ("compressed_owner_offsets", lambda: sparsecp.compressed_owner_offsets(BOUNDARIES, 2, True),
     r"local_length=True: expected"),
    ("document_boundaries", lambda: sparsecp.document_boundaries([1, 2.5]), r"lengths\[1\]=2\.5: expected"),
    # A tuple of ints beyond 64 bits reached C++ as a TypeError of nanobind's (issue 30's fuzz).
    ("plan lengths tuple beyond 64 bits", lambda: sparsecp.plan((2**64, 8), 2, 4),
     r"lengths\[0\]=18446744073709551616: must be a 64-bit integer"),
    ("generate_batch", lambda: sparsecp.generate_batch("lognormal", 1.5), r"tokens=1\.5: expected"),
]


@pytest.mark.parametrize("name,call,pattern", PLANNING_CASES, ids=[case[0] for case in PLANNING_CASES])
def test_planning_entry_points_refuse_non_integers(name, call, pattern):
    with pytest.raises(IntegerArgumentError, match=pattern) as raised:
        call()
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, TypeError)


def test_numpy_integers_are_integers():
    lengths = np.array(LENGTHS, dtype=np.int32)
    plan = sparsecp.plan(lengths, np.int64(4), np.int16(4), "greedy", block_size=np.int64(8))
    assert plan.work.sum() == sparsecp.plan(LENGTHS, 4, 4, "greedy", block_size=8).work.sum()
    route = sparsecp.sliding_window_route(np.array(BOUNDARIES), np.int64(32), 4, np.int8(1), np.int64(8))
    assert route == sparsecp.sliding_window_route(BOUNDARIES, 32, 4, 1, 8)


torch = pytest.importorskip("torch")
import sparsecp.torch as sct  # noqa: E402


def _selection(rows: int = 8, heads: int = 2, head_dim: int = 8, keys: int = 4):
    generator = torch.Generator().manual_seed(5)
    query = torch.randn(rows, heads, head_dim, generator=generator)
    key = torch.randn(keys, head_dim, generator=generator)
    weights = torch.randn(rows, heads, generator=generator)
    return query, key, weights


Q, K, W = _selection()
SEGMENTS = [(0, 8, 0, 2, 0)]  # 8 rows of one document at ratio 4: positions 0..7
QR = torch.randn(8, 6)
WQ = torch.randn(16, 6)
COS, SIN = torch.ones(8, 2), torch.zeros(8, 2)

TORCH_CASES = [
    ("select_indices ratio", lambda: sct.select_indices(Q, K, W, SEGMENTS, True, 2), r"ratio=True: expected"),
    ("select_indices threads", lambda: sct.select_indices(Q, K, W, SEGMENTS, 4, 2, threads=1.0),
     r"threads=1\.0: expected"),
    ("select_indices segment float", lambda: sct.select_indices(Q, K, W, [(0, 8, 0, 2, 0.9)], 4, 2),
     r"segments\[0\]\[4\]=0\.9: expected"),
    ("select_indices segment 32.7", lambda: sct.select_indices(Q, K, W, [(0, 8, 0, 2.0, 0)], 4, 2),
     r"segments\[0\]\[3\]=2\.0: expected"),
    ("select_indices segment str", lambda: sct.select_indices(Q, K, W, [(0, "8", 0, 2, 0)], 4, 2),
     r"segments\[0\]\[1\]='8': expected"),
    ("select_indices segment array", lambda: sct.select_indices(Q, K, W, np.array([[0, 8, 0, 32.7, 0]]), 4, 2),
     r"segments: expected an integer array, got dtype float64"),
    ("packed ratio", lambda: sct.packed_indexer_select(Q[None], K[None], W[None], SEGMENTS, True, 2),
     r"ratio=True: expected"),
    ("packed topk 0", lambda: sct.packed_indexer_select(Q[None], K[None], W[None], SEGMENTS, 4, 0),
     r"Indexer topk must be a positive integer, got 0"),
    ("csa_tnd_plan ratio", lambda: sct.csa_tnd_plan(SEGMENTS, 4.0), r"ratio=4\.0: expected"),
    ("project head_dim 0", lambda: sct.project_index_query(QR, WQ, COS, SIN, 0, 4), r"head_dim=0: must be at least 1"),
    ("project head_dim bool", lambda: sct.project_index_query(QR, WQ, COS, SIN, True, 4), r"head_dim=True: expected"),
    ("IndexerSelector topk", lambda: sct.IndexerSelector(WQ, K, 4, 2.0, head_dim=8), r"topk=2\.0: expected"),
    ("IndexerSelector ratio", lambda: sct.IndexerSelector(WQ, K, True, 2, head_dim=8), r"ratio=True: expected"),
    ("indexer_task_plan ratio", lambda: sct.indexer_task_plan(tuple(LENGTHS), 4, True, "zigzag"),
     r"ratio=True: expected"),
    ("indexer_task_plan size", lambda: sct.indexer_task_plan(tuple(LENGTHS), 4.0, 4, "zigzag"),
     r"size=4\.0: expected"),
    ("indexer_route rank", lambda: sct.indexer_route(tuple(LENGTHS), 4, True, 4, "zigzag"), r"rank=True: expected"),
    ("indexer_task_plan lengths beyond 64 bits", lambda: sct.indexer_task_plan((2**64,), 1, 4, "greedy"),
     r"lengths\[0\]=18446744073709551616: must be a 64-bit integer"),
    ("torch sliding_window_route", lambda: sct.sliding_window_route((0, 32.7, 128), 32, 4, 1, 8),
     r"boundaries\[1\]=32\.7: expected"),
    ("torch compressed_owner_offsets", lambda: sct.compressed_owner_offsets(BOUNDARIES, True, 32),
     r"ratio=True: expected"),
    # Issue 30: padding_bytes returned negative or float byte counts for these.
    ("padding_bytes negative row", lambda: sct.padding_bytes(_ROUTES(), -100, 8), r"input_row_bytes=-100: must be"),
    ("padding_bytes float row", lambda: sct.padding_bytes(_ROUTES(), 10.5, 8), r"input_row_bytes=10\.5: expected"),
    ("padding_bytes topk 0", lambda: sct.padding_bytes(_ROUTES(), 100, 0), r"topk=0: must be at least 1"),
    ("padding_bytes index bytes", lambda: sct.padding_bytes(_ROUTES(), 100, 8, -4), r"index_bytes=-4: must be"),
    ("padding_bytes float topk", lambda: sct.padding_bytes(_ROUTES(), 100, 8.0), r"topk=8\.0: expected"),
    # Issue 30: a calibrate timer returning None gave "std::bad_cast".
    ("calibrate timer None", lambda: sparsecp.calibrate_cost_model(lambda target, rows, segments: None, 4),
     r"calibrate: the timer must return seconds as a number, got None \(NoneType\)"),
    ("calibrate timer str", lambda: sparsecp.calibrate_cost_model(lambda target, rows, segments: "1", 4),
     r"got '1' \(str\)"),
    ("refit NaN time", lambda: sparsecp.CostModelRefit(sparsecp.CostModel()).add_step([(1, 2, 3, float("nan"))]),
     r"cost sample 0 must have a finite, positive time, got nan s"),
    ("owner_cost huge", lambda: sparsecp.owner_cost(LENGTHS, 4, 4, 1e308, 1), r"coefficient a must be at most 1e\+200"),
]


def _ROUTES():  # noqa: N802  (a constant made on use)
    return sct.prebuild(LENGTHS, 4, 1, [4], "spill", capacity=16)


@pytest.mark.parametrize("name,call,pattern", TORCH_CASES, ids=[case[0] for case in TORCH_CASES])
def test_torch_entry_points_refuse_non_integers(name, call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_ratio_true_is_not_a_cached_ratio_one():
    sct.indexer_task_plan(tuple(LENGTHS), 4, 1, "zigzag")  # cached under ratio=1
    with pytest.raises(ValueError, match=r"ratio=True"):
        sct.indexer_task_plan(tuple(LENGTHS), 4, True, "zigzag")


def test_seed_texts_stay_for_the_seed_options():
    with pytest.raises(ValueError, match=r"^indexer_balance_block_size must be a positive integer$"):
        sct.indexer_task_plan(tuple(LENGTHS), 4, 4, "greedy", block_size=True)
    with pytest.raises(ValueError, match=re.escape(
            "indexer_load_balance='hybrid' requires an explicit positive integer indexer_zigzag_min_length")):
        sct.indexer_task_plan(tuple(LENGTHS), 4, 4, "hybrid", block_size=8, zigzag_min_length=0)


def test_select_indices_topk_too_large_is_the_kernels_error():
    with pytest.raises(ValueError, match=r"Indexer topk 1099511627776 is too large"):
        sct.select_indices(Q, K, W, SEGMENTS, 4, 2**40)


@pytest.mark.parametrize("rows", [2**29, 2**34])
def test_packed_select_checks_segments_before_expanding_rows(rows):
    """A 32-row query with a segment claiming 2**29 (or 2**34) rows: a fast ValueError,
    not seconds and gigabytes of per-row ids (or MemoryError) first."""
    query, key, weights = _selection(rows=32, keys=2**27 // 2**20)
    start = time.perf_counter()
    with pytest.raises(ValueError, match="Indexer segment 0"):
        sct.packed_indexer_select(query[None], key[None], weights[None], [(0, rows, 0, 2**27, 0)], 4, 2)
    assert time.perf_counter() - start < 1.0
