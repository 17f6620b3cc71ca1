"""DeepSeek-V4's interleaved RoPE (transformers' ``apply_rotary_pos_emb``) in fewer passes.

The model's function expands ``cos`` / ``sin`` to the full rope width, builds ``rotate_half``
with a stack, and joins the untouched channels back with a cat; autograd then fills full-size
zero tensors for each slice's gradient. On the indexer's query (32 or 64 heads a row) that is
most of a CSA layer's elementwise time. ``InterleavedRope`` computes the same numbers, rounding
for rounding, on the channel pairs directly:

    out[2i]     = x[2i] * cos[i] - x[2i+1] * sin[i]      (the model's x*cos + (-x[2i+1])*sin)
    out[2i+1]   = x[2i+1] * cos[i] + x[2i] * sin[i]
    d x[2i]     = g[2i] * cos[i] + g[2i+1] * sin[i]      (autograd's sum of its two paths)
    d x[2i+1]   = g[2i+1] * cos[i] - g[2i] * sin[i]

each a product rounded, then one rounded sum, as the model's separate torch ops round them
(equal values; a zero's sign may differ where the model adds a +0 from a slice's zero fill). It
takes float32 ``x``, ``cos`` and ``sin`` with no gradient for ``cos`` / ``sin`` (the rotary
tables), outside ``torch.compile`` (whose fusion needs no help); anything else goes to the
model's function. ``UPSTREAM_FINGERPRINTS`` pins that function's source, so a change to it
stops ``context_parallel`` before this copy could drift.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ... import _core
from ...torch._threads import cpu_threads
from ...torch.select import kernel_arg

__all__ = ["InterleavedRope"]


def _pairs(t: torch.Tensor, rope_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The even and odd channels of ``t``'s trailing ``rope_dim`` (views)."""
    pairs = t[..., t.shape[-1] - rope_dim:].unflatten(-1, (rope_dim // 2, 2))
    return pairs[..., 0], pairs[..., 1]


def _kernel_takes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether sparsecp's C++ pass takes this call: CPU, [batch, heads, rows, dim] with a
    contiguous last dimension, tables of one shape [1 or batch, 1, rows, pairs]."""
    return (x.device.type == "cpu" and x.dim() == 4 and cos.dim() == 4 and cos.shape == sin.shape
            and cos.shape[1] == 1 and cos.shape[0] in (1, x.shape[0]) and cos.shape[2] == x.shape[2]
            and x.stride(-1) == 1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    """``out`` of the docstring (``sign`` 1) or ``d x`` from ``g = x`` (``sign`` -1: the inverse
    rotation), in a fresh tensor laid out like ``x`` (dense: a transposed view stays transposed,
    so that undoing the transpose gives a contiguous tensor): sparsecp's one-pass C++ kernel on
    CPU (``sparsecp/kernels/rope.hpp``), torch's operations on the channel pairs elsewhere."""
    rope_dim = 2 * cos.shape[-1]
    out = torch.empty_like(x, memory_format=torch.preserve_format)
    if _kernel_takes(x, cos, sin) and out.stride(-1) == 1:
        tables = [t[:, 0] if t[:, 0].stride(-1) == 1 else t[:, 0].contiguous() for t in (cos, sin)]
        if tables[0].stride() != tables[1].stride():
            tables = [t.contiguous() for t in tables]
        _core.interleaved_rope(kernel_arg(x.detach()), kernel_arg(tables[0]), kernel_arg(tables[1]), kernel_arg(out),
                               inverse=sign < 0, threads=cpu_threads(0))
        return out
    if x.shape[-1] > rope_dim:
        out[..., :x.shape[-1] - rope_dim] = x[..., :x.shape[-1] - rope_dim]
    even, odd = _pairs(x, rope_dim)
    out_even, out_odd = _pairs(out, rope_dim)
    if sign > 0:
        torch.sub(even * cos, odd * sin, out=out_even)
        torch.add(odd * cos, even * sin, out=out_odd)
    else:
        torch.add(even * cos, odd * sin, out=out_even)
        torch.sub(odd * cos, even * sin, out=out_odd)
    return out


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin, 1.0)

    @staticmethod
    @once_differentiable  # the C++ pass records no graph: a double backward raises, never drops a term
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, sin, -1.0), None, None


class InterleavedRope:
    """``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1)`` of the model, faster where it can
    be (see the module docstring); ``model_rope`` is the model's function."""

    def __init__(self, model_rope: Any) -> None:
        self.model_rope = model_rope

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1) -> torch.Tensor:
        if (torch.compiler.is_compiling() or x.dtype != torch.float32 or cos.dtype != torch.float32
                or sin.dtype != torch.float32 or cos.requires_grad or sin.requires_grad
                or x.shape[-1] < 2 * cos.shape[-1] or x.device != cos.device):
            return self.model_rope(x, cos, sin, unsqueeze_dim)
        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        half = x.shape[:-1] + (c.shape[-1],)
        try:
            fits = torch.broadcast_shapes(half, c.shape, s.shape) == half
        except RuntimeError:
            fits = False
        if not fits:  # a broadcast that grows x: the model's function (and its errors)
            return self.model_rope(x, cos, sin, unsqueeze_dim)
        if not torch.is_grad_enabled() or not x.requires_grad:
            return _rotate(x, c, s, 1.0)
        return _Rope.apply(x, c, s)
