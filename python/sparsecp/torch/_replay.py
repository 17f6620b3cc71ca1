"""Record and replay of selection results: recompute and RL without a second selection.

Selection is discrete and runs without grad, so replaying its integer result is exact. A
``SelectionReplay`` records, in call order, what every sparsecp selection entry point
returned while its ``record()`` context was active (``balanced_indexer_select``,
``launch_indexer_inputs`` with its handles, ``packed_indexer_select``, ``select_indices``,
``torch.ops.sparsecp.select_rows`` on every device: its ``key_begin`` / ``visible`` are
compared by shape, dtype and device, not value, which would need a host read);
inside its ``replay()`` context the same calls return the recorded ids with no planning, no
data movement and no selection work. ``selection_replay_contexts`` is the pair of them that
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...)`` expects.

What a replayed call does, by entry point:

* ``balanced_indexer_select``, ``packed_indexer_select``, ``select_indices``, ``select_rows``:
  return a copy of the recorded ids; the selector is not called.
* ``launch_indexer_inputs``: returns a handle with the same interface (``route``,
  ``owner_queries``, ``wait()``, ``launch_result()``) and ``replayed`` True. Nothing moves: its
  ``wait()`` gives the worker zero rows (``[1, 0, width]`` each, the owners' dtypes) and its
  ``route`` describes no rows (no segments, zero splits), so a selector called on them selects
  nothing (code may skip it: ``if not exchange.replayed``); ``launch_result`` takes that
  empty ``[0, topk]`` output (or None), and its handle's ``wait()`` gives the recorded ids of
  this rank's own rows. Both handles stay single-use, with the seed's texts.

Retained: one int32 copy of each call's returned ids, nothing else (no worker inputs, no
expanded worker Q, no route): ``4 * topk`` bytes per row this rank owns per selection call,
e.g. 4096 rows (32K tokens over CP 8) at top-512: 8 MiB per layer (``SelectionReplay.nbytes``).

Replay moves nothing: no replayed call makes a collective (no all-to-all, no agreement,
no host read; ``check_inputs`` aside). Every rank still raises when one rank's replay fails,
at the step's one agreement instead of at the call: each replayed call of an entry point
that communicates outside a replay (``balanced_indexer_select``, ``launch_indexer_inputs``
and its handle's ``launch_result``) is checked on its rank and noted in the process's
ledger (``_agreement.REPLAYS``: a count, a digest of what every rank's call shares, and the
first failure). A failed call (another batch, a call past the end of its recording, another
batch's ``routes=``, another selector topk) does not raise there: it returns all -1 ids of
the shape the call would return (the handle of a launch gives them from ``launch_result``),
so that this rank keeps making the collectives its peers make. ``verify_replays(group)``,
called once per step by every rank (after the backward, before the optimizer step), agrees
on the ledger (one small all-reduce) and raises on every rank, the failed rank its own error
and the others ``ValueError("Selection replay aborted: rank r rejected its inputs: <its
reason>")``, or, when no rank failed but the ranks replayed different calls, a
``ValueError`` naming the counts. Without it, the next agreement of a communicating sparsecp
call (which carries the ledger) raises the same, a step late. ``select_indices``,
``packed_indexer_select`` and ``select_rows`` take no group: a mismatch of theirs raises
where it is made, as before.

A replayed call must be the recorded one: the entry point, document lengths, ratio, mode
and options, rank and group size, and the shapes, dtypes and device of the tensors (for
``select_indices`` / ``packed_indexer_select`` also the segments and topk) are compared, and
a difference raises ``ValueError`` naming it; a call past the end of the recording raises
``RuntimeError``. A replayed call's ``routes=`` (``prebuild``) must be prebuilt for the call,
as outside a replay (they do not change the ids, so a replay may pass them where the
recording did not, or the other way round). ``SelectionReplay(check_inputs=True)`` also
compares a checksum of each call's query inputs (for recompute; see the class). Calls a
recorded call makes itself (the selector's ``select_indices``), and
selection calls between an overlapped launch and its ``launch_result`` (the worker's
selector), belong to that call and are neither recorded nor replayed on their own. That
window belongs to the session that launched and to the handle: it closes at
``launch_result``, when the handle is dropped (torch's checkpoint early stop ending a
recompute between launch and ``launch_result``, an exception caught around the layer), or
when its session exits; it is never inherited by a later call. (A handle the caller still
holds keeps its window open until its ``launch_result`` or until it is dropped.)

Nesting: the innermost active ``record()`` / ``replay()`` takes a call; a recording inside a
replay records what the replay returns (RL replay around checkpointed layers). Sessions are
per process, not per thread (a recompute may run on autograd's device threads).

Selective checkpointing (``create_selective_checkpoint_contexts``) caches op outputs by the
order ops run in; a recorded call runs with torch's Python dispatch modes suspended, so SAC
neither sees nor caches the selection's ops, and its recompute, which skips them, stays in
step. The worker's selector on the overlapped path is your code and runs under SAC (on
zero rows in a replay): keep its ops out of save policies.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
import torch
import torch.distributed as dist

from .. import _lengths as lengths_tuple
from ._agreement import REPLAYS, agree, capture, control_device
from ._exchange import WorkerInputs
from ._plans import empty_fingerprint, parameter_key
from ._route import IndexerRoute

__all__ = ["SelectionReplay", "selection_replay_contexts", "verify_replays"]

F = TypeVar("F", bound=Callable[..., Any])

# Entry points a worker's selector calls: inside an open overlapped exchange they belong to it.
_WORKER_KINDS = ("select_indices", "packed_indexer_select", "select_rows")
_LAUNCH = "launch_indexer_inputs"
# Entry points that communicate on a group: a replay of them agrees with the group's ranks.
_COLLECTIVE_KINDS = ("balanced_indexer_select", _LAUNCH)


class Call(NamedTuple):
    """What a selection call depends on: the entry point and (name, value) fields."""

    kind: str
    fields: tuple[tuple[str, Any], ...]


class _Entry:
    """One recorded call: its description, the int ids it returned (a copy) and, with
    ``check_inputs``, its query inputs' checksum."""

    __slots__ = ("call", "ids", "checksum")

    def __init__(self, call: Call) -> None:
        self.call = call
        self.ids: torch.Tensor | None = None
        self.checksum: tuple[tuple[str, float, float], ...] | None = None


class _State:
    """Process-wide: the active sessions (innermost last) and how many recorded calls are
    executing (their own nested calls pass through). Open overlapped exchanges belong to the
    session that made them (``_Session.windows``), never to the process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions: list[_Session] = []
        self.executing = 0


def _window_open() -> bool:
    """An overlapped exchange of an active session is open (its selector is running)."""
    return any(len(session.windows) for session in _STATE.sessions)


_STATE = _State()


class SelectionReplay:
    """A recording of selection results, replayed in call order.

    ``with replay.record():`` starts a fresh recording of every selection call in the block;
    ``with replay.replay():`` returns them again, from the first, for the same calls in the same
    order (it may be entered many times: a training forward and its recompute both replay an RL
    rollout's recording). Use one ``SelectionReplay`` per recomputed region (per checkpointed
    layer): a recompute replays its own region's calls, and regions recompute in reverse order.
    Calls are matched by their arguments and their order, not by which layer makes them: two
    layers with the same lengths, ratio and shapes are told apart only by order, so one
    SelectionReplay shared by separately recomputed layers would give a layer another's ids.

    ``check_inputs=True`` catches that (and any other replay on other values): each recorded
    call keeps a checksum of its query-side inputs (``query_residual`` and ``weights``, or
    ``query`` and ``weights``: a float64 sum and a position-weighted sum of each, 32 bytes a
    tensor), and a replayed call whose inputs' checksum differs raises ``ValueError``. Use it
    where a replay runs on the recorded values (recompute: a checkpointed forward runs again
    on the same inputs, bit for bit when its ops are deterministic), never for RL replays on
    new activations. It costs two reductions over those tensors per call and, on a GPU, a
    host read. ``selection_replay_contexts`` needs no check: it makes one SelectionReplay per
    checkpointed call.

    Attributes:
        recorded: True once a ``record()`` block finished without an exception.
        nbytes: Bytes held: the ids' int32 copies (``4 * topk`` per owned row and call).
    """

    def __init__(self, *, check_inputs: bool = False) -> None:
        self._entries: list[_Entry] = []
        self._recorded = False
        self.check_inputs = bool(check_inputs)

    def record(self) -> _Session:
        """A context manager recording this region's selection calls (discarding any earlier)."""
        return _Session(self, replaying=False)

    def replay(self) -> _Session:
        """A context manager replaying the recording; raises RuntimeError on entry without one."""
        return _Session(self, replaying=True)

    @property
    def recorded(self) -> bool:
        return self._recorded

    @property
    def nbytes(self) -> int:
        return sum(entry.ids.numel() * entry.ids.element_size() for entry in self._entries if entry.ids is not None)

    def calls(self) -> tuple[str, ...]:
        """The recorded calls' entry point names, in order."""
        return tuple(entry.call.kind for entry in self._entries)

    def clear(self) -> None:
        """Drop the recording (``recorded`` becomes False)."""
        self._entries, self._recorded = [], False

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        state = "recorded" if self._recorded else "not recorded"
        return f"SelectionReplay({len(self._entries)} calls, {self.nbytes} bytes, {state})"


class _Session:
    """One ``record()`` or ``replay()`` of a SelectionReplay; re-enterable (torch enters a
    checkpoint's recompute context once per recompute)."""

    def __init__(self, replay: SelectionReplay, replaying: bool) -> None:
        self.replay, self.replaying = replay, replaying
        self.cursor = 0
        # The overlapped exchanges this session opened and that are still open: held weakly,
        # so a handle dropped before its launch_result (checkpoint early stop, an exception
        # caught around the layer) closes its window; the session's exit closes the rest.
        self.windows: weakref.WeakSet[_Window] = weakref.WeakSet()

    def __enter__(self) -> SelectionReplay:
        with _STATE.lock:
            if any(session.replay is self.replay for session in _STATE.sessions):
                raise RuntimeError("SelectionReplay is already recording or replaying")
            if self.replaying and not self.replay.recorded:
                raise RuntimeError("SelectionReplay.replay(): nothing was recorded (a record() block must finish "
                                   "first)")
            if not self.replaying:
                self.replay.clear()
            self.cursor = 0
            self.windows.clear()
            _STATE.sessions.append(self)
        return self.replay

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        with _STATE.lock:
            if self in _STATE.sessions:
                _STATE.sessions.remove(self)
            for window in list(self.windows):  # left open (an early stop ended the recompute)
                window.open = False
            self.windows.clear()
        if not self.replaying:
            self.replay._recorded = kind is None

    def next_entry(self, call: Call) -> _Entry:
        """The recorded entry of this replayed call; raises when it is not the recorded call."""
        entries, index = self.replay._entries, self.cursor
        if index >= len(entries):
            raise RuntimeError(f"Selection replay: call {index + 1} ({call.kind}) is past the end of the recording "
                               f"({len(entries)} calls recorded)")
        entry = entries[index]
        difference = describe_difference(entry.call, call)
        if difference:
            raise ValueError(f"Selection replay: call {index + 1} ({call.kind}) differs from its recording: "
                             f"{difference}")
        self.cursor += 1
        return entry

    def add_entry(self, call: Call) -> _Entry:
        entry = _Entry(call)
        self.replay._entries.append(entry)
        return entry


def selection_replay_contexts(contexts: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
    """The ``context_fn`` of ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``.

    Returns (forward, recompute) context managers of one fresh SelectionReplay: the forward
    records every selection call of the checkpointed function, the recompute replays them (no
    planning, no collective, no selection work; ``verify_replays`` agrees on them once per
    step). ``contexts`` is another pair to enter with
    them, e.g. selective checkpointing's::

        context_fn=lambda: selection_replay_contexts(create_selective_checkpoint_contexts(policy))
    """
    replay = SelectionReplay()
    if contexts is None:
        return replay.record(), replay.replay()
    forward, recompute = contexts
    return _Both(forward, replay.record()), _Both(recompute, replay.replay())


class _Both:
    """Two context managers entered in order, exited in reverse; re-enterable."""

    def __init__(self, first: Any, second: Any) -> None:
        self.first, self.second = first, second

    def __enter__(self) -> None:
        self.first.__enter__()
        try:
            self.second.__enter__()
        except BaseException as error:
            self.first.__exit__(type(error), error, error.__traceback__)
            raise

    def __exit__(self, kind: Any, error: Any, trace: Any) -> Any:
        try:
            self.second.__exit__(kind, error, trace)
        finally:
            suppressed = self.first.__exit__(kind, error, trace)
        return suppressed


@contextlib.contextmanager
def _hidden() -> Iterator[None]:
    """Suspend torch's Python dispatch modes (selective checkpointing's caches) for selection
    work: SAC counts ops by order, and a replay does not run these ops. (torch's own helpers
    for it are private; a torch without them runs the work unhidden.)"""
    from torch.utils import _python_dispatch

    stack = getattr(_python_dispatch, "_get_current_dispatch_mode_stack", None)
    disable = getattr(_python_dispatch, "_disable_current_modes", None)
    if stack is None or disable is None or not stack():
        yield
        return
    with disable():
        yield


def replayable(kind: str) -> Callable[[F], F]:
    """Decorate a selection entry point (named ``kind``) so that active sessions record and
    replay it. Without one, a call costs one list check."""

    def decorate(function: F) -> F:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def entry_point(*args: Any, **kwargs: Any) -> Any:
            if not _STATE.sessions or _STATE.executing or (kind in _WORKER_KINDS and _window_open()):
                return function(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return _resolve(list(_STATE.sessions), kind, describe(kind, bound.arguments),
                            functools.partial(_execute, function, args, kwargs), bound.arguments, top=True)

        return cast(F, entry_point)

    return decorate


def _execute(function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    with _STATE.lock:
        _STATE.executing += 1
    try:
        with _hidden():
            return function(*args, **kwargs)
    finally:
        with _STATE.lock:
            _STATE.executing -= 1


def _resolve(sessions: list[_Session], kind: str, call: Call, execute: Callable[[], Any], arguments: dict[str, Any],
             top: bool) -> Any:
    """The call's result from the innermost session of ``sessions`` (executing it for real
    when none is left); ``top``: the handle returned to the caller (it opens a window)."""
    if not sessions:
        return execute()
    session = sessions[-1]
    if session.replaying:
        if kind in _COLLECTIVE_KINDS:  # no collective: checked here, noted in the ledger for the next agreement
            index = session.cursor
            entry, error = capture(lambda: _replayed_entry(session, kind, call, arguments))
            if error is not None and session.cursor == index and index < len(session.replay._entries):
                session.cursor += 1  # the failed call takes its recorded place: later calls stay aligned
            REPLAYS.note(_shared_text(call), error)
            template = entry if entry is not None and entry.ids is not None else _template(session.replay, index)
            if kind == _LAUNCH:
                return _ReplayedInputExchange(entry, template, arguments, call, session if top else None)
            with _hidden():
                if entry is not None and entry.ids is not None:
                    return entry.ids.clone()
                return _stand_in(arguments["query_residual"], 1, getattr(arguments.get("selector"), "topk", None),
                                 template, batched=True)
        entry = _replayed_entry(session, kind, call, arguments)
        assert entry.ids is not None
        with _hidden():
            return entry.ids.clone()
    entry = session.add_entry(call)
    if session.replay.check_inputs:
        entry.checksum = _checksum(kind, arguments)
    result = _resolve(sessions[:-1], kind, call, execute, arguments, top=False)
    if kind == _LAUNCH:
        return _RecordingExchange(result, entry, session if top else None)
    with _hidden():
        entry.ids = result.detach().clone()
    return result


def _replayed_entry(session: _Session, kind: str, call: Call, arguments: dict[str, Any]) -> _Entry:
    """The recorded entry of a replayed call, after every local check of it: the call is the
    recorded one, its ``routes=`` are its own, its inputs' checksum (``check_inputs``), and a
    selector's ``topk`` (``balanced_indexer_select``) is the recorded ids'."""
    entry = session.next_entry(call)
    if kind in _COLLECTIVE_KINDS and arguments.get("routes") is not None:
        _check_routes(call, arguments)  # invalid routes raise as outside a replay
    if session.replay.check_inputs:
        _compare_checksums(session.cursor, kind, entry, _checksum(kind, arguments))
    if kind != _LAUNCH:
        if entry.ids is None:
            raise RuntimeError(f"Selection replay: call {session.cursor} ({kind}) has no recorded result")
        topk = getattr(arguments.get("selector"), "topk", None)
        if isinstance(topk, int) and not isinstance(topk, bool) and topk != entry.ids.shape[-1]:
            raise ValueError(f"Selection replay: call {session.cursor} ({kind}): the selector's topk {topk} "
                             f"differs from the recording's {entry.ids.shape[-1]}")
    return entry


def _template(replay: SelectionReplay, index: int) -> _Entry | None:
    """A recorded entry whose ids give a failed call's stand-in its topk and dtype: the one
    at the failed call's place, else the last one with ids."""
    entries = replay._entries
    if index < len(entries) and entries[index].ids is not None:
        return entries[index]
    return next((entry for entry in reversed(entries) if entry.ids is not None), None)


def _stand_in(query: Any, dim: int, topk: Any, template: _Entry | None, batched: bool) -> torch.Tensor:
    """What a failed replayed call returns until the next agreement raises on every rank:
    all -1 ids ("sees no key") of the shape the call would return, [1, rows, topk] or
    [rows, topk] (rows from ``query``'s dimension ``dim``; topk the selector's, else the
    recording's), so that this rank runs in step with its peers until then."""
    ids = template.ids if template is not None else None
    if not (isinstance(topk, int) and not isinstance(topk, bool) and topk >= 0):
        topk = int(ids.shape[-1]) if ids is not None else 0
    rows = int(query.shape[dim]) if isinstance(query, torch.Tensor) and query.ndim > dim else 0
    device = query.device if isinstance(query, torch.Tensor) else torch.device("cpu")
    dtype = ids.dtype if ids is not None else torch.int32
    return torch.full((1, rows, topk) if batched else (rows, topk), -1, dtype=dtype, device=device)


def _stable(value: Any) -> str:
    """A value as text that is the same on every rank for equal values (no addresses)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (tuple, list, torch.Size)):
        return "(" + ",".join(_stable(item) for item in value) + ")"
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, np.ndarray):
        return _stable(value.tolist())
    return type(value).__name__


def _shared_text(call: Call) -> str:
    """What every rank's replayed call shares (the ledger's digest): the entry point and its
    fields but the rank and the devices."""
    fields = ";".join(f"{name}={_stable(value)}" for name, value in call.fields
                      if name != "rank" and not name.endswith(" device"))
    return f"{call.kind}:{fields}"


def verify_replays(group: Any = None) -> int:
    """Agree once on every selection call replayed since the last agreement; collective.

    Replayed calls (``SelectionReplay.replay()``, the recompute of
    ``selection_replay_contexts``) make no collective: each is checked on its own rank, and
    a failure (another call than the recorded one, a call past the end of the recording,
    another topk, ``routes=`` of another batch, ``check_inputs``' checksum) is held, the
    call returning all -1 ids of the right shape so that the rank stays in step with its
    peers. Call this once per step where every rank of ``group`` calls it (after the
    backward that recomputes, before the optimizer step): it makes one small all-reduce
    (a second, with the reason, only when a rank failed) and raises on every rank when a
    rank's replay failed (that rank its own error, the others ``ValueError("Selection
    replay aborted: rank r rejected its inputs: <its reason>")``) or when the ranks
    replayed different calls. Without it, the next communicating sparsecp call on any
    group (its own agreement carries the held verdict) raises instead, one step late.

    Args:
        group: The CP process group (default: the world).

    Returns:
        The number of selection calls this rank replayed since the last agreement.
    """
    group = dist.group.WORLD if group is None else group
    calls = REPLAYS.calls
    agree(group, control_device(group, None), None, empty_fingerprint(), "Selection replay")
    return calls


def _check_routes(call: Call, arguments: dict[str, Any]) -> None:
    """A replayed call's ``routes=`` must be this call's (``prebuild``), as outside a replay."""
    from ._prebuilt import prebuilt_layer

    fields = dict(call.fields)
    prebuilt_layer(arguments["routes"], arguments["lengths"], fields["group size"], fields["rank"],
                   arguments["ratio"], arguments["mode"], arguments["block_size"], arguments["zigzag_min_length"],
                   arguments["strategy_params"])


def _checksum(kind: str, arguments: dict[str, Any]) -> tuple[tuple[str, float, float], ...]:
    """(name, sum, position-weighted sum) in float64 of the call's query-side tensors."""
    names = ("query", "weights") if kind in _WORKER_KINDS else ("query_residual", "weights")
    sums = []
    with _hidden(), torch.no_grad():
        for name in names:
            tensor = arguments[name]
            if not isinstance(tensor, torch.Tensor):
                continue  # an invalid argument: the call's own checks name it
            values = tensor.detach().reshape(-1).double()
            positions = torch.arange(1, values.numel() + 1, dtype=torch.float64, device=values.device)
            sums.append((name, float(values.sum()), float((values * positions).sum())))
    return tuple(sums)


def _compare_checksums(index: int, kind: str, entry: _Entry, now: tuple[tuple[str, float, float], ...]) -> None:
    if entry.checksum is None:
        raise ValueError(f"Selection replay: call {index} ({kind}) was recorded without check_inputs")
    for (name, *was), (_, *value) in zip(entry.checksum, now):
        if [float.hex(v) for v in was] != [float.hex(v) for v in value]:  # bit for bit, NaN equal to NaN
            raise ValueError(f"Selection replay: call {index} ({kind}) differs from its recording: its {name} "
                             f"values differ (checksum {was[0]!r} recorded, {value[0]!r} now): another layer's "
                             "call, or other activations; use one SelectionReplay per recomputed layer "
                             "(check_inputs only where a replay runs on the recorded values)")


class _Window:
    """An overlapped exchange open between its launch and its launch_result: selection calls
    then are its worker's selector. Owned by the handle returned to the caller and registered
    (weakly) with the session the launch ran in (``session`` None: an inner handle, no window)."""

    def __init__(self, session: _Session | None) -> None:
        self.open = session is not None
        self._session = weakref.ref(session) if session is not None else None
        if session is not None:
            with _STATE.lock:
                session.windows.add(self)

    def close(self) -> None:
        if self.open:
            self.open = False
            session = self._session() if self._session is not None else None
            if session is not None:
                with _STATE.lock:
                    session.windows.discard(self)


class _RecordingExchange:
    """launch_indexer_inputs' handle inside a recording: the inner handle (real, or an outer
    replay's), whose result ids it records when they are waited for."""

    replayed = False

    def __init__(self, inner: Any, entry: _Entry, session: _Session | None) -> None:
        self._inner, self._entry, self._window = inner, entry, _Window(session)
        self.replayed = bool(getattr(inner, "replayed", False))

    def __getattr__(self, name: str) -> Any:  # route, owner_queries, group, consumed, ...
        if name.startswith("_"):  # never for private names (copy, pickle look them up before __init__)
            raise AttributeError(name)
        return getattr(self._inner, name)

    def wait(self) -> WorkerInputs:
        with _hidden():
            return self._inner.wait()

    def launch_result(self, selected: Any) -> _RecordingRows:
        self._window.close()
        with _hidden():
            return _RecordingRows(self._inner.launch_result(selected), self._entry)


class _RecordingRows:
    """The result handle inside a recording: waits on the inner one, records a copy of the ids."""

    def __init__(self, inner: Any, entry: _Entry) -> None:
        self._inner, self._entry = inner, entry

    @property
    def consumed(self) -> bool:
        return bool(self._inner.consumed)

    def wait(self) -> torch.Tensor:
        with _hidden():
            ids = self._inner.wait()
            self._entry.ids = ids.detach().clone()
        return ids


@functools.lru_cache(maxsize=16)
def _empty_route(size: int) -> IndexerRoute:
    zeros = (0,) * size
    return IndexerRoute((), zeros, zeros, (), (), (), (), 0)


class _ReplayedInputExchange:
    """launch_indexer_inputs' handle in a replay: nothing moves (see the module docstring)."""

    replayed = True

    def __init__(self, entry: _Entry | None, template: _Entry | None, arguments: dict[str, Any], call: Call,
                 session: _Session | None) -> None:
        fields = dict(call.fields)
        self._entry, self._template = entry, template  # entry None: the replayed launch failed (held)
        size = fields["group size"]
        self.route = _empty_route(size if isinstance(size, int) and size > 0 else 1)
        self.group = arguments["group"]
        self._query = arguments["query_residual"]
        query = self._query
        self.owner_queries = int(query.shape[1]) if isinstance(query, torch.Tensor) and query.ndim > 1 else 0
        embeddings = arguments["embeddings"]
        inputs = (query, arguments["weights"], *(embeddings if isinstance(embeddings, (tuple, list)) else ()))
        self._empty = [(tensor.dtype, tensor.device, int(tensor.shape[-1]) if tensor.ndim else 0)
                       if isinstance(tensor, torch.Tensor) else (torch.float32, torch.device("cpu"), 0)
                       for tensor in inputs]
        self._window = _Window(session)
        self.consumed = False

    def wait(self) -> WorkerInputs:
        """The worker's inputs: zero rows of each field, [1, 0, width]."""
        if self.consumed:
            raise RuntimeError("Indexer input exchange cannot be consumed twice")
        self.consumed = True
        with _hidden():
            return WorkerInputs(*(torch.empty((1, 0, width), dtype=dtype, device=device)
                                  for dtype, device, width in self._empty))

    def launch_result(self, selected: Any) -> _ReplayedRows:
        """Takes the selector's output on the zero rows ([0, topk]) or None; returns the handle
        of the recorded ids. No collective: a result refused here is held (``verify_replays``
        or the next agreement raises on every rank) and the handle gives all -1 ids."""
        self._window.close()

        def check() -> torch.Tensor:
            if selected is not None and (not isinstance(selected, torch.Tensor) or selected.ndim != 2
                                         or selected.shape[0] != 0):
                shape = tuple(selected.shape) if isinstance(selected, torch.Tensor) else type(selected).__name__
                raise ValueError(f"Selection replay: a replayed exchange's worker has no rows, so launch_result "
                                 f"takes [0, topk] (or None), got {shape}")
            if self._entry is None:  # the launch failed: its error is held already (the first one is kept)
                raise RuntimeError("Selection replay: launch_result of a replayed launch that failed")
            ids = self._entry.ids
            if ids is None:
                raise RuntimeError("Selection replay: the recorded exchange's result was never waited for while "
                                   "recording")
            if selected is not None and selected.shape[1] != ids.shape[1]:
                raise ValueError(f"Selection replay: topk {selected.shape[1]} differs from the recording's "
                                 f"{ids.shape[1]}")
            return ids

        ids, error = capture(check)
        REPLAYS.note("launch_result", error)
        with _hidden():
            if ids is not None:
                return _ReplayedRows(ids.clone())
            topk = selected.shape[1] if isinstance(selected, torch.Tensor) and selected.ndim == 2 else None
            return _ReplayedRows(_stand_in(self._query, 1, topk, self._template, batched=False))


class _ReplayedRows:
    """A replayed result handle: ``wait()`` gives the recorded ids once."""

    def __init__(self, ids: torch.Tensor) -> None:
        self._ids: torch.Tensor | None = ids
        self.consumed = False

    def wait(self) -> torch.Tensor:
        if self.consumed:
            raise RuntimeError("Indexer communication handle cannot be consumed twice")
        self.consumed = True
        ids, self._ids = self._ids, None
        assert ids is not None
        return ids


# --------------------------------------------------------------------------------------
# Describing a call, and naming how two calls differ.

def _tensor_fields(name: str, tensor: Any) -> list[tuple[str, Any]]:
    if not isinstance(tensor, torch.Tensor):
        return [(name, type(tensor).__name__)]
    return [(name + " shape", tuple(tensor.shape)), (name + " dtype", tensor.dtype), (name + " device", tensor.device)]


def _group_fields(group: Any) -> list[tuple[str, Any]]:
    try:
        return [("rank", dist.get_rank(group)), ("group size", dist.get_world_size(group))]
    except Exception:  # not a process group: the recorded call raised on it already
        return [("rank", None), ("group size", None)]


def _converted(convert: Callable[[], Any], value: Any) -> Any:
    """``convert()``, or the value's repr when it is invalid: describing a call never raises, so
    that a recorded call with bad inputs fails as the entry point fails (on every rank)."""
    try:
        return convert()
    except Exception:
        return "invalid: " + repr(value)[:80]


def describe(kind: str, arguments: dict[str, Any]) -> Call:
    """The fields of a call that its result depends on (bound arguments by name)."""
    fields: list[tuple[str, Any]] = []
    if kind in ("balanced_indexer_select", _LAUNCH):
        embeddings = arguments["position_embeddings" if kind != _LAUNCH else "embeddings"]
        cos, sin = tuple(embeddings) if isinstance(embeddings, (tuple, list)) and len(embeddings) == 2 else (None, None)
        lengths, params = arguments["lengths"], arguments["strategy_params"]
        fields += [("lengths", _converted(lambda: lengths_tuple(lengths), lengths)), ("ratio", arguments["ratio"]),
                   ("mode", arguments["mode"]), ("block_size", arguments["block_size"]),
                   ("zigzag_min_length", arguments["zigzag_min_length"]),
                   ("strategy parameters",
                    _converted(lambda: tuple(sorted((k, parameter_key(v)) for k, v in params.items())), params))]
        fields += _group_fields(arguments["group"])
        for name, tensor in (("qr", arguments["query_residual"]), ("weights", arguments["weights"]), ("cos", cos),
                             ("sin", sin)):
            fields += _tensor_fields(name, tensor)
    elif kind == "select_rows":  # the fixed path's op: rows' key ranges as device tensors
        for name in ("query", "key", "weights", "key_begin", "visible"):
            fields += _tensor_fields(name, arguments[name])
        fields += [("topk", arguments["topk"])]
    else:
        for name in ("query", "key", "weights"):
            fields += _tensor_fields(name, arguments[name])
        segments = arguments["segments"]
        table = _converted(lambda: np.asarray(getattr(segments, "array", segments), dtype=np.int64).reshape(-1, 5),
                           segments)
        fields += [("segments", table), ("ratio", arguments["ratio"]), ("topk", arguments["topk"])]
    return Call(kind, tuple(fields))


def describe_difference(recorded: Call, now: Call) -> str | None:
    """How ``now`` differs from ``recorded`` (the first differing field), or None."""
    if recorded.kind != now.kind:
        return f"the recording has {recorded.kind} here"
    for (name, was), (_, value) in zip(recorded.fields, now.fields):
        if isinstance(was, str) or isinstance(value, str):  # an invalid value (its repr)
            if type(was) is not type(value) or was != value:
                return f"{name} {was if isinstance(was, str) else 'valid'} recorded, " \
                       f"{value if isinstance(value, str) else 'valid'} now"
            continue
        if name == "lengths" and was != value:
            if len(was) != len(value):
                return f"lengths: {len(was)} documents recorded, {len(value)} now"
            index = next(i for i, (a, b) in enumerate(zip(was, value)) if a != b)
            return f"lengths: document {index} has {was[index]} tokens recorded, {value[index]} now"
        if name == "segments":
            if was.shape != value.shape:
                return f"segments: {len(was)} recorded, {len(value)} now"
            if not np.array_equal(was, value):
                index = int(np.flatnonzero((was != value).any(axis=1))[0])
                return (f"segments: segment {index} {tuple(was[index].tolist())} recorded, "
                        f"{tuple(value[index].tolist())} now")
            continue
        if was != value:
            return f"{name} {was!r} recorded, {value!r} now"
    return None
