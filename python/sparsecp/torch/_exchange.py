"""The row exchange of the indexer inputs and results: one implementation.

``launch_rows`` moves one [rows, ...] tensor one way along a route (``to_workers``: an
owner's rows to the ranks that select them, in worker order; ``to_owners``: the selected
ids back, in owner order) with the seed's one collective,
``torch.distributed.all_to_all_single(..., async_op=True)``: rows a rank keeps are copied
directly and never sent to itself, and the returned single-use ``_PendingRows`` places
the received rows when waited on. ``launch_fields`` packs fields of one dtype side by side
(``dtype_groups``) and launches one exchange per dtype group; ``unpack_fields`` splits
them again. The synchronous seed helpers (``_exchange_rows``, ``_exchange_inputs``), the
overlapped handles and the result path all go through ``launch_rows``.

Bytes handed to the collective are counted (``exchange_stats``).
"""
from __future__ import annotations

import atexit
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from ._route import IndexerRoute


class ExchangeBytes(NamedTuple):
    """Bytes one rank moves to and from other ranks in one balanced selection."""

    inputs_sent: int
    inputs_received: int
    results_sent: int
    results_received: int

    @property
    def sent(self) -> int:
        return self.inputs_sent + self.results_sent

    @property
    def received(self) -> int:
        return self.inputs_received + self.results_received


def expected_exchange_bytes(route: IndexerRoute, input_row_bytes: int, topk: int,
                            index_bytes: int = 4) -> ExchangeBytes:
    """The route's prediction of the bytes this rank moves (C++ expected_exchange_bytes).

    Args:
        route: This rank's route (an ``IndexerRoute``).
        input_row_bytes: Bytes of one row of all input fields together, e.g.
            q_rank * 2 (bf16 qr) + heads * 4 + rope_dim * 4 (fp32 weights, cos, sin).
        topk: Selected ids per row.
        index_bytes: Bytes of one id (4: int32).
    """
    core = getattr(route, "core", None)
    if core is not None and index_bytes == 4:
        return ExchangeBytes(*core.expected_bytes(input_row_bytes, topk))
    # TODO(issue 17): use the C++ route's expected_exchange_bytes (the binding, Route.expected_bytes,
    # has int32 ids only and needs a C++ route; this covers other id widths and routes built in Python).
    sent, received = len(route.send_rows), len(route.receive_rows)
    result_row = topk * index_bytes
    return ExchangeBytes(sent * input_row_bytes, received * input_row_bytes, received * result_row,
                         sent * result_row)


@dataclass
class _Stats:
    bytes_sent: int = 0
    bytes_received: int = 0
    exchanges: int = 0


_STATS = _Stats()
_STATS_LOCK = threading.Lock()


def exchange_stats() -> dict[str, int]:
    """Bytes this process handed to / received from other ranks through the indexer
    exchanges since the last reset (``bytes_sent``, ``bytes_received``), and the number of
    all-to-all calls (``exchanges``). Rows a rank keeps are never sent, so these equal
    ``expected_exchange_bytes`` of the routes used."""
    with _STATS_LOCK:
        return {"bytes_sent": _STATS.bytes_sent, "bytes_received": _STATS.bytes_received,
                "exchanges": _STATS.exchanges}


def reset_exchange_stats() -> None:
    """Zero the counters of ``exchange_stats``."""
    with _STATS_LOCK:
        _STATS.bytes_sent = _STATS.bytes_received = _STATS.exchanges = 0


def _all_to_all(received: torch.Tensor, send: torch.Tensor, output_splits: list[int], input_splits: list[int],
                group: Any) -> Any:
    """The seed's one collective (async), counted."""
    work = dist.all_to_all_single(received, send, output_splits, input_splits, group=group, async_op=True)
    with _STATS_LOCK:
        _STATS.bytes_sent += send.numel() * send.element_size()
        _STATS.bytes_received += received.numel() * received.element_size()
        _STATS.exchanges += 1
    return work


class DeviceRows(NamedTuple):
    """A route's row lists as int64 tensors on the data's device."""

    send_rows: torch.Tensor  # local owner rows, grouped by destination
    receive_rows: torch.Tensor  # worker positions, grouped by source owner
    local_sources: torch.Tensor  # local owner rows this rank selects itself
    local_targets: torch.Tensor  # their worker positions


@lru_cache(maxsize=32)
@torch.inference_mode(False)
def _device_rows(route: IndexerRoute, device: torch.device) -> DeviceRows:
    """The route's (send_rows, receive_rows, local_sources, local_targets) on ``device``, in
    tensors of their own (on the CPU too: they must not keep a C++ route's memory, and with it the
    route, alive from wherever they are kept; see ``IndexerRoute.detached``)."""
    return DeviceRows(*(torch.tensor(getattr(route, name).array, device=device) for name in DeviceRows._fields))


atexit.register(_device_rows.cache_clear)  # its routes, before module teardown (_plans.py)
# The public name of the seed's ``_device_rows`` for the rest of the package (sparsecp.models).
device_rows = _device_rows


class WorkerInputs(NamedTuple):
    """A worker's selection inputs, each [1, worker rows, width] in worker order
    (``IndexerInputExchange.wait()``)."""

    qr: torch.Tensor
    weights: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


@dataclass
class _PendingRows:
    """Own communication buffers until the receive is safe to consume."""

    send: torch.Tensor | None
    received: torch.Tensor | None
    output: torch.Tensor | None
    receive_rows: torch.Tensor
    work: Any
    consumed: bool = False

    @torch.no_grad()
    def wait(self) -> torch.Tensor:
        """Wait once, then restore received rows and release transfer storage.

        Returns:
            [rows, width]: worker order for inputs, owner order for results.
        """
        if self.consumed:
            raise RuntimeError("Indexer communication handle cannot be consumed twice")
        self.consumed = True
        self.work.wait()
        output = self.output
        assert output is not None and self.received is not None
        output.index_copy_(0, self.receive_rows, self.received)
        self.send = self.received = self.output = self.work = None
        return output


class Direction(NamedTuple):
    """One way rows move along a route."""

    gather: torch.Tensor  # source rows sent, grouped by destination rank
    scatter: torch.Tensor  # output rows of the received rows, grouped by source rank
    keep_from: torch.Tensor  # source rows this rank keeps
    keep_to: torch.Tensor  # their output rows
    send_splits: list[int]  # rows sent to each rank
    receive_splits: list[int]  # rows received from each rank
    rows: int  # output rows


def to_workers(route: IndexerRoute, rows: DeviceRows) -> Direction:
    """Owner rows to the ranks that select them: [route.owner_rows, ...] -> [route.query_count, ...]."""
    return Direction(rows.send_rows, rows.receive_rows, rows.local_sources, rows.local_targets,
                     route.input_splits.array.tolist(), route.output_splits.array.tolist(), route.query_count)


def to_owners(route: IndexerRoute, rows: DeviceRows, owner_rows: int) -> Direction:
    """Selected rows back to their owners: [route.query_count, ...] -> [owner_rows, ...]."""
    return Direction(rows.receive_rows, rows.send_rows, rows.local_targets, rows.local_sources,
                     route.output_splits.array.tolist(), route.input_splits.array.tolist(), owner_rows)


def launch_rows(tensor: torch.Tensor, direction: Direction, group: Any) -> _PendingRows:
    """Send ``tensor``'s rows along ``direction``; rows kept here are copied at once."""
    send = tensor.index_select(0, direction.gather).contiguous()
    received = tensor.new_empty((sum(direction.receive_splits), *tensor.shape[1:]))
    work = _all_to_all(received, send, direction.receive_splits, direction.send_splits, group)
    output = tensor.new_empty((direction.rows, *tensor.shape[1:]))
    output.index_copy_(0, direction.keep_to, tensor.index_select(0, direction.keep_from))
    return _PendingRows(send, received, output, direction.scatter, work)


def dtype_groups(tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, ...], ...]:
    """Indices of the tensors of each dtype, dtypes in order of first appearance."""
    groups: dict[torch.dtype, list[int]] = {}
    for index, tensor in enumerate(tensors):
        groups.setdefault(tensor.dtype, []).append(index)
    return tuple(tuple(indices) for indices in groups.values())


def launch_fields(fields: Sequence[torch.Tensor], direction: Direction,
                  group: Any) -> tuple[tuple[_PendingRows, ...], tuple[tuple[int, ...], ...]]:
    """Launch [1, rows, width] fields, those of one dtype packed side by side without
    rounding (one exchange per dtype group). Returns the transfers and the groups."""
    groups = dtype_groups(fields)
    transfers = tuple(launch_rows(torch.cat([fields[index][0] for index in indices], dim=-1), direction, group)
                      for indices in groups)
    return transfers, groups


def unpack_fields(merged: Sequence[torch.Tensor], groups: Sequence[Sequence[int]],
                  widths: Sequence[int]) -> list[torch.Tensor]:
    """The fields again, each [1, rows, width], from the groups' [rows, sum of widths]."""
    outputs: list[Any] = [None] * len(widths)
    for tensor, indices in zip(merged, groups):
        for index, value in zip(indices, tensor.split([widths[i] for i in indices], dim=-1)):
            outputs[index] = value.unsqueeze(0).contiguous()
    return outputs


def _exchange_rows(tensor: torch.Tensor, route: IndexerRoute, group: Any, rows: DeviceRows) -> torch.Tensor:
    """Exchange remote rows and place local bypass rows in worker task order."""
    return launch_rows(tensor, to_workers(route, rows), group).wait()


def _exchange_inputs(inputs: tuple[torch.Tensor, ...], route: IndexerRoute, group: Any, rows: DeviceRows) -> tuple:
    """Pack fields of equal dtype together without rounding the original RoPE values."""
    transfers, groups = launch_fields(inputs, to_workers(route, rows), group)
    return tuple(unpack_fields([transfer.wait() for transfer in transfers], groups,
                               [tensor.shape[-1] for tensor in inputs]))
