"""spill's cost model under ``sparsecp.models.deepseek_v4.context_parallel``: calibrated on the
layer's own selector without being asked (once per process: cached), agreed across ranks,
refitted from measured times; skipped when a model is given, when turned off, or for a strategy
that plans without one (2 gloo ranks, a tiny float32 model)."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers.models.deepseek_v4", reason="transformers >= 5.23 (DeepseekV4) not installed")

import v4_calibration_tasks  # noqa: E402
from multirank import pool_of, results_or_raise  # noqa: E402


def test_spill_calibrates_once_agreed_across_ranks_and_refits() -> None:
    results = results_or_raise(pool_of(2).run(v4_calibration_tasks.calibrates_once))
    for rank, r in enumerate(results):
        assert r["before"]["active"] and r["before"]["model"] is None, f"rank {rank}: calibrated before a forward"
        assert r["first"]["source"] == "calibrated", f"rank {rank}: {r['first']}"
        terms = r["first"]["terms"]
        assert terms is not None and min(terms) >= 0 and max(terms) > 0, f"rank {rank}: fitted {terms}"
        assert r["cached"]["source"] == "cached" and r["cached"]["seconds"] == 0.0, f"rank {rank}: {r['cached']}"
        assert r["cached"]["model"] == r["first"]["model"], f"rank {rank}: the cached fit is another model"
        assert r["later"]["refit_steps"] == 3, f"rank {rank}: the refit saw {r['later']['refit_steps']} forwards"
        # each measured forward was predicted before it ran, for both ranks: held-out errors, and their rms
        predictions = r["later"]["predictions"]
        assert [len(f) for f in predictions] == [2, 2, 2], f"rank {rank}: predictions {predictions}"
        assert all(p > 0 and m > 0 for f in predictions for p, m in f), f"rank {rank}: {predictions}"
        errors = [p / m - 1 for f in predictions for p, m in f]
        assert abs(r["later"]["prediction_residual"] - (sum(e * e for e in errors) / 6) ** 0.5) < 1e-12
        shares = [(p / (f[0][0] + f[1][0])) / (m / (f[0][1] + f[1][1])) - 1 for f in predictions for p, m in f]
        assert abs(r["later"]["share_residual"] - (sum(e * e for e in shares) / 6) ** 0.5) < 1e-12
        # the first fit planned these three forwards (a refit needs three measured ones first)
        assert r["later"]["by_refit"] == [False, False, False], f"rank {rank}: {r['later']['by_refit']}"
        # the model selector merges with torch.topk (no admission term); sparsecp's kernel keeps a running top-k
        assert r["later"]["heap_term"] is False and r["fused_heap_term"] is True, f"rank {rank}: {r}"
    # rank 0 fitted (its cache holds the fit); rank 1 only received it
    assert [r["cache_size"] for r in results] == [1, 0]
    assert results[0]["later"]["predictions"] == results[1]["later"]["predictions"], "ranks disagree on the errors"
    for key in ("first", "later"):
        assert results[0][key]["model"] == results[1][key]["model"], \
            f"ranks plan with different models after the {key} forwards: {results[0][key]} / {results[1][key]}"


@pytest.mark.parametrize("case, source", [("given", "given"), ("off", "off"), ("zigzag", "off")])
def test_a_given_model_calibrate_false_or_another_strategy_skip_it(case: str, source: str) -> None:
    for rank, r in enumerate(results_or_raise(pool_of(2).run(v4_calibration_tasks.skips, case))):
        assert not r["active"] and r["source"] == source and r["model"] is None, f"{case}: rank {rank}: {r}"
        assert r["refit_steps"] is None and r["cache_size"] == 0, f"{case}: rank {rank} calibrated: {r}"


def test_a_bad_calibrate_option_is_named() -> None:
    for message in results_or_raise(pool_of(2).run(v4_calibration_tasks.bad_option)):
        assert "calibrate must be True" in message and "'yes'" in message, message


def test_prediction_residual_of_seconds_and_of_shares() -> None:
    from sparsecp.models._cp.calibration import CalibrationReport

    report = CalibrationReport()
    assert report.prediction_residual() != report.prediction_residual()  # nan: nothing predicted yet
    # forward 1 (first fit): predicted 1 and 3 s, measured 2 and 2: errors -0.5 and +0.5; shares 0.5 / 1.5
    # forward 2 (a refit): a model of zeros predicts -100% and has no shares
    report.predictions = [[(1.0, 2.0), (3.0, 2.0)], [(0.0, 1.0), (0.0, 1.0)]]
    report.predicted_by_refit = [False, True]
    assert abs(report.prediction_residual() - (0.25 + 0.25 + 1 + 1) ** 0.5 / 2) < 1e-12
    assert abs(report.prediction_residual(shares=True) - 0.5) < 1e-12
    assert report.prediction_residual(refit_only=True) == 1.0
    assert report.prediction_residual(shares=True, refit_only=True) != report.prediction_residual(shares=True,
                                                                                                  refit_only=True)


def test_a_long_runs_history_is_bounded_as_its_predictions_are() -> None:
    """A refit every forward (times that drift: each fit a new model) adds one history line per
    forward; the report keeps the first (the calibration) and the last ones, like the predictions."""
    from types import SimpleNamespace

    import torch

    import sparsecp
    from sparsecp.models._cp.calibration import _HISTORY_KEPT, _PREDICTIONS_KEPT, SelectionCalibration

    calibration = SelectionCalibration("spill", {}, True, lambda bank: None, "stub", {}, torch.zeros(1), [4])
    start = sparsecp.CostModel.linear(1000, 50, 0, 8)
    calibration.report.model = start
    calibration.report.note("forward 1: calibrated (stand-in)")
    calibration.refit = sparsecp.CostModelRefit(start, window=8)
    state = SimpleNamespace(size=2, forwards=0, layouts={})
    forwards = 3 * _HISTORY_KEPT
    for forward in range(1, forwards + 1):
        rows = (100 + forward % 7, 300 + forward % 5)
        calibration._pending = [(r, r * r / 10, 8.0 * r, 0.0) for r in rows]  # each rank's sums
        a = 1000 * (1 + forward / 100)  # ns a row, drifting
        calibration.received_times([(1e-9 * (a * r + 50 * r * r / 10), 1) for r in rows])
        state.forwards = forward
        calibration._refit(state)
    report = calibration.report
    assert report.refits > 2 * _HISTORY_KEPT, report.refits
    assert len(report.history) == _HISTORY_KEPT and len(report.predictions) == _PREDICTIONS_KEPT
    assert report.history[0] == "forward 1: calibrated (stand-in)"
    assert report.history[-1].startswith(f"forward {forwards + 1}: refit "), report.history[-1]
    assert report.history_dropped == report.refits + 1 - _HISTORY_KEPT


def test_a_later_process_reads_the_fit_from_the_disk_cache() -> None:
    """Rank 0's fit is cached on disk: a later process's first forward plans with it at once (no
    calibration stall, the same model on every rank); a damaged file is calibrated anew;
    ``SPARSECP_CACHE_DIR=off`` turns the disk cache off (item 12 of issue 43)."""
    results = results_or_raise(pool_of(2).run(v4_calibration_tasks.calibrates_from_disk))
    for rank, r in enumerate(results):
        assert r["first"]["source"] == "calibrated" and r["first"]["seconds"] > 0, (rank, r["first"])
        assert r["from_disk"]["source"] == "cached on disk" and r["from_disk"]["seconds"] == 0.0, (rank, r)
        assert r["from_disk"]["model"] == r["first"]["model"], (rank, "the disk's fit is another model")
        for damage in ("{not json", "[]"):
            assert r[f"after {damage}"]["source"] == "calibrated", (rank, damage, r[f"after {damage}"])
        assert r["rewritten"]["source"] == "cached on disk", (rank, r["rewritten"])
        assert r["off"]["source"] == "calibrated", (rank, r["off"])
    assert [r["files"] for r in results] == [1, 1] and [r["files_at_end"] for r in results] == [1, 1]
