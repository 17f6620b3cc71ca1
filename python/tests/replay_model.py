"""A two-layer indexer model for the selection-replay tests (test_replay.py), and its rank tasks.

Each layer is a Lightning Indexer trained by the sparse KL against an attention-sink teacher,
with balanced selection over the CP group: layer 0 through ``balanced_indexer_select``, layer 1
through the overlapped handles (``launch_indexer_inputs`` -> ``wait`` -> selector ->
``launch_result`` -> ``wait``), both ``mode="spill"``. A layer's output feeds the next
(``x + tanh(out(x))``), so every parameter's gradient passes through recomputed activations.
The only collectives of a step are the selections' (no gradient all-reduce): a step's count is
a property of the selections alone.

Ways a step runs (``VARIANTS``): ``plain`` (no checkpointing), ``checkpoint`` (non-reentrant
checkpointing without replay: every selection runs twice), ``context_fn``
(``context_fn=selection_replay_contexts``), ``reentrant`` (reentrant checkpointing with one
``SelectionReplay`` per layer), ``selective`` (selective checkpointing composed with replay,
with a policy that saves ops the exchange uses too: mm, cat, index_select).
"""
from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import sparsecp.torch as sct

LENGTHS = (600, 100, 250, 73, 1)  # 1024 tokens: 256 per rank on 4 ranks
HIDDEN, Q_RANK, HEADS, HEAD_DIM, ROPE_DIM, ATT_HEADS, ATT_DIM, TOPK = 32, 16, 2, 16, 8, 2, 16, 512
RATIOS = (1, 2)  # layer 0 sees up to 600 keys (a real top-512 choice), layer 1 up to 300
VARIANTS = ("plain", "checkpoint", "context_fn", "reentrant", "selective")
COLLECTIVES = ("all_reduce", "all_to_all_single", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
               "all_gather", "barrier", "all_to_all")


@dataclass
class Batch:
    hidden: torch.Tensor  # [1, local, HIDDEN]: this rank's shard
    cos: torch.Tensor  # [1, local, ROPE_DIM / 2], document positions
    sin: torch.Tensor
    compressed: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # ratio -> bank [1, K, HIDDEN], cos, sin


def rope(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    angles = positions.double()[:, None] * 10000.0 ** (-torch.arange(0, ROPE_DIM, 2, dtype=torch.float64) / ROPE_DIM)
    return angles.cos().float(), angles.sin().float()


def make_batch(seed: int, rank: int, size: int, lengths: tuple[int, ...] = LENGTHS) -> Batch:
    """The same global batch on every rank (from the seed); this rank keeps its shard."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(sum(lengths), HIDDEN, generator=generator)
    positions = torch.cat([torch.arange(n) for n in lengths])
    local = sum(lengths) // size
    shard = slice(rank * local, (rank + 1) * local)
    cos, sin = rope(positions)
    banks = {}
    for ratio in RATIOS:  # every rank holds the whole batch's compressed bank
        blocks, key_positions, start = [], [], 0
        for n in lengths:
            count = n // ratio
            blocks.append(hidden[start:start + count * ratio].view(count, ratio, HIDDEN).mean(1))
            key_positions.append(torch.arange(1, count + 1) * ratio - 1)
            start += n
        key_cos, key_sin = rope(torch.cat(key_positions))
        banks[ratio] = (torch.cat(blocks)[None], key_cos[None], key_sin[None])
    return Batch(hidden[shard][None], cos[shard][None], sin[shard][None], banks)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The trailing ROPE_DIM channels of each head in interleaved pairs (differentiable)."""
    c, s = cos[..., None, :], sin[..., None, :]
    x0, x1 = x[..., HEAD_DIM - ROPE_DIM::2], x[..., HEAD_DIM - ROPE_DIM + 1::2]
    return torch.cat((x[..., :HEAD_DIM - ROPE_DIM], torch.stack((x0 * c - x1 * s, x1 * c + x0 * s), -1).flatten(-2)),
                     dim=-1)


class CountingSelector:
    """An IndexerSelector that counts its calls that selected rows (and the rows)."""

    def __init__(self, selector: sct.IndexerSelector, counts: dict[str, int]) -> None:
        self.selector, self.counts = selector, counts

    def __call__(self, qr: torch.Tensor, weights: torch.Tensor, embeddings: Any, segments: Any) -> torch.Tensor:
        rows = qr.shape[1]
        self.counts["selector calls" if rows else "empty selector calls"] += 1
        self.counts["selector rows"] += rows
        return self.selector(qr, weights, embeddings, segments)


class Layer(torch.nn.Module):
    def __init__(self, ratio: int, overlapped: bool) -> None:
        super().__init__()
        self.ratio, self.overlapped = ratio, overlapped
        self.q_a = torch.nn.Linear(HIDDEN, Q_RANK, bias=False)
        self.q_b = torch.nn.Linear(Q_RANK, HEADS * HEAD_DIM, bias=False)
        self.weights_proj = torch.nn.Linear(HIDDEN, HEADS, bias=False)
        self.key_proj = torch.nn.Linear(HIDDEN, HEAD_DIM, bias=False)
        self.attention_query = torch.nn.Linear(HIDDEN, ATT_HEADS * ATT_DIM, bias=False)
        self.attention_key = torch.nn.Linear(HIDDEN, ATT_DIM, bias=False)
        self.out = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.sinks = torch.nn.Parameter(torch.randn(ATT_HEADS))

    def forward(self, x: torch.Tensor, batch: Batch, group: Any, counts: dict[str, int],
                lengths: tuple[int, ...] = LENGTHS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(next hidden [1, S, HIDDEN], KL loss, top-k ids [1, S, TOPK])."""
        compressed, key_cos, key_sin = batch.compressed[self.ratio]
        qr = self.q_a(x)
        weights = self.weights_proj(x) * (HEAD_DIM ** -0.5 * HEADS ** -0.5)
        key = apply_rope(self.key_proj(compressed)[..., None, :], key_cos, key_sin)[..., 0, :]  # [1, K, D]
        selector = CountingSelector(sct.IndexerSelector(self.q_b.weight.detach(), key.detach()[0], self.ratio, TOPK,
                                                        head_dim=HEAD_DIM, rope_dim=ROPE_DIM, threads=1), counts)
        inputs = (qr.detach(), weights.detach(), (batch.cos, batch.sin))
        if self.overlapped:  # the overlapped handles, as a user writes them
            exchange = sct.launch_indexer_inputs(*inputs, lengths, self.ratio, "spill", group)
            worker_qr, worker_weights, worker_cos, worker_sin = exchange.wait()
            selected = selector(worker_qr, worker_weights, (worker_cos, worker_sin), exchange.route.segments)[0]
            topk = exchange.launch_result(selected).wait()[None]
        else:
            topk = sct.balanced_indexer_select(*inputs, selector, lengths, self.ratio, "spill", group)
        query = apply_rope(self.q_b(qr).view(*qr.shape[:-1], HEADS, HEAD_DIM), batch.cos, batch.sin)
        with torch.no_grad():
            attention_query = self.attention_query(x).view(1, -1, ATT_HEADS, ATT_DIM).transpose(1, 2).contiguous()
            attention_key = self.attention_key(compressed)
        loss = sct.shared_compressed_indexer_kl_loss(query, key, weights, attention_query, attention_key, topk,
                                                     self.sinks.detach(), attention_scale=ATT_DIM ** -0.5,
                                                     loss_coeff=1.0, threads=1)
        return x + torch.tanh(self.out(x)), loss, topk


class Model(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.layers = torch.nn.ModuleList([Layer(RATIOS[0], overlapped=False), Layer(RATIOS[1], overlapped=True)])


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    saved = (torch.ops.aten.mm.default, torch.ops.aten.cat.default, torch.ops.aten.index_select.default)
    return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> tuple[Any, Any]:
    return sct.selection_replay_contexts(create_selective_checkpoint_contexts(_policy))


def forward(model: Model, batch: Batch, group: Any, variant: str, counts: dict[str, int],
            lengths: tuple[int, ...] = LENGTHS) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The model's loss and each layer's top-k, run as ``variant`` says."""
    x = model.embed(batch.hidden)
    losses, topks = [], []
    for layer in model.layers:
        run = functools.partial(layer, batch=batch, group=group, counts=counts, lengths=lengths)
        if variant == "plain":
            x, loss, topk = run(x)
        elif variant == "checkpoint":
            x, loss, topk = checkpoint(run, x, use_reentrant=False)
        elif variant == "context_fn":
            x, loss, topk = checkpoint(run, x, use_reentrant=False, context_fn=sct.selection_replay_contexts)
        elif variant == "selective":
            x, loss, topk = checkpoint(run, x, use_reentrant=False, context_fn=_selective_contexts)
        elif variant == "reentrant":
            replay = sct.SelectionReplay()  # one per layer and step: its forward records, its recompute replays

            def replayed(x: torch.Tensor, run: Any = run, replay: sct.SelectionReplay = replay) -> Any:
                with replay.replay() if replay.recorded else replay.record():
                    return run(x)

            x, loss, topk = checkpoint(replayed, x, use_reentrant=True)
        else:
            raise ValueError(variant)
        losses.append(loss)
        topks.append(topk)
    return sum(losses) + 1e-2 * x.square().mean(), topks


@contextlib.contextmanager
def counted_collectives(counts: dict[str, int]) -> Iterator[None]:
    """Count every torch.distributed collective called while active (counts['collectives'])."""
    saved = {name: getattr(dist, name) for name in COLLECTIVES}

    def counting(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts["collectives"] += 1
            return saved[name](*args, **kwargs)
        return call

    for name in COLLECTIVES:
        setattr(dist, name, counting(name))
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(dist, name, function)


def new_counts() -> dict[str, int]:
    return {"collectives": 0, "selector calls": 0, "empty selector calls": 0, "selector rows": 0}


def step(rank: int, size: int, variant: str, seed: int) -> dict[str, Any]:
    """One forward and backward of ``variant``: counts, top-k and every parameter's gradient."""
    model, batch = Model(seed), make_batch(seed + 1, rank, size)
    counts, verify_counts = new_counts(), new_counts()
    with counted_collectives(counts):
        loss, topks = forward(model, batch, dist.group.WORLD, variant, counts)
        forward_counts = dict(counts)
        loss.backward()
    with counted_collectives(verify_counts):  # the step's one agreement on what its recompute replayed
        replayed = sct.verify_replays(dist.group.WORLD)
    return {"counts": counts, "forward counts": forward_counts, "loss": float(loss.detach()),
            "verify collectives": verify_counts["collectives"], "replayed calls": replayed,
            "topk": [t.numpy() for t in topks],
            "grads": {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None},
            "parameters": sorted(name for name, p in model.named_parameters() if p.requires_grad)}


def mismatched_replay(rank: int, size: int, seed: int) -> dict[str, str]:
    """Record layer 0's call, then replay calls that differ from it; returns each error's text
    and the number of collectives the failed replays made."""
    model, batch = Model(seed), make_batch(seed + 1, rank, size)
    layer, counts = model.layers[0], new_counts()
    x = model.embed(batch.hidden)
    alone = [dist.new_group([r]) for r in range(size)][rank]  # every rank creates every group
    replay = sct.SelectionReplay()
    with replay.record():
        layer(x, batch, dist.group.WORLD, counts)

    def other_ratio() -> None:
        layer.ratio = RATIOS[1]
        try:
            layer(x, batch, dist.group.WORLD, counts)
        finally:
            layer.ratio = RATIOS[0]

    shorter = Batch(batch.hidden, batch.cos[:, :-1], batch.sin[:, :-1], batch.compressed)
    cases = {"lengths": lambda: layer(x, batch, dist.group.WORLD, counts,
                                      lengths=(LENGTHS[0] - 4, LENGTHS[1] + 4, *LENGTHS[2:])),
             "ratio": other_ratio,
             "shape": lambda: layer(x[:, :-1], shorter, dist.group.WORLD, counts),
             "group": lambda: layer(x, batch, alone, counts),
             "entry point": lambda: model.layers[1](x, batch, dist.group.WORLD, counts)}
    errors = {}
    collectives, replayed = new_counts(), new_counts()
    with counted_collectives(collectives):
        for name, call in cases.items():
            try:
                with counted_collectives(replayed), replay.replay():
                    call()  # held: the failed call returns all -1 ids and moves nothing
                sct.verify_replays(dist.group.WORLD)  # the step's agreement raises it, on every rank
                errors[name] = "no error"
            except ValueError as error:
                errors[name] = str(error)
        try:
            with counted_collectives(replayed), replay.replay():
                layer(x, batch, dist.group.WORLD, counts)
                layer(x, batch, dist.group.WORLD, counts)
            sct.verify_replays(dist.group.WORLD)
            errors["past the end"] = "no error"
        except RuntimeError as error:
            errors["past the end"] = str(error)
    errors["collectives"] = str(collectives["collectives"])
    errors["replayed collectives"] = str(replayed["collectives"])
    return errors


def handle_semantics(rank: int, size: int, seed: int) -> dict[str, Any]:
    """The overlapped handles inside a recording and a replay: what they give and refuse."""
    model, batch = Model(seed), make_batch(seed + 1, rank, size)
    layer = model.layers[1]
    qr, weights = layer.q_a(batch.hidden).detach(), layer.weights_proj(batch.hidden).detach()
    launch = functools.partial(sct.launch_indexer_inputs, qr, weights, (batch.cos, batch.sin), LENGTHS, layer.ratio,
                               "spill", dist.group.WORLD)
    compressed, key_cos, key_sin = batch.compressed[layer.ratio]
    key = apply_rope(layer.key_proj(compressed)[..., None, :], key_cos, key_sin)[..., 0, :].detach()
    selector = sct.IndexerSelector(layer.q_b.weight.detach(), key[0], layer.ratio, TOPK, head_dim=HEAD_DIM,
                                   rope_dim=ROPE_DIM, threads=1)
    out: dict[str, Any] = {}

    def errors(function: Any) -> str:
        try:
            function()
        except (RuntimeError, ValueError) as error:
            return str(error)
        return "no error"

    replay = sct.SelectionReplay()
    with replay.record():
        exchange = launch()
        worker = exchange.wait()
        out["recorded twice"] = errors(exchange.wait)
        pending = exchange.launch_result(selector(*worker[:2], worker[2:], exchange.route.segments)[0])
        ids = pending.wait()
        out["recorded pending twice"] = errors(pending.wait)
        out["recorded replayed"] = exchange.replayed
        out["worker rows"] = worker.qr.shape[1]
    out["recorded ids"] = ids.numpy().copy()
    ids.fill_(-7)  # the caller's tensor: the recording kept its own copy
    with replay.replay():
        exchange = launch()
        worker = exchange.wait()
        out["replayed"] = exchange.replayed
        out["replayed twice"] = errors(exchange.wait)
        out["replayed worker shapes"] = [tuple(t.shape) for t in worker]
        out["replayed route"] = (exchange.route.query_count, len(exchange.route.segments),
                                 tuple(exchange.route.input_splits))
        selected = selector(*worker[:2], worker[2:], exchange.route.segments)[0]
        out["replayed selected"] = tuple(selected.shape)
        # Held, not raised at the call: the step's verify_replays raises it on every rank.
        out["non-empty result"] = errors(lambda: (exchange.launch_result(torch.zeros(3, TOPK, dtype=torch.int32)),
                                                  sct.verify_replays(dist.group.WORLD)))
        pending = exchange.launch_result(selected)
        out["replayed ids"] = pending.wait().numpy()
        out["replayed pending twice"] = errors(pending.wait)
    with replay.replay():  # code that skips the selector when the handle is replayed
        exchange = launch()
        out["skipped ids"] = exchange.launch_result(None).wait().numpy()
    exchange = launch()  # outside any session: the seed's handles
    worker = exchange.wait()
    out["plain twice"] = errors(exchange.wait)
    out["plain type"] = type(exchange).__name__
    pending = exchange.launch_result(selector(*worker[:2], worker[2:], exchange.route.segments)[0])
    out["plain ids"] = pending.wait().numpy()
    out["plain pending twice"] = errors(pending.wait)
    return out


def rl_replay(rank: int, size: int, seed: int) -> dict[str, Any]:
    """RL: record the rollout's selections (no grad), run another step on another batch, then
    batch: the rollout's choice is kept); ranks start replaying one after another in reverse
    rank order (no replayed call waits for the others), then replay again; the step's
    verify_replays agrees on all of it."""
    model = Model(seed)
    rollout_batch, other_batch = make_batch(seed + 1, rank, size), make_batch(seed + 2, rank, size)
    counts, replay = new_counts(), sct.SelectionReplay()
    with torch.no_grad(), replay.record():  # the rollout
        _, rollout_topk = forward(model, rollout_batch, dist.group.WORLD, "plain", counts)
    _, other_topk = forward(model, other_batch, dist.group.WORLD, "plain", counts)  # another step, normal
    time.sleep(0.2 * (size - 1 - rank))  # rank size-1 replays first, rank 0 last
    replayed_counts = new_counts()
    with counted_collectives(replayed_counts):
        with replay.replay():  # the training forward and backward
            loss, training_topk = forward(model, other_batch, dist.group.WORLD, "plain", replayed_counts)
            loss.backward()
        with replay.replay():
            _, again = forward(model, other_batch, dist.group.WORLD, "plain", replayed_counts)
    verify_counts = new_counts()
    with counted_collectives(verify_counts):
        verified = sct.verify_replays(dist.group.WORLD)
    return {"rollout": [t.numpy() for t in rollout_topk], "training": [t.numpy() for t in training_topk],
            "other": [t.numpy() for t in other_topk], "counts": replayed_counts, "calls": replay.calls(),
            "verified": verified, "verify collectives": verify_counts["collectives"],
            "nbytes": replay.nbytes, "again": [t.numpy() for t in again]}


def invalid_while_recording(rank: int, size: int, seed: int) -> str:
    """Inside a recording, rank 1 passes invalid lengths: the call fails as it does outside one,
    on every rank (the agreement), instead of leaving the others blocked; returns the error."""
    model, batch = Model(seed), make_batch(seed + 1, rank, size)
    lengths = (float(LENGTHS[0]), *LENGTHS[1:]) if rank == 1 else LENGTHS
    replay = sct.SelectionReplay()
    try:
        with replay.record():
            model.layers[0](model.embed(batch.hidden), batch, dist.group.WORLD, new_counts(), lengths=lengths)
    except ValueError as error:
        return f"{type(error).__name__}: {error}; recorded {replay.recorded}"
    return "no error"


def _early_stop_layers(model: Model, batch: Batch, group: Any) -> tuple[Any, Any]:
    """Two checkpointable layer functions for the early-stop test (issue 30 item 2), each
    returning (next hidden, a loss or Index Q, ids [rows, 8]):

    * ``local``: selects with ``select_indices`` on this rank's own rows (no collective) and
      returns its loss on the ids (computed inside: the recompute's ids reach the backward);
    * ``overlapped``: the overlapped handles, with the owner's differentiable projection run
      while the rows travel, after everything else it saves: its last saved tensor comes
      between the launch and ``launch_result``, so torch's checkpoint early stop ends its
      recompute there."""
    ratio = RATIOS[0]
    compressed = batch.compressed[ratio][0]
    local_rows = batch.hidden.shape[1]
    rank = dist.get_rank(group)
    segments, start, position, keys = [], rank * local_rows, 0, 0  # this rank's rows, per document piece
    for length in LENGTHS:
        first, last = max(start, position), min(start + local_rows, position + length)
        if first < last:
            end = last - position
            segments.append((first - start, last - start, keys, keys + end // ratio, end % ratio))
        keys += length // ratio
        position += length

    def local(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layer = model.layers[0]
        q = layer.q_b(layer.q_a(x)).view(-1, HEADS, HEAD_DIM)
        key, weights = layer.key_proj(compressed)[0], layer.weights_proj(x)[0].detach()
        ids = sct.select_indices(q.detach(), key.detach(), weights, segments, ratio, 8)
        # The loss on the ids inside the region: its backward reads the recomputed ids.
        return x + torch.tanh(layer.out(x)), scores_at(q, key, ids), ids

    def scores_at(q: torch.Tensor, key: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        picked = key[ids.clamp_min(0)]  # [rows, 8, HEAD_DIM]: the ids decide which keys' scores count
        return (torch.einsum("rhd,rkd->rk", q, picked) * (ids >= 0)).sum()

    def overlapped(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layer = model.layers[1]
        qr, weights = layer.q_a(x), layer.weights_proj(x).detach()
        y = x + torch.tanh(layer.out(x))
        key = layer.key_proj(compressed)[0].detach()
        selector = sct.IndexerSelector(layer.q_b.weight.detach(), key, ratio, 8, head_dim=HEAD_DIM,
                                       rope_dim=ROPE_DIM, threads=1)
        exchange = sct.launch_indexer_inputs(qr.detach(), weights, (batch.cos, batch.sin), LENGTHS, ratio, "spill",
                                             group)
        q = layer.q_b(qr).view(-1, HEADS, HEAD_DIM)  # the owner's projection while the rows travel: saved last
        worker = exchange.wait()
        selected = selector(worker.qr, worker.weights, (worker.cos, worker.sin), exchange.route.segments)[0]
        return y, q, exchange.launch_result(selected).wait()

    return local, overlapped


def early_stop_rl(rank: int, size: int, seed: int, early_stop: bool) -> dict[str, Any]:
    """RL replay around checkpointed layers (``context_fn=selection_replay_contexts``) under
    torch's checkpoint early stop: the overlapped layer's recompute (backward runs it first)
    stops between its launch and its ``launch_result``; the layer recomputed next must still
    replay the rollout's ids. Returns the checkpointed run's gradients and ids and those of
    the same replay without checkpointing."""
    from torch.utils.checkpoint import set_checkpoint_early_stop

    model, group = Model(seed), dist.group.WORLD
    rollout_batch, training_batch = make_batch(seed + 1, rank, size), make_batch(seed + 2, rank, size)
    rollout = sct.SelectionReplay()

    def run(batch: Batch, checkpointed: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        local, overlapped = _early_stop_layers(model, batch, group)
        x, total, all_ids = model.embed(batch.hidden), 0, []
        for index, (layer, function) in enumerate(zip(model.layers, (local, overlapped))):
            if checkpointed:
                x, out, ids = checkpoint(function, x, use_reentrant=False, context_fn=sct.selection_replay_contexts)
            else:
                x, out, ids = function(x)
            if index == 0:
                total = total + out
            else:  # the overlapped layer's loss outside its region (its last saved tensor stays before the ids)
                key = layer.key_proj(batch.compressed[RATIOS[0]][0])[0]
                picked = key[ids.clamp_min(0)]
                total = total + (torch.einsum("rhd,rkd->rk", out, picked) * (ids >= 0)).sum()
            all_ids.append(ids)
        return total + x.square().mean(), all_ids

    with torch.no_grad(), rollout.record():
        _, rollout_ids = run(rollout_batch, checkpointed=False)
    with set_checkpoint_early_stop(early_stop), rollout.replay():
        loss, training_ids = run(training_batch, checkpointed=True)
        loss.backward()
    grads = {name: p.grad.clone().numpy() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    with rollout.replay():
        loss, _ = run(training_batch, checkpointed=False)
        loss.backward()
    reference = {name: p.grad.clone().numpy() for name, p in model.named_parameters() if p.grad is not None}
    with torch.no_grad():
        _, fresh_ids = run(training_batch, checkpointed=False)  # no replay: the training batch's own choice
    return {"calls": rollout.calls(), "grads": grads, "reference": reference,
            "rollout ids": [t.numpy() for t in rollout_ids], "training ids": [t.numpy() for t in training_ids],
            "fresh ids": [t.numpy() for t in fresh_ids]}


def one_rank_replay_mismatch(rank: int, size: int, seed: int, case: str) -> tuple[str, str] | None:
    """Record two balanced selections on every rank, then replay them with one rank (the last)
    differing (``case``): its lengths, its mode, a call past the end of its recording, or
    another batch's ``routes=``; then the step's ``verify_replays``. Returns (type, text) of the
    error this rank raised, or None."""
    model, batch = Model(seed), make_batch(seed + 1, rank, size)
    layer, group = model.layers[0], dist.group.WORLD
    x = model.embed(batch.hidden).detach()
    odd = rank == size - 1
    qr, weights = layer.q_a(x).detach(), layer.weights_proj(x).detach()
    compressed = batch.compressed[layer.ratio][0]
    selector = sct.IndexerSelector(layer.q_b.weight.detach(), layer.key_proj(compressed)[0].detach(), layer.ratio,
                                   TOPK, head_dim=HEAD_DIM, rope_dim=ROPE_DIM, threads=1)

    def select(lengths: tuple[int, ...] = LENGTHS, mode: str = "spill", **extra: Any) -> torch.Tensor:
        return sct.balanced_indexer_select(qr, weights, (batch.cos, batch.sin), selector, lengths, layer.ratio, mode,
                                           group, **extra)

    full, short = sct.SelectionReplay(), sct.SelectionReplay()
    with full.record():
        select()
        select()
    with short.record():
        select()
    other = (LENGTHS[0] - 4, LENGTHS[1] + 4, *LENGTHS[2:])
    stale = sct.prebuild(other, size, rank, [layer.ratio], "spill")
    fewer = sct.IndexerSelector(layer.q_b.weight.detach(), layer.key_proj(compressed)[0].detach(), layer.ratio,
                                TOPK // 2, head_dim=HEAD_DIM, rope_dim=ROPE_DIM, threads=1)

    def other_topk() -> torch.Tensor:
        return sct.balanced_indexer_select(qr, weights, (batch.cos, batch.sin), fewer if odd else selector, LENGTHS,
                                           layer.ratio, "spill", group)

    second: dict[str, Any] = {"lengths": lambda: select(other if odd else LENGTHS), "topk": other_topk,
                              "mode": lambda: select(mode="greedy" if odd else "spill"),
                              "routes": lambda: select(routes=stale if odd else None),
                              "past the end": select}
    try:
        with (short if odd and case == "past the end" else full).replay():
            select()
            second[case]()  # held on the odd rank: no collective, all -1 ids
        sct.verify_replays(group)  # the step's one agreement: every rank raises
    except (RuntimeError, ValueError) as error:
        return type(error).__name__, str(error)
    return None


def exception_inside_a_recording(rank: int, size: int, seed: int) -> tuple[str, ...]:
    """Inside a record(), a layer launches the overlapped exchange and raises before its
    launch_result; the loop catches it. The selection calls after it must still be recorded
    (a process-wide window count left at 1 made them the dead exchange's selector: neither
    recorded nor replayed). Returns the recorded calls."""
    model, batch = Model(seed), make_batch(seed + 1, rank, size)
    layer, group = model.layers[1], dist.group.WORLD
    x = model.embed(batch.hidden).detach()
    qr, weights = layer.q_a(x).detach(), layer.weights_proj(x).detach()
    key = layer.key_proj(batch.compressed[layer.ratio][0])[0].detach()

    def failing_layer() -> None:
        exchange = sct.launch_indexer_inputs(qr, weights, (batch.cos, batch.sin), LENGTHS, layer.ratio, "spill",
                                             group)
        exchange.wait()
        raise KeyError("a failure between the launch and launch_result")

    replay = sct.SelectionReplay()
    with torch.no_grad(), replay.record():
        try:
            failing_layer()
        except KeyError:
            pass
        q = layer.q_b(qr)[0].view(-1, HEADS, HEAD_DIM)
        rows = q.shape[0]  # one document of this rank's rows
        sct.select_indices(q, key, weights[0], [(0, rows, 0, rows // layer.ratio, rows % layer.ratio)], layer.ratio, 8)
    return replay.calls()


def past_the_end_against_a_real_call(rank: int, size: int, seed: int, then: str) -> dict[str, Any]:
    """Issue 35 item 7: the last rank replays past the end of its recording while the others
    have left their replay and make a real call (it aborted the process in gloo: the ranks
    took different branches of the agreement). ``then``: what the last rank does next, the
    step's ``verify_replays`` ("verify") or the same real call ("call"). Returns each rank's
    error, the collectives the last rank's replay made, and whether the group still works."""
    model, batch = Model(seed), make_batch(seed + 1, rank, size)
    layer, group = model.layers[0], dist.group.WORLD
    x = model.embed(batch.hidden).detach()
    qr, weights = layer.q_a(x).detach(), layer.weights_proj(x).detach()
    compressed = batch.compressed[layer.ratio][0]
    selector = sct.IndexerSelector(layer.q_b.weight.detach(), layer.key_proj(compressed)[0].detach(), layer.ratio,
                                   TOPK, head_dim=HEAD_DIM, rope_dim=ROPE_DIM, threads=1)

    def select() -> torch.Tensor:
        return sct.balanced_indexer_select(qr, weights, (batch.cos, batch.sin), selector, LENGTHS, layer.ratio,
                                           "spill", group)

    short = sct.SelectionReplay()
    with short.record():
        recorded = select()
    counts = new_counts()
    out: dict[str, Any] = {"error": None}
    try:
        if rank == size - 1:
            with counted_collectives(counts), short.replay():
                select()
                stand_in = select()  # past the end: held, all -1 ids, no collective
            out["stand-in"] = (tuple(stand_in.shape), int(stand_in.max()))
            if then == "verify":
                sct.verify_replays(group)
            else:
                select()
        else:
            with short.replay():
                select()
            select()  # a real call, while the last rank is still replaying
    except (RuntimeError, ValueError) as error:
        out["error"] = (type(error).__name__, str(error))
    out["replay collectives"] = counts["collectives"]
    out["after equal"] = bool(torch.equal(select(), recorded))  # a real call on every rank: the group works
    return out


def agreement_branches(rank: int, size: int, case: str) -> str:
    """Every rank takes the same branch of the agreement, decided by reduced values only:
    ``flags`` (rank 0 invalid, reporting invalid ranks first; the others valid with another
    fingerprint, comparing fingerprints first: the pairing that aborted gloo), ``points``
    (every rank valid, rank 0 at another agreement point), ``replays`` (rank 0 replayed a
    call the others did not). Returns this rank's error text."""
    from sparsecp.torch._agreement import REPLAYS, agree
    from sparsecp.torch._plans import empty_fingerprint

    group = dist.group.WORLD
    fingerprint = empty_fingerprint().add("setting", rank)
    error = ValueError("rank 0's own failure") if rank == 0 and case == "flags" else None
    what = "Indexer result exchange" if rank == 0 and case == "points" else "Indexer input exchange"
    if rank == 0 and case == "replays":
        REPLAYS.note("balanced_indexer_select:a call only rank 0 replayed")
    try:
        if case == "replays":
            sct.verify_replays(group)
        else:
            agree(group, torch.device("cpu"), error, fingerprint if case == "flags" else empty_fingerprint(), what,
                  invalid_first=rank == 0)
    except ValueError as raised:
        return str(raised)
    return "no error"
