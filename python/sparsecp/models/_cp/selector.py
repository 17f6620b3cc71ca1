"""The two kinds of worker selector a model's adapter builds on, the loops they share.

A worker receives other ranks' rows as ``(q_residual, merge weights, cos, sin)`` plus the
segments ``(q_begin, q_end, key_begin, key_end, residual)`` that say which document piece each
row belongs to (``sparsecp.torch.select``'s convention: the segment's last row sits at position
``(key_end - key_begin) * ratio + residual - 1`` of its document), and returns each row's top-k
bank ids (ascending, ``-1`` padded: the seed's convention), ``[1, rows, topk]`` int32.

* ``ChunkedTopKSelector``: the model's own indexer math in torch. Rows go in chunks of
  ``CHUNK_ROWS``; a chunk scores only the keys its last row can see (the causal work, not rows
  x document keys, so its time is linear in the work spill's cost model counts), in merges of
  ``merge_width`` keys with a running top-k (``topk.merge_top``: score descending, ties to the
  lower id), so a row's ids never depend on where or with what it was computed. A model
  supplies its queries and its score of a key range.
* ``KernelSelector``: sparsecp's fused C++ kernel (``IndexerSelector``) on CPU, float32. The
  kernel reads keys from the start of the bank it was given; a worker's bank holds only the
  rows its segments see (``BankView``), so the segments' key ranges are moved to where they sit
  in it and the ids moved back.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...torch.select import segment_array
from .select import BankView
from .topk import merge_top

__all__ = ["CHUNK_ROWS", "ChunkedTopKSelector", "KernelSelector"]

CHUNK_ROWS = 256  # worker rows projected and scored at once
_SENTINEL = torch.iinfo(torch.int32).max


class ChunkedTopKSelector:
    """The model's indexer math on worker rows, in bounded memory (see the module docstring).

    Subclasses set ``ratio`` and ``topk`` and implement ``chunk_inputs`` (a row chunk's
    queries and merge weights, as the model makes them), ``merge_width`` and ``scores``."""

    ratio: int
    topk: int

    def __init__(self, bank: BankView | torch.Tensor) -> None:
        view = bank if isinstance(bank, BankView) else BankView(bank)
        self.bank, self.locate = view.bank.detach(), view.locate

    def chunk_inputs(self, query_residual: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A row chunk's (queries in the model's dtype, float32 merge weights), from its
        ``[1, rows, width]`` slices."""
        raise NotImplementedError

    def merge_width(self, rows: int, queries: torch.Tensor) -> int:
        """Keys per top-k merge for a chunk of ``rows`` (at least ``topk``)."""
        raise NotImplementedError

    def scores(self, queries: torch.Tensor, weights: torch.Tensor, begin: int, end: int) -> torch.Tensor:
        """``[rows, end - begin]`` float32: the model's index scores of bank rows ``[begin, end)``
        (rows of ``self.bank``), before the causal mask."""
        raise NotImplementedError

    @torch.no_grad()
    def __call__(self, query_residual: torch.Tensor, weights: torch.Tensor, position_embeddings: Any,
                 segments: Any) -> torch.Tensor:
        ratio, topk = self.ratio, self.topk
        cos, sin = position_embeddings
        rows = query_residual.shape[1]
        out = torch.full((rows, topk), -1, dtype=torch.int32, device=query_residual.device)
        for q_begin, q_end, key_begin, key_end, residual in segment_array(segments).tolist():
            end = (key_end - key_begin) * ratio + residual  # one past the last row's position
            first = end - (q_end - q_begin)  # the segment's first row's position
            if end // ratio == 0:
                continue
            base = self.locate(key_begin)
            for start in range(q_begin, q_end, CHUNK_ROWS):
                stop = min(q_end, start + CHUNK_ROWS)
                last_visible = (first + stop - q_begin) // ratio  # keys the chunk's last row sees
                if last_visible == 0:
                    continue
                q, w = self.chunk_inputs(query_residual[:, start:stop], weights[:, start:stop], cos[:, start:stop],
                                         sin[:, start:stop])
                positions = torch.arange(first + start - q_begin, first + stop - q_begin, device=q.device)
                visible = torch.div(positions + 1, ratio, rounding_mode="floor")
                width = self.merge_width(stop - start, q)
                best_scores: torch.Tensor | None = None
                best_ids: torch.Tensor | None = None
                for k0 in range(0, last_visible, width):
                    k1 = min(last_visible, k0 + width)
                    scores = self.scores(q, w, base + k0, base + k1)
                    columns = torch.arange(k0, k1, device=q.device)
                    scores = scores.masked_fill(columns[None, :] >= visible[:, None], float("-inf"))
                    ids = columns[None, :].expand(stop - start, -1)
                    if best_scores is not None and best_ids is not None:  # earlier (lower) ids first:
                        scores = torch.cat([best_scores, scores], dim=1)  # ties keep them
                        ids = torch.cat([best_ids, ids], dim=1)
                    best_scores, best_ids = merge_top(scores, ids, topk)
                assert best_ids is not None
                kept = best_ids < visible[:, None]  # a masked key's id is at or past the row's visible count
                ids = torch.where(kept, best_ids + key_begin, torch.full_like(best_ids, _SENTINEL))
                ids = torch.sort(ids, dim=1).values
                out[start:stop, :ids.shape[1]] = torch.where(ids == _SENTINEL, -1, ids).to(torch.int32)
        return out[None]


class KernelSelector:
    """sparsecp's fused CPU kernel on worker rows (see the module docstring). Subclasses build
    ``self.kernel`` and implement ``run`` (the kernel's call in its own conventions)."""

    def __init__(self, bank: BankView | torch.Tensor) -> None:
        view = bank if isinstance(bank, BankView) else BankView(bank)
        if view.bank.device.type != "cpu":
            raise ValueError(f"selector='fused' is sparsecp's CPU kernel; the Index K bank is on {view.bank.device}: "
                             "use selector='model' on this device")
        self.view, self.locate = view, view.locate

    def run(self, query_residual: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            table: np.ndarray) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def __call__(self, query_residual: torch.Tensor, weights: torch.Tensor, position_embeddings: Any,
                 segments: Any) -> torch.Tensor:
        cos, sin = position_embeddings
        table = np.array(segment_array(segments), dtype=np.int64, copy=True)
        shift = np.zeros(len(table), dtype=np.int64)
        for i, (_, _, key_begin, key_end, _) in enumerate(table.tolist()):
            shift[i] = key_begin - self.locate(key_begin) if key_end > key_begin else 0
        table[:, 2] -= shift
        table[:, 3] -= shift
        ids = self.run(query_residual, weights, cos, sin, table)
        if shift.any():
            rows = torch.from_numpy(np.repeat(shift, table[:, 1] - table[:, 0]).astype(np.int64))
            ids = torch.where(ids >= 0, ids + rows.to(ids.dtype)[None, :, None], ids)
        return ids
