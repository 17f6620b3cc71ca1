"""Worker-side selectors for a DeepSeek-V4 indexer under ``balanced_indexer_select``.

A worker receives other ranks' rows as ``(q_residual, merge weights, cos, sin)`` plus the
segments that say which document piece each row belongs to, and returns each row's top-k
compressed-bank ids (ascending, ``-1`` padded: the seed's convention). Two selectors:

* ``ModelSelector``: the model's own indexer math on the worker, as
  ``DeepseekV4Indexer.forward`` computes it: ``q_b_proj``, the compress rotary at the row's own
  position, ``DeepseekV4IndexerScorer``'s score (``ReLU(q . k)`` in float32, times
  ``softmax_scale``, times the float32 merge weights, summed over heads), the causal threshold
  ``(position + 1) // ratio``, top-k. Ties go to the lower id (a stable sort), so a row's ids do
  not depend on where or with what it was computed. Any device, any float dtype; on a GPU in
  bfloat16 / float16 the products are taken in the model's dtype and accumulated and written in
  float32 (``_cp_topk.float32_products``: the model's float32 sums in another order, no float32
  copy of the bank), and nothing reads the device from the host (the running top-k sorts instead
  of ``nonzero``).
* ``FusedSelector``: sparsecp's fused C++ kernel (``IndexerSelector``: projection, RoPE, score
  and top-k in one pass over the tensors) on CPU, in float32 (float64 and bfloat16 inputs are
  cast to float32); the same score up to float32 rounding (the kernel multiplies
  ``softmax_scale`` into the weights before the head sum, the model after the ReLU).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ..torch import IndexerSelector
from ..torch.select import segment_array
from ._cp_layer import BankView, SelectorClock
from ._cp_topk import float32_products, half_products, merge_top

__all__ = ["BankView", "FusedSelector", "ModelSelector", "SelectorClock"]

_CHUNK_ROWS = 256  # worker rows projected and scored at once
# Scratch of the per-head scores [rows, heads, keys] (float32) of one key slice. On a CPU it
# stays in a core's L2 cache (measured on the example's indexer, 32 heads of 64: 256 rows x
# 64-128 keys score at ~50 ns per row and key; 1024-key slices, 32 MiB, at ~240 ns, and the
# time per key then grew with the slice, i.e. with the document's length, which made the
# selector's time non-linear in its work). The head-summed scores [rows, keys] of one top-k
# merge take the same budget; the merge keeps at least top-k keys. Accelerators take larger
# slices (fewer kernel launches).
_SCORE_BYTES = 2 << 20
_DEVICE_SCORE_BYTES = 32 << 20
_SENTINEL = torch.iinfo(torch.int32).max


class ModelSelector:
    """The model's indexer math on worker rows (see the module docstring).

    Bounded memory: rows go in chunks of at most ``_CHUNK_ROWS`` (projected, rotated and scored
    per chunk), keys in merges of at most ``_SCORE_BYTES`` of head-summed scores, each scored in
    slices of at most ``_SCORE_BYTES`` of per-head scores (cache-resident on a CPU), with a
    running top-k whose merge keeps the model's order (score descending, ties to the lower id).
    A chunk scores only the keys its last row can see, so the work is the causal work, not rows
    x document keys, and its time is linear in it (spill's per-row cost model fits it).

    Args:
        indexer: The layer's ``DeepseekV4Indexer``.
        bank: The compressed Index K bank rows this rank gathered (a ``BankView``), or the whole
            batch's bank ``[entries, index_head_dim]``.
        rope: The model's ``apply_rotary_pos_emb``.
    """

    def __init__(self, indexer: Any, bank: BankView | torch.Tensor, rope: Callable[..., torch.Tensor]) -> None:
        view = bank if isinstance(bank, BankView) else BankView(bank)
        self.indexer, self.bank, self.locate, self.rope = indexer, view.bank.detach(), view.locate, rope
        self.ratio, self.topk = int(indexer.compress_rate), int(indexer.index_topk)

    @torch.no_grad()
    def __call__(self, query_residual: torch.Tensor, weights: torch.Tensor, position_embeddings: Any,
                 segments: Any) -> torch.Tensor:
        indexer, ratio, topk = self.indexer, self.ratio, self.topk
        cos, sin = position_embeddings
        rows = query_residual.shape[1]
        out = torch.full((rows, topk), -1, dtype=torch.int32, device=query_residual.device)
        scale = indexer.scorer.softmax_scale
        for q_begin, q_end, key_begin, key_end, residual in segment_array(segments).tolist():
            end = (key_end - key_begin) * ratio + residual  # one past the last row's position
            first = end - (q_end - q_begin)
            if end // ratio == 0:
                continue
            base = self.locate(key_begin)
            for start in range(q_begin, q_end, _CHUNK_ROWS):
                stop = min(q_end, start + _CHUNK_ROWS)
                last_visible = (first + stop - q_begin) // ratio  # keys the chunk's last row sees
                if last_visible == 0:
                    continue
                q = indexer.q_b_proj(query_residual[:, start:stop])
                q = q.view(1, stop - start, -1, indexer.head_dim).transpose(1, 2)
                q = self.rope(q, cos[:, start:stop], sin[:, start:stop]).transpose(1, 2)[0]  # [r, h, d], model dtype
                # the model's q.float() unless the products are taken in its dtype (_cp_topk)
                q32 = None if half_products(q, self.bank[:0].transpose(0, 1)) else q.float()
                w = weights[0, start:stop].float()
                positions = torch.arange(first + start - q_begin, first + stop - q_begin, device=q.device)
                visible = torch.div(positions + 1, ratio, rounding_mode="floor")
                budget = _SCORE_BYTES if q.device.type == "cpu" else _DEVICE_SCORE_BYTES
                merge_keys = max(topk, budget // (4 * (stop - start)))  # head-summed scores per merge
                slice_keys = max(1, budget // (4 * (stop - start) * q.shape[1]))  # per-head scores per slice
                best_scores: torch.Tensor | None = None
                best_ids: torch.Tensor | None = None
                for k0 in range(0, last_visible, merge_keys):
                    k1 = min(last_visible, k0 + merge_keys)
                    scores = torch.empty(stop - start, k1 - k0, dtype=torch.float32, device=q.device)
                    for s0 in range(k0, k1, slice_keys):
                        s1 = min(k1, s0 + slice_keys)
                        keys = self.bank[base + s0:base + s1].transpose(0, 1)  # [d, keys], model dtype
                        products = float32_products(q, keys) if q32 is None else torch.matmul(q32, keys.float())
                        head = torch.relu_(products)  # [r, heads, keys] float32, in place: the model's
                        head.mul_(scale).mul_(w[:, :, None])  # relu(q . k) * scale * w, in its order
                        torch.sum(head, dim=1, out=scores[:, s0 - k0:s1 - k0])
                    columns = torch.arange(k0, k1, device=q.device)
                    scores.masked_fill_(columns[None, :] >= visible[:, None], float("-inf"))
                    ids = columns[None, :].expand(stop - start, -1)
                    if best_scores is not None and best_ids is not None:  # earlier (lower) ids first
                        scores = torch.cat([best_scores, scores], dim=1)
                        ids = torch.cat([best_ids, ids], dim=1)
                    best_scores, best_ids = merge_top(scores, ids, topk)
                assert best_ids is not None
                kept = best_ids < visible[:, None]  # a masked key's id is at or past the row's visible count
                ids = torch.where(kept, best_ids + key_begin, torch.full_like(best_ids, _SENTINEL))
                ids = torch.sort(ids, dim=1).values
                out[start:stop, :ids.shape[1]] = torch.where(ids == _SENTINEL, -1, ids).to(torch.int32)
        return out[None]


class FusedSelector:
    """sparsecp's fused CPU kernel on worker rows, float32 (see the module docstring).

    Takes the gathered bank (a ``BankView``): segments are handed to the kernel with their key
    ranges moved to where they sit in it, and the ids it returns moved back to bank rows."""

    def __init__(self, indexer: Any, bank: BankView | torch.Tensor, rope_dim: int) -> None:
        view = bank if isinstance(bank, BankView) else BankView(bank)
        if view.bank.device.type != "cpu":
            raise ValueError(f"selector='fused' is sparsecp's CPU kernel; the Index K bank is on {view.bank.device}: "
                             "use selector='model' on this device")
        weight = indexer.q_b_proj.weight.detach().float().contiguous()
        self.scale, self.locate = float(indexer.scorer.softmax_scale), view.locate
        self.topk = int(indexer.index_topk)
        self.kernel = IndexerSelector(weight, view.bank.detach().float().contiguous(), int(indexer.compress_rate),
                                      int(indexer.index_topk), head_dim=int(indexer.head_dim), rope_dim=rope_dim)

    @torch.no_grad()
    def __call__(self, query_residual: torch.Tensor, weights: torch.Tensor, position_embeddings: Any,
                 segments: Any) -> torch.Tensor:
        cos, sin = position_embeddings
        table = np.array(segment_array(segments), dtype=np.int64, copy=True)
        shift = np.zeros(len(table), dtype=np.int64)
        for i, (_, _, key_begin, _, _) in enumerate(table.tolist()):
            shift[i] = key_begin - self.locate(key_begin)
        table[:, 2] -= shift
        table[:, 3] -= shift
        qr, w, cos, sin = query_residual.float(), weights.float() * self.scale, cos.float(), sin.float()
        ids = self.kernel(qr, w, (cos, sin), table)
        if shift.any():
            rows = torch.from_numpy(np.repeat(shift, table[:, 1] - table[:, 0]).astype(np.int64))
            ids = torch.where(ids >= 0, ids + rows.to(ids.dtype)[None, :, None], ids)
        return ids
