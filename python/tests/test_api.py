"""The drop-in module's surface: names, signatures, return types, the seed's error texts and
exception types, IndexerRoute's tuple semantics, caches; bad inputs to the exchange on a
1-rank gloo group (in this process) raise the seed's ValueError, reused handles its
RuntimeError; and the planning API of `sparsecp` itself."""
from __future__ import annotations

import dataclasses
import inspect
import pickle
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import sparsecp  # noqa: E402
import sparsecp.torch as indexer_balance  # noqa: E402

SEED_SIGNATURES = {
    "resolve_indexer_balance_block_size": ["mode", "block_size"],
    "validate_indexer_hybrid_threshold": ["mode", "min_length"],
    "indexer_task_plan": ["lengths", "size", "ratio", "mode", "block_size", "zigzag_min_length"],
    "indexer_route": ["lengths", "size", "rank", "ratio", "mode", "block_size", "zigzag_min_length"],
    "balanced_indexer_select": ["query_residual", "weights", "position_embeddings", "selector", "lengths", "ratio",
                                "mode", "group", "block_size", "zigzag_min_length"],
    "launch_indexer_inputs": ["query_residual", "weights", "embeddings", "lengths", "ratio", "mode", "group",
                              "block_size", "zigzag_min_length"],
    "_exchange_rows": ["tensor", "route", "group", "rows"],
    "_exchange_inputs": ["inputs", "route", "group", "rows"],
    "_device_rows": ["route", "device"],
}


@pytest.mark.parametrize("name", sorted(SEED_SIGNATURES))
def test_seed_names_and_argument_order(name):
    function = getattr(indexer_balance, name)
    parameters = [p.name for p in inspect.signature(function).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert parameters == SEED_SIGNATURES[name]


def test_seed_classes():
    assert [f.name for f in dataclasses.fields(indexer_balance.IndexerTask)] == ["document", "start", "end"]
    task = indexer_balance.IndexerTask(1, 2, 7)
    assert task.length == 5 and task < indexer_balance.IndexerTask(1, 3, 4)
    assert [f.name for f in dataclasses.fields(indexer_balance._PendingRows)][:5] == [
        "send", "received", "output", "receive_rows", "work"]
    assert [f.name for f in dataclasses.fields(indexer_balance.IndexerInputExchange)] == [
        "route", "rows", "group", "owner_queries", "transfers", "fields", "widths", "consumed"]


SEED_ERRORS = [
    (lambda: indexer_balance.resolve_indexer_balance_block_size("zig", None),
     "indexer_load_balance must be 'none', 'zigzag', 'greedy' or 'hybrid'"),
    (lambda: indexer_balance.resolve_indexer_balance_block_size("zigzag", 16),
     "indexer_balance_block_size requires indexer_load_balance='greedy' or 'hybrid'"),
    (lambda: indexer_balance.resolve_indexer_balance_block_size("greedy", 0),
     "indexer_balance_block_size must be a positive integer"),
    (lambda: indexer_balance.resolve_indexer_balance_block_size("greedy", True),
     "indexer_balance_block_size must be a positive integer"),
    (lambda: indexer_balance.resolve_indexer_balance_block_size("greedy", 2.0),
     "indexer_balance_block_size must be a positive integer"),
    (lambda: indexer_balance.validate_indexer_hybrid_threshold("zigzag", 10),
     "indexer_zigzag_min_length requires indexer_load_balance='hybrid'"),
    (lambda: indexer_balance.validate_indexer_hybrid_threshold("hybrid", None),
     "indexer_load_balance='hybrid' requires an explicit positive integer indexer_zigzag_min_length"),
    (lambda: indexer_balance.validate_indexer_hybrid_threshold("hybrid", 0),
     "indexer_load_balance='hybrid' requires an explicit positive integer indexer_zigzag_min_length"),
    (lambda: indexer_balance.indexer_task_plan((5, 0, 3), 2, 4, "zigzag"),
     "Indexer balance needs positive document lengths/ratio and an equal contiguous CP partition"),
    (lambda: indexer_balance.indexer_task_plan((5000, 300, 2699, 1), 4, 4, "greedy"),
     "Indexer greedy block size 2048 exceeds the local query count 2000"),
    (lambda: indexer_balance.indexer_route((5000, 300, 2699, 1), 4, 4, 4, "zigzag"),
     "Indexer balance rank must be inside its CP group"),
    (lambda: indexer_balance.indexer_route((5000, 300, 2699, 1), 4, 1, 4, "zigzag", zigzag_min_length=5),
     "indexer_zigzag_min_length requires indexer_load_balance='hybrid'"),
]


@pytest.mark.parametrize("call,text", SEED_ERRORS, ids=range(len(SEED_ERRORS)))
def test_seed_error_texts(call, text):
    with pytest.raises(ValueError) as raised:
        call()
    # The seed's text exactly, or followed by what is wrong with these inputs: " (...)".
    assert str(raised.value) == text or str(raised.value).startswith(text + " ("), str(raised.value)


def test_unknown_mode_names_the_seed_text_and_sparsecp_strategies():
    with pytest.raises(ValueError) as raised:
        indexer_balance.indexer_route((8,), 2, 0, 4, "spil")
    assert str(raised.value).startswith("indexer_load_balance must be 'none', 'zigzag', 'greedy' or 'hybrid'")
    assert "spill" in str(raised.value) and "'spil'" in str(raised.value)
    with pytest.raises(ValueError, match="unknown strategy 'spil'"):
        sparsecp.plan((8,), 2, 4, "spil")


def test_indexer_route_fields_behave_like_the_seeds_tuples():
    route = indexer_balance.indexer_route((5000, 300, 2699, 1), 4, 0, 4, "zigzag")
    assert route.segments[0] == (0, 625, 0, 156, 1) and route.segments[-1] == tuple(route.segments)[-1]
    assert route.input_splits == (0, 625, 625, 125) and (0, 625, 625, 125) == route.input_splits
    assert route.input_splits != (0, 625, 625, 126) and route.input_splits != [0, 625, 625, 125]
    assert hash(route.input_splits) == hash((0, 625, 625, 125))
    assert list(route.output_splits) == list(tuple(route.output_splits)) and sum(route.output_splits) == 1375
    assert route.send_rows[:3] == (625, 626, 627) and isinstance(route.send_rows[0], int)
    assert len(route.local_sources) == len(route.local_targets) == 625
    assert route.query_count == 2000 and isinstance(route.query_count, int)
    assert np.asarray(route.send_rows).dtype == np.int64 and not np.asarray(route.send_rows).flags.writeable
    with pytest.raises(dataclasses.FrozenInstanceError):
        route.query_count = 3
    again = indexer_balance.indexer_route((5000, 300, 2699, 1), 4, 0, 4, "zigzag")
    assert again is route  # lru_cached like the seed's
    plain = indexer_balance.IndexerRoute(*(tuple(getattr(route, f)) for f in ("segments", "input_splits",
                                                                              "output_splits", "send_rows",
                                                                              "receive_rows", "local_sources",
                                                                              "local_targets")), route.query_count)
    assert plain == route and hash(plain) == hash(route)
    assert indexer_balance.indexer_route.cache_info().hits >= 1
    indexer_balance.indexer_route.cache_clear()
    indexer_balance.indexer_task_plan.cache_clear()


def test_none_and_sparsecp_strategies_through_the_seed_api():
    lengths = (5000, 300, 2699, 1)
    none = indexer_balance.indexer_task_plan(lengths, 4, 4, "none")
    assert [sum(t.length for t in tasks) for tasks in none] == [2000] * 4
    spill = indexer_balance.indexer_task_plan(lengths, 4, 4, "spill", target_imbalance=1.01)
    assert sum(t.length for tasks in spill for t in tasks) == 8000
    with pytest.raises(ValueError, match="takes only block_size and zigzag_min_length"):
        indexer_balance.indexer_route(lengths, 4, 0, 4, "zigzag", target_imbalance=1.01)
    assert indexer_balance.resolve_indexer_balance_block_size("spill", None) is None
    indexer_balance.validate_indexer_hybrid_threshold("spill", None)


def test_sparsecp_planning_api():
    names = [s.name for s in sparsecp.strategies()]
    assert names[:4] == ["none", "zigzag", "greedy", "hybrid"] and "spill" in names and "auto" in names
    lengths = (5000, 300, 2699, 1)
    plan = sparsecp.plan(lengths, 4, 4, "spill")
    assert plan.imbalance <= 1.001 and plan.rows_moved == plan.rows_moved_bound
    assert plan.imbalance_bound <= plan.imbalance and plan.work.sum() == plan.total_work
    none = sparsecp.plan(lengths, 4, 4, "none")
    assert none.rows_moved == 0 and none.imbalance > 1.4
    assert sum(end - start for tasks in (plan.tasks(r) for r in range(4)) for _, start, end in tasks) == 8000
    route = sparsecp.route(plan, lengths, 4, 3, 4)
    assert route.send_rows.dtype == np.int64 and route.segments.shape[1] == 5
    same = sparsecp.route("spill", lengths, 4, 3, 4)
    assert np.array_equal(same.send_rows, route.send_rows) and same.query_count == route.query_count
    with pytest.raises(ValueError, match="the plan was made for other inputs: cp 4, got 2$"):
        sparsecp.route(plan, lengths, 2, 0, 4)
    other = list(lengths)
    other[1], other[2] = other[1] + 1, other[2] - 1  # same count and total: name the document
    with pytest.raises(ValueError, match=rf"other inputs: document 1 has length {lengths[1]}, got {other[1]}$"):
        sparsecp.route(plan, other, 4, 0, 4)
    with pytest.raises(TypeError, match="unknown strategy parameter 'target'"):
        sparsecp.plan(lengths, 4, 4, "spill", target=1.1)
    with pytest.raises(ValueError, match="spill target imbalance must be at least 1"):
        sparsecp.plan(lengths, 4, 4, "spill", target_imbalance=0.5)
    model = sparsecp.plan(lengths, 4, 4, "spill", cost_model=(10.0, 1.0, 0.5, 512))
    assert model.rows_moved > 0
    auto = sparsecp.plan(lengths, 4, 4, "auto", bandwidth_gbps=10, row_bytes={"qr_rank": 256})
    assert auto.strategy == "auto"


def _cross_node_rows(tasks_of, lengths, cp, per_node):
    """Reference: rows a plan selects on another node than their owner's (owner: the rank
    whose contiguous shard of sum(lengths) / cp rows holds the row)."""
    local, starts = sum(lengths) // cp, np.cumsum((0, *lengths))
    return sum(1 for r in range(cp) for document, start, end in tasks_of(r) for row in range(start, end)
               if (starts[document] + row) // local // per_node != r // per_node)


def _cross_node_bound(lengths, cp, ratio, per_node, target_imbalance):
    """Reference (node_map.hpp): per node, the fewest of its rows, costliest first, whose
    causal cost (visible keys (p + 1) // ratio) covers its load above per_node * T, with
    T = max(target * mean, costliest row) as spill's; summed over nodes."""
    costs = [(p + 1) // ratio for length in lengths for p in range(length)]
    local = len(costs) // cp
    target = max(target_imbalance * sum(costs) / cp, max(costs))
    total = 0
    for node in range(cp // per_node):
        mine = sorted(costs[node * per_node * local:(node + 1) * per_node * local], reverse=True)
        rows = 0
        excess = sum(mine) - per_node * target
        while excess > 0 and rows < len(mine):
            excess -= mine[rows]
            rows += 1
        total += rows
    return total


def test_spill_takes_the_node_map_and_crosses_nodes_at_the_bound():
    cp, ratio, per_node = 8, 4, 4
    changed = 0
    for seed in (1, 2, 3):
        lengths = tuple(sparsecp.generate_batch("lognormal", tokens=1 << 14, cp=cp, seed=seed))
        mapped = sparsecp.plan(lengths, cp, ratio, "spill", ranks_per_node=per_node)
        plain = sparsecp.plan(lengths, cp, ratio, "spill")
        bound = _cross_node_bound(lengths, cp, ratio, per_node, 1.001)
        crossing = _cross_node_rows(mapped.tasks, lengths, cp, per_node)
        assert crossing == bound, f"seed {seed}"
        # Same balance, up to one costliest row where a leftover piece went elsewhere.
        costliest = max(lengths) // ratio / (mapped.total_work / cp)
        assert mapped.imbalance <= max(plain.imbalance, 1.001) + costliest, f"seed {seed}"
        assert _cross_node_rows(plain.tasks, lengths, cp, per_node) >= bound
        changed += _cross_node_rows(plain.tasks, lengths, cp, per_node) > crossing
        # The seed API takes it too, with its own cache entry; the seed's modes ignore it
        # in sparsecp.plan and refuse it in the seed's names (their texts).
        seed_api = indexer_balance.indexer_task_plan(lengths, cp, ratio, "spill", ranks_per_node=per_node)
        assert [[(t.document, t.start, t.end) for t in tasks] for tasks in seed_api] == \
            [list(mapped.tasks(r)) for r in range(cp)]
        for mode in ("zigzag", "hybrid"):
            with_map = sparsecp.plan(lengths, cp, ratio, mode, ranks_per_node=per_node)
            without = sparsecp.plan(lengths, cp, ratio, mode)
            assert [with_map.tasks(r) for r in range(cp)] == [without.tasks(r) for r in range(cp)]
        with pytest.raises(ValueError, match="takes only block_size and zigzag_min_length, got ranks_per_node"):
            indexer_balance.indexer_task_plan(lengths, cp, ratio, "zigzag", ranks_per_node=per_node)
    assert changed >= 1  # the node map changes spill's plan
    lengths = tuple(sparsecp.generate_batch("lognormal", tokens=1 << 14, cp=cp, seed=1))
    with pytest.raises(ValueError, match=r"ranks per node \(3\) must divide the CP size \(8\)"):
        sparsecp.plan(lengths, cp, ratio, "spill", ranks_per_node=3)
    with pytest.raises(ValueError, match="spill ranks per node must be non-negative .*got -1"):
        sparsecp.plan(lengths, cp, ratio, "spill", ranks_per_node=-1)
    with pytest.raises(TypeError, match="ranks_per_node"):
        sparsecp.plan(lengths, cp, ratio, "spill", ranks_per_node=True)


def test_the_node_map_is_part_of_the_plan_cache_key_and_the_fingerprint():
    from sparsecp.torch._plans import planning_inputs

    lengths = tuple(sparsecp.generate_batch("lognormal", tokens=1 << 14, cp=8, seed=2))
    indexer_balance.indexer_task_plan.cache_clear()
    plain = indexer_balance.indexer_task_plan(lengths, 8, 4, "spill")
    mapped = indexer_balance.indexer_task_plan(lengths, 8, 4, "spill", ranks_per_node=2)
    assert indexer_balance.indexer_task_plan.cache_info().currsize == 2 and plain != mapped
    assert indexer_balance.indexer_task_plan(lengths, 8, 4, "spill", ranks_per_node=0) == plain
    fingerprints = {planning_inputs(lengths, 8, 4, "spill", None, None, params).fingerprint().value
                    for params in ({}, {"ranks_per_node": 2}, {"ranks_per_node": 4})}
    assert len(fingerprints) == 3
    indexer_balance.indexer_task_plan.cache_clear()


# --------------------------------------------------------------------------------------
# The exchange on a 1-rank group in this process.


@pytest.fixture(scope="module")
def group():
    if not dist.is_initialized():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _inputs(local=12, batch=1):
    qr = torch.randint(-2, 3, (batch, local, 16)).bfloat16()
    weights = torch.randint(-2, 3, (batch, local, 4)).float()
    cos, sin = torch.ones(batch, local, 2), torch.zeros(batch, local, 2)
    return qr, weights, (cos, sin)


def _selector():
    return indexer_balance.IndexerSelector(torch.ones(32, 16).bfloat16(), torch.ones(3, 8).bfloat16(), 4, 4,
                                           rope_dim=4)


BATCH_TEXT = "Indexer balance requires batch one and equal contiguous source query shards"


def test_exchange_bad_inputs_raise_seed_texts(group):
    qr, weights, embeddings = _inputs()
    lengths = (7, 5)
    select, launch = indexer_balance.balanced_indexer_select, indexer_balance.launch_indexer_inputs
    cases = [
        ((qr.expand(2, -1, -1), weights, embeddings), BATCH_TEXT),  # batch two
        ((qr, weights, embeddings + (embeddings[0],)), BATCH_TEXT),  # three embeddings
        ((qr[:, :10], weights, embeddings), BATCH_TEXT),  # shard does not match the lengths
        ((qr, weights[:, :11], embeddings), None),  # token axes differ
        ((qr, weights.to("meta"), embeddings), None),  # device differs
        ((qr, weights[0], embeddings), None),  # rank-2 weights
    ]
    for args, text in cases:
        with pytest.raises(ValueError) as raised:
            select(args[0], args[1], args[2], _selector(), lengths, 4, "zigzag", group)
        assert str(raised.value) == (text or "Indexer qr, weights and rotary embeddings must have matching "
                                             "batch/token axes and device")
        with pytest.raises(ValueError) as raised:
            launch(args[0], args[1], args[2], lengths, 4, "zigzag", group)
        assert str(raised.value) == (text or "Indexer qr, weights and rotary embeddings must share token axes and "
                                             "device")
    with pytest.raises(ValueError, match="^Indexer greedy block size 2048 exceeds the local query count 12$"):
        select(qr, weights, embeddings, _selector(), lengths, 4, "greedy", group)
    with pytest.raises(ValueError, match="^indexer_load_balance must be"):
        launch(qr, weights, embeddings, lengths, 4, "zig", group)


def test_exchange_handles_are_single_use(group):
    qr, weights, embeddings = _inputs()
    exchange = indexer_balance.launch_indexer_inputs(qr, weights, embeddings, (7, 5), 4, "hybrid", group,
                                                     block_size=4, zigzag_min_length=6)
    worker = exchange.wait()
    assert [t.dtype for t in worker] == [torch.bfloat16, torch.float32, torch.float32, torch.float32]
    with pytest.raises(RuntimeError, match="^Indexer input exchange cannot be consumed twice$"):
        exchange.wait()
    selected = _selector()(*worker[:2], worker[2:], exchange.route.segments)[0]
    with pytest.raises(ValueError, match=r"must return \[12, topk\] rows"):
        exchange.launch_result(selected[:5])
    pending = exchange.launch_result(selected)
    assert pending.wait().shape == (12, 4)
    assert pending.send is None and pending.received is None and pending.output is None  # released
    with pytest.raises(RuntimeError, match="^Indexer communication handle cannot be consumed twice$"):
        pending.wait()
    balanced = indexer_balance.balanced_indexer_select(qr, weights, embeddings, _selector(), (7, 5), 4, "hybrid",
                                                       group, 4, 6)
    assert balanced.shape == (1, 12, 4) and balanced.dtype == torch.int32


# --------------------------------------------------------------------------------------
# The plan cache, the lengths' trips into C++, the exchange's one implementation.


class _CountingCore:
    """Stands in for sparsecp._core in sparsecp.torch._plans: counts the calls that hand
    document lengths to C++ (a plan, a route, a fingerprint of them)."""

    def __init__(self, core):
        self._core, self.calls = core, []
        counting = self

        class Fingerprint:
            @staticmethod
            def seed(lengths, *args):
                counting._count("PlanningFingerprint.seed", lengths)
                return core.PlanningFingerprint.seed(lengths, *args)

            @staticmethod
            def strategy(lengths, *args):
                counting._count("PlanningFingerprint.strategy", lengths)
                return core.PlanningFingerprint.strategy(lengths, *args)

        self.PlanningFingerprint = Fingerprint

    def _count(self, name, lengths):
        if len(lengths):
            self.calls.append(name)

    def __getattr__(self, name):
        function = getattr(self._core, name)
        if name not in ("plan_seed", "route_seed"):
            return function

        def counted(lengths, *args):
            if not isinstance(lengths, self._core.PlanningFingerprint):  # a fingerprint holds them in C++
                self._count(name, lengths)
            return function(lengths, *args)

        return counted


@pytest.fixture
def counting_core(monkeypatch):
    from sparsecp.torch import _plans
    counting = _CountingCore(_plans._core)
    monkeypatch.setattr(_plans, "_core", counting)
    indexer_balance.indexer_route.cache_clear()
    yield counting
    indexer_balance.indexer_route.cache_clear()


@pytest.mark.parametrize("mode,options,first", [
    ("zigzag", {}, ["PlanningFingerprint.seed"]),
    ("hybrid", {"block_size": 4, "zigzag_min_length": 6}, ["PlanningFingerprint.seed"]),
    ("spill", {}, ["PlanningFingerprint.strategy"]),
])
def test_lengths_cross_into_cpp_only_when_a_batch_is_new(group, counting_core, mode, options, first):
    """A call converts the lengths once and hands them to C++ once: only the first call of a
    batch does, into its agreement fingerprint, which its route or plan is then made from."""
    qr, weights, embeddings = _inputs()
    selector = _selector()
    calls = []
    for lengths in ([7, 5], (7, 5), [7, 5]):  # equal batches, as a list or a tuple
        counting_core.calls.clear()
        balanced = indexer_balance.balanced_indexer_select(qr, weights, embeddings, selector, lengths, 4, mode, group,
                                                           **options)
        assert balanced.shape == (1, 12, 4)
        calls.append(list(counting_core.calls))
    assert calls == [first, [], []]
    exchange = indexer_balance.launch_indexer_inputs(qr, weights, embeddings, (7, 5), 4, mode, group, **options)
    worker = exchange.wait()
    exchange.launch_result(selector(worker.qr, worker.weights, (worker.cos, worker.sin),
                                    exchange.route.segments)[0]).wait()
    assert counting_core.calls == []


def test_one_plan_cache_serves_every_rank_and_both_names(counting_core):
    lengths = (5000, 300, 2699, 1)
    routes = [indexer_balance.indexer_route(lengths, 4, rank, 4, "greedy", 1000) for rank in range(4)]
    plan = indexer_balance.indexer_task_plan(lengths, 4, 4, "greedy", 1000)
    assert counting_core.calls == ["plan_seed"]  # one plan for every rank's route and the task plan
    assert indexer_balance.indexer_task_plan(list(lengths), 4, 4, "greedy", block_size=1000) is plan
    assert indexer_balance.indexer_route(list(lengths), 4, 2, 4, "greedy", 1000) is routes[2]
    info = indexer_balance.indexer_route.cache_info()
    assert info == indexer_balance.indexer_task_plan.cache_info() and info.currsize == 1
    indexer_balance.indexer_task_plan.cache_clear()
    assert indexer_balance.indexer_route.cache_info().currsize == 0
    assert not hasattr(indexer_balance.indexer_balance, "_LAST_PLAN")
    assert indexer_balance.indexer_route(lengths, 4, 2, 4, "greedy", 1000) == routes[2]
    assert pickle.loads(pickle.dumps(indexer_balance.indexer_route)) is indexer_balance.indexer_route


def test_indexer_balance_keeps_the_seeds_public_names():
    seed_names = {"resolve_indexer_balance_block_size", "validate_indexer_hybrid_threshold", "IndexerTask",
                  "indexer_task_plan", "IndexerRoute", "indexer_route", "balanced_indexer_select",
                  "IndexerInputExchange", "launch_indexer_inputs"}
    assert set(indexer_balance.indexer_balance.__all__) == seed_names
    for name in ("exchange_stats", "reset_exchange_stats", "expected_exchange_bytes", "ExchangeBytes", "RowTuple"):
        assert getattr(indexer_balance.indexer_balance, name) is getattr(indexer_balance, name)


def test_expected_exchange_bytes_of_a_cpp_and_a_python_route_agree():
    route = indexer_balance.indexer_route((5000, 300, 2699, 1), 4, 1, 4, "greedy", 1000)
    fields = ("segments", "input_splits", "output_splits", "send_rows", "receive_rows", "local_sources",
              "local_targets")
    plain = indexer_balance.IndexerRoute(*(tuple(getattr(route, f)) for f in fields), route.query_count)
    assert plain.core is None and route.core is not None
    sent, received = len(route.send_rows), len(route.receive_rows)
    assert sent and received
    for index_bytes in (4, 8, 2):
        expected = indexer_balance.expected_exchange_bytes(route, 100, 7, index_bytes)
        assert expected == indexer_balance.expected_exchange_bytes(plain, 100, 7, index_bytes)
        assert expected == (sent * 100, received * 100, received * 7 * index_bytes, sent * 7 * index_bytes)


def test_the_seeds_exchange_helpers_and_the_named_tuples(group):
    qr, weights, embeddings = _inputs()
    inputs = (qr, weights, *embeddings)
    route = indexer_balance.indexer_route((7, 5), 1, 0, 4, "zigzag")
    rows = indexer_balance._device_rows(route, qr.device)
    assert rows._fields == ("send_rows", "receive_rows", "local_sources", "local_targets")
    assert rows.local_sources is rows[2] and rows.local_sources.dtype == torch.int64
    exchanged = indexer_balance._exchange_inputs(inputs, route, group, rows)
    exchange = indexer_balance.launch_indexer_inputs(qr, weights, embeddings, (7, 5), 4, "zigzag", group)
    worker = exchange.wait()
    assert worker._fields == ("qr", "weights", "cos", "sin") and exchange.rows == rows
    assert len(exchanged) == len(worker) == 4
    for helper, handle, owner in zip(exchanged, worker, inputs):
        assert torch.equal(helper, handle) and helper.dtype == owner.dtype and helper.shape == owner.shape
    assert torch.equal(indexer_balance._exchange_rows(qr[0], route, group, rows), worker.qr[0])


PUBLIC_MODULES = ("sparsecp", "sparsecp.torch", "sparsecp.models", "sparsecp.models.deepseek_v4",
                  "sparsecp.models.deepseek_v32")


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_modules_name_themselves_in_help_and_expose_no_helpers(name):
    """help() on an exported function or class names a public module (the one users import it
    from), not the private file that defines it; the public modules do not hand out the modules
    they import (np, torch, functools, ...), only their own public submodules. The extension's
    names (sparsecp._core: its type stubs and pickles name them by their module) are the exception."""
    import importlib
    import types
    import typing

    if "deepseek" in name:
        pytest.importorskip("transformers.models.deepseek_v32")
    module = importlib.import_module(name)
    def hints_resolve(cls: type) -> bool:
        try:
            typing.get_type_hints(cls)
        except NameError:
            return False
        return True

    private = {export: obj.__module__ for export in module.__all__
               if not str(getattr(obj := getattr(module, export), "__module__", "")).startswith("sparsecp._core")
               and any(part.startswith("_") for part in str(getattr(obj, "__module__", "")).split(".")[1:])}
    for export, home in private.items():  # only a class keeps a private home, and only because typing
        cls = getattr(module, export)     # could not resolve its annotations in the public module
        assert isinstance(cls, type), f"{export}: {home}"
        cls.__module__ = name
        try:
            assert not hints_resolve(cls), f"{export} could be named by {name}"
        finally:
            cls.__module__ = home
    for export in module.__all__:  # typing resolves every exported class's annotations
        if isinstance(getattr(module, export), type):
            assert hints_resolve(getattr(module, export)), export
    helpers = [key for key, value in vars(module).items() if isinstance(value, types.ModuleType)
               and not key.startswith("_") and not value.__name__.startswith(f"{name}.")]
    assert helpers == [], helpers
    import pickle

    for export in module.__all__:  # by reference, through the module it now names
        obj = getattr(module, export)
        if isinstance(obj, type) or callable(obj) and obj.__class__.__name__ != "nb_func":
            assert pickle.loads(pickle.dumps(obj)) is obj, export
