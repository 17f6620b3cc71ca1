#!/usr/bin/env python3
"""sparse_attention on CPU: the C++ kernel against torch's own matmul rate and the chunked torch
path, in one process, same dtype and threads.

Shapes (per query row, as the models run them):
  v4      DeepSeek-V4-Flash: 64 heads, K=V 512 (qk_dim = value_dim = 512), 640 columns (window 128
          + top-k 512), sinks, 8,192 kv rows;
  v32     DeepSeek-V3.2: 64 heads, absorbed MLA 576 / 512, 2,048 columns, no sinks, 8,192 kv rows;
  v32h128 the same with 128 heads;
  small   the example model's (python/examples/train_deepseek_v4.py): 4 heads, K=V 64, 256 columns
          (window 128 + top-k 128), sinks, 8,192 kv rows (16x --rows query rows: each is cheap);
  head512 one head, K=V 512, 640 columns, sinks, 8,192 kv rows (4x --rows): the attention of
          step_at_length.py's V4-Flash proportions (--scale 64), where a rank holds one head.
Ids are distinct random kv rows per query row (int32), one row in 16 with its last 10% of
columns -1 (rows near a document start).

Work: ``2 * rows * heads * columns * (qk_dim + value_dim)`` flops forward and
``2 * rows * heads * columns * (3 * qk_dim + 2 * value_dim)`` backward (the recomputed scores,
d probs, d q, d k, d v), ``... * (4 * qk_dim + 3 * value_dim)`` together. Each figure is the
median of --repeats timed calls after one warm-up; "matmul" is torch's ``a @ b`` on 2048 x 2048
(smaller where one product would take over half a second: torch's bf16 matmul on CPUs without
AVX-512 runs reference loops, under 1 GFLOP/s; the size is printed then) in the same dtype and
threads, timed in the same process before, between and after the kernel's
forward and forward + backward measurements (the median of the three);
"ratio" is the kernel's forward + backward rate over it (bf16 rows also give the ratio to
torch's float32 matmul: the machine's limit where its bf16 matmul has no fast kernel). "chunked" is the torch path
(``backend="torch"``, the pre-kernel model path) on --chunked-rows rows. ``--chunk-bytes`` runs
the kernel once per per-thread scratch budget given (``sparse_attention``'s ``chunk_bytes``: the
rows of a block), side by side in the same process; ``--gemm auto,onednn`` likewise once per
choice of products (``SPARSECP_ATTENTION_GEMM``: ``auto`` takes the kernel's direct loops for
float32 with 1, 2, 4 or 8 heads on AVX-512 and AVX2 CPUs, ``onednn`` / ``blas`` that library's products
everywhere, ``direct`` the direct loops wherever they apply, on any ISA).

The fused select kernel (``--select``, on by default), at the shape of ``sparsecp bench select``
(one 8,192-token document, its last --select-rows rows, 2,048 compressed keys, 64 heads x 128,
top-k 512, ratio 4), bf16, through oneDNN (``SPARSECP_SELECT_GEMM=onednn``) and through the
VDPBF16PS kernel (``=native``), each at ``2 * heads * head_dim`` flops per visible (row, key)
pair, against torch's bf16 matmul in the same threads; the ratios are the default path's
(``sparsecp.select_gemm()``: oneDNN where its products run on AMX, the kernel's own elsewhere).

Usage:
  .venv/bin/python python/benchmarks/attention_speed.py [--shapes v4,v32,v32h128] [--dtypes float32,bfloat16]
      [--threads 1,2] [--rows 256] [--repeats 5] [--json]
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Iterator
from typing import Any, Callable

import torch

import sparsecp
from sparsecp.torch.attention import sparse_attention, sparse_attention_gemm

SHAPES = {
    "v4": {"heads": 64, "qk_dim": 512, "value_dim": 512, "columns": 640, "keys": 8192, "sinks": True},
    "v32": {"heads": 64, "qk_dim": 576, "value_dim": 512, "columns": 2048, "keys": 8192, "sinks": False},
    "v32h128": {"heads": 128, "qk_dim": 576, "value_dim": 512, "columns": 2048, "keys": 8192, "sinks": False},
    "small": {"heads": 4, "qk_dim": 64, "value_dim": 64, "columns": 256, "keys": 8192, "sinks": True},
    "head512": {"heads": 1, "qk_dim": 512, "value_dim": 512, "columns": 640, "keys": 8192, "sinks": True},
}
GEMMS = ("auto", "onednn", "blas", "direct")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def make_inputs(shape: dict[str, Any], rows: int, dtype: torch.dtype, seed: int = 1) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    heads, qk, keys, columns = shape["heads"], shape["qk_dim"], shape["keys"], shape["columns"]
    q = (torch.randn(rows, heads, qk, generator=g) * 0.5).to(dtype)
    kv = (torch.randn(keys, qk, generator=g) * 0.5).to(dtype)
    indices = torch.stack([torch.randperm(keys, generator=g)[:columns] for _ in range(rows)]).int()
    indices[::16, int(columns * 0.9):] = -1
    sinks = torch.randn(heads, generator=g) if shape["sinks"] else None
    grad = torch.randn(rows, heads, shape["value_dim"], generator=g).to(dtype)
    return {"q": q, "kv": kv, "indices": indices, "sinks": sinks, "grad": grad}


def flops(shape: dict[str, Any], rows: int) -> dict[str, float]:
    base = 2.0 * rows * shape["heads"] * shape["columns"]
    qk, value = shape["qk_dim"], shape["value_dim"]
    return {"forward": base * (qk + value), "backward": base * (3 * qk + 2 * value),
            "total": base * (4 * qk + 3 * value)}


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@functools.cache
def _matmul_size(dtype: torch.dtype, threads: int, budget_seconds: float) -> int:
    """The square size torch's matmul is timed at: 2048, or the largest power of two down to 256
    whose product takes under ``budget_seconds``. Where torch has no fast kernel for the dtype
    (bf16 on CPUs without AVX-512: reference loops, about 1 GFLOP/s at 512 and 0.3 at 2048 on a
    Zen 3) a 2048 product takes minutes; the size is reported with the rate."""
    a, b = torch.randn(256, 256).to(dtype), torch.randn(256, 256).to(dtype)
    # The median of 5: one slow sample (a thread pool waking) once shrank the size to 512 for
    # float32 on two threads, where 2048 takes 0.05 s.
    seconds = median_seconds(lambda: a @ b, 5)
    size = 2048
    while size > 256 and seconds * (size / 256) ** 3 > budget_seconds:
        size //= 2
    return size


def matmul_size(dtype: torch.dtype, budget_seconds: float = 0.5) -> int:
    """_matmul_size, probed once per dtype and thread count (one size for every sample)."""
    return _matmul_size(dtype, torch.get_num_threads(), budget_seconds)


def matmul_rate(dtype: torch.dtype, repeats: int) -> float:
    size = matmul_size(dtype)
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    return 2.0 * size**3 / median_seconds(lambda: a @ b, repeats) / 1e9


@contextlib.contextmanager
def attention_gemm_env(gemm: str) -> Iterator[None]:
    """SPARSECP_ATTENTION_GEMM=gemm for the block ("auto": unset), unset after it."""
    if gemm == "auto":
        os.environ.pop("SPARSECP_ATTENTION_GEMM", None)
    else:
        os.environ["SPARSECP_ATTENTION_GEMM"] = gemm
    try:
        yield
    finally:
        os.environ.pop("SPARSECP_ATTENTION_GEMM", None)


def attention_times(x: dict[str, Any], value_dim: int, backend: str, repeats: int,
                    between: Callable[[], None] | None = None, chunk_bytes: int | None = None,
                    gemm: str = "auto") -> dict[str, float]:
    with attention_gemm_env(gemm):
        return _attention_times(x, value_dim, backend, repeats, between, chunk_bytes)


def gemm_label(dtype: torch.dtype, heads: int, gemm: str) -> str:
    """What the kernel multiplies with under ``SPARSECP_ATTENTION_GEMM=gemm`` (a library it has
    no products of for the dtype here falls back, and the label says so)."""
    with attention_gemm_env(gemm):
        return sparse_attention_gemm(dtype, heads)


def _attention_times(x: dict[str, Any], value_dim: int, backend: str, repeats: int,
                     between: Callable[[], None] | None, chunk_bytes: int | None) -> dict[str, float]:
    scale = x["q"].shape[2] ** -0.5
    q = x["q"].clone().requires_grad_()
    kv = x["kv"].clone().requires_grad_()
    sinks = None if x["sinks"] is None else x["sinks"].clone().requires_grad_()
    inputs = [t for t in (q, kv, sinks) if t is not None]

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return sparse_attention(q, kv, x["indices"], scale, value_dim=value_dim, sinks=sinks, backend=backend,
                                    chunk_bytes=chunk_bytes)

    def both() -> None:
        out = sparse_attention(q, kv, x["indices"], scale, value_dim=value_dim, sinks=sinks, backend=backend,
                               chunk_bytes=chunk_bytes)
        torch.autograd.grad(out, inputs, x["grad"])

    fwd = median_seconds(forward, repeats)
    if between is not None:
        between()
    total = median_seconds(both, repeats)
    return {"forward": fwd, "total": total, "backward": max(total - fwd, 1e-9)}


def svg(report: dict[str, Any]) -> str:
    """Grouped bars per (shape, dtype, threads): torch's matmul, the kernel's forward + backward and
    the chunked torch path, in GFLOP/s on a log axis, with the kernel's ratio to the matmul."""
    import math

    rows = report["results"]
    width, bar, gap, left, top, height = 900, 14, 26, 70, 40, 260
    groups = len(rows)
    plot_width = groups * (3 * bar + gap)
    width = max(width, left + plot_width + 40)
    top_rate = max(max(r["matmul_gflops"], r["total_gflops"]) for r in rows) * 1.3
    low = 5.0

    def y(rate: float) -> float:
        rate = max(rate, low)
        return top + height * (1 - math.log(rate / low) / math.log(top_rate / low))

    colors = {"matmul_gflops": "#9e9e9e", "total_gflops": "#1565c0", "chunked_total_gflops": "#ef6c00"}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + height + 90}" '
             'font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="18" font-size="13">sparse_attention forward + backward on CPU, GFLOP/s (log scale): '
             f'{report["cpu"]}, {report["isa"]}, {report["gemm_bfloat16"]}, {report["date"]}</text>']
    for tick in (10, 30, 100, 300, 1000, 3000):
        if tick < top_rate:
            parts.append(f'<line x1="{left}" x2="{left + plot_width}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                         'stroke="#e0e0e0"/>')
            parts.append(f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick}</text>')
    for i, r in enumerate(rows):
        x0 = left + i * (3 * bar + gap)
        for j, key in enumerate(("matmul_gflops", "total_gflops", "chunked_total_gflops")):
            if key in r:
                parts.append(f'<rect x="{x0 + j * bar}" y="{y(r[key]):.1f}" width="{bar - 2}" '
                             f'height="{top + height - y(r[key]):.1f}" fill="{colors[key]}"/>')
        parts.append(f'<text x="{x0 + 1.5 * bar}" y="{y(r["total_gflops"]) - 4:.1f}" text-anchor="middle">'
                     f'{r["ratio"]:.2f}</text>')
        label = f'{r["shape"]} {"f32" if r["dtype"] == "float32" else "bf16"} {r["threads"]}t ' \
            f'{r.get("gemm", "").split(" ")[0]}'
        parts.append(f'<text x="{x0 + 1.5 * bar}" y="{top + height + 14}" text-anchor="middle">{label}</text>')
    legend = top + height + 40
    for j, (key, name) in enumerate((("matmul_gflops", "torch matmul (2048^3 or smaller)"),
                                     ("total_gflops", "sparsecp kernel (label: ratio to matmul)"),
                                     ("chunked_total_gflops", "chunked torch path"))):
        parts.append(f'<rect x="{left + j * 260}" y="{legend}" width="12" height="12" fill="{colors[key]}"/>')
        parts.append(f'<text x="{left + j * 260 + 16}" y="{legend + 10}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def select_rates(rows: int, threads: int, repeats: int) -> dict[str, float]:
    """GFLOP/s of select_indices in bf16 on each product path, and torch's bf16 matmul."""
    import sparsecp.torch as sct

    doc, keys, heads, dim, topk, ratio = 8192, 2048, 64, 128, 512, 4
    g = torch.Generator().manual_seed(2)
    query = (torch.randn(rows, heads, dim, generator=g) * 0.3).to(torch.bfloat16)
    key = (torch.randn(keys, dim, generator=g) * 0.3).to(torch.bfloat16)
    weights = torch.rand(rows, heads, generator=g)
    segments = [(0, rows, 0, keys, 0)]  # the document's last `rows` rows: it ends at position doc - 1
    pairs = sum((p + 1) // ratio for p in range(doc - rows, doc))
    work = 2.0 * heads * dim * pairs
    rates = {}
    for path in ("onednn", "native"):
        os.environ["SPARSECP_SELECT_GEMM"] = path
        try:
            seconds = median_seconds(lambda: sct.select_indices(query, key, weights, segments, ratio, topk,
                                                                threads=threads), repeats)
        finally:
            os.environ.pop("SPARSECP_SELECT_GEMM", None)
        rates[f"select_{path}_gflops"] = work / seconds / 1e9
    rates["matmul_gflops"] = matmul_rate(torch.bfloat16, repeats)
    rates["float32_matmul_gflops"] = matmul_rate(torch.float32, repeats)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="v4,v32,v32h128")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", default=f"1,{torch.get_num_threads()}",
                        help="comma-separated thread counts (default: 1 and torch's default)")
    parser.add_argument("--rows", type=int, default=256, help="query rows of a kernel call (default 256)")
    parser.add_argument("--chunked-rows", type=int, default=16,
                        help="query rows of a chunked torch path call (0: skip it; default 16)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-bytes", default="",
                        help="comma-separated per-thread scratch budgets of the kernel, each timed side by side "
                             "(default: the kernel's own)")
    parser.add_argument("--gemm", default="auto",
                        help="comma-separated products of the kernel, each timed side by side: auto (the "
                             "kernel's choice), onednn, blas, direct (float32 with 1, 2, 4 or 8 heads; "
                             "default auto)")
    parser.add_argument("--select", choices=("on", "off"), default="on", help="also time the bf16 select kernel")
    parser.add_argument("--select-rows", type=int, default=2048, help="select rows (default 2048)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--svg", help="write a bar chart of the results here")
    args = parser.parse_args()
    threads_list = sorted({int(t) for t in args.threads.split(",")})
    budgets: list[int | None] = [int(b) for b in args.chunk_bytes.split(",") if b] or [None]
    gemms = [g for g in args.gemm.split(",") if g]
    for gemm in gemms:
        if gemm not in GEMMS:
            parser.error(f"--gemm takes {', '.join(GEMMS)}; got {gemm!r}")
    variants = [(b, g) for b in budgets for g in gemms]
    results = []
    for threads in threads_list:
        torch.set_num_threads(threads)
        for dtype_name in args.dtypes.split(","):
            dtype = DTYPES[dtype_name]
            for shape_name, (budget, gemm) in ((name, v) for name in args.shapes.split(",") for v in variants):
                shape = SHAPES[shape_name]
                rows = {"v4": args.rows, "small": 16 * args.rows, "head512": 4 * args.rows}.get(
                    shape_name, max(1, args.rows // 4))
                x = make_inputs(shape, rows, dtype)
                work = flops(shape, rows)
                # torch's matmul timed before, between and after the kernel's calls (the median of
                # the three): a change in the machine's load hits both sides of the ratio alike.
                matmuls = [matmul_rate(dtype, args.repeats)]
                times = attention_times(
                    x, shape["value_dim"], "cpu", args.repeats,
                    between=lambda rates=matmuls, kind=dtype: rates.append(matmul_rate(kind, args.repeats)),
                    chunk_bytes=budget, gemm=gemm)
                matmuls.append(matmul_rate(dtype, args.repeats))
                matmul = statistics.median(matmuls)
                row: dict[str, Any] = {
                    "shape": shape_name, "dtype": dtype_name, "threads": threads, "rows": rows, "chunk_bytes": budget,
                    "gemm": gemm_label(dtype, shape["heads"], gemm),
                    **{f"{k}_gflops": work[k] / times[k] / 1e9 for k in ("forward", "backward", "total")},
                    "matmul_gflops": matmul}
                row["ratio"] = row["total_gflops"] / matmul
                row["matmul_size"] = matmul_size(dtype)
                if dtype != torch.float32:
                    # where torch's bf16 matmul has no fast kernel (its rate below float32's), the
                    # float32 matmul is the machine's real limit: the kernel's ratio to it too
                    row["float32_matmul_gflops"] = matmul_rate(torch.float32, args.repeats)
                    row["ratio_to_float32_matmul"] = row["total_gflops"] / row["float32_matmul_gflops"]
                if args.chunked_rows:
                    small = make_inputs(shape, args.chunked_rows, dtype)
                    t = attention_times(small, shape["value_dim"], "torch", max(1, args.repeats // 2))
                    row["chunked_total_gflops"] = flops(shape, args.chunked_rows)["total"] / t["total"] / 1e9
                    row["speedup_over_chunked"] = row["total_gflops"] / row["chunked_total_gflops"]
                results.append(row)
                if not args.json:
                    chunked = (f"  chunked {row['chunked_total_gflops']:7.1f} (x{row['speedup_over_chunked']:.1f})"
                               if args.chunked_rows else "")
                    scratch = f"  scratch {budget >> 10} KiB" if budget else ""
                    size = f" ({row['matmul_size']}^3)" if row["matmul_size"] != 2048 else ""
                    f32 = (f"  f32 matmul {row['float32_matmul_gflops']:7.1f} "
                           f"ratio {row['ratio_to_float32_matmul']:.2f}" if "float32_matmul_gflops" in row else "")
                    print(f"{shape_name:8s} {dtype_name:8s} threads {threads}{scratch}  {row['gemm'].split()[0]:6s}  "
                          f"fwd {row['forward_gflops']:7.1f}  bwd {row['backward_gflops']:7.1f}  "
                          f"fwd+bwd {row['total_gflops']:7.1f} GFLOP/s  "
                          f"matmul {matmul:7.1f}{size}  ratio {row['ratio']:.2f}{f32}{chunked}", flush=True)
    selects = []
    if args.select == "on":
        for threads in threads_list:
            torch.set_num_threads(threads)
            rates = {"threads": threads, **select_rates(args.select_rows, threads, args.repeats)}
            # the ratios are the default path's (sparsecp.select_gemm(): oneDNN where its bf16
            # products run on AMX, the kernel's own loops elsewhere)
            rates["default"] = sparsecp.select_gemm()
            chosen = rates["select_onednn_gflops" if rates["default"].startswith("onednn")
                           else "select_native_gflops"]
            rates["ratio"] = chosen / rates["matmul_gflops"]
            rates["ratio_to_float32_matmul"] = chosen / rates["float32_matmul_gflops"]
            selects.append(rates)
            if not args.json:
                print(f"select   bfloat16 threads {threads}  onednn {rates['select_onednn_gflops']:7.1f}  "
                      f"native {rates['select_native_gflops']:7.1f} GFLOP/s  matmul {rates['matmul_gflops']:7.1f}  "
                      f"ratio {rates['ratio']:.2f}  f32 matmul {rates['float32_matmul_gflops']:7.1f} "
                      f"ratio {rates['ratio_to_float32_matmul']:.2f}  (ratios: the default, "
                      f"{rates['default'].split()[0]})", flush=True)
    header = {"cpu": cpu_model(), "isa": sparsecp.kernel_isa(), "gemm_float32": sparse_attention_gemm(torch.float32),
              "gemm_bfloat16": sparse_attention_gemm(torch.bfloat16), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d")}
    report = {**header, "results": results, "select": selects}
    if args.svg:
        with open(args.svg, "w") as out:
            out.write(svg(report))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(" ".join(f"{k}={v}" for k, v in header.items()))


if __name__ == "__main__":
    main()
