"""Worker-side selectors for a DeepSeek-V3.2 indexer (``DeepseekV32Indexer``) under the balanced
selection, at ratio 1: the bank is the Index K row of every earlier token of the document.

A worker receives other ranks' rows as ``(q_residual, merge weights, cos, sin)`` plus the
segments ``(q_begin, q_end, key_begin, key_end, 0)`` that say which document piece each row
belongs to (at ratio 1 a segment's last row sees ``key_end - key_begin`` keys, its own position
plus one), and returns each row's top-k bank ids (global token rows, ascending, ``-1`` padded).

* ``ModelSelector``: ``DeepseekV32Indexer.forward``'s math on the worker, step for step: ``wq_b``,
  the half-split RoPE on the first ``qk_rope_head_dim`` channels of each head (the model's own
  ``apply_rotary_pos_emb``), ``ReLU(q . k * softmax_scale)`` in float32 (the model's ``.float()``),
  the head sum as the model's ``matmul`` of the float32 merge weights (``weights_proj(x) *
  n_heads^-0.5``), the causal mask, top-k. Rows in chunks, keys in chunks with a running top-k
  (ties to the lower id, so a row's ids do not depend on where it was computed); a chunk scores
  only the keys its last row can see. Any device, any float dtype; on a GPU in bfloat16 / float16
  the products ``q . k`` are taken in the model's dtype, accumulated and written in float32
  (``_cp_topk.float32_products``), with no host read.
* ``FusedSelector``: sparsecp's fused C++ kernel (``IndexerSelector``) on CPU, float32. The kernel
  rotates the *trailing* ``rope_dim`` channels in *interleaved* pairs; V3.2 rotates the *leading*
  ones in *half-split* pairs ``(j, j + rope/2)``. A dot product does not change when both sides'
  channels are permuted alike, so the selector permutes ``wq_b``'s rows (per head) and the bank's
  columns once, into the kernel's layout: the same scores up to float32 rounding (the kernel
  multiplies ``softmax_scale`` into the merge weights, before the ReLU's zero, which it keeps).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ..torch import IndexerSelector
from ..torch.select import segment_array
from ._cp_layer import BankView
from ._cp_topk import float32_products, half_products, merge_top

__all__ = ["FusedSelector", "ModelSelector", "kernel_channel_order"]

_CHUNK_ROWS = 256  # worker rows projected and scored at once
_SCORE_BYTES = 32 << 20  # scores [rows, heads, keys] float32 per key chunk
_SENTINEL = torch.iinfo(torch.int32).max


class ModelSelector:
    """The model's indexer math on worker rows (see the module docstring).

    Args:
        indexer: The layer's ``DeepseekV32Indexer``.
        bank: The Index K rows this rank gathered (a ``BankView``: rows and where each global row
            sits), or the whole batch's ``[tokens, index_head_dim]``.
        rope: The model's ``apply_rotary_pos_emb`` (half-split).
    """

    def __init__(self, indexer: Any, bank: BankView | torch.Tensor, rope: Callable[..., Any]) -> None:
        view = bank if isinstance(bank, BankView) else BankView(bank)
        self.indexer, self.bank, self.locate, self.rope = indexer, view.bank.detach(), view.locate, rope
        self.topk = int(indexer.index_topk)

    def _queries(self, query_residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """[1, rows, heads, head_dim] Index Q, as ``DeepseekV32Indexer.forward`` makes it."""
        indexer = self.indexer
        rows = query_residual.shape[1]
        q = indexer.wq_b(query_residual).view(1, rows, indexer.n_heads, indexer.head_dim)
        rope = indexer.qk_rope_head_dim
        q_rot, q_pass = torch.split(q, [rope, indexer.head_dim - rope], dim=-1)
        q_rot, _ = self.rope(q_rot, q_rot[:, :, :1], cos, sin, unsqueeze_dim=2)  # the key side is unused
        return torch.cat([q_rot, q_pass], dim=-1)

    @torch.no_grad()
    def __call__(self, query_residual: torch.Tensor, weights: torch.Tensor, position_embeddings: Any,
                 segments: Any) -> torch.Tensor:
        topk = self.topk
        cos, sin = position_embeddings
        rows = query_residual.shape[1]
        out = torch.full((rows, topk), -1, dtype=torch.int32, device=query_residual.device)
        scale = self.indexer.softmax_scale
        for q_begin, q_end, key_begin, key_end, _ in segment_array(segments).tolist():
            first = (key_end - key_begin) - (q_end - q_begin)  # the segment's first row's position
            base = self.locate(key_begin) if key_end > key_begin else 0
            for start in range(q_begin, q_end, _CHUNK_ROWS):
                stop = min(q_end, start + _CHUNK_ROWS)
                q = self._queries(query_residual[:, start:stop], cos[:, start:stop], sin[:, start:stop])
                # the model's q.float() unless the products are taken in its dtype (_cp_topk)
                q32 = None if half_products(q, self.bank[:0].transpose(0, 1)) else q.float()
                w = weights[:, start:stop].float().unsqueeze(-2)  # [1, r, 1, heads]
                visible = torch.arange(first + start - q_begin, first + stop - q_begin, device=q.device) + 1
                last_visible = first + stop - q_begin  # keys the chunk's last row sees
                key_chunk = max(topk, _SCORE_BYTES // (4 * (stop - start) * q.shape[2]))
                best_scores: torch.Tensor | None = None
                best_ids: torch.Tensor | None = None
                for k0 in range(0, last_visible, key_chunk):
                    k1 = min(last_visible, k0 + key_chunk)
                    keys = self.bank[base + k0:base + k1][None]  # [1, keys, head_dim]
                    # the model's lines: scores [1, r, heads, keys], ReLU, the head sum by matmul
                    if q32 is None:  # [1, r, heads, keys] float32 from the model's dtype
                        scores = float32_products(q, keys[0].transpose(0, 1)) * scale
                    else:
                        scores = torch.matmul(q32, keys.transpose(-1, -2).float().unsqueeze(1)) * scale
                    scores = torch.relu(scores)
                    scores = torch.matmul(w, scores).squeeze(-2)[0]  # [r, keys]
                    columns = torch.arange(k0, k1, device=q.device)
                    scores = scores.masked_fill(columns[None, :] >= visible[:, None], float("-inf"))
                    ids = columns[None, :].expand(stop - start, -1)
                    if best_scores is not None and best_ids is not None:  # earlier (lower) ids first:
                        scores = torch.cat([best_scores, scores], dim=1)  # ties keep them
                        ids = torch.cat([best_ids, ids], dim=1)
                    best_scores, best_ids = merge_top(scores, ids, topk)
                assert best_ids is not None  # every row sees at least itself
                kept = best_ids < visible[:, None]  # a masked key's id is at or past the row's visible count
                ids = torch.where(kept, best_ids + key_begin, torch.full_like(best_ids, _SENTINEL))
                ids = torch.sort(ids, dim=1).values
                out[start:stop, :ids.shape[1]] = torch.where(ids == _SENTINEL, -1, ids).to(torch.int32)
        return out[None]


def kernel_channel_order(head_dim: int, rope_dim: int) -> torch.Tensor:
    """The permutation of a V3.2 Index head's channels into the fused kernel's layout: the
    unrotated channels first, then the rotated ones as interleaved pairs ``(j, j + rope/2)``."""
    half = rope_dim // 2
    pairs = [c for j in range(half) for c in (j, j + half)]
    return torch.tensor(list(range(rope_dim, head_dim)) + pairs, dtype=torch.long)


class FusedSelector:
    """sparsecp's fused CPU kernel on worker rows, float32 (see the module docstring).

    Takes the gathered bank (a ``BankView``): segments are handed to the kernel with their key
    ranges moved to where they sit in it, and the ids it returns moved back to bank rows."""

    def __init__(self, indexer: Any, bank: BankView | torch.Tensor) -> None:
        view = bank if isinstance(bank, BankView) else BankView(bank)
        if view.bank.device.type != "cpu":
            raise ValueError(f"selector='fused' is sparsecp's CPU kernel; the Index K bank is on {view.bank.device}: "
                             "use selector='model' on this device")
        heads, head_dim, rope = int(indexer.n_heads), int(indexer.head_dim), int(indexer.qk_rope_head_dim)
        order = kernel_channel_order(head_dim, rope)
        weight = indexer.wq_b.weight.detach().float().view(heads, head_dim, -1)[:, order].reshape(heads * head_dim, -1)
        bank_rows = view.bank.detach().float()[:, order].contiguous()
        self.scale, self.locate, self.half = float(indexer.softmax_scale), view.locate, rope // 2
        self.kernel = IndexerSelector(weight.contiguous(), bank_rows, 1, int(indexer.index_topk), head_dim=head_dim,
                                      rope_dim=rope)

    @torch.no_grad()
    def __call__(self, query_residual: torch.Tensor, weights: torch.Tensor, position_embeddings: Any,
                 segments: Any) -> torch.Tensor:
        cos, sin = position_embeddings  # [1, rows, rope]: cat(freqs, freqs); the kernel takes one half
        table = np.array(segment_array(segments), dtype=np.int64, copy=True)
        shift = np.zeros(len(table), dtype=np.int64)
        for i, (_, _, key_begin, key_end, _) in enumerate(table.tolist()):
            shift[i] = key_begin - self.locate(key_begin) if key_end > key_begin else 0
        table[:, 2] -= shift
        table[:, 3] -= shift
        ids = self.kernel(query_residual.float(), weights.float() * self.scale,
                          (cos[..., :self.half].float().contiguous(), sin[..., :self.half].float().contiguous()),
                          table)
        if shift.any():
            rows = torch.from_numpy(np.repeat(shift, table[:, 1] - table[:, 0]).astype(np.int64))
            ids = torch.where(ids >= 0, ids + rows.to(ids.dtype)[None, :, None], ids)
        return ids
