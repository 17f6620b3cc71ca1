"""The context-parallel forward of one ``DeepseekV4Attention`` layer.

Per rank, every document isolated as if run alone (SYSTEM.md, "A real model"), in memory that
grows with the rank's own rows only and with no host round trip: every table this layer reads was
planned on the host and moved to the device once per batch (``BatchLayout.on``), and the batch was
agreed across ranks once, in the model's forward, so the collectives here run unchecked.

1. queries and the shared K=V of this rank's rows, as the model computes them;
2. sliding window: own K=V rows plus the halo of earlier rows of the same document from lower
   ranks (``gather_rows``; backward SUMs into the owners);
3. compressors (CSA/HCA): the layer input rows of the windows this rank owns, moved once
   (``CompressionLayout.compressor``), then the owned entries of the main compressor (and, for
   CSA, of the indexer's own compressor);
4. main bank: each document prefix this rank's rows see (``CompressionLayout.bank``);
5. CSA indexer: owners project ``q_residual`` (already computed for attention), merge weights
   and the compress-rotary rows; the selection route moves them to workers, a selector built
   from the layer scores them against the Index K bank rows the worker's segments can see
   (``BatchLayout.index_bank``: never the whole bank) and returns int32 ids to the owners. In a
   recompute (activation checkpointing) the first forward's ids are replayed: no selection, no
   selection collective;
6. attention with sinks over each row's own keys only (its window, then HCA's causal prefix or
   CSA's selected ids) through ``sparsecp.torch.sparse_attention`` (the C++ kernel on CPU, the
   chunked torch path elsewhere, or the state's ``attention_backend``: the FlashAttention recipe,
   scores recomputed in backward), the conjugate RoPE on the output and the grouped output
   projection;
7. optional indexer KL on the owner (``indexer_kl_loss_any_topk``): student = the indexer's own
   query, merge weights and Index K bank (gradients reach only indexer parameters: its inputs
   are detached), teacher = this attention's distribution over the selected keys plus its sink.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...torch.kl import indexer_kl_loss_any_topk
from .._cp.forward import FORWARD_KWARG, in_recompute
from .._cp.select import BankView, select_or_replay
from ._compress import owned_entries
from ._selector import FusedSelector, ModelSelector

if TYPE_CHECKING:
    from .._cp.forward import ForwardContext
    from .._cp.state import ContextParallelState
    from ._layout import DeviceCompression, DeviceLayout

__all__ = ["cp_attention_forward"]


def _select(attn: Any, state: ContextParallelState, context: ForwardContext, tables: DeviceCompression,
            hidden: torch.Tensor, block: torch.Tensor, q_residual: torch.Tensor, position_ids: torch.Tensor,
            rope: Any) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]]:
    """(ids [local rows, topk] int64 bank rows, the gathered Index K rows or None, the compress rotary)."""
    indexer = attn.compressor.indexer
    cos, sin = indexer.rotary_emb(hidden, position_ids=position_ids, layer_type=indexer.rope_layer_type)

    def inputs() -> tuple[torch.Tensor, ...]:
        weights = indexer.scorer.weights_proj(hidden).float() * indexer.scorer.weights_scaling
        return q_residual.detach(), weights, cos, sin

    def selector(view: BankView) -> Any:
        if state.selector == "fused":
            return FusedSelector(indexer, view, state.adapter.rope_dim)
        return ModelSelector(indexer, view, rope)

    ids, bank = select_or_replay(state, context, attn.layer_idx, tables,
                                 lambda: owned_entries(indexer, block.detach(), tables, indexer.head_dim, rope),
                                 inputs, selector, int(indexer.index_topk))
    return ids, bank, (cos, sin)


def _window_columns(layout: DeviceLayout, start: int, stop: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [start, stop)'s window columns: the last ``window`` window-block rows up to the row
    itself, valid from its document's start."""
    begin, end = layout.window_begin[start:stop], layout.window_end[start:stop]
    columns = torch.arange(-window + 1, 1, device=begin.device)
    index = end[:, None] - 1 + columns[None, :]
    return index, index >= begin[:, None]


def _indices(layout: DeviceLayout, tables: DeviceCompression | None, ids: torch.Tensor | None, window: int,
             window_rows: int) -> torch.Tensor:
    """Per own row, the rows of ``[window block | bank block]`` it attends, int32 with -1 for
    none (``sparse_attention``'s ``indices``): its window; then CSA's selected ids, or for HCA
    its causal document prefix (at most ``widest`` bank rows, which the host layout knows)."""
    index, valid = _window_columns(layout, 0, layout.window_begin.shape[0], window)
    if tables is not None:
        if ids is not None:  # CSA: the selected ids
            seen = ids >= 0
            compressed = ids - tables.layout.bank_start
        else:  # HCA: the row's causal prefix of its document's bank rows
            begin, end = tables.visible_begin, tables.visible_end
            compressed = begin[:, None] + torch.arange(tables.layout.widest, device=begin.device)[None, :]
            seen = compressed < end[:, None]
        index = torch.cat([index, compressed + window_rows], dim=1)
        valid = torch.cat([valid, seen], dim=1)
    return torch.where(valid, index, torch.full_like(index, -1)).to(torch.int32)


def cp_attention_forward(attn: Any, state: ContextParallelState, hidden_states: torch.Tensor,
                         position_embeddings: Any, position_ids: torch.Tensor,
                         attention_mask: Any = None, past_key_values: Any = None,
                         **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``DeepseekV4Attention.forward`` under context parallelism (see the module docstring)."""
    if past_key_values is not None:
        raise ValueError("sparsecp context parallelism trains on packed batches: a KV cache (use_cache=True, "
                         "past_key_values) is not supported; generation is out of scope")
    context = state.context(kwargs.get(FORWARD_KWARG))
    layout = context.layout
    batch = layout.batch
    rope = state.adapter.rope
    local, head_dim = hidden_states.shape[1], attn.head_dim
    cos, sin = position_embeddings[attn.rope_layer_type]
    if attn.training and attn.attention_dropout > 0:
        raise ValueError(f"attention_dropout={attn.attention_dropout} is not supported under sparsecp context "
                         "parallelism (the attention recomputes its probabilities in backward); set it to 0")

    q_residual = attn.q_a_norm(attn.q_a_proj(hidden_states))
    q = attn.q_b_proj(q_residual).view(1, local, -1, head_dim).transpose(1, 2)
    q = rope(attn.q_b_norm(q), cos, sin)  # [1, heads, local, head_dim]
    kv = attn.kv_norm(attn.kv_proj(hidden_states)).view(1, local, -1, head_dim).transpose(1, 2)
    kv = rope(kv, cos, sin)[0, 0]  # [local, head_dim]
    window = state.gather(kv, layout.window, context)
    keys = window

    tables = ids = None
    index_bank = index_rope = None
    if attn.compressor is not None:
        compressor = attn.compressor
        tables = layout.compressions[(int(compressor.compress_rate), hasattr(compressor, "indexer"))]
        block = state.gather(hidden_states[0], tables.compressor, context)
        entries = owned_entries(compressor, block, tables, head_dim, rope)
        bank_block = state.gather(entries, tables.bank, context)
        keys = torch.cat([window, bank_block])
        if tables.layout.overlap:
            ids, index_bank, index_rope = _select(attn, state, context, tables, hidden_states, block, q_residual,
                                                  position_ids, rope)
    indices = _indices(layout, tables, ids, batch.window, window.shape[0])
    output = state.attend(q[0].transpose(0, 1), keys, indices, attn.scaling, sinks=attn.sinks)
    output = output.transpose(0, 1)[None]  # [1, heads, local, head_dim]
    output = rope(output, cos, -sin).transpose(1, 2)  # [1, local, heads, head_dim]
    grouped = attn.o_a_proj(output.reshape(1, local, attn.config.o_groups, -1)).flatten(2)
    result = attn.o_b_proj(grouped)

    if ids is not None and state.kl_coeff is not None and torch.is_grad_enabled():
        assert tables is not None and index_bank is not None and index_rope is not None
        loss = _indexer_kl(attn, state, context, tables, hidden_states, q_residual, q, keys[window.shape[0]:],
                           ids, index_bank, index_rope, rope)
        if not in_recompute():
            context.add_kl(loss)
    return result, None


def _indexer_kl(attn: Any, state: ContextParallelState, context: ForwardContext, tables: DeviceCompression,
                hidden: torch.Tensor, q_residual: torch.Tensor, q: torch.Tensor, bank_block: torch.Tensor,
                ids: torch.Tensor, index_bank: torch.Tensor, index_rope: tuple[torch.Tensor, torch.Tensor],
                rope: Any) -> torch.Tensor:
    """This rank's share of the layer's indexer KL: ``coeff / S`` times its rows' losses (``S``
    and the rows without the padding document's, when the forward names one)."""
    batch = context.layout.batch
    indexer, local = attn.compressor.indexer, batch.local
    cos, sin = index_rope
    index_q = indexer.q_b_proj(q_residual.detach()).view(1, local, -1, indexer.head_dim).transpose(1, 2)
    index_q = rope(index_q, cos, sin).transpose(1, 2)  # [1, local, heads, head_dim]
    scorer = indexer.scorer
    merge = scorer.weights_proj(hidden.detach()) * (scorer.weights_scaling * scorer.softmax_scale)
    total = context.kl_tokens
    assert state.kl_coeff is not None  # the caller computes the KL only when it is on
    if bank_block.shape[0] == 0:  # no row of this rank sees a key: a zero loss, still connected to
        # the gathered bank so that this rank's backward runs the same collectives as its peers'
        return (index_q.sum() + merge.sum() + index_bank.sum()) * 0
    # The student's keys: the Index K rows of this rank's own document prefixes, which the KL
    # gather holds contiguously (the same rows as the main bank block).
    layout = tables.layout
    first = tables.index_bank.plan.locate(layout.bank_start) if tables.index_bank is not None else 0
    student = index_bank[first:first + bank_block.shape[0]]
    local_ids = torch.where(ids >= 0, ids - layout.bank_start, ids)
    if context.kl_rows is not None:  # a padding row keeps no id: it adds nothing to the loss
        local_ids = torch.where(context.kl_rows[:, None], local_ids, torch.full_like(local_ids, -1))
    return indexer_kl_loss_any_topk(
        index_q, student[None], merge, q.detach(), bank_block.detach()[None], local_ids[None],
        attn.sinks.detach(), attention_scale=attn.scaling, loss_coeff=state.kl_coeff * local / max(total, 1),
        trusted_ids=True)
