#!/usr/bin/env python3
"""One prepared GPU check of sparsecp's attention and model path (issue 46), in at most 7 minutes.

On one CUDA GPU, with what a stock CUDA image has (Python 3.12, torch 2.11, Triton 3.6, nvcc,
cmake, ninja, nanobind, scikit-build-core; no network), it runs these steps and writes one JSON
file (``$OUT/gpu_attention_check.json``, or ``--out``):

1. ``build``: ``import sparsecp`` (with its C++ extension); when that fails, ``pip install
   --no-build-isolation --no-deps --no-index .`` from the repository root (``--build always``
   forces it, ``never`` skips it). transformers without DeepSeek-V4 (5.17) gets the wheel in
   ``--wheels`` (default ``.cache/wheels``, where ``scripts/pytest.sh`` keeps it) installed with
   ``--no-index --no-deps``.
2. ``attention-v4`` / ``attention-v32``: ``sparse_attention`` forward + backward in bfloat16 on
   Triton (and FlashMLA / cuDNN-frontend where they import and take the input) at DeepSeek-V4-Flash
   (4,096 rows, 64 heads, K=V 512, 640 columns, sinks) and V3.2 (4,096 rows, 64 heads, 576/512,
   2,048 columns) shapes: out, lse, dq, dkv, dsinks of a row subset against the float64
   reference (the backward is run a second time with the output gradient zero outside the
   subset, so that dkv and dsinks hold the subset's rows only); ms and TFLOP/s of the forward
   and of forward + backward (``2 * rows * heads * columns * (4 * qk + 3 * value)``), against
   the chunked torch path and torch's bfloat16 matmul measured in the same process.
3. ``selector-32k`` / ``selector-128k``: the V4 model selector (``deepseek_v4.ModelSelector``:
   64 index heads of 128, top-k 512) on the last rows of a document whose compressed bank has
   32K / 128K keys: ms, and its ids against a dense float32 top-k.
4. ``model-v4``: a 2-layer DeepSeek-V4 (transformers) under ``sparsecp.models.deepseek_v4`` on
   one GPU, an NCCL group of one, against the per-document model (``python/tests/v4_tasks.py``'s
   oracle): logits, loss and every gradient in float32, the attention backend the layers took
   (``context_parallel_state(model).attention_path``). ``model-v4-wide`` does the same in
   bfloat16 with 64 heads of 512 (the shapes FlashMLA and cuDNN take), within bfloat16 tolerance.
5. Peak GPU memory per step (``torch.cuda.max_memory_allocated``).

Each step prints a PASS / FAIL / SKIP line; the exit status is 0 only when none failed. Steps
start only while the time budget (``--budget-s``, default 400 s) lasts; the rest are skipped.

``--cpu`` is a dry run of every step on CPU tensors at tiny shapes (Triton under its interpreter:
``TRITON_INTERPRET=1`` is set before anything imports Triton; gloo instead of NCCL; nothing is
built or installed); ``python/tests/test_gpu_attention_check.py`` runs it.

Usage::

    python python/examples/gpu_attention_check.py [--out FILE] [--budget-s 400] [--cpu]
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import platform
import resource
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
REFERENCE_ROWS = 64  # rows compared with the float64 reference


# --- shapes -------------------------------------------------------------------------------------

def attention_shapes(cpu: bool) -> dict[str, dict[str, Any]]:
    """name: rows, heads, qk, value, keys, columns, sinks. Full size on a GPU; tiny on --cpu (the
    same structure: K=V with sinks; qk above value, a qk tail)."""
    if cpu:
        return {"attention-v4": dict(rows=24, heads=4, qk=64, value=64, keys=96, columns=40, sinks=True),
                "attention-v32": dict(rows=20, heads=4, qk=72, value=64, keys=80, columns=48, sinks=False)}
    return {"attention-v4": dict(rows=4096, heads=64, qk=512, value=512, keys=8192, columns=640, sinks=True),
            "attention-v32": dict(rows=4096, heads=64, qk=576, value=512, keys=8192, columns=2048, sinks=False)}


def selector_shapes(cpu: bool) -> dict[str, dict[str, Any]]:
    if cpu:
        return {"selector-32k": dict(keys=256, rows=16, heads=4, dim=16, topk=8, ratio=4),
                "selector-128k": dict(keys=1024, rows=16, heads=4, dim=16, topk=8, ratio=4)}
    return {"selector-32k": dict(keys=32768, rows=512, heads=64, dim=128, topk=512, ratio=4),
            "selector-128k": dict(keys=131072, rows=512, heads=64, dim=128, topk=512, ratio=4)}


# --- helpers ------------------------------------------------------------------------------------

class Context:
    def __init__(self, torch: Any, device: Any, cpu: bool) -> None:
        self.torch, self.device, self.cpu = torch, device, cpu

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def time_ms(self, fn: Callable[[], Any], repeat: int, warmup: int = 1) -> float:
        """Median milliseconds of ``fn`` (CUDA events on a GPU)."""
        torch = self.torch
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(repeat):
            if self.device.type == "cuda":
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop))
            else:
                begin = time.perf_counter()
                fn()
                times.append((time.perf_counter() - begin) * 1e3)
        times.sort()
        return times[len(times) // 2]

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.reset_peak_memory_stats()

    def peak_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(self.torch.cuda.max_memory_allocated())
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # the process's, on CPU


def relative(got: Any, want: Any) -> float:
    """max |got - want| / max |want| (0 for empty tensors)."""
    got, want = got.detach().double(), want.detach().double()
    if want.numel() == 0:
        return 0.0
    scale = float(want.abs().max())
    return float((got - want).abs().max()) / (scale if scale > 0 else 1.0)


# --- step 1: build ------------------------------------------------------------------------------

def _pip(*args: str, timeout: int) -> str:
    command = [sys.executable, "-m", "pip", "install", "--no-input", *args]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    return " ".join(command[3:])


def step_build(args: argparse.Namespace) -> dict[str, Any]:
    did: list[str] = []

    def importable() -> str | None:
        try:
            import sparsecp._core  # noqa: F401
            import sparsecp.torch  # noqa: F401
            return None
        except Exception as error:  # the extension missing or built for another Python
            for name in [m for m in sys.modules if m == "sparsecp" or m.startswith("sparsecp.")]:
                del sys.modules[name]
            return f"{type(error).__name__}: {error}"

    why = importable()
    if args.cpu or args.build == "never":
        if why is not None:
            raise RuntimeError(f"sparsecp does not import ({why}); --build never / --cpu build nothing "
                               "(PYTHONPATH=python after the C++ build, or pip install --no-build-isolation .)")
        did.append("sparsecp imports (nothing built)")
    elif why is not None or args.build == "always":
        # The extension links OpenMP and OpenBLAS (CMakeLists: pkg-config openblas): say so first.
        probe = subprocess.run(["pkg-config", "--exists", "openblas"], capture_output=True)
        if probe.returncode != 0:
            raise RuntimeError(f"sparsecp does not import ({why}) and cannot be built here: pkg-config finds no "
                               "openblas (the C++ extension needs OpenBLAS and OpenMP: apt-get install "
                               "libopenblas-dev, or a prebuilt sparsecp wheel for this Python)")
        did.append(_pip("--no-build-isolation", "--no-deps", "--no-index", str(REPO), timeout=args.build_timeout))
        importlib.invalidate_caches()
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != (REPO / "python").resolve()]
        why = importable()
        if why is not None:
            raise RuntimeError(f"sparsecp does not import after the build: {why}")
    else:
        did.append("sparsecp imports (no build needed)")
    try:
        importlib.import_module("transformers.models.deepseek_v4")
    except Exception:
        wheels = sorted(Path(args.wheels).glob("transformers-*.whl")) if Path(args.wheels).is_dir() else []
        if args.cpu or not wheels:
            did.append(f"transformers has no DeepSeek-V4 and no wheel in {args.wheels}: the model steps will fail")
        else:
            did.append(_pip("--no-index", "--no-deps", str(wheels[-1]), timeout=120))
            for name in [m for m in sys.modules if m == "transformers" or m.startswith("transformers.")]:
                del sys.modules[name]
            importlib.invalidate_caches()
    import sparsecp

    return {"did": did, "sparsecp": str(Path(sparsecp.__file__).parent)}


# --- step 2: attention --------------------------------------------------------------------------

def _attention_inputs(ctx: Context, shape: dict[str, Any], seed: int) -> dict[str, Any]:
    torch = ctx.torch
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows, heads, qk, keys, columns = shape["rows"], shape["heads"], shape["qk"], shape["keys"], shape["columns"]
    dtype = torch.float32 if ctx.cpu else torch.bfloat16
    q = (torch.randn(rows, heads, qk, generator=g) * 0.5).to(dtype)
    kv = (torch.randn(keys, qk, generator=g) * 0.5).to(dtype)
    # Each row: ids spread over the bank, the last few -1 (a short row), one row with none.
    indices = torch.randint(0, keys, (rows, columns), generator=g, dtype=torch.int32)
    indices[:, columns - columns // 16:] = -1
    indices[3] = -1
    sinks = torch.randn(heads, generator=g) if shape["sinks"] else None
    grad = torch.randn(rows, heads, shape["value"], generator=g).to(dtype)
    moved = {"q": q, "kv": kv, "indices": indices, "sinks": sinks, "grad": grad}
    return {k: (None if v is None else v.to(ctx.device)) for k, v in moved.items()}


def _flops(shape: dict[str, Any]) -> tuple[float, float]:
    """(forward, forward + backward) flops of one call."""
    base = 2.0 * shape["rows"] * shape["heads"] * shape["columns"]
    return base * (shape["qk"] + shape["value"]), base * (4 * shape["qk"] + 3 * shape["value"])


def matmul_rate(ctx: Context) -> dict[str, float]:
    torch = ctx.torch
    n = 256 if ctx.cpu else 8192
    dtype = torch.float32 if ctx.cpu else torch.bfloat16
    a = torch.randn(n, n, device=ctx.device, dtype=dtype)
    b = torch.randn(n, n, device=ctx.device, dtype=dtype)
    ms = ctx.time_ms(lambda: a @ b, repeat=3 if ctx.cpu else 10, warmup=1 if ctx.cpu else 3)
    tflops = 2.0 * n ** 3 / (ms * 1e-3) / 1e12
    return {"n": n, "dtype": str(dtype), "ms": ms, "tflops": tflops, "summary": f"{n}^3 {dtype}: {tflops:.1f} TFLOP/s"}


def step_attention(ctx: Context, name: str, shape: dict[str, Any], matmul: dict[str, float]) -> dict[str, Any]:
    torch = ctx.torch
    from sparsecp.torch._attention_reference import reference_sparse_attention
    from sparsecp.torch.attention import sparse_attention, sparse_attention_backends

    x = _attention_inputs(ctx, shape, seed=46 + len(name))
    scale, value = shape["qk"] ** -0.5, shape["value"]
    reasons = sparse_attention_backends(x["q"], x["kv"], x["indices"], x["sinks"], value_dim=value)
    backends = [b for b in ("flashmla", "cudnn", "triton") if reasons[b] is None]
    if "triton" not in backends:
        raise RuntimeError(f"triton cannot take the input: {reasons['triton']}")
    subset = min(REFERENCE_ROWS, shape["rows"])
    mask = torch.zeros(shape["rows"], 1, 1, device=ctx.device, dtype=x["grad"].dtype)
    mask[:subset] = 1
    # The float64 reference on the subset's rows (its dkv and dsinks: theirs only).
    q64 = x["q"][:subset].double().requires_grad_()
    kv64 = x["kv"].double().requires_grad_()
    s64 = None if x["sinks"] is None else x["sinks"].double().requires_grad_()
    ref_out, ref_lse = reference_sparse_attention(q64, kv64, x["indices"][:subset], scale, value, s64)
    (ref_out * x["grad"][:subset].double()).sum().backward()
    want = {"out": ref_out.detach(), "lse": ref_lse.float(), "dq": q64.grad, "dkv": kv64.grad,
            "dsinks": None if s64 is None else s64.grad}
    del q64, kv64, s64, ref_out
    tolerance = 1e-4 if ctx.cpu else 3e-2
    fwd_flops, total_flops = _flops(shape)
    result: dict[str, Any] = {"shape": shape, "backends": {}, "reasons": reasons, "reference_rows": subset,
                              "tolerance": tolerance}
    failures = []

    def leaves() -> tuple[Any, Any, Any]:
        return (x["q"].detach().requires_grad_(), x["kv"].detach().requires_grad_(),
                None if x["sinks"] is None else x["sinks"].detach().requires_grad_())

    for backend in [*backends, "torch"]:
        ctx.reset_peak()
        q, kv, sinks = leaves()
        out, lse = sparse_attention(q, kv, x["indices"], scale, value_dim=value, sinks=sinks, return_lse=True,
                                    backend=backend)
        (out * mask).backward(x["grad"])  # dkv, dsinks: the subset's rows only
        got = {"out": out[:subset], "lse": lse[:subset], "dq": q.grad[:subset], "dkv": kv.grad,
               "dsinks": None if sinks is None else sinks.grad}
        errors = {}
        for key, reference in want.items():
            if reference is None:
                continue
            if key == "lse":
                finite = torch.isfinite(reference)
                same_inf = bool(torch.equal(torch.isneginf(got[key]), torch.isneginf(reference)))
                errors[key] = relative(got[key][finite], reference[finite]) if same_inf else math.inf
            else:
                errors[key] = relative(got[key], reference)
        del out, lse, q, kv, sinks, got
        entry: dict[str, Any] = {"relative_error": errors}
        if max(errors.values()) > tolerance:
            failures.append(f"{backend}: {errors}")
        repeat = 2 if ctx.cpu else (3 if backend == "torch" else 10)

        def forward(backend: str = backend) -> Any:
            with torch.no_grad():
                return sparse_attention(x["q"], x["kv"], x["indices"], scale, value_dim=value, sinks=x["sinks"],
                                        backend=backend)

        def both(backend: str = backend) -> Any:
            q, kv, sinks = leaves()
            out = sparse_attention(q, kv, x["indices"], scale, value_dim=value, sinks=sinks, backend=backend)
            out.backward(x["grad"])

        entry["forward_ms"] = ctx.time_ms(forward, repeat)
        entry["forward_backward_ms"] = ctx.time_ms(both, repeat)
        entry["forward_tflops"] = fwd_flops / (entry["forward_ms"] * 1e-3) / 1e12
        entry["forward_backward_tflops"] = total_flops / (entry["forward_backward_ms"] * 1e-3) / 1e12
        entry["of_matmul_rate"] = entry["forward_backward_tflops"] / matmul["tflops"]
        entry["peak_bytes"] = ctx.peak_bytes()
        result["backends"][backend] = entry
    triton = result["backends"]["triton"]
    torch_path = result["backends"]["torch"]
    result["triton_over_torch_path"] = torch_path["forward_backward_ms"] / triton["forward_backward_ms"]
    result["summary"] = (f"triton fwd+bwd {triton['forward_backward_ms']:.2f} ms = "
                         f"{triton['forward_backward_tflops']:.1f} TFLOP/s ({triton['of_matmul_rate']:.2f} of the "
                         f"bf16 matmul's {matmul['tflops']:.0f}), {result['triton_over_torch_path']:.1f}x the torch "
                         f"path; max error {max(triton['relative_error'].values()):.2e}; also ran: "
                         f"{', '.join(b for b in backends if b != 'triton') or 'no library'}")
    if failures:
        raise AssertionError("; ".join(failures) + f" (tolerance {tolerance})")
    return result


# --- step 3: the selector -----------------------------------------------------------------------

def step_selector(ctx: Context, shape: dict[str, Any]) -> dict[str, Any]:
    torch = ctx.torch
    from types import SimpleNamespace

    from sparsecp.models.deepseek_v4 import ModelSelector

    keys, rows, heads, dim, topk, ratio = (shape[k] for k in ("keys", "rows", "heads", "dim", "topk", "ratio"))
    dtype = torch.float32 if ctx.cpu else torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(7)
    rank = 64
    projection = torch.nn.Linear(rank, heads * dim, bias=False)
    with torch.no_grad():
        projection.weight.copy_(torch.randn(heads * dim, rank, generator=g) * rank ** -0.5)
    projection = projection.to(device=ctx.device, dtype=dtype)
    indexer = SimpleNamespace(q_b_proj=projection, head_dim=dim, compress_rate=ratio, index_topk=topk,
                              scorer=SimpleNamespace(softmax_scale=dim ** -0.5))
    bank = (torch.randn(keys, dim, generator=g)).to(device=ctx.device, dtype=dtype)
    residual = (torch.randn(1, rows, rank, generator=g)).to(device=ctx.device, dtype=dtype)
    weights = (torch.randn(1, rows, heads, generator=g) * heads ** -0.5).to(device=ctx.device, dtype=dtype)
    cos = torch.ones(1, rows, 1, device=ctx.device, dtype=dtype)
    sin = torch.zeros(1, rows, 1, device=ctx.device, dtype=dtype)

    def rope(q: Any, cos: Any, sin: Any) -> Any:
        return q  # the rotation is the layer's; the step times scoring and top-k

    selector = ModelSelector(indexer, bank, rope)
    # The last `rows` rows of a document whose last row sees every key: one segment.
    segments = [(0, rows, 0, keys, 0)]
    ms = ctx.time_ms(lambda: selector(residual, weights, (cos, sin), segments), repeat=2 if ctx.cpu else 5)
    ids = selector(residual, weights, (cos, sin), segments)[0].long()
    # The dense float32 reference: every row's scores over the keys it sees.
    with torch.no_grad():  # head by head: [rows, heads, keys] at once would not fit at 128K keys
        q = projection(residual[0]).view(rows, heads, dim).float()
        keys_t, w = bank.float().t(), weights[0].float()
        scores = torch.zeros(rows, keys, device=ctx.device)
        for h in range(heads):
            scores += torch.relu(q[:, h] @ keys_t) * indexer.scorer.softmax_scale * w[:, h:h + 1]
        visible = (torch.arange(keys * ratio - rows, keys * ratio, device=ctx.device) + 1) // ratio
        scores = scores.masked_fill(torch.arange(keys, device=ctx.device)[None, :] >= visible[:, None],
                                    float("-inf"))
        kth = torch.topk(scores, topk, dim=1).values[:, -1:]
        chosen = scores.gather(1, ids.clamp(min=0))
        # Every chosen id scores at least the k-th best (within float32 rounding of the sums).
        slack = 1e-5 if ctx.cpu else 2e-3
        below = (chosen < kth - slack * kth.abs().clamp(min=1)) & (ids >= 0)
        want = torch.sort(torch.topk(scores, topk, dim=1).indices, dim=1).values
        same = float((torch.sort(ids, dim=1).values == want).float().mean())
    if bool(below.any()):
        raise AssertionError(f"{int(below.sum())} chosen ids score below the k-th best")
    return {"shape": shape, "ms": ms, "ids_equal_to_dense_topk": same,
            "rows_keys_per_s": rows * keys / (ms * 1e-3), "summary": f"{ms:.2f} ms for {rows} rows x {keys} keys, "
            f"{same:.4f} of ids equal to a dense float32 top-k (the rest: equal scores)"}


# --- step 4: the model --------------------------------------------------------------------------

def _wide_overrides() -> dict[str, Any]:
    """64 heads of 512 (FlashMLA's and cuDNN's shapes), the rest small."""
    return dict(hidden_size=512, num_attention_heads=64, head_dim=512, partial_rotary_factor=0.125, q_lora_rank=128,
                o_groups=8, o_lora_rank=64, index_n_heads=16, index_head_dim=128, index_topk=8,
                moe_intermediate_size=64, n_routed_experts=4)


def step_model(ctx: Context, group: Any, wide: bool) -> dict[str, Any]:
    torch = ctx.torch
    sys.path.insert(0, str(REPO / "python" / "tests"))
    import v4_tasks

    from sparsecp.models import deepseek_v4 as cp_v4

    layers = dict(num_hidden_layers=2, layer_types=["sliding_attention", "compressed_sparse_attention"],
                  mlp_layer_types=["hash_moe", "moe"])
    overrides = dict(layers, **(_wide_overrides() if wide else {}))
    dtype = torch.bfloat16 if wide and not ctx.cpu else torch.float32
    if ctx.cpu:  # the interpreter's cost grows with heads x head_dim: fewer tokens for the wide model
        lengths: tuple[int, ...] = (21, 12) if wide else (61, 23, 40)
    else:
        lengths = (700, 300, 1048) if wide else (300, 120, 500)
    if ctx.device.type == "cuda":  # float32 products in float32 (no TF32), as the per-document model's
        torch.backends.cuda.matmul.allow_tf32 = False
    model = v4_tasks.tiny_model(dtype, 0, **overrides).to(ctx.device)
    input_ids = v4_tasks.packed_ids(lengths).to(ctx.device)
    ctx.reset_peak()
    oracle = v4_tasks.per_document_oracle(model, input_ids, lengths)
    model.train()
    # --cpu: the GPU's route on CPU tensors (Triton under the interpreter, the torch selection path).
    cp_v4.context_parallel(model, group, "spill", attention_backend="triton" if ctx.cpu else None)
    state = cp_v4.context_parallel_state(model)
    ids, positions = cp_v4.shard_batch(input_ids, lengths, group)
    labels = cp_v4.shard_labels(input_ids, lengths, group)
    out = model(input_ids=ids, position_ids=positions, document_lengths=lengths)
    loss = cp_v4.causal_lm_loss(out.logits, labels, lengths)
    loss.backward()
    ctx.sync()
    # float32: sums in another order than the per-document model's; bfloat16: its rounding.
    tolerance = 1e-3 if dtype == torch.float32 else 5e-2
    errors = {"logits": relative(out.logits[0].float(), oracle["logits"].float()),
              "loss": abs(float(loss.detach()) - oracle["loss"]) / max(abs(oracle["loss"]), 1e-12)}
    worst = ("", 0.0)
    for name, parameter in model.named_parameters():
        want = oracle["grads"][name]
        got = parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
        error = relative(got.float(), want.float())
        if error > worst[1]:
            worst = (name, error)
    errors["worst_gradient"] = worst[1]
    result = {"dtype": str(dtype), "lengths": lengths, "attention_path": state.attention_path,
              "relative_error": errors, "worst_gradient": worst[0], "tolerance": tolerance,
              "peak_bytes": ctx.peak_bytes(),
              "summary": f"{state.attention_path} attention, {dtype}: logits {errors['logits']:.1e}, loss "
                         f"{errors['loss']:.1e}, gradients {worst[1]:.1e} ({worst[0]})"}
    if max(errors.values()) > tolerance:
        raise AssertionError(f"{errors} above {tolerance} (worst gradient {worst[0]})")
    return result


# --- driver -------------------------------------------------------------------------------------

def environment(torch: Any, device: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                            "device": str(device)}
    for name in ("triton", "transformers", "flash_mla", "cudnn"):
        try:
            info[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception as error:
            info[name] = f"not importable ({type(error).__name__})"
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        info["cuda"] = torch.version.cuda
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="dry run of every step on CPU at tiny shapes")
    parser.add_argument("--out", default=None, help="JSON file (default: $OUT/gpu_attention_check.json, else "
                                                    "./gpu_attention_check.json)")
    parser.add_argument("--budget-s", type=float, default=400.0, help="start no step after this many seconds")
    parser.add_argument("--build", choices=("auto", "always", "never"), default="auto")
    parser.add_argument("--build-timeout", type=int, default=240)
    parser.add_argument("--wheels", default=str(REPO / ".cache" / "wheels"),
                        help="folder with a transformers wheel that has DeepSeek-V4 (installed only if needed)")
    parser.add_argument("--only", default=None, help="comma-separated step names to run (build always runs)")
    args = parser.parse_args()
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"      # before anything imports Triton
        os.environ["SPARSECP_TORCH_PATH"] = "1"   # the device code paths (selection, KL) on CPU tensors
    began = time.perf_counter()
    out_path = Path(args.out) if args.out else Path(os.environ.get("OUT", ".")) / "gpu_attention_check.json"
    report: dict[str, Any] = {"steps": {}, "cpu_dry_run": args.cpu}
    failed = 0

    def record(name: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        nonlocal failed
        if args.only and name != "build" and name not in args.only.split(","):
            return None
        if time.perf_counter() - began > args.budget_s:
            report["steps"][name] = {"status": "skip", "why": f"time budget {args.budget_s:.0f} s spent"}
            print(f"SKIP {name}: time budget spent", flush=True)
            return None
        start = time.perf_counter()
        try:
            detail = run()
            status = "pass"
        except Exception as error:  # report every step
            failed += 1
            detail = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-4000:]}
            status = "fail"
        seconds = time.perf_counter() - start
        report["steps"][name] = {"status": status, "seconds": round(seconds, 2), **detail}
        line = detail.get("summary") or detail.get("error") or ", ".join(detail.get("did", []))
        print(f"{status.upper()} {name} ({seconds:.1f} s): {line}", flush=True)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(report, indent=1, default=str))  # what ran so far survives a kill
        return detail if status == "pass" else None

    built = record("build", lambda: step_build(args))
    import torch
    import torch.distributed as dist

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_attention_check: FAIL: no CUDA device (--cpu: a dry run on CPU)")
        return 2
    if built is None:
        print("gpu_attention_check: FAIL: the package does not import")
        return 1
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if args.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    else:
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=120), device_id=device)
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("sparsecp.attention").setLevel(logging.INFO)  # the backend picks
    ctx = Context(torch, device, args.cpu)
    report["environment"] = environment(torch, device)
    print(f"gpu_attention_check: {report['environment'].get('gpu', 'CPU dry run')}, torch {torch.__version__}, "
          f"triton {report['environment']['triton']}, transformers {report['environment']['transformers']}",
          flush=True)
    matmul = record("matmul", lambda: matmul_rate(ctx)) or {"tflops": math.nan}
    for name, shape in attention_shapes(args.cpu).items():
        record(name, lambda shape=shape, name=name: step_attention(ctx, name, shape, matmul))
    for name, shape in selector_shapes(args.cpu).items():
        record(name, lambda shape=shape: step_selector(ctx, shape))
    record("model-v4", lambda: step_model(ctx, dist.group.WORLD, wide=False))
    record("model-v4-wide", lambda: step_model(ctx, dist.group.WORLD, wide=True))
    report["seconds"] = round(time.perf_counter() - began, 1)
    report["failed"] = failed
    out_path.write_text(json.dumps(report, indent=1, default=str))
    print(f"gpu_attention_check: {sum(s.get('status') == 'pass' for s in report['steps'].values())} passed, "
          f"{failed} failed, {sum(s.get('status') == 'skip' for s in report['steps'].values())} skipped in "
          f"{report['seconds']} s; {out_path}")
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
