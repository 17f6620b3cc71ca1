#!/usr/bin/env python3
"""The attention's share of a DeepSeek-V4 training step on CPU, before and after the C++ kernel.

One process (CP size 1, gloo) builds a random transformers ``DeepseekV4ForCausalLM``, makes two
copies of it context-parallel (``sparsecp.models.deepseek_v4.context_parallel(model, group,
mode="none", attention_backend=...)``) and times a training step (forward, causal-LM loss plus
the indexer KL loss at 0.01, backward; no optimizer) on the same packed batch, alternating:

* ``torch``: every attention layer through the chunked torch path (before the kernel);
* ``cpu``: every attention layer through sparsecp's C++ kernel (after).

Configurations (``--configs``):

* ``example``: ``python/examples/train_deepseek_v4.py``'s defaults: hidden 128, 4 layers
  (sliding, CSA, HCA, CSA), 4 attention heads of 64, window 64, CSA ratio 4, HCA ratio 32, an
  indexer of 32 heads of 64 with top-k 128, 4 experts (2 active), 16,384 tokens packed from
  sparsecp's ``lognormal`` generator (``generate_batch("lognormal", tokens, 4, seed)``: the
  example's 4-rank pack, here all in one process).
* ``v4flash``: the same model at DeepSeek-V4-Flash's per-row attention shape: 64 heads of 512
  (K=V), window 128, top-k 512 (CSA rows list 640 columns), the rest as small as above, one
  document of 512 tokens (a couple of minutes a run on one core).

How the attention's time is measured: every timed step runs under ``torch.profiler`` (CPU
events only, no shapes, no stacks), and the attention's seconds are the union of the intervals of
the events that are the attention's own work: the torch path's autograd function
``_SparseAttention`` (forward) and its node ``_SparseAttentionBackward``; the C++ kernel's custom
ops ``sparsecp::sparse_attention`` and ``sparsecp::sparse_attention_backward``. Not counted:
``sparse_attention``'s argument checks, its backend pick, and the torch path's index preparation
around ``_SparseAttention`` (a few elementwise ops a call). The share is those seconds over the
same step's wall time. The profiler costs a little per recorded op, so each round also times one
step per backend without it ("plain"): compare the two step columns for the profiler's cost.

Per configuration and backend it prints the median over ``--steps`` rounds of: the step's
seconds (plain and profiled), the attention's forward and backward seconds, its share of the
step, the number of attention calls a step, and the loss (the two backends must agree to float32
rounding); then the step's speedup (plain, torch over cpu). A warm-up step per backend comes
first, untimed.

Usage::

    python python/benchmarks/attention_share.py                       # both configurations, 3 rounds
    python python/benchmarks/attention_share.py --configs example --steps 5 --json share.json
    python python/benchmarks/attention_share.py --configs v4flash --tokens 1024
    python python/benchmarks/attention_share.py --tokens 256 --steps 1  # a quick look (seconds)
    python python/benchmarks/attention_share.py --configs example --steps 1 --top 15  # where the step goes
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from typing import Any

KL_COEFF = 0.01
PACK_RANKS = 4  # the example's default --ranks: its packs are made for 4 ranks
BACKENDS = ("torch", "cpu")  # before, after
# The profiler events that are the attention's own work (module docstring).
FORWARD_EVENTS = frozenset({"_SparseAttention", "sparsecp::sparse_attention"})
BACKWARD_EVENTS = frozenset({"_SparseAttentionBackward", "sparsecp::sparse_attention_backward"})

CONFIGS: dict[str, dict[str, Any]] = {
    "example": {"heads": 4, "head_dim": 64, "window": 64, "topk": 128, "tokens": 16384, "pack": "lognormal"},
    "v4flash": {"heads": 64, "head_dim": 512, "window": 128, "topk": 512, "tokens": 512, "pack": "one"},
}


def model_config(config: dict[str, Any]) -> Any:
    """train_deepseek_v4.py's model (its defaults), with ``config``'s attention shape."""
    from transformers import DeepseekV4Config

    return DeepseekV4Config(
        vocab_size=512, hidden_size=128, moe_intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=config["heads"], num_key_value_heads=1, head_dim=config["head_dim"], q_lora_rank=64,
        num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 32},
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"], sliding_window=config["window"], o_groups=2,
        o_lora_rank=64, index_n_heads=32, index_head_dim=64, index_topk=config["topk"], hc_mult=2,
        hc_sinkhorn_iters=5, max_position_embeddings=1 << 20, attn_implementation="eager",
        experts_implementation="eager")


def build_model(config: dict[str, Any], seed: int) -> Any:
    """A random model as the example makes it (sinks, position biases and the hash table drawn)."""
    import torch
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(model_config(config))
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed)
        for name, parameter in model.named_parameters():
            if name.endswith(("sinks", "position_bias")):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
        for name, buffer in model.named_buffers():
            if name.endswith("tid2eid"):
                buffer.copy_(torch.randint(0, model.config.n_routed_experts, buffer.shape, generator=generator))
    return model


def make_batch(config: dict[str, Any], tokens: int, seed: int) -> tuple[tuple[int, ...], Any]:
    import torch

    import sparsecp

    if config["pack"] == "one":
        lengths: tuple[int, ...] = (tokens,)
    else:
        lengths = tuple(int(n) for n in sparsecp.generate_batch("lognormal", tokens, PACK_RANKS, seed))
    return lengths, torch.randint(0, 512, (1, sum(lengths)), generator=torch.Generator().manual_seed(seed))


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by microsecond intervals (nested or overlapping ones counted once)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total * 1e-6


def attention_seconds(events: Any) -> dict[str, float]:
    """The attention's forward and backward seconds and its calls, from a profile's events."""
    forward = [(e.time_range.start, e.time_range.end) for e in events if e.name in FORWARD_EVENTS]
    backward = [(e.time_range.start, e.time_range.end) for e in events if e.name in BACKWARD_EVENTS]
    calls = sum(1 for e in events if e.name in ("_SparseAttention", "sparsecp::sparse_attention"))
    return {"forward": union_seconds(forward), "backward": union_seconds(backward), "calls": calls}


def top_ops(profile: Any, count: int) -> list[tuple[str, float, int]]:
    """The ``count`` profiler events with the most self CPU time: (name, seconds, calls)."""
    averages = sorted(profile.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)
    return [(a.key, a.self_cpu_time_total * 1e-6, a.count) for a in averages[:count]]


def run_step(model: Any, batch: dict[str, Any], profiled: bool, top: int = 0) -> dict[str, Any]:
    """One forward + backward; its wall seconds, loss and (profiled) the attention's seconds and
    the ``top`` ops by self CPU time."""
    import torch

    from sparsecp.models import deepseek_v4 as cp_v4

    def step() -> float:
        out = model(input_ids=batch["ids"], position_ids=batch["positions"], document_lengths=batch["lengths"])
        loss = cp_v4.causal_lm_loss(out.logits, batch["labels"], batch["lengths"])
        kl = cp_v4.indexer_kl_loss(model)
        (loss + kl if kl is not None else loss).backward()
        return float(loss.detach())

    model.zero_grad(set_to_none=True)
    if not profiled:
        start = time.perf_counter()
        loss = step()
        return {"seconds": time.perf_counter() - start, "loss": loss}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        start = time.perf_counter()
        loss = step()
        seconds = time.perf_counter() - start
    attention = attention_seconds(profile.events())
    if attention["calls"] == 0:
        raise RuntimeError("no sparse attention call was seen in the profile: the event names this benchmark "
                           f"looks for ({sorted(FORWARD_EVENTS)}) are not what sparse_attention records any more")
    return {"seconds": seconds, "loss": loss, **attention, "top": top_ops(profile, top) if top else []}


def run_config(name: str, tokens: int, steps: int, seed: int, top: int = 0) -> dict[str, Any]:
    from sparsecp.models import deepseek_v4 as cp_v4

    config = CONFIGS[name]
    base = build_model(config, seed)
    models = {}
    for backend in BACKENDS:
        model = copy.deepcopy(base)
        cp_v4.context_parallel(model, None, mode="none", indexer_kl_coeff=KL_COEFF, attention_backend=backend)
        model.train()
        models[backend] = model
    del base
    lengths, input_ids = make_batch(config, tokens, seed)
    ids, positions = cp_v4.shard_batch(input_ids, lengths)
    batch = {"ids": ids, "positions": positions, "labels": cp_v4.shard_labels(input_ids, lengths),
             "lengths": lengths}
    for backend in BACKENDS:  # warm-up: first-call costs (lazy initialisation, allocator growth)
        run_step(models[backend], batch, profiled=False)
    rounds: dict[str, list[dict[str, Any]]] = {backend: [] for backend in BACKENDS}
    for _ in range(steps):
        for backend in BACKENDS:
            plain = run_step(models[backend], batch, profiled=False)
            profiled = run_step(models[backend], batch, profiled=True, top=top)
            rounds[backend].append({**profiled, "plain_seconds": plain["seconds"]})
    result: dict[str, Any] = {"config": name, "tokens": tokens, "documents": len(lengths), "longest": max(lengths),
                              **{k: config[k] for k in ("heads", "head_dim", "window", "topk", "pack")},
                              "backends": {}}
    for backend, runs in rounds.items():
        def med(key: str, values: list[dict[str, Any]] = runs) -> float:
            return statistics.median(r[key] for r in values)

        result["backends"][backend] = {
            "plain_seconds": med("plain_seconds"), "profiled_seconds": med("seconds"),
            "attention_forward_seconds": med("forward"), "attention_backward_seconds": med("backward"),
            "attention_share": statistics.median((r["forward"] + r["backward"]) / r["seconds"] for r in runs),
            "calls": runs[0]["calls"], "loss": runs[0]["loss"], "top": runs[-1]["top"], "runs": runs}
    torch_side, cpu_side = result["backends"]["torch"], result["backends"]["cpu"]
    result["step_speedup"] = torch_side["plain_seconds"] / cpu_side["plain_seconds"]
    result["loss_relative_difference"] = abs(torch_side["loss"] - cpu_side["loss"]) / max(abs(torch_side["loss"]),
                                                                                          1e-30)
    return result


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in info)}
    except OSError:
        return platform.processor() or "unknown CPU"
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def print_result(result: dict[str, Any]) -> None:
    print(f"{result['config']}: {result['tokens']} tokens ({result['documents']} documents, longest "
          f"{result['longest']}), {result['heads']} heads of {result['head_dim']}, window {result['window']}, "
          f"top-k {result['topk']}")
    print("  backend  step s (plain)  step s (profiled)  attention fwd s  bwd s  share  calls  loss")
    for backend, r in result["backends"].items():
        print(f"  {backend:<7}  {r['plain_seconds']:14.2f}  {r['profiled_seconds']:17.2f}  "
              f"{r['attention_forward_seconds']:15.2f}  {r['attention_backward_seconds']:5.2f}  "
              f"{100 * r['attention_share']:4.0f}%  {r['calls']:5d}  {r['loss']:.6f}")
    print(f"  step speedup (plain, torch / cpu): {result['step_speedup']:.2f}x; losses differ by "
          f"{result['loss_relative_difference']:.1e} (relative)", flush=True)
    for backend, r in result["backends"].items():
        if not r["top"]:
            continue
        print(f"  {backend}: the last round's profiled step, ops by self CPU time (s, calls, share of the step):")
        for op, seconds, calls in r["top"]:
            print(f"    {seconds:7.3f}  {calls:6d}  {100 * seconds / r['runs'][-1]['seconds']:4.1f}%  {op}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="example,v4flash",
                        help="comma-separated: 'example' (the example's defaults), 'v4flash' (V4-Flash's per-row "
                             "attention shape) (default both)")
    parser.add_argument("--tokens", type=int,
                        help="tokens a step for every configuration (default: example 16384, v4flash 512)")
    parser.add_argument("--steps", type=int, default=3,
                        help="timed rounds; each runs every backend once plain and once profiled (default 3)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads, which the C++ kernel uses too (default 1: the example's per-rank "
                             "setting)")
    parser.add_argument("--seed", type=int, default=1, help="model and batch seed (default 1)")
    parser.add_argument("--top", type=int, default=0,
                        help="also print, per backend, the N ops with the most self CPU time in the last round's "
                             "profiled step (torch.profiler's key averages; default 0: none)")
    parser.add_argument("--json", help="also write the results (every round too) as JSON to this file")
    args = parser.parse_args(argv)
    names = [n for n in args.configs.split(",") if n]
    if not names or set(names) - set(CONFIGS):
        parser.error(f"--configs takes {', '.join(CONFIGS)}, got {args.configs!r}")
    if args.tokens is not None and args.tokens < 1:
        parser.error(f"--tokens must be positive, got {args.tokens}")
    if args.steps < 1 or args.threads < 1:
        parser.error("--steps and --threads must be positive")
    if args.top < 0:
        parser.error(f"--top must be 0 or more, got {args.top}")

    import torch
    import torch.distributed as dist

    import sparsecp
    from sparsecp.torch.attention import sparse_attention_gemm

    torch.set_num_threads(args.threads)
    header = {"cpu": cpu_model(), "isa": sparsecp.kernel_isa(), "gemm_float32": sparse_attention_gemm(torch.float32),
              "threads": args.threads, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
              "load": os.getloadavg(), "command": " ".join(["attention_share.py", *(argv or sys.argv[1:])])}
    print(f"# {header['cpu']}, kernels {header['isa']}, float32 products {header['gemm_float32']}, "
          f"{args.threads} thread(s), torch {header['torch']}, {header['date']}, load "
          f"{' '.join(f'{x:.2f}' for x in header['load'])}", flush=True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    results = []
    try:
        for name in names:
            tokens = args.tokens if args.tokens is not None else CONFIGS[name]["tokens"]
            result = run_config(name, tokens, args.steps, args.seed, args.top)
            results.append(result)
            print_result(result)
    finally:
        dist.destroy_process_group()
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"header": header, "results": results}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
