"""Cross-rank agreement before data moves, on the caller's process group.

Every communicating entry point of ``sparsecp.torch`` validates its inputs locally and
then, *whatever happened locally*, takes part in one small collective before any data
moves (the protocol of sparsecp's C++ exchange, ``transport/exchange.cpp`` ``agree``):

* an all-reduce (MIN) of 11 int64 values, the same on every agreement point
  (an exchange's launch or result, a sequence dispatch or gather, ``verify_replays``), so
  that ranks which reach different points still pair their collectives: the first rank
  whose inputs were invalid, the first rank holding a failed selection replay, whether
  some rank reports invalid ranks first, and the min of v and of ~v (all equal iff
  min(v) == ~min(~v)) of three values: the fingerprint of what every rank must agree on,
  the agreement point (which call this is), and the digest of the selection calls
  replayed since the last agreement (``ReplayLedger``), with their count's min and max;
* every branch after it is decided from those reduced values only, so every rank takes
  it: a rank whose replay failed since the last agreement (its error, then every other
  rank's "<what> aborted: rank r rejected its inputs: <its reason>"); an invalid rank, when
  some rank reports invalid ranks first or the ranks are at different points; ranks whose
  replays differ; ranks at different agreement points; then, as before, differing fingerprints
  (the C++ ``check_agreement`` over the same group, every rank raising the same
  ``ValueError`` naming what differs: document lengths, CP size, ratio, mode, options,
  widths, dtypes, topk); otherwise an invalid rank raises its own error (the seed's text
  and type) and every other rank ``ValueError("<what> aborted: rank r rejected its
  inputs: <its reason>")``: the reason (its error's text, at most ``REASON_BYTES`` bytes
  of UTF-8) travels in one more all-reduce, made only then.

So a bad input on one rank raises on every rank instead of leaving its peers blocked in
an all-to-all. The tensor lives where the group's backend can reduce it: a CPU tensor
for gloo (and MPI), a tensor on the current CUDA device for NCCL. On CUDA, reading the
verdict synchronises the host with the stream once per call.

Replayed selection calls (``SelectionReplay``) make no collective: each is checked on its
rank and noted in the process's ``REPLAYS`` ledger (a failure is held there, and the call
returns ids of the right shape, all -1, so that the rank stays in step with its peers);
the next agreement, whichever it is, carries the ledger and empties it.
"""
from __future__ import annotations

import hashlib
import threading
import zlib
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import _core

_MASK = (1 << 64) - 1
REASON_BYTES = 512  # the most bytes of an invalid rank's error text its peers report
_REDUCE_OPS = {"min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}
# The agreement points (``what``) whose names a rank can give for another rank's point.
KNOWN_POINTS = ("Indexer input exchange", "Indexer result exchange", "Sequence dispatch", "Sequence gather",
                "Selection replay")


_DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3, torch.float64: 4, torch.int32: 5,
                torch.int64: 6, torch.int16: 7, torch.int8: 8, torch.uint8: 9}


def dtype_code(dtype: torch.dtype) -> int:
    """A stable number for a dtype, compared across ranks (1 float32, 2 bfloat16, 3 float16,
    4 float64, 5 int32, 6 int64, ...; others a CRC of the name)."""
    return _DTYPE_CODES.get(dtype) or (zlib.crc32(str(dtype).encode()) | 1 << 32)


def signed64(value: int) -> int:
    """A 64-bit unsigned value as the int64 with the same bits."""
    value &= _MASK
    return value - (1 << 64) if value >> 63 else value


def point_code(what: str) -> int:
    """The agreement point's number (a CRC of its name, the same on every rank)."""
    return zlib.crc32(what.encode("utf-8", "replace"))


_POINT_NAMES = {point_code(name): name for name in KNOWN_POINTS}


class ReplayLedger:
    """The selection calls this process replayed since its last agreement (process-wide:
    a recompute may replay on autograd's threads): their count, a digest of what every
    rank must have replayed alike (``note``'s text, in order), and the first failure.

    A replayed call communicates nothing; the next agreement (``agree``: a real
    communicating call's, or ``verify_replays``') carries this ledger (``take``) and
    raises on every rank when a rank's replay failed or the ranks' replays differ."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls = 0
        self._digest = b""
        self._error: BaseException | None = None

    def note(self, text: str, error: BaseException | None = None) -> None:
        """One replayed call: ``text`` what every rank's call must share (no rank, no device),
        ``error`` its failure on this rank (only the first is kept)."""
        with self._lock:
            self._calls += 1
            self._digest = hashlib.blake2b(self._digest + text.encode("utf-8", "replace"), digest_size=8).digest()
            if error is not None and self._error is None:
                self._error = error

    @property
    def calls(self) -> int:
        """Replayed calls since the last agreement."""
        return self._calls

    @property
    def error(self) -> BaseException | None:
        """The first failed replayed call's error since the last agreement, or None."""
        return self._error

    def take(self) -> tuple[int, int, BaseException | None]:
        """(calls, digest as int64, first error); empties the ledger."""
        with self._lock:
            calls, digest, error = self._calls, self._digest, self._error
            self._calls, self._digest, self._error = 0, b"", None
        return calls, signed64(int.from_bytes(digest, "little")) if calls else 0, error


REPLAYS = ReplayLedger()


def control_device(group: Any, hint: torch.device | None) -> torch.device:
    """Where the group reduces small int64 tensors: CPU for gloo/MPI, else the CUDA device."""
    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend or "mpi" in backend:
        return torch.device("cpu")
    if hint is not None and hint.type not in ("cpu", "meta"):
        if hint.type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return hint
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def capture(check: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """Run ``check``; return (its result, None) or (None, the exception it raised)."""
    try:
        return check(), None
    except Exception as error:  # every local failure must still reach the collective
        return None, error


def agree(group: Any, device: torch.device, error: BaseException | None,
          fingerprint: _core.PlanningFingerprint, what: str, invalid_first: bool = False) -> None:
    """Collective: raise on every rank unless every rank is valid, every rank's replayed
    calls since the last agreement succeeded and match, and fingerprints agree.

    Args:
        group: The CP process group (every rank of it must call this, in the same order).
        device: Where the group reduces (``control_device``).
        error: This rank's local validation error, or None.
        fingerprint: What every rank must agree on (C++ PlanningFingerprint).
        what: The agreement point, e.g. "Indexer input exchange", used in messages.
        invalid_first: Report an invalid rank without comparing fingerprints (for checks
            where an invalid rank cannot compute its fingerprint, e.g. a failed selector).
            Any rank's flag counts for every rank (it is reduced with the verdict).
    """
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    value, point = signed64(fingerprint.value), point_code(what)
    calls, digest, replay_error = REPLAYS.take()
    if replay_error is not None:
        error = replay_error  # the earlier failure: its text is this rank's reason
    verdict = torch.tensor([rank if error is not None else size, rank if replay_error is not None else size,
                            0 if invalid_first else 1, value, ~value, point, ~point, digest, ~digest, calls, -calls],
                           dtype=torch.int64, device=device)
    dist.all_reduce(verdict, op=dist.ReduceOp.MIN, group=group)
    (first_invalid, first_replay_failed, every_compares, smallest, inverted_largest, lowest_point,
     inverted_highest_point, lowest_digest, inverted_highest_digest, fewest, negated_most) = verdict.tolist()
    points_differ = lowest_point != ~inverted_highest_point
    # Every branch below is decided by reduced values only: every rank takes the same one.
    if first_replay_failed < size:
        _report_invalid(group, device, error, first_replay_failed, what)
    if first_invalid < size and (points_differ or not every_compares):
        _report_invalid(group, device, error, first_invalid, what)
    if lowest_digest != ~inverted_highest_digest:
        raise ValueError(f"{what}: the CP ranks replayed different selection calls since their last agreement "
                         f"({fewest} to {-negated_most} replayed calls; this rank {calls}): a rank replayed a "
                         "recording another did not, or in another order")
    if points_differ:
        names = [_POINT_NAMES.get(code, f"an unknown one ({code:#x})") for code in (lowest_point,
                                                                                    ~inverted_highest_point)]
        raise ValueError(f"{what}: the CP ranks are at different sparsecp collectives (this rank at {what}; the "
                         f"ranks' points include {names[0]} and {names[1]}): their programs diverged, e.g. one rank "
                         "still replaying a recording where another calls for real, or calling verify_replays() "
                         "where another does not")
    if smallest != ~inverted_largest:  # every rank takes this branch: the verdict is the same everywhere

        def all_reduce(values: list[int], op: str) -> list[int]:
            reduced = torch.tensor(values, dtype=torch.int64, device=device)
            dist.all_reduce(reduced, op=_REDUCE_OPS[op], group=group)
            return reduced.tolist()

        try:
            _core.check_agreement(fingerprint, rank, size, all_reduce, what)
            mismatch = f"{what}: CP ranks disagree on their inputs"  # not reached: components differ
        except ValueError as difference:
            mismatch = str(difference)
        if error is not None:
            raise ValueError(f"{mismatch}; this rank also rejected its inputs: {error}") from error
        raise ValueError(mismatch)
    if first_invalid < size:
        _report_invalid(group, device, error, first_invalid, what)


def _report_invalid(group: Any, device: torch.device, error: BaseException | None, reporter: int,
                    what: str) -> None:
    """Collective (every rank, the same ``reporter``): raise this rank's own error, or name
    the reporting rank and its reason."""
    reason = _reason(group, device, error if dist.get_rank(group) == reporter else None)
    if error is not None:
        raise error
    raise ValueError(f"{what} aborted: rank {reporter} rejected its inputs: {reason}")


def _reason(group: Any, device: torch.device, error: BaseException | None) -> str:
    """Collective (every rank, only when some rank was invalid): the first invalid rank's
    error text, as ``type: text`` for other than ValueError, truncated to REASON_BYTES."""
    text = b""
    if error is not None:
        message = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
        text = message.encode("utf-8", "replace")[:REASON_BYTES]
    values = torch.zeros(REASON_BYTES, dtype=torch.int64)
    if text:
        values[:len(text)] = torch.tensor(list(text), dtype=torch.int64)
    values = values.to(device)
    dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)
    data = bytes(value for value in values.tolist() if value)
    return data.decode("utf-8", "replace")
