"""The balanced selection on a batch's agreed route, and the replay a recompute takes instead.

``select_or_replay`` is every selecting layer's step 5 (SYSTEM.md, "A real model"): gather the
Index K rows the worker's segments can see, send the owners' rows to their workers, score them
there with the layer's own selector, bring the ids back; in a recompute replay the first
forward's ids instead. ``balanced_select`` is the exchange alone.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ...torch._agreement import capture
from ...torch._exchange import exchange_stats, launch_rows, to_owners
from ...torch._overlapped import launch_on_route
from .forward import ForwardContext, in_recompute

__all__ = ["BankView", "balanced_select", "select_or_replay"]


class BankView:
    """A worker's part of a key bank: the rows it gathered (``bank``), and where each global bank
    row sits in it (``locate``; a document's prefix is contiguous in both)."""

    def __init__(self, bank: torch.Tensor, locate: Callable[[int], int] | None = None) -> None:
        self.bank = bank
        self.locate = locate if locate is not None else (lambda row: row)


def balanced_select(route: Any, route_rows: Any, inputs: tuple[torch.Tensor, ...], selector: Any, topk: int,
                    group: Any) -> torch.Tensor:
    """``balanced_indexer_select`` on a batch's agreed route, with no agreement round: the owners'
    rows (``inputs``, each ``[1, own rows, width]``) to their workers, ``selector(qr, weights,
    (cos, sin), segments)`` there, int32 ids ``[own rows, topk]`` back to the owners.

    ``route`` is this rank's ``IndexerRoute`` (``indexer_route``), ``route_rows`` its row lists on
    the device (``sparsecp.torch._exchange.device_rows``), both made once per batch. A selector that raises on
    one rank still completes the result exchange (with -1 padding) before raising there, so its
    peers are not left waiting."""
    exchange = launch_on_route(inputs, route, group)
    qr, weights, cos, sin = exchange.wait()
    selected, failure = capture(lambda: selector(qr, weights, (cos, sin), route.segments)[0])
    back = to_owners(route, route_rows, inputs[0].shape[-2])
    if failure is not None:
        padding = torch.full((route.query_count, topk), -1, dtype=torch.int32, device=qr.device)
        launch_rows(padding, back, group).wait()
        raise failure
    return launch_rows(selected, back, group).wait()


def select_or_replay(state: Any, context: ForwardContext, layer: int, tables: Any, keys: Callable[[], torch.Tensor],
                     inputs: Callable[[], tuple[torch.Tensor, ...]], make_selector: Callable[[BankView], Any],
                     topk: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A selecting layer's ids: ``(ids [own rows, topk] int64 bank rows, -1 padded, the gathered
    Index K rows or None)``.

    Args:
        state: The model's ``ContextParallelState``.
        context: The forward the layer runs in.
        layer: The layer's index (its recorded ids' key).
        tables: The batch's device tables of this selection: ``route``, ``route_rows`` and
            ``index_bank`` (the Index K gather of what this rank's segments, and with the KL its
            own rows, can see).
        keys: This rank's own Index K rows ``[own bank rows, index_head_dim]`` (called under
            gradients only when the KL trains on them).
        inputs: The owners' rows ``(q_residual, merge weights, cos, sin)``, each ``[1, own rows, width]``.
        make_selector: The layer's worker selector over the gathered bank.
        topk: The indexer's top-k.

    The first forward gathers the keys, selects and records the ids; a recompute replays them (no
    selector call and no selection collective) and gathers the keys only for the KL's student,
    so that it saves the same tensors as the first forward."""
    start = time.perf_counter()
    recompute = in_recompute()
    bank = None
    if not recompute or state.kl_coeff is not None:  # the KL's student needs the keys in a recompute too
        with torch.set_grad_enabled(torch.is_grad_enabled() and state.kl_coeff is not None):
            bank = state.gather(keys(), tables.index_bank, context)
    if recompute:
        ids = context.replay(layer)
        state.stats.replays += 1
    else:
        assert bank is not None
        with torch.no_grad():  # selection only: a recompute, which replays, must save the same tensors
            selector = make_selector(BankView(bank.detach(), tables.index_bank.plan.locate))
            sent = exchange_stats()["bytes_sent"]
            ids = balanced_select(tables.route, tables.route_rows, inputs(), state.clock.timed(selector), topk,
                                  state.group).long()
            state.selection_bytes += max(0, exchange_stats()["bytes_sent"] - sent)
        context.record(layer, ids)
        state.stats.selections += 1
    state.stats.indexer_seconds += time.perf_counter() - start
    return ids, bank
