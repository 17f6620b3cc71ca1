#!/usr/bin/env python3
"""shared_compressed_indexer_kl_loss on CPU: the fused C++ kernel against the chunked torch
formulation, in one process with the same threads, and the peak extra memory of each.

Shapes (``--shape``): ``v4`` (the default, DeepSeek-V4): B = 1, --rows query rows (2048), 64
index heads x 128, 64 attention heads x 512, 2048 compressed keys, each row 512 distinct random
keys (int32, sorted); ``example``: the small DeepSeek-V4 of ``python/examples/train_deepseek_v4.py``
and of the memory benchmark, 32 index heads x 64, 4 attention heads x 64, 2048 keys, top-k 128
(below the seed's TopK512 rule, so called through ``indexer_kl_loss_any_topk``, as the model
layers call it). Float32 values in [-1, 1] (merge weights scaled by 4 / sqrt(H * D), sinks by 2).
Counted work per selected (row, id) pair: teacher 2 * Hm * Dm, student forward 2 * H * D and the
two gradient products 2 * 2 * H * D (as `sparsecp bench kl`).

Speed: one repetition runs forward + backward of ``shared_compressed_indexer_kl_loss`` on
fresh leaf tensors once on each path: "fused" (CPU tensors -> the C++ kernel, ``threads`` =
--threads) and "torch" (the same call with ``SPARSECP_TORCH_PATH=1``: the chunked torch
implementation ``_kl_torch.kl_loss_and_grads_torch``, ``query_chunk_size`` 256, under
``torch.set_num_threads(--threads)``). The order alternates between repetitions; the
figures are medians and ranges over --repeats repetitions, and the speedup is the median
of the per-repetition ratios. Beside them, torch's own 2048^3 float32 matmul in the same process
and threads, and the fused path's rate as a fraction of it. Both paths' loss and gradients are compared once.

Memory: each path runs in a fresh subprocess (``--probe PATH``) with glibc's mmap and trim
thresholds fixed at 128 KiB (``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``, so
freed blocks go back to the system and resident memory follows live allocations). After a
small warm-up call (thread pools), the probe resets the kernel's resident high-water mark
(``/proc/self/clear_refs`` = 5), runs the forward and reads ``VmHWM``, then resets it again
and runs the backward; extra = high-water mark - resident size before. The three gradients
(fp32, the size of index_query, index_key and merge_weight) are outputs both paths must
hold; the figures are given with and without them. Every allocation torch and the kernel
make is resident (written), so RSS sees them; the fused kernel's own bound is
``indexer_kl_scratch_bytes``.

Kernel ISA: the fused path runs what ``isa="auto"`` resolves to, reported as ``isa``:
``SPARSECP_ISA=portable|avx2|avx512`` in the environment forces one (the probes inherit it),
e.g. ``SPARSECP_ISA=avx2`` to measure the AVX2 kernel on an AVX-512 CPU.

Usage:
  OPENBLAS_CORETYPE=SkylakeX .venv/bin/python python/benchmarks/kl_speed.py [--rows 2048] [--threads 2] \
      [--repeats 5] [--json]
  SPARSECP_ISA=avx2 .venv/bin/python python/benchmarks/kl_speed.py --json
  .venv/bin/python python/benchmarks/kl_speed.py --shape example --rows 8192 --threads 1
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

import sparsecp
import sparsecp.torch as sct
from sparsecp.torch.kl import indexer_kl_loss_any_topk

# heads x head_dim (the indexer), att_heads x att_dim (the teacher), compressed keys, top-k
SHAPES: dict[str, dict[str, int]] = {
    "v4": {"heads": 64, "head_dim": 128, "att_heads": 64, "att_dim": 512, "keys": 2048, "topk": 512},
    "example": {"heads": 32, "head_dim": 64, "att_heads": 4, "att_dim": 64, "keys": 2048, "topk": 128},
}
NAMES = ("index_query", "index_key", "merge_weight", "attention_query", "compressed_key", "topk_indices", "sinks")


def make_inputs(rows: int, shape: dict[str, int], seed: int = 1) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.rand(*shape, generator=generator) * 2 - 1) * scale

    heads, dim, att_heads, att_dim = shape["heads"], shape["head_dim"], shape["att_heads"], shape["att_dim"]
    keys = shape["keys"]
    ids = torch.rand(rows, keys, generator=generator).argsort(dim=1)[:, :shape["topk"]].sort(dim=1).values
    return dict(index_query=rand(1, rows, heads, dim), index_key=rand(1, keys, dim),
                merge_weight=rand(1, rows, heads, scale=4.0 / (heads * dim) ** 0.5),
                attention_query=rand(1, att_heads, rows, att_dim), compressed_key=rand(1, keys, att_dim),
                topk_indices=ids.to(torch.int32)[None], sinks=rand(att_heads, scale=2.0))


def flops(rows: int, shape: dict[str, int]) -> float:
    per_pair = 2.0 * shape["att_heads"] * shape["att_dim"] + 6.0 * shape["heads"] * shape["head_dim"]
    return rows * shape["topk"] * per_pair


def set_path(path: str) -> None:
    if path == "torch":
        os.environ["SPARSECP_TORCH_PATH"] = "1"
    else:
        os.environ.pop("SPARSECP_TORCH_PATH", None)


def leaves(inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [inputs[n].clone().requires_grad_() for n in NAMES[:3]]


def forward(inputs: dict[str, torch.Tensor], student: list[torch.Tensor], threads: int) -> torch.Tensor:
    """The seed's entry point where its TopK512 rule holds, else the one the model layers call."""
    scale = inputs["attention_query"].shape[-1] ** -0.5
    if inputs["topk_indices"].shape[-1] == 512:
        return sct.shared_compressed_indexer_kl_loss(*student, *(inputs[n] for n in NAMES[3:]),
                                                     attention_scale=scale, loss_coeff=1.0,
                                                     query_chunk_size=256, threads=threads)
    return indexer_kl_loss_any_topk(*student, *(inputs[n] for n in NAMES[3:]), attention_scale=scale,
                                    loss_coeff=1.0, query_chunk_size=256, threads=threads)


def step(path: str, inputs: dict[str, torch.Tensor], threads: int) -> tuple[float, float, list[torch.Tensor]]:
    """Forward + backward on fresh leaves; (seconds, loss, gradients)."""
    set_path(path)
    student = leaves(inputs)
    start = time.perf_counter()
    loss = forward(inputs, student, threads)
    loss.backward()
    seconds = time.perf_counter() - start
    return seconds, float(loss.detach()), [t.grad for t in student]


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def probe(path: str, rows: int, threads: int, shape: dict[str, int]) -> dict[str, Any]:
    """Peak resident memory above the inputs (this process only runs `path`)."""
    torch.set_num_threads(threads)
    step(path, make_inputs(8, shape, seed=2), threads)  # thread pools, lazy initialisation
    inputs = make_inputs(rows, shape)
    set_path(path)
    student = leaves(inputs)
    gc.collect()
    before = _status("VmRSS")
    _reset_peak()
    loss = forward(inputs, student, threads)
    forward_peak = _status("VmHWM") - before
    after_forward = _status("VmRSS")
    _reset_peak()
    loss.backward()
    backward_peak = _status("VmHWM") - before
    grad_bytes = sum(4 * t.numel() for t in student)
    scratch = sct.indexer_kl_scratch_bytes(*(inputs[n] for n in NAMES), threads=threads,
                                           any_topk=shape["topk"] != 512)
    return {"path": path, "rows": rows, "forward_peak": forward_peak, "after_forward": after_forward - before,
            "backward_peak": backward_peak, "peak": max(forward_peak, backward_peak), "grad_bytes": grad_bytes,
            "scratch_bytes": scratch}


def run_probe(path: str, rows: int, threads: int, shape: str) -> dict[str, Any]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072",
               OMP_NUM_THREADS=str(threads))
    done = subprocess.run([sys.executable, __file__, "--probe", path, "--rows", str(rows), "--threads", str(threads),
                           "--shape", shape], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)


def torch_chunk_bytes(chunk: int, shape: dict[str, int]) -> dict[str, int]:
    """The largest tensors one chunk of the torch path holds at once (float32 unless noted)."""
    c, topk = chunk, shape["topk"]
    return {"gathered teacher keys [C, T, Dm]": 4 * c * topk * shape["att_dim"],
            "gathered student keys [C, T, D]": 4 * c * topk * shape["head_dim"],
            "key-gradient contributions [C, T, D] (+ its masked copy)": 2 * 4 * c * topk * shape["head_dim"],
            "teacher logits, +sink, softmax [C, Hm, T+1] (x3)": 3 * 4 * c * shape["att_heads"] * (topk + 1),
            "student z, ReLU, dz, mask [C, H, T] (x4)": 4 * 4 * c * shape["heads"] * topk}


def matmul_gflops(threads: int, repeats: int = 3) -> float:
    """torch's own 2048 x 2048 float32 matmul in these threads (the median of ``repeats``)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - start)
    return 2.0 * 2048**3 / statistics.median(seconds) / 1e9


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="v4",
                        help="v4 (64 x 128 index heads, 64 x 512 attention heads, top-k 512; default) or example "
                             "(32 x 64, 4 x 64, top-k 128: the example's small model)")
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2, help="kernel threads = torch threads")
    parser.add_argument("--repeats", dest="repeat", type=int, default=5)
    parser.add_argument("--repeat", dest="repeat", type=int, help=argparse.SUPPRESS)  # the old spelling
    parser.add_argument("--memory-rows", default="512,2048,4096", help="row counts of the memory probes")
    parser.add_argument("--probe", choices=["fused", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    if args.probe:
        print(json.dumps(probe(args.probe, args.rows, args.threads, SHAPES[args.shape])))
        return 0

    summary: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "load_before": load(),
                               "isa": sparsecp.kernel_isa(), "threads": args.threads, "rows": args.rows,
                               "shape": args.shape, **SHAPES[args.shape],
                               "torch": torch.__version__, "gflop": flops(args.rows, shape) / 1e9,
                               "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}
    torch.set_num_threads(args.threads)
    inputs = make_inputs(args.rows, shape)
    _, fused_loss, fused_grads = step("fused", inputs, args.threads)  # warm-up and agreement
    _, torch_loss, torch_grads = step("torch", inputs, args.threads)
    summary["loss_relative"] = abs(fused_loss - torch_loss) / abs(torch_loss)
    summary["grad_relative"] = [float((a - b).norm() / b.norm()) for a, b in zip(fused_grads, torch_grads)]
    times: dict[str, list[float]] = {"fused": [], "torch": []}
    for repetition in range(args.repeat):
        order = ("fused", "torch") if repetition % 2 == 0 else ("torch", "fused")
        for path in order:
            times[path].append(step(path, inputs, args.threads)[0])
    set_path("fused")
    ratios = [t / f for f, t in zip(times["fused"], times["torch"])]
    for path, samples in times.items():
        summary[path] = {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples),
                         "gflops": flops(args.rows, shape) / statistics.median(samples) / 1e9}
    summary["speedup_median"] = statistics.median(ratios)
    summary["matmul_gflops"] = matmul_gflops(args.threads)  # in the same process and threads
    summary["fused_to_matmul"] = summary["fused"]["gflops"] / summary["matmul_gflops"]
    summary["speedup_range"] = [min(ratios), max(ratios)]
    summary["load_after_timing"] = load()

    memory = []
    for rows in (int(r) for r in args.memory_rows.split(",")):
        for path in ("fused", "torch"):
            memory.append(run_probe(path, rows, args.threads, args.shape))
    summary["memory"] = memory
    by = {(m["path"], m["rows"]): m for m in memory}
    summary["memory_ratio"] = {
        rows: {"peak": by["torch", rows]["peak"] / by["fused", rows]["peak"],
               "beyond_gradients": (by["torch", rows]["forward_peak"] - by["torch", rows]["grad_bytes"])
               / (by["fused", rows]["forward_peak"] - by["fused", rows]["grad_bytes"])}
        for rows in sorted({m["rows"] for m in memory})}
    summary["torch_chunk_bytes_analytic"] = torch_chunk_bytes(256, shape)
    summary["load_after"] = load()
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    mib = 1 << 20
    print(f"{summary['date']}, load {summary['load_before']} -> {summary['load_after']}, kernel {summary['isa']}, "
          f"{args.threads} threads (torch and kernel), torch {torch.__version__}")
    print(f"{args.rows} rows of shape {args.shape} ({shape['heads']} x {shape['head_dim']} index heads, "
          f"{shape['att_heads']} x {shape['att_dim']} attention heads, {shape['keys']} keys, top-k {shape['topk']}), "
          f"{summary['gflop']:.1f} GFLOP counted; fused vs torch: loss rel. "
          f"{summary['loss_relative']:.1e}, gradients rel. {', '.join(f'{g:.1e}' for g in summary['grad_relative'])}")
    for path in ("fused", "torch"):
        t = summary[path]
        of_matmul = f", {summary['fused_to_matmul']:.2f} of torch's float32 matmul" if path == "fused" else ""
        print(f"{path:5s}: median {t['median_s']:.3f} s (range {t['min_s']:.3f}-{t['max_s']:.3f}), "
              f"{t['gflops']:.1f} GFLOP/s{of_matmul}")
    print(f"torch's 2048^3 float32 matmul: {summary['matmul_gflops']:.1f} GFLOP/s (same process and threads)")
    print(f"speedup fused over torch: median {summary['speedup_median']:.2f}x "
          f"(range {summary['speedup_range'][0]:.2f}-{summary['speedup_range'][1]:.2f}), {args.repeat} repetitions")
    print("peak extra resident memory (MiB): forward / backward; forward beyond the gradients; scratch bound")
    for m in memory:
        print(f"  {m['path']:5s} rows {m['rows']:5d}: "
              f"{m['forward_peak'] / mib:8.1f} / {m['backward_peak'] / mib:8.1f}; "
              f"{(m['forward_peak'] - m['grad_bytes']) / mib:8.1f}; gradients {m['grad_bytes'] / mib:.1f}, "
              f"scratch bound {m['scratch_bytes'] / mib:.2f}")
    for rows, ratio in summary["memory_ratio"].items():
        print(f"  rows {rows}: torch / fused peak {ratio['peak']:.1f}x, beyond the gradients "
              f"{ratio['beyond_gradients']:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
