"""One packed batch's context-parallel layout for a DeepSeek-V4 model: pure integer planning.

Everything a CP attention layer needs to know about the batch, computed once per forward
from ``(document lengths, CP size, rank)`` and the model's window and compression ratios,
identical on every rank for the same inputs, with no tensors of data, no communication, no
clock (sparsecp's plan-then-run rule):

* the sliding-window halo route (``sliding_window_route``);
* per compression ratio ``m`` (and whether its compressor overlaps windows, CSA's Ca/Cb):
  - ``compressor``: the raw-row route that brings each rank the rows of the compression
    windows it owns (``document_compression_plan``'s job, extended to CSA's overlap: entry
    ``w`` of a document reads window ``w`` and, for CSA, window ``w - 1``), and per owned
    entry which gathered rows fill its ``2m`` (CSA) or ``m`` (HCA) slots;
  - ``bank``: the compressed-bank route that gathers, for this rank's rows, the prefix of
    every document they belong to (``document_prefix_route``'s rule at any ratio: the seed's
    function accepts ratios 1 and 2, the model uses 4 and 128);
  - per own row, the bank rows it may see (``[doc offset, doc offset + (p + 1) // m)``).

Compressed entries are owned by the rank holding their window's last raw token
(``compressed_owner_offsets``), entry ``w`` of document ``d`` sits at bank row
``compressed_document_offsets[d] + w`` and carries RoPE position ``w * m``: exactly the
bank each document would have if run alone, laid end to end.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import numpy as np
import torch

from ... import compressed_document_offsets, compressed_owner_offsets
from ...torch._exchange import device_rows
from .._cp.rows import DeviceRowGather, RowGather, own_rows, plan_row_gather

__all__ = ["BatchLayout", "CompressionLayout", "DeviceCompression", "DeviceLayout"]

_DEVICE_KEPT = 4  # device tables kept per batch layout (per device, KL on/off, cost model)


@dataclass(frozen=True, eq=False)
class CompressionLayout:
    """One compression ratio's routes and index tables for one rank (immutable).

    Attributes:
        ratio: Raw tokens per compressed entry (m).
        overlap: True for CSA's overlapped compressor (entry w reads windows w - 1 and w).
        compressor: Raw-row gather; its block holds raw rows
            ``[compressor.global_start, (rank + 1) * local)``.
        slot_rows: int64 [entries, slots]: the gathered block row feeding each slot of each
            owned entry (slots = 2m with overlap, Ca slots first, else m); -1 where the slot
            has no row (CSA entry 0's Ca half: zero value, -inf gate, as the model does).
        positions: int64 [entries]: each owned entry's RoPE position (w * m).
        owned: (first, end) bank rows this rank owns (``compressed_owner_offsets``).
        owners: Every rank's first owned bank row, and the total (size + 1 entries).
        bank: Gather of the document prefixes this rank's rows see; its block holds bank rows
            ``[bank.global_start, owned end)``.
        visible_begin, visible_end: int64 [local rows]: the bank rows each own row may see.
        bank_starts: Every rank's first bank row read (its first row's document's first entry).
    """

    ratio: int
    overlap: bool
    compressor: RowGather
    slot_rows: np.ndarray
    positions: np.ndarray
    owned: tuple[int, int]
    owners: tuple[int, ...]
    bank: RowGather
    visible_begin: np.ndarray
    visible_end: np.ndarray
    bank_starts: tuple[int, ...]

    @cached_property
    def widest(self) -> int:
        """The most bank rows one own row may see."""
        return int((self.visible_end - self.visible_begin).max()) if len(self.visible_end) else 0

    @property
    def bank_start(self) -> int:
        """The global bank row of this rank's bank block's first row."""
        return self.bank.global_start if self.bank.rows else self.owned[1]

    @property
    def entries(self) -> int:
        """Bank rows in the whole batch."""
        return self.owners[-1]


class BatchLayout:
    """The CP layout of one packed batch for one rank (see the module docstring).

    Args:
        lengths: Document lengths of the whole packed sequence, in order.
        size, rank: The CP group and this rank.
        window: The model's sliding window.
        compressions: ``(ratio, CSA?)`` of the model's compressed layers (the device tables' ratios).
    """

    def __init__(self, lengths: tuple[int, ...], size: int, rank: int, window: int,
                 compressions: tuple[tuple[int, bool], ...] = ()) -> None:
        self.lengths, self.size, self.rank, self.window = lengths, size, rank, window
        self.compressions = compressions
        own = own_rows(lengths, size, rank)
        self.boundaries, self.local, self.first = own.boundaries, own.local, own.first
        self.row_document, self.row_position = own.row_document, own.row_position  # each own row's document, position
        self._compression: dict[tuple[int, bool], CompressionLayout] = {}
        self._device: dict[Any, DeviceLayout] = {}

    def _first_document_start(self, q: int) -> int:
        """The start of the document holding rank q's first row."""
        return self.boundaries[self.document_of(q * self.local)]

    @cached_property
    def window_route(self) -> RowGather:
        """The raw-KV halo of sliding-window attention (the seed's ``sliding_window_route``):
        rank q reads ``[max(its first row's document start, q * local - window + 1), (q + 1) * local)``."""
        local = self.local
        needs = [[(max(self._first_document_start(q), q * local - self.window + 1), (q + 1) * local)]
                 for q in range(self.size)]
        return plan_row_gather(needs, [q * local for q in range(self.size + 1)], self.rank)

    @cached_property
    def window_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """Per own row, the gathered window block's rows ``[begin, end)`` it attends."""
        route = self.window_route
        rows = np.arange(self.first, self.first + self.local, dtype=np.int64)
        doc_start = np.asarray(self.boundaries, dtype=np.int64)[self.row_document]
        begin = np.maximum(doc_start, rows - self.window + 1) - route.global_start
        return begin, rows + 1 - route.global_start

    def document_of(self, token: int) -> int:
        return bisect.bisect_right(self.boundaries, token) - 1

    def compression(self, ratio: int, overlap: bool) -> CompressionLayout:
        """The layout of compression ratio ``ratio`` (cached per ratio and overlap)."""
        key = (ratio, overlap)
        if key not in self._compression:
            self._compression[key] = self._make_compression(ratio, overlap)
        return self._compression[key]

    def _make_compression(self, m: int, overlap: bool) -> CompressionLayout:
        boundaries, local, size = list(self.boundaries), self.local, self.size
        keys = [int(k) for k in compressed_document_offsets(boundaries, m)]
        owners = tuple(int(o) for o in compressed_owner_offsets(boundaries, m, local))
        raw_owners = [q * local for q in range(size + 1)]

        def entry(row: int) -> tuple[int, int]:  # bank row -> (document, window)
            d = bisect.bisect_right(keys, row) - 1  # the last document starting at or before row
            return d, row - keys[d]

        def first_needed(q: int) -> int:
            """The first raw row rank q's owned entries read (its own first row if earlier)."""
            if owners[q] == owners[q + 1]:
                return q * local
            d, w = entry(owners[q])
            first_window = max(w - 1, 0) if overlap else w
            return min(q * local, self.boundaries[d] + first_window * m)

        compressor = plan_row_gather([[(first_needed(q), (q + 1) * local)] for q in range(size)], raw_owners,
                                     self.rank)
        begin, end = owners[self.rank], owners[self.rank + 1]
        slots = 2 * m if overlap else m
        slot_rows = np.full((end - begin, slots), -1, dtype=np.int64)
        positions = np.zeros(end - begin, dtype=np.int64)
        for i, row in enumerate(range(begin, end)):
            d, w = entry(row)
            window_start = self.boundaries[d] + w * m - compressor.global_start
            current = np.arange(window_start, window_start + m)
            if overlap:
                slot_rows[i, m:] = current
                if w >= 1:
                    slot_rows[i, :m] = current - m
            else:
                slot_rows[i] = current
            positions[i] = w * m
        bank_starts = [keys[self.document_of(q * local)] for q in range(size)]
        bank = plan_row_gather([[(bank_starts[q], owners[q + 1])] for q in range(size)], owners, self.rank)
        doc_keys = np.asarray(keys, dtype=np.int64)[self.row_document]
        return CompressionLayout(
            ratio=m, overlap=overlap, compressor=compressor, slot_rows=slot_rows, positions=positions,
            owned=(begin, end), owners=owners, bank=bank, visible_begin=doc_keys,
            visible_end=doc_keys + (self.row_position + 1) // m, bank_starts=tuple(int(b) for b in bank_starts))

    def index_bank(self, ratio: int, segments: list[np.ndarray], own: bool) -> RowGather:
        """The CSA Index K bank rows this rank reads: ``[key_begin, key_end)`` of every segment it
        selects (``segments[q]``: rank q's selection route's segments), and with ``own`` (the
        indexer KL scores its own rows) its rows' document prefixes. Only what its rows can see,
        never the whole bank."""
        layout = self.compression(ratio, True)
        needs = []
        for q in range(self.size):
            need = [(int(kb), int(ke)) for _, _, kb, ke, _ in segments[q].tolist()]
            if own:
                need.append((layout.bank_starts[q], layout.owners[q + 1]))
            needs.append(need)
        return plan_row_gather(needs, layout.owners, self.rank)

    def on(self, device: torch.device, selection: Callable[[int], list[Any]], kl: bool,
           plan_key: Any = None) -> DeviceLayout:
        """Every table the layers read, on ``device``: made once per batch, device and plan (the
        layers then copy nothing from the host). ``selection(ratio)`` gives every rank's
        indexer route of the batch; ``kl``: whether the indexer KL runs; ``plan_key`` names what
        else the routes depend on (spill's cost model, refitted between forwards). The last
        ``_DEVICE_KEPT`` are kept: a refit every forward must not grow them without bound."""
        key = (str(device), kl, plan_key)
        if key in self._device:
            self._device[key] = self._device.pop(key)  # most recently used last
        else:
            while len(self._device) >= _DEVICE_KEPT:
                self._device.pop(next(iter(self._device)))
            self._device[key] = self._make_device(device, selection, kl)
        return self._device[key]

    def _make_device(self, device: torch.device, selection: Callable[[int], list[Any]], kl: bool) -> DeviceLayout:
        def move(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device)

        begin, end = self.window_keys
        made = {}
        for ratio, overlap in self.compressions:
            layout = self.compression(ratio, overlap)
            index_bank = index_rows = route = None
            if overlap:
                routes = selection(ratio)
                route = routes[self.rank].detached()  # the layers' graph holds these tables: no C++ objects
                index_bank = self.index_bank(ratio, [r.segments.array for r in routes], kl).on(device)
                index_rows = device_rows(route, device)
            start = layout.bank_start
            made[(ratio, overlap)] = DeviceCompression(
                layout=layout, compressor=layout.compressor.on(device), bank=layout.bank.on(device),
                slot_rows=move(layout.slot_rows), positions=move(layout.positions)[None],
                visible_begin=move(layout.visible_begin - start), visible_end=move(layout.visible_end - start),
                index_bank=index_bank, route=route, route_rows=index_rows)
        return DeviceLayout(batch=self, device=device, window=self.window_route.on(device), window_begin=move(begin),
                            window_end=move(end), positions=move(self.row_position)[None], compressions=made)


@dataclass(frozen=True)
class DeviceCompression:
    """One compression ratio's tables on the data's device (``BatchLayout.on``).

    ``visible_begin``/``visible_end`` are bank block rows (relative to ``layout.bank_start``);
    ``index_bank``, ``route`` and ``route_rows`` are CSA's: the Index K bank gather, this
    rank's selection route and its row lists on the device."""

    layout: CompressionLayout
    compressor: DeviceRowGather
    bank: DeviceRowGather
    slot_rows: torch.Tensor
    positions: torch.Tensor
    visible_begin: torch.Tensor
    visible_end: torch.Tensor
    index_bank: DeviceRowGather | None
    route: Any
    route_rows: Any


@dataclass(frozen=True)
class DeviceLayout:
    """A batch's layout on the data's device: what every layer of one forward reads."""

    batch: BatchLayout
    device: torch.device
    window: DeviceRowGather
    window_begin: torch.Tensor
    window_end: torch.Tensor
    positions: torch.Tensor
    compressions: dict[tuple[int, bool], DeviceCompression]
