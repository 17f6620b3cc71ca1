"""Rank tasks for test_selector_device_path.py: a training step's host syncs on the device code
path (``SPARSECP_TORCH_PATH=1``: the torch selection, the running top-k's sort instead of
``nonzero``, the torch KL) with CPU tensors, counted as test_v4_bounded counts them."""
from __future__ import annotations

import os
from typing import Any

import v4_bounded_tasks


def device_path_host_syncs(rank: int, size: int, layers: int, model: str) -> dict[str, Any]:
    """``v4_bounded_tasks.host_syncs`` (or ``v32_host_syncs``) with the device code path on and
    ``nonzero`` counted as a host read (its output size is data-dependent: a sync on a GPU)."""
    from sparsecp.models._cp import topk as _cp_topk

    saved = os.environ.get("SPARSECP_TORCH_PATH"), _cp_topk._DEVICE_PATH, v4_bounded_tasks._TENSOR_READS
    os.environ["SPARSECP_TORCH_PATH"] = "1"
    _cp_topk._DEVICE_PATH = True
    v4_bounded_tasks._TENSOR_READS = (*saved[2], "nonzero")
    try:
        if model == "v4":
            return v4_bounded_tasks.host_syncs(rank, size, layers, True)
        return v4_bounded_tasks.v32_host_syncs(rank, size, layers)
    finally:
        if saved[0] is None:
            os.environ.pop("SPARSECP_TORCH_PATH", None)
        else:
            os.environ["SPARSECP_TORCH_PATH"] = saved[0]
        _cp_topk._DEVICE_PATH, v4_bounded_tasks._TENSOR_READS = saved[1], saved[2]
