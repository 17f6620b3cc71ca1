"""FlashMLA's sparse forward behind ``sparse_attention``'s contract (the ``"flashmla"`` backend).

Read (not copied) in deepseek-ai/FlashMLA:

* ``flash_mla/flash_mla_interface.py`` at commit 02fe0d02e83f15ae5a049cc4acc009a50553e64c:
  ``flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None,
  indexer_topk=0)`` with ``q`` ``[s_q, h_q, d_qk]`` bfloat16, ``kv`` ``[s_kv, h_kv, d_qk]``
  bfloat16, ``indices`` ``[s_q, h_kv, topk]`` int32 (``-1`` or ``>= s_kv`` for none),
  ``attn_sink`` ``[h_q]`` float32 (the output times ``exp(lse) / (exp(lse) + exp(sink))``,
  ``lse`` unchanged), returning ``(out [s_q, h_q, d_v] bfloat16, max_logits [s_q, h_q],
  lse [s_q, h_q] float32)``. Older releases (the September 2025 one) have no ``attn_sink``:
  the adapter then applies the sink factor itself (it reads the signature).
* ``csrc/api/sparse_fwd.h`` at the same commit: sm_90a or sm_100f only; ``h_q`` 64 or 128;
  ``d_qk`` 512 or 576; ``d_v`` 512; last dims contiguous; strides within int32.
* ``tests/ref.py`` at a123d0b0191e0da7aa1e044f8644e0989cc63220: ``lse`` is
  ``torch.logsumexp`` (natural log) over the listed keys only, ``+inf`` for a row with none
  (whose output is zeros).
* vLLM's FlashMLA sparse backend pads the top-k width to a multiple of 128 (the kernels' key
  block, 64 or 128); the adapter pads ``indices`` with ``-1`` the same way.

Forward only (FlashMLA's sparse backward is an open pull request): ``attention.py`` pairs it
with cuDNN-frontend's DSA backward where that takes the input, else Triton's backward, both from
the ``lse`` this forward returns.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ._attention_library import LibraryKernel, find_function, lse_from_library, support_reason

__all__ = ["MODULE", "forward", "supports"]

MODULE = "flash_mla"
KERNEL = LibraryKernel(MODULE, "flash_mla_sparse_fwd", "FlashMLA's sparse forward",
                       missing=" (a release before the sparse kernels)")
TOPK_BLOCK = 128


@functools.lru_cache(maxsize=8)
def _takes_sinks(function: Callable[..., Any]) -> bool:
    try:
        return "attn_sink" in inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the newer interface is Python
        return False


def supports(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
             value_dim: int | None = None) -> str | None:
    """None when FlashMLA's sparse forward can take the input, else why not
    (``_attention_library.support_reason``)."""
    return support_reason(KERNEL, q, kv, indices, sinks, value_dim)


def forward(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float, value_dim: int,
            sinks: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [rows, heads, value_dim], lse [rows, heads] float32)`` on the contract (``-inf``
    lse for a row with no key) from ``flash_mla_sparse_fwd``."""
    rows, heads, qk_dim = q.shape
    keys, columns = kv.shape[0], indices.shape[1]
    if rows == 0 or columns == 0 or keys == 0:  # nothing to attend: no launch
        return (q.new_zeros((rows, heads, value_dim)),
                torch.full((rows, heads), float("-inf"), dtype=torch.float32, device=q.device))
    function, why = find_function(KERNEL)
    if function is None:
        raise RuntimeError(why)
    padded = -(-columns // TOPK_BLOCK) * TOPK_BLOCK
    ids = indices if padded == columns else F.pad(indices, (0, padded - columns), value=-1)
    ids = ids.contiguous().view(rows, 1, padded)                     # [s_q, h_kv = 1, topk]
    bank = kv.detach().contiguous().view(keys, 1, qk_dim)             # [s_kv, h_kv = 1, d_qk]
    query = q.detach()
    if query.stride(-1) != 1:
        query = query.contiguous()
    sink32 = None if sinks is None else sinks.detach().float().contiguous()
    options: dict[str, Any] = {"d_v": value_dim}
    if sink32 is not None and _takes_sinks(function):
        options["attn_sink"] = sink32
    result = function(query, bank, ids, float(scale), **options)
    out, lse = result[0], lse_from_library(result[2].float())
    if sink32 is not None and "attn_sink" not in options:
        # exp(lse) / (exp(lse) + exp(sink)), 0 where no key (whose output is zeros anyway)
        factor = torch.where(lse == float("-inf"), torch.zeros_like(lse), torch.sigmoid(lse - sink32[None, :]))
        out = (out.float() * factor[..., None]).to(q.dtype)
    return out, lse
