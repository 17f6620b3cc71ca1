"""Routes planned at data time (``prebuild``) and the fixed-capacity exchange.

``prebuild`` plans one batch for every layer ratio the model uses and keeps only host
integers (numpy arrays and Python values: picklable, so a data-loader worker can build
them; no process group, no torch device). The launch functions
(``launch_indexer_inputs``, ``balanced_indexer_select``) take them as ``routes=`` and
then plan nothing: they check that the call matches what was prebuilt, agree with the
other ranks (one small all-reduce, as every launch) and move the rows.

With ``capacity=`` (rows per peer, chosen once for the run; ``fixed_capacity`` derives
one from a sample of batches), the exchange is padded: every rank sends every rank
exactly ``capacity`` rows per dtype group (the unused slots padding), through staging
buffers that are allocated once per (group, device, shapes) and reused, so each step's
collective tensors have the same shapes and addresses whatever the batch, which is what
CUDA-graph capture needs. The padded index arrays are built by ``prebuild`` too. A batch
that needs more rows to one peer than the capacity raises ``ValueError`` in ``prebuild``
naming the rows needed and the capacity (it never truncates); since the need is a
property of the whole plan, every rank computes the same need and raises alike.

The launch functions check and agree eagerly (one small all-reduce, a host read) and
return the ids as a copy. The buffers serve one step at a time: a launch while the previous
launch on the same buffers is not finished (its result not waited for, and its handles
still alive) raises on every rank, since it would overwrite rows still travelling or the
index tensors and result rows that step still reads. A step given up (an exception while
its rows travel, a batch skipped) ends when its handles are dropped or ``abort()``ed: the
next launch first waits for the collectives it left in flight (every rank launched them),
then reuses the buffers. The layers of a model share the
buffers (the same group, capacity, owner rows and field layout, whatever their ratio):
finish one layer's selection before the next one's launch. For CUDA
graphs, capture the data movement itself: ``StagingBuffers.send_inputs`` /
``finish_inputs`` / ``send_results`` / ``finish_results`` with ``async_op=False`` and
``torch.ops.sparsecp.select_rows`` between them, after an eager ``load(indices)`` per
batch (python/examples/gpu_check.py does this). The buffers are keyed by the group's
``id``, device, capacity, owner rows and field layout.

Layout of the fixed path on one rank (``Q`` its owner rows, ``P`` the group size, ``C``
the capacity, ``W = Q + (P - 1) * C`` the worker rows it can ever hold):

* owner staging ``[Q + 1, width]`` (row ``Q`` stays zero: the source of padding slots),
* send / receive ``[P * C, width]`` (block ``p`` holds the rows to / from rank ``p``; the
  block to itself is all padding, since kept rows never travel),
* worker staging ``[W + 1, width]`` (row ``W`` is the sink of padding slots),
* the results the same way back with ``topk`` columns.
"""
from __future__ import annotations

import math
import numbers
import os
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .. import _core
from .. import _lengths as lengths_tuple
from .._checks import integer
from ._agreement import agree, capture, control_device, dtype_code
from ._checks import INPUT_NAMES, check_inputs
from ._exchange import _STATS, _STATS_LOCK, WorkerInputs, dtype_groups
from ._overlapped import launch_on_route
from ._plans import PlanningInputs, planned, planning_inputs, settings_fingerprint, unusable_fingerprint
from ._route import IndexerRoute
from ._worker_time import WorkerClock

__all__ = ["FixedIndices", "PrebuiltLayer", "PrebuiltRoutes", "StagingBuffers", "fixed_capacity",
           "padding_bytes", "prebuild"]

_ROUTE_ARRAYS = ("segments", "input_splits", "output_splits", "send_rows", "receive_rows", "local_sources",
                 "local_targets")


@dataclass(frozen=True)
class FixedIndices:
    """A route's row lists padded to a capacity (host int64 arrays), for the fixed exchange.

    ``send_rows`` [P * C]: block p = the owner rows sent to rank p, then ``owner_rows``
    (the zero row) in the unused slots; ``receive_rows`` [P * C]: block p = the worker
    positions of the rows received from rank p, then ``worker_rows`` (the sink row);
    ``keep_from`` / ``keep_to`` [Q]: the rows this rank keeps, padded with ``owner_rows``
    / ``worker_rows``; ``key_begin`` / ``visible`` [W]: per worker row the first bank key
    of its document and how many keys it sees (0 for padding rows: all -1 selected).
    """

    capacity: int
    owner_rows: int
    worker_rows: int
    send_rows: np.ndarray
    receive_rows: np.ndarray
    keep_from: np.ndarray
    keep_to: np.ndarray
    key_begin: np.ndarray
    visible: np.ndarray

    _TENSORS = ("send_rows", "receive_rows", "keep_from", "keep_to", "key_begin", "visible")


@dataclass
class PrebuiltLayer:
    """One ratio's prebuilt route: host arrays only (picklable)."""

    inputs: PlanningInputs
    rank: int
    arrays: dict[str, np.ndarray]
    query_count: int
    rows_needed: int  # the most rows any rank sends any other rank in this plan
    rows_moved: int  # rows this rank sends to others
    indices: FixedIndices | None
    _route: Any = field(default=None, repr=False, compare=False)
    _fingerprint: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_route"] = state["_fingerprint"] = None  # C++ / cached objects: rebuilt on use
        return state

    @property
    def route(self) -> Any:
        """This rank's ``IndexerRoute`` (built from the arrays on first use, no planning)."""
        if self._route is None:
            a = self.arrays
            self._route = IndexerRoute(a["segments"], a["input_splits"], a["output_splits"], a["send_rows"],
                                       a["receive_rows"], a["local_sources"], a["local_targets"], self.query_count)
        return self._route

    def fingerprint(self, settings: tuple[tuple[str, int], ...]) -> Any:
        """The planning inputs' fingerprint (hashes the lengths once per settings; plans
        nothing) with ``settings`` added."""
        if self._fingerprint is None:
            self._fingerprint = {}
        return settings_fingerprint(self.inputs, settings, self._fingerprint)


@dataclass
class PrebuiltRoutes:
    """A batch's routes for one rank, every prebuilt ratio (``prebuild``)."""

    lengths: tuple[int, ...]
    size: int
    rank: int
    mode: Any
    capacity: int | None
    layers: dict[int, PrebuiltLayer]

    @property
    def ratios(self) -> tuple[int, ...]:
        return tuple(self.layers)

    @property
    def rows_needed(self) -> int:
        """The most rows any rank sends any other rank, over every prebuilt ratio."""
        return max((layer.rows_needed for layer in self.layers.values()), default=0)

    def layer(self, ratio: int) -> PrebuiltLayer:
        found = self.layers.get(ratio)
        if found is None:
            raise ValueError(f"no route was prebuilt for ratio {ratio!r}; prebuilt ratios: {list(self.layers)}")
        return found

    def route(self, ratio: int) -> Any:
        """This rank's ``IndexerRoute`` for ``ratio``."""
        return self.layer(ratio).route


def _rows_needed(entry: Any, size: int) -> int:
    """The largest number of rows one rank sends one other rank in the plan. Other ranks'
    routes are built and dropped, not kept in the plan cache (a prebuilding data loader
    sees every batch once)."""
    plan = entry.plan()
    most = 0
    for source in range(size):
        splits = np.array(_core.route_from_plan(plan, source).input_splits)
        splits[source] = 0
        most = max(most, int(splits.max(initial=0)))
    return most


def _pad_blocks(rows: np.ndarray, splits: np.ndarray, capacity: int, fill: int) -> np.ndarray:
    """Rows grouped by peer (``splits`` each) laid out in blocks of ``capacity``, ``fill``
    in the unused slots."""
    out = np.full(len(splits) * capacity, fill, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(splits)[:-1]))
    for peer, (start, count) in enumerate(zip(starts.tolist(), splits.tolist())):
        out[peer * capacity:peer * capacity + count] = rows[start:start + count]
    return out


def _row_ranges(segments: np.ndarray, ratio: int, worker_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per worker row: its document's first bank key and how many keys it sees."""
    key_begin = np.zeros(worker_rows, dtype=np.int64)
    visible = np.zeros(worker_rows, dtype=np.int64)
    for q_begin, q_end, k_begin, k_end, residual in segments.tolist():
        end = (k_end - k_begin) * ratio + residual
        positions = np.arange(end - (q_end - q_begin), end, dtype=np.int64)
        key_begin[q_begin:q_end] = k_begin
        visible[q_begin:q_end] = (positions + 1) // ratio
    return key_begin, visible


def _fixed_indices(arrays: dict[str, np.ndarray], query_count: int, ratio: int, capacity: int) -> FixedIndices:
    size = len(arrays["input_splits"])
    owner_rows = len(arrays["send_rows"]) + len(arrays["local_sources"])
    worker_rows = owner_rows + (size - 1) * capacity
    kept = len(arrays["local_sources"])

    def padded(values: np.ndarray, rows: int, fill: int) -> np.ndarray:
        out = np.full(rows, fill, dtype=np.int64)
        out[:len(values)] = values
        return out

    key_begin, visible = _row_ranges(arrays["segments"], ratio, worker_rows)
    assert query_count <= worker_rows
    return FixedIndices(capacity, owner_rows, worker_rows,
                        _pad_blocks(arrays["send_rows"], arrays["input_splits"], capacity, owner_rows),
                        _pad_blocks(arrays["receive_rows"], arrays["output_splits"], capacity, worker_rows),
                        padded(arrays["local_sources"][:kept], owner_rows, owner_rows),
                        padded(arrays["local_targets"][:kept], owner_rows, worker_rows), key_begin, visible)


def prebuild(lengths: Sequence[int], size: int, rank: int, ratios: Iterable[int], mode: str,
             block_size: int | None = None, zigzag_min_length: int | None = None, *,
             capacity: int | None = None, **strategy_params: Any) -> PrebuiltRoutes:
    """Plan one batch ahead of its step: this rank's routes for every layer ratio.

    Pure host integers (no process group, no device: call it in a data-loader worker and
    hand the result over with the batch; it pickles). Pass it as ``routes=`` to
    ``launch_indexer_inputs`` / ``balanced_indexer_select``, which then plan nothing.

    Args:
        lengths, size, rank, mode, block_size, zigzag_min_length, **strategy_params: as
            ``indexer_route``.
        ratios: Every compression ratio the model's selection layers use.
        capacity: Rows per peer of the fixed-capacity exchange (``fixed_capacity``), or
            None for the exchange sized by each batch.

    Raises:
        ValueError: the planner's errors; with ``capacity``, a batch that needs more rows
            to one peer than the capacity (naming both). Every rank of the batch raises
            alike: the need is a property of the whole plan.
    """
    size, rank = integer("size", size, 1), integer("rank", rank, 0)
    if capacity is not None:
        capacity = integer("capacity", capacity, 1)
    ratios = tuple(ratios)

    layers: dict[int, PrebuiltLayer] = {}
    for ratio in ratios:
        inputs = planning_inputs(lengths, size, ratio, mode, block_size, zigzag_min_length, strategy_params)
        entry = planned(inputs)
        core = entry.route(rank, IndexerRoute.from_core).core
        assert core is not None  # the plan cache's routes wrap C++ routes
        arrays = {name: np.array(getattr(core, name)) for name in _ROUTE_ARRAYS}
        if capacity is not None and not layers:  # before any padded array is allocated
            owner_rows = len(arrays["send_rows"]) + len(arrays["local_sources"])
            refuse_absurd_capacity(capacity, len(ratios) * index_bytes(size, capacity, owner_rows),
                                   "padded index arrays", None, owner_rows)
        needed = _rows_needed(entry, size)
        if capacity is not None and needed > capacity:
            raise ValueError(f"Indexer fixed-capacity exchange: this batch needs {needed} rows from one rank to "
                             f"another at ratio {ratio}, more than the capacity of {capacity} rows per peer "
                             "(choose a larger capacity, e.g. with sparsecp.torch.fixed_capacity)")
        indices = None if capacity is None else _fixed_indices(arrays, core.query_count, inputs.ratio, capacity)
        layers[inputs.ratio] = PrebuiltLayer(inputs, rank, arrays, core.query_count, needed,
                                             int(len(arrays["send_rows"])), indices)
    return PrebuiltRoutes(lengths_tuple(lengths), size, rank, mode, capacity, layers)


def fixed_capacity(batches: Iterable[Sequence[int]], size: int, ratios: Iterable[int], mode: str,
                   block_size: int | None = None, zigzag_min_length: int | None = None, *, headroom: float = 1.0,
                   multiple: int = 8, **strategy_params: Any) -> int:
    """A capacity (rows per peer) for the run from a sample of batches' document lengths.

    The most rows any rank sends any other rank over the sample and ratios, times
    ``headroom``, rounded up to a multiple of ``multiple`` (at least ``multiple``). A later
    batch needing more raises in ``prebuild``; choose ``headroom`` > 1 for margin.
    """
    ratios = tuple(ratios)
    multiple = integer("multiple", multiple, 1)
    if (isinstance(headroom, bool) or not isinstance(headroom, numbers.Real) or not math.isfinite(headroom)
            or not headroom >= 1.0):
        raise ValueError(f"headroom must be a finite number of at least 1.0, got {headroom!r}")
    headroom = float(headroom)
    most = 0
    for lengths in batches:
        for ratio in ratios:
            entry = planned(planning_inputs(lengths, size, ratio, mode, block_size, zigzag_min_length,
                                            strategy_params))
            most = max(most, _rows_needed(entry, size))
    wanted = int(np.ceil(most * headroom))
    return max(multiple, -(-wanted // multiple) * multiple)


def index_bytes(size: int, capacity: int, owner_rows: int) -> int:
    """Bytes of one layer's padded index arrays (``FixedIndices``: int64 send / receive rows
    [P * C], keep from / to [Q], key begin / visible [W])."""
    worker_rows = owner_rows + (size - 1) * capacity
    return 8 * (2 * size * capacity + 2 * owner_rows + 2 * worker_rows)


def staging_bytes(size: int, capacity: int, owner_rows: int, fields: Sequence[tuple[int, torch.dtype]]) -> int:
    """Bytes ``StagingBuffers`` allocates for this layout (results not counted: they are
    ``topk`` wide, allocated at the first result)."""
    worker_rows, slots = owner_rows + (size - 1) * capacity, size * capacity
    total = index_bytes(size, capacity, owner_rows)
    for indices in dtype_groups([torch.empty(0, dtype=dtype) for _, dtype in fields]):
        row = sum(fields[i][0] for i in indices) * fields[indices[0]][1].itemsize
        total += row * ((owner_rows + 1) + 2 * slots + owner_rows + (worker_rows + 1))
    return total + sum(width * dtype.itemsize * worker_rows for width, dtype in fields)


def memory_limit(device: torch.device | None) -> int | None:
    """The most bytes the fixed exchange may allocate up front on ``device`` (None: this
    host's memory): half of it; None where it cannot be told."""
    try:
        if device is not None and device.type == "cuda":
            return int(torch.cuda.get_device_properties(device).total_memory) // 2
        if device is None or device.type == "cpu":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, RuntimeError, AttributeError):
        return None
    return None


def refuse_absurd_capacity(capacity: int, nbytes: int, what: str, device: torch.device | None,
                           owner_rows: int) -> None:
    """Raise ValueError, before anything is allocated, when a capacity's buffers would take
    more than ``memory_limit``: naming the capacity and the bytes."""
    limit = memory_limit(device)
    if limit is None or nbytes <= limit:
        return
    where = "this host" if device is None or device.type == "cpu" else str(device)
    raise ValueError(f"Indexer fixed-capacity exchange: capacity {capacity} rows per peer would allocate {nbytes} "
                     f"bytes ({_binary(nbytes)}) of {what} on {where}, more than half of its {_binary(2 * limit)} of "
                     f"memory; this batch's ranks hold {owner_rows} rows each, and no rank sends a peer more than "
                     "its own rows (choose the capacity with sparsecp.torch.fixed_capacity)")


def _binary(nbytes: int) -> str:
    """Bytes in KiB, MiB or GiB (one decimal)."""
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f} {unit}"
    return f"{nbytes / 1024:.1f} KiB"


def padding_bytes(routes: PrebuiltRoutes, input_row_bytes: int, topk: int, index_bytes: int = 4) -> dict[str, int]:
    """Bytes of padding this rank hands to peers per step at the routes' capacity, over
    every prebuilt ratio (one layer each): ``padding`` (slots to other ranks carrying no
    row, inputs and results) and ``payload`` (the rows that move)."""
    if not isinstance(routes, PrebuiltRoutes):
        raise TypeError(f"padding_bytes: routes must come from sparsecp.torch.prebuild, got {type(routes).__name__}")
    if routes.capacity is None:
        raise ValueError("padding_bytes needs routes prebuilt with a capacity")
    # Byte counts are whole and not negative (floats, bools and negatives named here; they
    # gave negative or float counts).
    row = integer("input_row_bytes", input_row_bytes, 0) + integer("topk", topk, 1) * integer("index_bytes",
                                                                                              index_bytes, 1)
    slots = (routes.size - 1) * routes.capacity
    padding = sum((slots - layer.rows_moved) * row for layer in routes.layers.values())
    payload = sum(layer.rows_moved * row for layer in routes.layers.values())
    return {"padding": padding, "payload": payload}


# --------------------------------------------------------------------------------------
# The fixed-capacity exchange.


class StagingBuffers:
    """The fixed exchange's buffers for one (group, device, capacity, field layout):
    allocated once, reused every step (see the module docstring for the layout)."""

    def __init__(self, device: torch.device, size: int, capacity: int, owner_rows: int,
                 fields: tuple[tuple[int, torch.dtype], ...]) -> None:
        self.device, self.size, self.capacity, self.owner_rows = device, size, capacity, owner_rows
        self.worker_rows = owner_rows + (size - 1) * capacity
        self.fields = fields
        self.groups = dtype_groups([torch.empty(0, dtype=dtype) for _, dtype in fields])
        slots = size * capacity
        new = _zeros(device)
        self.widths = tuple(width for width, _ in fields)
        self.owner, self.send, self.receive, self.kept, self.worker = [], [], [], [], []
        for indices in self.groups:
            width, dtype = sum(self.widths[i] for i in indices), fields[indices[0]][1]
            self.owner.append(new(owner_rows + 1, width, dtype=dtype))
            self.send.append(new(slots, width, dtype=dtype))
            self.receive.append(new(slots, width, dtype=dtype))
            self.kept.append(new(owner_rows, width, dtype=dtype))
            self.worker.append(new(self.worker_rows + 1, width, dtype=dtype))
        self.worker_fields = tuple(new(1, self.worker_rows, width, dtype=dtype) for width, dtype in fields)
        index = torch.int64
        self.send_rows, self.receive_rows = new(slots, dtype=index), new(slots, dtype=index)
        self.keep_from, self.keep_to = new(owner_rows, dtype=index), new(owner_rows, dtype=index)
        self.key_begin, self.visible = new(self.worker_rows, dtype=index), new(self.worker_rows, dtype=index)
        self.results: dict[tuple[int, torch.dtype], tuple[torch.Tensor, ...]] = {}
        # The step's live handle (its FixedInputExchange, then its result handle) until the
        # result is waited for: a launch meanwhile would reload the index tensors and
        # overwrite the worker rows and result staging that handle still reads (every layer
        # of a model shares these buffers, whatever its ratio). A weak reference: dropping
        # the handles (an exception while rows travel, caught by a loop that skips the
        # batch) ends the step.
        self._user: weakref.ref[Any] | None = None
        # The step's collectives not waited for yet (its input all-to-alls, then its result
        # all-to-all). A step whose handles were dropped leaves them here; the next launch
        # waits for them (``release``) before it writes into these buffers: every rank
        # launched them (the launch agrees first), so they complete.
        self._works: list[Any] = []

    @property
    def in_use(self) -> bool:
        """True from a launch until its result is waited for (and its handles are alive)."""
        return self._user is not None and self._user() is not None

    def use(self, handle: Any, works: Sequence[Any] = ()) -> None:
        """``handle`` (or None: free) is the step now using these buffers; ``works``: its
        collectives still to be waited for (kept until the handle waits them)."""
        self._user = None if handle is None else weakref.ref(handle)
        self._works = [work for work in works if work is not None]

    def abort(self, handle: Any) -> None:
        """End ``handle``'s step without its result: wait for its collectives, free the buffers."""
        if self._user is not None and self._user() is handle:
            self.release()
            self.use(None)

    def waited(self) -> None:
        """The live handle waited for its collectives."""
        self._works = []

    def release(self) -> None:
        """Before a launch on free buffers: wait for what a dropped step left travelling, so
        that no collective of it still reads or writes the buffers."""
        works, self._works = self._works, []
        for work in works:
            work.wait()

    def collective_tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor handed to a collective (inputs, then results): fixed for the run."""
        results = tuple(t for buffers in self.results.values() for t in buffers[1:3])
        return (*self.send, *self.receive, *results)

    def load(self, indices: FixedIndices) -> None:
        """Copy a batch's padded index arrays into the fixed index tensors."""
        if (indices.capacity, indices.owner_rows) != (self.capacity, self.owner_rows):
            raise ValueError(f"Indexer fixed-capacity exchange: routes for capacity {indices.capacity} and "
                             f"{indices.owner_rows} owner rows, buffers for {self.capacity} and {self.owner_rows}")
        for name in FixedIndices._TENSORS:
            getattr(self, name).copy_(torch.from_numpy(getattr(indices, name)))

    def result_buffers(self, topk: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """(worker [W + 1, topk], send, receive [P * C, topk], kept [Q, topk], owner [Q + 1, topk])."""
        key = (topk, dtype)
        found = self.results.get(key)
        if found is None:
            new, slots = _zeros(self.device), self.size * self.capacity
            found = self.results[key] = (new(self.worker_rows + 1, topk, dtype=dtype), new(slots, topk, dtype=dtype),
                                         new(slots, topk, dtype=dtype), new(self.owner_rows, topk, dtype=dtype),
                                         new(self.owner_rows + 1, topk, dtype=dtype))
        return found

    # The step's data movement: tensor ops into the fixed buffers only (capturable).

    def send_inputs(self, inputs: Sequence[torch.Tensor], group: Any, async_op: bool = True) -> list[Any]:
        """Pack the owner fields [1, Q, width], gather the padded blocks, launch the
        all-to-alls (one per dtype group), place the kept rows. Returns the works."""
        works = []
        for g, indices in enumerate(self.groups):
            owner, column = self.owner[g], 0
            for i in indices:
                owner[:self.owner_rows, column:column + self.widths[i]].copy_(inputs[i][0])
                column += self.widths[i]
            torch.index_select(owner, 0, self.send_rows, out=self.send[g])
            works.append(_all_to_all(self.receive[g], self.send[g], group, async_op))
            torch.index_select(owner, 0, self.keep_from, out=self.kept[g])
            self.worker[g].index_copy_(0, self.keep_to, self.kept[g])
        return works

    def finish_inputs(self, works: Sequence[Any]) -> tuple[torch.Tensor, ...]:
        """Wait, place the received rows; the worker fields, each [1, W, width]."""
        for g, (indices, work) in enumerate(zip(self.groups, works)):
            if work is not None:
                work.wait()
            worker, column = self.worker[g], 0
            worker.index_copy_(0, self.receive_rows, self.receive[g])
            for i in indices:
                self.worker_fields[i][0].copy_(worker[:self.worker_rows, column:column + self.widths[i]])
                column += self.widths[i]
        return self.worker_fields

    def send_results(self, selected: torch.Tensor, group: Any, async_op: bool = True) -> Any:
        """Results [rows <= W, topk] back towards their owners (padded blocks)."""
        worker, send, receive, kept, owner = self.result_buffers(selected.shape[1], selected.dtype)
        worker[:selected.shape[0]].copy_(selected)
        torch.index_select(worker, 0, self.receive_rows, out=send)
        work = _all_to_all(receive, send, group, async_op)
        torch.index_select(worker, 0, self.keep_to, out=kept)
        owner.index_copy_(0, self.keep_from, kept)
        return work

    def finish_results(self, work: Any, topk: int, dtype: torch.dtype) -> torch.Tensor:
        """Wait, place; this rank's own rows' ids [Q, topk] (a view of the staging: valid
        until the next step's results)."""
        _, _, receive, _, owner = self.result_buffers(topk, dtype)
        if work is not None:
            work.wait()
        owner.index_copy_(0, self.send_rows, receive)
        return owner[:self.owner_rows]


def _zeros(device: torch.device) -> Any:
    def new(*shape: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=device)

    return new


def _all_to_all(received: torch.Tensor, send: torch.Tensor, group: Any, async_op: bool) -> Any:
    """Equal splits of ``capacity`` rows per peer, counted like the dynamic exchange."""
    work = dist.all_to_all_single(received, send, group=group, async_op=async_op)
    with _STATS_LOCK:
        _STATS.bytes_sent += send.numel() * send.element_size()
        _STATS.bytes_received += received.numel() * received.element_size()
        _STATS.exchanges += 1
    return work


_STAGING: dict[tuple[Any, ...], StagingBuffers] = {}


def _cache_key(group: Any, device: torch.device, size: int, capacity: int, owner_rows: int,
               fields: tuple[tuple[int, torch.dtype], ...]) -> tuple[Any, ...]:
    return id(group), str(device), size, capacity, owner_rows, fields


def staging_buffers(group: Any, device: torch.device, size: int, capacity: int, owner_rows: int,
                    fields: tuple[tuple[int, torch.dtype], ...]) -> StagingBuffers:
    """The run's staging buffers for this group, device and layout (made on first use)."""
    key = _cache_key(group, device, size, capacity, owner_rows, fields)
    found = _STAGING.get(key)
    if found is None:
        found = _STAGING[key] = StagingBuffers(device, size, capacity, owner_rows, fields)
    return found


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@dataclass
class FixedInputExchange:
    """``launch_indexer_inputs``' handle on the fixed-capacity path (same interface as
    ``IndexerInputExchange``: ``route``, ``wait()``, ``launch_result()``)."""

    route: Any
    group: Any
    staging: StagingBuffers
    works: list[Any]
    consumed: bool = False
    _clock: WorkerClock | None = None

    @property
    def owner_queries(self) -> int:
        return self.staging.owner_rows

    @property
    def selection_seconds(self) -> float | None:
        """As ``IndexerInputExchange.selection_seconds`` (None inside CUDA graph capture)."""
        return self._clock.seconds if self._clock is not None else None

    @torch.no_grad()
    def wait(self) -> WorkerInputs:
        """(qr, weights, cos, sin), each [1, route.query_count, width]: views of the fixed
        worker staging (``staging.worker_fields`` are the whole [1, W, width] buffers)."""
        if self.consumed:
            raise RuntimeError("Indexer input exchange cannot be consumed twice")
        self.consumed = True
        fields = self.staging.finish_inputs(self.works)
        self.staging.waited()
        self.works = []
        rows = self.route.query_count
        self._clock = WorkerClock(self.staging.device)
        return WorkerInputs(*(tensor[:, :rows] for tensor in fields))

    def abort(self) -> None:
        """Give up this step (a batch skipped after an exception): waits for the rows already
        travelling and frees the staging buffers for the next launch; the handle is then
        consumed. Dropping every reference to the handles does the same at the next launch."""
        self.consumed = True
        self.works = []
        self.staging.abort(self)

    @torch.no_grad()
    def launch_result(self, selected: torch.Tensor) -> _FixedPendingResult:
        """Return ids [route.query_count (or W), topk] to their owners; collective."""
        return self._launch_result(selected)

    @torch.no_grad()
    def _launch_result(self, selected: Any, failure: BaseException | None = None) -> _FixedPendingResult:
        from ._checks import result_checks

        if self._clock is not None:
            self._clock.stop()
        rows = self.route.query_count
        if isinstance(selected, torch.Tensor) and selected.ndim == 2 and selected.shape[0] == self.staging.worker_rows:
            selected = selected[:rows]
        try:
            result_checks(selected, rows, self.group, self.staging.device, failure)
        except BaseException:
            self.staging.use(None)  # raised on every rank: the step is over, the buffers free
            raise
        work = self.staging.send_results(selected, self.group, not _capturing(self.staging.device))
        pending = _FixedPendingResult(self.staging, work, int(selected.shape[1]), selected.dtype)
        self.staging.use(pending, (work,))
        return pending


@dataclass
class _FixedPendingResult:
    staging: StagingBuffers
    work: Any
    topk: int
    dtype: torch.dtype
    consumed: bool = False

    @torch.no_grad()
    def wait(self) -> torch.Tensor:
        """This rank's own rows' ids [Q, topk] (a copy: the next call reuses the staging;
        ``StagingBuffers.finish_results`` is the capture-safe view)."""
        if self.consumed:
            raise RuntimeError("Indexer communication handle cannot be consumed twice")
        self.consumed = True
        ids = self.staging.finish_results(self.work, self.topk, self.dtype).clone()
        self.work = None
        self.staging.use(None)
        return ids

    def abort(self) -> None:
        """Give up the result (see ``FixedInputExchange.abort``)."""
        self.consumed = True
        self.work = None
        self.staging.abort(self)


def prebuilt_layer(routes: Any, lengths: Any, size: int, rank: int, ratio: Any, mode: Any, block_size: Any,
                   zigzag_min_length: Any, params: dict[str, Any]) -> PrebuiltLayer:
    """The layer of ``routes`` for this call (host checks only, no communication); raises
    when the routes were not prebuilt for this call's planning inputs and rank."""
    if not isinstance(routes, PrebuiltRoutes):
        raise TypeError(f"routes must come from sparsecp.torch.prebuild, got {type(routes).__name__}")
    layer = routes.layer(ratio)
    called = planning_inputs(lengths, size, ratio, mode, block_size, zigzag_min_length, params)
    if called != layer.inputs:
        differ = [name for name, a, b in zip(PlanningInputs._fields, called, layer.inputs) if a != b]
        raise ValueError(f"routes were prebuilt for other inputs than this call's (they differ in "
                         f"{', '.join(differ)})")
    if routes.rank != rank:
        raise ValueError(f"routes were prebuilt for rank {routes.rank}, called on rank {rank}")
    return layer


def _prebuilt_checks(inputs: tuple, lengths: Any, ratio: Any, mode: Any, group: Any, block_size: Any,
                     zigzag_min_length: Any, params: dict[str, Any], axes_text: str,
                     routes: Any) -> PrebuiltLayer:
    """Local checks of a prebuilt call, then the agreement; returns the layer."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    tensors = tuple(value for value in inputs if isinstance(value, torch.Tensor))
    device = control_device(group, tensors[0].device if tensors else None)

    def check() -> PrebuiltLayer:
        layer = prebuilt_layer(routes, lengths, size, rank, ratio, mode, block_size, zigzag_min_length, params)
        if len(tensors) != len(inputs):
            from ._checks import BATCH_TEXT

            raise ValueError(BATCH_TEXT)
        check_inputs(inputs, size, sum(layer.inputs.lengths), axes_text)
        indices = layer.indices
        if indices is not None and _STAGING.get(_cache_key(*_staging_key(indices, inputs, group, size))) is None:
            # Buffers this launch would allocate: refused here, before the agreement, so that
            # every rank raises (the peers naming this rank and its reason).
            fields = tuple((int(tensor.shape[-1]), tensor.dtype) for tensor in inputs)
            refuse_absurd_capacity(indices.capacity, staging_bytes(size, indices.capacity, indices.owner_rows, fields),
                                   "exchange buffers", inputs[0].device, indices.owner_rows)
        if indices is not None and _staging_in_use(indices, inputs, group, size):
            raise RuntimeError("Indexer fixed-capacity exchange: the previous launch on these staging buffers "
                               "(same group, device, capacity, owner rows and field layout) has not been waited "
                               "on to its result; wait() its inputs and its launch_result handle (or abort() or drop "
                               "its handles) before the next launch")
        return layer

    layer, error = capture(check)
    settings = tuple(setting for name, tensor in zip(INPUT_NAMES, tensors)
                     for setting in ((name + " width", int(tensor.shape[-1]) if tensor.ndim else -1),
                                     (name + " dtype", dtype_code(tensor.dtype))))
    settings += (("fields", len(inputs)),)
    capacity = getattr(routes, "capacity", None)
    if capacity is not None:
        settings += (("fixed capacity", int(capacity)),)
    if layer is not None:
        fingerprint = layer.fingerprint(settings)
    else:
        # This rank rejected its routes: fingerprint what the call itself says (the routes
        # play no part in it), so that peers agreeing on the call report this rank's reason,
        # not a difference made up from an empty fingerprint.
        called, _ = capture(lambda: planning_inputs(lengths, size, ratio, mode, block_size, zigzag_min_length,
                                                    params))
        fingerprint = called.fingerprint() if called is not None else unusable_fingerprint(mode)
        for name, value in settings:
            fingerprint.add(name, value)
    agree(group, device, error, fingerprint, "Indexer input exchange")
    assert layer is not None
    return layer


def launch_prebuilt(inputs: tuple, lengths: Any, ratio: Any, mode: Any, group: Any, block_size: Any,
                    zigzag_min_length: Any, params: dict[str, Any], axes_text: str, routes: Any) -> Any:
    """``launch_indexer_inputs`` with ``routes=``: no planning; the fixed-capacity exchange
    when the routes have a capacity, else the exchange sized by the batch."""
    layer = _prebuilt_checks(inputs, lengths, ratio, mode, group, block_size, zigzag_min_length, params,
                             axes_text, routes)
    if layer.indices is None:
        return launch_on_route(inputs, layer.route, group)
    staging = _staging_for(layer.indices, inputs, group, routes.size)
    staging.release()  # a dropped step's collectives, if any, end before the buffers are rewritten
    staging.load(layer.indices)
    works = staging.send_inputs(inputs, group, not _capturing(staging.device))
    exchange = FixedInputExchange(layer.route, group, staging, works)
    staging.use(exchange, works)
    return exchange


def _staging_key(indices: FixedIndices, inputs: tuple, group: Any, size: int) -> tuple[Any, ...]:
    fields = tuple((int(tensor.shape[-1]), tensor.dtype) for tensor in inputs)
    return group, inputs[0].device, size, indices.capacity, indices.owner_rows, fields


def _staging_for(indices: FixedIndices, inputs: tuple, group: Any, size: int) -> StagingBuffers:
    return staging_buffers(*_staging_key(indices, inputs, group, size))


def _staging_in_use(indices: FixedIndices, inputs: tuple, group: Any, size: int) -> bool:
    """Whether this call's staging buffers exist and serve an unfinished step (looked up, not
    made: ``fixed_step_indices``' functional path never allocates them)."""
    found = _STAGING.get(_cache_key(*_staging_key(indices, inputs, group, size)))
    return found is not None and found.in_use
