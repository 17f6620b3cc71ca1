#!/usr/bin/env python3
"""Calibrate the cost model on a torch selector, then check it on held-out batches.

``sparsecp.torch.calibrate`` times the selector over synthetic segments and fits
a + b * vis + c * min(topk, vis) per row (plus a per-call constant). This script then
plans held-out packed batches (``none`` and ``zigzag`` routes of random lognormal
batches: task lists unlike the calibration points), times the same selector on every
rank's segments (median of interleaved repeats, the same clock) and prints predicted
against measured seconds per rank. The selector here is sparsecp's ``IndexerSelector``
on the device fallback path (pure torch, ``SPARSECP_TORCH_PATH=1``), as a GPU/NPU user's
own kernel would be on its device.

    python python/examples/calibrate_selector.py [--device cuda] [--batches 3]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("SPARSECP_TORCH_PATH", "1")

import torch  # noqa: E402

import sparsecp.torch as sct  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--q-rank", type=int, default=64)
    parser.add_argument("--topk", type=int, default=128)
    parser.add_argument("--ratio", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per held-out batch")
    parser.add_argument("--cp", type=int, default=4)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=512, help="rows per calibration point")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(args.seed)
    keys = args.tokens // args.ratio
    wq_b = torch.randn((args.heads * args.head_dim, args.q_rank), generator=generator).to(device)
    key = torch.randn((keys, args.head_dim), generator=generator).to(device)
    selector = sct.IndexerSelector(wq_b, key, args.ratio, args.topk, rope_dim=16)
    fit = sct.calibrate(selector, q_rank=args.q_rank, heads=args.heads, keys=keys, ratio=args.ratio, topk=args.topk,
                        rope_dim=16, rows=args.rows, visible=(0, 32, 96, 128, 192, 512, 1024), repeats=args.repeats,
                        device=device, dtype=torch.float32)
    m = fit.model
    print(f"calibrated on {fit.device}: a = {m.a:.4g} ns/row, b = {m.b:.4g} ns/key, c = {m.c:.4g} ns/capped key, "
          f"d = {m.d:.4g} ns/top-k admission, k = {fit.per_call_seconds * 1e3:.3f} ms/call; "
          f"rms residual {100 * fit.rms_relative_residual:.1f}% over {len(fit.points)} points")

    rng = random.Random(args.seed)
    clock = time.thread_time
    errors = []
    print(f"{'batch':>5} {'mode':>6} {'rank':>4} {'rows':>6} {'predicted ms':>13} {'measured ms':>12} {'error':>7}")
    for batch in range(args.batches):
        lengths: list[int] = []
        while sum(lengths) < args.tokens:
            lengths.append(max(args.ratio, int(rng.lognormvariate(7, 1))))
        lengths[-1] -= sum(lengths) - args.tokens
        if lengths[-1] <= 0:
            lengths.pop()
            lengths[-1] += args.tokens - sum(lengths)
        for mode in ("none", "zigzag"):
            routes = [sct.indexer_route(tuple(lengths), args.cp, rank, args.ratio, mode) for rank in range(args.cp)]
            inputs = []
            for route in routes:
                rows = route.query_count
                qr = torch.randn((1, rows, args.q_rank), generator=generator).to(device)
                weights = torch.rand((1, rows, args.heads), generator=generator).to(device)
                angle = torch.rand((1, rows, 8), generator=generator).to(device)
                inputs.append((qr, weights, (angle.cos(), angle.sin()), route.segments))
            times: list[list[float]] = [[] for _ in routes]
            for _ in range(args.repeats):
                for rank, call in enumerate(inputs):
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                        start = time.perf_counter()
                        selector(*call)
                        torch.cuda.synchronize(device)
                        times[rank].append(time.perf_counter() - start)
                    else:
                        start = clock()
                        selector(*call)
                        times[rank].append(clock() - start)
            for rank, route in enumerate(routes):
                measured = statistics.median(times[rank])
                predicted = fit.predict(route.segments, args.ratio)
                errors.append(predicted / measured - 1)
                print(f"{batch:>5} {mode:>6} {rank:>4} {route.query_count:>6} {predicted * 1e3:>13.2f} "
                      f"{measured * 1e3:>12.2f} {100 * errors[-1]:>+6.1f}%")
    worst = max(abs(e) for e in errors)
    typical = statistics.median(abs(e) for e in errors)
    print(f"held-out per-rank calls: {len(errors)}; median |error| {100 * typical:.1f}%, worst {100 * worst:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
