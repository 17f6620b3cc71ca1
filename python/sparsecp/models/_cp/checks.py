"""Model-agnostic checks a context-parallel model makes across its CP ranks.

* ``agree_parameters``: at ``context_parallel`` time, every rank must hold the same weights (a
  rank that loaded another checkpoint, or initialised with another seed, would compute silently
  wrong logits for the rows whose keys it owns). One all-reduce of per-parameter checksums, made
  once; a difference raises on every rank, naming the first parameter that differs.
* ``batch_digest``: a short digest of a whole packed batch, which ``shard_batch`` attaches to
  the shard it returns; the forward's agreement compares it across ranks, so a rank handed
  another batch's shard (same lengths, other tokens) is refused instead of training on a mix.
"""
from __future__ import annotations

import hashlib
import numbers
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["BATCH_DIGEST", "agree_parameters", "batch_digest", "kl_coeff_option"]

BATCH_DIGEST = "_sparsecp_batch_digest"  # the attribute shard_batch sets on the shards it returns
_SLICE = 1 << 22  # elements of a parameter summed in float64 at once


def agree_parameters(module: torch.nn.Module, group: Any, what: str) -> None:
    """Raise on every rank of ``group`` unless every rank's parameters and buffers match (their
    float64 sums and sums of squares, within float64 rounding of the same values).

    Parameters on the meta device (deferred initialisation) are skipped: they hold no values yet.
    """
    if dist.get_world_size(group) == 1:
        return
    names, sums = [], []
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.device.type == "meta" or tensor.dtype.is_complex:
            continue
        with torch.no_grad():
            # In slices: a float64 copy of a whole embedding table could itself exhaust memory.
            total = torch.zeros(2, dtype=torch.float64, device=tensor.device)
            for piece in tensor.detach().reshape(-1).split(_SLICE):
                values = piece.to(torch.float64)
                total += torch.stack([values.sum(), (values * values).sum()])
            sums.append(total)
        names.append(name)
    if not names:
        return
    device = torch.device("cpu") if "gloo" in str(dist.get_backend(group)).lower() else sums[0].device
    local = torch.stack(sums).to(device)
    smallest, largest = local.clone(), local.clone()
    dist.all_reduce(smallest, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
    gap = (largest - smallest).abs() > 1e-9 * largest.abs().clamp_min(1.0)
    gap |= torch.isnan(largest) != torch.isnan(smallest)
    differing = [name for name, bad in zip(names, gap.any(dim=1).tolist()) if bad]
    if differing:
        raise ValueError(f"{what}: the CP ranks hold different weights ({len(differing)} of {len(names)} parameters "
                         f"and buffers differ, first {differing[0]!r}): every CP rank must load the same checkpoint "
                         "(or initialise with the same seed) before context_parallel")


def batch_digest(input_ids: torch.Tensor) -> str:
    """A short digest of a whole packed batch's token ids (host bytes; made once per batch at
    data-preparation time)."""
    data = input_ids.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def kl_coeff_option(value: Any) -> float | None:
    """``indexer_kl_coeff=``'s value, checked: None (no KL) or a finite real number (an int,
    float, numpy scalar or one-element real tensor; not a bool, not a string). The same
    argument on every rank, so a local refusal is every rank's."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not (value.dtype.is_complex or
                                                                       value.dtype == torch.bool):
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"indexer_kl_coeff must be a real number (the KL loss's coefficient) or None, got "
                         f"{value!r} ({type(value).__name__})")
    if not np.isfinite(float(value)):
        raise ValueError(f"indexer_kl_coeff must be finite, got {value}")
    return float(value)
