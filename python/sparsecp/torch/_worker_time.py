"""The worker's selection time, as the launch handles measure it, and the per-rank cost
samples a training loop feeds to ``sparsecp.CostModelRefit``.

A handle's clock starts when ``wait()`` hands the worker its inputs and stops when
``launch_result()`` takes its ids: the time the worker spent selecting (and anything else
it did in between). On CUDA it is device time from two timing events on the current
stream (no synchronisation is added; reading it after the result's ``wait()`` finds the
events done); elsewhere the calling thread's CPU time (the process's when torch runs
several threads), as ``sparsecp.torch.calibrate`` measures. Inside CUDA graph capture
nothing is timed.
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from ._agreement import control_device
from .calibrate import segment_sums


class WorkerClock:
    """Started when the worker holds its inputs; ``stop()`` when it launches its results."""

    __slots__ = ("_device", "_clock", "_start", "_end", "_seconds")

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._start: Any = None
        self._end: Any = None
        self._seconds: float | None = None
        self._clock = _cpu_clock()  # the same clock at both ends
        if device.type == "cuda":
            if not torch.cuda.is_current_stream_capturing():
                self._start = torch.cuda.Event(enable_timing=True)
                self._start.record()
        else:
            self._start = self._clock()

    def stop(self) -> None:
        if self._start is None or self._end is not None or self._seconds is not None:
            return
        if self._device.type == "cuda":
            self._end = torch.cuda.Event(enable_timing=True)
            self._end.record()
        else:
            self._seconds = self._clock() - self._start

    @property
    def seconds(self) -> float | None:
        """Seconds between the two points; None before ``stop()`` or when not timed."""
        if self._end is not None and self._seconds is None:
            self._end.synchronize()
            self._seconds = float(self._start.elapsed_time(self._end)) * 1e-3
        return self._seconds


def _cpu_clock() -> Any:
    return time.thread_time if torch.get_num_threads() == 1 else time.process_time


def step_cost_samples(exchange: Any, ratio: int, topk: int, group: Any, *, seconds: float | None = None,
                      candidates: int = 0, quantum: int = 1) -> list[tuple[float, float, float, float, float]]:
    """Every rank's (rows, sum of widths, sum min(topk, vis), seconds, sum of heap
    replacements) for this step: one
    small all-gather. Collective: every rank of ``group`` calls it, after its
    ``launch_result``. Pass the list to ``sparsecp.CostModelRefit.add_step`` and plan the
    next step with its ``model`` (``cost_model=refit.model``).

    Args:
        exchange: this step's handle from ``launch_indexer_inputs`` (its ``route`` and
            ``selection_seconds``).
        ratio, topk: the layer's compression ratio and ids per row.
        seconds: this rank's selection time, when measured otherwise (default: the
            handle's ``selection_seconds``).
        candidates, quantum: the cost model's candidate cap and width quantum.

    Ranks that selected no rows are left out (their time is only the call's).
    """
    if seconds is None:
        seconds = exchange.selection_seconds
    if seconds is None:
        raise ValueError("step_cost_samples needs this rank's selection time: call it after launch_result(), "
                         "or pass seconds= (the handle times nothing inside CUDA graph capture)")
    rows, widths, capped, heap = segment_sums(exchange.route.segments, ratio, topk, candidates, quantum)
    mine = torch.tensor([rows, widths, capped, float(seconds), heap], dtype=torch.float64,
                        device=control_device(group, None))
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    samples = [tuple(float(v) for v in value.tolist()) for value in every]
    return [(r, w, c, s, h) for r, w, c, s, h in samples if r > 0 and s > 0]
