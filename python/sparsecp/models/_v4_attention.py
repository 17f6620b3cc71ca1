"""The context-parallel forward of one ``DeepseekV4Attention`` layer.

Per rank, every document isolated as if run alone (SYSTEM.md, "A real model"):

1. queries and the shared K=V of this rank's rows, as the model computes them;
2. sliding window: own K=V rows plus the halo of earlier rows of the same document from lower
   ranks (``sliding_window_route`` + ``sequence_dispatch``; backward SUMs into the owners);
3. compressors (CSA/HCA): the layer input rows of the windows this rank owns, moved once
   (``CompressionLayout.compressor``), then the owned entries of the main compressor (and, for
   CSA, of the indexer's own compressor);
4. main bank: each document prefix this rank's rows see (``CompressionLayout.bank``);
5. CSA indexer: owners project ``q_residual`` (already computed for attention), merge weights
   and the compress-rotary rows; ``balanced_indexer_select`` moves them to workers, a selector
   built from the layer scores them against the whole Index K bank (all-gathered: workers score
   rows of any document) and returns int32 ids to the owners. In a recompute (activation
   checkpointing) the first forward's ids are replayed: no selection, no selection collective;
6. attention with sinks over each row's own keys only (gathered: its window, then HCA's causal
   prefix or CSA's selected ids; the model's eager path computes every pair and masks), the
   conjugate RoPE on the output and the grouped output projection;
7. optional indexer KL on the owner (``indexer_kl_loss_any_topk``): student = the indexer's own
   query, merge weights and Index K bank (gradients reach only indexer parameters: its inputs
   are detached), teacher = this attention's distribution over the selected keys plus its sink.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..torch import balanced_indexer_select, sequence_dispatch, sequence_gather
from ..torch.kl import indexer_kl_loss_any_topk
from ._v4_compress import owned_entries
from ._v4_selector import FusedSelector, ModelSelector

if TYPE_CHECKING:
    from ._v4_layout import BatchLayout, CompressionLayout
    from ._v4_state import ContextParallelState

__all__ = ["cp_attention_forward"]


def _in_recompute() -> bool:
    """True while autograd runs a backward pass: a layer's forward then is a recompute."""
    return torch._C._current_graph_task_id() != -1


def _dispatch(state: ContextParallelState, rows: torch.Tensor, route: Any) -> torch.Tensor:
    if state.size == 1:
        return rows
    state.stats.dispatch_bytes += route.sent_rows * rows[0].numel() * rows.element_size() if len(rows) else 0
    return sequence_dispatch(rows, 0, route, state.group)


def _whole_bank(state: ContextParallelState, entries: torch.Tensor, layout: CompressionLayout) -> torch.Tensor:
    """Every rank's owned entries in bank order (all-gather of padded shards; backward: SUM)."""
    if state.size == 1:
        return entries
    owners = np.asarray(layout.owners, dtype=np.int64)
    counts = np.diff(owners)
    widest = int(counts.max())
    if widest == 0:
        return entries
    padding = entries.new_zeros((widest - len(entries), entries.shape[1]))
    padded = torch.cat([entries, padding])  # always through cat: the same graph on every rank
    gathered = sequence_gather(padded.contiguous(), 0, state.group)
    index = np.concatenate([np.arange(q * widest, q * widest + c) for q, c in enumerate(counts)])
    state.stats.dispatch_bytes += (state.size - 1) * padded.numel() * padded.element_size()
    return gathered.index_select(0, torch.from_numpy(index).to(gathered.device))


def _select(attn: Any, state: ContextParallelState, batch: BatchLayout, layout: CompressionLayout,
            hidden: torch.Tensor, block: torch.Tensor, q_residual: torch.Tensor, position_ids: torch.Tensor,
            rope: Any, forward: int) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]]:
    """(ids [local rows, topk] int64, the whole Index K bank or None, the compress rotary)."""
    indexer = attn.compressor.indexer
    start = time.perf_counter()
    cos, sin = indexer.rotary_emb(hidden, position_ids=position_ids, layer_type=indexer.rope_layer_type)
    need_bank = not _in_recompute() or state.kl_coeff is not None
    bank = None
    if need_bank:
        with torch.set_grad_enabled(torch.is_grad_enabled() and state.kl_coeff is not None):
            entries = owned_entries(indexer, block.detach(), layout, indexer.head_dim, rope)
            bank = _whole_bank(state, entries, layout)
    key = (forward, batch.lengths)
    if _in_recompute():
        ids = state.recorded_ids(attn.layer_idx, key)
        state.stats.replays += 1
    else:
        assert bank is not None
        with torch.no_grad():  # selection only: a recompute, which replays, must save the same tensors
            weights = indexer.scorer.weights_proj(hidden).float() * indexer.scorer.weights_scaling
        if state.selector == "fused":
            selector: Any = FusedSelector(indexer, bank, state.rope_dim)
        else:
            selector = ModelSelector(indexer, bank, rope)
        ids = balanced_indexer_select(
            q_residual.detach(), weights.detach(), (cos, sin), state.clock.timed(selector), batch.lengths,
            layout.ratio, state.mode, state.group, state.block_size, state.zigzag_min_length,
            **state.strategy_params)[0].long()
        state.record_ids(attn.layer_idx, key, ids)
        state.stats.selections += 1
    state.stats.indexer_seconds += time.perf_counter() - start
    return ids, bank, (cos, sin)


def _attended_keys(batch: BatchLayout, window_rows: int, compressed_rows: int, layout: CompressionLayout | None,
                   ids: torch.Tensor | None, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per own row, the rows of ``[window block | bank block]`` it attends: ``(index, valid)``,
    each ``[local rows, window + compressed columns]``. Window columns: the last ``window`` block
    rows up to the row itself, valid from its document's start; compressed columns: CSA's selected
    ids, or for HCA every bank-block row, valid on the row's causal document prefix. Attention then
    reads only these keys (what the model's dense mask leaves), not the whole block."""
    begin, end = (torch.from_numpy(a).to(device) for a in batch.window_keys)
    columns = torch.arange(-batch.window + 1, 1, device=device)
    index = end[:, None] - 1 + columns[None, :]
    valid = index >= begin[:, None]
    if layout is not None:
        offset = layout.bank.global_start
        if ids is not None:  # CSA: the selected ids
            compressed = ids - offset
            seen = ids >= 0
        else:  # HCA: the causal prefix of the row's document
            keys = torch.arange(offset, offset + compressed_rows, device=device)
            vb, ve = (torch.from_numpy(a).to(device) for a in (layout.visible_begin, layout.visible_end))
            compressed = (keys - offset)[None, :].expand(batch.local, -1)
            seen = (keys[None, :] >= vb[:, None]) & (keys[None, :] < ve[:, None])
        index = torch.cat([index, compressed + window_rows], dim=1)
        valid = torch.cat([valid, seen], dim=1)
    return torch.where(valid, index, torch.zeros_like(index)), valid


def cp_attention_forward(attn: Any, state: ContextParallelState, hidden_states: torch.Tensor,
                         position_embeddings: Any, position_ids: torch.Tensor,
                         attention_mask: Any = None, past_key_values: Any = None,
                         **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``DeepseekV4Attention.forward`` under context parallelism (see the module docstring)."""
    if past_key_values is not None:
        raise ValueError("sparsecp context parallelism trains on packed batches: a KV cache (use_cache=True, "
                         "past_key_values) is not supported; generation is out of scope")
    batch = state.layout(kwargs.get("document_lengths"))
    rope = state.rope
    local, head_dim = hidden_states.shape[1], attn.head_dim
    cos, sin = position_embeddings[attn.rope_layer_type]

    q_residual = attn.q_a_norm(attn.q_a_proj(hidden_states))
    q = attn.q_b_proj(q_residual).view(1, local, -1, head_dim).transpose(1, 2)
    q = rope(attn.q_b_norm(q), cos, sin)  # [1, heads, local, head_dim]
    kv = attn.kv_norm(attn.kv_proj(hidden_states)).view(1, local, -1, head_dim).transpose(1, 2)
    kv = rope(kv, cos, sin)[0, 0]  # [local, head_dim]
    window = _dispatch(state, kv, batch.window_route)
    keys = window

    layout = ids = None
    compressed_rows = 0
    if attn.compressor is not None:
        compressor = attn.compressor
        layout = batch.compression(int(compressor.compress_rate), hasattr(compressor, "indexer"))
        block = _dispatch(state, hidden_states[0], layout.compressor)
        entries = owned_entries(compressor, block, layout, head_dim, rope)
        bank_block = _dispatch(state, entries, layout.bank)
        compressed_rows = bank_block.shape[0]
        keys = torch.cat([window, bank_block])
        if layout.overlap:
            ids, index_bank, index_rope = _select(attn, state, batch, layout, hidden_states, block, q_residual,
                                                  position_ids, rope, kwargs.get("sparsecp_forward", 0))
    index, valid = _attended_keys(batch, window.shape[0], compressed_rows, layout, ids, q.device)
    attended = keys[index]  # [local, columns, head_dim]
    mask = torch.zeros(valid.shape, dtype=q.dtype, device=q.device).masked_fill(~valid, float("-inf"))
    logits = torch.einsum("hld,lkd->hlk", q[0], attended) * attn.scaling + mask  # [heads, local, columns]
    sinks = attn.sinks.reshape(-1, 1, 1).expand(-1, local, -1)
    combined = torch.cat([logits, sinks.to(logits.dtype)], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1]
    probs = torch.nn.functional.dropout(probs, p=attn.attention_dropout if attn.training else 0.0,
                                        training=attn.training).to(keys.dtype)
    output = torch.einsum("hlk,lkd->hld", probs, attended)[None]  # [1, heads, local, head_dim]
    output = rope(output, cos, -sin).transpose(1, 2)  # [1, local, heads, head_dim]
    grouped = attn.o_a_proj(output.reshape(1, local, attn.config.o_groups, -1)).flatten(2)
    result = attn.o_b_proj(grouped)

    if ids is not None and state.kl_coeff is not None and torch.is_grad_enabled():
        assert layout is not None and index_bank is not None
        loss = _indexer_kl(attn, state, batch, layout, hidden_states, q_residual, q, keys[window.shape[0]:],
                           ids, index_bank, index_rope, rope)
        if not _in_recompute():
            state.kl_losses.append(loss)
    return result, None


def _indexer_kl(attn: Any, state: ContextParallelState, batch: BatchLayout, layout: CompressionLayout,
                hidden: torch.Tensor, q_residual: torch.Tensor, q: torch.Tensor, bank_block: torch.Tensor,
                ids: torch.Tensor, index_bank: torch.Tensor, index_rope: tuple[torch.Tensor, torch.Tensor],
                rope: Any) -> torch.Tensor:
    """This rank's share of the layer's indexer KL: ``coeff / S`` times its rows' losses."""
    indexer, local = attn.compressor.indexer, batch.local
    cos, sin = index_rope
    index_q = indexer.q_b_proj(q_residual.detach()).view(1, local, -1, indexer.head_dim).transpose(1, 2)
    index_q = rope(index_q, cos, sin).transpose(1, 2)  # [1, local, heads, head_dim]
    scorer = indexer.scorer
    merge = scorer.weights_proj(hidden.detach()) * (scorer.weights_scaling * scorer.softmax_scale)
    total = batch.boundaries[-1]
    assert state.kl_coeff is not None  # the caller computes the KL only when it is on
    if bank_block.shape[0] == 0:  # no row of this rank sees a key: a zero loss, still connected to
        # the gathered bank so that this rank's backward runs the same collectives as its peers'
        return (index_q.sum() + merge.sum() + index_bank.sum()) * 0
    return indexer_kl_loss_any_topk(
        index_q, index_bank[None], merge, q.detach(), bank_block.detach()[None], ids[None],
        attn.sinks.detach(), attention_scale=attn.scaling, loss_coeff=state.kl_coeff * local / total,
        main_key_offset=layout.bank.global_start)
