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
  (``_cp.topk.float32_products``), with no host read.
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

from ...torch import IndexerSelector
from .._cp.select import BankView
from .._cp.selector import ChunkedTopKSelector, KernelSelector
from .._cp.topk import float32_products, half_products

__all__ = ["FusedSelector", "ModelSelector", "index_queries", "kernel_channel_order"]

_SCORE_BYTES = 32 << 20  # scores [rows, heads, keys] float32 per key chunk


def index_queries(indexer: Any, query_residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  rope: Callable[..., Any]) -> torch.Tensor:
    """[1, rows, heads, head_dim] Index Q, as ``DeepseekV32Indexer.forward`` makes it (``wq_b``, the
    half-split RoPE ``rope`` on the first ``qk_rope_head_dim`` channels of each head)."""
    rows = query_residual.shape[1]
    q = indexer.wq_b(query_residual).view(1, rows, indexer.n_heads, indexer.head_dim)
    width = indexer.qk_rope_head_dim
    q_rot, q_pass = torch.split(q, [width, indexer.head_dim - width], dim=-1)
    q_rot, _ = rope(q_rot, q_rot[:, :, :1], cos, sin, unsqueeze_dim=2)  # the key side is unused
    return torch.cat([q_rot, q_pass], dim=-1)


class ModelSelector(ChunkedTopKSelector):
    """The model's indexer math on worker rows (see the module docstring), in bounded memory
    (``_cp.selector``).

    Args:
        indexer: The layer's ``DeepseekV32Indexer``.
        bank: The Index K rows this rank gathered (a ``BankView``: rows and where each global row
            sits), or the whole batch's ``[tokens, index_head_dim]``.
        rope: The model's ``apply_rotary_pos_emb`` (half-split).
    """

    ratio = 1  # V3.2's indexer scores every earlier token

    def __init__(self, indexer: Any, bank: BankView | torch.Tensor, rope: Callable[..., Any]) -> None:
        super().__init__(bank)
        self.indexer, self.rope, self.topk = indexer, rope, int(indexer.index_topk)

    def chunk_inputs(self, query_residual: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = index_queries(self.indexer, query_residual, cos, sin, self.rope)
        # the model's q.float() unless the products are taken in its dtype (_cp.topk)
        q = q if half_products(q, self.bank[:0].transpose(0, 1)) else q.float()
        return q, weights.float().unsqueeze(-2)  # [1, r, 1, heads]

    def merge_width(self, rows: int, queries: torch.Tensor) -> int:
        return max(self.topk, _SCORE_BYTES // (4 * rows * queries.shape[2]))

    def scores(self, queries: torch.Tensor, weights: torch.Tensor, begin: int, end: int) -> torch.Tensor:
        keys = self.bank[begin:end][None]  # [1, keys, head_dim]
        scale = self.indexer.softmax_scale
        # the model's lines: scores [1, r, heads, keys], ReLU, the head sum by matmul
        if queries.dtype == torch.float32:
            scores = torch.matmul(queries, keys.transpose(-1, -2).float().unsqueeze(1)) * scale
        else:  # [1, r, heads, keys] float32 from the model's dtype
            scores = float32_products(queries, keys[0].transpose(0, 1)) * scale
        return torch.matmul(weights, torch.relu(scores)).squeeze(-2)[0]  # [r, keys]


def kernel_channel_order(head_dim: int, rope_dim: int) -> torch.Tensor:
    """The permutation of a V3.2 Index head's channels into the fused kernel's layout: the
    unrotated channels first, then the rotated ones as interleaved pairs ``(j, j + rope/2)``."""
    half = rope_dim // 2
    pairs = [c for j in range(half) for c in (j, j + half)]
    return torch.tensor(list(range(rope_dim, head_dim)) + pairs, dtype=torch.long)


class FusedSelector(KernelSelector):
    """sparsecp's fused CPU kernel on worker rows, float32 (see the module docstring)."""

    def __init__(self, indexer: Any, bank: BankView | torch.Tensor) -> None:
        super().__init__(bank)
        heads, head_dim, rope = int(indexer.n_heads), int(indexer.head_dim), int(indexer.qk_rope_head_dim)
        order = kernel_channel_order(head_dim, rope)
        weight = indexer.wq_b.weight.detach().float().view(heads, head_dim, -1)[:, order].reshape(heads * head_dim, -1)
        bank_rows = self.view.bank.detach().float()[:, order].contiguous()
        self.scale, self.half = float(indexer.softmax_scale), rope // 2
        self.kernel = IndexerSelector(weight.contiguous(), bank_rows, 1, int(indexer.index_topk), head_dim=head_dim,
                                      rope_dim=rope)

    def run(self, query_residual: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            table: np.ndarray) -> torch.Tensor:
        # cos / sin [1, rows, rope]: cat(freqs, freqs); the kernel takes one half
        return self.kernel(query_residual.float(), weights.float() * self.scale,
                           (cos[..., :self.half].float().contiguous(), sin[..., :self.half].float().contiguous()),
                           table)
