"""The clock of a model's worker selectors: calls and the CPU seconds spent in them, per rank."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["SelectorClock"]


class SelectorClock:
    """Counts selector calls and the CPU seconds of the calling thread spent in them (per rank).

    CPU time, not wall time: with more ranks than cores (tests, an example on a laptop) a rank's
    wall time counts the time its peers held the core, which makes balanced plans, whose ranks
    all select at once, look slower than they are. For a CUDA selector this measures the host's
    share only; time the device with events (``sparsecp.torch.calibrate`` does).

    Attributes:
        calls: Selector calls since the caller last set it to 0 (``context_parallel_state(model)
            .clock.calls = 0`` once a step gives a step's count).
        seconds: CPU seconds of this thread in those calls (set to 0 with ``calls``).
        lifetime_calls: Every call since the clock was made; never reset (the cost-model refit
            takes each forward's difference).
        lifetime_seconds: Their CPU seconds; never reset.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0
        # Never reset by callers (who zero calls / seconds per step): the cost-model refit
        # (_cp.calibration) takes each forward's difference.
        self.lifetime_calls = 0
        self.lifetime_seconds = 0.0

    def timed(self, selector: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def run(*args: Any) -> torch.Tensor:
            start = time.thread_time()
            try:
                return selector(*args)
            finally:
                spent = time.thread_time() - start
                self.calls += 1
                self.seconds += spent
                self.lifetime_calls += 1
                self.lifetime_seconds += spent
        return run
