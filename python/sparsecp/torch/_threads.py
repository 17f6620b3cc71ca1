"""How many threads sparsecp's CPU kernels take when a torch caller leaves ``threads`` at 0."""
from __future__ import annotations

import torch

__all__ = ["cpu_threads"]


def cpu_threads(threads: int) -> int:
    """``threads`` where it is positive, else torch's intra-op thread count.

    The kernels run on sparsecp's own OpenMP runtime, which does not see
    ``torch.set_num_threads``: left to its default, every kernel call would use every core of
    the machine while the caller's torch ops use the threads it asked for, and on a node with one
    rank per core (or a few threads per rank) the ranks' kernels would compete for the same cores.
    Resolved when the kernel runs (inside a custom op's eager body, never while tracing), so a
    compiled graph follows ``torch.set_num_threads`` too. Results never depend on it."""
    return threads if threads > 0 else max(1, torch.get_num_threads())
