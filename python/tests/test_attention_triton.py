"""The Triton sparse attention kernels (``sparsecp.torch._attention_triton``) without a GPU.

* Under Triton's interpreter, on CPU float32 tensors, against ``reference_sparse_attention`` in
  float64: out, lse, dq, dkv and dsinks within 1e-5 relative, for each shape class, with the
  deterministic key gradient (two runs bit-identical) and the atomic one. ``TRITON_INTERPRET=1``
  must be set before the kernels are defined, so the checks run in a fresh interpreter: this file
  run as a script.
* ``triton.compile`` of every kernel for sm_90 and sm_100 at V4's (64 heads, K=V 512, sinks) and
  V3.2's (64 heads, 576/512) shapes in bfloat16: shared memory within 227 KiB, no register spills
  (ptxas's own report).

Both kinds start at once in separate processes and are waited for by the tests that read them.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

import pytest

SEED = int(os.environ.get("SPARSECP_TEST_SEED", "46"))
TOLERANCE = 1e-5
SHARED_LIMIT = 227 * 1024          # sm_90 and sm_100: 227 KiB of shared memory per block
TIMEOUT = 240

# name: rows, heads, qk_dim, value_dim, keys, columns, sinks ("random", "none", "extreme") and
# what else the case sets up.
CASES: dict[str, dict[str, Any]] = {
    "basic_value_dim_below_qk": dict(rows=7, heads=4, qk=40, value=24, keys=19, columns=21, sinks="random"),
    "no_sinks": dict(rows=6, heads=3, qk=20, value=20, keys=11, columns=18, sinks="none"),
    "rows_all_minus_one": dict(rows=5, heads=2, qk=16, value=16, keys=9, columns=7, sinks="random",
                               empty_rows=[0, 3]),
    "rows_all_minus_one_no_sinks": dict(rows=4, heads=2, qk=16, value=16, keys=9, columns=7, sinks="none",
                                        empty_rows=[1]),
    "zero_rows": dict(rows=0, heads=4, qk=24, value=16, keys=8, columns=5, sinks="random"),
    "zero_columns": dict(rows=3, heads=2, qk=24, value=16, keys=8, columns=0, sinks="random"),
    "one_column": dict(rows=6, heads=5, qk=24, value=24, keys=4, columns=1, sinks="random"),
    "repeated_ids": dict(rows=5, heads=4, qk=32, value=24, keys=6, columns=19, sinks="random", repeated=True),
    "sinks_minus_inf_and_large": dict(rows=6, heads=4, qk=24, value=24, keys=13, columns=17, sinks="extreme"),
    "heads_64": dict(rows=3, heads=64, qk=32, value=32, keys=23, columns=20, sinks="random"),
    "head_blocks_partial": dict(rows=4, heads=40, qk=24, value=16, keys=12, columns=18, sinks="random",
                                block_heads=16),
    # The deterministic key gradient in chunks of 3 rows: 3 + 3 + 1, the last one short.
    "row_chunks": dict(rows=7, heads=3, qk=24, value=20, keys=10, columns=12, sinks="random", chunk_rows=3),
}
CONFIGS = {"v4": (64, 512, 512), "v32": (64, 576, 512)}
ARCHS = (90, 100)


def _inputs(case: dict[str, Any], generator: Any) -> tuple[Any, ...]:
    import torch

    rows, heads, qk, keys, columns = case["rows"], case["heads"], case["qk"], case["keys"], case["columns"]
    q = torch.randn(rows, heads, qk, generator=generator)
    kv = torch.randn(keys, qk, generator=generator)
    indices = torch.randint(-1, keys, (rows, columns), generator=generator, dtype=torch.int32)
    for r in case.get("empty_rows", []):
        indices[r] = -1
    if case.get("repeated"):
        indices[0] = 2                                   # one key in every column
        indices[1, ::2] = 5                              # one key in half the columns
        indices[2] = torch.arange(columns, dtype=torch.int32) % 3
    sinks = None
    if case["sinks"] == "random":
        sinks = torch.randn(heads, generator=generator)
    elif case["sinks"] == "extreme":
        sinks = torch.tensor([float("-inf"), 30.0, 0.5, float("-inf")][:heads])
    return q, kv, indices, sinks


def _relative(got: Any, want: Any, per_head: bool = False) -> float:
    """max |got - want| / max |want|, per head (dim 1) when asked, the worst head kept."""
    import torch

    got, want = got.detach().double(), want.detach().double()
    if got.shape != want.shape:
        return float("inf")
    if want.numel() == 0:
        return 0.0
    if per_head:
        got, want = got.transpose(0, 1).reshape(want.shape[1], -1), want.transpose(0, 1).reshape(want.shape[1], -1)
    else:
        got, want = got.reshape(1, -1), want.reshape(1, -1)
    diff = (got - want).abs().amax(1)
    scale = want.abs().amax(1)
    return float(torch.where(scale > 0, diff / torch.where(scale > 0, scale, 1.0), diff).max())


def _run_case(name: str, case: dict[str, Any]) -> dict[str, Any]:
    import torch

    from sparsecp.torch import _attention_triton as triton_attention
    from sparsecp.torch._attention_reference import reference_sparse_attention

    generator = torch.Generator().manual_seed(SEED + sum(map(ord, name)))
    q, kv, indices, sinks = _inputs(case, generator)
    scale, value_dim = 0.7 / case["qk"] ** 0.5, case["value"]
    reason = triton_attention.supports(q, kv, indices, sinks)
    if reason is not None:
        return {"error": f"supports() refused: {reason}"}
    saved_config, saved_budget = triton_attention._config, triton_attention.CONTRIB_BUDGET_BYTES
    if "block_heads" in case:
        def small_blocks(heads: int, qk_dim: int, value_dim: int, dtype: torch.dtype) -> dict[str, int]:
            return dict(saved_config(heads, qk_dim, value_dim, dtype), FWD_BH=case["block_heads"],
                        BWD_BH=case["block_heads"])
        triton_attention._config = small_blocks
    if "chunk_rows" in case:
        head_blocks = -(-case["heads"] // triton_attention._config(case["heads"], case["qk"], case["value"],
                                                                  q.dtype)["BWD_BH"])
        triton_attention.CONTRIB_BUDGET_BYTES = case["chunk_rows"] * head_blocks * case["columns"] * case["qk"] * 4
    try:
        out, lse = triton_attention.forward(q, kv, indices, scale, value_dim, sinks)
        q64, kv64 = q.double().requires_grad_(), kv.double().requires_grad_()
        sinks64 = sinks.double().requires_grad_() if sinks is not None else None
        ref_out, ref_lse = reference_sparse_attention(q64, kv64, indices, scale, value_dim, sinks64)
        grad_out = torch.randn(ref_out.shape, generator=generator, dtype=torch.float64)
        (ref_out * grad_out).sum().backward()
        ref_dq = q64.grad if q64.grad is not None else torch.zeros_like(q64)
        ref_dkv = kv64.grad if kv64.grad is not None else torch.zeros_like(kv64)
        ref_ds = None
        if sinks64 is not None:
            ref_ds = sinks64.grad if sinks64.grad is not None else torch.zeros_like(sinks64)
        result: dict[str, Any] = {
            "out_dtype": str(out.dtype), "lse_dtype": str(lse.dtype),
            "out": _relative(out, ref_out, per_head=True),
            "lse_infinite_match": bool(torch.equal(torch.isinf(lse), torch.isinf(ref_lse))),
            "lse": _relative(torch.where(torch.isinf(lse), 0.0, lse), torch.where(torch.isinf(ref_lse), 0.0, ref_lse),
                             per_head=True),
        }
        args = (q, kv, indices, scale, value_dim, sinks, out, lse, grad_out.float())
        first = triton_attention.backward(*args)
        again = triton_attention.backward(*args)
        atomic = triton_attention.backward(*args, deterministic=False)
        result["bit_identical"] = all(
            (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
            for a, b in zip(first, again))
        for mode, (dq, dkv, dsinks) in (("deterministic", first), ("atomic", atomic)):
            result[f"{mode}_dq"] = _relative(dq, ref_dq, per_head=True)
            result[f"{mode}_dkv"] = _relative(dkv, ref_dkv)
            if ref_ds is None:
                result[f"{mode}_dsinks_none"] = dsinks is None
            else:
                result[f"{mode}_dsinks"] = _relative(dsinks, ref_ds) if dsinks is not None else float("inf")
        return result
    finally:
        triton_attention._config, triton_attention.CONTRIB_BUDGET_BYTES = saved_config, saved_budget


def _interpreter_main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    import torch

    torch.set_num_threads(1)
    print(f"seed {SEED}", flush=True)
    for name, case in CASES.items():
        try:
            result = _run_case(name, case)
        except Exception as error:  # reported by the test of that case
            result = {"error": f"{type(error).__name__}: {error}"}
        print("RESULT " + json.dumps({"case": name, **result}), flush=True)


def _ptxas(arch: int) -> str | None:
    try:
        from triton.backends.nvidia.compiler import get_ptxas  # type: ignore[import-untyped]

        path = get_ptxas(arch).path
    except Exception:
        path = None
    for candidate in (path, "/usr/local/cuda/bin/ptxas"):
        if candidate and os.path.exists(candidate):
            return str(candidate)
    return None


def _compile_main(archs: list[int]) -> None:
    import triton  # type: ignore[import-untyped]
    from triton.backends.compiler import GPUTarget  # type: ignore[import-untyped]

    from sparsecp.torch import _attention_triton as triton_attention

    for arch in archs:
        ptxas = _ptxas(arch)
        for config, (heads, qk, value) in CONFIGS.items():
            for name, fn, signature, constexprs, attrs, options in triton_attention._compile_specs(heads, qk, value):
                report: dict[str, Any] = {"arch": arch, "config": config, "kernel": name}
                try:
                    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
                    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
                    report["shared"] = int(compiled.metadata.shared)
                    if ptxas is None:
                        report["ptxas"] = "missing"
                    else:
                        # Triton ran ptxas -v already; its report is not kept, so run it once more.
                        with tempfile.TemporaryDirectory() as folder:
                            ptx = os.path.join(folder, "kernel.ptx")
                            with open(ptx, "w") as file:
                                file.write(compiled.asm["ptx"])
                            done = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}a", ptx, "-o",
                                                   os.path.join(folder, "kernel.cubin")],
                                                  capture_output=True, text=True, timeout=120)
                        log = done.stdout + done.stderr
                        registers = re.findall(r"Used (\d+) registers", log)
                        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
                        report["registers"] = int(registers[0]) if registers else None
                        report["spill_bytes"] = sum(int(a) + int(b) for a, b in spills) if spills else None
                        if done.returncode != 0:
                            report["error"] = f"ptxas rc {done.returncode}: {log[-400:]}"
                except Exception as error:
                    report["error"] = f"{type(error).__name__}: {str(error)[-600:]}"
                print("RESULT " + json.dumps(report), flush=True)


# ---- the tests: each kind's process starts at the first test that needs any, all at once ----

_processes: dict[str, subprocess.Popen[str]] = {}
_results: dict[str, tuple[list[dict[str, Any]], str]] = {}


def _start_all() -> None:
    if _processes:
        return
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    environment.pop("TRITON_INTERPRET", None)
    environment.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    kinds = {"interpreter": (["interpreter"], dict(environment, TRITON_INTERPRET="1")),
             **{f"compile_{arch}": (["compile", str(arch)], environment) for arch in ARCHS}}
    for kind, (args, env) in kinds.items():
        _processes[kind] = subprocess.Popen([sys.executable, os.path.abspath(__file__), *args], env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(kind: str) -> tuple[list[dict[str, Any]], str]:
    pytest.importorskip("triton", reason="Triton is not installed")
    _start_all()
    if kind not in _results:
        process = _processes[kind]
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            stderr += f"\n(timed out after {TIMEOUT} s)"
        found = [json.loads(line[len("RESULT "):]) for line in stdout.splitlines() if line.startswith("RESULT ")]
        _results[kind] = (found, stdout[-3000:] + stderr[-3000:])
    return _results[kind]


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_reference(name: str) -> None:
    found, log = _wait("interpreter")
    print(f"seed {SEED} (SPARSECP_TEST_SEED)")
    results = {r["case"]: r for r in found}
    assert name in results, f"case {name} did not report (seed {SEED}):\n{log}"
    result = results[name]
    assert "error" not in result, f"seed {SEED}: {result['error']}\n{log}"
    assert result["out_dtype"] == "torch.float32" and result["lse_dtype"] == "torch.float32", result
    assert result["lse_infinite_match"], result
    assert result["bit_identical"], f"two deterministic backwards differ (seed {SEED}): {result}"
    for key, value in result.items():
        if key.endswith("_none"):
            assert value, f"{key} (seed {SEED}): {result}"
        elif isinstance(value, float):
            assert value <= TOLERANCE, f"{key} relative error {value:.3g} > {TOLERANCE} (seed {SEED}): {result}"


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_for_target(arch: int, config: str) -> None:
    found, log = _wait(f"compile_{arch}")
    reports = [r for r in found if r["config"] == config]
    assert len(reports) == 4, f"expected 4 kernels at {config} for sm_{arch}:\n{log}"
    for report in reports:
        print(json.dumps(report))
    for report in reports:
        assert "error" not in report, report
        assert report["shared"] <= SHARED_LIMIT, f"shared memory over 227 KiB: {report}"
    if any(r.get("ptxas") == "missing" for r in reports):
        pytest.skip(f"no ptxas for sm_{arch} (neither Triton's bundled one nor /usr/local/cuda/bin/ptxas): "
                    "registers and spills not checked")
    for report in reports:
        assert report["registers"] is not None and report["spill_bytes"] is not None, report
        assert report["spill_bytes"] == 0, f"register spills: {report}"


def test_supports_says_why() -> None:
    pytest.importorskip("triton", reason="Triton is not installed")
    import torch

    from sparsecp.torch import _attention_triton as triton_attention

    q, kv = torch.zeros(2, 4, 32), torch.zeros(5, 32)
    indices = torch.zeros(2, 3, dtype=torch.int32)
    assert triton_attention.available()
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    cpu = triton_attention.supports(q, kv, indices, None)
    assert (cpu is None) if interpreting else (cpu is not None and "TRITON_INTERPRET" in cpu)
    assert "dtype" in (triton_attention.supports(q.double(), kv.double(), indices, None) or "")
    assert "qk_dim" in (triton_attention.supports(q, torch.zeros(5, 16), indices, None) or "")
    assert "qk_dim" in (triton_attention.supports(torch.zeros(2, 4, 1024), torch.zeros(5, 1024), indices, None)
                        or "")
    assert "indices" in (triton_attention.supports(q, kv, indices.to(torch.int16), None) or "")
    assert "sinks" in (triton_attention.supports(q, kv, indices, torch.zeros(3)) or "")


if __name__ == "__main__":
    if sys.argv[1] == "interpreter":
        _interpreter_main()
    elif sys.argv[1] == "compile":
        _compile_main([int(a) for a in sys.argv[2:]])
