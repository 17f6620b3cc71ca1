"""Cross-rank agreement before data moves, on the caller's process group.

Every communicating entry point of ``sparsecp.torch`` validates its inputs locally and
then, *whatever happened locally*, takes part in one small collective before any data
moves (the protocol of sparsecp's C++ exchange, ``transport/exchange.cpp`` ``agree``):

* an all-reduce (MIN) of three int64 values: the first rank whose inputs were invalid,
  and the fingerprint of what every rank must agree on (min of v and of ~v: all equal
  iff min(v) == ~min(~v));
* only when fingerprints differ, the C++ ``check_agreement`` (transport/agreement.hpp)
  runs over the same group and every rank raises the same ``ValueError`` naming what
  differs (document lengths, CP size, ratio, mode, options, widths, dtypes, topk);
* otherwise, when some rank's inputs were invalid, that rank raises its own error (the
  seed's text and type) and every other rank raises ``ValueError("<what> aborted: rank r
  rejected its inputs: <its reason>")``: the reason (its error's text, at most
  ``REASON_BYTES`` bytes of UTF-8) travels in one more all-reduce, made only then.

So a bad input on one rank raises on every rank instead of leaving its peers blocked in
an all-to-all. The tensor lives where the group's backend can reduce it: a CPU tensor
for gloo (and MPI), a tensor on the current CUDA device for NCCL. On CUDA, reading the
verdict synchronises the host with the stream once per call.
"""
from __future__ import annotations

import zlib
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import _core

_MASK = (1 << 64) - 1
REASON_BYTES = 512  # the most bytes of an invalid rank's error text its peers report
_REDUCE_OPS = {"min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}


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
    """Collective: raise on every rank unless every rank is valid and fingerprints agree.

    Args:
        group: The CP process group (every rank of it must call this, in the same order).
        device: Where the group reduces (``control_device``).
        error: This rank's local validation error, or None.
        fingerprint: What every rank must agree on (C++ PlanningFingerprint).
        what: The operation, e.g. "Indexer input exchange", used in messages.
        invalid_first: Report an invalid rank without comparing fingerprints (for checks
            where an invalid rank cannot compute its fingerprint, e.g. a failed selector).
    """
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    value = signed64(fingerprint.value)
    verdict = torch.tensor([rank if error is not None else size, value, ~value], dtype=torch.int64, device=device)
    dist.all_reduce(verdict, op=dist.ReduceOp.MIN, group=group)
    first_invalid, smallest, inverted_largest = verdict.tolist()
    differ = smallest != ~inverted_largest and not (invalid_first and first_invalid < size)
    if differ:  # every rank takes this branch: the verdict is the same everywhere

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
        reason = _reason(group, device, error if rank == first_invalid else None)
        if error is not None:
            raise error
        raise ValueError(f"{what} aborted: rank {first_invalid} rejected its inputs: {reason}")


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
