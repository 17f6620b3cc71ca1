"""The plain reference of ``sparse_attention``: loops a reviewer can check by eye.

Every backend of ``sparsecp.torch.sparse_attention`` (the C++ kernel, Triton, the chunked torch
path, an installed GPU library) is tested against this function on the same inputs. It is
differentiable through torch's autograd, so its gradients are the reference gradients too. It is
slow and holds ``[rows, heads, columns]`` at once: for tests only.

The contract (FlashMLA's sparse forward, cuDNN-frontend's DSA backward, Megatron-LM's DSA):

* ``q`` ``[rows, heads, qk_dim]``, token-major;
* ``kv`` ``[keys, qk_dim]``, one key row shared by every head; values are ``kv[:, :value_dim]``;
* ``indices`` ``[rows, columns]`` integer ids into ``kv``, ``-1`` for no key; a key listed twice
  in one row counts twice;
* ``sinks`` ``[heads]`` or None: a per-head logit with no value, in the softmax's denominator;
* ``out[r, h] = sum_c p[r, h, c] * kv[indices[r, c], :value_dim]`` with
  ``p = exp(s - L)``, ``s[r, h, c] = scale * q[r, h] . kv[indices[r, c]]`` and
  ``L = log(sum_c exp(s[r, h, c]) + exp(sinks[h]))`` (no sink term without sinks);
* ``lse[r, h] = log(sum_c exp(s[r, h, c]))``: over the keys only, ``-inf`` for a row with no key.
  A row with no key outputs zeros.
"""
from __future__ import annotations

import torch

__all__ = ["reference_sparse_attention"]


def reference_sparse_attention(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float,
                               value_dim: int | None = None,
                               sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [rows, heads, value_dim], lse [rows, heads])`` in ``q``'s dtype and float32 (float64
    for float64 ``q``), computed densely in float64 (see the module docstring)."""
    value_dim = kv.shape[1] if value_dim is None else int(value_dim)
    rows, heads = q.shape[0], q.shape[1]
    valid = (indices >= 0)[:, None, :]                                     # [rows, 1, columns]
    safe = torch.where(indices >= 0, indices, torch.zeros_like(indices)).long()
    bank = kv.double() if kv.shape[0] else kv.new_zeros((1, kv.shape[1]), dtype=torch.float64)  # no key: -1 only
    keys = bank[safe]                                                     # [rows, columns, qk_dim]
    logits = torch.einsum("rhd,rcd->rhc", q.double(), keys) * scale       # [rows, heads, columns]
    masked = logits.masked_fill(~valid, float("-inf"))
    # Shift by a constant (the largest logit, the sink included): the softmax does not depend on
    # it, and a row with no key keeps finite values, so its gradients are zeros, not NaN.
    shift = masked.amax(dim=-1) if masked.shape[-1] else logits.new_full((rows, heads), float("-inf"))
    if sinks is not None:
        shift = torch.maximum(shift, sinks.double()[None, :])
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift)).detach()
    weights = torch.exp(logits - shift[..., None]).masked_fill(~valid, 0.0)
    key_sum = weights.sum(-1)                                             # [rows, heads]
    denominator = key_sum + (torch.exp(sinks.double()[None, :] - shift) if sinks is not None else 0.0)
    denominator = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    out = torch.einsum("rhc,rcd->rhd", weights / denominator[..., None], keys[..., :value_dim])
    lse = (torch.log(key_sum.detach()) + shift).masked_fill(key_sum.detach() == 0, float("-inf"))
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return out.to(q.dtype), lse.to(lse_dtype)
