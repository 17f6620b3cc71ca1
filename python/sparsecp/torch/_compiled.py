"""The fixed-capacity exchange as functional code, for torch.compile (``fullgraph=True``).

Inside a compiled region the rows move with
``torch.distributed._functional_collectives.all_to_all_single`` (the functional
collectives torch.compile traces; ``all_to_all_single(async_op=True)`` and autograd
Functions holding a process group break the graph). The fixed capacity gives every
collective equal, static splits, so the graph has one shape whatever the batch.

The step outside and inside the compiled region:

* eager, once per step: ``fixed_step_indices(...)`` checks the call against the prebuilt
  routes and agrees with every rank (the one small all-reduce every launch makes), then
  returns the batch's padded index tensors (``FixedIndexTensors``) on the device: their
  shapes are the step's layout (``index.worker_rows``, ``index.owner_rows``,
  ``index.capacity``), the same on every rank since the routes' capacity and the batch were
  agreed;
* compiled: ``fixed_inputs_to_workers`` (owner fields -> worker rows [W, width]), the
  worker's projection and ``torch.ops.sparsecp.select_rows`` (ids [W, topk]),
  ``fixed_results_to_owners`` (-> [Q, topk]), the KL loss (``ops.indexer_kl_loss``), and
  its backward.

The compiled functions take the layout from the index they are given, never from another
source: the ``worker_rows`` / ``owner_rows`` arguments are optional and, where a rank passes
a value that differs from its index's (another layout's number on one rank), the rows still
move as the agreed index says and the function returns the index's rows. A compiled region
cannot raise on every rank without a collective and a host read of its own, and it needs
neither: what the ranks must agree on was agreed by ``fixed_step_indices``. Pass the index
of this step's ``fixed_step_indices`` call (another step's index of another capacity would
give the ranks' all-to-alls different sizes).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed._functional_collectives as funcol

from ._exchange import dtype_groups
from ._prebuilt import FixedIndices, _prebuilt_checks

__all__ = ["FixedIndexTensors", "fixed_inputs_to_workers", "fixed_results_to_owners", "fixed_step_indices"]


class FixedIndexTensors(NamedTuple):
    """A batch's padded index tensors on the device (``FixedIndices``, as tensors)."""

    send_rows: torch.Tensor
    receive_rows: torch.Tensor
    keep_from: torch.Tensor
    keep_to: torch.Tensor
    key_begin: torch.Tensor
    visible: torch.Tensor

    @classmethod
    def of(cls, indices: FixedIndices, device: torch.device) -> FixedIndexTensors:
        return cls(*(torch.from_numpy(getattr(indices, name)).to(device) for name in cls._fields))

    @property
    def worker_rows(self) -> int:
        """W: the worker rows a rank can hold (the fields' rows on the worker side)."""
        return int(self.key_begin.shape[0])

    @property
    def owner_rows(self) -> int:
        """Q: this rank's own rows."""
        return int(self.keep_from.shape[0])

    @property
    def slots(self) -> int:
        """P * C: the rows of each all-to-all (``capacity`` rows per peer)."""
        return int(self.send_rows.shape[0])


def fixed_step_indices(query_residual: torch.Tensor, weights: torch.Tensor, embeddings: tuple, lengths: Any,
                       ratio: int, mode: str, group: Any, block_size: int | None = None,
                       zigzag_min_length: int | None = None, *, routes: Any,
                       **strategy_params: Any) -> FixedIndexTensors:
    """Eager, before the compiled step: check the call against ``routes`` (prebuilt with a
    capacity) and agree with every rank of ``group`` (raises on every rank otherwise);
    the batch's index tensors for the compiled region. Collective."""
    inputs = (query_residual, weights, *embeddings)
    layer = _prebuilt_checks(inputs, lengths, ratio, mode, group, block_size, zigzag_min_length, strategy_params,
                             "Indexer qr, weights and rotary embeddings must share token axes and device", routes)
    if layer.indices is None:
        raise ValueError("fixed_step_indices needs routes prebuilt with a capacity (prebuild(..., capacity=...))")
    return FixedIndexTensors.of(layer.indices, query_residual.device)


def _move(tensor: torch.Tensor, gather: torch.Tensor, scatter: torch.Tensor, keep_from: torch.Tensor,
          keep_to: torch.Tensor, rows_out: int, group: Any) -> torch.Tensor:
    """[n, width] source rows -> [rows_out, width]: padded blocks through one functional
    all-to-all with equal splits; padding reads the appended zero row ``n`` and lands in
    the dropped row ``rows_out``."""
    padded = torch.cat([tensor, tensor.new_zeros((1, *tensor.shape[1:]))])
    received = funcol.all_to_all_single(padded.index_select(0, gather).contiguous(), None, None, group)
    out = tensor.new_zeros((rows_out + 1, *tensor.shape[1:]))
    out = out.index_copy(0, keep_to, padded.index_select(0, keep_from))
    out = out.index_copy(0, scatter, funcol.wait_tensor(received))
    return out[:rows_out]


def fixed_inputs_to_workers(fields: Sequence[torch.Tensor], index: FixedIndexTensors, worker_rows: int | None,
                            group: Any) -> list[torch.Tensor]:
    """Owner fields, each [1, Q, width] -> worker rows, each [W, width] (fields of one
    dtype packed side by side, one all-to-all per dtype group). Rows past the route's
    ``query_count`` are zero (``visible`` 0). W is ``index.worker_rows`` (``worker_rows``
    may be None; a different value is not used: the module docstring says why)."""
    worker_rows = index.worker_rows
    outputs: list[Any] = [None] * len(fields)
    for indices in dtype_groups(fields):
        packed = torch.cat([fields[i][0] for i in indices], dim=-1)
        moved = _move(packed, index.send_rows, index.receive_rows, index.keep_from, index.keep_to, worker_rows,
                      group)
        for i, value in zip(indices, moved.split([fields[i].shape[-1] for i in indices], dim=-1)):
            outputs[i] = value
    return outputs


def fixed_results_to_owners(selected: torch.Tensor, index: FixedIndexTensors, owner_rows: int | None,
                            group: Any) -> torch.Tensor:
    """Worker ids [W, topk] -> this rank's own rows' ids [Q, topk]; Q is ``index.owner_rows``
    (``owner_rows`` may be None; a different value is not used)."""
    owner_rows = index.owner_rows
    return _move(selected, index.receive_rows, index.send_rows, index.keep_to, index.keep_from, owner_rows, group)
