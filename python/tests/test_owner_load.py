"""spill's owner load (``owner_load``, ``sparsecp.owner_cost``): per-rank work that stays on each
row's owner (the KL loss) enters the balance, through the package, the torch planning names
(their plan cache) and the training example's ``--balance-step`` fit."""
from __future__ import annotations

import os

import numpy as np
import pytest

import sparsecp

LENGTHS = (5000, 300, 2699, 1)  # cp 4, ratio 4: 2000 rows per rank


def _visible(position: int, ratio: int) -> int:
    return (position + 1) // ratio


def test_owner_cost_sums_each_owned_row():
    lengths, cp, ratio, topk = (700, 13, 300, 11, 400), 4, 4, 64
    cost = sparsecp.owner_cost(lengths, cp, ratio, 2.5, 0.75, topk)
    local = sum(lengths) // cp
    expected = [0.0] * cp
    row = 0
    for length in lengths:
        for position in range(length):
            expected[row // local] += 2.5 + 0.75 * min(topk, _visible(position, ratio))
            row += 1
    assert cost == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="coefficient a must be finite and non-negative, got -1"):
        sparsecp.owner_cost(lengths, cp, ratio, -1.0, 1.0)
    with pytest.raises(ValueError, match="equal contiguous CP partition"):
        sparsecp.owner_cost(lengths, 7, ratio, 1.0, 1.0)


def test_spill_with_an_owner_load_sheds_from_the_heavy_owner():
    plain = sparsecp.plan(LENGTHS, 4, 4, "spill")
    pairs = float(sum(plain.work))
    # Rank 3 (the lightest selection) gets the heaviest owner load: it now sheds rows.
    heavy = [0.0, 0.0, 0.0, 0.1 * pairs]
    balanced = sparsecp.plan(LENGTHS, 4, 4, "spill", owner_load=heavy, target_imbalance=1.01)
    assert plain.rows_moved > 0
    assert balanced.work[3] < plain.work[3]
    assert balanced.rows[3] < 2000
    totals = [w + o for w, o in zip(balanced.work, heavy)]
    assert max(totals) / (sum(totals) / 4) <= 1.01  # selection + owner within the target (the slack allows it)
    assert list(balanced.cost) == [float(w) for w in balanced.work]  # causal model: cost is the work
    # Zeros (a list, a tuple or a numpy array) plan exactly as no owner load.
    for zeros in ([0, 0, 0, 0], (0.0,) * 4, np.zeros(4)):
        same = sparsecp.plan(LENGTHS, 4, 4, "spill", owner_load=zeros)
        assert [same.tasks(r) for r in range(4)] == [plain.tasks(r) for r in range(4)]
    # auto takes it too (and predicts with it).
    assert sum(sparsecp.plan(LENGTHS, 4, 4, "auto", owner_load=heavy).rows) == sum(LENGTHS)
    # The seed's modes never see it.
    zigzag = sparsecp.plan(LENGTHS, 4, 4, "zigzag")
    with_load = sparsecp.plan(LENGTHS, 4, 4, "zigzag", owner_load=heavy)
    assert [with_load.tasks(r) for r in range(4)] == [zigzag.tasks(r) for r in range(4)]


def test_invalid_owner_loads_are_refused_naming_the_value():
    with pytest.raises(ValueError, match=r"needs one value per rank \(cp 4\) or none, got 3 values"):
        sparsecp.plan(LENGTHS, 4, 4, "spill", owner_load=[1, 2, 3])
    with pytest.raises(ValueError, match="owner load of rank 1 must be finite and non-negative, got -1"):
        sparsecp.plan(LENGTHS, 4, 4, "spill", owner_load=[1, -1, 0, 0])
    with pytest.raises(ValueError, match="owner load of rank 2 must be finite and non-negative, got nan"):
        sparsecp.strategy_params(owner_load=[0, 0, float("nan"), 0])
    with pytest.raises(TypeError, match=r"owner_load\[0\]=True: expected a number"):
        sparsecp.strategy_params(owner_load=[True, 0, 0, 0])
    with pytest.raises(TypeError, match="expected a sequence of numbers"):
        sparsecp.strategy_params(owner_load="1,2")
    assert sparsecp.strategy_params(owner_load=(1, 2.5)).owner_load == [1.0, 2.5]


def test_torch_planning_names_take_it_and_key_their_cache_on_it():
    sct = pytest.importorskip("sparsecp.torch")
    heavy = [0.0, 0.0, 0.0, 4e5]
    listed = sct.indexer_task_plan(LENGTHS, 4, 4, "spill", owner_load=heavy)
    assert sct.indexer_task_plan(LENGTHS, 4, 4, "spill", owner_load=tuple(heavy)) is listed  # one cache entry
    assert sct.indexer_task_plan(LENGTHS, 4, 4, "spill", owner_load=np.array(heavy)) is listed
    plain = sct.indexer_task_plan(LENGTHS, 4, 4, "spill")
    assert plain != listed
    expected = sparsecp.plan(LENGTHS, 4, 4, "spill", owner_load=heavy)
    assert [[(t.document, t.start, t.end) for t in rank] for rank in listed] == \
        [list(expected.tasks(r)) for r in range(4)]
    route = sct.indexer_route(LENGTHS, 4, 3, 4, "spill", owner_load=heavy)
    assert sum(q_end - q_begin for q_begin, q_end, *_ in route.segments) == expected.rows[3]
    with pytest.raises(ValueError, match="takes only block_size and zigzag_min_length"):
        sct.indexer_task_plan(LENGTHS, 4, 4, "zigzag", owner_load=heavy)


def _example():
    import rank_tasks

    return rank_tasks._train_example()


def test_step_fit_recovers_the_owner_model_from_per_rank_times():
    module = _example()
    config = module.IndexerConfig()
    size = 4
    units = [float(u) for u in sparsecp.plan(config.lengths, size, config.ratio, "none").cost]
    slots = sparsecp.owner_cost(config.lengths, size, config.ratio, 0.0, 1.0, config.topk)
    assert len(set(slots)) == size  # the ranks' KL work differs: c_kl can be fitted
    per_unit, a_kl, c_kl = 2e-8, 3e-6, 4e-7  # seconds
    local = config.tokens // size
    selection = [0.01 + per_unit * u for u in units]
    owner = [0.05 + a_kl * local + c_kl * s for s in slots]
    fit = module.step_fit(config, size, selection, owner)
    assert fit["seconds_per_unit"] == pytest.approx(per_unit, rel=1e-9)
    assert fit["c_kl_s"] == pytest.approx(c_kl, rel=1e-9)
    assert fit["a_kl_s"] * local == pytest.approx(0.05 + a_kl * local, rel=1e-9)  # the constant folds into a_kl
    expected = sparsecp.owner_cost(config.lengths, size, config.ratio, fit["a_kl_s"] / per_unit, c_kl / per_unit,
                                   config.topk)
    assert fit["owner_load"] == pytest.approx(tuple(expected), rel=1e-9)
    # Noise that inverts the trend: no slope, a constant owner load (nothing to balance beyond it).
    flat = module.step_fit(config, size, selection, [1.0 - 1e-7 * s for s in slots])
    assert flat["c_kl_s"] == 0 and flat["a_kl_s"] > 0
    assert max(flat["owner_load"]) - min(flat["owner_load"]) <= 1e-9 * max(flat["owner_load"])


def test_a_step_planned_with_an_owner_load_keeps_the_gradients():
    """The heavy owner selects fewer rows; ids and gradients stay bit for bit the unbalanced run's."""
    import rank_tasks
    from multirank import pool_of, results_or_raise

    seed = int(os.environ.get("SPARSECP_TEST_SEED", "20261201")) + 107
    print(f"seed {seed}")
    config = dict(lengths=(2900, 300, 700, 45, 151), hidden=64, q_lora_rank=32, heads=4, head_dim=32, rope_dim=16,
                  att_heads=4, att_dim=32)
    lengths, size, local = config["lengths"], 4, sum(config["lengths"]) // 4
    pairs = float(sum(sparsecp.plan(lengths, size, 4, "none").work))
    heavy = (0.2 * pairs, 0.0, 0.0, 0.0)  # rank 0 (the lightest selection) gets the heaviest owner load
    expected = sparsecp.plan(lengths, size, 4, "spill", owner_load=heavy)
    assert expected.rows[0] < local
    pool = pool_of(size)
    balanced = results_or_raise(pool.run(rank_tasks.train_indexer_step, "spill", seed, config, heavy, timeout=120))
    none = results_or_raise(pool.run(rank_tasks.train_indexer_step, "none", seed, config, timeout=120))
    assert [r["rows_selected"] for r in balanced] == [int(n) for n in expected.rows]
    for rank in range(size):
        assert np.array_equal(balanced[rank]["topk"], none[rank]["topk"])
        for name, grad in none[rank]["grads"].items():
            assert np.array_equal(balanced[rank]["grads"][name], grad), (name, rank)
