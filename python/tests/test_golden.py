"""Seed parity through the Python API: the 467 golden cases of tests/data/golden_cases.json
(produced by the seed's own indexer_balance.py, tools/golden/make_golden.py), replayed
through the drop-in module (sparsecp.torch.indexer_task_plan / indexer_route) and, for
the successful cases, through sparsecp.plan / sparsecp.route. Plans, every field of every
rank's route and the error texts must match (errors: the seed's text is contained in
ours, as tests/planning/golden_test.cpp checks)."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

import sparsecp

indexer_balance = pytest.importorskip("sparsecp.torch")

DATA = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "golden_cases.json"
CASES = json.loads(DATA.read_text())["cases"]
ROW_LISTS = ("send_rows", "receive_rows", "local_sources", "local_targets")


def expand(runs: list) -> np.ndarray:
    """[first, count] runs back to the row list."""
    if not runs:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(first, first + count, dtype=np.int64) for first, count in runs])


def route_matches(route, expected: dict) -> list[str]:
    """Field names whose values differ (through the seed-compatible tuple views)."""
    wrong = []
    segments = tuple(tuple(s) for s in expected["segments"])
    if route.segments != segments or tuple(route.segments) != segments:
        wrong.append("segments")
    for name in ("input_splits", "output_splits"):
        if getattr(route, name) != tuple(expected[name]):
            wrong.append(name)
    for name in ROW_LISTS:
        if not np.array_equal(np.asarray(getattr(route, name)), expand(expected[name])):
            wrong.append(name)
    if route.query_count != expected["query_count"]:
        wrong.append("query_count")
    return wrong


def inputs(case: dict) -> tuple:
    return (tuple(case["lengths"]), case["cp"], case["ratio"], case["mode"], case["block_size"],
            case["zigzag_min_length"])


@pytest.fixture(autouse=True)
def _fresh_caches():
    indexer_balance.indexer_route.cache_clear()
    indexer_balance.indexer_task_plan.cache_clear()


def test_golden_file_has_every_case():
    assert len(CASES) == 467
    assert sum("routes" in case for case in CASES) == 384


@pytest.mark.parametrize("case", [c for c in CASES if "routes" in c], ids=lambda c: c["id"])
def test_seed_plan_and_routes(case):
    lengths, cp, ratio, mode, block, threshold = inputs(case)
    plan = indexer_balance.indexer_task_plan(lengths, cp, ratio, mode, block, threshold)
    expected_plan = tuple(tuple(indexer_balance.IndexerTask(*task) for task in tasks) for tasks in case["plan"])
    assert plan == expected_plan
    for rank, expected in enumerate(case["routes"]):
        route = indexer_balance.indexer_route(lengths, cp, rank, ratio, mode, block, threshold)
        assert route_matches(route, expected) == [], f"{case['id']} rank {rank}"


@pytest.mark.parametrize("case", [c for c in CASES if "routes" in c], ids=lambda c: c["id"])
def test_sparsecp_plan_and_route_match_the_seed(case):
    """sparsecp's own API (strategy adapters with the same options) gives the seed's result."""
    lengths, cp, ratio, mode, block, threshold = inputs(case)
    options = {k: v for k, v in (("block_size", block), ("zigzag_min_length", threshold)) if v is not None}
    plan = sparsecp.plan(lengths, cp, ratio, mode, **options)
    for rank, tasks in enumerate(case["plan"]):
        assert plan.tasks(rank) == [tuple(task) for task in tasks]
    for rank, expected in enumerate(case["routes"]):
        for route in (sparsecp.route(plan, lengths, cp, rank, ratio), sparsecp.route(mode, lengths, cp, rank, ratio,
                                                                                    **options)):
            wrapped = indexer_balance.IndexerRoute.from_core(route)
            assert route_matches(wrapped, expected) == [], f"{case['id']} rank {rank}"
            assert route.segments.dtype == np.int64 and route.segments.shape == (len(expected["segments"]), 5)


@pytest.mark.parametrize("case", [c for c in CASES if "plan_error" in c], ids=lambda c: c["id"])
def test_seed_errors(case):
    lengths, cp, ratio, mode, block, threshold = inputs(case)
    if case.get("plan_comparable", True):
        if case["plan_error"] is None:
            indexer_balance.indexer_task_plan(lengths, cp, ratio, mode, block, threshold)
        else:
            with pytest.raises(ValueError) as raised:
                indexer_balance.indexer_task_plan(lengths, cp, ratio, mode, block, threshold)
            assert case["plan_error"] in str(raised.value)
    else:  # 'none': sparsecp's no-balancing baseline instead of the seed's rejection
        plan = indexer_balance.indexer_task_plan(lengths, cp, ratio, mode, block, threshold)
        local = sum(lengths) // cp
        assert sum(task.length for task in plan[0]) == local
    rank = case["route_rank"]
    if case.get("route_comparable", True):
        with pytest.raises(ValueError) as raised:
            indexer_balance.indexer_route(lengths, cp, rank, ratio, mode, block, threshold)
        assert case["route_error"] in str(raised.value)
    else:
        route = indexer_balance.indexer_route(lengths, cp, rank, ratio, mode, block, threshold)
        local = sum(lengths) // cp
        assert route.query_count == local and len(route.send_rows) == 0 and sum(route.input_splits) == 0
        assert np.array_equal(route.local_sources.array, np.arange(local))
        assert np.array_equal(route.local_targets.array, np.arange(local))


# Issue 30: the seed's error precedence in two held-out kinds of case, each checked against
# the seed's own module (tools/golden/reindent.py of seeds/001): indexer_route checks the rank
# before it looks at the lengths, and hybrid's lengths come before its block size.
PRECEDENCE = [
    ("route", ((8, 2**64), 2, 5, 4, "zigzag"), "Indexer balance rank must be inside its CP group"),
    ("route", ((8, 8.5), 2, -1, 4, "greedy", 4), "Indexer balance rank must be inside its CP group"),
    ("plan", ((3, 0, 5), 2, 4, "hybrid", -2**64, 1),
     "Indexer balance needs positive document lengths/ratio and an equal contiguous CP partition"),
    ("plan", ((3, 0, 5), 2, 4, "hybrid", 0, 1),
     "Indexer balance needs positive document lengths/ratio and an equal contiguous CP partition"),
    ("plan", ((3, 5), 2, 4, "hybrid", 2**64, 1), "Indexer greedy block size 18446744073709551616 exceeds the local "
     "query count 4"),
]


@pytest.mark.parametrize("kind, arguments, seed_text", PRECEDENCE, ids=lambda value: repr(value)[:40])
def test_the_seeds_error_precedence(kind, arguments, seed_text):
    function = indexer_balance.indexer_route if kind == "route" else indexer_balance.indexer_task_plan
    with pytest.raises(ValueError) as raised:
        function(*arguments)
    assert seed_text in str(raised.value)


def test_an_option_of_true_does_not_hit_the_cache_entry_of_1():
    """``True == 1`` and they hash alike: a plan cached for block_size=1 answered True, and
    the error cached for True answered 1 (the seed's own lru_cache has the same hole)."""
    lengths = (8, 8)
    indexer_balance.indexer_task_plan(lengths, 2, 1, "greedy", 1)
    with pytest.raises(ValueError, match="indexer_balance_block_size must be a positive integer"):
        indexer_balance.indexer_task_plan(lengths, 2, 1, "greedy", True)
    with pytest.raises(ValueError, match="indexer_balance_block_size must be a positive integer"):
        indexer_balance.indexer_route(lengths, 2, 0, 1, "greedy", 1.0)
