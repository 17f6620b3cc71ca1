"""Sparse attention on the contract every DSA kernel shares, with autograd and backends.

``sparse_attention(q, kv, indices, scale)`` attends each query row to the key rows its
``indices`` list, exactly as FlashMLA's sparse forward, cuDNN-frontend's DSA backward and
Megatron-LM's DSA backends define it:

* ``q`` ``[rows, heads, qk_dim]`` (token-major); ``kv`` ``[keys, qk_dim]``, one key row shared by
  every head, whose first ``value_dim`` columns are the value (DeepSeek-V4's K=V: 512; V3.2's
  absorbed MLA: 576 / 512); ``indices`` ``[rows, columns]`` int32 ids into ``kv``, ``-1`` for
  none (a key listed twice counts twice); ``sinks`` ``[heads]`` float32 or None (V4's attention
  sink: in the softmax's denominator, its probability dropped);
* returns ``out`` ``[rows, heads, value_dim]`` in ``q``'s dtype and, with ``return_lse=True``,
  ``lse`` ``[rows, heads]`` float32 (float64 for float64 inputs): the natural log-sum-exp over
  the keys only, ``-inf`` for a row with no key (whose output is zeros). ``lse`` carries no
  gradient; ``out`` is differentiable in ``q``, ``kv`` and ``sinks``.

Backends, tried in this order where ``backend`` is None (each has a support check that says why
it cannot take an input, and the next one is tried):

* ``"cpu"``: sparsecp's C++ kernel (CPU tensors; float32, bfloat16, float64): the FlashAttention
  recipe in row blocks, products through oneDNN (AMX and AVX512_BF16 where the CPU has them) or
  the BLAS, a key gradient that is bit-identical across runs and thread counts. It runs on
  ``torch.get_num_threads()`` threads. A ``torch.library`` custom op (``sparsecp::sparse_attention``)
  with a fake kernel and registered autograd, so ``torch.compile(fullgraph=True)`` traces it.
* ``"flashmla"``: FlashMLA's sparse forward (``flash_mla.flash_mla_sparse_fwd``: installed
  separately; sm_90 / sm_100, bfloat16, 64 or 128 heads, qk 512 or 576, values 512), its
  backward by cuDNN-frontend's DSA backward where that takes the input, else by Triton's
  (``_attention_flashmla``).
* ``"cudnn"``: Triton's forward and cuDNN-frontend's DSA backward (package
  ``nvidia-cudnn-frontend``; sm_90 / sm_100, bfloat16, 64 or 128 heads, qk 512 or 576, values
  512; ``_attention_cudnn``).
* ``"triton"``: Triton kernels (CUDA tensors; CPU tensors under ``TRITON_INTERPRET=1``).
* ``"torch"``: chunked torch code with the same semantics, any device; the reference path.

On CPU tensors the order is ``cpu``, ``torch``; on a CUDA device ``flashmla``, ``cudnn``,
``triton``, ``torch``. The first pick of each backend on each device type is logged once per
process (logger ``sparsecp.attention``, INFO) with what the backends before it said.

``sparse_attention_backends(q, kv, indices, sinks)`` lists what each backend says of an input;
``sparse_attention_gemm(dtype, heads)`` names what the C++ kernel multiplies with.
"""
from __future__ import annotations

import logging
import math
import os
from typing import Any, Callable

import torch

from .. import _core
from . import _attention_cudnn, _attention_flashmla, _attention_library, _attention_triton
from ._attention_chunked import DEFAULT_CHUNK_BYTES, attention_chunk_rows
from ._attention_chunked import sparse_attention as _chunked_attention
from ._threads import cpu_threads
from .select import kernel_arg

__all__ = ["BACKENDS", "sparse_attention", "sparse_attention_backend", "sparse_attention_backends",
           "sparse_attention_gemm"]

BACKENDS = ("cpu", "flashmla", "cudnn", "triton", "torch")
# Tried in this order where backend is None, by device type (others: the "cuda" order).
PICK_ORDER = {"cpu": ("cpu", "torch"), "cuda": ("flashmla", "cudnn", "triton", "torch")}

_LOG = logging.getLogger("sparsecp.attention")
_LOGGED: set[tuple[str, str]] = set()

_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float64)


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float, value_dim: int,
           sinks: torch.Tensor | None) -> None:
    """The contract's shape, dtype and device rules, the same for every backend."""
    if not isinstance(q, torch.Tensor) or q.ndim != 3:
        raise ValueError(f"sparse_attention q must be a [rows, heads, qk_dim] tensor, got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    if not isinstance(kv, torch.Tensor) or kv.ndim != 2 or kv.shape[1] != q.shape[2]:
        raise ValueError(f"sparse_attention kv must be [keys, qk_dim={q.shape[2]}], got "
                         f"{tuple(kv.shape) if isinstance(kv, torch.Tensor) else type(kv).__name__}")
    if kv.dtype != q.dtype or not q.dtype.is_floating_point:
        raise ValueError(f"sparse_attention q and kv must share one floating dtype, got {q.dtype} and {kv.dtype}")
    if not isinstance(indices, torch.Tensor) or indices.ndim != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(f"sparse_attention indices must be [rows={q.shape[0]}, columns], got "
                         f"{tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__}")
    if indices.dtype != torch.int32:
        raise ValueError(f"sparse_attention indices must be int32, got {indices.dtype}")
    if kv.device != q.device or indices.device != q.device:
        raise ValueError(f"sparse_attention q, kv and indices must be on one device, got {q.device}, {kv.device} "
                         f"and {indices.device}")
    if q.shape[1] < 1 or q.shape[2] < 1:
        raise ValueError(f"sparse_attention q needs at least one head and one channel, got {tuple(q.shape)}")
    if not 1 <= value_dim <= q.shape[2]:
        raise ValueError(f"sparse_attention value_dim must be in [1, qk_dim={q.shape[2]}], got {value_dim}")
    if not math.isfinite(scale):
        raise ValueError(f"sparse_attention scale must be finite, got {scale}")
    if kv.shape[0] > 2**31 - 1:
        raise ValueError(f"sparse_attention kv has {kv.shape[0]} rows, more than int32 indices address")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or sinks.shape != (q.shape[1],):
            raise ValueError(f"sparse_attention sinks must be [heads={q.shape[1]}], got "
                             f"{tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__}")
        if sinks.device != q.device or not sinks.dtype.is_floating_point:
            raise ValueError(f"sparse_attention sinks must be a floating tensor on {q.device}, got {sinks.dtype} "
                             f"on {sinks.device}")


def _check_ids(indices: torch.Tensor, keys: int) -> None:
    """Ids in [-1, keys): checked on the host for CPU tensors only (a device check would read
    the device; the C++ kernel checks again, naming the row and column)."""
    if indices.device.type != "cpu" or indices.numel() == 0:
        return
    low, high = int(indices.min()), int(indices.max())
    if low < -1 or high >= keys:
        bad = low if low < -1 else high
        row, column = divmod(int((indices == bad).flatten().nonzero()[0]), indices.shape[1])
        raise ValueError(f"sparse_attention index {bad} at row {row}, column {column} is out of range "
                         f"[-1, {keys}) (kv has {keys} rows)")


# --- the C++ kernel as a custom op -----------------------------------------------------------------

def _optional_arg(tensor: torch.Tensor | None) -> Any:
    return None if tensor is None else kernel_arg(tensor)


@torch.library.custom_op("sparsecp::sparse_attention", mutates_args=())
def _cpu_forward(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
                 scale: float, value_dim: int, chunk_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    q, kv, indices = q.contiguous(), kv.contiguous(), indices.contiguous()
    accumulate = _accumulate_dtype(q.dtype)
    sinks_in = None if sinks is None else sinks.detach().to(accumulate).contiguous()
    out = q.new_empty((q.shape[0], q.shape[1], value_dim))
    lse = torch.empty((q.shape[0], q.shape[1]), dtype=accumulate)
    _core.sparse_attention_forward(kernel_arg(q.detach()), kernel_arg(kv.detach()), kernel_arg(indices),
                                   _optional_arg(sinks_in), kernel_arg(out), kernel_arg(lse), scale, value_dim,
                                   threads=cpu_threads(0), scratch_bytes=chunk_bytes)
    return out, lse


@_cpu_forward.register_fake
def _(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None, scale: float,
      value_dim: int, chunk_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (q.new_empty((q.shape[0], q.shape[1], value_dim)),
            q.new_empty((q.shape[0], q.shape[1]), dtype=_accumulate_dtype(q.dtype)))


@torch.library.custom_op("sparsecp::sparse_attention_backward", mutates_args=())
def _cpu_backward(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
                  out: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor, scale: float,
                  value_dim: int, chunk_bytes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, kv, indices = q.contiguous(), kv.contiguous(), indices.contiguous()
    accumulate = _accumulate_dtype(q.dtype)
    sinks_in = None if sinks is None else sinks.to(accumulate).contiguous()
    grad_q = torch.empty_like(q)
    grad_kv = torch.empty(kv.shape, dtype=accumulate)
    grad_sinks = torch.zeros(q.shape[1], dtype=accumulate)
    _core.sparse_attention_backward(kernel_arg(q), kernel_arg(kv), kernel_arg(indices), _optional_arg(sinks_in),
                                    kernel_arg(out.contiguous()), kernel_arg(lse.contiguous()),
                                    kernel_arg(grad_out.to(q.dtype).contiguous()), kernel_arg(grad_q),
                                    kernel_arg(grad_kv), _optional_arg(grad_sinks if sinks is not None else None),
                                    scale, value_dim, threads=cpu_threads(0), scratch_bytes=chunk_bytes)
    return grad_q, grad_kv.to(kv.dtype), grad_sinks


@_cpu_backward.register_fake
def _(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None, out: torch.Tensor,
      lse: torch.Tensor, grad_out: torch.Tensor, scale: float,
      value_dim: int, chunk_bytes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(kv), q.new_empty((q.shape[1],), dtype=_accumulate_dtype(q.dtype))


def _cpu_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, kv, indices, sinks, scale, value_dim, chunk_bytes = inputs
    out, lse = output
    ctx.save_for_backward(q, kv, indices, sinks, out, lse)
    ctx.scale, ctx.value_dim, ctx.chunk_bytes, ctx.has_sinks = scale, value_dim, chunk_bytes, sinks is not None
    ctx.mark_non_differentiable(lse)


def _cpu_autograd(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor | None) -> tuple[Any, ...]:
    q, kv, indices, sinks, out, lse = ctx.saved_tensors
    grad_q, grad_kv, grad_sinks = torch.ops.sparsecp.sparse_attention_backward(
        q, kv, indices, sinks, out, lse, grad_out, ctx.scale, ctx.value_dim, ctx.chunk_bytes)
    sink_grad = grad_sinks.to(sinks.dtype) if ctx.has_sinks else None
    return grad_q, grad_kv, None, sink_grad, None, None, None


_cpu_forward.register_autograd(_cpu_autograd, setup_context=_cpu_setup)


# --- backends ----------------------------------------------------------------------------------------

def _cpu_support(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
                 value_dim: int | None = None) -> str | None:
    if q.device.type != "cpu":
        return f"tensors on {q.device}, not the CPU"
    if q.dtype not in _CPU_DTYPES:
        return f"dtype {q.dtype} (the C++ kernel takes float32, bfloat16 and float64)"
    return None


def _torch_support(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
                   value_dim: int | None = None) -> str | None:
    return None


def _triton_support(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
                    value_dim: int | None = None) -> str | None:
    if not _attention_triton.available():
        return "triton is not installed"
    return _attention_triton.supports(q, kv, indices, sinks)


def _flashmla_backward(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
                       value_dim: int | None) -> tuple[str | None, str]:
    """(the backward paired with FlashMLA's forward: "cudnn" or "triton", or None; why)."""
    cudnn = _attention_cudnn.supports(q, kv, indices, sinks, value_dim)
    if cudnn is None:
        return "cudnn", ""
    triton = _triton_support(q, kv, indices, sinks)
    if triton is None:
        return "triton", ""
    return None, f"no backward takes it (cudnn: {cudnn}; triton: {triton})"


def _flashmla_support(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
                      value_dim: int | None = None) -> str | None:
    reason = _attention_flashmla.supports(q, kv, indices, sinks, value_dim)
    if reason is not None:
        return reason
    backward, why = _flashmla_backward(q, kv, indices, sinks, value_dim)
    return None if backward is not None else why


def _cudnn_support(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
                   value_dim: int | None = None) -> str | None:
    reason = _attention_cudnn.supports(q, kv, indices, sinks, value_dim)
    if reason is not None:
        return reason
    triton = _triton_support(q, kv, indices, sinks)
    return None if triton is None else f"its forward is Triton's, which cannot take it: {triton}"


_SUPPORT: dict[str, Callable[..., str | None]] = {
    "cpu": _cpu_support, "flashmla": _flashmla_support, "cudnn": _cudnn_support, "triton": _triton_support,
    "torch": _torch_support}


def sparse_attention_backends(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                              sinks: torch.Tensor | None = None, *,
                              value_dim: int | None = None) -> dict[str, str | None]:
    """For every backend, None where it takes this input, else the reason it does not
    (``value_dim`` None: not known, the libraries' value width is not checked)."""
    return {name: _SUPPORT[name](q, kv, indices, sinks, value_dim) for name in BACKENDS}


def _log_pick(name: str, refused: dict[str, str], q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
              sinks: torch.Tensor | None, value_dim: int | None) -> None:
    """Logs the first pick of ``name`` on this device type (once per process)."""
    if torch.compiler.is_compiling():
        return
    key = (_attention_library.device_type(q), name)
    if key in _LOGGED:
        return
    _LOGGED.add(key)
    detail = ""
    if name == "flashmla":
        detail = f" (forward FlashMLA, backward {_flashmla_backward(q, kv, indices, sinks, value_dim)[0]})"
    elif name == "cudnn":
        detail = " (forward Triton, backward cuDNN-frontend)"
    skipped = "; ".join(f"{other}: {reason}" for other, reason in refused.items())
    _LOG.info("sparsecp.sparse_attention on %s takes %r%s%s", key[0], name, detail,
              f"; not taken: {skipped}" if skipped else "")


def sparse_attention_backend(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                             sinks: torch.Tensor | None = None, backend: str | None = None, *,
                             value_dim: int | None = None) -> str:
    """The backend ``sparse_attention`` runs for this input: ``backend`` itself when it can take the
    input (else ValueError with its reason), or with None the first in ``PICK_ORDER`` for the
    tensors' device type that takes it (CPU: the C++ kernel, then the torch path; CUDA: FlashMLA,
    cuDNN-frontend, Triton, the torch path). ``value_dim`` None: not known (the libraries check
    their value width again when ``sparse_attention`` runs). The first pick of each backend on
    each device type is logged (INFO, logger ``sparsecp.attention``)."""
    if backend is not None:
        if backend not in _SUPPORT:
            raise ValueError(f"sparse_attention backend must be one of {', '.join(BACKENDS)} or None, got {backend!r}")
        reason = _SUPPORT[backend](q, kv, indices, sinks, value_dim)
        if reason is not None:
            raise ValueError(f"sparse_attention backend {backend!r} cannot take this input: {reason}")
        _log_pick(backend, {}, q, kv, indices, sinks, value_dim)
        return backend
    kind = _attention_library.device_type(q)
    order = PICK_ORDER.get(kind, PICK_ORDER["cuda"])
    if kind == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        order = ("cpu", "torch")  # the interpreter is for tests that ask for it by name
    refused: dict[str, str] = {}
    for name in order:
        reason = _SUPPORT[name](q, kv, indices, sinks, value_dim)
        if reason is None:
            _log_pick(name, refused, q, kv, indices, sinks, value_dim)
            return name
        refused[name] = reason
    _log_pick("torch", refused, q, kv, indices, sinks, value_dim)
    return "torch"


class _TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
                scale: float, value_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = _attention_triton.forward(q, kv, indices, scale, value_dim, sinks)
        ctx.save_for_backward(q, kv, indices, sinks, out, lse)
        ctx.scale, ctx.value_dim = scale, value_dim
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor | None) -> tuple[Any, ...]:
        q, kv, indices, sinks, out, lse = ctx.saved_tensors
        grad_q, grad_kv, grad_sinks = _attention_triton.backward(
            q, kv, indices, ctx.scale, ctx.value_dim, sinks, out, lse, grad_out.contiguous())
        return grad_q, grad_kv, None, grad_sinks, None, None


class _LibraryAttention(torch.autograd.Function):
    """An installed library's forward with another's backward (from the forward's out and lse)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
                scale: float, value_dim: int, forward: Callable[..., Any],
                backward: Callable[..., Any]) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = forward(q, kv, indices, scale, value_dim, sinks)
        ctx.save_for_backward(q, kv, indices, sinks, out, lse)
        ctx.scale, ctx.value_dim, ctx.backward = scale, value_dim, backward
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor | None) -> tuple[Any, ...]:
        q, kv, indices, sinks, out, lse = ctx.saved_tensors
        grad_q, grad_kv, grad_sinks = ctx.backward(q, kv, indices, ctx.scale, ctx.value_dim, sinks, out, lse,
                                                   grad_out.contiguous())
        return grad_q, grad_kv, None, grad_sinks, None, None, None, None


def _library_attention(name: str, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                       sinks: torch.Tensor | None, scale: float, value_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    if name == "flashmla":
        paired, why = _flashmla_backward(q, kv, indices, sinks, value_dim)
        if paired is None:
            raise ValueError(f"sparse_attention backend 'flashmla' cannot take this input: {why}")
        backward = _attention_cudnn.backward if paired == "cudnn" else _attention_triton.backward
        return _LibraryAttention.apply(q, kv, indices, sinks, scale, value_dim, _attention_flashmla.forward,
                                       backward)
    return _LibraryAttention.apply(q, kv, indices, sinks, scale, value_dim, _attention_triton.forward,
                                   _attention_cudnn.backward)


def _torch_attention(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor | None,
                     scale: float, value_dim: int, return_lse: bool,
                     chunk_bytes: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    valid = indices >= 0
    index = torch.where(valid, indices, torch.zeros_like(indices)).long()
    if kv.shape[0] == 0:  # every id is -1: gather from one zero row, which no row attends
        kv = torch.cat([kv, kv.new_zeros((1, kv.shape[1]))])
    chunk = attention_chunk_rows(max(indices.shape[1], 1), q.shape[1], q.shape[2], value_dim, q.element_size(),
                                 chunk_bytes or DEFAULT_CHUNK_BYTES)
    values = None if value_dim == kv.shape[1] else kv[:, :value_dim]
    out = _chunked_attention(q.transpose(0, 1), kv, lambda a, b: (index[a:b], valid[a:b]), scale=scale,
                             values=values, sinks=sinks, chunk_rows=chunk).transpose(0, 1)
    lse = None
    if return_lse:
        with torch.no_grad():
            lse = torch.full((q.shape[0], q.shape[1]), float("-inf"), dtype=_accumulate_dtype(q.dtype),
                             device=q.device)
            for start in range(0, q.shape[0], chunk):
                stop = min(q.shape[0], start + chunk)
                keys = kv[index[start:stop]]  # [rows, columns, qk_dim]
                logits = torch.einsum("rhd,rcd->rhc", q[start:stop], keys).to(lse.dtype) * scale
                logits = logits.masked_fill(~valid[start:stop, None, :], float("-inf"))
                if logits.shape[-1]:
                    lse[start:stop] = torch.logsumexp(logits, dim=-1)
    return out, lse


def sparse_attention(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float, *,
                     value_dim: int | None = None, sinks: torch.Tensor | None = None, return_lse: bool = False,
                     backend: str | None = None, chunk_bytes: int | None = None) -> Any:
    """Each query row's softmax attention over the ``kv`` rows its ``indices`` list.

    Args:
        q: ``[rows, heads, qk_dim]``.
        kv: ``[keys, qk_dim]``, one key row for every head; values are ``kv[:, :value_dim]``.
        indices: ``[rows, columns]`` int32, ids into ``kv`` or ``-1`` for none.
        scale: The logit scale (finite).
        value_dim: Value columns (default: ``qk_dim``).
        sinks: ``[heads]`` sink logits, or None.
        return_lse: Also return ``lse`` ``[rows, heads]`` (over the keys only; no gradient).
        backend: ``"cpu"``, ``"flashmla"``, ``"cudnn"``, ``"triton"``, ``"torch"`` or None (the
            first that takes the input, ``PICK_ORDER``).
        chunk_bytes: Scratch budget that sets how many rows go together: per thread for the C++
            kernel (default 1 MiB: about a core's L2), per row chunk for the torch path (default
            64 MiB). Never
            changes results beyond the last bits of the torch path's sums.

    Returns:
        ``out`` ``[rows, heads, value_dim]``, or ``(out, lse)`` with ``return_lse=True``.

    Raises:
        ValueError: naming the argument: shapes, dtypes or devices that do not agree, ids out of
            range (checked for CPU tensors), a non-finite scale, a backend that cannot take the input.
    """
    value_dim = int(kv.shape[1] if value_dim is None else value_dim) if isinstance(kv, torch.Tensor) else 0
    scale = float(scale)
    if chunk_bytes is not None and (isinstance(chunk_bytes, bool) or int(chunk_bytes) != chunk_bytes
                                    or chunk_bytes < 1):
        raise ValueError(f"sparse_attention chunk_bytes must be a positive integer or None, got {chunk_bytes!r}")
    chunk = int(chunk_bytes or 0)
    _check(q, kv, indices, scale, value_dim, sinks)
    name = sparse_attention_backend(q, kv, indices, sinks, backend, value_dim=value_dim)
    if name != "cpu" and not torch.compiler.is_compiling():  # the C++ kernel checks them itself
        _check_ids(indices, kv.shape[0])
    if name == "cpu":
        out, lse = torch.ops.sparsecp.sparse_attention(q, kv, indices, sinks, scale, value_dim, chunk)
    elif name == "triton":
        out, lse = _TritonAttention.apply(q, kv, indices, sinks, scale, value_dim)
    elif name in ("flashmla", "cudnn"):
        out, lse = _library_attention(name, q, kv, indices, sinks, scale, value_dim)
    else:
        out, lse = _torch_attention(q, kv, indices, sinks, scale, value_dim, return_lse, chunk)
    return (out, lse) if return_lse else out


def sparse_attention_gemm(dtype: torch.dtype = torch.bfloat16, heads: int | None = None) -> str:
    """What multiplies a C++ kernel call of ``dtype`` with ``heads`` query heads (None: more than
    8): ``"onednn <version>"`` or ``"blas"`` (a library's products), or ``"direct"`` (float32
    with 1, 2, 4 or 8 heads on AVX-512 and AVX2 CPUs: the kernel's own vector loops read each
    row's kv rows where they lie, where a library call per row costs more than its
    matrix-vector arithmetic)."""
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float64: "float64"}
    if dtype not in names:
        raise ValueError(f"sparse_attention_gemm dtype must be float32, bfloat16 or float64, got {dtype}")
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int) or heads < 1):
        raise ValueError(f"sparse_attention_gemm heads must be a positive int or None, got {heads!r}")
    return str(_core.sparse_attention_gemm(names[dtype], heads=heads or 0))
