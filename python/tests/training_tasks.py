"""Rank tasks for test_cp_training.py (and V3.2's FSDP2 test): DeepSeek-V4 under CP trained the way large models are
(FSDP2 over a dp x cp mesh, user labels with -100, padding, gradient accumulation), the
one-process oracle they must equal, the indexer's recall of the attention's own top-k, and bad
inputs.

The oracle runs every document of the global batch (every dp rank's packed row) alone through
the unmodified transformers model, one process, and divides the summed cross entropy by the
number of valid labels of the whole optimizer step: the gradient the contract promises.
"""
from __future__ import annotations

import copy
from typing import Any

import model_tasks
import torch
import torch.distributed as dist
import v4_tasks

IGNORE = -100
# Two dp rows of documents; each row is padded (pad_to_multiple) to a multiple of PAD_TO, and
# each document's first PROMPT tokens are masked (-100), as supervised fine-tuning masks prompts.
ROWS = ((13, 8, 11), (7, 17, 5))
PAD_TO = 8
PROMPT = 3


def batch_row(row: int, seed: int = 0, kind: str = "v4") -> tuple[torch.Tensor, tuple[int, ...], torch.Tensor]:
    """dp row ``row``'s packed ids [1, S], lengths and labels (-100 on each document's prompt),
    padded to a multiple of PAD_TO with a document of ignored labels (``kind``: model_tasks')."""
    tasks, cp_v4 = model_tasks.model_of(kind)
    lengths = ROWS[row % len(ROWS)]
    input_ids = tasks.packed_ids(lengths, seed=11 + 7 * row + 100 * seed)
    labels = input_ids.clone()
    start = 0
    for length in lengths:
        labels[0, start:start + PROMPT] = IGNORE
        start += length
    return cp_v4.pad_to_multiple(input_ids, lengths, PAD_TO, labels=labels)


def oracle_steps(model: Any, rows: list[tuple[torch.Tensor, tuple[int, ...], torch.Tensor]], steps: int,
                 lr: float) -> dict[str, Any]:
    """Every document of ``rows`` alone through the unmodified model, the cross entropy summed
    over their valid next-token labels and divided by their count; ``steps`` AdamW steps.
    Returns the loss of each step and the parameters after each step."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    documents = []
    for input_ids, lengths, labels in rows:
        start = 0
        for length in lengths:
            documents.append((input_ids[:, start:start + length], labels[0, start + 1:start + length]))
            start += length
    count = sum(int((targets != IGNORE).sum()) for _, targets in documents)
    losses, params = [], []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for ids, targets in documents:
            if not (targets != IGNORE).any():
                continue  # nothing learned here (padding, or a document that is all prompt)
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1]
            loss = torch.nn.functional.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum") / count
            loss.backward()
            total += float(loss.detach())
        losses.append(total)
        optimizer.step()
        params.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return {"losses": losses, "params": params, "count": count}


def fsdp_train(rank: int, size: int, dp: int, steps: int, micro_batches: int, lr: float,
               checkpointing: bool = False, kl: float | None = None, replicated: bool = False,
               kind: str = "v4") -> dict[str, Any]:
    """The issue's contract on a dp x cp mesh: context_parallel over mesh['cp'], fully_shard of
    every layer and the model over the flattened mesh, shard_batch / shard_labels with the user's
    labels, causal_lm_loss over the flattened mesh, FSDP2's default reduction, AdamW.

    With ``micro_batches`` = 2 each dp rank's row is split into two micro-batches (its documents
    halved), whose losses share ``num_items_in_batch`` (the valid labels of both, every rank).
    With ``kl`` the indexer KL joins the loss, times the CP size (``indexer_kl_loss`` is this
    rank's share of its row's KL, shares summed over the CP ranks; FSDP2 averages over dp x cp).
    ``replicated``: no fully_shard, the same loss, gradients averaged over the flattened mesh by
    ``all_reduce_gradients(..., average=True)`` (DDP's convention, mathematically FSDP2's).
    Returns the global mean loss per step and (every rank) the full parameters after each step.
    ``kind``: the model (model_tasks')."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    tasks, cp_v4 = model_tasks.model_of(kind)
    cp = size // dp
    mesh = init_device_mesh("cpu", (dp, cp), mesh_dim_names=("dp", "cp"))
    flat = mesh["dp", "cp"]._flatten()
    model = tasks.tiny_model(torch.float64)
    if checkpointing:
        model.activation_checkpointing_enable()
    model.train()
    cp_v4.context_parallel(model, mesh["cp"], "spill", indexer_kl_coeff=kl)
    if not replicated:
        for layer in model.model.layers:
            fully_shard(layer, mesh=flat)
        fully_shard(model, mesh=flat)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    input_ids, lengths, labels = batch_row(mesh["dp"].get_local_rank(), kind=kind)
    if micro_batches == 1:
        micro = [(input_ids, lengths, labels)]
    else:  # the documents split in two packed micro-batches, each padded to a multiple of cp
        half = len(lengths) // 2
        cut = sum(lengths[:half])
        micro = [cp_v4.pad_to_multiple(input_ids[:, :cut], lengths[:half], mesh["cp"], labels=labels[:, :cut]),
                 cp_v4.pad_to_multiple(input_ids[:, cut:], lengths[half:], mesh["cp"], labels=labels[:, cut:])]
    shards = [(*cp_v4.shard_batch(ids, lens, mesh["cp"]), cp_v4.shard_labels(ids, lens, mesh["cp"], labels=lab),
               lens) for ids, lens, lab in micro]
    total = None
    if micro_batches > 1:  # the valid labels of the whole optimizer step, counted before its first backward
        total = sum(cp_v4.count_valid_tokens(shard_labels, flat) for _, _, shard_labels, _ in shards)
    losses, params = [], []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        reported = torch.zeros((), dtype=torch.float64)
        for ids, positions, shard_labels, lens in shards:
            logits = model(input_ids=ids, position_ids=positions, document_lengths=lens).logits
            loss = cp_v4.causal_lm_loss(logits, shard_labels, lens, group=flat, num_items_in_batch=total)
            reported += loss.detach()
            if kl is not None:
                indexer_kl = cp_v4.indexer_kl_loss(model, group=flat)  # scaled by the CP size for the mean
                assert indexer_kl is not None
                loss = loss + indexer_kl
            loss.backward()
        if replicated:
            cp_v4.all_reduce_gradients(model, flat, average=True)
        dist.all_reduce(reported, group=flat.get_group())
        losses.append(float(reported) / flat.size())  # the mean over flat of the returned values
        optimizer.step()
        params.append({n: (p if replicated else p.full_tensor()).detach().clone() for n, p in model.named_parameters()})
    return {"losses": losses, "params": params, "sharded": type(next(model.parameters())).__name__}


def fsdp_oracle(steps: int, lr: float, dp: int, kind: str = "v4") -> dict[str, Any]:
    """The one-process run matching ``fsdp_train`` (every dp row's documents)."""
    tasks, _ = model_tasks.model_of(kind)
    return oracle_steps(tasks.tiny_model(torch.float64), [batch_row(row, kind=kind) for row in range(dp)], steps, lr)


def bad_training_input(rank: int, size: int, case: str, kind: str = "v4") -> str:
    """One bad input of the training API on every rank, with ``kind``'s model (model_tasks'); this
    rank's error text ('' if none)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    tasks, cp_v4 = model_tasks.model_of(kind)
    mesh = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("dp", "cp"))
    model = tasks.tiny_model(torch.float64)
    input_ids, lengths, labels = batch_row(0, kind=kind)
    try:
        if case == "labels shape":
            cp_v4.shard_labels(input_ids, lengths, mesh["cp"], labels=labels[:, :-1])
        elif case == "2-D mesh":
            cp_v4.context_parallel(model, mesh, "spill")
        elif case == "2-D mesh shard_batch":
            cp_v4.shard_batch(input_ids, lengths, mesh)
        elif case == "fsdp first":
            fully_shard(model, mesh=mesh["dp", "cp"]._flatten())
            cp_v4.context_parallel(model, mesh["cp"], "spill")
        elif case == "loss labels":
            cp_v4.causal_lm_loss(torch.zeros(1, 5, 7), torch.zeros(1, 4, dtype=torch.long), lengths,
                                 group=mesh["cp"])
        elif case == "all_reduce after fsdp":
            cp_v4.context_parallel(model, mesh["cp"], "spill")
            fully_shard(model, mesh=mesh["dp", "cp"]._flatten())
            cp_v4.all_reduce_gradients(model, mesh["cp"])
        elif case == "legacy count with masks":  # counted over the CP group context_parallel was given
            cp_v4.context_parallel(model, mesh["cp"], "spill")
            ids, positions = cp_v4.shard_batch(input_ids, lengths, mesh["cp"])
            shard = cp_v4.shard_labels(input_ids, lengths, mesh["cp"], labels=labels)
            logits = torch.zeros(1, shard.shape[1], tasks.VOCAB)
            cp_v4.causal_lm_loss(logits, shard, lengths)
        elif case.startswith("num_items_in_batch") or case == "float labels":
            shard = cp_v4.shard_labels(input_ids, lengths, mesh["cp"], labels=labels)
            logits = torch.zeros(1, shard.shape[1], tasks.VOCAB)
            count = {"num_items_in_batch 0": 0, "num_items_in_batch -4 tensor": torch.tensor(-4),
                     "num_items_in_batch a string": "12"}.get(case)
            cp_v4.causal_lm_loss(logits, shard.double() if case == "float labels" else shard, lengths,
                                 group=mesh["dp", "cp"]._flatten(), num_items_in_batch=count)
        elif case in ("fsdp loss without group", "fsdp kl without group"):
            kl = "kl" in case
            cp_v4.context_parallel(model, mesh["cp"], "spill", indexer_kl_coeff=0.1 if kl else None, calibrate=False)
            flat = mesh["dp", "cp"]._flatten()
            for layer in model.model.layers:
                fully_shard(layer, mesh=flat)
            fully_shard(model, mesh=flat)
            ids, positions = cp_v4.shard_batch(input_ids, lengths, mesh["cp"])
            logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
            shard = cp_v4.shard_labels(input_ids, lengths, mesh["cp"], labels=labels)
            assert cp_v4.causal_lm_loss(logits, shard, lengths, group=flat) is not None  # with group=: fine
            if kl:
                cp_v4.indexer_kl_loss(model)
            else:
                cp_v4.causal_lm_loss(logits, shard, lengths, num_items_in_batch=100)
        elif case == "labels not shifted":  # the shard of the input ids as its labels
            cp_v4.context_parallel(model, mesh["cp"], "spill", calibrate=False)
            ids, positions = cp_v4.shard_batch(input_ids, lengths, mesh["cp"])
            logits = torch.zeros(1, ids.shape[1], tasks.VOCAB)
            cp_v4.causal_lm_loss(logits, ids, lengths, group=mesh["dp", "cp"]._flatten())
        elif case == "flat mesh as the CP group":  # each dp row's ranks hold another batch
            flat = mesh["dp", "cp"]._flatten()
            cp_v4.context_parallel(model, flat, "spill", calibrate=False)
            row_ids, row_lengths, _ = batch_row(dist.get_rank() // (size // 2), kind=kind)
            ids, positions = cp_v4.shard_batch(row_ids, row_lengths, flat)
            model(input_ids=ids, position_ids=positions, document_lengths=row_lengths)
        elif case.startswith("pad_to_multiple"):
            multiple = {"pad_to_multiple a tensor": torch.tensor(4), "pad_to_multiple a float": 4.0,
                        "pad_to_multiple a bool": True}[case]
            cp_v4.pad_to_multiple(input_ids, lengths, multiple)
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return ""


LABEL_LENGTHS = (13, 17, 11, 7)  # 2 ranks of 24 rows: rank 0 holds 1 document end, rank 1 holds 3


def rank_local_labels(rank: int, size: int, case: str, form: str, kind: str = "v4") -> str:
    """``causal_lm_loss`` on labels that are wrong on one rank only (or masked over both, each
    rank's own count within the old per-shard bound), then a collective as the next step's would
    be: this rank's error text ('' if the loss raised nowhere)."""
    tasks, cp_v4 = model_tasks.model_of(kind)
    lengths = LABEL_LENGTHS
    input_ids = tasks.packed_ids(lengths)
    labels = cp_v4.shard_labels(input_ids, lengths).clone()
    if case == "-1 on rank 1" and rank == 1:
        labels[0, 5] = -1
    elif case == "vocab on rank 0" and rank == 0:
        labels[0, 3], labels[0, 9] = tasks.VOCAB, tasks.VOCAB + 4
    elif case == "masks on both ranks":  # 4 more in all: 3 on rank 0, 1 on rank 1, each shard masking 4 <= 4 ends
        labels[0, 1:4 if rank == 0 else 2] = IGNORE
    elif case == "masks on rank 0" and rank == 0:  # 4 more on rank 0 only: its old per-shard check fired
        labels[0, 1:5] = IGNORE
    logits = torch.zeros(1, labels.shape[1], tasks.VOCAB, dtype=torch.float64, requires_grad=True)
    kwargs: dict[str, Any] = {"legacy": {}, "group": {"group": dist.group.WORLD},
                              "num_items": {"num_items_in_batch": 40}}[form]
    try:
        loss = cp_v4.causal_lm_loss(logits, labels, lengths, **kwargs)
        loss.backward()
    except (IndexError, ValueError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    dist.all_reduce(logits.grad)  # the next collective (the gradients' all-reduce)
    return ""


def int_widths(rank: int, size: int) -> dict[str, Any]:
    """One CP forward and loss from int32 input_ids (shard_labels keeps their dtype) and from
    int64 ones, padded by a numpy integer multiple; the losses and logits of both."""
    import numpy as np

    from sparsecp.models import deepseek_v4 as cp_v4

    model = v4_tasks.tiny_model(torch.float64)
    cp_v4.context_parallel(model, None, "spill")
    out = {}
    for dtype in (torch.int32, torch.int64):
        input_ids, lengths, _ = cp_v4.pad_to_multiple(v4_tasks.packed_ids((13, 17, 11)).to(dtype), (13, 17, 11),
                                                      np.int64(2 * size))
        ids, positions = cp_v4.shard_batch(input_ids, lengths)
        logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
        labels = cp_v4.shard_labels(input_ids, lengths)
        loss = cp_v4.causal_lm_loss(logits, labels, group=None, num_items_in_batch=np.int64(sum(lengths) - 4))
        out[str(dtype)] = {"lengths": lengths, "labels dtype": str(labels.dtype), "loss": float(loss.detach()),
                           "logits": logits.detach()}
    return out


def router_aux(rank: int, size: int, lengths: tuple[int, ...], inner: bool = False) -> dict[str, Any]:
    """out.aux_loss of the CP model (output_router_logits=True) and its router gradient,
    gradients averaged over the CP ranks (what FSDP2 over dp x cp does with dp = 1). ``inner``:
    ``context_parallel(model.model)``, the outer CausalLM left as it is (its aux_loss, and
    router_aux_loss given either module, are also returned)."""
    from sparsecp.models import deepseek_v4 as cp_v4

    model = v4_tasks.tiny_model(torch.float64)
    cp_v4.context_parallel(model.model if inner else model, None, "spill")
    input_ids = v4_tasks.packed_ids(lengths)
    ids, positions = cp_v4.shard_batch(input_ids, lengths)
    out = model(input_ids=ids, position_ids=positions, document_lengths=lengths, output_router_logits=True)
    aux = cp_v4.router_aux_loss(out, model.model if inner else model)
    seen = {"out.aux_loss": float(out.aux_loss.detach()),
            "router_aux_loss(out, model)": float(cp_v4.router_aux_loss(out, model).detach())}
    aux.backward()
    cp_v4.all_reduce_gradients(model, average=True)
    return {**seen, "aux": float(aux.detach()), "grads": {n: p.grad.clone() for n, p in model.named_parameters()
                                                          if n.endswith("mlp.gate.weight")}}


def router_aux_oracle(lengths: tuple[int, ...]) -> dict[str, Any]:
    """transformers' load_balancing_loss_func on the router logits of every document run alone,
    laid end to end (the whole packed row, each document isolated), and its gate gradients."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import load_balancing_loss_func

    model = v4_tasks.tiny_model(torch.float64)
    input_ids = v4_tasks.packed_ids(lengths)
    per_layer: list[list[torch.Tensor]] = []
    start = 0
    for length in lengths:
        out = model(input_ids=input_ids[:, start:start + length], use_cache=False, output_router_logits=True)
        start += length
        for layer, logits in enumerate(out.router_logits):
            if len(per_layer) <= layer:
                per_layer.append([])
            per_layer[layer].append(logits)
    config = model.config
    aux = load_balancing_loss_func(tuple(torch.cat(layer) for layer in per_layer), config.num_local_experts,
                                   config.num_experts_per_tok)
    aux.backward()
    return {"aux": float(aux.detach()), "grads": {n: p.grad.clone() for n, p in model.named_parameters()
                                                  if n.endswith("mlp.gate.weight")}}


# ----------------------------------------------------------------------------------------------
# the indexer learns


KL_LENGTHS = (64, 48)


def attention_recall(model: Any, input_ids: torch.Tensor, lengths: tuple[int, ...]) -> float:
    """Mean over CSA layers and rows of the share of the attention's own top-k keys that the
    indexer selects, on the unmodified model run one document at a time.

    The attention's own top-k of row t: the ``index_topk`` visible compressed keys (the causal
    prefix ``(pos + 1) // ratio`` of its document) with the largest attention mass, the main
    attention's softmax over every visible key and its sink, summed over heads: what the row
    would attend most if it saw every key. Rows that see no more than ``index_topk`` keys are
    left out (the indexer then selects them all)."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import apply_rotary_pos_emb as rope

    model = copy.deepcopy(model)
    hits, rows = 0, 0
    topk = int(model.config.index_topk)
    documents = model_tasks.attention_inputs_per_document(model, input_ids, lengths, model_tasks.is_csa)
    for length, index, hidden, position_ids, embeddings in documents:
        attention = model.model.layers[index].self_attn
        compressor, indexer = attention.compressor, attention.compressor.indexer
        cos, sin = embeddings["compress"]
        q_residual = attention.q_a_norm(attention.q_a_proj(hidden))
        q = attention.q_b_proj(q_residual).view(1, length, -1, attention.head_dim).transpose(1, 2)
        q = rope(attention.q_b_norm(q), cos, sin)[0]  # [H, S, D]
        bank = compressor(hidden, q_residual, position_ids, None, index)[0][0, 0]  # [T, D]
        selected = indexer(hidden, q_residual, position_ids, None, index)[0]  # [S, k]
        ratio = int(compressor.compress_rate)
        for t in range(length):
            visible = (t + 1) // ratio
            if visible <= topk:
                continue
            logits = torch.cat([q[:, t] @ bank[:visible].T * attention.scaling,
                                attention.sinks[:, None]], dim=1)
            mass = torch.softmax(logits, dim=1)[:, :-1].sum(0)
            best = set(torch.topk(mass, topk).indices.tolist())
            hits += len(best & {int(s) for s in selected[t].tolist() if s >= 0})
            rows += 1
    return hits / max(rows * topk, 1)


def kl_training(rank: int, size: int, coeff: float, train_kl: bool, steps: int, lr: float) -> dict[str, Any]:
    """``steps`` AdamW steps of the tiny model under CP on one fixed batch, the loss the LM
    loss plus (``train_kl``) the indexer KL at ``coeff``; the KL is measured in both runs.
    Returns the KL of each step's forward (summed over ranks) and the trained parameters."""
    from sparsecp.models import deepseek_v4 as cp_v4

    model = v4_tasks.tiny_model(torch.float64)
    model.train()
    cp_v4.context_parallel(model, None, "spill", indexer_kl_coeff=coeff)
    input_ids = v4_tasks.packed_ids(KL_LENGTHS)
    ids, positions = cp_v4.shard_batch(input_ids, KL_LENGTHS)
    labels = cp_v4.shard_labels(input_ids, KL_LENGTHS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    kls = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, position_ids=positions, document_lengths=KL_LENGTHS).logits
        loss = cp_v4.causal_lm_loss(logits, labels, group=None, num_items_in_batch=sum(KL_LENGTHS) - 2)
        kl = cp_v4.indexer_kl_loss(model)
        assert kl is not None
        (loss + kl if train_kl else loss).backward()
        cp_v4.all_reduce_gradients(model)
        measured = kl.detach().clone()
        dist.all_reduce(measured)
        kls.append(float(measured))
        optimizer.step()
    return {"kls": kls, "state": {n: p.detach().clone() for n, p in model.named_parameters()}}


def reduce_gradients(rank: int, size: int, average: bool, bucket_bytes: int) -> dict[str, torch.Tensor]:
    """all_reduce_gradients on a small replicated model whose gradients depend on the rank (one
    parameter left without a gradient on odd ranks); returns the reduced gradients."""
    from sparsecp.models import deepseek_v4 as cp_v4

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3), torch.nn.Linear(3, 2))
    x = torch.full((4, 5), float(rank + 1))
    out = model[1](model[0](x)) if rank % 2 else model(x)  # odd ranks leave model[2] without a gradient
    out.sum().backward()
    cp_v4.all_reduce_gradients(model, average=average, bucket_bytes=bucket_bytes)
    return {n: p.grad.clone() for n, p in model.named_parameters()}
