"""Smoke test of ``python/benchmarks/v4_memory.py``: a tiny run (256 tokens, one document, 2 gloo
ranks, the fused selector) with ``--warmup 1 --steps 2 --profile 3`` whose ``--json`` must hold
both warm steps' times, their median and peak and rank 0's top ops; the perf control FIFO's two
commands; the refusal of bad counts; and the helpers that reset and read a process's peak
resident size. It checks the benchmark's plumbing, not its figures."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "python", "benchmarks", "v4_memory.py")

pytest.importorskip("transformers")


def run_script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the sparsecp this test imports
    return subprocess.run([sys.executable, SCRIPT, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_warm_steps_report_their_times_peak_and_profile(tmp_path: object) -> None:
    out = os.path.join(str(tmp_path), "run.json")
    done = run_script("--tokens", "256", "--packs", "one", "--selectors", "fused", "--checkpointing", "off",
                      "--warmup", "1", "--steps", "2", "--profile", "3", "--json", out)
    assert done.returncode == 0, f"v4_memory.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "1 warm-up step(s) before the timed one" in done.stdout
    with open(out) as file:
        (row,) = json.load(file)["rows"]
    assert row["warmup"] == 1 and row["steps"] == 2 and row["tokens"] == 256
    assert row["peak_mib"] > 0
    slowest = [max(rank["step_seconds"][i] for rank in row["ranks"]) for i in range(2)]
    assert row["step_seconds"] == pytest.approx(sum(slowest) / 2)  # the median of two
    for rank in row["ranks"]:
        assert len(rank["step_seconds"]) == 2 and min(rank["step_seconds"]) > 0 and rank["peak_growth_kib"] > 0
        assert rank["selector_seconds"] > 0  # the timed steps' own selection (the warm-up's is not counted)
    top = row["ranks"][0]["top"]
    assert len(top) == 3 and row["ranks"][1]["top"] == []  # rank 0 only
    assert all(seconds >= 0 and calls > 0 for _, seconds, calls in top)
    assert done.stdout.count("#   rank 0 self CPU") == 3


def test_the_perf_fifo_brackets_the_timed_steps(tmp_path: object) -> None:
    """``--perf-fifo``: rank 0 writes 'enable' before the timed steps and 'disable' after them
    (a reader thread stands in for ``perf record --control=fifo:PATH``)."""
    fifo = os.path.join(str(tmp_path), "perf.ctl")
    os.mkfifo(fifo)
    commands: list[str] = []

    def read() -> None:
        for _ in range(2):  # rank 0 opens, writes one command and closes, twice
            with open(fifo) as control:
                commands.extend(control.read().split())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    done = run_script("--tokens", "256", "--packs", "one", "--selectors", "fused", "--checkpointing", "off",
                      "--warmup", "1", "--perf-fifo", fifo)
    reader.join(timeout=30)
    assert done.returncode == 0, f"v4_memory.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert commands == ["enable", "disable"]


@pytest.mark.parametrize("option, value, message", [("--warmup", "-1", "--warmup must be 0 or more, got -1"),
                                                     ("--steps", "0", "--steps must be 1 or more, got 0"),
                                                     ("--profile", "-2", "--profile must be 0 or more, got -2")])
def test_bad_counts_are_refused(option: str, value: str, message: str) -> None:
    done = run_script(option, value, timeout=60)
    assert done.returncode == 2 and message in done.stderr


def test_the_peak_resets_to_the_resident_size() -> None:
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        import v4_memory
    finally:
        sys.path.pop(0)
    block = b"\x01" * (64 << 20)  # written: 64 MiB resident
    del block
    high = v4_memory._peak_kib()
    v4_memory._reset_peak()
    low = v4_memory._peak_kib()
    assert low <= high - 32 * 1024, (high, low)  # the 64 MiB are gone from the peak
    assert low >= v4_memory._resident_kib() - 1024
