#!/usr/bin/env python3
"""Per-rank peak memory, step time and bank bytes of one DeepSeek-V4 training step under CP.

For each configuration (tokens x pack x selector x activation checkpointing) two fresh gloo ranks
(``--ranks``) on this machine build the same random ``DeepseekV4ForCausalLM``, make it
context-parallel (``sparsecp.models.deepseek_v4``, ``mode="spill"``), and run one training step on
their shard: forward, indexer KL (0.01), backward. Each rank reports:

* its peak resident memory growth during the step (``ru_maxrss`` after the step against the
  resident size before it, in fresh processes: the step's own peak), and per local row;
* the step's wall time (the slowest rank);
* per CSA layer, the Index K bank bytes it received against what the whole-bank all-gather it
  replaced moved to it (``(ranks - 1) x the widest rank's owned entries``), and the bytes of every
  row it gathered for the sliding-window halo, compressor windows and bank prefixes.

The model (the sizes of the issue that asked for this): hidden 128, four layers (sliding, CSA,
HCA, CSA), window 128, CSA ratio 4, HCA ratio 128, 4 attention heads of 64, an indexer of 32 heads
of 64 with top-k 128, 4 experts (2 active), float32. ``--baseline also`` (``only``) adds the same model with every
layer sliding and a window of 4: the memory of everything but the attention layers.

``--warmup N`` runs N untimed steps on the same batch first (default 0: the timed step is the
process's first, so its time includes first-call costs: lazy initialisation, the allocator's
growth, oneDNN's primitive creation). With N > 0 the timed step is a warm one, as nearly every
step of a training run is; its peak is the kernel's high-water mark (``VmHWM``) reset through
``/proc/self/clear_refs`` just before it, against the resident size before the warm-up steps
(the model and the batch, as without warm-up).

``--steps N`` times N steps after the warm-up (default 1): the step time is the median over them
of the slowest rank's (each step starts on a barrier), which steadies the figure on a busy or
drifting machine.

``--profile N`` runs rank 0's timed steps under ``torch.profiler`` and prints, under the row, the N
ops with the most self CPU time in them (the profiler adds a little per recorded op, so read the
step's seconds from a run without it). Profiling a configuration and its baseline side by side
shows what the CSA and HCA layers add to the all-sliding step. For shares that include the
kernels' own time (the profiler's self times of Python autograd functions and custom ops are not
reliable), ``--perf-fifo PATH`` lets ``perf`` record the timed steps of every rank only::

    mkfifo /tmp/perf.ctl
    perf record -a -D -1 --control=fifo:/tmp/perf.ctl -F 999 -o step.data -- \
        python python/benchmarks/v4_memory.py --tokens 16384 --packs lognormal --selectors fused \
        --checkpointing off --warmup 1 --perf-fifo /tmp/perf.ctl
    perf report -i step.data --sort dso,sym

Packs: ``one`` (one document of all the tokens) and ``lognormal`` (sparsecp's long-tailed
generator, ``sparsecp.generate_batch("lognormal", tokens, ranks, seed)``).

Usage::

    python python/benchmarks/v4_memory.py --tokens 16384,32768 --packs lognormal --selectors model
    python python/benchmarks/v4_memory.py --tokens 16384,65536 --baseline only
    python python/benchmarks/v4_memory.py --tokens 131072 --packs lognormal --checkpointing on --json out.json
    python python/benchmarks/v4_memory.py --tokens 16384 --packs lognormal --checkpointing off --warmup 1
    python python/benchmarks/v4_memory.py --tokens 16384 --packs lognormal --selectors fused --checkpointing off \
        --baseline also --warmup 1 --profile 15   # where a warm step goes, and its baseline's
    python python/benchmarks/v4_memory.py --svg memory.svg --from out.json   # plot saved runs
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import queue
import resource
import socket
import statistics
import sys
import time
import traceback
from typing import Any

KL_COEFF = 0.01


def model_config(baseline: bool) -> Any:
    from transformers import DeepseekV4Config

    types = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
             "compressed_sparse_attention"]
    return DeepseekV4Config(
        vocab_size=512, hidden_size=128, moe_intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=1, head_dim=64, q_lora_rank=64, num_experts_per_tok=2, n_routed_experts=4,
        n_shared_experts=1, layer_types=["sliding_attention"] * 4 if baseline else types,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"], sliding_window=4 if baseline else 128, o_groups=2,
        o_lora_rank=64, index_n_heads=32, index_head_dim=64, index_topk=128, hc_mult=2, hc_sinkhorn_iters=5,
        max_position_embeddings=1 << 21, attn_implementation="eager", experts_implementation="eager")


def lengths_of(pack: str, tokens: int, ranks: int) -> tuple[int, ...]:
    import sparsecp

    if pack == "one":
        return (tokens,)
    return tuple(int(n) for n in sparsecp.generate_batch("lognormal", tokens, ranks, 1))


def _resident_kib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _reset_peak() -> None:
    """Sets this process's resident high-water mark (VmHWM) to its resident size now (Linux 4.0+)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError as error:
        raise RuntimeError(f"--warmup needs /proc/self/clear_refs to reset the peak resident size: {error}") from None


def _peak_kib() -> int:
    """This process's resident high-water mark since the last _reset_peak (VmHWM, KiB)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/status has no VmHWM line")


def _perf_control(path: str | None, command: str) -> None:
    """Tells a waiting ``perf record --control=fifo:PATH`` to ``enable`` or ``disable`` recording."""
    if path:
        with open(path, "w") as fifo:
            fifo.write(command + "\n")


def rank_main(rank: int, size: int, port: int, job: dict[str, Any], results: Any) -> None:
    try:
        results.put((rank, run_rank(rank, size, port, job)))
    except BaseException:  # the parent reports it
        results.put((rank, {"error": traceback.format_exc()}))


def run_rank(rank: int, size: int, port: int, job: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from transformers import DeepseekV4ForCausalLM

    from sparsecp.models import deepseek_v4 as cp_v4

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=3600))
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(model_config(job["baseline"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("sinks", "position_bias")):
                parameter.normal_(0, 0.5)
    if job["checkpointing"]:
        model.activation_checkpointing_enable()
    model.train()
    # The baseline has no CSA layer, so no indexer and no KL.
    cp_v4.context_parallel(model, None, "spill", selector=job["selector"],
                           indexer_kl_coeff=None if job["baseline"] else KL_COEFF,
                           attention_backend=job.get("attention"))
    state = cp_v4.context_parallel_state(model)
    lengths = lengths_of(job["pack"], job["tokens"], size)
    input_ids = torch.randint(0, 512, (1, sum(lengths)), generator=torch.Generator().manual_seed(1))
    ids, positions = cp_v4.shard_batch(input_ids, lengths)
    labels = cp_v4.shard_labels(input_ids, lengths)
    del input_ids

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
        loss = cp_v4.causal_lm_loss(logits, labels, lengths)
        kl = cp_v4.indexer_kl_loss(model) if not job["baseline"] else torch.zeros(())
        (loss + kl).backward()
        return loss, kl

    warm = job.get("warmup", 0)
    dist.barrier()
    before = _resident_kib()  # the model and the batch: a warm step's peak is taken against it too
    for _ in range(warm):
        step()
    state.clock.seconds = 0.0
    state.stats.dispatch_bytes = 0
    dist.barrier()
    if warm:
        _reset_peak()
    profiled = rank == 0 and job.get("profile", 0) > 0
    profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profiled else None
    perf_fifo = job.get("perf_fifo") if rank == 0 else None  # one writer; perf -a sees every rank
    _perf_control(perf_fifo, "enable")
    step_seconds = []
    with profile if profile is not None else contextlib.nullcontext():
        for index in range(job.get("steps", 1)):
            if index:
                dist.barrier()  # every timed step starts together, so its slowest rank is its time
            start = time.perf_counter()
            loss, kl = step()
            step_seconds.append(time.perf_counter() - start)
    dist.barrier()  # the slowest rank's step is inside the recording too
    _perf_control(perf_fifo, "disable")
    top = []
    if profile is not None:
        from attention_share import top_ops  # the benchmarks' folder: this script's own

        top = top_ops(profile, job["profile"])
    peak = _peak_kib() if warm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    dist.barrier()
    banks = []
    if not job["baseline"]:
        layout = next(reversed(state.batch(lengths)._device.values()))  # the tables the forward made
        tables = layout.compressions[(4, True)]
        assert tables.index_bank is not None
        owners = tables.layout.owners
        widest = max(owners[q + 1] - owners[q] for q in range(size))
        row_bytes = 64 * 4
        banks.append({"index_bank_received": tables.index_bank.plan.received_rows * row_bytes,
                      "whole_bank_gather": (size - 1) * widest * row_bytes,
                      "index_bank_rows": tables.index_bank.plan.rows, "bank_entries": tables.layout.entries})
    local = sum(lengths) // size
    growth = max(0, peak - before)
    return {"rank": rank, "local_rows": local, "documents": len(lengths), "longest": max(lengths),
            "peak_growth_kib": growth, "kib_per_row": growth / local, "step_seconds": step_seconds,
            "selector_seconds": state.clock.seconds / len(step_seconds),
            "dispatch_bytes": state.stats.dispatch_bytes // len(step_seconds), "banks": banks,
            "loss": float(loss.detach()), "kl": float(kl.detach()), "top": top}


def run_job(job: dict[str, Any], ranks: int) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=rank_main, args=(r, ranks, port, job, results)) for r in range(ranks)]
    for process in processes:
        process.start()
    out: list[tuple[int, dict[str, Any]]] = []
    while len(out) < len(processes):
        try:
            out.append(results.get(timeout=5))
        except queue.Empty:  # a rank killed from outside (out of memory: SIGKILL) sends nothing
            answered = {rank for rank, _ in out}
            dead = [(r, p.exitcode) for r, p in enumerate(processes) if r not in answered and p.exitcode is not None]
            if dead:
                for process in processes:
                    process.kill()
                raise RuntimeError(f"rank {dead[0][0]} died with exit code {dead[0][1]} before reporting "
                                   f"({job}); -9 is SIGKILL, usually the kernel's out-of-memory killer") from None
    for process in processes:
        process.join()
    by_rank = [value for _, value in sorted(out, key=lambda item: item[0])]
    for value in by_rank:
        if "error" in value:
            raise RuntimeError(value["error"])
    return by_rank


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def svg(rows: list[dict[str, Any]]) -> str:
    """Memory per local row (KB, the busiest rank) against tokens, one line per configuration."""
    series: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        name = f"{row['pack']}, {row['selector']}" + (", checkpointing" if row["checkpointing"] else "") + \
            (" (baseline: all sliding, window 4)" if row["baseline"] else "")
        series.setdefault(name, []).append((row["tokens"], row["kb_per_row"]))
    width, height, left, bottom, top, right = 940, 380, 70, 50, 20, 410
    xs = sorted({t for points in series.values() for t, _ in points})
    top_y = max(v for points in series.values() for _, v in points) * 1.15
    import math

    def x(tokens: int) -> float:
        span = math.log2(xs[-1] / xs[0]) if len(xs) > 1 else 1.0
        return left + (width - left - right) * (math.log2(tokens / xs[0]) / span if span else 0.5)

    def y(value: float) -> float:
        return top + (height - top - bottom) * (1 - value / top_y)

    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f", "#bcbd22",
              "#e377c2"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<line x1="{left}" y1="{y(0)}" x2="{width - right}" y2="{y(0)}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{y(0)}" stroke="black"/>',
             f'<text x="{(left + width - right) / 2}" y="{height - 12}" text-anchor="middle">tokens (2 ranks)</text>',
             f'<text x="16" y="{(top + height - bottom) / 2}" transform="rotate(-90 16 {(top + height - bottom) / 2})" '
             'text-anchor="middle">peak growth per local row (KB)</text>']
    for tokens in xs:
        parts.append(f'<text x="{x(tokens)}" y="{y(0) + 16}" text-anchor="middle">{tokens // 1024}K</text>')
    for step in range(5):
        value = top_y * step / 5
        parts.append(f'<text x="{left - 6}" y="{y(value) + 4}" text-anchor="end">{value:.0f}</text>')
        parts.append(f'<line x1="{left}" y1="{y(value)}" x2="{width - right}" y2="{y(value)}" stroke="#ddd"/>')
    for index, (name, points) in enumerate(sorted(series.items())):
        color = colors[index % len(colors)]
        points.sort()
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for t, v in points:
            parts.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="3" fill="{color}"/>')
        legend_y = top + 16 * index + 8
        parts.append(f'<line x1="{width - right + 10}" y1="{legend_y}" x2="{width - right + 30}" y2="{legend_y}" '
                     f'stroke="{color}" stroke-width="2"/>')
        parts.append(f'<text x="{width - right + 34}" y="{legend_y + 4}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2, help="gloo ranks (default 2)")
    parser.add_argument("--tokens", default="16384,32768,65536,131072",
                        help="comma-separated batch sizes in tokens (default 16384,32768,65536,131072)")
    parser.add_argument("--packs", default="one,lognormal",
                        help="'one' (a single document), 'lognormal' (default both)")
    parser.add_argument("--selectors", default="model,fused", help="worker selectors (default model,fused)")
    parser.add_argument("--checkpointing", default="off,on", help="activation checkpointing: off, on (default both)")
    parser.add_argument("--baseline", choices=("off", "also", "only"), default="off",
                        help="the same model with every layer sliding and a window of 4, lognormal packs, model "
                             "selector: 'also' beside the configurations, 'only' instead of them (default off)")
    parser.add_argument("--attention", default="auto",
                        help="sparse_attention backends, comma-separated: 'auto' (the C++ kernel on CPU), 'cpu', "
                             "'torch' (the chunked torch path) (default auto)")
    parser.add_argument("--warmup", type=int, default=0,
                        help="untimed steps before the timed one (default 0: the timed step is the process's first)")
    parser.add_argument("--steps", type=int, default=1,
                        help="timed steps after the warm-up; the step time is the median over them of the "
                             "slowest rank's, the peak the highest (default 1)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile rank 0's timed steps and print their N ops with the most self CPU time "
                             "(default 0: no profiler)")
    parser.add_argument("--perf-fifo", metavar="PATH",
                        help="a perf control FIFO: rank 0 writes 'enable' before the timed steps and 'disable' "
                             "after them, so that `perf record -a -D -1 --control=fifo:PATH` records only those")
    parser.add_argument("--json", help="append each configuration's result to this JSON file as it finishes")
    parser.add_argument("--svg", help="write the memory-per-row plot here")
    parser.add_argument("--from", dest="source", help="read results from this JSON file instead of running")
    args = parser.parse_args()
    if args.ranks < 1:
        parser.error(f"--ranks must be positive, got {args.ranks}")
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, got {args.warmup}")
    if args.steps < 1:
        parser.error(f"--steps must be 1 or more, got {args.steps}")
    if args.profile < 0:
        parser.error(f"--profile must be 0 or more, got {args.profile}")
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        parser.error(f"--tokens must be comma-separated integers, got {args.tokens!r}")
    bad = [t for t in tokens if t < args.ranks or t % args.ranks]
    if bad:
        parser.error(f"--tokens {bad}: each must be a positive multiple of --ranks {args.ranks}")
    packs = [p for p in args.packs.split(",") if p]
    if set(packs) - {"one", "lognormal"} or not packs:
        parser.error(f"--packs takes 'one' and/or 'lognormal', got {args.packs!r}")
    selectors = [s for s in args.selectors.split(",") if s]
    if set(selectors) - {"model", "fused"} or not selectors:
        parser.error(f"--selectors takes 'model' and/or 'fused', got {args.selectors!r}")
    attentions = [None if a == "auto" else a for a in args.attention.split(",") if a]
    if {a for a in attentions if a is not None} - {"cpu", "torch"} or not attentions:
        parser.error(f"--attention takes 'auto', 'cpu' and/or 'torch', got {args.attention!r}")
    checkpointing = [c for c in args.checkpointing.split(",") if c]
    if set(checkpointing) - {"on", "off"} or not checkpointing:
        parser.error(f"--checkpointing takes 'off' and/or 'on', got {args.checkpointing!r}")

    rows: list[dict[str, Any]] = []
    if args.source:
        with open(args.source) as source:
            rows = json.load(source)["rows"]
    else:
        import sparsecp

        header = {"cpu": cpu_model(), "isa": sparsecp.kernel_isa(), "cores": os.cpu_count(),
                  "date": datetime.date.today().isoformat(), "ranks": args.ranks, "command": " ".join(sys.argv)}
        warmth = f", {args.warmup} warm-up step(s) before the timed one" if args.warmup else ", the first step timed"
        print(f"# {header['cpu']}, kernels {header['isa']}, {header['cores']} cores, {args.ranks} ranks, "
              f"{header['date']}{warmth}")
        print("# tokens  pack       selector ckpt  attention  peak/rank MiB  KB/row  step s  selector s  "
              "Index K recv MB (whole-bank MB)")
        timing = {"warmup": args.warmup, "steps": args.steps, "profile": args.profile, "perf_fifo": args.perf_fifo}
        jobs = [{"tokens": t, "pack": p, "selector": s, "checkpointing": c == "on", "baseline": False, "attention": a,
                 **timing}
                for t in tokens for p in packs for s in selectors for c in checkpointing for a in attentions]
        if args.baseline == "only":
            jobs = []
        if args.baseline != "off":
            jobs += [{"tokens": t, "pack": "lognormal", "selector": "model", "checkpointing": False, "baseline": True,
                      "attention": a, **timing} for t in tokens for a in attentions]
        for job in jobs:
            ranks = run_job(job, args.ranks)
            busiest = max(ranks, key=lambda r: r["peak_growth_kib"])
            bank = " ".join(f"{b['index_bank_received'] / 1e6:.2f} ({b['whole_bank_gather'] / 1e6:.2f})"
                            for r in ranks for b in r["banks"])
            row = {**job, "peak_mib": busiest["peak_growth_kib"] / 1024,
                   "kb_per_row": busiest["peak_growth_kib"] * 1.024 / busiest["local_rows"],
                   "step_seconds": statistics.median(max(r["step_seconds"][i] for r in ranks)
                                                     for i in range(args.steps)),
                   "selector_seconds": max(r["selector_seconds"] for r in ranks), "ranks": ranks}
            rows.append(row)
            ckpt = "on " if job["checkpointing"] else "off"
            tag = " (baseline)" if job["baseline"] else ""
            print(f"{job['tokens']:>8}  {job['pack']:<10} {job['selector']:<8} {ckpt}  "
                  f"{job['attention'] or 'auto':<9}{tag}  {row['peak_mib']:>13.0f}  "
                  f"{row['kb_per_row']:>6.0f}  {row['step_seconds']:>6.2f}  {row['selector_seconds']:>10.1f}  {bank}",
                  flush=True)
            for name, seconds, calls in ranks[0]["top"]:
                print(f"#   rank 0 self CPU {seconds:7.3f} s  {calls:>6} calls  {name}", flush=True)
            if args.json:
                with open(args.json, "w") as out:
                    json.dump({"header": header, "rows": rows}, out, indent=1)
    if args.svg:
        with open(args.svg, "w") as out:
            out.write(svg(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
