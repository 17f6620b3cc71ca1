"""The running top-k of a worker selector, in the model's order (score descending, ties to the
lower key), merged chunk by chunk of keys so that its scratch does not grow with the document.

``merge_top(scores, ids, topk)`` keeps each row's ``topk`` best columns of ``scores`` whose
``ids`` ascend along the row (the previous best, then a new chunk of higher ids): ``torch.topk``
finds each row's k-th score in linear time (a stable sort of every merge cost 2.5x more per key),
the columns above it are taken, then the lowest columns equal to it up to ``topk`` (``topk``'s
own pick among ties is unspecified). The result stays in column (id) order, so the next merge's
ties again go to the lower id. A NaN score ranks above every number, as ``torch.topk`` and
``torch.sort`` rank it, ties among NaNs to the lower id.
"""
from __future__ import annotations

import torch

__all__ = ["chosen_columns", "merge_top"]


def merge_top(scores: torch.Tensor, ids: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``topk`` best ``(scores, ids)`` of ``[rows, n]`` inputs, in column order."""
    count = min(topk, scores.shape[1])
    if count == scores.shape[1]:
        return scores, ids
    ranked = torch.where(torch.isnan(scores), torch.full_like(scores, float("inf")), scores)
    kth = torch.topk(ranked, count, dim=1, sorted=False).values.amin(dim=1, keepdim=True)
    above = ranked > kth
    equal = ranked == kth
    chosen = above | (equal & (equal.cumsum(dim=1) <= count - above.sum(dim=1, keepdim=True)))
    columns = chosen_columns(chosen, count, scores.device.type != "cpu")
    return scores.gather(1, columns), ids.gather(1, columns)


def chosen_columns(chosen: torch.Tensor, count: int, on_device: bool) -> torch.Tensor:
    """Each row's ``count`` True columns of ``chosen`` [rows, n], ascending."""
    if not on_device:
        return chosen.nonzero()[:, 1].view(chosen.shape[0], count)  # row-major: ascending columns
    # nonzero's output size is data-dependent: on a device it would sync the host every merge.
    return torch.argsort((~chosen).to(torch.int8), dim=1, stable=True)[:, :count]
