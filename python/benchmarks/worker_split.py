#!/usr/bin/env python3
"""How a worker's selection time splits into the Index Q projection and the scoring + top-k,
per rank's rows, at the training-step example's shapes (one thread, no communication).

For each rank's 2048 own rows (mode 'none'), times `IndexerSelector` (the fused
`select_worker_rows`: OpenBLAS projection qr @ Wq_b with RoPE, then scoring + top-k) and
`project_index_query` alone on the same rows; scoring + top-k = the difference. The
projection costs the same for every row (2 x q_lora_rank x heads x head_dim FLOP), the
scoring grows with the row's visible keys: a balancing plan that counts scoring work moves
projection work with the rows.

Usage:
  OPENBLAS_CORETYPE=SkylakeX OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
      .venv/bin/python python/benchmarks/worker_split.py [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import sparsecp.torch as sct

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import train_indexer_step as example  # noqa: E402

CONFIG = example.IndexerConfig(lengths=(5800, 600, 1400, 90, 302), hidden=1024, q_lora_rank=1536, heads=64,
                               head_dim=128, rope_dim=64, att_heads=64, att_dim=512)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", dest="repeat", type=int, default=3)
    parser.add_argument("--repeat", dest="repeat", type=int, help=argparse.SUPPRESS)  # the old spelling
    args = parser.parse_args()
    torch.set_num_threads(1)
    c = CONFIG
    layer, _, batch = example.build(c, 1)
    with torch.no_grad():
        key = layer.index_key(batch.compressed[None], batch.key_cos[None], batch.key_sin[None])[0]
        weights = layer.merge_weights(batch.hidden[None])
    wq_b = layer.q_b_proj.weight.detach()
    selector = sct.IndexerSelector(wq_b, key, c.ratio, c.topk, head_dim=c.head_dim, rope_dim=c.rope_dim, threads=1)
    local = c.tokens // args.ranks
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load {open('/proc/loadavg').read().split()[0]}; "
          f"thread CPU seconds, median of {args.repeat}")
    for rank in range(args.ranks):
        rows = slice(rank * local, (rank + 1) * local)
        segments = sct.indexer_route(c.lengths, args.ranks, rank, c.ratio, "none").segments
        qr, cos, sin = batch.query_residual[rows], batch.cos[rows], batch.sin[rows]
        whole, projection = [], []
        for _ in range(args.repeat):
            start = time.thread_time()
            selector(qr[None], weights[:, rows], (cos[None], sin[None]), segments)
            whole.append(time.thread_time() - start)
            start = time.thread_time()
            sct.project_index_query(qr, wq_b, cos, sin, c.head_dim, c.rope_dim)
            projection.append(time.thread_time() - start)
        total, project = statistics.median(whole), statistics.median(projection)
        print(f"rank {rank}: selection {total:.3f} s = projection {project:.3f} s + scoring/top-k "
              f"{total - project:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
