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

__all__ = ["BankView", "FusedSelector", "ModelSelector", "SelectorClock"]

_CHUNK_ROWS = 256  # worker rows projected and scored at once
_SCORE_BYTES = 32 << 20  # scores [rows, heads, keys] float32 per key chunk
_SENTINEL = torch.iinfo(torch.int32).max


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


class BankView:
    """A worker's part of a compressed bank: the rows it gathered (``bank``), and where each global
    bank row sits in it (``locate``; a document's prefix is contiguous in both)."""

    def __init__(self, bank: torch.Tensor, locate: Callable[[int], int] | None = None) -> None:
        self.bank = bank
        self.locate = locate if locate is not None else (lambda row: row)


class ModelSelector:
    """The model's indexer math on worker rows (see the module docstring).

    Bounded memory: rows go in chunks of at most ``_CHUNK_ROWS`` (projected, rotated and scored
    per chunk), keys in chunks of at most ``_SCORE_BYTES`` of scores, with a running top-k whose
    merge keeps the model's order (score descending, ties to the lower id). A chunk scores only
    the keys its last row can see, so the work is the causal work, not rows x document keys.

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
                q = self.rope(q, cos[:, start:stop], sin[:, start:stop]).transpose(1, 2)[0].float()  # [r, h, d]
                w = weights[0, start:stop].float()
                positions = torch.arange(first + start - q_begin, first + stop - q_begin, device=q.device)
                visible = torch.div(positions + 1, ratio, rounding_mode="floor")
                key_chunk = max(topk, _SCORE_BYTES // (4 * (stop - start) * q.shape[1]))
                best_scores: torch.Tensor | None = None
                best_ids: torch.Tensor | None = None
                for k0 in range(0, last_visible, key_chunk):
                    k1 = min(last_visible, k0 + key_chunk)
                    keys = self.bank[base + k0:base + k1].float().transpose(0, 1)[None]  # [1, d, keys]
                    scores = torch.relu(torch.matmul(q, keys)) * scale  # [r, heads, keys]
                    scores = (scores * w[:, :, None]).sum(dim=1)
                    columns = torch.arange(k0, k1, device=q.device)
                    scores = scores.masked_fill(columns[None, :] >= visible[:, None], float("-inf"))
                    ids = columns[None, :].expand(stop - start, -1)
                    if best_scores is not None and best_ids is not None:  # earlier (lower) ids first:
                        scores = torch.cat([best_scores, scores], dim=1)
                        ids = torch.cat([best_ids, ids], dim=1)  # stable ties keep them first
                    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :topk]
                    best_scores, best_ids = scores.gather(1, order), ids.gather(1, order)
                assert best_ids is not None
                kept = torch.arange(best_ids.shape[1], device=q.device)[None, :] < visible[:, None]
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
        ids = self.kernel(query_residual.float(), weights.float() * self.scale, (cos.float(), sin.float()), table)
        if shift.any():
            rows = torch.from_numpy(np.repeat(shift, table[:, 1] - table[:, 0]).astype(np.int64))
            ids = torch.where(ids >= 0, ids + rows.to(ids.dtype)[None, :, None], ids)
        return ids
