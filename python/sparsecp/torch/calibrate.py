"""Calibrating the per-row cost model on the user's own selector, on its own device.

``calibrate(selector, ...)`` times the callable that ``balanced_indexer_select`` would call
(``selector(qr, weights, (cos, sin), segments)``: sparsecp's ``IndexerSelector`` or any
kernel with that signature) over synthetic segments spanning visible-key counts and row
counts, and fits ``seconds = k + a * rows + b * sum(vis) + c * sum(min(topk, vis)) +
d * sum(heap(vis))`` (heap: the expected admissions into a full running top-k, ``CostModel.heap``) with
the library's calibration procedure (``sparsecp.calibrate_cost_model``: the points, the
interleaved repeats, the medians and the non-negative fit behind ``sparsecp calibrate``;
this module adds the tensors and the device's clock). The model it returns is what
``spill`` and ``auto`` balance (``cost_model=...``).

Times: on CUDA, CUDA events around each call (device time); elsewhere the calling thread's
CPU time (``time.thread_time``; the process's with several torch threads). One warm-up
call, then repeats interleaved (every point once per round), each point keeping its median,
so that a slow spell of a busy machine hits every point alike. A fit whose rms relative
residual exceeds ``max_residual`` is refused with a ValueError, never returned, and so is a
selector whose output is not integer ids [1, rows, topk] on the device (``None``, another
shape or dtype: it would fit the time of doing something else).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import CostModel, calibrate_cost_model, cost_sample
from .._checks import integer

DEFAULT_VISIBLE = (0, 64, 256, 448, 512, 640, 1024, 2048, 4096)


@dataclass(frozen=True)
class CalibrationPoint:
    """One timed shape: its exact sums and its median time (seconds)."""

    target: int  # requested mean visible keys per row
    rows: int
    visible: float  # sum of vis over the rows
    capped: float  # sum of min(topk, vis)
    seconds: float
    predicted: float
    heap: float = 0.0  # sum of heap(vis): expected top-k admissions


@dataclass(frozen=True)
class Calibration:
    """The fitted model (ns per row), the per-call constant and how well it fits."""

    model: CostModel
    per_call_seconds: float
    rms_relative_residual: float
    device: str
    points: list[CalibrationPoint] = field(default_factory=list)

    def predict(self, segments: Sequence[Sequence[int]], ratio: int) -> float:
        """Predicted seconds of one selector call on ``segments`` (k included)."""
        rows, visible, capped, heap = segment_sums(segments, ratio, self.model.topk, self.model.candidates,
                                                   self.model.quantum)
        return (self.per_call_seconds + 1e-9 * (self.model.a * rows + self.model.b * visible
                                                + self.model.c * capped + self.model.d * heap))


def segment_sums(segments: Sequence[Sequence[int]], ratio: int, topk: int, candidates: int = 0,
                 quantum: int = 1) -> tuple[float, float, float, float]:
    """(rows, sum of widths, sum min(topk, vis), sum of heap(vis)) of worker segments
    (5-tuples, segment.hpp); a row's width is its visible-key count under the candidate cap
    (0: none) and quantum, its heap(vis) the expected top-k admissions."""
    tasks = []
    for index, (q_begin, q_end, key_begin, key_end, residual) in enumerate(segments):
        end = (key_end - key_begin) * ratio + residual
        tasks.append((index, end - (q_end - q_begin), end))
    rows, visible, capped, heap = cost_sample(tasks, ratio, topk, candidates, quantum)
    return float(rows), float(visible), float(capped), float(heap)


def _timer(device: torch.device) -> Callable[[Callable[[], Any]], float]:
    if device.type == "cuda":
        def cuda_time(call: Callable[[], Any]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            call()
            end.record()
            torch.cuda.synchronize(device)
            return float(start.elapsed_time(end)) * 1e-3
        return cuda_time
    clock = time.thread_time if torch.get_num_threads() == 1 else time.process_time

    def cpu_time(call: Callable[[], Any]) -> float:
        start = clock()
        call()
        return clock() - start
    return cpu_time


def check_selected(selected: Any, rows: int, topk: int, device: torch.device, name: str) -> None:
    """A selector's output must be what ``balanced_indexer_select`` takes from it: integer
    ids [1, rows, topk] on the device; raises ValueError naming what it returned."""
    if not isinstance(selected, torch.Tensor):
        raise ValueError(f"calibrate: the selector {name} returned {type(selected).__name__}, not ids "
                         f"[1, {rows}, {topk}] (int32 or int64): a fit to a selector that selects nothing is refused")
    what = f"{selected.dtype} {tuple(selected.shape)} on {selected.device}"
    if tuple(selected.shape) != (1, rows, topk):
        raise ValueError(f"calibrate: the selector {name} returned {what}; ids must be [1, {rows}, {topk}] "
                         f"([1, rows, topk] for the {rows} rows it was given, topk {topk})")
    if selected.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"calibrate: the selector {name} returned {what}; ids must be int32 or int64")
    if selected.device.type != device.type or device.index not in (None, selected.device.index):
        raise ValueError(f"calibrate: the selector {name} returned {what}; ids must be on {device}, where it is "
                         "timed")


@torch.no_grad()
def calibrate(selector: Callable[..., Any], *, q_rank: int, heads: int, keys: int, ratio: int, topk: int,
              rope_dim: int = 64, rows: int = 64, visible: Sequence[int] = DEFAULT_VISIBLE, repeats: int = 3,
              device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16, max_residual: float = 0.5,
              seed: int = 0, timer: Callable[[Callable[[], Any]], float] | None = None, candidates: int = 0,
              quantum: int = 1, heap_term: bool = False) -> Calibration:
    """Fit the per-row cost model to ``selector``'s own times on ``device``.

    Args:
        selector: ``selector(qr, weights, (cos, sin), segments)``, as ``balanced_indexer_select``
            calls it; it holds its own Wq_b and Index K bank of ``keys`` compressed keys.
        q_rank, heads, rope_dim: the shapes of qr [1, rows, q_rank], weights [1, rows, heads]
            and cos/sin [1, rows, rope_dim / 2] the selector takes.
        keys: keys in the selector's bank; points that would see more are left out.
        ratio, topk: the layer's compression ratio and ids per row.
        rows: rows per timed point (each point also runs at rows / 4, to tell k from a).
        visible: mean visible keys per row at each point (>= 3 points that fit ``keys``).
        repeats: timed calls per point (interleaved; the median is kept).
        max_residual: refuse (ValueError) a fit whose rms relative residual exceeds it; 0: no bound.
        timer: ``timer(call) -> seconds`` instead of the device's clock (tests).
        candidates, quantum: what the selector's kernel does, carried by the model: a row's key
            term prices at most ``candidates`` keys (0: no cap; DeepSeek-V4.1's candidate layers
            score 16384) and rounds its width up to a multiple of ``quantum`` (1: exact).
        heap_term: fit d, the top-k admission term, too: for a selector that keeps a running top-k per
            row (a heap, or sparsecp's CPU kernel: ``IndexerSelector`` off the torch path). ``torch.topk``
            and GPU radix selects scan every score alike, and a free d only follows their timing noise.

    Returns:
        A Calibration: ``model`` (a, b, c, d in ns; unit "ns"; note naming shape and device).

    Raises:
        ValueError: invalid arguments; a fit over ``max_residual``; a selector that returns
            other than integer ids [1, rows, topk] on ``device`` (``None``, another shape or
            dtype), naming what it returned.
    """
    rows = integer("rows", rows, 1)
    repeats = integer("repeats", repeats, 1)
    if rows > 1 << 20:  # before any tensor is made (the library's limit)
        raise ValueError(f"rows must be within [1, 2^20], got {rows}")
    q_rank, heads, keys = integer("q_rank", q_rank, 1), integer("heads", heads, 1), integer("keys", keys, 1)
    ratio, topk, rope_dim = integer("ratio", ratio, 1), integer("topk", topk, 1), integer("rope_dim", rope_dim, 0)
    candidates, quantum = integer("candidates", candidates, 0), integer("quantum", quantum, 1)
    if not (max_residual >= 0 and max_residual != float("inf")):
        raise ValueError(f"max_residual must be finite and non-negative, got {max_residual}")
    device = torch.device(device)
    visible = [integer("visible", target, 0) for target in visible]
    generator = torch.Generator().manual_seed(seed)

    def tensor(*shape: int) -> torch.Tensor:
        return (torch.rand(shape, generator=generator) - 0.5).to(device=device, dtype=dtype)

    qr, weights = tensor(1, rows, q_rank), tensor(1, rows, heads).abs() + 0.1
    angle = torch.rand((1, rows, rope_dim // 2), generator=generator) * 6.2832
    cos, sin = angle.cos().to(device, dtype), angle.sin().to(device, dtype)
    clock = timer or _timer(device)

    def measure(target: int, count: int, segments: tuple[tuple[int, int, int, int, int], ...]) -> float:
        args = (qr[:, :count], weights[:, :count], (cos[:, :count], sin[:, :count]), segments)
        returned: list[Any] = []
        seconds = clock(lambda: returned.append(selector(*args)))
        if returned:  # checked outside the timed call
            check_selected(returned[-1], count, topk, device, name)
        return seconds

    name = getattr(selector, "__qualname__", type(selector).__name__)
    model, per_call, rms, fitted = calibrate_cost_model(measure, ratio, rows, visible, topk, candidates, quantum,
                                                        keys, repeats, max_residual, heap_term)
    model = model.replace(note=f"selector {name} heads {heads} q_rank {q_rank} rope_dim {rope_dim} ratio {ratio} "
                               f"{dtype} on {device}")
    points = [CalibrationPoint(*point) for point in fitted]
    return Calibration(model, per_call, rms, str(device), points)
