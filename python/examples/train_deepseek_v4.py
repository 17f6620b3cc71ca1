#!/usr/bin/env python3
"""Train a small transformers DeepSeek-V4 under context parallelism, one strategy against another.

Every step, each strategy (``--modes``, interleaved: none, zigzag, hybrid, spill, and spill on
its default cost model, by default) trains its own copy of the same randomly initialised
``DeepseekV4ForCausalLM`` on the same packed batch, split contiguously over ``--ranks`` gloo
ranks with ``sparsecp.models.deepseek_v4``: the sliding-window halo and compressed-bank
prefixes move between ranks, the CSA indexer's top-k selection is balanced by the strategy,
the indexer trains on its KL loss, AdamW updates the replicated weights. The copies see the
same data and must report the same losses (each equals the model run one document at a time);
what differs is where the selection work runs.

Batches: ``--tokens`` tokens per step packed from documents of sparsecp's long-tailed
``lognormal`` generator (``sparsecp.generate_batch("lognormal", tokens, cp, seed)``: most
documents short, a few as long as a whole shard or longer), one seed per step.

Sizes (the defaults): hidden 128, 4 layers (sliding, CSA, HCA, CSA), 4 attention heads of 64,
window 64, CSA ratio 4, HCA ratio 32, an indexer of 32 heads of 64 (V4.1's head count, half its
head width) with top-k 128, 4 experts (2 active) of width 64, 16384 tokens a step (4096 a rank).
The indexer scores every visible compressed key of every row (``len / 4`` keys at the end of a
document, each against 32 heads), so with documents of thousands of tokens it is a real part of
the step, while the rest of the model (a 128-wide MoE transformer) stays small enough for a CPU:
the regime the balancing is for.

Per step and strategy it prints the loss (summed over ranks), the step time (slowest rank), and
per rank the indexer's share of the step (owner-side indexer work, selection exchange and
worker selection); at the end, medians per strategy: step time, the selection work's imbalance
(max / mean of the ranks' selector seconds), the indexer's share, bytes each rank sent (halo,
compressor rows, bank prefixes, Index K bank; selection exchange), and each rank's peak memory
against one process running the whole batch (resident set growth during the steps).

spill calibrates its cost model on the worker selector by itself (``context_parallel``: rank 0
times the selector in the first forward, every rank refits from the measured selection times of
later steps); ``NAME-uncalibrated`` runs a strategy with ``calibrate=False`` (spill on causal
pairs). The step is also charged in CPU seconds (each rank's own work: with more ranks than
cores, a rank's wall time counts its peers' turns on the core): per strategy the slowest rank's
step, its gain over the first strategy's, and the bound a perfect balancer of the first
strategy's selection could reach, ``(R + I * m) / (R + m)`` (m: the mean of the ranks' selector
seconds, I: their max / mean, R: the rest of the step, the mean of the ranks' step CPU seconds
less their selector seconds).

With ``--dp D`` it trains the way large models are trained: D x ``--ranks`` gloo processes on a
``(dp, cp)`` DeviceMesh, each dp row its own packed batch, ``context_parallel`` over
``mesh["cp"]``, then FSDP2 (``fully_shard``) of every layer and the model over the flattened
dp x cp mesh (no hand all-reduce), the loss the mean over the valid tokens of the global batch
(``causal_lm_loss(..., group=flat)``) plus the KL times the CP size. Each rank then reports its
parameter, gradient and AdamW-state bytes (the replicated run reports them too: every rank holds
the whole model).

Usage::

    python python/examples/train_deepseek_v4.py --ranks 4
    python python/examples/train_deepseek_v4.py --ranks 2 --dp 2 --modes spill --steps 2 --tokens 4096
    python python/examples/train_deepseek_v4.py --ranks 4 --steps 5 --selector fused --json out.json
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
    from transformers import DeepseekV4Config

    return DeepseekV4Config(
        vocab_size=512, hidden_size=args.hidden, moe_intermediate_size=args.hidden // 2, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, head_dim=64, q_lora_rank=64, num_experts_per_tok=2,
        n_routed_experts=4, n_shared_experts=1,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 32},
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"], sliding_window=64, o_groups=2, o_lora_rank=64,
        index_n_heads=args.index_heads, index_head_dim=64, index_topk=args.topk, hc_mult=2, hc_sinkhorn_iters=5,
        max_position_embeddings=1 << 20, attn_implementation="eager", experts_implementation="eager")


def build_models(args: argparse.Namespace) -> Any:
    import torch
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(args.seed)
    model = DeepseekV4ForCausalLM(model_config(args))
    with torch.no_grad():  # the model initialises sinks, position biases and the hash table to 0
        generator = torch.Generator().manual_seed(args.seed)
        for name, parameter in model.named_parameters():
            if name.endswith(("sinks", "position_bias")):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
        for name, buffer in model.named_buffers():
            if name.endswith("tid2eid"):
                buffer.copy_(torch.randint(0, model.config.n_routed_experts, buffer.shape, generator=generator))
    return model


def batch(args: argparse.Namespace, step: int, row: int = 0) -> tuple[tuple[int, ...], Any]:
    """Step ``step``'s packed batch of dp row ``row`` (row 0: the replicated run's batch)."""
    import torch

    import sparsecp

    seed = args.seed + step + 7919 * row
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
    """This rank's bytes of parameters, gradients and optimizer state (a DTensor counts its
    local shard only: what FSDP2 keeps between steps)."""
    def local(tensor: Any) -> Any:
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    def size(tensor: Any) -> int:
        return local(tensor).numel() * local(tensor).element_size()

    parameters = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if hasattr(v, "numel") and v.ndim > 0]
    return {"param_bytes": sum(size(p) for p in parameters),
            "grad_bytes": sum(size(p.grad) for p in parameters if p.grad is not None),
            "optimizer_bytes": sum(size(v) for v in state)}


def run_rank(rank: int, size: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    import sparsecp.torch as sparsecp_torch
    from sparsecp.models import deepseek_v4 as cp_v4

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=600))
    try:
        dp = getattr(args, "dp", 1)
        cp_group: Any = None
        flat: Any = None
        row = 0
        if dp > 1:  # FSDP2 over the flattened dp x cp mesh
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (dp, size // dp), mesh_dim_names=("dp", "cp"))
            cp_group, flat, row = mesh["cp"], mesh["dp", "cp"]._flatten(), mesh["dp"].get_local_rank()
        base = build_models(args)
        models, optimizers = {}, {}
        for variant in args.variants:
            mode, _, selector = variant.partition("+")
            selector = selector or args.selectors[0]
            options = dict(MODE_OPTIONS.get(mode.removesuffix(UNCALIBRATED), {}))
            if mode.endswith(UNCALIBRATED):
                options["calibrate"] = False
            model = copy.deepcopy(base)
            cp_v4.context_parallel(model, cp_group, mode.removesuffix(UNCALIBRATED), selector=selector,
                                   indexer_kl_coeff=args.kl, **options)
            if flat is not None:  # after context_parallel: FSDP2 wraps the CP forwards and hooks
                from torch.distributed.fsdp import fully_shard

                for layer in model.model.layers:
                    fully_shard(layer, mesh=flat)
                fully_shard(model, mesh=flat)
            model.train()
            models[variant] = model
            optimizers[variant] = torch.optim.AdamW(model.parameters(), lr=args.lr)
        del base
        resident = rss_bytes()
        memories: dict[str, dict[str, int]] = {}
        for step in range(args.steps):
            lengths, input_ids = batch(args, step, row)
            ids, positions = cp_v4.shard_batch(input_ids, lengths, cp_group)
            labels = cp_v4.shard_labels(input_ids, lengths, cp_group)
            for mode in args.variants:
                model, optimizer = models[mode], optimizers[mode]
                state = cp_v4.context_parallel_state(model)
                assert state is not None
                state.stats.reset()
                state.clock.calls, state.clock.seconds = 0, 0.0
                sparsecp_torch.reset_exchange_stats()
                dist.barrier()
                start, cpu_start = time.perf_counter(), time.thread_time()
                optimizer.zero_grad(set_to_none=True)
                out = model(input_ids=ids, position_ids=positions, document_lengths=lengths)
                if flat is None:  # replicated: shares summed over the CP ranks
                    loss = cp_v4.causal_lm_loss(out.logits, labels, lengths)
                    kl = cp_v4.indexer_kl_loss(model)
                    (loss + kl if kl is not None else loss).backward()
                    cp_v4.all_reduce_gradients(model)
                else:  # FSDP2 averages over dp x cp: each term scaled for that mean
                    loss = cp_v4.causal_lm_loss(out.logits, labels, lengths, group=flat)
                    kl = cp_v4.indexer_kl_loss(model, group=flat)
                    (loss + kl if kl is not None else loss).backward()
                if step == 0:  # after backward, before the step: parameters and gradients (AdamW's
                    # state from the first step on, so it is read after the step)
                    memories[mode] = memory_bytes(model, optimizer)
                optimizer.step()
                seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - cpu_start
                if step == 0:
                    memories[mode]["optimizer_bytes"] = memory_bytes(model, optimizer)["optimizer_bytes"]
                # reported: the global mean loss and the mean over dp rows of each row's KL
                summed = torch.tensor([float(loss.detach()) / (size if flat is not None else 1),
                                       float(kl.detach()) / dp if kl is not None else 0.0])
                dist.all_reduce(summed)
                queue.put({"rank": rank, "step": step, "mode": mode, "seconds": seconds,
                           "loss": float(summed[0]), "kl": float(summed[1]), "documents": len(lengths),
                           "longest": max(lengths), "indexer_seconds": state.stats.indexer_seconds,
                           "selector_seconds": state.clock.seconds, "cpu_seconds": cpu_seconds,
                           "calibration": None if state.calibration is None else str(state.calibration.report),
                           "calibration_seconds": 0.0 if state.calibration is None else
                           state.calibration.report.seconds,
                           "predictions": [] if state.calibration is None else state.calibration.report.predictions,
                           "predicted_by_refit": [] if state.calibration is None else
                           state.calibration.report.predicted_by_refit,
                           "dispatch_bytes": state.stats.dispatch_bytes,
                           "selection_bytes": sparsecp_torch.exchange_stats()["bytes_sent"], **memories[mode]})
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
        record = queue.get(timeout=1800)
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
    mib = 2 ** -20
    memory = "  per rank MiB: " + " ".join(f"params {r['param_bytes'] * mib:.2f} grads {r['grad_bytes'] * mib:.2f} "
                                           f"adamw {r['optimizer_bytes'] * mib:.2f}" for r in ranks[:1])
    print(f"step {first['step']}  {first['mode']:16s} loss {first['loss']:.6f}  kl {first['kl']:.5f}  "
          f"step {max(r['seconds'] for r in ranks):6.2f} s (CPU {max(r['cpu_seconds'] for r in ranks):5.2f} s)  "
          f"selection {max(r['selector_seconds'] for r in ranks):6.3f} s  indexer share per rank {shares}  "
          f"({first['documents']} documents, longest {first['longest']})"
          + (memory if first["step"] == 0 else ""), flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(records: list[dict[str, Any]], single: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    steps = [r for r in records if "step" in r]
    result: dict[str, Any] = {"modes": {}}
    for mode in args.variants:
        mine = [r for r in steps if r["mode"] == mode]
        by_step: dict[int, list[dict[str, Any]]] = {}
        for r in mine:
            by_step.setdefault(r["step"], []).append(r)
        step_time = [max(r["seconds"] for r in rs) for rs in by_step.values()]
        imbalance = [max(r["selector_seconds"] for r in rs) / max(1e-12, statistics.mean(
            r["selector_seconds"] for r in rs)) for rs in by_step.values()]
        share = [statistics.mean(r["indexer_seconds"] / r["seconds"] for r in rs) for rs in by_step.values()]
        slowest_selector = [max(r["selector_seconds"] for r in rs) for rs in by_step.values()]
        first = args.modes[0] + (f"+{mode.partition('+')[2]}" if "+" in mode else "")  # same selector
        baseline = [r for r in steps if r["mode"] == first]
        first_slowest = {s: max(r["selector_seconds"] for r in baseline if r["step"] == s) for s in by_step}
        against_first = [max(r["selector_seconds"] for r in rs) / max(1e-12, first_slowest[s])
                         for s, rs in by_step.items()]
        # The step in CPU seconds (each rank's own work), against the first strategy's with the same
        # selector, and the bound a perfect balancer of that strategy's selection could reach.
        base_steps = {s: [r for r in steps if r["mode"] == first and r["step"] == s] for s in by_step}
        step_cpu = {s: max(r["cpu_seconds"] for r in rs) for s, rs in by_step.items()}
        gain, bound = [], []
        for s in by_step:
            ranks = base_steps[s]
            m = statistics.mean(r["selector_seconds"] for r in ranks)
            imbalance_first = max(r["selector_seconds"] for r in ranks) / max(1e-12, m)
            rest = statistics.mean(r["cpu_seconds"] - r["selector_seconds"] for r in ranks)
            gain.append(max(r["cpu_seconds"] for r in ranks) / step_cpu[s])
            bound.append((rest + imbalance_first * m) / (rest + m))
        result["modes"][mode] = {
            "step_seconds": median(step_time), "step_cpu_seconds": median(list(step_cpu.values())),
            "step_gain": median(gain), "step_bound": median(bound),
            "step_gain_of_bound": median([g / b for g, b in zip(gain, bound)]),
            "calibration_seconds": max(r.get("calibration_seconds", 0.0) for r in mine),
            "calibration": next((r["calibration"] for r in sorted(mine, key=lambda r: (-r["step"], r["rank"]))
                                 if r.get("calibration")), None),
            # each forward's (predicted, measured) selector seconds per rank, by the model that planned it
            "predictions": max((r["predictions"] for r in mine), key=len),
            "predicted_by_refit": max((r["predicted_by_refit"] for r in mine), key=len),
            "selection_imbalance": median(imbalance), "indexer_share": median(share),
            "slowest_selector_seconds": median(slowest_selector),
            "slowest_selector_vs_first": median(against_first),
            "per_step_slowest_selector_vs_first": against_first, "per_step_gain": gain,
            "dispatch_bytes_per_rank": median([r["dispatch_bytes"] for r in mine]),
            "selection_bytes_per_rank": median([r["selection_bytes"] for r in mine]),
            "losses": [by_step[s][0]["loss"] for s in sorted(by_step)]}
    result["peak_growth_per_rank"] = [r["peak_growth"] for r in sorted(
        (r for r in records if "peak_growth" in r), key=lambda r: r["rank"])]
    result["peak_growth_one_process"] = next((r["peak_growth"] for r in single if "peak_growth" in r), None)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4, help="CP ranks (gloo on loopback)")
    parser.add_argument("--dp", type=int, default=1,
                        help="data-parallel rows: with D > 1, D x --ranks processes, FSDP2 over the flattened "
                             "dp x cp mesh (each dp row its own batch) instead of replicated weights")
    parser.add_argument("--modes", default="none,zigzag,hybrid,spill,spill-uncalibrated",
                        help="strategies, interleaved every step (the first is the baseline); spill and auto "
                             "calibrate their cost model on the worker selector; NAME-uncalibrated runs NAME with "
                             "calibrate=False")
    parser.add_argument("--steps", type=int, default=5, help="training steps per strategy")
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per packed batch")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--index-heads", type=int, default=32)
    parser.add_argument("--topk", type=int, default=128)
    parser.add_argument("--selector", default="model",
                        help="workers score with the model's torch math ('model') or sparsecp's fused CPU kernel "
                             "('fused'); 'model,fused' runs every strategy with each, interleaved")
    parser.add_argument("--kl", type=float, default=0.01, help="indexer KL coefficient (the indexer's training signal)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-single", action="store_true", help="skip the one-process memory baseline")
    parser.add_argument("--json", help="also write the summary as JSON to this file")
    args = parser.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    args.selectors = [s for s in args.selector.split(",") if s]
    if args.ranks < 1 or args.tokens % args.ranks or not args.modes:
        parser.error("--ranks must divide --tokens, and --modes name at least one strategy")
    if not args.selectors or any(s not in ("model", "fused") for s in args.selectors):
        parser.error(f"--selector takes 'model', 'fused' or both, got {args.selector!r}")
    args.variants = [m if len(args.selectors) == 1 else f"{m}+{s}" for m in args.modes for s in args.selectors]
    import torch

    import sparsecp

    print(f"# DeepSeek-V4 (transformers) under CP {args.ranks}: {args.tokens} tokens/step, lognormal documents, "
          f"selector {args.selector}, modes {','.join(args.modes)}; {cpu_model()}, "
          f"{os.cpu_count()} cores, kernel ISA {sparsecp.kernel_isa()}, torch {torch.__version__}", flush=True)
    if args.dp < 1:
        parser.error("--dp must be at least 1")
    records = spawn(run_rank, args.ranks * args.dp, args, print_step)
    single: list[dict[str, Any]] = []
    if not args.no_single:
        one = copy.copy(args)
        one.ranks, one.modes, one.variants, one.steps = 1, args.modes[:1], args.variants[:1], min(args.steps, 2)
        one.dp = 1
        single = spawn(single_process_peak, 1, one, None)
    result = summary(records, single, args)
    print("\nmedians per strategy over the steps (step: the slowest rank's wall time; selection: the selector's "
          "CPU seconds, the slowest rank's, its ratio to the first strategy's in the same step, and max / mean over "
          "the ranks)")
    print(f"{'mode':16s} {'step s':>8s} {'slowest sel. s':>15s} {'vs ' + args.variants[0]:>10s} "
          f"{'sel. imbalance':>15s} {'indexer share':>14s} {'KV bytes/rank':>14s} {'sel. bytes/rank':>16s}")
    for mode, row in result["modes"].items():
        print(f"{mode:16s} {row['step_seconds']:8.2f} {row['slowest_selector_seconds']:15.3f} "
              f"{row['slowest_selector_vs_first']:10.3f} {row['selection_imbalance']:15.2f} "
              f"{100 * row['indexer_share']:13.0f}% {row['dispatch_bytes_per_rank']:14.0f} "
              f"{row['selection_bytes_per_rank']:16.0f}")
    print(f"\nthe step in CPU seconds (each rank's own work), medians over the steps: the slowest rank's, its gain "
          f"over {args.modes[0]}'s with the same selector, and the bound (R + I*m) / (R + m) of a perfect balancer "
          f"of {args.modes[0]}'s selection")
    print(f"{'mode':16s} {'step CPU s':>11s} {'gain':>7s} {'bound':>7s} {'gain/bound':>11s}  cost model")
    for mode, row in result["modes"].items():
        calibration = row["calibration"] or "-"
        if row["calibration_seconds"]:
            calibration += f"; calibration {row['calibration_seconds']:.2f} s on rank 0 (first step)"
        print(f"{mode:16s} {row['step_cpu_seconds']:11.2f} {row['step_gain']:7.3f} {row['step_bound']:7.3f} "
              f"{row['step_gain_of_bound']:11.3f}  {calibration}")
    losses = [row["losses"] for row in result["modes"].values()]
    spread = max(abs(a - b) for run in losses for a, b in zip(run, losses[0])) if len(losses) > 1 else 0.0
    print(f"losses per step agree across strategies to {spread:.2e}")
    peaks = ", ".join(f"{p / 2**20:.0f}" for p in result["peak_growth_per_rank"])
    one = result["peak_growth_one_process"]
    print(f"peak memory growth per rank (MiB): {peaks}" + (f"; one process, whole batch: {one / 2**20:.0f} MiB"
                                                           if one is not None else ""))
    first = [r for r in records if r.get("step") == 0 and r.get("mode") == args.variants[0]]
    mib = 2 ** -20
    layout = f"FSDP2 over dp {args.dp} x cp {args.ranks}" if args.dp > 1 else f"replicated over cp {args.ranks}"
    for name in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        values = [r[name] * mib for r in sorted(first, key=lambda r: r["rank"])]
        print(f"{name.removesuffix('_bytes'):9s} MiB per rank ({layout}): " + ", ".join(f"{v:.2f}" for v in values))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
