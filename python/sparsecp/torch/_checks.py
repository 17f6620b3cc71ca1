"""The indexer exchange's input checks and cross-rank agreement (not in the seed, which
trusts every rank's inputs): every rank validates locally and then, whatever happened,
takes part in one agreement (``_agreement.agree``) before any data moves."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ._agreement import agree, capture, control_device, dtype_code
from ._plans import Planned, empty_fingerprint, planned, planning_inputs, unusable_fingerprint

INPUT_NAMES = ("qr", "weights", "cos", "sin")
BATCH_TEXT = "Indexer balance requires batch one and equal contiguous source query shards"

R = TypeVar("R")


def check_inputs(inputs: tuple, size: int, tokens: int, axes_text: str) -> None:
    """The seed's input checks and texts (``tokens``: sum of the document lengths)."""
    query_residual = inputs[0]
    if (len(inputs) != 4 or query_residual.ndim != 3 or query_residual.shape[0] != 1
            or query_residual.shape[1] * size != tokens):
        raise ValueError(BATCH_TEXT)
    if any(tensor.ndim != 3 or tensor.shape[:2] != query_residual.shape[:2]
           or tensor.device != query_residual.device for tensor in inputs):
        raise ValueError(axes_text)


def launch_checks(inputs: tuple, lengths: Any, ratio: int, mode: Any, group: Any, block_size: Any,
                  zigzag_min_length: Any, params: dict[str, Any], axes_text: str,
                  wrap: Callable[[Any], R]) -> R:
    """Validate, route and agree with every rank; returns this rank's route (``wrap``ped).

    The lengths are converted once (``planning_inputs``) and cross into C++ once, into the
    agreement's fingerprint, which the route then plans from; both come from the plan
    cache's entry for them."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    tensors = tuple(value for value in inputs if isinstance(value, torch.Tensor))
    device = control_device(group, tensors[0].device if tensors else None)
    entry: Planned | None
    entry, unusable = capture(lambda: planned(planning_inputs(lengths, size, ratio, mode, block_size,
                                                              zigzag_min_length, params)))

    def check() -> R:
        if len(tensors) != len(inputs):
            raise ValueError(BATCH_TEXT)
        if entry is None:
            assert unusable is not None
            raise unusable
        check_inputs(inputs, size, entry.tokens, axes_text)
        return entry.route(rank, wrap)

    settings = tuple(setting for name, tensor in zip(INPUT_NAMES, tensors)
                     for setting in ((name + " width", int(tensor.shape[-1]) if tensor.ndim else -1),
                                     (name + " dtype", dtype_code(tensor.dtype))))
    settings += (("fields", len(inputs)),)
    if entry is not None:  # first: the route then plans on the lengths it holds in C++
        fingerprint = entry.fingerprint(settings)
    else:
        fingerprint = unusable_fingerprint(mode)
        for name, value in settings:
            fingerprint.add(name, value)
    route, error = capture(check)
    agree(group, device, error, fingerprint, "Indexer input exchange")
    return route


def result_checks(selected: Any, query_count: int, group: Any, device_hint: torch.device,
                  failure: BaseException | None = None) -> None:
    """Every rank returns [query_count, topk] results of one dtype and topk; agreed.

    ``failure`` is this rank's selector error, if it raised: every rank raises then."""
    device = control_device(group, device_hint)

    def check() -> None:
        if failure is not None:
            raise failure
        if not isinstance(selected, torch.Tensor) or selected.ndim != 2 or selected.shape[0] != query_count:
            shape = tuple(selected.shape) if isinstance(selected, torch.Tensor) else type(selected).__name__
            raise ValueError(f"Indexer selection must return [{query_count}, topk] rows for this worker, "
                             f"got {shape}")
        if selected.device != device_hint:
            raise ValueError(f"Indexer selection returned a tensor on {selected.device}, expected {device_hint}")

    _, error = capture(check)
    fingerprint = empty_fingerprint()
    if error is None:
        fingerprint.add("topk", int(selected.shape[1])).add("result dtype", dtype_code(selected.dtype))
    agree(group, device, error, fingerprint, "Indexer result exchange", invalid_first=True)
