"""sparsecp's kernels as ``torch.library`` custom ops, for torch.compile and CUDA graphs.

* ``torch.ops.sparsecp.select_rows(query, key, weights, key_begin, visible, topk)``: the
  Lightning Indexer selection (``select_indices``' math) with each row's visible keys given
  as tensors, ``[key_begin[r], key_begin[r] + visible[r])`` of the bank, instead of host
  segments, so its shapes are fixed by the fixed-capacity layout and nothing is read on
  the host outside the kernel: ``query`` [W, heads, head_dim], ``key`` [K, head_dim],
  ``weights`` [W, heads], ``key_begin`` / ``visible`` int64 [W] (``FixedIndices``) ->
  int32 [W, topk] (ascending ids, -1 padded; a row with ``visible`` 0 is all -1). CPU
  tensors run the fused C++ kernel; other devices a dense masked torch version (one
  [W, heads, K] score block: sized for the fixed buffers, capturable in a CUDA graph).
  Every path makes the same checks (``select.check_select_rows``) and is recorded and
  replayed alike (``SelectionReplay``: the op's kernel is the replayable call).
* ``torch.ops.sparsecp.select_indices`` and ``torch.ops.sparsecp.select_worker_rows``:
  what ``select_indices`` and ``IndexerSelector`` call while torch.compile traces (segments
  as a flat ``int[]``), so a layer written against the seed's selection API compiles with
  ``fullgraph=True``; their kernels are the eager functions (the same ids, replayed alike).
* ``torch.ops.sparsecp.indexer_kl_loss(...)``: the indexer KL loss and its three
  gradients (``shared_compressed_indexer_kl_loss``' kernel), with a registered autograd
  formula (the backward scales the saved gradients) and a fake kernel, defined in kl.py
  beside the loss (so that kl.py needs nothing from here); ``indexer_kl_loss`` (importable
  from here) is the differentiable call; ``shared_compressed_indexer_kl_loss`` goes through
  it while torch.compile traces.

Both have fake (meta) kernels, so torch.compile traces them without running them;
``torch.library.opcheck`` passes for both (python/tests/test_fixed.py).
"""
from __future__ import annotations

import numpy as np
import torch

from ._replay import replayable
from .kl import indexer_kl_loss  # the KL loss's op is registered with the loss (kl.py)
from .select import _select_indices, _torch_path, check_select_rows, select_indices, select_worker_rows

__all__ = ["indexer_kl_loss", "select_rows"]


@torch.library.custom_op("sparsecp::select_rows", mutates_args=())
def select_rows(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, key_begin: torch.Tensor,
                visible: torch.Tensor, topk: int) -> torch.Tensor:
    """Top-``topk`` ids of each row among its visible keys (see the module docstring)."""
    return _select_rows(query, key, weights, key_begin, visible, topk)


@replayable("select_rows")  # record / replay on every device and path (sparsecp.torch.SelectionReplay)
@torch.no_grad()
def _select_rows(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, key_begin: torch.Tensor,
                 visible: torch.Tensor, topk: int) -> torch.Tensor:
    check_select_rows(query, key, weights, key_begin, visible, topk)  # one set of checks for every path
    if query.device.type == "cpu" and not _torch_path(query.device):
        begin, count = key_begin.numpy(), visible.numpy()
        seen = np.flatnonzero(count > 0)
        # One segment per row at ratio 1: the row at position count - 1 sees `count` keys.
        table = np.stack([seen, seen + 1, begin[seen], begin[seen] + count[seen], np.zeros_like(seen)], axis=1)
        return select_indices(query, key, weights, np.ascontiguousarray(table, dtype=np.int64), 1, topk)
    return _select_rows_dense(query, key, weights, key_begin, visible, topk)


@torch.library.custom_op("sparsecp::select_indices", mutates_args=())
def _select_indices_op(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, segments: list[int],
                       ratio: int, topk: int, threads: int) -> torch.Tensor:
    """``select_indices`` as traced by torch.compile: segments flat, 5 per segment."""
    table = np.asarray(segments, dtype=np.int64).reshape(-1, 5)
    return _select_indices(query, key, weights, table, ratio, topk, threads=threads)


@_select_indices_op.register_fake
def _(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, segments: list[int], ratio: int, topk: int,
      threads: int) -> torch.Tensor:
    return query.new_empty((query.shape[0], topk), dtype=torch.int32)


@torch.library.custom_op("sparsecp::select_worker_rows", mutates_args=())
def _select_worker_rows_op(qr: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           wq_b: torch.Tensor, key: torch.Tensor, segments: list[int], heads: int, head_dim: int,
                           rope_dim: int, ratio: int, topk: int, out_in: bool, threads: int) -> torch.Tensor:
    """``IndexerSelector``'s selection as traced by torch.compile (projection, RoPE, top-k)."""
    table = np.asarray(segments, dtype=np.int64).reshape(-1, 5)
    return select_worker_rows(qr, weights, cos, sin, wq_b, key, table, heads, head_dim, rope_dim, ratio, topk,
                              out_in, threads)


@_select_worker_rows_op.register_fake
def _(qr: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, wq_b: torch.Tensor,
      key: torch.Tensor, segments: list[int], heads: int, head_dim: int, rope_dim: int, ratio: int, topk: int,
      out_in: bool, threads: int) -> torch.Tensor:
    return qr.new_empty((qr.shape[0], topk), dtype=torch.int32)


@select_rows.register_fake
def _(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, key_begin: torch.Tensor,
      visible: torch.Tensor, topk: int) -> torch.Tensor:
    return query.new_empty((query.shape[0], topk), dtype=torch.int32)


def _select_rows_dense(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, key_begin: torch.Tensor,
                       visible: torch.Tensor, topk: int) -> torch.Tensor:
    """Device-side selection: no host reads, fixed shapes (capturable). Same semantics as
    ``_select_torch``: scores in fp32 (q rounded to bf16 for bf16 keys), a stable
    descending sort (ties to the lower id), the visible keys kept, ascending, -1 padded."""
    rows, keys = query.shape[0], key.shape[0]
    q = query.reshape(rows, weights.shape[1], key.shape[1])
    q = q.to(torch.bfloat16).float() if key.dtype == torch.bfloat16 else q.float()
    scores = torch.einsum("rhd,kd->rhk", q, key.float()).clamp_min(0)
    scores = (scores * weights.float()[:, :, None]).sum(dim=1)
    columns = torch.arange(keys, device=query.device)[None, :]
    begin, end = key_begin[:, None], (key_begin + visible)[:, None]
    scores = scores.masked_fill((columns < begin) | (columns >= end), float("-inf"))
    take = min(topk, keys)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :take]
    kept = torch.arange(take, device=query.device)[None, :] < visible[:, None]
    sentinel = torch.iinfo(torch.int32).max
    ids = torch.sort(torch.where(kept, order, torch.full_like(order, sentinel)), dim=1).values
    out = torch.full((rows, topk), -1, dtype=torch.int32, device=query.device)
    out[:, :take] = torch.where(ids == sentinel, -1, ids).to(torch.int32)
    return out
