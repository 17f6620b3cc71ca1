#!/usr/bin/env python3
"""sparsecp.torch.select_indices on CPU tensors against `sparsecp bench select`, one run.

The bench shape of `sparsecp bench select` (DeepSeek-V4 indexer): one 8192-token document,
all 8192 rows, 2048 compressed keys, 64 heads x 128, top-k 512, ratio 4, in fp32 and bf16;
small-integer values. The Python side calls `select_indices(query [rows, heads, head_dim],
key [keys, head_dim], weights [rows, heads], segments, 4, 512)`, which runs the fused C++
kernel on the tensors in place; its score rate is 2 x heads x head_dim per visible (row,
key) pair divided by the median time of --repeats calls. The tool's rates come from
`sparsecp bench select --dtype both --json` run right after, with the same thread count.

Usage:
  .venv/bin/python python/benchmarks/select_speed.py --sparsecp build/native/sparsecp [--threads 2] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

import sparsecp
import sparsecp.torch as sct

DOC, ROWS, HEADS, HEAD_DIM, TOPK, RATIO = 8192, 8192, 64, 128, 512, 4


def score_flops() -> float:
    first = DOC - ROWS
    pairs = sum((p + 1) // RATIO for p in range(first, DOC))
    return 2.0 * HEADS * HEAD_DIM * pairs


def time_python(dtype: torch.dtype, repeat: int, threads: int) -> float:
    generator = torch.Generator().manual_seed(1)
    query = torch.randint(-3, 4, (ROWS, HEADS, HEAD_DIM), generator=generator).to(dtype)
    key = torch.randint(-3, 4, (DOC // RATIO, HEAD_DIM), generator=generator).to(dtype)
    weights = torch.randint(1, 4, (ROWS, HEADS), generator=generator).float()
    segments = [(0, ROWS, 0, DOC // RATIO, DOC % RATIO)]
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        sct.select_indices(query, key, weights, segments, RATIO, TOPK, threads=threads)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--sparsecp", required=True, help="the sparsecp tool")
    parser.add_argument("--threads", type=int, default=0, help="kernel threads (0: OpenMP's default)")
    parser.add_argument("--repeats", dest="repeat", type=int, default=3)
    parser.add_argument("--repeat", dest="repeat", type=int, help=argparse.SUPPRESS)  # the old spelling
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    flops = score_flops()
    python = {name: flops / time_python(dtype, args.repeat, args.threads) / 1e9
              for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    command = [args.sparsecp, "bench", "select", "--dtype", "both", "--json", "--repeats", str(args.repeat),
               "--threads", str(args.threads)]
    tool = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    cpp = {"fp32": tool["score_gflops"], "bf16": tool["bf16_score_gflops"]}
    summary = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "isa": sparsecp.kernel_isa(),
               "threads": tool["threads"], "score_gflop": flops / 1e9, "python_gflops": python,
               "tool_gflops": cpp, "ratio": {k: python[k] / cpp[k] for k in python}}
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"score work {flops / 1e9:.1f} GFLOP, kernel {summary['isa']}, {tool['threads']} threads, "
          f"median of {args.repeat}; {summary['date']}")
    for name in ("fp32", "bf16"):
        print(f"{name}: select_indices {python[name]:.1f} GFLOP/s, sparsecp bench select {cpp[name]:.1f} GFLOP/s, "
              f"ratio {python[name] / cpp[name]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
