"""Multi-rank test harness: gloo ranks on loopback, spawned once per group size, with a
timeout on every task so that a hang fails the test instead of blocking the suite.

``RankPool(size)`` spawns ``size`` processes (torch.multiprocessing, spawn) that join one
gloo process group over TCP on 127.0.0.1 (a free port), then run tasks: module-level
functions ``task(rank, size, *args)`` (picklable by reference). ``pool.run(task, *args)``
returns every rank's result in rank order; a rank's exception comes back as a
``RankError`` (its type name, message and traceback) in that rank's slot. If any rank has
not answered after ``timeout`` seconds, every process of the pool is killed and
``RankTimeout`` is raised: the pool is then unusable, and the next ``pool_of`` call spawns
a fresh one.

Workers run single-threaded (OMP_NUM_THREADS=1, torch.set_num_threads(1)): the test
machine has 2 cores.
"""
from __future__ import annotations

import datetime
import os
import queue
import socket
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch.multiprocessing as mp

DEFAULT_TIMEOUT = float(os.environ.get("SPARSECP_TEST_RANK_TIMEOUT", "90"))


@dataclass
class RankError:
    """An exception raised by a rank's task."""

    rank: int
    type_name: str
    message: str
    trace: str

    def __str__(self) -> str:
        return f"rank {self.rank}: {self.type_name}: {self.message}"


class RankTimeout(AssertionError):
    """A rank did not finish its task in time (a hang)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _worker(rank: int, size: int, port: int, tasks: Any, results: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=DEFAULT_TIMEOUT * 2))
    while True:
        item = tasks.get()
        if item is None:
            break
        task_id, function, args = item
        try:
            results.put((task_id, rank, True, function(rank, size, *args)))
        except BaseException as error:  # report every failure, keep serving
            results.put((task_id, rank, False, RankError(rank, type(error).__name__, str(error),
                                                         traceback.format_exc())))
    dist.destroy_process_group()


class RankPool:
    """``size`` gloo ranks serving tasks (see the module docstring)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.alive = True
        self._next_task = 0
        context = mp.get_context("spawn")
        self._tasks = [context.Queue() for _ in range(size)]
        self._results = context.Queue()
        port = _free_port()
        saved = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        try:
            self._processes = [context.Process(target=_worker, daemon=True,
                                               args=(rank, size, port, self._tasks[rank], self._results))
                               for rank in range(size)]
            for process in self._processes:
                process.start()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def run(self, function: Callable, *args: Any, timeout: float = DEFAULT_TIMEOUT,
            ranks_args: list | None = None) -> list[Any]:
        """Run ``function(rank, size, *args)`` on every rank (``ranks_args[rank]`` replaces
        ``args`` when given); returns results (or RankError) in rank order."""
        assert self.alive, "the rank pool was killed by an earlier timeout"
        self._next_task += 1
        task_id = self._next_task
        for rank in range(self.size):
            self._tasks[rank].put((task_id, function, tuple(ranks_args[rank]) if ranks_args else args))
        results: dict[int, Any] = {}
        deadline = _now() + timeout
        while len(results) < self.size:
            try:
                got_id, rank, _, value = self._results.get(timeout=max(0.1, deadline - _now()))
            except queue.Empty:
                missing = sorted(set(range(self.size)) - set(results))
                self.kill()
                answered = [str(results[r]) for r in sorted(results)]
                name = getattr(function, "__name__", function)  # a functools.partial has none
                raise RankTimeout(f"{name}: ranks {missing} of {self.size} did not finish within "
                                  f"{timeout:.0f} s (hang); answered: {answered}") from None
            if got_id == task_id:
                results[rank] = value
        return [results[rank] for rank in range(self.size)]

    def kill(self) -> None:
        self.alive = False
        for process in self._processes:
            if process.is_alive():
                process.kill()
        for process in self._processes:
            process.join(timeout=10)

    def close(self) -> None:
        if not self.alive:
            return
        for tasks in self._tasks:
            tasks.put(None)
        for process in self._processes:
            process.join(timeout=20)
        self.kill()


def _now() -> float:
    import time

    return time.monotonic()


_POOLS: dict[int, RankPool] = {}


def pool_of(size: int) -> RankPool:
    """The shared pool of ``size`` ranks (respawned after a timeout)."""
    pool = _POOLS.get(size)
    if pool is None or not pool.alive:
        pool = _POOLS[size] = RankPool(size)
    return pool


def close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


def results_or_raise(results: list[Any]) -> list[Any]:
    """The results, or an AssertionError listing every rank's failure with its traceback."""
    errors = [r for r in results if isinstance(r, RankError)]
    if errors:
        raise AssertionError("\n".join(f"{e}\n{e.trace}" for e in errors))
    return results
