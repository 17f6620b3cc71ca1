"""One packed batch's context-parallel layout when the key bank is every earlier token of the
document (DeepSeek-V3.2: an indexer at compression ratio 1, no compressor, no window).

Pure integer planning from ``(document lengths, CP size, rank)``, identical on every rank for the
same inputs (sparsecp's plan-then-run rule), then moved to the device once per batch:

* ``prefix``: the key rows this rank's own rows may attend: the prefix of the document its first
  row belongs to, up to its last row, ``[start of that document, (rank + 1) * local)``, gathered
  from the ranks that own them (``plan_row_gather``; backward SUMs into the owners). At ratio 1
  bank row = global token row, so the owners are the raw shards;
* per own row, the prefix block rows it may see (``visible_begin``, ``visible_end``: its own
  document from its start up to the row itself);
* the indexer's selection route (``indexer_route`` at ratio 1, every rank's, from one plan) and
  the Index K rows a worker's segments read (``[key_begin, key_end)`` of each segment), plus,
  when the indexer KL runs, its own rows' document prefix (the student's keys).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import numpy as np
import torch

from .rows import DeviceRowGather, RowGather, own_rows, plan_row_gather

__all__ = ["DevicePrefixLayout", "PrefixLayout"]

_DEVICE_KEPT = 4  # device tables kept per batch layout (per device, KL on/off, cost model)


class PrefixLayout:
    """The ratio-1 CP layout of one packed batch for one rank (see the module docstring)."""

    def __init__(self, lengths: tuple[int, ...], size: int, rank: int) -> None:
        self.lengths, self.size, self.rank = lengths, size, rank
        own = own_rows(lengths, size, rank)
        self.boundaries, self.local, self.first = own.boundaries, own.local, own.first
        self.row_document, self.row_position = own.row_document, own.row_position  # each own row's document, position
        self.owners = tuple(q * self.local for q in range(size + 1))
        self._device: dict[Any, DevicePrefixLayout] = {}

    def _prefix_start(self, q: int) -> int:
        """The start of the document holding rank q's first row: where q's prefix block begins."""
        return self.boundaries[bisect.bisect_right(self.boundaries, q * self.local) - 1]

    @cached_property
    def prefix(self) -> RowGather:
        """Every rank's own rows' document prefixes (rank q: ``[its first document's start, (q + 1) * local)``)."""
        needs = [[(self._prefix_start(q), (q + 1) * self.local)] for q in range(self.size)]
        return plan_row_gather(needs, self.owners, self.rank)

    @property
    def prefix_start(self) -> int:
        """The global row of this rank's prefix block's first row."""
        return self._prefix_start(self.rank)

    @cached_property
    def visible(self) -> tuple[np.ndarray, np.ndarray]:
        """Per own row, the prefix block rows ``[begin, end)`` it may see: its document up to itself."""
        rows = np.arange(self.first, self.first + self.local, dtype=np.int64)
        starts = np.asarray(self.boundaries, dtype=np.int64)[self.row_document]
        return starts - self.prefix_start, rows + 1 - self.prefix_start

    @cached_property
    def widest(self) -> int:
        """The most keys one own row may see (the longest visible prefix)."""
        begin, end = self.visible
        return int((end - begin).max()) if self.local else 0

    def index_bank(self, segments: list[np.ndarray], own: bool) -> RowGather:
        """The Index K rows this rank reads: ``[key_begin, key_end)`` of every segment it selects
        for (``segments[q]``: rank q's route's segments) and, with ``own`` (the indexer KL scores
        its own rows), its rows' document prefix. Only what its rows can see."""
        needs = []
        for q in range(self.size):
            need = [(int(kb), int(ke)) for _, _, kb, ke, _ in segments[q].tolist()]
            if own:
                need.append((self._prefix_start(q), (q + 1) * self.local))
            needs.append(need)
        return plan_row_gather(needs, self.owners, self.rank)

    def on(self, device: torch.device, selection: Callable[[int], list[Any]], kl: bool,
           plan_key: Any = None) -> DevicePrefixLayout:
        """Every table the layers read, on ``device``, made once per batch, device and plan.
        ``selection(1)`` gives every rank's indexer route of the batch (ratio 1); ``plan_key``
        names what else the routes depend on (spill's cost model, refitted between forwards)."""
        key = (str(device), kl, plan_key)
        if key in self._device:
            self._device[key] = self._device.pop(key)  # most recently used last
        else:
            while len(self._device) >= _DEVICE_KEPT:  # a refit every forward must not grow them
                self._device.pop(next(iter(self._device)))
            self._device[key] = self._make_device(device, selection, kl)
        return self._device[key]

    def _make_device(self, device: torch.device, selection: Callable[[int], list[Any]],
                     kl: bool) -> DevicePrefixLayout:
        from ...torch._exchange import device_rows

        def move(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device)

        routes = selection(1)
        route = routes[self.rank].detached()  # the layers' graph holds these tables: no C++ objects
        begin, end = self.visible
        return DevicePrefixLayout(
            batch=self, device=device, prefix=self.prefix.on(device), visible_begin=move(begin),
            visible_end=move(end), index_bank=self.index_bank([r.segments.array for r in routes], kl).on(device),
            route=route, route_rows=device_rows(route, device))


@dataclass(frozen=True)
class DevicePrefixLayout:
    """A batch's ratio-1 layout on the data's device: what every layer of one forward reads.

    ``visible_begin``/``visible_end`` are prefix block rows; ``index_bank`` the Index K gather;
    ``route`` and ``route_rows`` this rank's selection route and its row lists on the device."""

    batch: PrefixLayout
    device: torch.device
    prefix: DeviceRowGather
    visible_begin: torch.Tensor
    visible_end: torch.Tensor
    index_bank: DeviceRowGather
    route: Any
    route_rows: Any
