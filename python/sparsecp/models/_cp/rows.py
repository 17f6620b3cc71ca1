"""Rows of a sequence-sharded array moved to the ranks that read them.

A context-parallel layer keeps several arrays sharded along the sequence: raw rows (rank ``q`` owns
``[q * local, (q + 1) * local)``) and compressed banks (rank ``q`` owns the entries whose window ends
in its rows, ``compressed_owner_offsets``). Each rank reads a few *intervals* of such an array: its
sliding-window halo, the prefix of every document its rows belong to, the bank prefixes of the rows
it selects for. This module plans, for every rank at once and from the same integers, which rows
each rank sends to each peer (``plan_row_gather``: pure integer code, no tensors of data, no
communication, no clock), and moves them with one variable-split all-to-all whose backward sums
every reader's gradient back into the owner's rows (``gather_rows``).

The plan is made once per batch on the host and moved to the device once (``RowGather.on``); a
layer then runs ``gather_rows`` with no agreement round and no host round trip: the batch was agreed
once, in the model's forward, before any layer ran. Every rank takes part in the all-to-all whenever
any rank exchanges (``RowGather.exchange``), so the collectives of all ranks pair up.
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ... import document_boundaries

__all__ = ["BackwardOrder", "DeviceRowGather", "OwnRows", "RowGather", "gather_rows", "merge_intervals", "own_rows",
           "plan_row_gather"]

Interval = tuple[int, int]


@dataclass(frozen=True)
class OwnRows:
    """A rank's contiguous shard of a packed batch: ``local`` rows from global row ``first``, the
    documents' ``boundaries``, and each own row's document and position in it."""

    boundaries: tuple[int, ...]
    local: int
    first: int
    row_document: np.ndarray
    row_position: np.ndarray


def own_rows(lengths: Sequence[int], size: int, rank: int) -> OwnRows:
    """``rank``'s rows of the packed batch ``lengths`` split evenly over ``size`` ranks."""
    boundaries = tuple(int(b) for b in document_boundaries(lengths))
    total = boundaries[-1]
    if total % size:
        raise ValueError(f"document lengths sum to {total}, not a multiple of the CP size {size}")
    local = total // size
    first = rank * local
    rows = np.arange(first, first + local, dtype=np.int64)
    starts = np.asarray(boundaries[:-1], dtype=np.int64)
    row_document = np.searchsorted(starts, rows, side="right") - 1
    return OwnRows(boundaries, local, first, row_document, rows - starts[row_document])


def merge_intervals(intervals: Sequence[Interval]) -> tuple[Interval, ...]:
    """Non-empty ``[begin, end)`` intervals, sorted and merged where they touch or overlap."""
    merged: list[list[int]] = []
    for begin, end in sorted((int(b), int(e)) for b, e in intervals if e > b):
        if merged and begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    return tuple((b, e) for b, e in merged)


def _pieces(intervals: Sequence[Interval], begin: int, end: int) -> list[np.ndarray]:
    """The rows of ``intervals`` inside ``[begin, end)``, as ascending arange pieces."""
    return [np.arange(max(b, begin), min(e, end), dtype=np.int64) for b, e in intervals if min(e, end) > max(b, begin)]


def _cat(pieces: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class RowGather:
    """One rank's gather of ``intervals`` (global rows) of an array sharded by ``owners`` (immutable).

    The output holds the rows of ``intervals`` in ascending global order. A single interval
    ``[start, end)`` gives the block layout of a sequence dispatch: output row ``i`` is global
    row ``start + i``.

    Attributes:
        size, rank: The CP group and this rank.
        intervals: This rank's merged intervals.
        offsets: Output row of each interval's first row.
        local_rows: Rows this rank owns (``owners[rank + 1] - owners[rank]``).
        rows: Output rows.
        send_index: Local rows sent, grouped by destination rank (ascending).
        send_splits, receive_splits: Rows sent to / received from each rank.
        receive_positions: Output rows of the received rows, grouped by source rank.
        keep_index, keep_positions: Local rows this rank reads itself, and their output rows.
        exchange: Whether any rank of the group sends a row (then every rank joins the all-to-all).
    """

    size: int
    rank: int
    intervals: tuple[Interval, ...]
    offsets: tuple[int, ...]
    local_rows: int
    rows: int
    send_index: np.ndarray
    send_splits: tuple[int, ...]
    receive_splits: tuple[int, ...]
    receive_positions: np.ndarray
    keep_index: np.ndarray
    keep_positions: np.ndarray
    exchange: bool

    @property
    def sent_rows(self) -> int:
        return int(sum(self.send_splits))

    @property
    def received_rows(self) -> int:
        return int(sum(self.receive_splits))

    @property
    def global_start(self) -> int:
        """The first global row gathered (0 when nothing is)."""
        return self.intervals[0][0] if self.intervals else 0

    def locate(self, row: int) -> int:
        """The output row of global row ``row`` (which must be gathered)."""
        i = bisect.bisect_right(self.intervals, (row, float("inf"))) - 1
        if i < 0 or not self.intervals[i][0] <= row < self.intervals[i][1]:
            raise ValueError(f"row {row} is not gathered by rank {self.rank} (intervals {self.intervals})")
        return self.offsets[i] + row - self.intervals[i][0]

    def on(self, device: torch.device) -> DeviceRowGather:
        """The plan's index tables on ``device`` (one copy each; made once per batch), with those of
        the tagged backward exchange (``BackwardOrder``)."""
        def move(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(array).to(device)

        # The backward sends back what it received, each peer's part led by one tag row: its rows
        # come from the gradient's receive_positions (a tag row from row 0, then overwritten), and
        # what returns adds into send_index (a tag row into a spare row past the last).
        out_splits, out_data, out_tags = _tagged(self.receive_splits, self.rank)
        in_splits, in_data, in_tags = _tagged(self.send_splits, self.rank)
        send_rows = np.zeros(sum(out_splits), dtype=np.int64)
        send_rows[out_data] = self.receive_positions
        returned_rows = np.full(sum(in_splits), self.local_rows, dtype=np.int64)
        returned_rows[in_data] = self.send_index
        return DeviceRowGather(self, move(self.send_index), move(self.receive_positions), move(self.keep_index),
                               move(self.keep_positions), tuple(out_splits), tuple(in_splits), move(send_rows),
                               move(out_tags), move(returned_rows), move(in_tags))


def _tagged(splits: tuple[int, ...], rank: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """A peer-ordered exchange of ``splits`` rows with one tag row first in each peer's part:
    (the tagged splits, where the data rows go, where the tag rows go)."""
    tagged = [n + (q != rank) for q, n in enumerate(splits)]
    starts = np.cumsum([0] + tagged[:-1], dtype=np.int64)
    tags = np.asarray([starts[q] for q in range(len(splits)) if q != rank], dtype=np.int64)
    data = np.concatenate([starts[q] + (q != rank) + np.arange(n, dtype=np.int64) for q, n in enumerate(splits)])
    return tagged, data, tags


@dataclass(frozen=True)
class DeviceRowGather:
    """A ``RowGather`` with its index tables on the data's device."""

    plan: RowGather
    send_index: torch.Tensor
    receive_positions: torch.Tensor
    keep_index: torch.Tensor
    keep_positions: torch.Tensor
    # the tagged backward exchange: its splits, the gradient row of each row it sends (row 0 for
    # a tag row), where the tag rows go, the local row each returned row adds into (a spare row
    # past the last for a tag row), and where the returned tag rows are
    tagged_send_splits: tuple[int, ...]
    tagged_receive_splits: tuple[int, ...]
    tagged_send_rows: torch.Tensor
    send_tags: torch.Tensor
    tagged_returned_rows: torch.Tensor
    returned_tags: torch.Tensor


def plan_row_gather(needs: Sequence[Sequence[Interval]], owners: Sequence[int], rank: int) -> RowGather:
    """This rank's ``RowGather`` when rank ``q`` reads ``needs[q]`` of an array rank ``q`` owns rows
    ``[owners[q], owners[q + 1])`` of. Pure: every rank computes every rank's part from the same
    integers, so the ranks' send and receive splits match.

    Raises:
        ValueError: a needed row outside ``[0, owners[-1])``, or ``needs``/``owners`` of another
            group size.
    """
    size = len(owners) - 1
    if len(needs) != size or size < 1:
        raise ValueError(f"row gather: {len(needs)} ranks' needs for {size} owners")
    merged = [merge_intervals(n) for n in needs]
    total = int(owners[-1])
    for q, intervals in enumerate(merged):
        if intervals and (intervals[0][0] < 0 or intervals[-1][1] > total):
            raise ValueError(f"row gather: rank {q} reads rows {intervals} outside the array's [0, {total})")
    mine = merged[rank]
    offsets, position = [], 0
    for begin, end in mine:
        offsets.append(position)
        position += end - begin
    first, last = int(owners[rank]), int(owners[rank + 1])

    def output_rows(rows: np.ndarray) -> np.ndarray:
        out = np.empty_like(rows)
        starts = np.asarray([b for b, _ in mine], dtype=np.int64)
        which = np.searchsorted(starts, rows, side="right") - 1
        out[:] = np.asarray(offsets, dtype=np.int64)[which] + rows - starts[which]
        return out

    send_pieces, send_splits, receive_pieces, receive_splits = [], [], [], []
    keep_rows = np.zeros(0, dtype=np.int64)
    for q in range(size):
        # What this rank sends q: q's rows inside this rank's shard (local indices).
        sent = _cat(_pieces(merged[q], first, last)) if q != rank else np.zeros(0, dtype=np.int64)
        send_pieces.append(sent - first)
        send_splits.append(len(sent))
        # What this rank receives from q: its own rows inside q's shard (output positions).
        rows = _cat(_pieces(mine, int(owners[q]), int(owners[q + 1])))
        if q == rank:
            keep_rows = rows
            receive_splits.append(0)
        else:
            receive_pieces.append(output_rows(rows) if len(rows) else rows)
            receive_splits.append(len(rows))
    exchange = any(_cat(_pieces(merged[q], int(owners[p]), int(owners[p + 1]))).size
                   for q in range(size) for p in range(size) if p != q)
    return RowGather(
        size=size, rank=rank, intervals=mine, offsets=tuple(offsets), local_rows=last - first, rows=position,
        send_index=_cat(send_pieces), send_splits=tuple(send_splits), receive_splits=tuple(receive_splits),
        receive_positions=_cat(receive_pieces), keep_index=keep_rows - first,
        keep_positions=output_rows(keep_rows) if len(keep_rows) else keep_rows, exchange=bool(exchange))


class BackwardOrder:
    """Counts gradient exchanges whose peer was in another forward's backward (on the device: no
    host read in the backward). Each row gather's backward sends every peer one extra row, the
    tag of the forward it belongs to; a peer running another forward's backward at that moment
    (backwards run in a different order on the CP ranks, against DDP's and FSDP2's contract too)
    sends another tag. The next forward's agreement reads the count and raises on every rank."""

    TAGS = 200  # forward numbers modulo this, plus 1: exact in bfloat16 (integers up to 256)

    def __init__(self) -> None:
        self.count: torch.Tensor | None = None

    def tag(self, forward: int) -> int:
        return forward % self.TAGS + 1

    def note(self, mismatched: torch.Tensor) -> None:
        if self.count is None or self.count.device != mismatched.device:
            self.count = torch.zeros((), dtype=torch.int64, device=mismatched.device)
        self.count.add_(mismatched.to(torch.int64))

    def take(self) -> torch.Tensor | None:
        """The count so far (None: no tagged backward ran), reset for the next window."""
        count, self.count = self.count, None
        return count


class _GatherRows(torch.autograd.Function):
    """local [local_rows, ...] -> gathered [rows, ...]; backward: each reader's gradient summed
    into the owner's rows (its own reads first, then the peers' in ascending rank), every peer's
    part tagged with the forward it belongs to (``BackwardOrder``)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, table: DeviceRowGather, group: Any,
                order: tuple[int, BackwardOrder] | None = None) -> torch.Tensor:
        plan = table.plan
        out = local.new_empty((plan.rows, *local.shape[1:]))
        out.index_copy_(0, table.keep_positions, local.index_select(0, table.keep_index))
        if plan.exchange:
            send = local.index_select(0, table.send_index)
            received = local.new_empty((plan.received_rows, *local.shape[1:]))
            dist.all_to_all_single(received, send, list(plan.receive_splits), list(plan.send_splits), group=group)
            out.index_copy_(0, table.receive_positions, received)
        ctx.table, ctx.group, ctx.order = table, group, order
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        table, plan = ctx.table, ctx.table.plan
        grad = grad.contiguous()
        tagged = plan.exchange and ctx.order is not None
        local = grad.new_zeros((plan.local_rows + tagged, *grad.shape[1:]))  # tagged: a spare row for the tags
        local.index_add_(0, table.keep_index, grad.index_select(0, table.keep_positions))
        if plan.exchange and not tagged:
            back = grad.index_select(0, table.receive_positions)
            returned = grad.new_empty((plan.sent_rows, *grad.shape[1:]))
            dist.all_to_all_single(returned, back, list(plan.send_splits), list(plan.receive_splits),
                                   group=ctx.group)
            local.index_add_(0, table.send_index, returned)
        elif plan.exchange:
            tag, order = ctx.order
            if len(grad):
                back = grad.index_select(0, table.tagged_send_rows).index_fill_(0, table.send_tags, float(tag))
            else:  # nothing gathered here: only the tag rows go out
                back = grad.new_full((len(table.send_tags), *grad.shape[1:]), float(tag))
            returned = grad.new_empty((sum(table.tagged_receive_splits), *grad.shape[1:]))
            dist.all_to_all_single(returned, back, list(table.tagged_receive_splits), list(table.tagged_send_splits),
                                   group=ctx.group)
            tags = returned.index_select(0, table.returned_tags).reshape(len(table.returned_tags), -1)[:, 0]
            order.note((tags != tag).sum())
            local = local.index_add_(0, table.tagged_returned_rows, returned)[:plan.local_rows]
        return local, None, None, None


def gather_rows(local: torch.Tensor, table: DeviceRowGather, group: Any,
                order: tuple[int, BackwardOrder] | None = None) -> torch.Tensor:
    """This rank's gathered rows (``table.plan``) of the array whose shard ``local`` is.

    Args:
        local: This rank's owned rows ``[plan.local_rows, ...]`` (along dim 0).
        table: The batch's plan for this rank, on ``local``'s device.
        group: The CP process group; every rank calls this with its own plan of the same batch.
        order: ``(tag, BackwardOrder)``: the backward tags its exchange with the forward's tag
            and counts peers that sent another (None: untagged).

    Returns:
        ``[plan.rows, ...]``; differentiable (backward: SUM into the owners).
    """
    if local.shape[0] != table.plan.local_rows:  # a bug in the caller's layout, not user input
        raise RuntimeError(f"row gather: this rank owns {table.plan.local_rows} rows, got {local.shape[0]}")
    if table.plan.size == 1:
        return local.index_select(0, table.keep_index) if table.plan.rows != local.shape[0] else local
    return _GatherRows.apply(local, table, group, order)
