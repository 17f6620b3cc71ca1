"""What the installed-library backends of ``sparse_attention`` share (``_attention_flashmla``,
``_attention_cudnn``): finding the library, the device they run on, what they take, and the lse
conventions.

* ``load(name)``: the module, imported once (a failed import is remembered, so a support check
  that runs every layer does not search the path again); a module already in ``sys.modules`` is
  used as it is (the unit tests put stand-ins there).
* ``device_type(tensor)`` and ``capability(device)``: where a tensor is and the GPU's (major,
  minor); the only two facts about the machine the support checks read, kept apart so that tests
  can stand in a CUDA device for CPU tensors.
* ``LibraryKernel``: one library entry point and the inputs the adapter hands it (both take
  bfloat16, 64 or 128 heads, qk_dim 512 or 576, value_dim 512, int32 ids, on sm_90 and the
  sm_100 family); ``find_function(kernel)`` finds it, ``support_reason(kernel, ...)`` says why an
  input is refused (None when it is taken): the one support check both adapters run.
* FlashMLA's and cuDNN-frontend's lse is the natural log-sum-exp over the keys (the sink left
  out), with ``+inf`` for a row that lists no key; sparsecp's contract says ``-inf`` there.
  ``lse_from_library`` and ``lse_for_library`` convert.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import torch

__all__ = ["LibraryKernel", "architecture_reason", "capability", "device_type", "find_function", "load",
           "lse_for_library", "lse_from_library", "support_reason"]

_FAILED: dict[str, str] = {}


def load(name: str) -> tuple[ModuleType | None, str | None]:
    """``(module, None)``, or ``(None, why it does not import)``."""
    module = sys.modules.get(name)
    if module is not None:
        return module, None
    if name in _FAILED:
        return None, _FAILED[name]
    try:
        return importlib.import_module(name), None
    except Exception as error:  # ImportError, or a library that fails while loading its extension
        _FAILED[name] = f"{name} does not import ({type(error).__name__}: {error})"
        return None, _FAILED[name]


def device_type(tensor: torch.Tensor) -> str:
    """``tensor.device.type``."""
    return tensor.device.type


def capability(device: torch.device) -> tuple[int, int]:
    """The CUDA device's compute capability (major, minor)."""
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


@dataclass(frozen=True)
class LibraryKernel:
    """One library function behind the contract, and what the adapter hands it."""

    module: str                            # import path, e.g. "flash_mla"
    name: str                              # the function's name in it
    title: str                             # what refusals call it: "FlashMLA's sparse forward"
    missing: str = ""                      # said after "has no <name>" (why it may be absent)
    heads: tuple[int, ...] = (64, 128)     # query heads taken
    qk_dims: tuple[int, ...] = (512, 576)  # q and kv widths taken
    value_dim: int = 512                   # the only value width taken


def find_function(kernel: LibraryKernel) -> tuple[Callable[..., Any] | None, str | None]:
    """``(the library's function, None)``, or ``(None, why it cannot be had)``."""
    module, why = load(kernel.module)
    if module is None:
        return None, why
    found = getattr(module, kernel.name, None)
    if found is None:
        return None, f"{kernel.module} has no {kernel.name}{kernel.missing}"
    return found, None


def architecture_reason(kernel: LibraryKernel, major: int, minor: int) -> str | None:
    """None on sm_90 and sm_100-family GPUs (both libraries' sm_90a / sm_100f kernels)."""
    if (major, minor) == (9, 0) or major == 10:
        return None
    return f"sm_{major}{minor}: {kernel.title} runs on sm_90 and sm_100 only"


def support_reason(kernel: LibraryKernel, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                   sinks: torch.Tensor | None, value_dim: int | None) -> str | None:
    """None when the adapter can hand ``kernel`` the input, else why not: the library imports
    and has the function, CUDA tensors in bfloat16 on sm_90 / sm_100, the heads, qk_dim and
    value_dim ``kernel`` takes, int32 ids, ``[heads]`` sinks. ``value_dim`` None means not known
    yet (``sparse_attention`` checks again with it)."""
    found, why = find_function(kernel)
    if found is None:
        return why
    if device_type(q) != "cuda":
        return f"tensors on {q.device.type}, not a CUDA device"
    if q.dtype != torch.bfloat16 or kv.dtype != torch.bfloat16:
        return f"dtype {q.dtype}: {kernel.title} is taken in bfloat16"
    reason = architecture_reason(kernel, *capability(q.device))
    if reason is not None:
        return reason
    if q.dim() != 3 or q.shape[1] not in kernel.heads:
        heads = " or ".join(str(h) for h in kernel.heads)
        return f"{q.shape[1] if q.dim() == 3 else '?'} heads: {kernel.title} is taken at {heads}"
    if q.shape[2] not in kernel.qk_dims:
        dims = " or ".join(str(d) for d in kernel.qk_dims)
        return f"qk_dim {q.shape[2]}: {kernel.title} takes {dims}"
    if value_dim is not None and value_dim != kernel.value_dim:
        return f"value_dim {value_dim}: {kernel.title} takes {kernel.value_dim}"
    if indices.dtype != torch.int32:
        return f"indices dtype {indices.dtype}: {kernel.title} takes int32"
    if sinks is not None and (sinks.dim() != 1 or sinks.shape[0] != q.shape[1]):
        return "sinks must be [heads]"
    return None


def lse_from_library(lse: torch.Tensor) -> torch.Tensor:
    """A library's lse in the contract's convention: ``+inf`` (no key) becomes ``-inf``."""
    return torch.where(lse == float("inf"), torch.full_like(lse, float("-inf")), lse)


def lse_for_library(lse: torch.Tensor) -> torch.Tensor:
    """The contract's lse as the libraries take it: float32, contiguous, ``-inf`` (no key) as
    ``+inf``."""
    lse = lse.float()
    return torch.where(lse == float("-inf"), torch.full_like(lse, float("inf")), lse).contiguous()
