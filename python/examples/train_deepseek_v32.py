#!/usr/bin/env python3
"""Train a small transformers DeepSeek-V3.2 under context parallelism, one strategy against another.

Every step, each strategy (``--modes``, interleaved: none, zigzag, greedy, hybrid, spill, and
spill on its default cost model by default) trains its own copy of the same randomly initialised
``DeepseekV32ForCausalLM`` on the same packed batch, split contiguously over ``--ranks`` gloo
ranks with ``sparsecp.models.deepseek_v32``: each rank gathers its rows' document prefix of the
MLA latent, the indexer's top-k selection over every earlier token (ratio 1) is balanced by the
strategy, the indexer trains on its KL loss, AdamW updates the replicated weights. The copies see the same
data and must report the same losses (each equals the model run one document at a time); what
differs is where the selection work runs. spill calibrates its cost model on the worker selector
by itself (``context_parallel``: rank 0 times the selector in the first forward, every rank refits
from the measured selection times of later forwards); ``NAME-uncalibrated`` runs a strategy with
``calibrate=False`` (spill on causal pairs).

Batches: ``--tokens`` tokens per step packed from documents of sparsecp's long-tailed
``lognormal`` generator (``sparsecp.generate_batch("lognormal", tokens, cp, seed)``), one seed
per step. At ratio 1 the indexer scores every earlier token of a row's document against every
index head, so its work grows with the square of the document length: with documents of
thousands of tokens it is a large part of the step of this small model (about 40% at the
defaults), the regime the balancing is for.

Sizes (the defaults): hidden 128, 3 layers (one dense MLP, two MoE of 4 experts, 2 active), MLA
with 4 heads (latent 64, rope 32, nope 32, value 32), an indexer of 32 heads of 64 keeping the top
128, 16384 tokens a step (4096 a rank).

Per step and strategy it prints the loss (summed over ranks), the step time (slowest rank) and
per rank the indexer's share of the step; at the end, medians per strategy: step time, the
slowest rank's selector CPU seconds and its ratio to the first strategy's in the same step, the
selection's imbalance (max / mean of the ranks' selector CPU seconds: with more ranks than cores,
wall time would count a rank's peers' turns on the core), bytes each rank sent (latent prefixes
and Index K rows; selection exchange), and per rank the parameter, gradient and AdamW bytes and
the resident-set growth during the steps, against one process running the whole batch.

Usage::

    python python/examples/train_deepseek_v32.py --ranks 4
    python python/examples/train_deepseek_v32.py --ranks 2 --modes none,spill --steps 2 --tokens 4096
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import resource
import socket
import statistics
import sys
import time
from typing import Any

UNCALIBRATED = "-uncalibrated"  # a mode name ending so plans with calibrate=False (the default cost model)
MODE_OPTIONS: dict[str, dict[str, Any]] = {
    "none": {}, "zigzag": {}, "greedy": {"block_size": 256}, "hybrid": {"block_size": 256, "zigzag_min_length": 1024},
    "spill": {},
}


def model_config(args: argparse.Namespace) -> Any:
    from transformers import DeepseekV32Config

    return DeepseekV32Config(
        vocab_size=512, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        moe_intermediate_size=args.hidden // 2, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=4, n_group=2, topk_group=1, num_experts_per_tok=2, kv_lora_rank=64,
        q_lora_rank=64, qk_rope_head_dim=32, v_head_dim=32, qk_nope_head_dim=32, index_topk=args.topk,
        index_head_dim=64, index_n_heads=args.index_heads, first_k_dense_replace=1,
        max_position_embeddings=1 << 20, experts_implementation="eager")


def batch(args: argparse.Namespace, step: int) -> tuple[tuple[int, ...], Any]:
    import torch

    import sparsecp

    seed = args.seed + step
    lengths = tuple(int(n) for n in sparsecp.generate_batch("lognormal", args.tokens, args.ranks, seed))
    generator = torch.Generator().manual_seed(seed)
    return lengths, torch.randint(0, 512, (1, sum(lengths)), generator=generator)


def cpu_model() -> str:
    """The CPU's model name, family and model (lscpu's words), for the report's header."""
    try:
        with open("/proc/cpuinfo") as file:
            fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in file)}
    except OSError:
        return platform.machine()
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"


def rss_bytes() -> int:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_bytes(model: Any, optimizer: Any) -> dict[str, int]:
    """This rank's bytes of parameters, gradients and optimizer state."""
    parameters = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if hasattr(v, "numel") and v.ndim > 0]
    return {"param_bytes": sum(p.numel() * p.element_size() for p in parameters),
            "grad_bytes": sum(p.grad.numel() * p.grad.element_size() for p in parameters if p.grad is not None),
            "optimizer_bytes": sum(v.numel() * v.element_size() for v in state)}


def run_rank(rank: int, size: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    import torch
    import torch.distributed as dist
    from transformers import DeepseekV32ForCausalLM

    import sparsecp.torch as sparsecp_torch
    from sparsecp.models import deepseek_v32 as cp_v32

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=1200))
    try:
        torch.manual_seed(args.seed)
        base = DeepseekV32ForCausalLM(model_config(args))
        models, optimizers = {}, {}
        for mode in args.modes:
            model = copy.deepcopy(base)
            strategy = mode.removesuffix(UNCALIBRATED)
            cp_v32.context_parallel(model, None, strategy, selector=args.selector, indexer_kl_coeff=args.kl,
                                    calibrate=not mode.endswith(UNCALIBRATED), **MODE_OPTIONS.get(strategy, {}))
            model.train()
            models[mode] = model
            optimizers[mode] = torch.optim.AdamW(model.parameters(), lr=args.lr)
        del base
        resident = rss_bytes()
        memories: dict[str, dict[str, int]] = {}
        for step in range(args.steps):
            lengths, input_ids = batch(args, step)
            ids, positions = cp_v32.shard_batch(input_ids, lengths)
            labels = cp_v32.shard_labels(input_ids, lengths)
            for mode in args.modes:
                model, optimizer = models[mode], optimizers[mode]
                state = cp_v32.context_parallel_state(model)
                assert state is not None
                state.stats.reset()
                state.clock.calls, state.clock.seconds = 0, 0.0
                sparsecp_torch.reset_exchange_stats()
                dist.barrier()
                start, cpu_start = time.perf_counter(), time.thread_time()
                optimizer.zero_grad(set_to_none=True)
                out = model(input_ids=ids, position_ids=positions, document_lengths=lengths)
                loss = cp_v32.causal_lm_loss(out.logits, labels, lengths)
                kl = cp_v32.indexer_kl_loss(model)
                (loss + kl if kl is not None else loss).backward()
                cp_v32.all_reduce_gradients(model)
                if step == 0:
                    memories[mode] = memory_bytes(model, optimizer)
                optimizer.step()
                seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - cpu_start
                if step == 0:
                    memories[mode]["optimizer_bytes"] = memory_bytes(model, optimizer)["optimizer_bytes"]
                summed = torch.tensor([float(loss.detach()), float(kl.detach()) if kl is not None else 0.0])
                dist.all_reduce(summed)
                queue.put({"rank": rank, "step": step, "mode": mode, "seconds": seconds, "cpu_seconds": cpu_seconds,
                           "loss": float(summed[0]), "kl": float(summed[1]), "documents": len(lengths),
                           "longest": max(lengths), "indexer_seconds": state.stats.indexer_seconds,
                           "selector_seconds": state.clock.seconds, "dispatch_bytes": state.stats.dispatch_bytes,
                           "selection_bytes": sparsecp_torch.exchange_stats()["bytes_sent"],
                           "calibration": str(state.calibration.report), **memories[mode]})
        queue.put({"rank": rank, "peak_growth": peak_bytes() - resident})
    except BaseException as error:
        queue.put({"rank": rank, "error": f"{type(error).__name__}: {error}"})
        raise
    finally:
        dist.destroy_process_group()


def single_process_peak(args: argparse.Namespace, queue: Any) -> None:
    """One process, the whole batch, the same model and step (CP size 1)."""
    run_rank(0, 1, free_port(), args, queue)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spawn(target: Any, size: int, args: argparse.Namespace, report: Any) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    queue = context.Queue()
    port = free_port()
    if target is run_rank:
        processes = [context.Process(target=run_rank, args=(rank, size, port, args, queue)) for rank in range(size)]
    else:
        processes = [context.Process(target=target, args=(args, queue))]
    for process in processes:
        process.start()
    records: list[dict[str, Any]] = []
    finished = 0
    pending: dict[tuple[int, str], list[dict[str, Any]]] = {}
    while finished < len(processes):
        record = queue.get(timeout=3600)
        if "error" in record:
            for process in processes:
                process.kill()
            raise SystemExit(f"rank {record['rank']} failed: {record['error']}")
        records.append(record)
        if "peak_growth" in record:
            finished += 1
            continue
        key = (record["step"], record["mode"])
        pending.setdefault(key, []).append(record)
        if len(pending[key]) == len(processes) and report is not None:
            report(sorted(pending.pop(key), key=lambda r: r["rank"]))
    for process in processes:
        process.join()
    return records


def print_step(ranks: list[dict[str, Any]]) -> None:
    first = ranks[0]
    shares = " ".join(f"{100 * r['indexer_seconds'] / r['seconds']:3.0f}%" for r in ranks)
    print(f"step {first['step']}  {first['mode']:18s} loss {first['loss']:.6f}  kl {first['kl']:.5f}  "
          f"step {max(r['seconds'] for r in ranks):6.2f} s  indexer share per rank {shares}  "
          f"({first['documents']} documents, longest {first['longest']})", flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(records: list[dict[str, Any]], single: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    steps = [r for r in records if "step" in r]
    result: dict[str, Any] = {"modes": {}}
    first_slowest = {}
    for record in steps:
        if record["mode"] == args.modes[0]:
            first_slowest[record["step"]] = max(first_slowest.get(record["step"], 0.0), record["selector_seconds"])
    for mode in args.modes:
        by_step: dict[int, list[dict[str, Any]]] = {}
        for r in steps:
            if r["mode"] == mode:
                by_step.setdefault(r["step"], []).append(r)
        mean = statistics.mean
        result["modes"][mode] = {
            "step_seconds": median([max(r["seconds"] for r in rs) for rs in by_step.values()]),
            "slowest_selector_seconds": median([max(r["selector_seconds"] for r in rs) for rs in by_step.values()]),
            "slowest_selector_vs_first": median([max(r["selector_seconds"] for r in rs) / max(1e-12, first_slowest[s])
                                                 for s, rs in by_step.items()]),
            "selection_imbalance": median([max(r["selector_seconds"] for r in rs) / max(1e-12, mean(
                r["selector_seconds"] for r in rs)) for rs in by_step.values()]),
            "indexer_share": median([mean(r["indexer_seconds"] / r["seconds"] for r in rs) for rs in by_step.values()]),
            "dispatch_bytes_per_rank": median([r["dispatch_bytes"] for rs in by_step.values() for r in rs]),
            "selection_bytes_per_rank": median([r["selection_bytes"] for rs in by_step.values() for r in rs]),
            "losses": [by_step[s][0]["loss"] for s in sorted(by_step)],
            "cost_model": by_step[max(by_step)][0]["calibration"]}
    result["peak_growth_per_rank"] = [r["peak_growth"] for r in sorted(
        (r for r in records if "peak_growth" in r), key=lambda r: r["rank"])]
    result["peak_growth_one_process"] = next((r["peak_growth"] for r in single if "peak_growth" in r), None)
    first = sorted((r for r in steps if r["step"] == 0 and r["mode"] == args.modes[0]), key=lambda r: r["rank"])
    result["state_bytes_per_rank"] = {name: first[0][name] for name in ("param_bytes", "grad_bytes", "optimizer_bytes")}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4, help="CP ranks (gloo on loopback)")
    parser.add_argument("--modes", default="none,zigzag,greedy,hybrid,spill,spill-uncalibrated",
                        help="strategies, interleaved every step (the first is the baseline); spill and auto "
                             "calibrate their cost model on the worker selector; NAME-uncalibrated runs NAME with "
                             "calibrate=False")
    parser.add_argument("--steps", type=int, default=3, help="training steps per strategy")
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per packed batch")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--index-heads", type=int, default=32)
    parser.add_argument("--topk", type=int, default=128)
    parser.add_argument("--selector", default="model", choices=("model", "fused"),
                        help="workers score with the model's torch math or sparsecp's fused CPU kernel")
    parser.add_argument("--kl", type=float, default=0.01, help="indexer KL coefficient (the indexer's training signal)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-single", action="store_true", help="skip the one-process memory baseline")
    parser.add_argument("--json", help="also write the summary as JSON to this file")
    args = parser.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    if args.ranks < 1 or args.tokens % args.ranks or not args.modes:
        parser.error("--ranks must divide --tokens, and --modes name at least one strategy")
    import torch

    import sparsecp

    print(f"# DeepSeek-V3.2 (transformers) under CP {args.ranks}: {args.tokens} tokens/step, lognormal documents, "
          f"top-{args.topk} of every earlier token, {args.index_heads} index heads, selector {args.selector}; "
          f"{cpu_model()}, {os.cpu_count()} cores, kernel ISA {sparsecp.kernel_isa()}, torch {torch.__version__}",
          flush=True)
    records = spawn(run_rank, args.ranks, args, print_step)
    single: list[dict[str, Any]] = []
    if not args.no_single:
        one = copy.copy(args)
        one.ranks, one.modes, one.steps = 1, args.modes[:1], 1
        single = spawn(single_process_peak, 1, one, None)
    result = summary(records, single, args)
    print("\nmedians per strategy over the steps (step: the slowest rank's wall time; selection: the selector's "
          "CPU seconds, the slowest rank's, its ratio to the first strategy's in the same step, and max / mean over "
          "the ranks)")
    print(f"{'mode':18s} {'step s':>8s} {'slowest sel. s':>15s} {'vs ' + args.modes[0]:>10s} "
          f"{'sel. imbalance':>15s} {'indexer share':>14s} {'KV bytes/rank':>14s} {'sel. bytes/rank':>16s}")
    for mode, row in result["modes"].items():
        print(f"{mode:18s} {row['step_seconds']:8.2f} {row['slowest_selector_seconds']:15.3f} "
              f"{row['slowest_selector_vs_first']:10.3f} {row['selection_imbalance']:15.2f} "
              f"{100 * row['indexer_share']:13.0f}% {row['dispatch_bytes_per_rank']:14.0f} "
              f"{row['selection_bytes_per_rank']:16.0f}")
    for mode, row in result["modes"].items():
        print(f"{mode:18s} {row['cost_model']}")
    losses = [row["losses"] for row in result["modes"].values()]
    spread = max(abs(a - b) for run in losses for a, b in zip(run, losses[0])) if len(losses) > 1 else 0.0
    print(f"losses per step agree across strategies to {spread:.2e}")
    peaks = ", ".join(f"{p / 2**20:.0f}" for p in result["peak_growth_per_rank"])
    one_process = result["peak_growth_one_process"]
    print(f"peak memory growth per rank (MiB, every strategy's copy): {peaks}"
          + (f"; one process, whole batch, one strategy: {one_process / 2**20:.0f} MiB"
             if one_process is not None else ""))
    print("per rank (replicated weights): " + ", ".join(f"{name.removesuffix('_bytes')} {value / 2**20:.2f} MiB"
                                                         for name, value in result["state_bytes_per_rank"].items()))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
