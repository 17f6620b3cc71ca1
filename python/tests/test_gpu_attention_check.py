"""``python/examples/gpu_attention_check.py --cpu``: the prepared GPU check's dry run on CPU.

Every step of the GPU check (the package import, the matmul rate, Triton sparse attention forward
+ backward against the float64 reference at tiny V4- and V3.2-like shapes under Triton's
interpreter, the V4 model selector against a dense top-k, a 2-layer DeepSeek-V4 under sparsecp on
a gloo group of one against the per-document model, narrow in float32 and with 64 heads of 512)
runs on CPU tensors in a fresh interpreter (``TRITON_INTERPRET=1`` before Triton is imported) and
writes its JSON report. Its time budget keeps it within about 90 s: a step it had no time for is
reported as skipped, never as passed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "python" / "examples" / "gpu_attention_check.py"
STEPS = ("build", "matmul", "attention-v4", "attention-v32", "selector-32k", "selector-128k", "model-v4",
         "model-v4-wide")


def test_the_gpu_check_dry_runs_every_step_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("triton", reason="the dry run runs the Triton kernels under the interpreter")
    pytest.importorskip("transformers.models.deepseek_v4", reason="transformers without DeepseekV4")
    # The child imports the sparsecp this test run imports (the installed package in CI, a source
    # tree with its built extension in development): the parent's own path, not the checkout's.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("TRITON_INTERPRET", None)  # the script sets it itself, before Triton is imported
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--budget-s", "70", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["cpu_dry_run"] is True and report["failed"] == 0
    steps = report["steps"]
    assert set(steps) == set(STEPS), sorted(steps)
    ran = [name for name in STEPS if steps[name]["status"] == "pass"]
    assert all(steps[name]["status"] in ("pass", "skip") for name in STEPS)
    assert ran[:4] == ["build", "matmul", "attention-v4", "attention-v32"], ran
    for name in ("attention-v4", "attention-v32"):
        backends = steps[name]["backends"]
        assert set(backends) == {"triton", "torch"}
        for entry in backends.values():
            assert max(entry["relative_error"].values()) <= 1e-4
            assert entry["forward_backward_ms"] > 0 and entry["forward_backward_tflops"] > 0
    if steps["model-v4"]["status"] == "pass":
        assert steps["model-v4"]["attention_path"] == "triton"
    print(f"dry run {report['seconds']} s; skipped: {[n for n in STEPS if steps[n]['status'] == 'skip']}")
