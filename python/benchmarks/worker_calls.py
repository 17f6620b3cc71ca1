#!/usr/bin/env python3
"""sparsecp's fused worker selection (``IndexerSelector``) on the DeepSeek-V4 example's worker calls.

For batches ``sparsecp.generate_batch("lognormal", --tokens, --ranks, seed)`` and the strategies
none and spill, every rank's worker route is called with the example's indexer shape (32 heads of
64, top-k 128, ratio 4, rope 32, q_rank --q-rank) on random float32 inputs. It prints

* the sum over all calls of each call's best wall time (the minimum of --repeats interleaved
  rounds): run it on two builds of the package to compare them;
* for every call of several segments, its time against the same segments called one by one
  (median and maximum of the ratio): 1.0 when a call's time is the sum of its rows' costs,
  which is what spill's per-row cost model assumes.

Usage::

    python python/benchmarks/worker_calls.py --threads 1
    python python/benchmarks/worker_calls.py --threads 2 --q-rank 1024
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

HEADS, HEAD_DIM, TOPK, RATIO, ROPE = 32, 64, 128, 4, 32


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="kernel and torch threads")
    parser.add_argument("--q-rank", type=int, default=64, help="the indexer's query rank (the example's: 64)")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=4, help="batches: seeds 1..N")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import numpy as np
    import torch

    import sparsecp
    from sparsecp.torch import IndexerSelector, indexer_route
    from sparsecp.torch.select import segment_array

    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    kernel = IndexerSelector(torch.randn(HEADS * HEAD_DIM, args.q_rank, generator=generator) * 0.02,
                             torch.randn(args.tokens // RATIO, HEAD_DIM, generator=generator), RATIO, TOPK,
                             head_dim=HEAD_DIM, rope_dim=ROPE, threads=args.threads)
    qr = torch.rand(1, args.tokens, args.q_rank, generator=generator) - 0.5
    weights = torch.rand(1, args.tokens, HEADS, generator=generator) + 0.1
    angle = torch.rand(1, args.tokens, ROPE // 2, generator=generator) * 6.2832
    cos, sin = angle.cos(), angle.sin()

    def call(rows: slice, table: np.ndarray) -> None:
        kernel(qr[:, rows], weights[:, rows], (cos[:, rows], sin[:, rows]), table)

    calls = []
    for seed in range(1, args.seeds + 1):
        lengths = tuple(int(n) for n in sparsecp.generate_batch("lognormal", args.tokens, args.ranks, seed))
        for mode in ("none", "spill"):
            for rank in range(args.ranks):
                route = indexer_route(lengths, args.ranks, rank, RATIO, mode)
                calls.append((int(route.query_count), np.array(segment_array(route.segments), dtype=np.int64)))
    whole = [float("inf")] * len(calls)
    apart = [float("inf")] * len(calls)
    for _ in range(args.repeats):
        for i, (count, table) in enumerate(calls):
            start = time.perf_counter()
            call(slice(0, count), table)
            whole[i] = min(whole[i], time.perf_counter() - start)
            if len(table) < 2:
                continue
            start = time.perf_counter()
            for q_begin, q_end, key_begin, key_end, residual in table.tolist():
                call(slice(q_begin, q_end), np.array([[0, q_end - q_begin, key_begin, key_end, residual]],
                                                     dtype=np.int64))
            apart[i] = min(apart[i], time.perf_counter() - start)
    ratios = [w / a for w, a in zip(whole, apart) if a != float("inf")]
    print(f"# {len(calls)} worker calls ({args.seeds} batches x none, spill x {args.ranks} ranks), kernel ISA "
          f"{sparsecp.kernel_isa()}, {args.threads} threads, q_rank {args.q_rank}, best of {args.repeats}")
    print(f"sum of the calls' best wall times: {sum(whole) * 1e3:.0f} ms")
    if ratios:
        print(f"one call against its segments called one by one ({len(ratios)} calls of several segments): "
              f"median {statistics.median(ratios):.3f}, max {max(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
