"""Worker-side selectors for a DeepSeek-V4 indexer under ``balanced_indexer_select``.

A worker receives other ranks' rows as ``(q_residual, merge weights, cos, sin)`` plus the
segments that say which document piece each row belongs to, and returns each row's top-k
compressed-bank ids (ascending, ``-1`` padded: the seed's convention). Two selectors:

* ``ModelSelector``: the model's own indexer math on the worker, as
  ``DeepseekV4Indexer.forward`` computes it: ``q_b_proj``, the compress rotary at the row's own
  position, ``DeepseekV4IndexerScorer``'s score (``ReLU(q . k)`` in float32, times
  ``softmax_scale``, times the float32 merge weights, summed over heads), the causal threshold
  ``(position + 1) // ratio``, top-k. Ties go to the lower id (a stable sort), so a row's ids do
  not depend on where or with what it was computed. Any device, any float dtype.
* ``FusedSelector``: sparsecp's fused C++ kernel (``IndexerSelector``: projection, RoPE, score
  and top-k in one pass over the tensors) on CPU, in float32 (float64 and bfloat16 inputs are
  cast to float32); the same score up to float32 rounding (the kernel multiplies
  ``softmax_scale`` into the weights before the head sum, the model after the ReLU).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

from ..torch import IndexerSelector
from ..torch.select import segment_array

__all__ = ["FusedSelector", "ModelSelector", "SelectorClock"]

_CHUNK_ROWS = 256


class SelectorClock:
    """Counts selector calls and the CPU seconds of the calling thread spent in them (per rank).

    CPU time, not wall time: with more ranks than cores (tests, the example on a laptop) a rank's
    wall time counts the time its peers held the core, which makes balanced plans, whose ranks
    all select at once, look slower than they are. For a CUDA selector this measures the host's
    share only; time the device with events (``sparsecp.torch.calibrate`` does)."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0

    def timed(self, selector: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def run(*args: Any) -> torch.Tensor:
            start = time.thread_time()
            try:
                return selector(*args)
            finally:
                self.calls += 1
                self.seconds += time.thread_time() - start
        return run


class ModelSelector:
    """The model's indexer math on worker rows (see the module docstring).

    Args:
        indexer: The layer's ``DeepseekV4Indexer``.
        bank: The whole batch's compressed Index K bank ``[entries, index_head_dim]``.
        rope: The model's ``apply_rotary_pos_emb``.
    """

    def __init__(self, indexer: Any, bank: torch.Tensor, rope: Callable[..., torch.Tensor]) -> None:
        self.indexer, self.bank, self.rope = indexer, bank.detach(), rope
        self.ratio, self.topk = int(indexer.compress_rate), int(indexer.index_topk)

    @torch.no_grad()
    def __call__(self, query_residual: torch.Tensor, weights: torch.Tensor, position_embeddings: Any,
                 segments: Any) -> torch.Tensor:
        indexer, ratio = self.indexer, self.ratio
        cos, sin = position_embeddings
        rows = query_residual.shape[1]
        q = indexer.q_b_proj(query_residual).view(1, rows, -1, indexer.head_dim).transpose(1, 2)
        q = self.rope(q, cos, sin).transpose(1, 2)[0].float()  # [rows, heads, head_dim]
        w = weights[0].float()
        out = torch.full((rows, self.topk), -1, dtype=torch.int32, device=q.device)
        sentinel = torch.iinfo(torch.int32).max
        scale = indexer.scorer.softmax_scale
        for q_begin, q_end, key_begin, key_end, residual in segment_array(segments).tolist():
            end = (key_end - key_begin) * ratio + residual  # one past the last row's position
            first = end - (q_end - q_begin)
            span = end // ratio  # keys the segment's last row sees
            if span == 0:
                continue
            keys = self.bank[key_begin:key_begin + span].float().transpose(0, 1)[None]  # [1, D, span]
            for start in range(q_begin, q_end, _CHUNK_ROWS):
                stop = min(q_end, start + _CHUNK_ROWS)
                positions = torch.arange(first + start - q_begin, first + stop - q_begin, device=q.device)
                visible = torch.div(positions + 1, ratio, rounding_mode="floor")
                scores = torch.relu(torch.matmul(q[start:stop], keys)) * scale  # [chunk, heads, span]
                scores = (scores * w[start:stop, :, None]).sum(dim=1)
                columns = torch.arange(span, device=q.device)
                scores = scores.masked_fill(columns[None, :] >= visible[:, None], float("-inf"))
                order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :self.topk]
                kept = torch.arange(order.shape[1], device=q.device)[None, :] < visible[:, None]
                ids = torch.where(kept, order + key_begin, torch.full_like(order, sentinel))
                ids = torch.sort(ids, dim=1).values
                out[start:stop, :ids.shape[1]] = torch.where(ids == sentinel, -1, ids).to(torch.int32)
        return out[None]


class FusedSelector:
    """sparsecp's fused CPU kernel on worker rows, float32 (see the module docstring)."""

    def __init__(self, indexer: Any, bank: torch.Tensor, rope_dim: int) -> None:
        weight = indexer.q_b_proj.weight.detach().float().contiguous()
        self.scale = float(indexer.scorer.softmax_scale)
        self.kernel = IndexerSelector(weight, bank.detach().float().contiguous(), int(indexer.compress_rate),
                                      int(indexer.index_topk), head_dim=int(indexer.head_dim), rope_dim=rope_dim)

    @torch.no_grad()
    def __call__(self, query_residual: torch.Tensor, weights: torch.Tensor, position_embeddings: Any,
                 segments: Any) -> torch.Tensor:
        cos, sin = position_embeddings
        table = np.ascontiguousarray(segment_array(segments))
        return self.kernel(query_residual.float(), weights.float() * self.scale, (cos.float(), sin.float()), table)
