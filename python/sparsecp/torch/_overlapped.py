"""The seed's overlapped handle, ``IndexerInputExchange``: ``launch_indexer_inputs`` returns
it, its ``wait()`` gives the worker its rows, its ``launch_result`` returns the ids to their
owners (a ``_PendingRows``). ``launch_on_route`` launches one along a checked, agreed route
(the dynamic exchange; ``_prebuilt`` has the fixed-capacity one). Above ``_exchange``,
``_checks`` and ``_route``; ``indexer_balance`` (the seed's names) and ``_prebuilt`` use it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ._checks import result_checks
from ._exchange import (
    DeviceRows,
    WorkerInputs,
    _device_rows,
    _PendingRows,
    launch_fields,
    launch_rows,
    to_owners,
    to_workers,
    unpack_fields,
)
from ._route import IndexerRoute
from ._worker_time import WorkerClock

__all__ = ["IndexerInputExchange", "launch_on_route"]


@dataclass
class IndexerInputExchange:
    """One balanced query dispatch with original routing and dtype groups."""

    route: IndexerRoute
    rows: DeviceRows
    group: Any
    owner_queries: int
    transfers: tuple
    fields: tuple
    widths: tuple
    consumed: bool = False
    # Set per instance by wait(); not a dataclass field, so the seed's fields stay as they are.
    _clock: ClassVar[WorkerClock | None] = None
    # Inside a SelectionReplay's replay() the launch returns a handle that moves nothing and
    # has this True (sparsecp.torch._replay): code may then skip the worker's selector.
    replayed: ClassVar[bool] = False

    @torch.no_grad()
    def wait(self) -> WorkerInputs:
        """Restore qr, weights and original RoPE after all input launches.

        Returns:
            (qr, weights, cos, sin), each [1, worker rows, width] in worker order
            (``route.segments`` describes the rows), with the owners' dtypes.
        """
        if self.consumed:
            raise RuntimeError("Indexer input exchange cannot be consumed twice")
        self.consumed = True
        merged = [transfer.wait() for transfer in self.transfers]
        self.transfers = ()
        inputs = WorkerInputs(*unpack_fields(merged, self.fields, self.widths))
        self._clock = WorkerClock(inputs.qr.device)  # type: ignore[misc]
        return inputs

    @property
    def selection_seconds(self) -> float | None:
        """The worker's selection time: from ``wait()`` handing it its inputs to
        ``launch_result()`` (device time on CUDA, CPU time elsewhere;
        ``sparsecp.torch.step_cost_samples`` gathers every rank's for a cost-model refit).
        None before ``launch_result()``."""
        return self._clock.seconds if self._clock is not None else None

    @torch.no_grad()
    def launch_result(self, selected: torch.Tensor) -> _PendingRows:
        """Return selection IDs while owner-side differentiable projections run.

        Args:
            selected: This worker's ids, [route.query_count, topk]. Collective: every rank
                calls it, with the same topk and dtype (agreed before anything moves).

        Returns:
            A single-use handle whose wait() gives this rank's own rows' ids
            [owner_queries, topk].
        """
        return self._launch_result(selected)

    @torch.no_grad()
    def _launch_result(self, selected: Any, failure: BaseException | None = None) -> _PendingRows:
        """launch_result; ``failure``: this rank's selector error (every rank raises then)."""
        if self._clock is not None:
            self._clock.stop()  # before the checks' collective, which waits for the other ranks
        result_checks(selected, self.route.query_count, self.group, self.rows.send_rows.device, failure)
        return launch_rows(selected, to_owners(self.route, self.rows, self.owner_queries), self.group)


def launch_on_route(inputs: tuple, route: IndexerRoute, group: Any) -> IndexerInputExchange:
    """Launch every dtype group of the (checked, agreed) inputs along ``route``."""
    rows = _device_rows(route, inputs[0].device)
    transfers, fields = launch_fields(inputs, to_workers(route, rows), group)
    return IndexerInputExchange(route, rows, group, inputs[0].shape[1], transfers, fields,
                                tuple(value.shape[-1] for value in inputs))
