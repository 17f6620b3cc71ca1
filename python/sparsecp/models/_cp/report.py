"""Whether balancing helps, from inside the user's own training loop: ``balance_report``.

Every rank's selector seconds (the ``SelectorClock``'s CPU seconds), its own step seconds (the
calling thread's CPU seconds since the last report: what a rank computes itself, not the time it
waits for its peers), the rows it sent for other ranks' reads and the selection exchange's bytes,
gathered in one collective over the CP group. From them: the selection imbalance ``I`` (the
slowest rank's selection over the mean), the selection's share of the step, and the bound a
perfect balancer of this strategy's selection could reach, ``(R + I * m) / (R + m)`` with ``m``
the mean selection seconds and ``R`` the mean rest of a step (sparsecp's examples and benchmarks
print the same). A bound near 1 says balancing cannot pay here, whatever the strategy.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

__all__ = ["BalanceReport", "ReportMark", "balance_report"]


@dataclass
class ReportMark:
    """Where the last report's window ended (lifetime counters of one rank)."""

    cpu_seconds: float
    selector_seconds: float = 0.0
    forwards: int = 0
    moved_bytes: int = 0
    selection_bytes: int = 0


@dataclass(frozen=True)
class BalanceReport:
    """The ranks' selection balance over a window of forwards (``balance_report``); the same on every rank.

    Attributes:
        ranks, forwards: The CP group's size and the model forwards in the window.
        step_seconds: Each rank's CPU seconds in the window (its own compute: forwards, backwards,
            optimizer, anything else the calling thread ran).
        selection_seconds: Each rank's selector CPU seconds in the window.
        imbalance: The slowest rank's selection seconds over the ranks' mean (1: balanced).
        selection_share: The selection's share of the ranks' mean step.
        bound: ``(R + I * m) / (R + m)``: the step speed-up a perfect balancer of this window's
            selection could reach (1: nothing to gain).
        moved_bytes: Each rank's bytes sent for other ranks' reads (halos, prefixes, banks).
        selection_bytes: Each rank's bytes sent by its selection exchanges (inputs to workers, ids
            back to owners).
        prediction_error: rms relative error of spill's cost model predicting each rank's share
            of a forward's selection (None without a calibrated model).
    """

    ranks: int
    forwards: int
    step_seconds: tuple[float, ...]
    selection_seconds: tuple[float, ...]
    imbalance: float
    selection_share: float
    bound: float
    moved_bytes: tuple[int, ...]
    selection_bytes: tuple[int, ...]
    prediction_error: float | None

    def __str__(self) -> str:
        mib = 1 << 20
        error = "" if self.prediction_error is None else \
            f"; the cost model predicts each rank's share to {self.prediction_error:.3f} rms"
        return (f"sparsecp balance over {self.ranks} ranks, {self.forwards} forwards: selection imbalance "
                f"{self.imbalance:.3f} ({min(self.selection_seconds):.3g}-{max(self.selection_seconds):.3g} s), "
                f"{100 * self.selection_share:.1f}% of the step, bound {self.bound:.3f}; sent per rank "
                f"{max(self.moved_bytes) / mib:.2f} MiB rows + {max(self.selection_bytes) / mib:.2f} MiB "
                f"selection{error}")


def _local(state: Any) -> ReportMark:
    return ReportMark(time.thread_time(), state.clock.lifetime_seconds, state.forwards, state.moved_bytes,
                      state.selection_bytes)


def balance_report(state: Any, reset: bool = True, step_seconds: float | None = None) -> BalanceReport:
    """This window's ``BalanceReport`` (since ``context_parallel`` or the last report with
    ``reset``). Collective over the CP group: every rank calls it at the same point of its loop.
    ``step_seconds``: this rank's own step seconds over the window, where the calling thread ran
    other work in it too (another model, an evaluation); by default its CPU seconds."""
    now, last = _local(state), state.report_mark
    if step_seconds is not None and (isinstance(step_seconds, bool) or not isinstance(step_seconds, (int, float))
                                     or not math.isfinite(step_seconds) or step_seconds < 0):
        raise ValueError(f"balance_report: step_seconds must be a finite number of seconds >= 0, got "
                         f"{step_seconds!r}")
    own = now.cpu_seconds - last.cpu_seconds if step_seconds is None else float(step_seconds)
    window = (own, now.selector_seconds - last.selector_seconds, now.forwards - last.forwards,
              now.moved_bytes - last.moved_bytes, now.selection_bytes - last.selection_bytes)
    everyone: list[Any] = [window]
    if state.size > 1:
        everyone = [None] * state.size
        dist.all_gather_object(everyone, window, group=state.group)
    if reset:
        state.report_mark = now
    steps = tuple(float(w[0]) for w in everyone)
    selection = tuple(float(w[1]) for w in everyone)
    m = sum(selection) / len(selection)
    rest = max(0.0, sum(steps) / len(steps) - m)
    imbalance = max(selection) / m if m > 0 else 1.0
    calibration = getattr(state.calibration, "report", None)
    error = calibration.prediction_residual(shares=True) if calibration is not None else math.nan
    return BalanceReport(
        ranks=state.size, forwards=int(everyone[0][2]), step_seconds=steps, selection_seconds=selection,
        imbalance=imbalance, selection_share=m / (rest + m) if rest + m > 0 else 0.0,
        bound=(rest + imbalance * m) / (rest + m) if rest + m > 0 else 1.0,
        moved_bytes=tuple(int(w[3]) for w in everyone), selection_bytes=tuple(int(w[4]) for w in everyone),
        prediction_error=None if math.isnan(error) else error)
