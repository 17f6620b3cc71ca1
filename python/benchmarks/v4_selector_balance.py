#!/usr/bin/env python3
"""How well each strategy balances a DeepSeek-V4 worker selector, without a training step's noise.

For each batch (``sparsecp.generate_batch("lognormal", --tokens, --ranks, seed)``) and strategy,
every rank's selection route is planned as ``context_parallel`` plans it, and the layer's own
selector (``--selector model``: the model's torch math, ``fused``: sparsecp's CPU kernel) is
timed on each rank's route in this one process (the calling thread's CPU seconds, the minimum of
``--repeats`` rounds, every call of a batch once per round, interleaved): the slowest rank's
time against ``none``'s is what the plan gives, with no other rank sharing the core.

``spill`` plans on the cost model ``context_parallel`` would calibrate on this selector
(``sparsecp.models._cp.calibration``: the same grid, rows and fit); ``spill-pairs`` on spill's default model.
It also prints, per batch, how far the calibrated model's prediction of each rank's share
(its time over the ranks' mean) is from the measured share: the error spill balances with;
and, over every timed call (none of them in any fit), the rms relative residual of the
calibrated model's predicted seconds, and of a fit to the real calls of the odd-numbered
batches (``CostModelRefit``, the refit ``context_parallel`` runs) predicting the even ones.

The model is the example's (``train_deepseek_v4.py``: an indexer of 32 heads of 64, top-k
128, ratio 4); the selector's inputs are random (the time does not depend on their values).

Usage::

    python python/benchmarks/v4_selector_balance.py --selector model --seeds 1-8
    python python/benchmarks/v4_selector_balance.py --selector fused --seeds 1-8 --repeats 5
    python python/benchmarks/v4_selector_balance.py --selector model --seeds 1-8 --calibrations 6
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

MODES: dict[str, dict[str, Any]] = {"none": {}, "zigzag": {}, "hybrid": {"block_size": 256, "zigzag_min_length": 1024},
                                    "spill-pairs": {}, "spill": {}}


def sign_test(wins: int, n: int) -> float:
    """P(at least ``wins`` of ``n`` fair coin flips): how likely so many wins are by chance."""
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n


def seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--selector", default="model", choices=("model", "fused"))
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--seeds", default="1-8", help="batch seeds, 'first-last'")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calibrations", type=int, default=1,
                        help="calibrate this many times over (after the timing), each fit's held-out residual "
                             "printed: how much the first fit depends on its second of timings")
    args = parser.parse_args()

    import torch
    import train_deepseek_v4 as example
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import apply_rotary_pos_emb

    import sparsecp
    from sparsecp.models._cp.calibration import SelectionCalibration
    from sparsecp.models._cp.selector import CHUNK_ROWS as _CHUNK_ROWS
    from sparsecp.models.deepseek_v4._selector import FusedSelector, ModelSelector
    from sparsecp.torch import indexer_route
    from sparsecp.torch.calibrate import segment_sums

    torch.set_num_threads(1)
    config_args = argparse.Namespace(hidden=128, index_heads=32, topk=128, seed=1, tokens=args.tokens,
                                     ranks=args.ranks)
    model = example.build_models(config_args)
    indexer = next(layer.self_attn.compressor.indexer for layer in model.model.layers
                   if layer.self_attn.compressor is not None and hasattr(layer.self_attn.compressor, "indexer"))
    rope_dim, ratio, topk = int(model.config.qk_rope_head_dim), int(indexer.compress_rate), int(indexer.index_topk)

    def make(bank: torch.Tensor) -> Any:
        if args.selector == "fused":
            return FusedSelector(indexer, bank, rope_dim)
        return ModelSelector(indexer, bank, apply_rotary_pos_emb)

    dims = {"q_rank": int(indexer.q_b_proj.weight.shape[1]), "heads": int(indexer.num_heads),
            "head_dim": int(indexer.head_dim), "rope_dim": rope_dim, "ratio": ratio, "topk": topk}
    batches = {seed: tuple(int(n) for n in sparsecp.generate_batch("lognormal", args.tokens, args.ranks, seed))
               for seed in seeds(args.seeds)}
    calibration = SelectionCalibration("spill", {}, "once", make, args.selector, dims, indexer.q_b_proj.weight,
                                       [ratio], rows=2 * _CHUNK_ROWS, heap_term=args.selector == "fused")
    cost, residual, _, wall, _ = calibration._fit(batches[min(batches)], torch.device("cpu"))
    print(f"# {args.selector} selector, {args.ranks} ranks, {args.tokens} tokens; calibrated in {wall:.2f} s: "
          f"a {cost.a:.0f} + b {cost.b:.1f} * vis + c {cost.c:.1f} * min(topk, vis) + d {cost.d:.1f} * heap(vis) "
          f"ns a row, "
          f"residual {residual:.3f}", flush=True)

    keys = args.tokens // ratio
    selector = make(torch.randn(keys, int(indexer.head_dim), generator=torch.Generator().manual_seed(0)))
    generator = torch.Generator().manual_seed(1)
    rows = 2 * args.tokens  # more than any rank selects
    qr = torch.rand(1, rows, dims["q_rank"], generator=generator) - 0.5
    weights = torch.rand(1, rows, dims["heads"], generator=generator) + 0.1
    angle = torch.rand(1, rows, rope_dim // 2, generator=generator) * 2 * math.pi
    cos, sin = angle.cos(), angle.sin()

    against: dict[str, list[float]] = {mode: [] for mode in MODES}
    errors: list[float] = []
    timed: dict[int, list[tuple[tuple[float, float, float, float], float]]] = {}  # seed -> (sums, seconds)
    for seed, lengths in batches.items():
        calls = []
        for mode, options in MODES.items():
            params = {"cost_model": cost} if mode == "spill" else {}
            for rank in range(args.ranks):
                route = indexer_route(lengths, args.ranks, rank, ratio, mode.removesuffix("-pairs"),
                                      options.get("block_size"), options.get("zigzag_min_length"), **params)
                calls.append((mode, rank, int(route.query_count), route.segments))
        times: dict[tuple[str, int], list[float]] = {(mode, rank): [] for mode, rank, _, _ in calls}
        for _ in range(args.repeats):
            for mode, rank, count, segments in calls:
                start = time.thread_time()
                selector(qr[:, :count], weights[:, :count], (cos[:, :count], sin[:, :count]), segments)
                times[(mode, rank)].append(time.thread_time() - start)
        best = {key: min(values) for key, values in times.items()}
        timed[seed] = [(segment_sums(segments, ratio, topk), best[(mode, rank)])
                       for mode, rank, count, segments in calls if count]
        slowest = {mode: max(best[(mode, rank)] for rank in range(args.ranks)) for mode in MODES}
        line = []
        for mode in MODES:
            mean = statistics.mean(best[(mode, rank)] for rank in range(args.ranks))
            against[mode].append(slowest[mode] / slowest["none"])
            line.append(f"{mode} {slowest[mode] / slowest['none']:.3f} (max/mean {slowest[mode] / mean:.2f})")
        for mode in ("none", "spill"):  # the calibrated model's error on each rank's share
            measured = [best[(mode, rank)] for rank in range(args.ranks)]
            predicted = []
            for call_mode, _, _, segments in calls:
                if call_mode == mode:
                    n, visible, capped, heap = segment_sums(segments, ratio, topk)
                    predicted.append(cost.a * n + cost.b * visible + cost.c * capped + cost.d * heap)
            m, p = statistics.mean(measured), statistics.mean(predicted)
            errors += [(x / m) / (y / p) - 1 for x, y in zip(measured, predicted)]
        print(f"seed {seed}: none's slowest rank {slowest['none'] * 1e3:.0f} ms; slowest against none: "
              + ", ".join(line), flush=True)
    paired = [s / min(z, h) for s, z, h in zip(against["spill"], against["zigzag"], against["hybrid"])]
    lower = sum(r < 1 for r in paired)
    print(f"\nspill against the better of zigzag and hybrid, batch by batch: median {statistics.median(paired):.3f} "
          f"(range {min(paired):.3f}-{max(paired):.3f}), lower in {lower} of {len(paired)} batches "
          f"(a sign test's one-sided p {sign_test(lower, len(paired)):.2g})")
    print(f"median slowest rank against none over {len(batches)} batches: "
          + ", ".join(f"{mode} {statistics.median(values):.3f}" for mode, values in against.items()))
    print(f"the calibrated model's error on a rank's share of the selection (none's and spill's routes): rms "
          f"{math.sqrt(sum(e * e for e in errors) / len(errors)):.3f}")

    def residual(model: Any, samples: list[tuple[tuple[float, float, float, float], float]]) -> float:
        def predict(sums: tuple[float, float, float, float]) -> float:
            n, visible, capped, heap = sums
            return 1e-9 * (model.a * n + model.b * visible + model.c * capped + model.d * heap)
        return math.sqrt(statistics.mean((predict(x) / y - 1) ** 2 for x, y in samples))

    every = [sample for samples in timed.values() for sample in samples]
    print(f"rms relative residual per call (held out): the calibrated model {residual(cost, every):.3f} "
          f"over {len(every)} calls", end="")
    train = [seed for i, seed in enumerate(timed) if i % 2 == 0]
    test = [sample for i, (seed, samples) in enumerate(timed.items()) if i % 2 for sample in samples]
    if train and test:
        refit = sparsecp.CostModelRefit(cost, window=len(train), max_rms_relative_residual=1.0)
        for seed in train:
            refit.add_step([(n, visible, capped, seconds, heap) for (n, visible, capped, heap), seconds in timed[seed]])
        model = refit.model
        print(f"; fitted to batches {train} ({refit.samples} calls, residual {refit.rms_relative_residual:.3f}: "
              f"a {model.a:.0f} + b {model.b:.1f} * vis + c {model.c:.1f} * min(topk, vis) + d {model.d:.1f} "
              f"* heap(vis) ns), it predicts the other {len(test)} calls to {residual(model, test):.3f}")
    else:
        print()
    if args.calibrations > 1:
        from sparsecp.models._cp import calibration as _cp_calibration

        fits = [(cost, residual(cost, every))]
        for _ in range(args.calibrations - 1):
            _cp_calibration.clear_cache()
            again = calibration._fit(batches[min(batches)], torch.device("cpu"))[0]
            fits.append((again, residual(again, every)))
        biases = [statistics.mean(1e-9 * (m.a * x[0] + m.b * x[1] + m.c * x[2] + m.d * x[3]) / y - 1
                                  for x, y in every) for m, _ in fits]
        print(f"{len(fits)} calibrations, each on the held-out calls: residual "
              + ", ".join(f"{r:.3f}" for _, r in fits) + "; mean bias "
              + ", ".join(f"{b:+.3f}" for b in biases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
