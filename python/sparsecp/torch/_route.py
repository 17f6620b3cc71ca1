"""The seed's ``IndexerRoute``: one rank's route as the exchange reads it (the bottom layer of
``sparsecp.torch``: it imports only the C++ core and ``_plans``' field views).

Layers of the package, each importing only those below it:

1. ``_plans`` (the plan cache, ``RowTuple``), ``_route`` (this), ``_agreement``, ``_exchange``
   (the row exchange and its byte counters), ``_checks`` (input checks and agreement),
   ``_worker_time``, ``calibrate``, ``select``, ``_replay`` (record / replay);
2. ``_overlapped`` (the overlapped handle, ``IndexerInputExchange``), ``_prebuilt`` (routes
   made at data time, the fixed-capacity exchange), ``ops``, ``kl``, ``sequence``,
   ``_compiled``;
3. ``indexer_balance``: the seed's public names; ``sparsecp.torch`` re-exports them all.
"""
from __future__ import annotations

import operator
from dataclasses import FrozenInstanceError
from typing import Any

from .. import _core
from ._plans import RowTuple, int64_array

__all__ = ["IndexerRoute"]

_ROUTE_FIELDS = ("segments", "input_splits", "output_splits", "send_rows", "receive_rows", "local_sources",
                 "local_targets", "query_count")
_ROW_FIELDS = _ROUTE_FIELDS[:7]


class IndexerRoute:
    """Device-independent row ordering and matching variable collective splits.

    The seed's frozen dataclass, field for field: ``segments`` ((q_begin, q_end,
    key_begin, key_end, residual) per worker task), ``input_splits``, ``output_splits``,
    ``send_rows``, ``receive_rows``, ``local_sources``, ``local_targets`` (each a
    ``RowTuple``, equal to the seed's tuple) and ``query_count`` (int). ``core`` is the
    C++ route (``sparsecp.Route``) when sparsecp built it; its fields are then wrapped on
    first access, without copying.
    """

    __slots__ = ("core", "query_count", "_fields", "_hash")
    core: _core.Route | None
    query_count: int
    _fields: list[RowTuple | None]
    _hash: int | None

    def __init__(self, segments: Any, input_splits: Any, output_splits: Any, send_rows: Any, receive_rows: Any,
                 local_sources: Any, local_targets: Any, query_count: int) -> None:
        fields = [RowTuple(int64_array(segments, width=5), flat=True)]
        fields += [RowTuple(int64_array(values)) for values in (input_splits, output_splits, send_rows,
                                                                receive_rows, local_sources, local_targets)]
        set_field = object.__setattr__
        set_field(self, "core", None)
        set_field(self, "query_count", operator.index(query_count))
        set_field(self, "_fields", fields)
        set_field(self, "_hash", None)

    @classmethod
    def from_core(cls, route: _core.Route) -> IndexerRoute:
        """Wrap a C++ route; its arrays are viewed (on first access), never copied."""
        self = cls.__new__(cls)
        set_field = object.__setattr__
        set_field(self, "core", route)
        set_field(self, "query_count", route.query_count)
        set_field(self, "_fields", [None] * 7)
        set_field(self, "_hash", None)
        return self

    def detached(self) -> IndexerRoute:
        """This route holding no extension object: a C++ route's fields copied into arrays of
        their own (itself when it holds none). For what an autograd graph can reach (a model's
        per-batch tables): torch does not free the Python objects of a graph still alive at
        interpreter exit (a script's global loss), and nanobind reports each extension object
        left that way as leaked when the interpreter ends."""
        if self.core is None:
            return self
        segments, inputs, outputs, sends, receives, sources, targets = (
            self._field(index).array for index in range(len(_ROW_FIELDS)))  # __init__ copies them
        route = IndexerRoute(segments, inputs, outputs, sends, receives, sources, targets, self.query_count)
        object.__setattr__(route, "_hash", self._hash)
        return route

    def _field(self, index: int) -> RowTuple:
        value = self._fields[index]
        if value is None:
            # segments with their flat tuple: a compiled selector reads it (select.flat_segments)
            value = self._fields[index] = RowTuple(getattr(self.core, _ROW_FIELDS[index]), flat=index == 0)
        return value

    segments = property(lambda self: self._field(0), doc="(q_begin, q_end, key_begin, key_end, residual) per task")
    input_splits = property(lambda self: self._field(1), doc="rows this owner sends to each peer")
    output_splits = property(lambda self: self._field(2), doc="rows this worker receives from each owner")
    send_rows = property(lambda self: self._field(3), doc="local owner rows, grouped by destination")
    receive_rows = property(lambda self: self._field(4), doc="worker positions, grouped by source owner")
    local_sources = property(lambda self: self._field(5), doc="local owner rows this rank selects itself")
    local_targets = property(lambda self: self._field(6), doc="their worker positions")

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field '{name}'")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field '{name}'")

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, IndexerRoute):
            return NotImplemented
        return self is other or all(getattr(self, name) == getattr(other, name) for name in _ROUTE_FIELDS)

    def __hash__(self) -> int:
        # From cheap content summaries (sizes and sums), so that equal routes hash equally
        # without hashing every byte: _device_rows' cache hashes each new route once.
        value = self._hash
        if value is None:
            digest = tuple((len(array), int(array.sum())) for array in (getattr(self, name).array
                                                                         for name in _ROW_FIELDS))
            value = hash((self.query_count, digest))
            object.__setattr__(self, "_hash", value)
        return value

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _ROUTE_FIELDS)
        return f"IndexerRoute({fields})"

    @property
    def owner_rows(self) -> int:
        """Rows this rank owns: len(send_rows) + len(local_sources)."""
        return len(self.send_rows) + len(self.local_sources)
