"""The running top-k of a worker selector, in the model's order (score descending, ties to the
lower key), merged chunk by chunk of keys so that its scratch does not grow with the document.

``merge_top(scores, ids, topk)`` keeps each row's ``topk`` best columns of ``scores`` whose
``ids`` ascend along the row (the previous best, then a new chunk of higher ids): ``torch.topk``
finds each row's k-th score in linear time (a stable sort of every merge cost 2.5x more per key),
the columns above it are taken, then the lowest columns equal to it up to ``topk`` (``topk``'s
own pick among ties is unspecified). The result stays in column (id) order, so the next merge's
ties again go to the lower id. A NaN score ranks above every number, as ``torch.topk`` and
``torch.sort`` rank it, ties among NaNs to the lower id.

``float32_products(a, b)``: the selectors' scores ``a @ b`` in float32 from operands kept in the
model's dtype. The models score in float32 (transformers' ``q.float() @ k.float()``); the
products of two bfloat16 (or float16) numbers are exact in float32, so a half-precision GEMM that
accumulates and writes float32 (``torch.mm(..., out_dtype=torch.float32)``, CUDA) computes the same
sums up to their order, at the tensor cores' rate and without float32 copies of the bank.
``half_products(a, b)`` says where that applies (not on CPU tensors, float32 or float64 operands,
or a torch without ``out_dtype``): elsewhere the caller keeps the model's own float32 lines.
"""
from __future__ import annotations

import os

import torch

__all__ = ["chosen_columns", "float32_products", "half_products", "merge_top"]

# SPARSECP_TORCH_PATH=1: the device code path on CPU tensors too (as sparsecp.torch.select reads it).
_DEVICE_PATH = os.environ.get("SPARSECP_TORCH_PATH", "") == "1"
_HALF = (torch.bfloat16, torch.float16)
_MM_OUT_DTYPE: list[bool] = []  # whether torch.mm takes out_dtype (probed once, on meta tensors)


def _mm_takes_out_dtype() -> bool:
    if not _MM_OUT_DTYPE:
        try:
            probe = torch.empty((2, 2), dtype=torch.bfloat16, device="meta")
            _MM_OUT_DTYPE.append(torch.mm(probe, probe, out_dtype=torch.float32).dtype == torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_OUT_DTYPE.append(False)
    return _MM_OUT_DTYPE[0]


def half_products(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``float32_products`` takes these operands (see the module docstring)."""
    return (a.device.type != "cpu" and a.dtype in _HALF and b.dtype == a.dtype and b.dim() == 2
            and _mm_takes_out_dtype())


def float32_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a [..., d] @ b [d, n]`` as float32 ``[..., n]`` from half-precision operands (where
    ``half_products`` says so), accumulated in float32."""
    flat = a.reshape(-1, a.shape[-1])
    return torch.mm(flat, b, out_dtype=torch.float32).view(*a.shape[:-1], b.shape[1])


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
    columns = chosen_columns(chosen, count, scores.device.type != "cpu" or _DEVICE_PATH)
    return scores.gather(1, columns), ids.gather(1, columns)


def chosen_columns(chosen: torch.Tensor, count: int, on_device: bool) -> torch.Tensor:
    """Each row's ``count`` True columns of ``chosen`` [rows, n], ascending."""
    if not on_device:
        return chosen.nonzero()[:, 1].view(chosen.shape[0], count)  # row-major: ascending columns
    # nonzero's output size is data-dependent: on a device it would sync the host every merge.
    return torch.argsort((~chosen).to(torch.int8), dim=1, stable=True)[:, :count]
