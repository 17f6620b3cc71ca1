"""What the installed-library backends of ``sparse_attention`` share (``_attention_flashmla``,
``_attention_cudnn``): finding the library, the device they run on, and the lse conventions.

* ``load(name)``: the module, imported once (a failed import is remembered, so a support check
  that runs every layer does not search the path again); a module already in ``sys.modules`` is
  used as it is (the unit tests put stand-ins there).
* ``device_type(tensor)`` and ``capability(device)``: where a tensor is and the GPU's (major,
  minor); the only two facts about the machine the support checks read, kept apart so that tests
  can stand in a CUDA device for CPU tensors.
* FlashMLA's and cuDNN-frontend's lse is the natural log-sum-exp over the keys (the sink left
  out), with ``+inf`` for a row that lists no key; sparsecp's contract says ``-inf`` there.
  ``lse_from_library`` and ``lse_for_library`` convert.
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType

import torch

__all__ = ["capability", "device_type", "load", "lse_for_library", "lse_from_library"]

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


def lse_from_library(lse: torch.Tensor) -> torch.Tensor:
    """A library's lse in the contract's convention: ``+inf`` (no key) becomes ``-inf``."""
    return torch.where(lse == float("inf"), torch.full_like(lse, float("-inf")), lse)


def lse_for_library(lse: torch.Tensor) -> torch.Tensor:
    """The contract's lse as the libraries take it: float32, contiguous, ``-inf`` (no key) as
    ``+inf``."""
    lse = lse.float()
    return torch.where(lse == float("-inf"), torch.full_like(lse, float("inf")), lse).contiguous()
