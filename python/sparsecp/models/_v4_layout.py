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

import numpy as np

from .. import _core, compressed_document_offsets, compressed_owner_offsets, document_boundaries

__all__ = ["BatchLayout", "CompressionLayout"]


@dataclass(frozen=True)
class CompressionLayout:
    """One compression ratio's routes and index tables for one rank (immutable).

    Attributes:
        ratio: Raw tokens per compressed entry (m).
        overlap: True for CSA's overlapped compressor (entry w reads windows w - 1 and w).
        compressor: Raw-row route; its gathered block holds raw rows
            ``[compressor.global_start, (rank + 1) * local)``.
        slot_rows: int64 [entries, slots]: the gathered block row feeding each slot of each
            owned entry (slots = 2m with overlap, Ca slots first, else m); -1 where the slot
            has no row (CSA entry 0's Ca half: zero value, -inf gate, as the model does).
        positions: int64 [entries]: each owned entry's RoPE position (w * m).
        owned: (first, end) bank rows this rank owns (``compressed_owner_offsets``).
        owners: Every rank's first owned bank row, and the total (size + 1 entries).
        bank: Route gathering the document prefixes this rank's rows see; its block holds
            bank rows ``[bank.global_start, bank.global_end)``.
        visible_begin, visible_end: int64 [local rows]: the bank rows each own row may see.
    """

    ratio: int
    overlap: bool
    compressor: _core.SequenceDispatchRoute
    slot_rows: np.ndarray
    positions: np.ndarray
    owned: tuple[int, int]
    owners: tuple[int, ...]
    bank: _core.SequenceDispatchRoute
    visible_begin: np.ndarray
    visible_end: np.ndarray

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
    """

    def __init__(self, lengths: tuple[int, ...], size: int, rank: int, window: int) -> None:
        self.lengths, self.size, self.rank, self.window = lengths, size, rank, window
        self.boundaries = tuple(int(b) for b in document_boundaries(lengths))
        total = self.boundaries[-1]
        if total % size:
            raise ValueError(f"document lengths sum to {total}, not a multiple of the CP size {size}")
        self.local = total // size
        self.first = rank * self.local
        rows = np.arange(self.first, self.first + self.local, dtype=np.int64)
        starts = np.asarray(self.boundaries[:-1], dtype=np.int64)
        self.row_document = np.searchsorted(starts, rows, side="right") - 1  # document of each own row
        self.row_position = rows - starts[self.row_document]                 # its position in the document
        self._compression: dict[tuple[int, bool], CompressionLayout] = {}

    @cached_property
    def window_route(self) -> _core.SequenceDispatchRoute:
        """The raw-KV halo of sliding-window attention."""
        return _core.sliding_window_route(list(self.boundaries), self.local, self.size, self.rank, self.window)

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

        compressor = _core.dispatch_route_from_intervals([first_needed(q) for q in range(size)], raw_owners,
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
        bank = _core.dispatch_route_from_intervals(bank_starts, list(owners), self.rank)
        doc_keys = np.asarray(keys, dtype=np.int64)[self.row_document]
        return CompressionLayout(
            ratio=m, overlap=overlap, compressor=compressor, slot_rows=slot_rows, positions=positions,
            owned=(begin, end), owners=owners, bank=bank, visible_begin=doc_keys,
            visible_end=doc_keys + (self.row_position + 1) // m)
