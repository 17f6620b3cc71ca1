"""The context-parallel forward of one ``DeepseekV32Attention`` layer (MLA with the DSA indexer).

Per rank, every document isolated as if run alone, with no host round trip: every table read
here was planned on the host and moved to the device once per batch (``PrefixLayout.on``), and
the batch was agreed across ranks once, in the model's forward (``_cp.agreement.check_and_agree``).

1. queries, the MLA latent ``[kv_a_layernorm(c) | RoPE(k_rot)]`` of this rank's rows, and the
   Index K rows, as the model computes them;
2. the latent prefix: each own row's document prefix from the ranks that own it (one
   ``gather_rows``; backward SUMs into the owners). This is MLA's compressed KV cache, 576
   values a token in DeepSeek-V3.2, not the per-head keys (128 heads x 320);
3. the indexer: owners send ``q_residual`` (already computed for attention), the float32 merge
   weights and the rotary rows along the batch's balanced route; workers run the model's own
   indexer math (``_selector.py``) against the Index K rows their segments can see and return
   int32 ids (global token rows) to the owners. A recompute (activation checkpointing) replays
   the first forward's ids: no selection, no selection collective;
4. attention in MLA's absorbed form, which is the model's math regrouped: ``q_h . k_h(t) =
   (W_kb_h^T q_nope_h) . c_t + q_rot_h . k_rot_t`` and ``sum_t p_t W_vb_h c_t = W_vb_h sum_t p_t
   c_t``; so each head attends the shared latent rows its row selected
   (``sparsecp.torch.sparse_attention`` with qk_dim 576 and value_dim 512: the C++ kernel on CPU,
   the chunked torch path elsewhere; FlashAttention's recipe, scores recomputed in backward), and
   ``W_vb`` is applied once per row and head afterwards; then ``o_proj``;
5. optional indexer KL on the owner (``indexer_kl_loss_any_topk``, the model's ``index_topk``):
   student = the indexer's own query, merge weights and Index K (its inputs detached, so only
   indexer parameters learn), teacher = this attention's per-head distribution over the selected
   keys (no sink: a sink logit of the dtype's lowest value), summed over heads and L1-normalised,
   detached.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...torch.kl import indexer_kl_loss_any_topk
from .._cp.forward import FORWARD_KWARG, in_recompute
from .._cp.rows import DeviceRowGather
from .._cp.select import BankView, select_or_replay
from ._selector import FusedSelector, ModelSelector, index_queries

if TYPE_CHECKING:
    from .._cp.forward import ForwardContext
    from .._cp.prefix import DevicePrefixLayout
    from .._cp.state import ContextParallelState

__all__ = ["cp_attention_forward", "index_keys"]


def index_keys(indexer: Any, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: Any) -> torch.Tensor:
    """[rows, index_head_dim]: ``DeepseekV32Indexer.forward``'s keys of ``hidden`` [1, rows, hidden]
    (``k_norm(wk(x))``, the half-split RoPE on the first ``qk_rope_head_dim`` channels)."""
    k = indexer.k_norm(indexer.wk(hidden)).unsqueeze(2)  # [1, rows, 1, head_dim]
    k_rot, k_pass = torch.split(k, [indexer.qk_rope_head_dim, indexer.head_dim - indexer.qk_rope_head_dim], dim=-1)
    _, k_rot = rope(k_rot, k_rot, cos, sin, unsqueeze_dim=2)  # the query side is unused
    return torch.cat([k_rot, k_pass], dim=-1)[0, :, 0]


def _select(attn: Any, state: ContextParallelState, context: ForwardContext, layout: DevicePrefixLayout,
            hidden: torch.Tensor, q_residual: torch.Tensor, cos: torch.Tensor,
            sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ids [own rows, topk] int64 global token rows, -1 padded; the gathered Index K rows or None)."""
    indexer, rope = attn.indexer, state.adapter.rope

    def inputs() -> tuple[torch.Tensor, ...]:
        weights = indexer.weights_proj(hidden.to(indexer.weights_proj.weight.dtype)).float() \
            * indexer.n_heads ** -0.5  # the model's merge weights, float32
        return q_residual.detach(), weights, cos, sin

    def selector(view: BankView) -> Any:
        return FusedSelector(indexer, view) if state.selector == "fused" else ModelSelector(indexer, view, rope)

    return select_or_replay(state, context, attn.layer_idx, layout,
                            lambda: index_keys(indexer, hidden.detach(), cos, sin, rope), inputs, selector,
                            int(indexer.index_topk))


def _indices(ids: torch.Tensor, prefix_start: int) -> torch.Tensor:
    """Per own row, its selected ids as prefix block rows, int32 with -1 for none
    (``sparse_attention``'s ``indices``)."""
    return torch.where(ids >= 0, ids - prefix_start, torch.full_like(ids, -1)).to(torch.int32)


def cp_attention_forward(attn: Any, state: ContextParallelState, hidden_states: torch.Tensor,
                         position_embeddings: tuple[torch.Tensor, torch.Tensor], attention_mask: Any = None,
                         past_key_values: Any = None, position_ids: torch.Tensor | None = None,
                         **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``DeepseekV32Attention.forward`` under context parallelism (see the module docstring)."""
    if past_key_values is not None:
        raise ValueError("sparsecp context parallelism trains on packed batches: a KV cache (use_cache=True, "
                         "past_key_values) is not supported; generation is out of scope")
    if attn.training and attn.attention_dropout > 0:
        raise ValueError(f"attention_dropout={attn.attention_dropout} is not supported under sparsecp context "
                         "parallelism (the attention recomputes its probabilities in backward); set it to 0")
    context = state.context(kwargs.get(FORWARD_KWARG))
    layout: DevicePrefixLayout = context.layout
    local = hidden_states.shape[1]
    heads, nope, rope_dim = attn.num_heads, attn.qk_nope_head_dim, attn.qk_rope_head_dim
    latent_dim, value_dim = attn.kv_lora_rank, attn.v_head_dim
    cos, sin = position_embeddings

    q_residual = attn.q_a_layernorm(attn.q_a_proj(hidden_states))
    q_states = attn.q_b_proj(q_residual).view(1, local, -1, attn.qk_head_dim).transpose(1, 2)
    q_pass, q_rot = torch.split(q_states, [nope, rope_dim], dim=-1)
    kv_pass, k_rot = torch.split(attn.kv_a_proj_with_mqa(hidden_states), [latent_dim, rope_dim], dim=-1)
    k_pass = attn.kv_a_layernorm(kv_pass)
    q_rot, k_rot = state.adapter.mla_rope(q_rot, k_rot.view(1, 1, local, rope_dim), cos, sin)
    latent = torch.cat([k_pass[0], k_rot[0, 0]], dim=-1)  # [own rows, kv_lora_rank + rope]
    prefix = state.gather(latent, layout.prefix, context)           # [prefix rows, kv_lora_rank + rope]

    # The absorbed query: W_kb_h^T q_nope_h next to q_rot_h ([heads, own rows, kv_lora_rank + rope]).
    kv_b = attn.kv_b_proj.weight.view(heads, nope + value_dim, latent_dim)
    query = torch.cat([torch.einsum("hln,hnc->hlc", q_pass[0], kv_b[:, :nope]), q_rot[0]], dim=-1)

    ids, index_bank = _select(attn, state, context, layout, hidden_states, q_residual, cos, sin)
    attended = state.attend(query.transpose(0, 1), prefix, _indices(ids, layout.batch.prefix_start), attn.scaling,
                            value_dim=latent_dim)  # [own rows, heads, kv_lora_rank]
    output = torch.einsum("lhc,hvc->lhv", attended, kv_b[:, nope:]).reshape(1, local, heads * value_dim)
    result = attn.o_proj(output)

    if state.kl_coeff is not None and torch.is_grad_enabled():
        assert index_bank is not None
        loss = _indexer_kl(attn, state, context, hidden_states, q_residual, query, prefix, ids, index_bank,
                           layout.index_bank, cos, sin)
        if not in_recompute():
            context.add_kl(loss)
    return result, None


def _indexer_kl(attn: Any, state: ContextParallelState, context: ForwardContext, hidden: torch.Tensor,
                q_residual: torch.Tensor, query: torch.Tensor, prefix: torch.Tensor, ids: torch.Tensor,
                index_bank: torch.Tensor, index_table: DeviceRowGather, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
    """This rank's share of the layer's indexer KL: ``coeff / S`` times its rows' losses (S and the
    rows without the padding document's, when the forward names one)."""
    indexer, local, batch = attn.indexer, hidden.shape[1], context.layout.batch
    index_q = index_queries(indexer, q_residual.detach(), cos, sin, state.adapter.rope)
    merge = indexer.weights_proj(hidden.detach()) * (indexer.n_heads ** -0.5 * indexer.softmax_scale)
    assert state.kl_coeff is not None  # the caller computes the KL only when it is on
    # The student's keys: the Index K rows of this rank's own document prefixes, which the KL
    # gather holds contiguously (the same rows as the latent prefix block).
    first = index_table.plan.locate(batch.prefix_start)
    student = index_bank[first:first + prefix.shape[0]]
    local_ids = torch.where(ids >= 0, ids - batch.prefix_start, ids)
    if context.kl_rows is not None:  # a padding row keeps no id: it adds nothing to the loss
        local_ids = torch.where(context.kl_rows[:, None], local_ids, torch.full_like(local_ids, -1))
    # No sink: the lowest finite logit, whose probability is exactly 0 beside any selected key (and
    # which keeps a row with no key, a padding row, from a softmax over nothing but -inf).
    no_sink = torch.full((attn.num_heads,), torch.finfo(query.dtype).min, dtype=query.dtype, device=query.device)
    return indexer_kl_loss_any_topk(
        index_q, student[None], merge, query.detach()[None], prefix.detach()[None], local_ids[None], no_sink,
        attention_scale=attn.scaling, loss_coeff=state.kl_coeff * local / context.kl_tokens, trusted_ids=True)
