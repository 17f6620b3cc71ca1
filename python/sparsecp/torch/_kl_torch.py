"""Chunked pure-torch indexer KL loss with its gradients (any device).

The same math, validation and error texts as the fused C++ kernel
(``include/sparsecp/kernels/indexer_kl.hpp``; seed: hyper_parallel's
``shared_compressed_indexer_kl_loss``), written with torch ops only so that it runs on
any device. Like the seed's project, the gradients are computed in the forward pass; an
autograd function scales them by the incoming gradient in its backward.

Memory: the work is cut into chunks of ``query_chunk_size`` query rows; a chunk holds
``[C, T, Dm]`` gathered teacher keys, ``[C, T, D]`` student keys and ``[C, Hm, T]`` /
``[C, H, T]`` score tensors (C = chunk rows), i.e. what the unfused formulation needs,
bounded by the chunk size instead of the row count.

Precision: every tensor is computed in float32 (bf16 inputs are widened exactly), the
per-slot loss terms and the loss sum in float64; gradients are float32. When any float
input is float64, everything is computed in float64 and the gradients are float64 (what
``torch.autograd.gradcheck`` needs; the C++ kernel takes float32 and bfloat16 only).
"""

from __future__ import annotations

import math

import torch

# The smallest normal float32: the teacher's L1 denominator clamp and the "tiny" of
# log(max(p, tiny)), as in the C++ kernel.
FLT_MIN = float(torch.finfo(torch.float32).tiny)


def _validate(index_query, index_key, merge_weight, attention_query, compressed_key,
              topk_indices, sinks, attention_scale, loss_coeff, main_key_offset, seed_topk=True):
    """The C++ kernel's checks, with its texts (the seed's where it has them). ``seed_topk``
    False drops only the seed's TopK512 rule (its NPU op's limit), for callers whose top-k is
    the model's own (sparsecp.models: any ``index_topk``); every other check stays."""
    if index_query.ndim != 4:
        raise ValueError(f"Indexer KL index_query must have shape [B, S, H, D], got {list(index_query.shape)}")
    batch, rows, heads, head_dim = index_query.shape
    if heads < 1 or head_dim < 1:
        raise ValueError("Indexer KL index_query needs at least one head and one channel, "
                         f"got shape {list(index_query.shape)}")
    if index_key.ndim != 3 or index_key.shape[0] != batch or index_key.shape[2] != head_dim:
        raise ValueError(f"Indexer KL index_key must have shape [B, K, D] = [{batch}, K, {head_dim}] "
                         f"(B and D of index_query), got {list(index_key.shape)}")
    if tuple(merge_weight.shape) != (batch, rows, heads):
        raise ValueError(f"Indexer KL merge_weight must have shape [B, S, H] = [{batch}, {rows}, {heads}] "
                         f"(from index_query), got {list(merge_weight.shape)}")
    if topk_indices.ndim != 3 or tuple(topk_indices.shape[:2]) != (batch, rows):
        raise ValueError("Fused KL indices must have shape [B, Q, TopK] matching Indexer Q: "
                         "topk_indices and index_query must share batch/query dimensions (got "
                         f"topk_indices {list(topk_indices.shape)} and index_query {list(index_query.shape)})")
    if topk_indices.dtype not in (torch.int32, torch.int64):
        raise ValueError("Indexer KL topk_indices must be int32 or int64")
    topk = topk_indices.shape[2]
    if compressed_key.ndim != 3:
        raise ValueError(f"Indexer KL compressed_key must have shape [B, K, Dm], got {list(compressed_key.shape)}")
    keys, att_dim = compressed_key.shape[1], compressed_key.shape[2]
    if keys < 1 or (seed_topk and not min(512, keys) <= topk <= 512):
        raise ValueError("Fused KL requires ordinary TopK512 selections, allowing padding for a "
                         f"compact bank; got K={keys}, TopK={topk}")
    if compressed_key.shape[0] != batch or att_dim < 1:
        raise ValueError(f"Indexer KL compressed_key must have shape [B, K, Dm] with B = {batch} "
                         f"and Dm >= 1, got {list(compressed_key.shape)}")
    if attention_query.ndim != 4 or attention_query.shape[0] != batch or attention_query.shape[1] < 1 \
            or attention_query.shape[2] != rows or attention_query.shape[3] != att_dim:
        raise ValueError(f"Indexer KL attention_query must have shape [B, Hm, S, Dm] = [{batch}, Hm, "
                         f"{rows}, {att_dim}] (head-major; B, S of index_query, Dm of compressed_key, "
                         f"Hm >= 1), got {list(attention_query.shape)}")
    att_heads = attention_query.shape[1]
    if tuple(sinks.shape) != (att_heads,):
        raise ValueError(f"Indexer KL sinks must have shape [Hm] = [{att_heads}] (one logit per "
                         f"attention head), got {list(sinks.shape)}")
    if main_key_offset < 0:
        raise ValueError(f"Indexer KL main_key_offset must be non-negative, got {main_key_offset}")
    if index_key.shape[1] < main_key_offset + keys:
        raise ValueError(f"Indexer KL index_key has {index_key.shape[1]} rows, fewer than "
                         f"main_key_offset {main_key_offset} + the compact bank's K = {keys} "
                         "(compressed_key rows) that its view needs")
    for name, value in (("attention_scale", attention_scale), ("loss_coeff", loss_coeff)):
        if not math.isfinite(float(value)):
            raise ValueError(f"Indexer KL {name} must be finite, got {value}")
    if topk_indices.device != index_query.device:
        raise ValueError("Fused KL indices must share Indexer Q's device, got "
                         f"{topk_indices.device} and {index_query.device}")
    return batch, rows, keys


def _check_ids(topk_indices, main_key_offset, keys):
    """Every id is -1 or inside [main_key_offset, main_key_offset + K); names the first bad one."""
    ids = topk_indices.long()
    bad = (ids != -1) & ((ids < main_key_offset) | (ids >= main_key_offset + keys))
    if bool(bad.any()):
        b, t, j = (int(v) for v in bad.nonzero()[0])
        value = int(ids[b, t, j])
        high = main_key_offset + keys
        if main_key_offset == 0:
            raise ValueError(f"Indexer KL topk id {value} at [{b}, {t}, {j}] is outside the bank's "
                             f"keys [0, {high}) (use -1 for padding)")
        raise ValueError(f"Indexer KL topk id {value} at [{b}, {t}, {j}] is outside the compact "
                         "bank's keys [main_key_offset, main_key_offset + K) = "
                         f"[{main_key_offset}, {high}) (use -1 for padding)")


def kl_loss_and_grads_torch(index_query: torch.Tensor, index_key: torch.Tensor,
                            merge_weight: torch.Tensor, attention_query: torch.Tensor,
                            compressed_key: torch.Tensor, topk_indices: torch.Tensor,
                            sinks: torch.Tensor, attention_scale: float, loss_coeff: float,
                            main_key_offset: int = 0, query_chunk_size: int = 256, seed_topk: bool = True,
                            check_ids: bool = True):
    """Loss and gradients of the indexer's sparse KL (seed: shared_compressed_indexer_kl_loss).

    Args:
        index_query: ``[B, S, H, D]`` float32 or bfloat16 (or float64: see Precision).
        index_key: ``[B, Ki, D]``; rows ``[main_key_offset, main_key_offset + K)`` are the
            student's keys.
        merge_weight: ``[B, S, H]`` (already scaled by the caller).
        attention_query: ``[B, Hm, S, Dm]``, head-major.
        compressed_key: ``[B, K, Dm]``, the teacher's (compact) key bank.
        topk_indices: ``[B, S, T]`` int32 or int64, index_key rows, ``-1`` padded;
            ``min(512, K) <= T <= 512``.
        sinks: ``[Hm]`` attention-sink logits.
        attention_scale: scale of the teacher's logits ``qatt . Katt``.
        loss_coeff: the loss is ``loss_coeff / (B * S)`` times the sum of row losses.
        main_key_offset: compact bank offset (seed 000): ids are shifted down by it.
        query_chunk_size: query rows per chunk (bounds the intermediates).
        seed_topk: False accepts any ``T >= 1`` (see ``_validate``).
        check_ids: False skips the range check of the ids (a host read of them): for callers
            whose ids come from their own selection against these banks.

    Returns:
        ``(loss, grad_index_query, grad_index_key, grad_merge_weight)``: loss a float64
        scalar tensor, gradients float32 (float64 when a float input is float64) with the
        inputs' shapes, on the inputs' device.
    """
    batch, rows, keys = _validate(index_query, index_key, merge_weight, attention_query,
                                  compressed_key, topk_indices, sinks, attention_scale, loss_coeff,
                                  main_key_offset, seed_topk)
    if query_chunk_size < 1:
        raise ValueError(f"query_chunk_size must be positive, got {query_chunk_size}")
    device = index_query.device
    floats = (index_query, index_key, merge_weight, attention_query, compressed_key, sinks)
    compute = torch.float64 if any(t.dtype == torch.float64 for t in floats) else torch.float32
    grad_q = torch.zeros(index_query.shape, dtype=compute, device=device)
    grad_k = torch.zeros(index_key.shape, dtype=compute, device=device)
    grad_w = torch.zeros(merge_weight.shape, dtype=compute, device=device)
    loss = torch.zeros((), dtype=torch.float64, device=device)
    if loss_coeff == 0 or batch * rows == 0:
        return loss, grad_q, grad_k, grad_w
    if check_ids:
        _check_ids(topk_indices, main_key_offset, keys)
    coeff = float(loss_coeff) / (batch * rows)
    sink_logits = sinks.to(compute)
    for b in range(batch):
        student_keys = index_key[b, main_key_offset:main_key_offset + keys].to(compute)  # [K, D]
        teacher_keys = compressed_key[b].to(compute)  # [K, Dm]
        grad_keys = grad_k[b, main_key_offset:main_key_offset + keys]  # a view: [K, D]
        for s0 in range(0, rows, query_chunk_size):
            s1 = min(rows, s0 + query_chunk_size)
            ids = topk_indices[b, s0:s1].long()  # [C, T]
            valid = ids != -1
            local = torch.where(valid, ids - main_key_offset, torch.zeros_like(ids))
            row_valid = valid.any(-1)  # [C]

            # Teacher: per-head softmax over the selected keys plus the sink column.
            qa = attention_query[b, :, s0:s1].to(compute)  # [Hm, C, Dm]
            # Padding slots gather key 0 as a placeholder: zero it (in place, on the fresh
            # gathered copy), or a NaN/Inf in key 0 would leak into every padded row
            # through 0 * NaN (the C++ kernels never read padding).
            selected_teacher = teacher_keys[local].masked_fill_(~valid[..., None], 0)  # [C, T, Dm]
            logits = torch.einsum("hcd,ctd->cht", qa, selected_teacher) * attention_scale
            logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
            sink = sink_logits[None, :, None].expand(logits.shape[0], -1, 1)
            probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
            mass = probs.sum(1)  # [C, T]
            p = (mass / mass.sum(-1, keepdim=True).clamp_min(FLT_MIN)).double()

            # Student: weighted ReLU scores over the same slots.
            q = index_query[b, s0:s1].to(compute)  # [C, H, D]
            w = merge_weight[b, s0:s1].to(compute)  # [C, H]
            selected_student = student_keys[local].masked_fill_(~valid[..., None], 0)  # [C, T, D]
            z = torch.einsum("chd,ctd->cht", q, selected_student)  # [C, H, T]
            relu = z.clamp_min(0)
            scores = torch.einsum("ch,cht->ct", w, relu).double()
            # Rows without a valid slot get a uniform dummy (masked out below).
            scores = torch.where(valid, scores, torch.full_like(scores, float("-inf")))
            scores = torch.where(row_valid[:, None], scores, torch.zeros_like(scores))
            log_pred = torch.log_softmax(scores, dim=-1)

            terms = p * (torch.log(p.clamp_min(FLT_MIN)) - log_pred)
            terms = torch.where(valid, terms, torch.zeros_like(terms))
            loss = loss + terms.sum()

            g = ((log_pred.exp() - p) * coeff).to(compute)
            g = torch.where(valid, g, torch.zeros_like(g))  # [C, T]
            dz = g[:, None, :] * w[:, :, None] * (z > 0)  # [C, H, T]
            grad_q[b, s0:s1] = torch.einsum("cht,ctd->chd", dz, selected_student)
            grad_w[b, s0:s1] = torch.einsum("ct,cht->ch", g, relu)
            contributions = torch.einsum("cht,chd->ctd", dz, q)  # [C, T, D]
            grad_keys.index_add_(0, local[valid], contributions[valid])
    return loss * coeff, grad_q, grad_k, grad_w
