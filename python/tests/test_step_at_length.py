"""Smoke test of ``python/benchmarks/step_at_length.py``: a tiny run (one CSA layer at
V4-Flash's proportions / 64, 512 tokens in one document, 2 gloo ranks, none and spill, 2
steps) whose ``--json`` must hold every per-strategy field with sane values, and whose
projection must be present. It checks the benchmark's plumbing, not its figures."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "python", "benchmarks", "step_at_length.py")
FIELDS = ("step_seconds", "gain", "gain_interval", "bound", "indexer_share", "selection_bytes_per_rank")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("step_at_length")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the sparsecp this test imports
    command = [sys.executable, SCRIPT, "--scale", "64", "--layers", "csa", "--experts", "6", "--tokens", "512",
               "--pack", "one", "--ranks", "2", "--modes", "none,spill", "--steps", "2", "--warmup", "0",
               "--json", str(out / "run.json"), "--svg", str(out / "run.svg"), "--project",
               "--project-tokens", "65536"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, f"step_at_length.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    with open(out / "run.json") as file:
        result = json.load(file)
    result["stdout"] = done.stdout
    result["svg"] = (out / "run.svg").read_text()
    return result


def test_every_strategy_reports_every_field(report: dict) -> None:
    (run,) = report["runs"]
    assert list(run["modes"]) == ["none", "spill"]
    for mode, row in run["modes"].items():
        missing = [f for f in FIELDS if f not in row]
        assert not missing, f"{mode}: missing {missing}"
        assert len(row["step_seconds"]) == 2 and all(s > 0 for s in row["step_seconds"]), (mode, row["step_seconds"])
        low, high = row["gain_interval"]
        assert 0 < low <= row["gain"] <= high, (mode, row["gain"], row["gain_interval"])
        assert 0 < row["indexer_share"] < 1, (mode, row["indexer_share"])
        assert row["bound"] >= 1 and math.isfinite(row["bound"]), (mode, row["bound"])
        parts = row["breakdown_seconds"]
        assert all(parts[c] >= 0 for c in ("scoring", "indexer", "moe", "rest")), parts
        assert parts["attention"] > 0 and parts["moe"] > 0 and parts["scoring"] > 0, parts
        assert sum(parts.values()) == pytest.approx(row["step_seconds_median"], rel=0.2), (parts, row)


def test_figures_mean_what_they_say(report: dict) -> None:
    modes = report["runs"][0]["modes"]
    none, spill = modes["none"], modes["spill"]
    # One document over 2 ranks: none moves no row, spill moves some (the second rank's rows
    # see 3x the first's keys); at this size the selectors' times hardly differ, so only the
    # definitions are checked: imbalance = max / mean >= 1, and the bound, with I >= 1, >= 1.
    assert all(row["selection_imbalance"] >= 1 for row in modes.values())
    assert none["bound"] >= 1.0 and spill["bound"] == none["bound"]  # the bound is the baseline's
    assert none["selection_bytes_per_rank"] == 0
    assert spill["selection_bytes_per_rank"] > 0
    assert none["gain"] == 1.0 and none["gain_interval"] == [1.0, 1.0]
    # every strategy trains the same model on the same batch: the same global loss
    for a, b in zip(none["losses"], spill["losses"]):
        assert a == pytest.approx(b, rel=1e-4), (none["losses"], spill["losses"])


def test_projection_and_picture(report: dict) -> None:
    projection = report["projection"]
    assert {c["mode"] for c in projection["check"]} == {"none", "spill"}
    assert all(c["predicted"] > 0 and c["measured"] > 0 for c in projection["check"])
    table = projection["table"]
    assert {(row["mix"], row["cp"]) for row in table} == {(m, c) for m in ("one", "longtail", "lognormal")
                                                           for c in (8, 16, 32, 64)}
    one = [row for row in table if row["mix"] == "one"]
    assert all(row["bound"] > 1 and 0 < row["spill_gain"] <= row["bound"] * 1.001 for row in one), one
    assert "predicted vs measured" in report["stdout"]
    assert report["svg"].startswith("<svg") and report["svg"].rstrip().endswith("</svg>")
