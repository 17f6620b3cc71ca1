"""Plans and routes behind the seed's planning names (indexer_task_plan, indexer_route).

One cache: ``planned(inputs)`` keeps, per planning inputs (``PlanningInputs``: the
lengths converted once, the CP size, ratio, mode and options), a ``Planned`` entry that
makes on first use and then keeps the C++ plan, each rank's route, the task tuples and the
agreement fingerprints. Every rank's route of one batch comes from the same entry, so the
batch is planned once per process (for zigzag, each rank's route is built alone: the
seed's fast path). The lengths cross into C++ only when an entry builds something new.

Also here: the shims that map the seed's loosely typed options onto the C++ API, and
``RowTuple``, the tuple view of a route field.
"""
from __future__ import annotations

import atexit
import operator
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np

from .. import _core, strategy_params
from .. import _lengths as lengths_tuple
from .._checks import integer

SEED_MODES = ("none", "zigzag", "greedy", "hybrid")
_STRATEGIES = frozenset(name for name, *_ in _core.strategies())
_INT64_MAX = (1 << 63) - 1

T = TypeVar("T")


def mode_name(mode: Any) -> str:
    """A mode as the C++ API takes it; a non-string can never name a mode."""
    return mode if isinstance(mode, str) else "\0"


def option(value: Any) -> int | None:
    """An optional positive-integer option as the C++ API takes it.

    The seed rejects bools and non-integers with its "must be a positive integer" text at
    the same point where it rejects values below 1, so they map to 0 here.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return 0  # below 1 (an int64 or not): the same text
    return min(value, _INT64_MAX)


def option_key(value: Any) -> Any:
    """An option as a cache key part: ``True`` must not find ``1``'s entry (``True == 1``
    and they hash alike), nor ``1.0``; other values as given."""
    if isinstance(value, bool) or (value is not None and not isinstance(value, int)):
        return (type(value).__name__, value)
    return value


def rank_outside(rank: Any, size: Any) -> bool:
    """The seed's first check of ``indexer_route``, ``not 0 <= rank < size``, made before
    anything else as the seed makes it (False when the values do not compare: the type
    checks then name them)."""
    try:
        return not 0 <= rank < size
    except TypeError:
        return False


def positive(value: Any) -> bool:
    """True for an integer option the C++ API takes as positive (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def is_sparsecp_strategy(mode: Any) -> bool:
    """True for a registered strategy that is not one of the seed's modes (spill, auto, ...)."""
    return isinstance(mode, str) and mode in _STRATEGIES and mode not in SEED_MODES


class PlanningInputs(NamedTuple):
    """Everything a plan depends on, converted once per call; the key of the plan cache."""

    lengths: tuple[int, ...]
    size: int
    ratio: int
    mode: Any
    block_size: Any
    zigzag_min_length: Any
    params: tuple[tuple[str, Any], ...]  # sparsecp strategies' parameters, sorted by name

    def extra_params(self) -> _core.StrategyParams | None:
        if not self.params:
            return None
        if self.mode in SEED_MODES:
            raise ValueError(f"the seed's mode '{self.mode}' takes only block_size and zigzag_min_length, "
                             f"got {', '.join(name for name, _ in self.params)}")
        return strategy_params(**dict(self.params))

    def fingerprint(self) -> _core.PlanningFingerprint:
        """What the ranks must agree on; never raises (see ``unusable_fingerprint``)."""
        try:
            mode, options = self.mode, (option(self.block_size), option(self.zigzag_min_length))
            if mode in SEED_MODES:
                return _core.PlanningFingerprint.seed(self.lengths, self.size, self.ratio, mode, *options)
            extra = strategy_params(**dict(self.params))
            if self.block_size is not None:
                extra.block_size = options[0]
            if self.zigzag_min_length is not None:
                extra.zigzag_min_length = options[1]
            return _core.PlanningFingerprint.strategy(self.lengths, self.size, self.ratio, mode, extra)
        except Exception:
            return unusable_fingerprint(self.mode)


def planning_inputs(lengths: Sequence[int], size: int, ratio: int, mode: Any, block_size: Any,
                    zigzag_min_length: Any, params: dict[str, Any]) -> PlanningInputs:
    """The planning inputs of one call. Integers are checked before the cache is consulted
    (``sparsecp._checks``: int or numpy integers, never bool or float), so ``ratio=True``
    cannot hit ``ratio=1``'s entry."""
    return PlanningInputs(lengths_tuple(lengths), integer("size", size), integer("ratio", ratio),
                          mode, option_key(block_size), option_key(zigzag_min_length),
                          tuple(sorted((name, parameter_key(value)) for name, value in params.items())))


def parameter_key(value: Any) -> Any:
    """A parameter value as a cache key part: sequences (``owner_load``, a list or a numpy
    array) as tuples; the rest as given."""
    if isinstance(value, np.ndarray):
        return tuple(value.tolist())
    return tuple(value) if isinstance(value, list) else value


def empty_fingerprint() -> _core.PlanningFingerprint:
    """A fingerprint of no planning inputs, for agreeing on other settings only."""
    return _core.PlanningFingerprint.seed([], 1, 1, "none", None, None)


def unusable_fingerprint(mode: Any) -> _core.PlanningFingerprint:
    """The fingerprint of a rank whose planning inputs cannot be fingerprinted: it still
    takes part in the agreement, and differs from every usable one."""
    return empty_fingerprint().add("unusable planning inputs (mode " + repr(mode)[:40] + ")", 1)


class Planned:
    """What one ``PlanningInputs`` plans to, each part made on first use and then kept.

    ``route(rank, wrap)`` and ``tasks(wrap)`` keep what ``wrap`` makes of the C++ objects, so
    the same inputs give the same Python objects (as the seed's lru_caches do).
    """

    __slots__ = ("inputs", "_plan", "_routes", "_tasks", "_fingerprints", "_tokens")

    def __init__(self, inputs: PlanningInputs) -> None:
        self.inputs = inputs
        self._plan: _core.Plan | None = None
        self._routes: dict[int, Any] = {}
        self._tasks: Any = None
        self._fingerprints: dict[tuple[tuple[str, int], ...], _core.PlanningFingerprint] = {}
        self._tokens: int | None = None

    @property
    def tokens(self) -> int:
        """sum(lengths)."""
        if self._tokens is None:
            self._tokens = sum(self.inputs.lengths)
        return self._tokens

    def plan(self) -> _core.Plan:
        """The C++ plan of every rank (the seed's validation and texts)."""
        if self._plan is None:
            i = self.inputs
            try:
                self._plan = _core.plan_seed(self._batch(), i.size, i.ratio, mode_name(i.mode),
                                             option(i.block_size), option(i.zigzag_min_length), i.extra_params())
            except ValueError as error:
                block = i.block_size
                if type(block) is int and block > _INT64_MAX:  # C++ saw it clamped: name the value given
                    clamped = f"block size {_INT64_MAX} exceeds"
                    if clamped in str(error):
                        raise ValueError(str(error).replace(clamped, f"block size {block} exceeds")) from None
                raise
        return self._plan

    def _batch(self) -> _core.PlanningFingerprint | tuple[int, ...]:
        """The lengths for planning: a fingerprint of them already made for the agreement
        holds them in C++ (so they cross into C++ once per call), else the tuple. An unusable
        fingerprint (``unusable_fingerprint``: no lengths) is never used."""
        documents = len(self.inputs.lengths)
        for fingerprint in self._fingerprints.values():
            if documents and fingerprint.documents == documents:
                return fingerprint
        return self.inputs.lengths

    def route(self, rank: int, wrap: Callable[[_core.Route], T]) -> T:
        """This rank's route, ``wrap``ped (the seed's rank check and texts)."""
        if rank in self._routes:
            return self._routes[rank]
        i = self.inputs
        if not 0 <= rank < i.size:
            raise ValueError("Indexer balance rank must be inside its CP group")
        if i.mode == "zigzag":  # the seed's fast path: only this rank's tasks
            core = _core.route_seed(self._batch(), i.size, rank, i.ratio, i.mode, option(i.block_size),
                                    option(i.zigzag_min_length), i.extra_params())
        else:
            core = _core.route_from_plan(self.plan(), rank)
        route = self._routes[rank] = wrap(core)
        return route

    def tasks(self, wrap: Callable[[_core.Plan], T]) -> T:
        """Every rank's tasks, ``wrap``ped."""
        if self._tasks is None:
            self._tasks = wrap(self.plan())
        return self._tasks

    def fingerprint(self, settings: tuple[tuple[str, int], ...]) -> _core.PlanningFingerprint:
        """The planning inputs' fingerprint with ``settings`` (name, value) added in order."""
        return settings_fingerprint(self.inputs, settings, self._fingerprints)


def settings_fingerprint(inputs: PlanningInputs, settings: tuple[tuple[str, int], ...],
                         cache: dict[tuple[tuple[str, int], ...], _core.PlanningFingerprint]
                         ) -> _core.PlanningFingerprint:
    """``inputs``' fingerprint with ``settings`` (name, value) added in order, kept in
    ``cache`` (the lengths are hashed once per settings)."""
    fingerprint = cache.get(settings)
    if fingerprint is None:
        fingerprint = inputs.fingerprint()
        for name, value in settings:
            fingerprint.add(name, value)
        cache[settings] = fingerprint
    return fingerprint


@lru_cache(maxsize=128)
def planned(inputs: PlanningInputs) -> Planned:
    """The plan cache (``indexer_task_plan.cache_clear()`` / ``indexer_route.cache_clear()``
    clear it; ``cache_info()`` reports it)."""
    return Planned(inputs)


# The cache's Plans and Routes are the extension's objects: drop them at interpreter exit,
# while the extension can still free them, instead of leaving them to module teardown
# (which runs after nanobind's own and prints them as leaked).
atexit.register(planned.cache_clear)


class PlanCached(Generic[T]):
    """A public planning function with the seed's ``lru_cache`` interface (``cache_info``,
    ``cache_clear``) over the one plan cache; use as a decorator."""

    def __init__(self, function: Callable[..., T]) -> None:
        self.__wrapped__ = function
        self.__doc__ = function.__doc__
        self.__name__ = function.__name__
        self.__qualname__ = function.__qualname__
        self.__module__ = function.__module__
        self.cache_info = planned.cache_info
        self.cache_clear = planned.cache_clear

    def __call__(self, *args: Any, **kwargs: Any) -> T:
        return self.__wrapped__(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<function {self.__module__}.{self.__qualname__} (plan cache)>"

    def __reduce__(self) -> str:  # pickled by name, like a function
        return self.__qualname__


class RowTuple(Sequence):
    """A read-only tuple view of an int64 numpy array: one field of an IndexerRoute.

    Compares equal to (and hashes like) the seed's tuple of the same values, indexes and
    slices like it (ints, or 5-tuples for ``segments``), and iterates like it. The
    array itself is ``.array`` (or ``numpy.asarray(field)``), without a copy.
    """

    __slots__ = ("_array", "_hash", "_flat")

    def __init__(self, array: np.ndarray, flat: bool = False) -> None:
        self._array = array
        self._hash: int | None = None
        # The values as one tuple of Python ints, made on construction when asked (segments:
        # what torch.compile reads, since it cannot trace numpy views of C++ memory).
        self._flat: tuple[int, ...] | None = tuple(array.reshape(-1).tolist()) if flat else None

    def flat(self) -> tuple[int, ...]:
        """Every value in row-major order, as Python ints."""
        if self._flat is None:
            self._flat = tuple(self._array.reshape(-1).tolist())
        return self._flat

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


def int64_array(values: Any, width: int = 0) -> np.ndarray:
    """Route field values as a read-only int64 array ([n], or [n, width])."""
    if isinstance(values, RowTuple):
        return values.array
    array = np.array(values, dtype=np.int64, ndmin=1 if not width else 2)
    if width:
        array = array.reshape(-1, width)
    array.setflags(write=False)
    return array
