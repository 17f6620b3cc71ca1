#!/usr/bin/env python3
"""A DeepSeek-V4 training step at V4-Flash's per-token proportions under CP: where the indexer
matters, what balancing it gains, against the bound a perfect balancer could reach.

The model is transformers' ``DeepseekV4ForCausalLM`` with V4-Flash's configuration
(``DeepseekV4Config()``'s defaults: hidden 4,096, 64 heads of 512, q/o LoRA 1,024 in 8 output
groups, an indexer of 64 heads of 128 with top-k 512, window 128, CSA ratio 4, HCA ratio 128,
6 + 1 experts of width 2,048, 4 hyper-connection streams), scaled by ``--scale F``: the hidden
size and every head count (attention heads, index heads) divided by F; head dims, LoRA ranks,
expert widths, top-k, window and ratios kept. Every per-token term of a layer is then 1/F of
V4-Flash's, so their proportions hold; the startup table lists them (multiply-adds per token,
forward, from the config) and says where they do not (the output groups: at most one per head).
Two more choices keep the per-token mix while fitting a CPU: ``--experts`` routed experts (a
token's work does not depend on how many there are, the parameters do) and a vocabulary scaled
with the layer count (``--layers`` layers of V4-Flash's 43 get that share of its 129,280-word
LM head, so the head stays the share of a token's work it is in V4-Flash). ``--layers`` takes
the real mix (``flash``: 43 layers as V4-Flash orders them) or a list (``csa,hca``).

Each step is a training step as a user runs it: ``context_parallel(model, group, mode=...)``,
``model.activation_checkpointing_enable()`` (non-reentrant activation recompute), forward on
``shard_batch``'s rows, ``causal_lm_loss`` + ``indexer_kl_loss`` (KL coefficient 0.01),
backward, ``all_reduce_gradients``, AdamW. Every strategy of ``--modes`` trains its own copy of
the same model on the same batches, interleaved step by step (a slow spell of the machine hits
every strategy alike); ``--ranks`` gloo ranks on loopback (spawned processes, one torch thread
each, ``OMP_NUM_THREADS=1``). Batches: ``--tokens`` tokens, ``--pack`` ``one`` (one document),
``longtail`` (lengths log-uniform between tokens/256 and the whole batch, drawn with the step's
seed and packed in order until the batch is full: a few documents as long as most of the batch,
many short ones) or ``lognormal`` (``sparsecp.generate_batch("lognormal", tokens, ranks, seed)``).

Per strategy it reports, from each rank's main thread (``time.thread_time``: a rank's own CPU
seconds; with ranks sharing cores a rank's wall time also counts its peers' turns):

* ``step CPU``: the slowest rank's step in CPU seconds (and its wall time beside it);
* the breakdown of that CPU time: ``attention`` (the attention modules' forward, recompute and
  backward, less what follows), ``scoring`` (the worker selector: the indexer's scoring and top-k,
  ``context_parallel_state(model).clock``), ``indexer`` (the indexer's own modules on the owner:
  its compressor, merge weights, rotary), ``MoE`` (the MoE blocks' forward, recompute and
  backward), ``rest`` (everything else: embeddings, norms, hyper-connections, LM head, loss,
  gradient all-reduce, AdamW). Module times come from forward hooks (pre / post) and, for
  backward, from identity autograd marks on each module's output (backward enters the module) and
  input (backward leaves it); time goes to the innermost open module, so nested parts are not
  counted twice. Beside it, ``exchange``: the wall seconds of the selection path outside the
  selector and the indexer's modules (moving rows to workers and ids back, the Index K bank
  gather, waiting for the slowest worker, and time off the core on a loaded machine), from
  ``stats.indexer_seconds``;
* the indexer's share: (scoring + indexer) / step CPU, the slowest rank's;
* none's selection imbalance ``I``: the max over ranks of the selector seconds over their mean;
* the bound ``(R + I * m) / (R + m)``: what a perfect balancer of the baseline's (the first mode's)
  selection could gain in the step, with ``m`` the mean of the ranks' selector CPU seconds and
  ``R`` the rest of the step, the mean over ranks of step CPU less selector seconds (the
  definition ``python/examples/train_deepseek_v4.py`` prints);
* the gain over the baseline: per step, the baseline's slowest-rank step CPU over the
  strategy's, the median over steps and its 95% interval (a sign-test interval of the median,
  as ``sparsecp run`` computes it: with 5 steps the range); "within noise" when it holds 1;
* ``selection_bytes_per_rank``: the bytes each rank sent in the selection exchanges (max over
  ranks, median over steps), ``sparsecp.torch.exchange_stats()``.

``--project``: a cost model per rank, ``t = a * dense + b * keys + c * scoring + d * rows + e``
(multiply-adds of the training step's dense parts, of attention's key columns, and of the
selection the rank scores, and the rows it selects, all counted from the config and the plan),
fitted per component to the baseline's ranks (``c``, ``d`` to the selector's CPU seconds; ``a``,
``b`` and the constant ``e`` to the rest of each rank's step CPU seconds), printed first against
every strategy's measured slowest-rank step (predicted vs measured), and used to say where the
bound would reach 1.05 on this machine at longer batches.
Then the same terms at V4-Flash's full size (43 layers) on a GPU whose rates are flags
(``--bf16-tflops`` for dense and attention, ``--fp8-tflops`` for the indexer's scoring, both times
``--efficiency``; ``--link-gbps`` for the selection exchange), at ``--project-tokens`` tokens over
CP 8/16/32/64, for the document mixes ``one``, ``longtail`` and ``lognormal``: the bound and spill's
gain (none's slowest rank over spill's, spill paying its exchange at the link's rate).

Usage::

    python python/benchmarks/step_at_length.py --scale 64 --layers csa,hca --tokens 65536 --pack one
    python python/benchmarks/step_at_length.py --scale 64 --layers csa,hca --tokens 131072,262144 \\
        --pack one,longtail --steps 5 --json out.json --svg out.svg --project
    python python/benchmarks/step_at_length.py --from out.json --svg out.svg --project  # saved runs
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import queue
import socket
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any

KL_COEFF = 0.01
FLASH_LAYERS = 43
FLASH_VOCAB = 129280
CSA, HCA, SLIDING = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
LAYER_NAMES = {"csa": CSA, "hca": HCA, "sliding": SLIDING}
MODE_OPTIONS: dict[str, dict[str, Any]] = {"greedy": {"block_size": 256},
                                           "hybrid": {"block_size": 256, "zigzag_min_length": 1024}}
COMPONENTS = ("attention", "scoring", "indexer", "moe", "rest")


# ---------------------------------------------------------------- configuration and costs


def flash_config() -> Any:
    """V4-Flash: transformers' DeepseekV4Config defaults."""
    from transformers import DeepseekV4Config

    return DeepseekV4Config()


def layer_types(spec: str) -> list[str]:
    if spec == "flash":
        return list(flash_config().layer_types)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n not in LAYER_NAMES]
    if bad or not names:
        raise ValueError(f"--layers takes 'flash' or a list of csa, hca, sliding; got {spec!r}")
    return [LAYER_NAMES[n] for n in names]


def scaled_config(scale: int, layers: str, experts: int, tokens: int) -> Any:
    """V4-Flash with the hidden size and every head count divided by ``scale`` (see the module
    docstring); float32, eager attention (the CP layers bring their own)."""
    from transformers import DeepseekV4Config

    flash = flash_config()
    heads, index_heads, hidden = (flash.num_attention_heads // scale, flash.index_n_heads // scale,
                                  flash.hidden_size // scale)
    if scale < 1 or heads * scale != flash.num_attention_heads or index_heads * scale != flash.index_n_heads \
            or hidden * scale != flash.hidden_size or heads < 1:
        raise ValueError(f"--scale must divide {flash.num_attention_heads} (the head counts) and "
                         f"{flash.hidden_size}, got {scale}")
    types = layer_types(layers)
    mlp = list(flash.mlp_layer_types) if layers == "flash" else ["moe"] * len(types)
    if experts < flash.num_experts_per_tok:
        raise ValueError(f"--experts must be at least the {flash.num_experts_per_tok} active experts, got {experts}")
    vocab = max(512, round(FLASH_VOCAB * len(types) / FLASH_LAYERS))
    return DeepseekV4Config(
        vocab_size=vocab, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=1,
        head_dim=flash.head_dim, q_lora_rank=flash.q_lora_rank, o_lora_rank=flash.o_lora_rank,
        o_groups=math.gcd(flash.o_groups, heads), index_n_heads=index_heads, index_head_dim=flash.index_head_dim,
        index_topk=flash.index_topk, sliding_window=flash.sliding_window, compress_rates=dict(flash.compress_rates),
        moe_intermediate_size=flash.moe_intermediate_size, num_experts_per_tok=flash.num_experts_per_tok,
        n_routed_experts=experts, n_shared_experts=flash.n_shared_experts, hc_mult=flash.hc_mult,
        hc_sinkhorn_iters=flash.hc_sinkhorn_iters, num_hidden_layers=len(types), layer_types=types,
        mlp_layer_types=mlp, max_position_embeddings=max(flash.max_position_embeddings, tokens),
        attn_implementation="eager", experts_implementation="eager")  # type: ignore[call-arg]


def token_macs(config: Any, layer_type: str, p: int) -> dict[str, float]:
    """Forward multiply-adds of one token at document position ``p`` in one layer of
    ``layer_type``, per term (from the config). ``indexer scoring`` is the CSA selector's
    ``heads * head_dim`` per visible compressed key; attention's ``keys`` term counts QK and PV
    over the keys the row attends (window + top-k for CSA, window + its document's compressed
    prefix for HCA)."""
    h, heads, d = config.hidden_size, config.num_attention_heads, config.head_dim
    q, o, g = config.q_lora_rank, config.o_lora_rank, config.o_groups
    window = config.sliding_window
    hc = config.hc_mult
    terms = {
        "q_a + q_b": h * q + q * heads * d,
        "kv": h * d,
        "o_a (grouped)": heads * d * o,
        "o_b": g * o * h,
        "hyper-connections": 2 * (2 + hc) * hc * hc * h,
        "MoE experts": (config.num_experts_per_tok + config.n_shared_experts) * 3 * h * config.moe_intermediate_size,
        "MoE router": h * config.n_routed_experts,
    }
    keys = min(p + 1, window)
    if layer_type == CSA:
        ratio = config.compress_rates[CSA]
        visible = (p + 1) // ratio
        keys += min(config.index_topk, visible)
        ih, idim = config.index_n_heads, config.index_head_dim
        terms["compressor"] = 2 * h * 2 * d
        terms["indexer compressor"] = 2 * h * 2 * idim
        terms["indexer q_b + weights"] = q * ih * idim + h * ih
        terms["indexer scoring"] = ih * idim * visible
    elif layer_type == HCA:
        ratio = config.compress_rates[HCA]
        keys += (p + 1) // ratio
        terms["compressor"] = 2 * h * d
    terms["attention keys"] = 2 * heads * d * keys
    return terms


def cost_table(config: Any, scale: int, positions: list[int]) -> str:
    """Per-token multiply-adds of V4-Flash and of the scaled model times ``scale``, per term."""
    flash = flash_config()
    lines = [f"per-token forward multiply-adds (M) at document position p: V4-Flash, the scaled model x {scale}, ratio",
             f"{'layer':5s} {'term':24s} " + " ".join(f"{'p=' + str(p):>26s}" for p in positions)]
    for layer_type, short in ((CSA, "CSA"), (HCA, "HCA")):
        big = [token_macs(flash, layer_type, p) for p in positions]
        small = [token_macs(config, layer_type, p) for p in positions]
        for term in big[0]:
            cells = []
            for b, s in zip(big, small):
                cells.append(f"{b[term] / 1e6:9.2f} {s[term] * scale / 1e6:9.2f} {s[term] * scale / b[term]:5.2f}"
                             if b[term] else f"{'-':>26s}")
            lines.append(f"{short:5s} {term:24s} " + " ".join(cells))
        cells = []
        for b, s in zip(big, small):
            tb, ts = sum(b.values()), sum(s.values())
            cells.append(f"{tb / 1e6:9.2f} {ts * scale / 1e6:9.2f} {ts * scale / tb:5.2f}")
        lines.append(f"{short:5s} {'total':24s} " + " ".join(cells))
    head = flash.hidden_size * FLASH_VOCAB / FLASH_LAYERS
    mine = config.hidden_size * config.vocab_size / config.num_hidden_layers
    lines.append(f"{'all':5s} {'LM head per layer':24s} {head / 1e6:9.2f} {mine * scale / 1e6:9.2f} "
                 f"{mine * scale / head:5.2f}   (vocabulary {config.vocab_size}, {config.num_hidden_layers} layers)")
    return "\n".join(lines)


# ---------------------------------------------------------------- batches


def lengths_of(pack: str, tokens: int, ranks: int, seed: int) -> tuple[int, ...]:
    """The packed documents of a ``--pack`` batch (see the module docstring)."""
    import sparsecp

    if pack == "one":
        return (tokens,)
    if pack == "lognormal":
        return tuple(int(n) for n in sparsecp.generate_batch("lognormal", tokens, ranks, seed))
    if pack == "longtail":
        import random

        draw = random.Random(seed)
        low = max(1, tokens // 256)
        lengths: list[int] = []
        left = tokens
        while left > 0:
            n = int(math.exp(draw.uniform(math.log(low), math.log(tokens))))
            lengths.append(min(left, max(1, n)))
            left -= lengths[-1]
        return tuple(lengths)
    raise ValueError(f"--pack takes one, longtail, lognormal; got {pack!r}")


# ---------------------------------------------------------------- per-rank timing


class ComponentClock:
    """CPU seconds of this thread per component: time goes to the innermost open component
    (``enter`` / ``leave`` nest; ``rest`` when none is open)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.stack = ["rest"]
        self.mark = time.thread_time()

    def _account(self) -> None:
        now = time.thread_time()
        self.seconds[self.stack[-1]] = self.seconds.get(self.stack[-1], 0.0) + now - self.mark
        self.mark = now

    def enter(self, label: str) -> None:
        self._account()
        self.stack.append(label)

    def leave(self, label: str) -> None:
        self._account()
        if label in self.stack[1:]:
            while self.stack.pop() != label:
                pass

    def reset(self) -> None:
        self.seconds, self.stack, self.mark = {}, ["rest"], time.thread_time()


def install_hooks(model: Any, clock: ComponentClock) -> None:
    """Forward hooks on the attention and MoE modules (and the owner-side indexer modules), with
    identity autograd marks so that their backward is timed too (see the module docstring)."""
    import torch

    class Mark(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, tensor: torch.Tensor, label: str, entering: bool) -> torch.Tensor:
            ctx.label, ctx.entering = label, entering
            return tensor.view_as(tensor)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
            (clock.enter if ctx.entering else clock.leave)(ctx.label)
            return grad, None, None

    def pre(label: str, backward: bool) -> Any:
        def hook(module: Any, args: tuple) -> Any:
            clock.enter(label)
            if backward and args and isinstance(args[0], torch.Tensor) and args[0].requires_grad \
                    and torch.is_grad_enabled():
                module._step_at_length_marked = True
                return (Mark.apply(args[0], label, False), *args[1:])
            module._step_at_length_marked = False
            return None
        return hook

    def post(label: str) -> Any:
        def hook(module: Any, args: tuple, output: Any) -> Any:
            clock.leave(label)
            if not getattr(module, "_step_at_length_marked", False):
                return None
            if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
                return (Mark.apply(output[0], label, True), *output[1:])
            if isinstance(output, torch.Tensor):
                return Mark.apply(output, label, True)
            return None
        return hook

    for layer in model.model.layers:
        for module, label, backward in ((layer.self_attn, "attention", True), (layer.mlp, "moe", True)):
            module.register_forward_pre_hook(pre(label, backward))
            module.register_forward_hook(post(label))
        compressor = getattr(layer.self_attn, "compressor", None)
        indexer = getattr(compressor, "indexer", None)
        if indexer is not None:  # the owner's indexer modules (q_b_proj runs in the worker's selector)
            for module in (indexer.kv_proj, indexer.gate_proj, indexer.scorer.weights_proj, indexer.rotary_emb):
                module.register_forward_pre_hook(pre("indexer", False))
                module.register_forward_hook(post("indexer"))


def build_model(config: Any, seed: int) -> Any:
    import torch
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(config)
    with torch.no_grad():  # the model initialises sinks, position biases and the hash table to 0
        generator = torch.Generator().manual_seed(seed)
        for name, parameter in model.named_parameters():
            if name.endswith(("sinks", "position_bias")):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return model


def run_rank(rank: int, size: int, port: int, job: dict[str, Any], results: Any) -> None:
    try:
        _run_rank(rank, size, port, job, results)
    except BaseException:  # the parent reports it
        results.put({"rank": rank, "error": traceback.format_exc()})


def _run_rank(rank: int, size: int, port: int, job: dict[str, Any], results: Any) -> None:
    import copy

    import torch
    import torch.distributed as dist

    import sparsecp.torch as sparsecp_torch
    from sparsecp.models import deepseek_v4 as cp_v4

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=3600))
    try:
        config = scaled_config(job["scale"], job["layers"], job["experts"], job["tokens"])
        base = build_model(config, job["seed"]).to(getattr(torch, job.get("dtype", "float32")))
        clock = ComponentClock()
        models, optimizers = {}, {}
        for mode in job["modes"]:
            model = copy.deepcopy(base)
            cp_v4.context_parallel(model, dist.group.WORLD, mode, selector=job["selector"],
                                   indexer_kl_coeff=KL_COEFF, **MODE_OPTIONS.get(mode, {}))
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            model.train()
            install_hooks(model, clock)
            models[mode], optimizers[mode] = model, torch.optim.AdamW(model.parameters(), lr=1e-4)
        del base
        for step in range(job["warmup"] + job["steps"]):
            lengths = lengths_of(job["pack"], job["tokens"], size, job["seed"] + step)
            input_ids = torch.randint(0, config.vocab_size, (1, job["tokens"]),
                                      generator=torch.Generator().manual_seed(job["seed"] + step))
            ids, positions = cp_v4.shard_batch(input_ids, lengths)
            labels = cp_v4.shard_labels(input_ids, lengths)
            for mode in job["modes"]:
                model, optimizer = models[mode], optimizers[mode]
                state = cp_v4.context_parallel_state(model)
                assert state is not None
                state.stats.reset()
                state.clock.calls, state.clock.seconds = 0, 0.0
                sparsecp_torch.reset_exchange_stats()
                dist.barrier()
                clock.reset()
                wall, cpu = time.perf_counter(), time.thread_time()
                optimizer.zero_grad(set_to_none=True)
                logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
                loss = cp_v4.causal_lm_loss(logits, labels, lengths)
                kl = cp_v4.indexer_kl_loss(model)
                (loss + kl if kl is not None else loss).backward()
                cp_v4.all_reduce_gradients(model)
                optimizer.step()
                cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
                clock.leave("rest")
                parts = dict(clock.seconds)
                selector = state.clock.seconds
                owner = parts.get("indexer", 0.0)
                record = {
                    "rank": rank, "step": step, "mode": mode, "warmup": step < job["warmup"],
                    "cpu_seconds": cpu, "wall_seconds": wall, "selector_seconds": selector,
                    "breakdown": {"attention": parts.get("attention", 0.0) - selector, "scoring": selector,
                                  "indexer": owner, "moe": parts.get("moe", 0.0), "rest": parts.get("rest", 0.0)},
                    "exchange_wall_seconds": max(0.0, state.stats.indexer_seconds - selector - owner),
                    "selection_bytes": sparsecp_torch.exchange_stats()["bytes_sent"],
                    "dispatch_bytes": state.stats.dispatch_bytes, "loss": float(loss.detach()),
                    "documents": len(lengths), "longest": max(lengths)}
                results.put(record)
                del logits, loss, kl
        results.put({"rank": rank, "done": True})
    finally:
        dist.destroy_process_group()


def run_job(job: dict[str, Any], ranks: int, report: Any, started: Any = None) -> list[dict[str, Any]]:
    """Spawns the ranks, calls ``started()`` while they start (the parent's own imports overlap
    theirs), hands every completed (step, mode) to ``report``, returns every record."""
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=run_rank, args=(r, ranks, port, job, results)) for r in range(ranks)]
    for process in processes:
        process.start()
    if started is not None:
        started()
    records: list[dict[str, Any]] = []
    pending: dict[tuple[int, str], list[dict[str, Any]]] = {}
    done = 0
    try:
        while done < ranks:
            try:
                record = results.get(timeout=5)
            except queue.Empty:  # a rank killed from outside (out of memory: SIGKILL) sends nothing
                dead = [(r, p.exitcode) for r, p in enumerate(processes) if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"rank {dead[0][0]} died with exit code {dead[0][1]} ({job}); -9 is "
                                       "SIGKILL, usually the kernel's out-of-memory killer") from None
                continue
            if "error" in record:
                raise RuntimeError(f"rank {record['rank']} failed:\n{record['error']}")
            if record.get("done"):
                done += 1
                continue
            records.append(record)
            key = (record["step"], record["mode"])
            pending.setdefault(key, []).append(record)
            if len(pending[key]) == ranks:
                report(sorted(pending.pop(key), key=lambda r: r["rank"]))
    finally:
        for process in processes:
            if process.is_alive() and done < ranks:
                process.kill()
            process.join()
    return records


# ---------------------------------------------------------------- statistics


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """The median and its 95% sign-test interval (``sparsecp run``'s ``median_interval``):
    ``[x_(k), x_(n-k+1)]`` for the largest k whose coverage is at least 95% (k >= 1)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return (float("nan"),) * 3
    k, tail = 1, 0.5 ** n
    while k < n // 2:
        tail += math.comb(n, k) * 0.5 ** n
        if 2 * tail > 0.05:
            break
        k += 1
    return statistics.median(xs), xs[k - 1], xs[n - k]


def summarize(records: list[dict[str, Any]], modes: list[str]) -> dict[str, Any]:
    """Per strategy, over the timed steps: the figures of the module docstring."""
    timed = [r for r in records if not r["warmup"]]
    by: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in timed:
        by.setdefault((r["mode"], r["step"]), []).append(r)
    steps = sorted({r["step"] for r in timed})
    baseline = modes[0]
    out: dict[str, Any] = {}
    for mode in modes:
        slowest_cpu, walls, shares, gains, bounds, imbalances, sel_bytes, exchange = [], [], [], [], [], [], [], []
        breakdown: dict[str, list[float]] = {c: [] for c in COMPONENTS}
        per_rank_cpu: list[list[float]] = []
        per_rank_selector: list[list[float]] = []
        for step in steps:
            ranks = sorted(by[(mode, step)], key=lambda r: r["rank"])
            base = by[(baseline, step)]
            slow = max(ranks, key=lambda r: r["cpu_seconds"])
            slowest_cpu.append(slow["cpu_seconds"])
            walls.append(max(r["wall_seconds"] for r in ranks))
            shares.append((slow["breakdown"]["scoring"] + slow["breakdown"]["indexer"]) / slow["cpu_seconds"])
            for c in COMPONENTS:
                breakdown[c].append(slow["breakdown"][c])
            exchange.append(max(r["exchange_wall_seconds"] for r in ranks))
            gains.append(max(r["cpu_seconds"] for r in base) / slow["cpu_seconds"])
            m = statistics.mean(r["selector_seconds"] for r in base)
            imbalance = max(r["selector_seconds"] for r in base) / max(m, 1e-12)
            rest = statistics.mean(r["cpu_seconds"] - r["selector_seconds"] for r in base)
            bounds.append((rest + imbalance * m) / (rest + m))
            own_m = statistics.mean(r["selector_seconds"] for r in ranks)
            imbalances.append(max(r["selector_seconds"] for r in ranks) / max(own_m, 1e-12))
            sel_bytes.append(max(r["selection_bytes"] for r in ranks))
            per_rank_cpu.append([r["cpu_seconds"] for r in ranks])
            per_rank_selector.append([r["selector_seconds"] for r in ranks])
        gain, low, high = median_interval(gains)
        out[mode] = {
            "step_seconds": slowest_cpu, "step_seconds_median": statistics.median(slowest_cpu),
            "wall_seconds": walls, "wall_seconds_median": statistics.median(walls),
            "gain": gain, "gain_interval": [low, high], "within_noise": low <= 1.0 <= high,
            "gain_per_step": gains, "bound": statistics.median(bounds), "bound_per_step": bounds,
            "indexer_share": statistics.median(shares), "selection_imbalance": statistics.median(imbalances),
            "selection_bytes_per_rank": statistics.median(sel_bytes),
            "breakdown_seconds": {c: statistics.median(v) for c, v in breakdown.items()},
            "exchange_wall_seconds": statistics.median(exchange),
            "per_rank_step_seconds": per_rank_cpu, "per_rank_selector_seconds": per_rank_selector,
            "losses": [sum(r["loss"] for r in by[(mode, s)]) for s in steps],  # the ranks' shares summed
            "lengths_steps": steps}
    return out


def gain_text(row: dict[str, Any]) -> str:
    low, high = row["gain_interval"]
    return f"{row['gain']:.3f} ({low:.3f}-{high:.3f})" + (" ~ within noise" if row["within_noise"] else "")


def print_summary(result: dict[str, Any]) -> None:
    modes = result["modes"]
    base = next(iter(modes))
    print(f"\n{result['tokens']} tokens, pack {result['pack']}, {result['ranks']} ranks, {result['steps']} timed "
          f"steps: medians per strategy; step = the slowest rank's step in CPU seconds, its breakdown in CPU seconds; "
          f"exchange: wall seconds; bound (R + I*m) / (R + m) of a perfect balancer of {base}'s selection "
          f"(I = {modes[base]['selection_imbalance']:.3f})")
    print(f"{'mode':8s} {'step CPU':>9s} {'wall':>7s} {'attention':>10s} {'scoring':>8s} {'indexer':>8s} {'MoE':>7s} "
          f"{'rest':>7s} {'exchange':>9s} {'share':>6s} {'sel. imb.':>9s} {'sel. MB/rank':>12s} {'bound':>6s}  "
          f"gain over {base} (95% interval)")
    for mode, row in modes.items():
        b = row["breakdown_seconds"]
        print(f"{mode:8s} {row['step_seconds_median']:9.2f} {row['wall_seconds_median']:7.2f} {b['attention']:10.2f} "
              f"{b['scoring']:8.2f} {b['indexer']:8.2f} {b['moe']:7.2f} {b['rest']:7.2f} "
              f"{row['exchange_wall_seconds']:9.2f} {100 * row['indexer_share']:5.1f}% "
              f"{row['selection_imbalance']:9.3f} {row['selection_bytes_per_rank'] / 1e6:12.3f} {row['bound']:6.3f}  "
              + ("-" if mode == base else gain_text(row)))
    losses = [row["losses"] for row in modes.values()]
    spread = max(abs(a - b) for run in losses for a, b in zip(run, losses[0])) if len(losses) > 1 else 0.0
    print(f"losses per step agree across strategies to {spread:.2e}")


# ---------------------------------------------------------------- projection


def rank_terms(config: Any, lengths: tuple[int, ...], cp: int, mode: str, layers: list[str]) -> list[dict[str, float]]:
    """Per rank, the multiply-adds of one training step (forward, recompute, backward): ``dense``
    (every term but attention's keys and the indexer's scoring, x4: forward, recompute, backward
    twice; the LM head x3), ``keys`` (attention's key columns, x4) and ``scoring`` (the selection
    this rank runs under ``mode``: the plan's causal pairs x index heads x head dim, once; no
    backward), summed over ``layers``."""
    import numpy as np

    import sparsecp

    tokens = sum(lengths)
    local = tokens // cp
    position = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
    out = []
    csa_layers = sum(t == CSA for t in layers)
    scoring_per_pair = config.index_n_heads * config.index_head_dim
    work: list[float] | None = None
    rows: list[float] = []
    if csa_layers:
        ratio = config.compress_rates[CSA]
        plan = sparsecp.plan(list(lengths), cp, ratio, mode, **MODE_OPTIONS.get(mode, {}))
        work = [float(w) for w in plan.work]
        rows = [float(r) for r in plan.rows]
    dense_token = 0.0
    for t in layers:
        terms = token_macs(config, t, 0)
        dense_token += sum(v for k, v in terms.items() if k not in ("attention keys", "indexer scoring"))
    head = config.hidden_size * config.vocab_size
    for rank in range(cp):
        p = position[rank * local:(rank + 1) * local]
        keys = 0.0
        for t in layers:
            k = np.minimum(p + 1, config.sliding_window).astype(np.float64)
            if t == CSA:
                k += np.minimum(config.index_topk, (p + 1) // config.compress_rates[CSA])
            elif t == HCA:
                k += (p + 1) // config.compress_rates[HCA]
            keys += float(k.sum()) * 2 * config.num_attention_heads * config.head_dim
        scoring = 0.0 if work is None else work[rank] * scoring_per_pair * csa_layers
        selected = 0.0 if work is None else rows[rank] * csa_layers
        out.append({"dense": 4 * dense_token * local + 3 * head * local, "keys": 4 * keys, "scoring": scoring,
                    "rows": selected, "step": 1.0})
    return out


def fit_costs(samples: list[tuple[dict[str, float], float, float]]) -> dict[str, float]:
    """Per-component rates from the baseline's ranks, each sample (terms, step CPU seconds,
    selector CPU seconds): ``c``, ``d`` = the selector's seconds per scoring multiply-add and per
    selected row (least squares through 0); ``a``, ``b``, ``e`` from the rest of the step (step
    less selector seconds) against the dense and key multiply-adds and a constant per rank and
    step (the optimizer, Python), non-negative (a term whose coefficient comes out negative is
    dropped and the others refitted)."""
    import numpy as np

    selector = np.array([s for _, _, s in samples])
    x = np.array([[t["scoring"], t["rows"]] for t, _, _ in samples])
    c, d = (0.0, 0.0)
    if (x[:, 0] > 0).any():
        (c, d), *_ = np.linalg.lstsq(x, selector, rcond=None)
        if c < 0 or d < 0:  # one term alone
            c, d = (float(x[:, 0] @ selector / (x[:, 0] @ x[:, 0])), 0.0) if c > 0 else \
                (0.0, float(x[:, 1] @ selector / (x[:, 1] @ x[:, 1])))
    names = ["dense", "keys", "step"]
    while True:
        x = np.array([[t[n] for n in names] for t, _, _ in samples])
        y = np.array([step - sel for _, step, sel in samples])
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        if (coef >= 0).all() or len(names) == 1:
            fitted = dict(zip(names, (max(0.0, float(v)) for v in coef)))
            return {"dense": fitted.get("dense", 0.0), "keys": fitted.get("keys", 0.0), "step": fitted.get("step", 0.0),
                    "scoring": float(c), "rows": float(d)}
        names = [n for n, v in zip(names, coef) if v >= 0] or names[:1]


def predict(terms: list[dict[str, float]], rates: dict[str, float]) -> list[float]:
    return [sum(rates[n] * t[n] for n in rates) for t in terms]


def projection(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Fits the per-rank cost model on the baseline's steps of every run, checks it against every
    strategy's measured slowest rank, then projects V4-Flash at --project-tokens on a GPU."""
    fits: list[tuple[dict[str, float], float, float]] = []
    for run in runs:
        if args.fit_tokens and run["tokens"] > args.fit_tokens:
            continue  # predicted, not fitted
        config = scaled_config(run["scale"], run["layers"], run["experts"], run["tokens"])
        layers = list(config.layer_types)
        base = next(iter(run["modes"]))
        for i, step in enumerate(run["modes"][base]["lengths_steps"]):
            lengths = tuple(lengths_of(run["pack"], run["tokens"], run["ranks"], run["seed"] + step))
            terms = rank_terms(config, lengths, run["ranks"], base, layers)
            for rank, t in enumerate(terms):
                fits.append((t, run["modes"][base]["per_rank_step_seconds"][i][rank],
                             run["modes"][base]["per_rank_selector_seconds"][i][rank]))
    rates = fit_costs(fits)
    fitted_on = f" of runs up to {args.fit_tokens} tokens" if args.fit_tokens else ""
    print("\nprojection: per-rank step CPU seconds = a * dense + b * keys multiply-adds + c * scoring multiply-adds "
          "+ d * selected rows + e; c, d fitted to the baseline's selector seconds, a, b, e to the rest of its steps "
          f"({len(fits)} rank-steps{fitted_on}): a = {rates['dense'] * 1e12:.2f} ps, "
          f"b = {rates['keys'] * 1e12:.2f} ps, c = {rates['scoring'] * 1e12:.2f} ps, "
          f"d = {rates['rows'] * 1e6:.2f} us, e = {rates['step']:.3f} s")
    print("this machine, the slowest rank's step CPU seconds, median over the steps: predicted vs measured")
    print(f"{'tokens':>8s} {'pack':9s} {'mode':8s} {'predicted':>10s} {'measured':>9s} {'error':>7s}   "
          f"{'slowest selector s: predicted':>29s} {'measured':>9s}")
    checks = []
    for run in runs:
        config = scaled_config(run["scale"], run["layers"], run["experts"], run["tokens"])
        for mode, row in run["modes"].items():
            predicted, selector = [], []
            for step in row["lengths_steps"]:
                lengths = tuple(lengths_of(run["pack"], run["tokens"], run["ranks"], run["seed"] + step))
                terms = rank_terms(config, lengths, run["ranks"], mode, list(config.layer_types))
                predicted.append(max(predict(terms, rates)))
                selector.append(max(rates["scoring"] * t["scoring"] + rates["rows"] * t["rows"] for t in terms))
            p, m = statistics.median(predicted), row["step_seconds_median"]
            ps = statistics.median(selector)
            ms = statistics.median(max(ranks) for ranks in row["per_rank_selector_seconds"])
            checks.append({"tokens": run["tokens"], "pack": run["pack"], "mode": mode, "predicted": p,
                           "measured": m, "error": p / m - 1, "selector_predicted": ps, "selector_measured": ms})
            print(f"{run['tokens']:8d} {run['pack']:9s} {mode:8s} {p:10.2f} {m:9.2f} {100 * (p / m - 1):6.1f}%   "
                  f"{ps:9.3f} {ms:9.3f}")
    # This machine, longer batches: where the bound reaches 1.05 on the measured configuration.
    first = runs[0]
    ranks = first["ranks"]
    print(f"\nthis machine at longer batches, by the same model (the measured configuration, {ranks} ranks): none's "
          "slowest-rank step, the selection's share of it, I and the bound")
    print(f"{'tokens':>8s} {'pack':9s} {'step s':>8s} {'share':>6s} {'I':>6s} {'bound':>6s}")
    longer = []
    for pack in ("one", "longtail"):
        for power in range(13, 21):
            n = 1 << power
            config = scaled_config(first["scale"], first["layers"], first["experts"], n)
            terms = rank_terms(config, lengths_of(pack, n, ranks, first["seed"]), ranks, "none",
                               list(config.layer_types))
            total = predict(terms, rates)
            sel = [rates["scoring"] * t["scoring"] + rates["rows"] * t["rows"] for t in terms]
            m = statistics.mean(sel)
            imbalance = max(sel) / m if m else 1.0
            rest = statistics.mean(t - x for t, x in zip(total, sel))
            bound = (rest + imbalance * m) / (rest + m)
            share = sel[total.index(max(total))] / max(total)
            longer.append({"tokens": n, "pack": pack, "step_seconds": max(total), "indexer_share": share,
                           "imbalance": imbalance, "bound": bound})
            print(f"{n:8d} {pack:9s} {max(total):8.1f} {100 * share:5.1f}% {imbalance:6.2f} {bound:6.3f}")
    # V4-Flash on a GPU: dense and attention at bf16, scoring at fp8, times --efficiency.
    flash = flash_config()
    layers = list(flash.layer_types)
    bf16 = args.bf16_tflops * 1e12 * args.efficiency / 2  # multiply-adds per second
    fp8 = args.fp8_tflops * 1e12 * args.efficiency / 2
    gpu = {"dense": 1 / bf16, "keys": 1 / bf16, "scoring": 1 / fp8, "rows": 0.0, "step": 0.0}
    # one selection row's exchange bytes: q_lora (bf16) + merge weights, cos, sin (fp32) out, top-k int32 ids back
    row_bytes = 2 * flash.q_lora_rank + 4 * (flash.index_n_heads + flash.qk_rope_head_dim) + 4 * flash.index_topk
    csa_layers = sum(t == CSA for t in layers)
    print(f"\nV4-Flash ({len(layers)} layers, {csa_layers} CSA) at {args.project_tokens} tokens, GPU at "
          f"{args.bf16_tflops:g} bf16 / {args.fp8_tflops:g} fp8 TFLOP/s x {args.efficiency:g}, link "
          f"{args.link_gbps:g} GB/s; spill's exchange: {row_bytes} bytes per moved row and CSA layer at the link's "
          "rate (not overlapped)")
    print(f"{'mix':9s} {'cp':>4s} {'step s':>8s} {'share':>6s} {'I':>6s} {'bound':>6s} {'spill gain':>10s} "
          f"{'spill MB/rank':>13s} {'of bound':>8s}")
    table = []
    import sparsecp

    for mix in ("one", "longtail", "lognormal"):
        for cp in (8, 16, 32, 64):
            lengths = lengths_of(mix, args.project_tokens, cp, args.seed)
            none = rank_terms(flash, lengths, cp, "none", layers)
            spill = rank_terms(flash, lengths, cp, "spill", layers)
            none_t = predict(none, gpu)
            sel = [gpu["scoring"] * t["scoring"] for t in none]  # a GPU selector: its multiply-adds only
            m = statistics.mean(sel)
            imbalance = max(sel) / m if m else 1.0
            rest = statistics.mean(t - s for t, s in zip(none_t, sel))
            bound = (rest + imbalance * m) / (rest + m)
            plan = sparsecp.plan(list(lengths), cp, flash.compress_rates[CSA], "spill")
            moved = [0.0] * cp
            for rank in range(cp):
                route = sparsecp.route(plan, list(lengths), cp, rank, flash.compress_rates[CSA])
                sent = sum(int(n) for q, n in enumerate(route.input_splits) if q != rank)
                moved[rank] = sent * row_bytes * csa_layers
            spill_t = [t + b / (args.link_gbps * 1e9) for t, b in zip(predict(spill, gpu), moved)]
            gain = max(none_t) / max(spill_t)
            share = max(sel) / max(none_t)
            table.append({"mix": mix, "cp": cp, "documents": len(lengths), "step_seconds": max(none_t),
                          "indexer_share": share, "imbalance": imbalance, "bound": bound, "spill_gain": gain,
                          "spill_bytes_per_rank": max(moved)})
            print(f"{mix:9s} {cp:4d} {max(none_t):8.2f} {100 * share:5.1f}% {imbalance:6.2f} {bound:6.3f} "
                  f"{gain:10.3f} {max(moved) / 1e6:13.1f} {gain / bound:8.3f}")
    return {"rates_seconds_per_mac": rates, "check": checks, "this_machine_longer": longer, "gpu": {
        "bf16_tflops": args.bf16_tflops, "fp8_tflops": args.fp8_tflops, "efficiency": args.efficiency,
        "link_gbps": args.link_gbps, "tokens": args.project_tokens}, "table": table}


# ---------------------------------------------------------------- picture


def svg(runs: list[dict[str, Any]]) -> str:
    """Left: gain over the baseline (with its interval) and the bound, per strategy, against
    tokens; right: the baseline's indexer share against tokens; one line style per pack."""
    packs = sorted({r["pack"] for r in runs})
    modes_shown = len(next(iter(runs))["modes"]) + 1 if runs else 1
    legend_rows = math.ceil(len(packs) * modes_shown / 4)
    plot_bottom = 330
    width, height, top, bottom = 980, plot_bottom + 56 + 14 * legend_rows, 30, 0
    bottom = height - plot_bottom
    panels = [(70, 470), (560, 960)]
    tokens = sorted({r["tokens"] for r in runs})
    colors = {"none": "#7f7f7f", "zigzag": "#1f77b4", "greedy": "#8c564b", "hybrid": "#2ca02c", "spill": "#d62728",
              "bound": "#000000"}
    dashes = ["", "6,3", "2,3", "8,3,2,3"]

    def x(panel: int, t: int) -> float:
        left, right = panels[panel]
        span = math.log2(tokens[-1] / tokens[0]) if len(tokens) > 1 else 0
        return (left + right) / 2 if not span else left + (right - left) * math.log2(t / tokens[0]) / span

    gains = [v for r in runs for row in r["modes"].values() for v in (*row["gain_interval"], row["bound"])]
    g_low, g_high = min(0.9, min(gains)), max(1.1, max(gains))
    shares = [row["indexer_share"] for r in runs for row in r["modes"].values()]
    s_high = max(0.05, max(shares) * 1.2)

    def y(value: float, low: float, high: float) -> float:
        return top + (height - top - bottom) * (1 - (value - low) / (high - low))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>']
    for panel, (label, low, high, ticks) in enumerate((
            ("step gain over none (CPU s, slowest rank) and bound", g_low, g_high,
             [g_low + (g_high - g_low) * i / 5 for i in range(6)]),
            ("indexer share of the slowest rank's step", 0.0, s_high, [s_high * i / 5 for i in range(6)]))):
        left, right = panels[panel]
        parts.append(f'<line x1="{left}" y1="{height - bottom}" x2="{right}" y2="{height - bottom}" stroke="black"/>')
        parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>')
        parts.append(f'<text x="{(left + right) / 2}" y="{top - 10}" text-anchor="middle">{label}</text>')
        parts.append(f'<text x="{(left + right) / 2}" y="{plot_bottom + 34}" text-anchor="middle">tokens '
                     f'({runs[0]["ranks"]} ranks)</text>')
        for t in tokens:
            parts.append(f'<text x="{x(panel, t):.1f}" y="{height - bottom + 16}" text-anchor="middle">'
                         f'{t // 1024}K</text>')
        for v in ticks:
            text = f"{v:.2f}" if panel == 0 else f"{100 * v:.0f}%"
            parts.append(f'<line x1="{left}" y1="{y(v, low, high):.1f}" x2="{right}" y2="{y(v, low, high):.1f}" '
                         'stroke="#ddd"/>')
            parts.append(f'<text x="{left - 6}" y="{y(v, low, high) + 4:.1f}" text-anchor="end">{text}</text>')
        if panel == 0:
            parts.append(f'<line x1="{left}" y1="{y(1.0, low, high):.1f}" x2="{right}" y2="{y(1.0, low, high):.1f}" '
                         'stroke="#999" stroke-dasharray="3,3"/>')
    legend = []
    for pi, pack in enumerate(packs):
        mine = sorted((r for r in runs if r["pack"] == pack), key=lambda r: r["tokens"])
        dash = dashes[pi % len(dashes)]
        modes = list(mine[0]["modes"])
        series: list[tuple[str, int, list[tuple[int, float]]]] = [
            ("bound", 0, [(r["tokens"], r["modes"][modes[0]]["bound"]) for r in mine])]
        series += [(m, 0, [(r["tokens"], r["modes"][m]["gain"]) for r in mine]) for m in modes[1:]]
        series += [(modes[0], 1, [(r["tokens"], r["modes"][modes[0]]["indexer_share"]) for r in mine])]
        for name, panel, points in series:
            low, high = (g_low, g_high) if panel == 0 else (0.0, s_high)
            color = colors.get(name, "#9467bd")
            path = " ".join(f"{x(panel, t):.1f},{y(v, low, high):.1f}" for t, v in points)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2" '
                         f'stroke-dasharray="{dash}"/>')
            for t, v in points:
                parts.append(f'<circle cx="{x(panel, t):.1f}" cy="{y(v, low, high):.1f}" r="3" fill="{color}"/>')
            if panel == 0 and name != "bound":
                for r in mine:
                    lo, hi = r["modes"][name]["gain_interval"]
                    parts.append(f'<line x1="{x(0, r["tokens"]):.1f}" y1="{y(lo, low, high):.1f}" '
                                 f'x2="{x(0, r["tokens"]):.1f}" y2="{y(hi, low, high):.1f}" stroke="{color}"/>')
            legend.append((f"{name if panel == 0 else 'none: indexer share'} ({pack})", color, dash))
    for i, (name, color, dash) in enumerate(legend):
        lx, ly = 80 + 230 * (i % 4), plot_bottom + 60 + 14 * (i // 4)
        parts.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 20}" y2="{ly - 4}" stroke="{color}" stroke-width="2" '
                     f'stroke-dasharray="{dash}"/>')
        parts.append(f'<text x="{lx + 24}" y="{ly}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write_whole(path: str, text: str) -> None:
    """Writes ``path`` through a temporary file in its folder, renamed only when complete."""
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".step_at_length.", dir=folder)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


# ---------------------------------------------------------------- main


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in info)}
        return (f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} "
                f"model {fields.get('model', '?')})")
    except OSError:
        return platform.processor() or "unknown CPU"


def print_step(ranks: list[dict[str, Any]]) -> None:
    first = ranks[0]
    cpu = " ".join(f"{r['cpu_seconds']:.2f}" for r in ranks)
    sel = " ".join(f"{r['selector_seconds']:.2f}" for r in ranks)
    print(f"  step {first['step']}{' (warm-up)' if first['warmup'] else ''} {first['mode']:8s} CPU s per rank {cpu}  "
          f"wall {max(r['wall_seconds'] for r in ranks):.2f}  selector s per rank {sel}  loss {first['loss']:.5f}  "
          f"({first['documents']} documents, longest {first['longest']})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, default=64, help="divide the hidden size and every head count by F "
                        "(a divisor of 64; default 64: hidden 64, 1 head, 1 index head)")
    parser.add_argument("--layers", default="csa,hca", help="'flash' (V4-Flash's 43 layers) or a list of csa, hca, "
                        "sliding (default csa,hca)")
    parser.add_argument("--experts", type=int, default=8, help="routed experts (6 active + 1 shared, as V4-Flash; "
                        "default 8)")
    parser.add_argument("--tokens", default="65536", help="tokens per batch, comma-separated for several runs")
    parser.add_argument("--pack", default="one", help="one, longtail, lognormal; comma-separated for several")
    parser.add_argument("--ranks", type=int, default=2, help="CP ranks, gloo on loopback (2-4; default 2)")
    parser.add_argument("--modes", default="none,zigzag,hybrid,spill",
                        help="strategies, interleaved step by step; the first is the baseline (default "
                             "none,zigzag,hybrid,spill)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per strategy (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1: spill calibrates its "
                        "cost model in its first forward)")
    parser.add_argument("--selector", default="fused", choices=("fused", "model"),
                        help="the worker selector: sparsecp's fused CPU kernel or the model's torch math")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the model's parameters and activations (default float32)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write every run's summary here")
    parser.add_argument("--svg", help="write the gain / bound / indexer-share picture here")
    parser.add_argument("--from", dest="source",
                        help="read runs from these --json files (comma-separated) instead of running")
    parser.add_argument("--project", action="store_true", help="fit the per-rank cost model, check it against the "
                        "measured steps, project V4-Flash on a GPU (see above)")
    parser.add_argument("--fit-tokens", type=int, default=0, help="fit the cost model on runs of at most this many "
                        "tokens only, so that longer runs test its extrapolation (default 0: every run)")
    parser.add_argument("--project-tokens", type=int, default=1 << 20, help="tokens of the projected batch (1M)")
    parser.add_argument("--bf16-tflops", type=float, default=989.0, help="dense bf16 TFLOP/s (default 989: H100 SXM)")
    parser.add_argument("--fp8-tflops", type=float, default=1979.0, help="dense fp8 TFLOP/s (default 1979: H100 SXM)")
    parser.add_argument("--efficiency", type=float, default=0.4, help="fraction of those rates reached (default 0.4)")
    parser.add_argument("--link-gbps", type=float, default=50.0, help="per-rank link, GB/s (default 50: 400 Gb/s)")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    packs = [p for p in args.pack.split(",") if p]
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        parser.error(f"--tokens takes comma-separated integers, got {args.tokens!r}")
    if not modes or len(set(modes)) != len(modes):
        parser.error(f"--modes names distinct strategies, got {args.modes!r}")
    if set(packs) - {"one", "longtail", "lognormal"} or not packs:
        parser.error(f"--pack takes one, longtail, lognormal; got {args.pack!r}")
    if not 1 <= args.ranks <= 8 or any(t <= 0 or t % args.ranks for t in tokens):
        parser.error("--ranks must be 1-8 and divide every --tokens")
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be at least 1 and --warmup at least 0")
    # V4-Flash's 64 heads and hidden 4,096 (checked against its config in scaled_config); the
    # rest of the options are checked by the ranks, so that the parent's transformers import
    # overlaps theirs
    if args.scale < 1 or 64 % args.scale:
        parser.error(f"--scale must divide 64 (V4-Flash's head counts), got {args.scale}")
    try:
        layer_types(args.layers)
    except ValueError as error:
        parser.error(str(error))
    import sparsecp

    runs: list[dict[str, Any]] = []
    if args.source:
        header: dict[str, Any] = {}
        for name in args.source.split(","):  # several files: their runs together, the first file's header
            with open(name) as source:
                saved = json.load(source)
            runs += saved["runs"]
            header = header or saved["header"]
        for run in runs:  # summarized again from the saved records: the figures as this version defines them
            if run.get("records"):
                run["modes"] = summarize(run["records"], list(run["modes"]))
    else:
        os.environ["OMP_NUM_THREADS"] = "1"  # the spawned ranks: one thread each, all of it on thread_time
        from importlib.metadata import version

        header = {"cpu": cpu_model(), "cores": os.cpu_count(), "isa": sparsecp.kernel_isa(), "torch": version("torch"),
                  "date": datetime.date.today().isoformat(), "load": os.getloadavg(),
                  "command": " ".join(["step_at_length.py", *(argv if argv is not None else sys.argv[1:])])}

        def started() -> None:  # the header (its transformers import) while the first run's ranks start
            if not printed:
                print_header(header, args, modes, max(tokens))
                printed.append(True)
            print(f"\n{current[0]} tokens, pack {current[1]}:", flush=True)

        printed: list[bool] = []
        current: list[Any] = []
        for pack in packs:
            for n in tokens:
                job = {"scale": args.scale, "layers": args.layers, "experts": args.experts, "tokens": n, "pack": pack,
                       "modes": modes, "steps": args.steps, "warmup": args.warmup, "selector": args.selector,
                       "seed": args.seed, "dtype": args.dtype}
                current[:] = [n, pack]
                start = time.perf_counter()
                records = run_job(job, args.ranks, print_step, started)
                run = {**{k: v for k, v in job.items() if k != "modes"}, "ranks": args.ranks,
                       "seconds": time.perf_counter() - start, "load": os.getloadavg(),
                       "modes": summarize(records, modes), "records": records}
                runs.append(run)
                print_summary(run)
    for run in runs if args.source else []:
        print_summary(run)
    output: dict[str, Any] = {"header": header, "runs": runs}
    if args.project:
        output["projection"] = projection(runs, args)
    if args.json:
        write_whole(args.json, json.dumps(output, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.svg:
        write_whole(args.svg, svg(runs))
        print(f"wrote {args.svg}")
    return 0


def print_header(header: dict[str, Any], args: argparse.Namespace, modes: list[str], tokens: int) -> None:
    config = scaled_config(args.scale, args.layers, args.experts, tokens)
    print(f"# DeepSeek-V4 step at length: scale 1/{args.scale} (hidden {config.hidden_size}, "
          f"{config.num_attention_heads} heads of {config.head_dim}, {config.index_n_heads} index heads of "
          f"{config.index_head_dim}, top-k {config.index_topk}, window {config.sliding_window}, o_groups "
          f"{config.o_groups}, {config.n_routed_experts} experts of {config.moe_intermediate_size}), layers "
          f"{args.layers}, CP {args.ranks}, selector {args.selector}, modes {','.join(modes)}; {header['cpu']}, "
          f"{header['cores']} cores, kernel ISA {header['isa']}, torch {header['torch']}, load "
          f"{' '.join(f'{v:.2f}' for v in header['load'])}", flush=True)
    print(cost_table(config, args.scale, [4096, 131072, 1 << 20]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
