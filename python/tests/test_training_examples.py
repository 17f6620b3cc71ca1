"""The DeepSeek training examples' shared driver (python/examples/cp_training_driver.py) without
training: the median interval is ``sparsecp run``'s, the report gives every gain its interval and
"within noise" where it holds 1, a one-strategy run compares nothing, and both examples' ``--help``
work."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
sys.path.insert(0, EXAMPLES)

import cp_training_driver as driver  # noqa: E402


@pytest.mark.parametrize("count, coverage, k", [(1, 0.0, 1), (3, 0.75, 1), (5, 0.9375, 1), (6, 1 - 2 / 64, 1),
                                                (9, 1 - 2 * 10 / 512, 2)])
def test_median_interval_is_the_cli_order_statistics(count: int, coverage: float, k: int) -> None:
    values = [float(v) for v in range(count, 0, -1)]  # unsorted on purpose
    interval = driver.MedianInterval.of(values)
    assert interval.coverage == pytest.approx(coverage)
    assert (interval.low, interval.high) == (float(k), float(count - k + 1))
    assert interval.median == pytest.approx((count + 1) / 2)


def test_verdicts() -> None:
    assert driver.MedianInterval.of([0.9, 1.0, 1.2]).verdict() == "within noise"
    assert driver.MedianInterval.of([1.1, 1.2, 1.3]).verdict() == "too few steps"
    assert driver.MedianInterval.of([1.1, 1.2, 1.3, 1.1, 1.2, 1.3]).verdict() == "faster"
    assert driver.MedianInterval.of([0.8, 0.9, 0.9, 0.8, 0.9, 0.9]).verdict() == "slower"
    assert driver.MedianInterval.of([0.8, 0.9, 1.1, 0.8, 0.9, 0.9]).verdict() == "within noise"


def records(modes: list[str], steps: int, slower: dict[str, float]) -> list[dict[str, object]]:
    """Two ranks' records as the ranks put them: ``slower[mode]`` scales a mode's step."""
    out: list[dict[str, object]] = []
    for step in range(steps):
        for mode in modes:
            for rank in range(2):
                noise = 1 + 0.01 * ((step * 7 + rank) % 3)
                out.append({"rank": rank, "step": step, "mode": mode, "seconds": 2.0, "loss": 6.0, "kl": 0.0,
                            "cpu_seconds": slower.get(mode, 1.0) * noise, "selector_seconds": 0.1 * (1 + rank),
                            "indexer_seconds": 0.2, "dispatch_bytes": 10, "selection_bytes": 0, "documents": 3,
                            "longest": 100, "calibration": None, "calibration_seconds": 0.0, "predictions": [],
                            "predicted_by_refit": [], "param_bytes": 1, "grad_bytes": 1, "optimizer_bytes": 2})
    return out + [{"rank": rank, "peak_growth": 2 ** 20} for rank in range(2)]


def report(modes: list[str], steps: int, slower: dict[str, float],
           capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, object], str]:
    args = argparse.Namespace(modes=modes, variants=modes, selectors=["model"], steps=steps, dp=1, ranks=2)
    rows = records(modes, steps, slower)
    result = driver.summary(rows, [], args)
    driver.print_summary(result, args)
    driver.print_state_bytes(rows, args)
    return result, capsys.readouterr().out


def test_gains_carry_their_interval_and_noise(capsys: pytest.CaptureFixture[str]) -> None:
    result, text = report(["none", "spill", "zigzag"], 6, {"none": 1.0, "spill": 0.5, "zigzag": 1.0}, capsys)
    modes = result["modes"]
    assert isinstance(modes, dict)
    spill, zigzag = modes["spill"]["step_gain_interval"], modes["zigzag"]["step_gain_interval"]
    assert spill["verdict"] == "faster" and spill["low"] > 1.9
    assert zigzag["verdict"] == "within noise" and zigzag["low"] <= 1 <= zigzag["high"]
    assert f"({spill['low']:.3f}-{spill['high']:.3f}) faster" in text
    assert "within noise" in text and "97% interval of the median over the 6 steps" in text
    assert "losses per step agree" in text


def test_few_steps_claim_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    result, text = report(["none", "spill"], 3, {"spill": 0.5}, capsys)
    assert "too few steps" in text and "75% interval" in text and "faster" not in text


def test_one_strategy_compares_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    _, text = report(["spill"], 3, {}, capsys)
    for word in ("gain", "vs spill", "noise", "interval", "agree across"):
        assert word not in text, word
    assert "bound" in text and "param" in text


@pytest.mark.parametrize("example, flag", [("train_deepseek_v4.py", "--dp"), ("train_deepseek_v32.py", "--selector")])
def test_help(example: str, flag: str) -> None:
    text = subprocess.run([sys.executable, os.path.join(EXAMPLES, example), "--help"], check=True,
                          capture_output=True, text=True, timeout=120).stdout
    assert flag in text and "--modes" in text and "within noise" in text


def test_the_examples_run_from_the_package() -> None:
    """``python -m sparsecp.example`` lists the examples where the imported sparsecp finds them
    (an installed wheel's ``sparsecp/examples``, as in CI, or the source tree's) and runs one by
    name; an unknown name is refused naming the examples."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    listing = subprocess.run([sys.executable, "-m", "sparsecp.example"], env=env, capture_output=True, text=True,
                             timeout=120, check=True).stdout
    for name in ("train_deepseek_v4", "train_deepseek_v32", "train_indexer_step", "calibrate_selector"):
        assert name in listing, listing
    assert "cp_training_driver" not in listing, "the shared driver is not an example of its own"
    folder = listing.split("examples in ", 1)[1].split(":\n", 1)[0]
    if folder.endswith(os.path.join("sparsecp", "examples")):  # the wheel leaves out the repository's GPU check
        assert "gpu_attention_check" not in listing, listing
    run = subprocess.run([sys.executable, "-m", "sparsecp.example", "train_deepseek_v4", "--help"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "--dp" in run.stdout, run.stderr
    unknown = subprocess.run([sys.executable, "-m", "sparsecp.example", "train_llama"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "no example 'train_llama'; the examples: " in unknown.stderr, unknown.stderr
