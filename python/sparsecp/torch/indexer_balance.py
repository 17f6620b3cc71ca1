"""The seed's ``indexer_balance`` module (Huawei hyper_parallel), drop-in, backed by sparsecp.

No-grad query-task redistribution for compressed Indexer selection: main attention,
teacher and KL keep the original sequence ownership; selection exchanges low-rank query
residuals, merge weights and original rotary embeddings, receivers project Indexer Q
and return integer TopK results. Code written against the seed's module runs unchanged
after ``import sparsecp.torch as indexer_balance``: the same public names, signatures,
argument order, return types and error texts.

What is different:

* Planning and routes come from sparsecp's C++ planners (the seed's exact plans and
  routes, 100-1000x faster). ``IndexerRoute`` fields compare equal to the seed's tuples
  and index like them, but are views of the C++ route's arrays: no per-row Python
  object is built. Routes and task plans are ``lru_cache``d like the seed's.
* ``mode`` also takes sparsecp's own strategies (``spill``, ``auto``, the peers; see
  ``sparsecp.strategies()``), with their extra parameters as keyword arguments after the
  seed's (e.g. ``target_imbalance=1.01``). ``'none'`` is accepted as the no-balancing
  baseline (every rank selects its own rows; nothing moves); the seed rejects it with
  "Indexer task mode must be 'zigzag', 'greedy' or 'hybrid'".
* Before any data moves, every rank of the group agrees on its inputs (lengths, size,
  ratio, mode and options, field widths and dtypes; topk before results return): a
  rank given different inputs, or invalid ones, raises on every rank instead of leaving
  its peers blocked in an all-to-all (``_agreement.py``). This costs one 3-value
  all-reduce per launch and one per result return.
* Bytes handed to ``all_to_all_single`` are counted (``exchange_stats``) and equal the
  route's prediction (``expected_exchange_bytes``).

Communication is the seed's: ``torch.distributed.all_to_all_single(..., async_op=True)``
on the caller's ``group`` (gloo for CPU tensors, NCCL for CUDA tensors), fields of one
dtype packed side by side, one all-to-all per dtype group, local rows copied directly
and never sent to self.
"""
from __future__ import annotations

import operator
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import FrozenInstanceError, dataclass
from functools import lru_cache
from typing import Any, NamedTuple, Optional

import numpy as np
import torch
import torch.distributed as dist

from .. import _core, strategy_params
from .._checks import integer, integer_list
from ._agreement import agree, capture, control_device, dtype_code

__all__ = [
    "ExchangeBytes",
    "IndexerInputExchange",
    "IndexerRoute",
    "IndexerTask",
    "RowTuple",
    "balanced_indexer_select",
    "exchange_stats",
    "expected_exchange_bytes",
    "indexer_route",
    "indexer_task_plan",
    "launch_indexer_inputs",
    "reset_exchange_stats",
    "resolve_indexer_balance_block_size",
    "validate_indexer_hybrid_threshold",
]

_SEED_MODES = ("none", "zigzag", "greedy", "hybrid")
_STRATEGIES = frozenset(name for name, *_ in _core.strategies())
_INT64_MAX = (1 << 63) - 1


def _mode(mode: Any) -> str:
    """A mode as the C++ API takes it; a non-string can never name a mode."""
    return mode if isinstance(mode, str) else "\0"


def _option(value: Any) -> Optional[int]:
    """An optional positive-integer option as the C++ API takes it.

    The seed rejects bools and non-integers with its "must be a positive integer" text at
    the same point where it rejects values below 1, so they map to 0 here.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return min(value, _INT64_MAX)


def _lengths(lengths: Sequence[int]) -> tuple[int, ...]:
    if type(lengths) is tuple:
        return lengths
    return integer_list("lengths", lengths)


def _extra_params(mode: str, params: dict[str, Any]) -> Optional[_core.StrategyParams]:
    if not params:
        return None
    if mode in _SEED_MODES:
        raise ValueError(f"the seed's mode '{mode}' takes only block_size and zigzag_min_length, "
                         f"got {', '.join(sorted(params))}")
    return strategy_params(**params)


def _sparsecp_strategy(mode: Any) -> bool:
    """True for a registered strategy that is not one of the seed's modes (spill, auto, ...)."""
    return isinstance(mode, str) and mode in _STRATEGIES and mode not in _SEED_MODES


def resolve_indexer_balance_block_size(mode: str, block_size: int | None) -> int | None:
    """Resolve the greedy-pool query block option, defaulting to 2048 rows.

    None represents an omitted option so none/zigzag remain valid without it.
    Explicit values require greedy/hybrid mode and must be positive integers.
    sparsecp's own strategies (not in the seed) take an optional positive block size
    (``auto`` uses it for its greedy/hybrid candidates) and return it unchanged.
    """
    if _sparsecp_strategy(mode):
        if block_size is not None and _option(block_size) < 1:
            raise ValueError("indexer_balance_block_size must be a positive integer")
        return block_size
    return _core.resolve_block_size(_mode(mode), _option(block_size))


def validate_indexer_hybrid_threshold(mode: str, min_length: int | None) -> None:
    """Require an explicit raw-token document threshold only for hybrid scheduling.

    The threshold selects complete zigzag fragments independently of CP size and
    the greedy block size. No performance threshold is chosen implicitly.
    sparsecp's own strategies take an optional positive threshold (``auto`` uses it for
    its hybrid candidate).

    Args:
        mode: Selected Indexer load-balancing strategy.
        min_length: Explicit positive raw-token document threshold for hybrid.
    """
    if _sparsecp_strategy(mode):
        if min_length is not None and _option(min_length) < 1:
            raise ValueError("indexer_zigzag_min_length must be a positive integer")
        return
    _core.validate_hybrid_threshold(mode == "hybrid", _option(min_length))


@dataclass(frozen=True, order=True)
class IndexerTask:
    """A contiguous query interval in the original document coordinates."""

    document: int
    start: int
    end: int

    @property
    def length(self) -> int:
        """Return the number of real query rows, excluding any synthetic padding."""
        return self.end - self.start


_LAST_PLAN: list = [None, None]  # (inputs, plan) of the last _plan call


@lru_cache(maxsize=128)
def _plan(lengths: tuple[int, ...], size: int, ratio: int, mode: Any, block_size: Any,
          zigzag_min_length: Any, params: tuple) -> _core.Plan:
    """The C++ plan behind indexer_task_plan and the non-zigzag routes (planned once)."""
    return _core.plan_seed(lengths, size, ratio, _mode(mode), _option(block_size), _option(zigzag_min_length),
                           _extra_params(_mode(mode), dict(params)))


def _last_plan(*inputs: Any) -> _core.Plan:
    """_plan, remembering the last inputs: the routes of every rank of one batch are built
    one after another from the same objects, so a tuple comparison (identity first) stands
    in for hashing the lengths again."""
    last, planned = _LAST_PLAN
    if last != inputs:
        planned = _plan(*inputs)
        _LAST_PLAN[:] = [inputs, planned]
    return planned


@lru_cache(maxsize=128, typed=True)  # typed: ratio=True must not hit ratio=1's entry
def indexer_task_plan(lengths: tuple[int, ...], size: int, ratio: int, mode: str,
                      block_size: int | None = None, zigzag_min_length: int | None = None,
                      **strategy_params: Any) -> tuple:
    """Assign real queries using zigzag, greedy or a shared-budget hybrid plan.

    Cached like the seed's (``functools.lru_cache``, so ``lengths`` is a tuple);
    ``indexer_task_plan.cache_clear()`` also drops the plans behind ``indexer_route``.

    Args:
        lengths: Global document lengths in packed order.
        size: CP group size; total packed tokens must divide this value.
        ratio: Compression ratio used by the unchanged Indexer kernel.
        mode: 'zigzag' pairs document tails and heads after removing the leading
            remainder; 'greedy' weights blocks by the number of causal Q/K pairs;
            'hybrid' keeps long-document zigzag fragments and greedily places
            their leading remainders together with all shorter documents. sparsecp also
            accepts 'none' (every rank keeps its rows) and its own strategies
            (``sparsecp.strategies()``: 'spill', 'auto', ...).
        block_size: Maximum original query rows per greedy task, before adjacent
            tasks assigned to one rank are merged. Greedy/hybrid default to 2048.
            Explicit values require greedy/hybrid and must be positive and at most local Q
            to guarantee its per-worker row bound. Omit this option for zigzag.
        zigzag_min_length: Hybrid-only minimum document length in original tokens.
            Must be specified explicitly. Eligible fragments remain whole,
            independently of block_size. Documents shorter than 2*size enter the
            greedy pool because they have no complete zigzag fragments.
        **strategy_params: sparsecp strategies only: their parameters
            (``sparsecp.strategy_params``), e.g. ``target_imbalance`` for 'spill'.

    Returns:
        A sorted, disjoint task list (tuple of IndexerTask) for each rank. Greedy/hybrid
        cap each worker at twice the original local query count; zigzag preserves equal
        row counts.
    """
    size, ratio = integer("size", size), integer("ratio", ratio)
    planned = _last_plan(lengths, size, ratio, mode, block_size, zigzag_min_length,
                         tuple(sorted(strategy_params.items())))
    return tuple(tuple(IndexerTask(*task) for task in planned.tasks(rank)) for rank in range(size))


def _clear_plans(clear_task_plans: Callable[[], None] = indexer_task_plan.cache_clear) -> None:
    clear_task_plans()
    _plan.cache_clear()
    _LAST_PLAN[:] = [None, None]


indexer_task_plan.cache_clear = _clear_plans  # type: ignore[attr-defined]


class RowTuple(Sequence):
    """A read-only tuple view of an int64 numpy array: one field of an IndexerRoute.

    Compares equal to (and hashes like) the seed's tuple of the same values, indexes and
    slices like it (ints, or 5-tuples for ``segments``), and iterates like it. The
    array itself is ``.array`` (or ``numpy.asarray(field)``), without a copy.
    """

    __slots__ = ("_array", "_hash")

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self._hash: Optional[int] = None

    @property
    def array(self) -> np.ndarray:
        """The int64 values: [n] for row lists and splits, [n, 5] for segments."""
        return self._array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._array if dtype is None else self._array.astype(dtype)

    def __len__(self) -> int:
        return len(self._array)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(_items(self._array[index]))
        value = self._array[operator.index(index)]
        return int(value) if value.ndim == 0 else tuple(value.tolist())

    def __iter__(self) -> Iterator[Any]:
        return _items(self._array)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, RowTuple):
            return self._array.shape == other._array.shape and bool(np.array_equal(self._array, other._array))
        if not isinstance(other, tuple):
            return NotImplemented
        if len(other) != len(self._array):
            return False
        values = np.asarray(other) if other else None
        if values is not None and values.shape == self._array.shape and values.dtype.kind in "iu":
            return bool(np.array_equal(values, self._array))
        return tuple(self) == other

    def __ne__(self, other: Any) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self))
        return self._hash

    def __repr__(self) -> str:
        if len(self._array) <= 32:
            return repr(tuple(self))
        head = ", ".join(map(repr, self[:4]))
        return f"({head}, ... {len(self._array) - 4} more)"


def _items(array: np.ndarray) -> Iterator[Any]:
    return iter(array.tolist()) if array.ndim == 1 else map(tuple, array.tolist())


def _int64(values: Any, width: int = 0) -> np.ndarray:
    if isinstance(values, RowTuple):
        return values.array
    array = np.array(values, dtype=np.int64, ndmin=1 if not width else 2)
    if width:
        array = array.reshape(-1, width)
    array.setflags(write=False)
    return array


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

    def __init__(self, segments: Any, input_splits: Any, output_splits: Any, send_rows: Any, receive_rows: Any,
                 local_sources: Any, local_targets: Any, query_count: int) -> None:
        fields = [RowTuple(_int64(segments, width=5))]
        fields += [RowTuple(_int64(values)) for values in (input_splits, output_splits, send_rows, receive_rows,
                                                          local_sources, local_targets)]
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

    def _field(self, index: int) -> RowTuple:
        value = self._fields[index]
        if value is None:
            value = self._fields[index] = RowTuple(getattr(self.core, _ROW_FIELDS[index]))
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
        if self._hash is None:
            digest = tuple((len(array), int(array.sum())) for array in (getattr(self, name).array
                                                                         for name in _ROW_FIELDS))
            object.__setattr__(self, "_hash", hash((self.query_count, digest)))
        return self._hash

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _ROUTE_FIELDS)
        return f"IndexerRoute({fields})"

    @property
    def owner_rows(self) -> int:
        """Rows this rank owns: len(send_rows) + len(local_sources)."""
        return len(self.send_rows) + len(self.local_sources)


@lru_cache(maxsize=128, typed=True)
def indexer_route(lengths: tuple[int, ...], size: int, rank: int, ratio: int, mode: str,
                  block_size: int | None = None, zigzag_min_length: int | None = None,
                  **strategy_params: Any) -> IndexerRoute:
    """Keep self-owned tasks local and communicate the remaining rows in owner order.

    Cached like the seed's (``functools.lru_cache``, so ``lengths`` is a tuple): the same
    inputs return the same route object.

    Args:
        lengths: Shared document lengths in raw tokens.
        size: Number of ranks in the CP group.
        rank: Current rank within the CP group.
        ratio: Compression ratio used by the Indexer.
        mode: Zigzag, greedy or hybrid task allocation ('none' and sparsecp's strategies
            too, see indexer_task_plan).
        block_size: Maximum initial greedy-pool task size in Q rows.
        zigzag_min_length: Hybrid-only long-document threshold.
        **strategy_params: sparsecp strategies only: their parameters.

    Returns:
        Immutable input/result route with a local-task bypass.
    """
    size, rank, ratio = integer("size", size), integer("rank", rank), integer("ratio", ratio)
    if not 0 <= rank < size:
        raise ValueError("Indexer balance rank must be inside its CP group")
    params = tuple(sorted(strategy_params.items()))
    if mode == "zigzag":  # the seed's fast path: only this rank's tasks
        return IndexerRoute.from_core(
            _core.route_seed(lengths, size, rank, ratio, mode, _option(block_size), _option(zigzag_min_length),
                             _extra_params(mode, dict(params))))
    planned = _last_plan(lengths, size, ratio, mode, block_size, zigzag_min_length, params)
    return IndexerRoute.from_core(_core.route_from_plan(planned, rank))


@lru_cache(maxsize=32)
@torch.inference_mode(False)
def _device_rows(route: IndexerRoute, device: torch.device) -> tuple:
    """(send_rows, receive_rows, local_sources, local_targets) as int64 tensors on ``device``."""
    with warnings.catch_warnings():  # read-only route arrays: torch never writes index tensors
        warnings.simplefilter("ignore", UserWarning)
        return tuple(torch.from_numpy(getattr(route, name).array).to(device) for name in
                     ("send_rows", "receive_rows", "local_sources", "local_targets"))


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
        route: This rank's route.
        input_row_bytes: Bytes of one row of all input fields together, e.g.
            q_rank * 2 (bf16 qr) + heads * 4 + rope_dim * 4 (fp32 weights, cos, sin).
        topk: Selected ids per row.
        index_bytes: Bytes of one id (4: int32).
    """
    sent, received = int(route.input_splits.array.sum()), int(route.output_splits.array.sum())
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
    """Bytes this process handed to / received from other ranks through the exchanges of
    this module since the last reset (``bytes_sent``, ``bytes_received``), and the number
    of all-to-all calls (``exchanges``). Rows a rank keeps are never sent, so these equal
    ``expected_exchange_bytes`` of the routes used."""
    with _STATS_LOCK:
        return {"bytes_sent": _STATS.bytes_sent, "bytes_received": _STATS.bytes_received,
                "exchanges": _STATS.exchanges}


def reset_exchange_stats() -> None:
    """Zero the counters of ``exchange_stats``."""
    with _STATS_LOCK:
        _STATS.bytes_sent = _STATS.bytes_received = _STATS.exchanges = 0


def _all_to_all(received: torch.Tensor, send: torch.Tensor, output_splits: list, input_splits: list,
                group: Any) -> Any:
    """The seed's one collective (async), counted."""
    work = dist.all_to_all_single(received, send, output_splits, input_splits, group=group, async_op=True)
    with _STATS_LOCK:
        _STATS.bytes_sent += send.numel() * send.element_size()
        _STATS.bytes_received += received.numel() * received.element_size()
        _STATS.exchanges += 1
    return work


def _splits(route: IndexerRoute) -> tuple[list, list]:
    return route.input_splits.array.tolist(), route.output_splits.array.tolist()


def _exchange_rows(tensor: torch.Tensor, route: IndexerRoute, group: Any, rows: tuple) -> torch.Tensor:
    """Exchange remote rows and place local bypass rows in worker task order."""
    send_rows, receive_rows, local_sources, local_targets = rows
    input_splits, output_splits = _splits(route)
    send = tensor.index_select(0, send_rows).contiguous()
    received = tensor.new_empty((sum(output_splits), *tensor.shape[1:]))
    work = _all_to_all(received, send, output_splits, input_splits, group)
    output = tensor.new_empty((route.query_count, *tensor.shape[1:]))
    output.index_copy_(0, local_targets, tensor.index_select(0, local_sources))
    work.wait()
    output.index_copy_(0, receive_rows, received)
    return output


def _exchange_inputs(inputs: tuple[torch.Tensor, ...], route: IndexerRoute, group: Any, rows: tuple) -> tuple:
    """Pack fields of equal dtype together without rounding the original RoPE values."""
    by_dtype: dict[torch.dtype, list[int]] = {}
    for index, tensor in enumerate(inputs):
        by_dtype.setdefault(tensor.dtype, []).append(index)
    outputs: list[Any] = [None] * len(inputs)
    for indices in by_dtype.values():
        widths = [inputs[index].shape[-1] for index in indices]
        packed = torch.cat([inputs[index][0] for index in indices], dim=-1)
        received = _exchange_rows(packed, route, group, rows)
        for index, field in zip(indices, received.split(widths, dim=-1)):
            outputs[index] = field.unsqueeze(0).contiguous()
    return tuple(outputs)


# --------------------------------------------------------------------------------------
# Validation and agreement (not in the seed, which trusts every rank's inputs).

_INPUT_NAMES = ("qr", "weights", "cos", "sin")


def _planning_fingerprint(lengths: Any, size: int, ratio: Any, mode: Any, block_size: Any, zigzag_min_length: Any,
                          params: dict) -> _core.PlanningFingerprint:
    """What the ranks must agree on; never raises (a rank with unusable inputs still takes
    part in the agreement, with a fingerprint that marks them)."""
    try:
        lengths = list(_lengths(lengths))
        if mode in _SEED_MODES:
            return _core.PlanningFingerprint.seed(lengths, size, ratio, mode, _option(block_size),
                                                  _option(zigzag_min_length))
        extra = strategy_params(**params)
        if block_size is not None:
            extra.block_size = _option(block_size)
        if zigzag_min_length is not None:
            extra.zigzag_min_length = _option(zigzag_min_length)
        return _core.PlanningFingerprint.strategy(lengths, size, ratio, mode, extra)
    except Exception:
        fingerprint = _core.PlanningFingerprint.seed([], 1, 1, "none", None, None)
        return fingerprint.add("unusable planning inputs (mode " + repr(mode)[:40] + ")", 1)


def _check_inputs(inputs: tuple, size: int, lengths: Any, axes_text: str) -> None:
    """The seed's input checks and texts."""
    query_residual = inputs[0]
    if (len(inputs) != 4 or query_residual.ndim != 3 or query_residual.shape[0] != 1
            or query_residual.shape[1] * size != sum(lengths)):
        raise ValueError("Indexer balance requires batch one and equal contiguous source query shards")
    if any(tensor.ndim != 3 or tensor.shape[:2] != query_residual.shape[:2]
           or tensor.device != query_residual.device for tensor in inputs):
        raise ValueError(axes_text)


def _launch_checks(inputs: tuple, lengths: Any, ratio: int, mode: str, group: Any, block_size: Any,
                   zigzag_min_length: Any, params: dict, axes_text: str) -> IndexerRoute:
    """Validate, route and agree with every rank; returns this rank's route."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    tensors = tuple(value for value in inputs if isinstance(value, torch.Tensor))
    device = control_device(group, tensors[0].device if tensors else None)

    def check() -> IndexerRoute:
        if len(tensors) != len(inputs):
            raise ValueError("Indexer balance requires batch one and equal contiguous source query shards")
        _check_inputs(inputs, size, _lengths(lengths), axes_text)
        integer("ratio", ratio)
        return indexer_route(_lengths(lengths), size, rank, ratio, mode, block_size, zigzag_min_length, **params)

    route, error = capture(check)
    fingerprint = _planning_fingerprint(lengths, size, ratio, mode, block_size, zigzag_min_length, params)
    for name, tensor in zip(_INPUT_NAMES, tensors):
        fingerprint.add(name + " width", int(tensor.shape[-1]) if tensor.ndim else -1)
        fingerprint.add(name + " dtype", dtype_code(tensor.dtype))
    fingerprint.add("fields", len(inputs))
    agree(group, device, error, fingerprint, "Indexer input exchange")
    return route


def _result_checks(selected: Any, route: IndexerRoute, group: Any, device_hint: torch.device,
                   failure: Optional[BaseException] = None) -> None:
    """Every rank returns [query_count, topk] results of one dtype and topk; agreed.

    ``failure`` is this rank's selector error, if it raised: every rank raises then."""
    device = control_device(group, device_hint)

    def check() -> None:
        if failure is not None:
            raise failure
        if not isinstance(selected, torch.Tensor) or selected.ndim != 2 or selected.shape[0] != route.query_count:
            shape = tuple(selected.shape) if isinstance(selected, torch.Tensor) else type(selected).__name__
            raise ValueError(f"Indexer selection must return [{route.query_count}, topk] rows for this worker, "
                             f"got {shape}")
        if selected.device != device_hint:
            raise ValueError(f"Indexer selection returned a tensor on {selected.device}, expected {device_hint}")

    _, error = capture(check)
    fingerprint = _core.PlanningFingerprint.seed([], 1, 1, "none", None, None)
    if error is None:
        fingerprint.add("topk", int(selected.shape[1])).add("result dtype", dtype_code(selected.dtype))
    agree(group, device, error, fingerprint, "Indexer result exchange", invalid_first=True)


# --------------------------------------------------------------------------------------
# The seed's exchange entry points.


@torch.no_grad()
def balanced_indexer_select(query_residual: torch.Tensor, weights: torch.Tensor,
                            position_embeddings: tuple[torch.Tensor, torch.Tensor], selector: Callable,
                            lengths: tuple[int, ...], ratio: int, mode: str, group: Any,
                            block_size: int | None = None, zigzag_min_length: int | None = None,
                            **strategy_params: Any) -> torch.Tensor:
    """Redistribute low-rank selection inputs and return TopK to the original owners.

    Args:
        query_residual: Local low-rank query residual [1, local tokens, q_lora_rank].
        weights: Local merge weights [1, local tokens, heads].
        position_embeddings: Original per-token cos/sin, each [1, local tokens, rotary/2].
            All payload dtypes are preserved; tensors of equal dtype share a collective.
        selector: Callable (qr, weights, (cos, sin), segments) that projects Indexer Q
            with the current layer parameters and selects against the planned Index K bank
            (``sparsecp.torch.IndexerSelector`` is one). It runs without autograd; owner-side
            Q and weights retain their KL gradients. Returns [1, worker rows, topk].
        lengths: Global original document lengths; no per-document CP padding is added.
        ratio: Compression ratio used by this selection layer.
        mode: 'zigzag', 'greedy' or 'hybrid' (or 'none', 'spill', 'auto', ...), identical
            on all CP ranks.
        group: Original sequence-ordered CP process group.
        block_size: Greedy task length in original query rows; see indexer_task_plan.
        zigzag_min_length: Hybrid-only minimum original document length.
        **strategy_params: sparsecp strategies only: their parameters.

    Returns:
        This rank's own rows' selected ids, [1, local tokens, topk] (the selector's dtype,
        int32 for sparsecp's selectors).

    Raises:
        ValueError: on every rank, when any rank's inputs are invalid or the ranks' inputs
            differ (the seed's texts for the checks it has).
    """
    inputs = (query_residual, weights, *position_embeddings)
    route = _launch_checks(inputs, lengths, ratio, mode, group, block_size, zigzag_min_length, strategy_params,
                           "Indexer qr, weights and rotary embeddings must have matching batch/token axes and device")
    rows = _device_rows(route, query_residual.device)
    balanced_qr, balanced_weights, cos, sin = _exchange_inputs(inputs, route, group, rows)
    # A selector failing on one rank must not leave its peers in the result exchange.
    selected, failure = capture(lambda: selector(balanced_qr, balanced_weights, (cos, sin), route.segments)[0])
    _result_checks(selected, route, group, query_residual.device, failure)
    send_rows, receive_rows, local_sources, local_targets = rows
    input_splits, output_splits = _splits(route)
    send = selected.index_select(0, receive_rows).contiguous()
    received = selected.new_empty((sum(input_splits), selected.shape[-1]))
    work = _all_to_all(received, send, input_splits, output_splits, group)
    output = selected.new_empty((query_residual.shape[1], selected.shape[-1]))
    output.index_copy_(0, local_sources, selected.index_select(0, local_targets))
    work.wait()
    output.index_copy_(0, send_rows, received)
    return output.unsqueeze(0)


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
        output.index_copy_(0, self.receive_rows, self.received)
        self.send = self.received = self.output = self.work = None
        return output


@dataclass
class IndexerInputExchange:
    """One balanced query dispatch with original routing and dtype groups."""

    route: IndexerRoute
    rows: tuple
    group: Any
    owner_queries: int
    transfers: tuple
    fields: tuple
    widths: tuple
    consumed: bool = False

    @torch.no_grad()
    def wait(self) -> tuple:
        """Restore qr, weights and original RoPE after all input launches.

        Returns:
            (qr, weights, cos, sin), each [1, worker rows, width] in worker order
            (``route.segments`` describes the rows), with the owners' dtypes.
        """
        if self.consumed:
            raise RuntimeError("Indexer input exchange cannot be consumed twice")
        self.consumed = True
        outputs: list[Any] = [None] * len(self.widths)
        for transfer, indices in zip(self.transfers, self.fields):
            merged = transfer.wait()
            for index, value in zip(indices, merged.split([self.widths[i] for i in indices], dim=-1)):
                outputs[index] = value.unsqueeze(0).contiguous()
        self.transfers = ()
        return tuple(outputs)

    @torch.no_grad()
    def launch_result(self, selected: torch.Tensor) -> _PendingRows:
        """Return selection IDs while owner-side differentiable projections run.

        Args:
            selected: This worker's ids, [route.query_count, topk]. Collective: every rank
                calls it, with the same topk and dtype (agreed before anything moves).

        Returns:
            A single-use handle whose wait() gives this rank's own rows' ids
            [owner_queries, topk].
        """
        send_rows, receive_rows, local_sources, local_targets = self.rows
        _result_checks(selected, self.route, self.group, send_rows.device)
        input_splits, output_splits = _splits(self.route)
        send = selected.index_select(0, receive_rows).contiguous()
        received = selected.new_empty((sum(input_splits), selected.shape[-1]))
        work = _all_to_all(received, send, input_splits, output_splits, self.group)
        output = selected.new_empty((self.owner_queries, selected.shape[-1]))
        output.index_copy_(0, local_sources, selected.index_select(0, local_targets))
        return _PendingRows(send, received, output, send_rows, work)


@torch.no_grad()
def launch_indexer_inputs(
    query_residual: torch.Tensor, weights: torch.Tensor, embeddings: tuple,
    lengths: tuple[int, ...], ratio: int, mode: str, group: Any,
    block_size: int | None = None, zigzag_min_length: int | None = None,
    **strategy_params: Any,
) -> IndexerInputExchange:
    """Launch all selection input fields without waiting for worker readiness.

    Args:
        query_residual: Owner qr, shaped [1, local Q, q_lora_rank].
        weights: Owner Indexer merge weights [1, local Q, heads].
        embeddings: Original cos/sin, each [1, local Q, rotary/2]; retain their dtypes and
            positions.
        lengths: Global document lengths for contiguous CP ownership.
        ratio: Key compression ratio.
        mode: Existing zigzag, greedy or hybrid task assignment (or 'none', 'spill',
            'auto', ...).
        group: CP process group.
        block_size: Greedy task length in original query rows.
        zigzag_min_length: Hybrid long-document threshold.
        **strategy_params: sparsecp strategies only: their parameters.

    Returns:
        Single-use handle retaining transfer storage until wait.
    """
    inputs = (query_residual, weights, *embeddings)
    route = _launch_checks(inputs, lengths, ratio, mode, group, block_size, zigzag_min_length, strategy_params,
                           "Indexer qr, weights and rotary embeddings must share token axes and device")
    rows = _device_rows(route, query_residual.device)
    send_rows, receive_rows, local_sources, local_targets = rows
    input_splits, output_splits = _splits(route)
    grouped: dict[torch.dtype, list[int]] = {}
    for index, value in enumerate(inputs):
        grouped.setdefault(value.dtype, []).append(index)
    transfers, fields = [], []
    for indices in grouped.values():
        packed = torch.cat([inputs[index][0] for index in indices], dim=-1)
        send = packed.index_select(0, send_rows).contiguous()
        received = packed.new_empty((sum(output_splits), packed.shape[-1]))
        work = _all_to_all(received, send, output_splits, input_splits, group)
        output = packed.new_empty((route.query_count, packed.shape[-1]))
        output.index_copy_(0, local_targets, packed.index_select(0, local_sources))
        transfers.append(_PendingRows(send, received, output, receive_rows, work))
        fields.append(tuple(indices))
    return IndexerInputExchange(route, rows, group, query_residual.shape[1], tuple(transfers),
                                tuple(fields), tuple(value.shape[-1] for value in inputs))
