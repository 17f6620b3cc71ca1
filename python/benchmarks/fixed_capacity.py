#!/usr/bin/env python3
"""The fixed-capacity exchange's capacity and padding per strategy on the simulate sweep.

The batches of `sparsecp simulate`'s standard sweep (lognormal, Pareto and mixture batches
of 1,048,576 tokens, seeds 1-5, ratio 4; ``sparsecp.generate_batch``) at each CP size. Per
(strategy, CP): the capacity one run would fix over those 15 batches (the most rows any
rank sends any other rank, ``sparsecp.torch.fixed_capacity`` with ``multiple=8``); per
batch and rank the bytes it hands to peers per layer at that capacity, split into payload
(rows that move) and padding (empty slots), with the DeepSeek-V4 row size (3,584 bytes of
inputs out, 2,048 bytes of ids back). Reported: the capacity, the most rows one rank sends
one peer per distribution (the capacity a run of only that kind of batch would need), the
fixed bytes per rank ((CP - 1) x capacity rows, inputs out and ids back), the median over batches of the mean per
rank of payload and padding, in MiB, and the most rows one rank sends or receives in all
over the sample (what a capacity on each rank's total, rather than per peer, would fix).
Planning is integer code: the figures do not depend on the machine.

Usage:
  .venv/bin/python python/benchmarks/fixed_capacity.py [--cp 4,8,16,32,64]
      [--strategies zigzag,greedy,spill] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

INPUT_ROW_BYTES, RESULT_ROW_BYTES, RATIO, TOKENS = 3584, 2048, 4, 1 << 20
DISTRIBUTIONS, SEEDS = ("lognormal", "pareto", "mixture"), (1, 2, 3, 4, 5)


def transfers(lengths: tuple[int, ...], cp: int, strategy: str) -> np.ndarray:
    """[cp, cp] rows rank i sends rank j (diagonal zero)."""
    import sparsecp.torch as sct

    matrix = np.stack([np.asarray(sct.indexer_route(lengths, cp, rank, RATIO, strategy).input_splits)
                       for rank in range(cp)])
    np.fill_diagonal(matrix, 0)
    return matrix


def main() -> None:
    import sparsecp

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cp", default="4,8,16,32,64")
    parser.add_argument("--strategies", default="zigzag,greedy,spill")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    mib = float(1 << 20)
    rows = []
    for cp in (int(value) for value in args.cp.split(",")):
        batches = [tuple(sparsecp.generate_batch(distribution, TOKENS, cp, seed))
                   for distribution in DISTRIBUTIONS for seed in SEEDS]
        for strategy in args.strategies.split(","):
            matrices = [transfers(lengths, cp, strategy) for lengths in batches]
            needed = max(int(matrix.max()) for matrix in matrices)
            capacity = max(8, -(-needed // 8) * 8)
            slots = (cp - 1) * capacity
            row = INPUT_ROW_BYTES + RESULT_ROW_BYTES
            payload = [float(matrix.sum(axis=1).mean()) * row / mib for matrix in matrices]
            padding = [(slots - float(matrix.sum(axis=1).mean())) * row / mib for matrix in matrices]
            per_distribution = {distribution: max(int(m.max()) for m, (d, _) in
                                                  zip(matrices, ((d, seed) for d in DISTRIBUTIONS for seed in SEEDS))
                                                  if d == distribution) for distribution in DISTRIBUTIONS}
            # The most rows one rank sends (or receives) in all: the buffer a per-rank total
            # capacity would need (variable splits, padding kept on the rank itself).
            total = max(max(int(m.sum(axis=1).max()), int(m.sum(axis=0).max())) for m in matrices)
            rows.append({"cp": cp, "strategy": strategy, "capacity": capacity, "needed_by": per_distribution,
                         "total_rows": total, "total_mib": total * row / mib,
                         "buffer_mib": slots * row / mib, "payload_mib": statistics.median(payload),
                         "padding_mib": statistics.median(padding),
                         "padding_share": statistics.median(p / (p + q) for p, q in zip(padding, payload))})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| CP | strategy | capacity (rows per peer) | most rows to one peer: lognormal / pareto / mixture | "
          "fixed bytes per rank per layer, MiB | payload MiB | padding MiB | padding share | "
          "most rows one rank sends or receives in all (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        needed = " / ".join(str(r["needed_by"][d]) for d in DISTRIBUTIONS)
        print(f"| {r['cp']} | {r['strategy']} | {r['capacity']} | {needed} | {r['buffer_mib']:.1f} | "
              f"{r['payload_mib']:.1f} | {r['padding_mib']:.1f} | {r['padding_share']:.0%} | "
              f"{r['total_rows']} ({r['total_mib']:.1f}) |")


if __name__ == "__main__":
    main()
