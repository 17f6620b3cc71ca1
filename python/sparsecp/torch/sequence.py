"""KV routes and sequence gathers with autograd (seed 000's attention module, completed).

Main attention keeps the original contiguous shards; its keys come from lower ranks:

* ``sliding_window_route(boundaries, local_length, size, rank, window)``: the raw-KV halo
  of sliding-window attention, never crossing the start of the document holding the
  rank's first token.
* ``document_prefix_route(boundaries, local_length, size, rank, ratio)`` (ratio 1 or 2):
  compressed-KV prefixes of the documents a rank touches; the bank is owned block by
  block by the rank holding the block's last raw token.

Both return a ``SequenceDispatchRoute`` (C++ ``planning/dispatch.hpp``, identical on every
rank for the same inputs, no communication). ``sequence_dispatch(tensor, dim, route,
group)`` moves rows per route: every rank receives its interval as one contiguous block
in global order (rows from lower ranks first, its own rows last); its backward SUMs each
consumer's gradient into the owner's rows, in ascending consumer rank order (so results
do not depend on arrival order). ``sequence_gather(tensor, dim, group)`` all-gathers equal
shards along ``dim`` (``all_gather_into_tensor``); its backward is a SUM reduce-scatter
(``reduce_scatter_tensor``). ``launch_*`` return single-use ``SequenceGatherHandle``s;
``DeferredBankLaunch`` (seed ``_DeferredBankLaunch``) launches at a chosen point.

Before data moves the ranks agree (one small all-reduce) on dtype, trailing shape and
dimension, and for a dispatch on the route's defining inputs (kind, document boundaries,
window or ratio, raw shard length, CP size), so a mismatched rank raises on every rank,
naming the difference, instead of hanging or returning rows that were never written. A
dispatch whose route needs no exchange moves no data but still takes part in the
agreement (a rank handed other inputs might need an exchange), so later collectives stay
paired.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from .. import _core
from .. import compressed_document_offsets as _offsets
from .. import compressed_owner_offsets as _owners
from .. import document_prefix_route as _prefix_route
from .. import sliding_window_route as _window_route
from .._checks import integer
from ._agreement import agree, capture, control_device, dtype_code

SequenceDispatchRoute = _core.SequenceDispatchRoute

__all__ = [
    "DeferredBankLaunch",
    "SequenceDispatchRoute",
    "SequenceGatherHandle",
    "compressed_document_offsets",
    "compressed_owner_offsets",
    "document_prefix_route",
    "launch_sequence_dispatch",
    "launch_sequence_gather",
    "sequence_dispatch",
    "sequence_gather",
    "sliding_window_route",
]


def sliding_window_route(boundaries: tuple[int, ...], local_length: int, size: int, rank: int,
                         window: int) -> SequenceDispatchRoute:
    """Plan the same-document left halo; every rank agrees whether to exchange.

    Args:
        boundaries: Document boundaries (0, cumulative lengths..., total), strictly
            increasing, ending at local_length * size.
        local_length: Raw tokens per rank.
        size, rank: The CP group and this rank.
        window: Sliding window (a query at p sees keys [max(doc start, p - window + 1), p]).

    Raises:
        ValueError: "SWA dispatch requires positive dimensions and a valid CP rank",
            "SWA document boundaries must span the full contiguous CP sequence".
    """
    return _window_route(boundaries, local_length, size, rank, window)


def document_prefix_route(boundaries: tuple[int, ...], local_length: int, size: int, rank: int,
                          ratio: int) -> SequenceDispatchRoute:
    """Route natural-document main KV prefixes using complete-block ownership.

    ``local_length`` is the raw shard length; the route's ``local_length`` is the
    compressed extent this rank owns (``compressed_owner_offsets``).

    Raises:
        ValueError: "Main KV dispatch requires a supported ratio and equal positive raw CP
            shards", "Main KV document boundaries must span the complete contiguous CP
            sequence".
    """
    return _prefix_route(boundaries, local_length, size, rank, ratio)


def compressed_document_offsets(boundaries: tuple[int, ...], ratio: int) -> tuple[int, ...]:
    """Compressed-bank offset of each document (sum of floor(len / ratio) before it), and the total."""
    return tuple(_offsets(boundaries, ratio))


def compressed_owner_offsets(boundaries: tuple[int, ...], ratio: int, local_length: int) -> tuple[int, ...]:
    """The compressed bank's physical layout: rank r owns rows [owners[r], owners[r + 1])."""
    return tuple(_owners(boundaries, ratio, local_length))


def _move_dim_to_front(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    return tensor.movedim(dim, 0).contiguous()


def _move_dim_from_front(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    return tensor.movedim(0, dim)


def _check_dim(tensor: torch.Tensor, sequence_dim: int) -> int:
    sequence_dim = integer("sequence_dim", sequence_dim)
    if not -tensor.ndim <= sequence_dim < tensor.ndim:
        raise ValueError("sequence dispatch dimension is outside the input tensor dimensions")
    return sequence_dim % tensor.ndim


def _agree_layout(group: Any, tensor: torch.Tensor, dim: int, error: BaseException | None, what: str,
                  *, route: SequenceDispatchRoute | None = None,
                  settings: dict[str, int] | None = None) -> None:
    if route is not None:  # the route's defining inputs, identical on consistent ranks
        fingerprint = _core.dispatch_route_fingerprint(route)
    else:
        fingerprint = _core.PlanningFingerprint.seed([], 1, 1, "none", None, None)
    if error is None:
        fingerprint.add("dtype", dtype_code(tensor.dtype)).add("dimension", dim).add("rank", tensor.ndim)
        for axis, extent in enumerate(tensor.shape):
            if axis != dim:
                fingerprint.add(f"extent of dimension {axis}", int(extent))
        for name, value in (settings or {}).items():
            fingerprint.add(name, value)
    agree(group, control_device(group, tensor.device), error, fingerprint, what, invalid_first=True)


class SequenceGatherHandle:
    """A launched sequence transfer; ``wait()`` once returns its differentiable result.

    Seed ``SequenceGatherHandle``. The result's contents are only valid after wait();
    a second wait() raises RuntimeError("Sequence gather handle cannot be consumed
    twice"). Buffers are released by wait().
    """

    def __init__(self, output: torch.Tensor, work: Any) -> None:
        self._output: torch.Tensor | None = output
        self._work = work
        self.consumed = False

    def wait(self) -> torch.Tensor:
        if self.consumed:
            raise RuntimeError("Sequence gather handle cannot be consumed twice")
        self.consumed = True
        if self._work is not None:
            self._work.wait()
        output, self._output, self._work = self._output, None, None
        assert output is not None  # released only here, once
        return output


@dataclass
class DeferredBankLaunch:
    """A launch deferred to a chosen point (seed ``_DeferredBankLaunch``).

    ``start()`` calls the launcher once, drops it (releasing what it captured) and returns
    the handle; later calls return the same handle. ``wait()`` is ``start().wait()``.
    """

    launcher: Callable[[], SequenceGatherHandle] | None
    handle: SequenceGatherHandle | None = None

    def start(self) -> SequenceGatherHandle:
        """Launch once in the differentiable forward, then release captured inputs."""
        if self.handle is None:
            assert self.launcher is not None  # dropped only once the handle exists
            self.handle = self.launcher()
            self.launcher = None
        return self.handle

    def wait(self) -> torch.Tensor:
        """Resolve the same differentiable handle at its first consumer."""
        return self.start().wait()


_DeferredBankLaunch = DeferredBankLaunch


def _send_index(route: SequenceDispatchRoute, device: torch.device) -> torch.Tensor:
    """Local rows this rank sends, concatenated in peer order (ranges may overlap)."""
    pieces = [np.arange(begin, begin + count, dtype=np.int64)
              for begin, count in zip(route.send_begin, route.send_splits) if count]
    rows = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return torch.from_numpy(rows).to(device)


class _SequenceDispatch(torch.autograd.Function):
    """Front layout: local [local_length, ...] -> block [block_rows, ...]."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, route: SequenceDispatchRoute, group: Any, works: list) -> torch.Tensor:
        received = route.received_rows
        block = local.new_empty((route.block_rows, *local.shape[1:]))
        block[received:].copy_(local)
        if route.exchange_needed:
            send = local.index_select(0, _send_index(route, local.device))
            works.append(dist.all_to_all_single(block[:received], send, list(route.receive_splits),
                                                list(route.send_splits), group=group, async_op=True))
        ctx.route, ctx.group = route, group
        return block

    @staticmethod
    def backward(ctx: Any, grad_block: torch.Tensor) -> tuple:
        route = ctx.route
        grad_block = grad_block.contiguous()
        received = route.received_rows
        grad = grad_block[received:].clone()  # this rank's own consumption first
        if route.exchange_needed:
            returned = grad_block.new_empty((route.sent_rows, *grad_block.shape[1:]))
            dist.all_to_all_single(returned, grad_block[:received], list(route.send_splits),
                                   list(route.receive_splits), group=ctx.group)
            offset = 0
            for begin, count in zip(route.send_begin, route.send_splits):  # ascending consumer rank
                if count:
                    grad[begin:begin + count] += returned[offset:offset + count]
                    offset += count
        return grad, None, None, None


def launch_sequence_dispatch(tensor: torch.Tensor, sequence_dim: int, route: SequenceDispatchRoute,
                             group: Any) -> SequenceGatherHandle:
    """Start moving rows per ``route``; wait() gives this rank's block.

    Args:
        tensor: This rank's physical rows along ``sequence_dim`` (route.local_length of them).
        sequence_dim: The sequence dimension (negative counts from the end).
        route: This rank's SequenceDispatchRoute, immutable per-batch routing agreed by
            every member of the CP group.
        group: Existing framework-owned CP process group, in sequence-shard rank order.

    Returns:
        A handle whose wait() gives the tensor with ``sequence_dim`` extended to
        route.block_rows: bank rows [global_start, global_end) in global order. Its
        backward sums every consumer's gradient back into the owners' rows.
    """
    def check() -> int:
        dim = _check_dim(tensor, sequence_dim)
        if tensor.shape[dim] != route.local_length:
            raise ValueError("sequence dispatch owner length does not match the bank's physical layout")
        if route.size != dist.get_world_size(group) or route.rank != dist.get_rank(group):
            raise ValueError(f"sequence dispatch route is for rank {route.rank} of {route.size}, this is rank "
                             f"{dist.get_rank(group)} of {dist.get_world_size(group)}")
        return dim

    dim, error = capture(check)
    # Every rank agrees, whatever its own route says: a rank handed other inputs may need
    # an exchange that this one does not (and would pair with an unrelated collective).
    if dist.get_world_size(group) > 1:
        _agree_layout(group, tensor, dim if error is None else 0, error, "Sequence dispatch", route=route)
    elif error is not None:
        raise error
    works: list = []
    block = _SequenceDispatch.apply(_move_dim_to_front(tensor, dim), route, group, works)
    return SequenceGatherHandle(_move_dim_from_front(block, dim), works[0] if works else None)


def sequence_dispatch(tensor: torch.Tensor, sequence_dim: int, route: SequenceDispatchRoute,
                      group: Any) -> torch.Tensor:
    """Blocking ``launch_sequence_dispatch(...).wait()``."""
    return launch_sequence_dispatch(tensor, sequence_dim, route, group).wait()


class _SequenceGather(torch.autograd.Function):
    """Front layout: local [L, ...] -> [size * L, ...]; backward: SUM reduce-scatter."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: Any, works: list) -> torch.Tensor:
        size = dist.get_world_size(group)
        gathered = local.new_empty((size * local.shape[0], *local.shape[1:]))
        works.append(dist.all_gather_into_tensor(gathered, local, group=group, async_op=True))
        ctx.group, ctx.size = group, size
        return gathered

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple:
        """SUM consumer gradients directly into each owner's sequence shard."""
        send = grad_output.contiguous()
        output = send.new_empty((send.shape[0] // ctx.size, *send.shape[1:]))
        work = dist.reduce_scatter_tensor(output, send, op=dist.ReduceOp.SUM, group=ctx.group, async_op=True)
        assert work is not None  # async_op=True returns the Work
        work.wait()
        return output, None, None


def launch_sequence_gather(tensor: torch.Tensor, sequence_dim: int, group: Any) -> SequenceGatherHandle:
    """Start an all-gather of equal shards along ``sequence_dim``; wait() gives the whole
    sequence (``size * local`` along ``sequence_dim``, ranks in group order)."""
    def check() -> int:
        return _check_dim(tensor, sequence_dim)

    dim, error = capture(check)
    _agree_layout(group, tensor, dim if error is None else 0, error, "Sequence gather",
                  settings={"local length": int(tensor.shape[dim])} if error is None else None)
    works: list = []
    gathered = _SequenceGather.apply(_move_dim_to_front(tensor, dim), group, works)
    return SequenceGatherHandle(_move_dim_from_front(gathered, dim), works[0])


def sequence_gather(tensor: torch.Tensor, sequence_dim: int, group: Any) -> torch.Tensor:
    """All-gather along the sequence dimension; backward is a SUM reduce-scatter."""
    return launch_sequence_gather(tensor, sequence_dim, group).wait()
