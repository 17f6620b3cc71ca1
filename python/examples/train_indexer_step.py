#!/usr/bin/env python3
"""One training step of a Lightning Indexer layer with balanced selection over CP ranks.

A small indexer layer in torch (``q_b_proj``, ``weights_proj``, RoPE, a compressed Index K
bank, and a main-attention query / key with sinks as the teacher) trains on one packed
batch split contiguously over a gloo CP group, the way hyper_parallel's layer does in
``_forward_dispatched``:

1. The owner computes its merge weights ``w = weights_proj(x) * D**-0.5 * H**-0.5`` and
   launches its selection inputs (low-rank query residual ``qr``, ``w``, the rows' RoPE
   ``cos``/``sin``) with ``launch_indexer_inputs(..., mode)`` (``"spill"``: only the rows
   needed to balance the selection work move).
2. Every rank holds the whole compressed Index K bank (``key_proj`` over the compressed
   hidden states, RoPE at each block's position); as a worker it waits for its rows,
   projects their Index Q with the layer's ``q_b_proj`` weight and selects top-k keys
   (``IndexerSelector``, no grad), then returns the ids (``launch_result``).
3. Meanwhile the owner re-projects its *own* rows' Index Q with grad, builds the teacher
   (main attention Q head-major ``[1, Hm, S, Dm]``, the compact compressed attention keys
   its rows can see, sinks; no grad), waits for its ids, and computes
   ``shared_compressed_indexer_kl_loss`` on its own rows with ``main_key_offset`` = the
   compact bank's first row.
4. ``loss.backward()``; the indexer's parameter gradients are averaged over the group with
   ``all_reduce`` (what DDP does: each rank's loss covers its own rows with
   ``loss_coeff / (1 * local rows)``, so the average is the gradient of the whole batch's
   loss with ``loss_coeff / (1 * all rows)``; the key bank is replicated, each rank
   contributes the gradient of the keys its rows selected); ``optimizer.step()``.

The same step with ``mode="none"`` (every rank selects its own rows) gives bit-identical
gradients (the KL stays on the owners either way; only where the ids are computed changes),
and a single process over the whole batch gives the same gradients to fp32 rounding (with
the ranks' thread count: see ``single_process_step``).

Usage::

    python python/examples/train_indexer_step.py --ranks 4              # spill, compared with none and 1 process
    python python/examples/train_indexer_step.py --ranks 4 --heads 64 --head-dim 128 \\
        --att-heads 64 --att-dim 512 --tokens-per-rank 2048 --no-compare   # timing at DeepSeek-V4 head shapes
    sparsecp calibrate --heads 64 --head-dim 128 --q-rank 1536 --threads 1 --out v4.txt
    python python/examples/train_indexer_step.py ... --q-rank 1536 --cost-model v4.txt  # spill on that model
    python python/examples/train_indexer_step.py --ranks 4 --no-compare --repeats 7 \\
        --checkpoint none,plain,replay      # activation checkpointing: recompute selects again, or replays

With ``--balance-step`` the step is balanced, not only the selection: the KL loss (and the rest
of the owner's work: teacher, index query, backward) stays on each row's owner and costs about
``a_kl + c_kl * min(topk, visible)`` per owned row, which no plan can move. One step of
``none`` first measures each rank's selection and owner-side thread CPU time; ``step_fit``
fits the selection's seconds per cost unit and ``a_kl``, ``c_kl`` from them (per-rank sums of
the cost model's load and of ``min(topk, visible)`` over the owned rows), and the mode then
plans with ``owner_load`` = ``sparsecp.owner_cost`` of that model, so the rank with the
heaviest KL selects less. The run reports, per rank and variant, selection, KL and step
totals and the step imbalance (max / mean of the step's thread CPU) with and without it::

    python python/examples/train_indexer_step.py --ranks 4 --no-compare --balance-step --repeats 5

With ``--checkpoint plain`` the layer's forward runs under non-reentrant activation
checkpointing and its recompute (in the backward) plans, exchanges and selects again; with
``replay`` it runs with ``context_fn=sparsecp.torch.selection_replay_contexts`` and the
recompute reuses the forward's ids (phase "selection" then counts the forward's only). The
gradients are bit for bit the same either way.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import queue
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.checkpoint import checkpoint, noop_context_fn

import sparsecp
import sparsecp.torch as indexer_balance


@dataclass(frozen=True)
class IndexerConfig:
    """Sizes of the toy layer and its batch (DeepSeek-V4 uses 64 x 128 index heads, 64 x 512
    attention heads, q LoRA rank 1536, RoPE 64, top-k 512, ratio 4)."""

    lengths: tuple[int, ...] = (2900, 300, 700, 45, 151)  # one long document: spill moves rows
    hidden: int = 64
    q_lora_rank: int = 32
    heads: int = 4
    head_dim: int = 32
    rope_dim: int = 16
    att_heads: int = 4
    att_dim: int = 32
    topk: int = 512  # the KL takes ordinary top-512 selections
    ratio: int = 4
    loss_coeff: float = 1.0
    lr: float = 0.1
    # spill / auto: a per-row cost model file from `sparsecp calibrate` at this layer's shape
    # (its per-row term is the worker's Index-Q projection); None balances causal pairs.
    cost_model: str | None = None

    @property
    def tokens(self) -> int:
        return sum(self.lengths)


@dataclass
class Batch:
    """The global packed batch; every rank generates it from the seed and keeps its shard."""

    hidden: torch.Tensor  # [N, hidden]
    query_residual: torch.Tensor  # [N, q_lora_rank]
    cos: torch.Tensor  # [N, rope_dim / 2], document-local positions
    sin: torch.Tensor
    compressed: torch.Tensor  # [K, hidden]: mean of every complete block of `ratio` tokens
    key_cos: torch.Tensor  # [K, rope_dim / 2], the block's last position
    key_sin: torch.Tensor
    key_begin: torch.Tensor  # [N] int64: the bank row of the token's document's first block
    visible: torch.Tensor  # [N] int64: keys the token sees, (p + 1) // ratio


def rope_tables(positions: torch.Tensor, rope_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inverse = 10000.0 ** (-torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim)
    angles = positions.double()[:, None] * inverse[None, :]
    return angles.cos().float(), angles.sin().float()


def make_batch(config: IndexerConfig, seed: int) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(config.tokens, config.hidden, generator=generator)
    query_residual = torch.randn(config.tokens, config.q_lora_rank, generator=generator)
    positions = torch.cat([torch.arange(n) for n in config.lengths])  # one loop step per document
    blocks, key_positions, key_begin = [], [], []
    start, bank = 0, 0
    for n in config.lengths:
        count = n // config.ratio
        blocks.append(hidden[start:start + count * config.ratio].view(count, config.ratio, -1).mean(1))
        key_positions.append(torch.arange(1, count + 1) * config.ratio - 1)
        key_begin.append(torch.full((n,), bank))
        start, bank = start + n, bank + count
    cos, sin = rope_tables(positions, config.rope_dim)
    key_cos, key_sin = rope_tables(torch.cat(key_positions), config.rope_dim)
    return Batch(hidden, query_residual, cos, sin, torch.cat(blocks), key_cos, key_sin, torch.cat(key_begin),
                 torch.div(positions + 1, config.ratio, rounding_mode="floor"))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """Rotate the trailing ``rope_dim`` channels of every head in interleaved pairs, as
    ``sparsecp.torch.project_index_query`` does (x ``[..., rows, heads, D]``, cos/sin
    ``[..., rows, rope_dim / 2]``); differentiable."""
    head_dim = x.shape[-1]
    c, s = cos[..., None, :], sin[..., None, :]
    x0 = x[..., head_dim - rope_dim::2]
    x1 = x[..., head_dim - rope_dim + 1::2]
    rotated = torch.stack((x0 * c - x1 * s, x1 * c + x0 * s), dim=-1).flatten(-2)
    return torch.cat((x[..., :head_dim - rope_dim], rotated), dim=-1)


class IndexerLayer(torch.nn.Module):
    """The indexer (trained) and the teacher it learns from (main attention Q/K, sinks)."""

    def __init__(self, config: IndexerConfig) -> None:
        super().__init__()
        self.config = config
        self.q_b_proj = torch.nn.Linear(config.q_lora_rank, config.heads * config.head_dim, bias=False)
        self.weights_proj = torch.nn.Linear(config.hidden, config.heads, bias=False)
        self.key_proj = torch.nn.Linear(config.hidden, config.head_dim, bias=False)
        # The teacher: main attention's query and compressed key, and its sink logits.
        self.attention_query = torch.nn.Linear(config.hidden, config.att_heads * config.att_dim, bias=False)
        self.attention_key = torch.nn.Linear(config.hidden, config.att_dim, bias=False)
        self.sinks = torch.nn.Parameter(torch.randn(config.att_heads))

    def indexer_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(name, p) for name, p in self.named_parameters() if name.split(".")[0] in
                ("q_b_proj", "weights_proj", "key_proj")]

    def merge_weights(self, hidden: torch.Tensor) -> torch.Tensor:
        """[1, S, H], scaled by D**-0.5 * H**-0.5 as the model does."""
        return self.weights_proj(hidden) * (self.config.head_dim ** -0.5 * self.config.heads ** -0.5)

    def index_query(self, query_residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The owner's differentiable Index Q, [1, S, H, D]."""
        c = self.config
        query = self.q_b_proj(query_residual).view(*query_residual.shape[:-1], c.heads, c.head_dim)
        return apply_rope(query, cos, sin, c.rope_dim)

    def index_key(self, compressed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The whole compressed Index K bank, [1, K, D] (RoPE at each block's last position)."""
        key = self.key_proj(compressed)[..., None, :]
        return apply_rope(key, cos, sin, self.config.rope_dim)[..., 0, :]

    @torch.no_grad()
    def teacher(self, hidden: torch.Tensor, compressed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Main attention Q head-major [1, Hm, S, Dm] and the compressed keys [1, K, Dm]."""
        c = self.config
        query = self.attention_query(hidden).view(1, -1, c.att_heads, c.att_dim).transpose(1, 2).contiguous()
        return query, self.attention_key(compressed)


@dataclass
class StepResult:
    loss: float
    topk: torch.Tensor  # [S, topk] int32: this rank's rows' ids
    grads: dict[str, torch.Tensor]  # averaged over the group
    params: dict[str, torch.Tensor]  # after optimizer.step()
    seconds: dict[str, tuple[float, float]] = field(default_factory=dict)  # phase -> (wall, thread CPU)
    rows_selected: int = 0  # rows this rank selected as a worker
    slots: int = 0  # valid (row, id) pairs of its own rows (the KL's work)
    fit: dict[str, Any] | None = None  # --balance-step: the fit its plan's owner_load came from


class _Phases:
    """Wall and thread-CPU seconds per named phase (phases may nest: a checkpoint's recompute
    runs its phases inside "backward")."""

    def __init__(self) -> None:
        self.seconds: dict[str, tuple[float, float]] = {}

    def __call__(self, name: str) -> _Phase:
        return _Phase(self, name)


class _Phase:
    def __init__(self, phases: _Phases, name: str) -> None:
        self.phases, self.name = phases, name

    def __enter__(self) -> None:
        self.start = (time.perf_counter(), time.thread_time())

    def __exit__(self, *exc: Any) -> None:
        wall, cpu = self.phases.seconds.get(self.name, (0.0, 0.0))
        self.phases.seconds[self.name] = (wall + time.perf_counter() - self.start[0],
                                          cpu + time.thread_time() - self.start[1])


def compact_bank(batch: Batch, shard: slice) -> tuple[int, int]:
    """[first, end) bank rows the shard's rows can see: from its first document's first
    block to the last row's last visible key (at least one row, as the KL needs K >= 1)."""
    first = int(batch.key_begin[shard.start])
    end = int((batch.key_begin[shard] + batch.visible[shard]).max())
    return first, min(max(end, first + 1), batch.compressed.shape[0])


CHECKPOINTING = ("none", "plain", "replay")
SEED_MODES = ("none", "zigzag", "greedy", "hybrid")
STEP_BALANCED = "/step"  # the variant suffix of --balance-step: "spill/step"


def variant_name(mode: str, checkpointing: str, balance_step: bool = False) -> str:
    """The label of a (mode, checkpointing) run: the mode alone without checkpointing, and
    "/step" when it plans with the fitted owner load (--balance-step)."""
    mode = mode + STEP_BALANCED if balance_step else mode
    return mode if checkpointing == "none" else f"{mode}+{checkpointing}"


def _line(x: list[float], y: list[float]) -> tuple[float, float]:
    """(intercept, slope) of y ~ intercept + slope * x by least squares, both >= 0: a negative
    slope gives (mean y, 0), a negative intercept the fit through the origin."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((xi - mx) ** 2 for xi in x)
    slope = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sxx if sxx > 0 else 0.0
    if slope <= 0:
        return max(my, 0.0), 0.0
    intercept = my - slope * mx
    if intercept < 0:
        return 0.0, sum(xi * yi for xi, yi in zip(x, y)) / sum(xi * xi for xi in x)
    return intercept, slope


def step_fit(config: IndexerConfig, size: int, selection_s: list[float], owner_s: list[float]) -> dict[str, Any]:
    """--balance-step's fit, from one contiguous (``none``) step's per-rank thread CPU seconds:
    ``selection_s`` (phase "selection") and ``owner_s`` (the rest of the step: KL, teacher,
    index query, backward, ...).

    * Seconds per unit of the selection cost model (causal pairs, or --cost-model's): the
      slope of ``selection_s`` against each rank's contiguous load in those units (the ratio
      of sums where no slope is found), so a mis-calibrated model is rescaled to this job.
    * The owner side, ``owner_s ~ k + c_kl * slots`` with ``slots`` each rank's
      sum of min(topk, visible) over its own rows; ``a_kl = k / local rows``.
    * ``owner_load``: ``sparsecp.owner_cost`` of ``a_kl``, ``c_kl`` in the selection model's units,
      what spill balances beside the selection (the same on every rank: the inputs are
      all-gathered).
    """
    model = sparsecp.load_cost_model(config.cost_model) if config.cost_model else sparsecp.CostModel()
    units = [float(u) for u in sparsecp.plan(config.lengths, size, config.ratio, "none", cost_model=model).cost]
    slots = sparsecp.owner_cost(config.lengths, size, config.ratio, 0.0, 1.0, config.topk)
    _, per_unit = _line(units, selection_s)
    if per_unit <= 0:
        per_unit = sum(selection_s) / sum(units) if sum(units) > 0 else 0.0
    k, c_kl = _line(slots, owner_s)
    a_kl = k / (config.tokens // size)
    fit: dict[str, Any] = {"seconds_per_unit": per_unit, "unit": model.unit, "a_kl_s": a_kl, "c_kl_s": c_kl,
                           "selection_s": list(selection_s), "owner_s": list(owner_s), "slots": slots,
                           "selection_units": units, "owner_load": None}
    if per_unit > 0 and a_kl + c_kl > 0:
        fit["owner_load"] = tuple(sparsecp.owner_cost(config.lengths, size, config.ratio, a_kl / per_unit,
                                                      c_kl / per_unit, config.topk))
    return fit


def fit_owner_load(rank: int, size: int, config: IndexerConfig, seed: int, steps: int) -> dict[str, Any]:
    """--balance-step on a process group: ``steps`` contiguous steps (medians), their per-rank
    times all-gathered, and ``step_fit`` of them (identical on every rank)."""
    runs = [rank_step(rank, size, config, "none", seed) for _ in range(steps)]
    selection = statistics.median(r.seconds["selection"][1] for r in runs)
    owner = statistics.median(r.seconds["step"][1] - r.seconds["selection"][1] for r in runs)
    gathered = [torch.zeros(2, dtype=torch.float64) for _ in range(size)]
    dist.all_gather(gathered, torch.tensor([selection, owner], dtype=torch.float64))
    times = torch.stack(gathered).tolist()
    return step_fit(config, size, [t[0] for t in times], [t[1] for t in times])


def train_step(layer: IndexerLayer, optimizer: torch.optim.Optimizer, batch: Batch, rank: int, size: int,
               mode: str, group: Any | None, checkpointing: str = "none",
               owner_load: tuple[float, ...] | None = None) -> StepResult:
    """One step on this rank's contiguous shard (``group=None``: one process, whole batch).

    ``checkpointing``: "none"; "plain" (the layer's forward under non-reentrant activation
    checkpointing: the backward recomputes it, selection and all-to-alls included); "replay"
    (the same with ``context_fn=sparsecp.torch.selection_replay_contexts``: the recompute
    reuses the forward's ids). ``owner_load``: spill / auto plan with each rank's owner-side
    load (``sparsecp.strategy_params``; in the cost model's units)."""
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"checkpointing must be one of {CHECKPOINTING}, got {checkpointing!r}")
    c = layer.config
    local = c.tokens // size
    shard = slice(rank * local, (rank + 1) * local)
    hidden, qr = batch.hidden[shard][None], batch.query_residual[shard][None]
    cos, sin = batch.cos[shard][None], batch.sin[shard][None]
    phases = _Phases()
    started = (time.perf_counter(), time.thread_time())
    optimizer.zero_grad(set_to_none=True)

    def layer_forward(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The layer's forward: (KL loss, this rank's ids [S, topk], rows selected as a worker)."""
        with phases("merge weights"):
            weights = layer.merge_weights(hidden)  # [1, S, H], with grad
        with phases("selection"):
            if group is not None:
                own = mode not in SEED_MODES
                params: dict[str, Any] = {"cost_model": c.cost_model} if own and c.cost_model is not None else {}
                if own and owner_load is not None:
                    params["owner_load"] = owner_load
                wave = indexer_balance.launch_indexer_inputs(qr, weights.detach(), (cos, sin), c.lengths, c.ratio,
                                                             mode, group, **params)
        with phases("index key bank"):
            key = layer.index_key(batch.compressed[None], batch.key_cos[None], batch.key_sin[None])  # [1, K, D]
        with phases("selection"):
            selector = indexer_balance.IndexerSelector(layer.q_b_proj.weight.detach(), key.detach()[0], c.ratio,
                                                       c.topk, head_dim=c.head_dim, rope_dim=c.rope_dim, threads=1)
            if group is None:
                segments = indexer_balance.indexer_route(c.lengths, 1, 0, c.ratio, "none").segments
                topk = selector(qr, weights.detach(), (cos, sin), segments)[0]
                rows_selected = local
            else:
                # In a replayed recompute the handle moves nothing and its worker has zero rows.
                worker_qr, worker_weights, worker_cos, worker_sin = wave.wait()
                selected = selector(worker_qr, worker_weights, (worker_cos, worker_sin), wave.route.segments)[0]
                rows_selected = worker_qr.shape[1]
                pending = wave.launch_result(selected)
        with phases("index query"):
            query = layer.index_query(qr, cos, sin)  # the owner's own rows, with grad
        with phases("teacher"):
            first, end = compact_bank(batch, shard)
            attention_query, attention_key = layer.teacher(hidden, batch.compressed[first:end][None])
        with phases("selection"):
            if group is not None:
                topk = pending.wait()
        with phases("kl loss"):  # the fused kernel: loss and the three gradients
            loss = indexer_balance.shared_compressed_indexer_kl_loss(
                query, key, weights, attention_query, attention_key, topk[None], layer.sinks.detach(),
                attention_scale=c.att_dim ** -0.5, loss_coeff=c.loss_coeff, main_key_offset=first)
        return loss, topk, rows_selected

    if checkpointing == "none":
        loss, topk, rows_selected = layer_forward(hidden)
    else:
        context_fn = indexer_balance.selection_replay_contexts if checkpointing == "replay" else noop_context_fn
        loss, topk, rows_selected = checkpoint(layer_forward, hidden, use_reentrant=False, context_fn=context_fn)
    with phases("backward"):
        loss.backward()
    with phases("all_reduce + step"):
        parameters = layer.indexer_parameters()
        if group is not None:
            # Replayed recomputes make no collective: their calls are agreed here, once per step,
            # before the update (a rank whose replay failed raises on every rank).
            indexer_balance.verify_replays(group)
            for _, parameter in parameters:
                dist.all_reduce(parameter.grad, group=group)
                parameter.grad /= size
        grads = {name: p.grad.detach().clone() for name, p in parameters}
        optimizer.step()
    phases.seconds["step"] = (time.perf_counter() - started[0], time.thread_time() - started[1])
    return StepResult(float(loss.detach()), topk.clone(), grads, {n: p.detach().clone() for n, p in parameters},
                      phases.seconds, rows_selected, int((topk >= 0).sum()))


def build(config: IndexerConfig, seed: int) -> tuple[IndexerLayer, torch.optim.Optimizer, Batch]:
    """The same layer, optimizer and batch in every process."""
    torch.manual_seed(seed)
    layer = IndexerLayer(config)
    optimizer = torch.optim.SGD([p for _, p in layer.indexer_parameters()], lr=config.lr)
    return layer, optimizer, make_batch(config, seed + 1)


def rank_step(rank: int, size: int, config: IndexerConfig, mode: str, seed: int,
              owner_load: tuple[float, ...] | None = None) -> StepResult:
    """One step on an initialised process group (the test's and the script's rank task);
    ``mode`` may name a checkpointing too (``variant_name``: "spill+replay"; a "/step" suffix is
    dropped: pass its ``owner_load``)."""
    layer, optimizer, batch = build(config, seed)
    mode, _, checkpointing = mode.partition("+")
    mode = mode.removesuffix(STEP_BALANCED)
    return train_step(layer, optimizer, batch, rank, size, mode, dist.group.WORLD, checkpointing or "none",
                      owner_load)


def single_process_step(config: IndexerConfig, seed: int, threads: int = 1) -> StepResult:
    """The whole batch in this process, with ``threads`` torch threads (default: one, like each
    rank). The thread count matters at the last bit: torch's GEMMs may round the projections
    differently with other thread counts, and a bit flip of ``q . k`` near 0 flips its
    ReLU's gradient, a jump of one (head, id) term in ``dq`` (measured at DeepSeek-V4 head
    shapes with 2 threads here: q_b_proj's gradient off by 5e-3 of its largest element; with
    1 thread, 4e-7)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        layer, optimizer, batch = build(config, seed)
        return train_step(layer, optimizer, batch, 0, 1, "none", None)
    finally:
        torch.set_num_threads(saved)


def _rank_main(rank: int, size: int, port: int, config: IndexerConfig, modes: list[str], seed: int,
               repeat: int, results: Any, collected: Any, fit_steps: int = 1) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=300))
    try:
        fit: dict[str, Any] | None = None
        if any(STEP_BALANCED in mode for mode in modes):  # --balance-step: fit first, then plan with it
            fit = fit_owner_load(rank, size, config, seed, fit_steps)
        for repetition in range(repeat):  # modes interleaved
            for mode in modes:
                balanced = STEP_BALANCED in mode and fit is not None
                result = rank_step(rank, size, config, mode, seed, fit["owner_load"] if balanced else None)
                result.fit = fit if balanced else None
                if repetition:  # later repetitions only time
                    result.grads, result.params, result.topk = {}, {}, result.topk[:0]
                results.put((mode, rank, result))
        collected.wait(600)  # tensors travel as shared memory: stay until the parent has them
    finally:
        dist.destroy_process_group()


def _failed_ranks(processes: list) -> dict[int, int]:
    return {rank: process.exitcode for rank, process in enumerate(processes) if process.exitcode not in (None, 0)}


def run_ranks(size: int, config: IndexerConfig, modes: list[str], seed: int, repeat: int = 1,
              timeout: float = 600.0, fit_steps: int = 1) -> dict[str, list[list[StepResult]]]:
    """Spawn ``size`` gloo ranks on loopback, one thread each; every rank runs ``repeat`` x one
    step per mode (modes interleaved). Returns mode -> rank -> the repetitions' results (only
    the first keeps gradients, parameters and ids). A "/step" mode (``variant_name(...,
    balance_step=True)``) plans with the owner load fitted from ``fit_steps`` contiguous steps
    run first (``fit_owner_load``; its results carry the fit)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results, done = context.Queue(), context.Event()
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # one thread per rank (each rank's kernels)
        os.environ.setdefault(name, "1")
    processes = [context.Process(target=_rank_main,
                                 args=(rank, size, port, config, modes, seed, repeat, results, done, fit_steps))
                 for rank in range(size)]
    for process in processes:
        process.start()
    collected: dict[str, list] = {mode: [[] for _ in range(size)] for mode in modes}
    deadline = time.monotonic() + timeout
    try:
        pending = size * len(modes) * repeat
        while pending:
            try:
                mode, rank, result = results.get(timeout=1.0)
            except queue.Empty:  # a rank that raised has exited: report it now, not at the timeout
                failed = _failed_ranks(processes)
                if failed:  # the others may be raising too: a few seconds to exit, then name all that did
                    grace = time.monotonic() + 10.0
                    while time.monotonic() < grace and any(process.exitcode is None for process in processes):
                        time.sleep(0.1)
                    failed = _failed_ranks(processes)
                    raise RuntimeError(f"rank(s) {sorted(failed)} exited with status(es) {list(failed.values())} "
                                       "before finishing their steps (their tracebacks are above)") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the ranks returned no result within {timeout:.0f} s") from None
                continue
            collected[mode][rank].append(result)
            pending -= 1
    finally:
        done.set()
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    return collected


def median_seconds(steps: list[StepResult]) -> dict[str, tuple[float, float]]:
    """Per phase, the median (wall, thread CPU) seconds over repetitions."""
    return {name: (statistics.median(s.seconds[name][0] for s in steps),
                   statistics.median(s.seconds[name][1] for s in steps)) for name in steps[0].seconds}


def imbalance(values: list[float]) -> float:
    """max / mean (1 without any)."""
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[n] - b[n]).abs().max() / b[n].abs().max()) for n in b)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mode", default="spill", help="balancing strategy (spill, greedy, none, ...)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tokens-per-rank", type=int, default=0,
                        help="scale the default documents to this many tokens per rank (0: 1024 for 4 ranks)")
    # Option names as the sparsecp tool spells them (--q-rank, --repeats); the older
    # spellings --q-lora-rank and --repeat still work, hidden from --help.
    flags = {"q_lora_rank": "--q-rank"}
    for name in ("hidden", "q_lora_rank", "heads", "head_dim", "rope_dim", "att_heads", "att_dim"):
        parser.add_argument(flags.get(name, "--" + name.replace("_", "-")), dest=name, type=int,
                            default=getattr(IndexerConfig, name))
    parser.add_argument("--q-lora-rank", dest="q_lora_rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cost-model", default=None,
                        help="spill/auto: balance this per-row cost model (a file from `sparsecp calibrate --heads H "
                             "--head-dim D --q-rank R --threads 1`) instead of causal pairs")
    parser.add_argument("--checkpoint", default="none",
                        help="activation checkpointing of the layer's forward, one or a comma list (runs "
                             "interleaved): none, plain (the recompute selects and communicates again), replay "
                             "(context_fn=selection_replay_contexts: the recompute reuses the ids)")
    parser.add_argument("--balance-step", action="store_true",
                        help="also run --mode planned on the whole step (variant MODE/step): one contiguous step first "
                             "measures each rank's selection and owner-side (KL, ...) thread CPU time, a_kl + c_kl * "
                             "min(topk, visible) per owned row is fitted to it, and spill/auto then balance selection "
                             "+ that owner load, so the rank with the heaviest KL selects less")
    parser.add_argument("--fit-steps", type=int, default=1,
                        help="--balance-step: contiguous steps the fit takes its (median) times from")
    parser.add_argument("--no-compare", action="store_true", help="run only --mode (timing)")
    parser.add_argument("--repeats", type=int, default=1, help="steps per mode and rank (times: medians)")
    parser.add_argument("--repeat", dest="repeats", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    config = IndexerConfig(**{name: getattr(args, name) for name in
                              ("hidden", "q_lora_rank", "heads", "head_dim", "rope_dim", "att_heads", "att_dim")},
                           cost_model=args.cost_model)
    if args.tokens_per_rank or config.tokens % args.ranks:
        total = (args.tokens_per_rank or config.tokens // args.ranks) * args.ranks
        scaled = [max(1, n * total // config.tokens) for n in config.lengths]
        scaled[0] += total - sum(scaled)
        config = dataclasses.replace(config, lengths=tuple(scaled))
    checkpointings = args.checkpoint.split(",")
    for checkpointing in checkpointings:
        if checkpointing not in CHECKPOINTING:
            parser.error(f"--checkpoint: {checkpointing!r} is not one of {', '.join(CHECKPOINTING)}")
    if args.balance_step and args.mode in SEED_MODES:
        parser.error(f"--balance-step: --mode {args.mode} is one of hyper_parallel's modes, which take no owner "
                     "load; use spill or auto")
    if args.balance_step and args.mode == "auto" and args.cost_model is None:
        parser.error("--balance-step: auto predicts on its nominal accelerator model unless given --cost-model; "
                     "the owner load must be in the planner's units: pass --cost-model, or use spill")
    if args.fit_steps < 1:
        parser.error(f"--fit-steps must be at least 1, got {args.fit_steps}")
    base = [args.mode] if args.no_compare or args.mode == "none" else [args.mode, "none"]
    modes = [variant_name(mode, checkpointing, balanced) for mode in base
             for balanced in ((False, True) if args.balance_step and mode == args.mode else (False,))
             for checkpointing in checkpointings]
    print(f"{args.ranks} gloo ranks, documents {config.lengths}, index heads {config.heads} x {config.head_dim}, "
          f"attention heads {config.att_heads} x {config.att_dim}, top-k {config.topk}, ratio {config.ratio}",
          file=sys.stderr)
    runs = run_ranks(args.ranks, config, modes, args.seed, args.repeats, fit_steps=args.fit_steps)
    results = {mode: [steps[0] for steps in runs[mode]] for mode in modes}
    summary: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "lengths": config.lengths,
                               "ranks": args.ranks, "repeats": args.repeats, "config": dataclasses.asdict(config)}
    for mode in modes:
        summary[mode] = [{"rank": r, "loss": steps[0].loss, "rows_selected": steps[0].rows_selected,
                          "kl_slots": steps[0].slots, "seconds": median_seconds(steps),
                          "selection_cpu_s": [s.seconds["selection"][1] for s in steps],
                          "kl_cpu_s": [s.seconds["kl loss"][1] for s in steps],
                          "step_cpu_s": [s.seconds["step"][1] for s in steps]}
                         for r, steps in enumerate(runs[mode])]
        summary.setdefault("step_imbalance", {})[mode] = imbalance(
            [rank["seconds"]["step"][1] for rank in summary[mode]])
        fit = runs[mode][0][0].fit
        if fit is not None:
            summary["balance_step_fit"] = fit
    if not args.no_compare:
        single = single_process_step(config, args.seed)
        distributed = results[modes[0]][0]
        summary["loss_sum_over_ranks_div_ranks"] = sum(s.loss for s in results[modes[0]]) / args.ranks
        summary["single_process_loss"] = single.loss
        summary["max_relative_grad_difference_vs_single_process"] = max_relative_difference(distributed.grads,
                                                                                            single.grads)
        if "none" in results and modes[0] != "none":  # every variant's gradients are none's
            summary["grads_bitwise_equal_to_none"] = all(
                torch.equal(a.grads[n], b.grads[n]) for mode in modes if mode != "none"
                for a, b in zip(results[mode], results["none"]) for n in a.grads)
    if len(checkpointings) > 1:  # checkpointing never changes a gradient bit
        summary["grads_bitwise_equal_across_checkpointing"] = all(
            torch.equal(a.grads[n], b.grads[n]) for mode in modes[1:len(checkpointings)]
            for a, b in zip(results[mode], results[modes[0]]) for n in a.grads)
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    if "balance_step_fit" in summary:
        fit = summary["balance_step_fit"]
        load = fit["owner_load"]
        unit = fit["unit"] if fit["unit"] != "pairs" else "causal pair"
        print(f"--balance-step fit from {args.fit_steps} contiguous step(s): selection {fit['seconds_per_unit']:.4g} s "
              f"per {unit}; owner side {fit['a_kl_s'] * 1e6:.3g} us per row + {fit['c_kl_s'] * 1e9:.3g} ns per "
              f"min(topk, visible); owner load per rank "
              f"{[round(x) for x in load] if load else 'none (nothing fitted)'}")
    for mode in modes:
        print(f"mode {mode}: per rank thread CPU seconds (median of {args.repeats}): selection, KL, step total")
        for rank in summary[mode]:
            seconds = rank["seconds"]
            select, kl, step = seconds["selection"][1], seconds["kl loss"][1], seconds["step"][1]
            print(f"  rank {rank['rank']}: loss {rank['loss']:.6f}, selected {rank['rows_selected']} rows, KL over "
                  f"{rank['kl_slots']} ids; selection {select:.3f} s, KL {kl:.3f} s, step {step:.3f} s "
                  f"(KL / selection {kl / select:.2f}, backward {seconds['backward'][1]:.3f} s); wall: selection "
                  f"{seconds['selection'][0]:.3f} s, step {seconds['step'][0]:.3f} s")
        steps = [rank["seconds"]["step"][1] for rank in summary[mode]]
        selections = [rank["seconds"]["selection"][1] for rank in summary[mode]]
        print(f"  step imbalance (max / mean of the step's thread CPU) {summary['step_imbalance'][mode]:.3f}, "
              f"slowest rank {max(steps):.3f} s; selection alone {imbalance(selections):.3f}")
    for key in ("single_process_loss", "loss_sum_over_ranks_div_ranks",
                "max_relative_grad_difference_vs_single_process", "grads_bitwise_equal_to_none"):
        if key in summary:
            print(f"{key}: {summary[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
