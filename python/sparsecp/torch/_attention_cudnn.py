"""cuDNN-frontend's DSA sparse-attention backward behind ``sparse_attention``'s contract (the
``"cudnn"`` backend, and the ``"flashmla"`` backend's backward where it takes the input).

Package ``nvidia-cudnn-frontend`` (module ``cudnn``; the DSA kernels need its CuTe DSL extra).
Read (not copied) in NVIDIA/cudnn-frontend:

* ``python/cudnn/deepseek_sparse_attention/sparse_attention_backward/api.py`` at commits
  35acc09e7bf6a3bf624721cdc6dbafe70cd20073 and 05c09659d5266077319aa96e66cb81a0de23d319 (the same
  signature): ``sparse_attention_backward_wrapper(q, kv, out, dout, lse, attn_sink, topk_idxs,
  softmax_scale=None, topk_length=None, dq=None, dkv=None, block_tile=64, stream=None)`` returning
  a ``TupleDict`` ``{'dq', 'dkv', 'd_sink'}``; ``q`` ``[total_S_q, H, D]``, ``kv``
  ``[total_S_kv, D]`` (K=V, one head), ``out`` / ``dout`` ``[total_S_q, H, D_v]``, ``lse``
  ``[total_S_q, H]`` float32 "FlashMLA KV-only LSE excluding sink", ``attn_sink`` ``[H]`` float32
  (required), ``topk_idxs`` ``[total_S_q, topk]`` int32 global ids; its support check: SM90+, Q
  bfloat16 (float16 too on SM90), KV the same dtype.
* ``.../sparse_attention_backward/_interface_sm90.py`` at 01f940b3c2fa9792705ebbae72fd02170a4f4250
  and ``_interface_sm100.py`` at 02c83689942f31fbf9c25c0fb4ce6b2421dbc22e: ``head_dim`` 512 or 576,
  ``D_v`` = 512 for 576 else ``head_dim``; SM90 asserts compute capability 9, SM100 tunes
  (10, 0) and (10, 3); more than one query head.
* ``python/cudnn/deepseek_sparse_attention/README.md``: the forward and backward take invalid
  (``-1``) and duplicate indices.

The contract's ``-inf`` lse (no key) is handed over as FlashMLA's ``+inf``; without sinks the
adapter passes ``-inf`` sinks (no effect on the gradients, a zero sink gradient it drops). Only
64 and 128 heads (V4's and V3.2's) are taken: other head counts have other kernel variants this
adapter has not been run on.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from ._attention_library import LibraryKernel, find_function, lse_for_library, support_reason

__all__ = ["MODULE", "backward", "supports"]

MODULE = "cudnn.deepseek_sparse_attention.sparse_attention_backward"
KERNEL = LibraryKernel(MODULE, "sparse_attention_backward_wrapper", "cuDNN-frontend's DSA backward")


def supports(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
             value_dim: int | None = None) -> str | None:
    """None when cuDNN-frontend's DSA backward can take the input, else why not
    (``_attention_library.support_reason``)."""
    return support_reason(KERNEL, q, kv, indices, sinks, value_dim)


def backward(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float, value_dim: int,
             sinks: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor,
             grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(dq, dkv, dsinks or None)`` in the inputs' dtypes from cuDNN's DSA backward, given the
    forward's ``out`` and contract ``lse`` (``-inf`` for a row with no key)."""
    rows, heads, _ = q.shape
    keys, columns = kv.shape[0], indices.shape[1]
    if rows == 0 or columns == 0 or keys == 0:  # every output row is zeros: so is every gradient
        dsinks = None if sinks is None else torch.zeros_like(sinks)
        return torch.zeros_like(q), torch.zeros_like(kv), dsinks
    function, why = find_function(KERNEL)
    if function is None:
        raise RuntimeError(why)
    sink32 = (sinks.detach().float().contiguous() if sinks is not None
              else torch.full((heads,), float("-inf"), dtype=torch.float32, device=q.device))
    result = function(q.detach().contiguous(), kv.detach().contiguous(), out.detach().contiguous(),
                      grad_out.to(q.dtype).contiguous(), lse_for_library(lse), sink32, indices.contiguous(),
                      softmax_scale=float(scale))
    if isinstance(result, Mapping):
        dq, dkv, dsink = result["dq"], result["dkv"], result["d_sink"]
    else:
        dq, dkv, dsink = result
    dsinks = None if sinks is None else dsink.to(sinks.dtype)
    return dq.to(q.dtype), dkv.to(kv.dtype), dsinks
