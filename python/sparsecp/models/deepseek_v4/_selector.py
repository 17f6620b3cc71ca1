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
  float32 (``_cp.topk.float32_products``: the model's float32 sums in another order, no float32
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

from ...torch import IndexerSelector
from .._cp.select import BankView
from .._cp.selector import ChunkedTopKSelector, KernelSelector
from .._cp.topk import float32_products, half_products

__all__ = ["FusedSelector", "ModelSelector"]

# Scratch of the per-head scores [rows, heads, keys] (float32) of one key slice. On a CPU it
# stays in a core's L2 cache (measured on the example's indexer, 32 heads of 64: 256 rows x
# 64-128 keys score at ~50 ns per row and key; 1024-key slices, 32 MiB, at ~240 ns, and the
# time per key then grew with the slice, i.e. with the document's length, which made the
# selector's time non-linear in its work). The head-summed scores [rows, keys] of one top-k
# merge take the same budget; the merge keeps at least top-k keys. Accelerators take larger
# slices (fewer kernel launches).
_SCORE_BYTES = 2 << 20
_DEVICE_SCORE_BYTES = 32 << 20


class ModelSelector(ChunkedTopKSelector):
    """The model's indexer math on worker rows (see the module docstring), in bounded memory
    (``_cp.selector``); each merge's keys are scored in slices of at most ``_SCORE_BYTES`` of
    per-head scores (cache-resident on a CPU).

    Args:
        indexer: The layer's ``DeepseekV4Indexer``.
        bank: The compressed Index K bank rows this rank gathered (a ``BankView``), or the whole
            batch's bank ``[entries, index_head_dim]``.
        rope: The model's ``apply_rotary_pos_emb``.
    """

    def __init__(self, indexer: Any, bank: BankView | torch.Tensor, rope: Callable[..., torch.Tensor]) -> None:
        super().__init__(bank)
        self.indexer, self.rope = indexer, rope
        self.ratio, self.topk = int(indexer.compress_rate), int(indexer.index_topk)
        self.scale = indexer.scorer.softmax_scale

    def chunk_inputs(self, query_residual: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        indexer, rows = self.indexer, query_residual.shape[1]
        q = indexer.q_b_proj(query_residual)
        q = q.view(1, rows, -1, indexer.head_dim).transpose(1, 2)
        q = self.rope(q, cos, sin).transpose(1, 2)[0]  # [r, h, d], model dtype
        # the model's q.float() unless the products are taken in its dtype (_cp.topk)
        return (q if half_products(q, self.bank[:0].transpose(0, 1)) else q.float()), weights[0].float()

    def _budget(self, q: torch.Tensor) -> int:
        return _SCORE_BYTES if q.device.type == "cpu" else _DEVICE_SCORE_BYTES

    def merge_width(self, rows: int, queries: torch.Tensor) -> int:
        return max(self.topk, self._budget(queries) // (4 * rows))  # head-summed scores per merge

    def scores(self, queries: torch.Tensor, weights: torch.Tensor, begin: int, end: int) -> torch.Tensor:
        rows = queries.shape[0]
        slice_keys = max(1, self._budget(queries) // (4 * rows * queries.shape[1]))  # per-head scores per slice
        scores = torch.empty(rows, end - begin, dtype=torch.float32, device=queries.device)
        for s0 in range(begin, end, slice_keys):
            s1 = min(end, s0 + slice_keys)
            keys = self.bank[s0:s1].transpose(0, 1)  # [d, keys], model dtype
            products = torch.matmul(queries, keys.float()) if queries.dtype == torch.float32 else \
                float32_products(queries, keys)
            head = torch.relu_(products)  # [r, heads, keys] float32, in place: the model's
            head.mul_(self.scale).mul_(weights[:, :, None])  # relu(q . k) * scale * w, in its order
            torch.sum(head, dim=1, out=scores[:, s0 - begin:s1 - begin])
        return scores


class FusedSelector(KernelSelector):
    """sparsecp's fused CPU kernel on worker rows, float32 (see the module docstring)."""

    def __init__(self, indexer: Any, bank: BankView | torch.Tensor, rope_dim: int) -> None:
        super().__init__(bank)
        weight = indexer.q_b_proj.weight.detach().float().contiguous()
        self.scale, self.topk = float(indexer.scorer.softmax_scale), int(indexer.index_topk)
        self.kernel = IndexerSelector(weight, self.view.bank.detach().float().contiguous(), int(indexer.compress_rate),
                                      int(indexer.index_topk), head_dim=int(indexer.head_dim), rope_dim=rope_dim)

    def run(self, query_residual: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            table: np.ndarray) -> torch.Tensor:
        return self.kernel(query_residual.float(), weights.float() * self.scale, (cos.float(), sin.float()), table)
