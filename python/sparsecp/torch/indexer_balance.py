"""The seed's ``indexer_balance`` module (Huawei hyper_parallel), drop-in, backed by sparsecp.

No-grad query-task redistribution for compressed Indexer selection: main attention,
teacher and KL keep the original sequence ownership; selection exchanges low-rank query
residuals, merge weights and original rotary embeddings, receivers project Indexer Q
and return integer TopK results. Code written against the seed's module runs unchanged
after ``import sparsecp.torch as indexer_balance``: the same public names, signatures,
argument order, return types and error texts.

What is different:

* Planning and routes come from sparsecp's C++ planners (the seed's exact plans and
  routes, 100-1000x faster). ``IndexerRoute`` fields compare equal to the seed's tuples
  and index like them, but are views of the C++ route's arrays: no per-row Python
  object is built. Routes and task plans are cached like the seed's (one cache behind
  both; ``cache_info`` / ``cache_clear`` as on the seed's ``lru_cache``).
* ``mode`` also takes sparsecp's own strategies (``spill``, ``auto``, the peers; see
  ``sparsecp.strategies()``), with their extra parameters as keyword arguments after the
  seed's (e.g. ``target_imbalance=1.01``). ``'none'`` is accepted as the no-balancing
  baseline (every rank selects its own rows; nothing moves); the seed rejects it with
  "Indexer task mode must be 'zigzag', 'greedy' or 'hybrid'".
* Before any data moves, every rank of the group agrees on its inputs (lengths, size,
  ratio, mode and options, field widths and dtypes; topk before results return): a
  rank given different inputs, or invalid ones, raises on every rank instead of leaving
  its peers blocked in an all-to-all (``_checks.py``, ``_agreement.py``). This costs
  one small all-reduce (11 int64 values) per launch and one per result return.
* Bytes handed to ``all_to_all_single`` are counted (``exchange_stats``) and equal the
  route's prediction (``expected_exchange_bytes``); both are sparsecp's own, in
  ``sparsecp.torch`` (and importable from here).

Communication is the seed's: ``torch.distributed.all_to_all_single(..., async_op=True)``
on the caller's ``group`` (gloo for CPU tensors, NCCL for CUDA tensors), fields of one
dtype packed side by side, one all-to-all per dtype group, local rows copied directly
and never sent to self (``_exchange.py``: one implementation for the inputs, the
overlapped handles and the results). ``balanced_indexer_select`` is the overlapped path
run straight through: launch the inputs, wait, select, launch the results, wait.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .. import _core
from .._checks import integer

# The `X as X` imports: sparsecp's own names (and the seed's private exchange helpers) that
# this module defined before; importable from here as they were (sparsecp.torch has them).
# Below this module (no module imports one above it): _route (IndexerRoute), _overlapped
# (IndexerInputExchange), _exchange, _checks, _prebuilt, _replay.
from ._agreement import capture
from ._checks import launch_checks
from ._exchange import ExchangeBytes as ExchangeBytes
from ._exchange import _device_rows as _device_rows
from ._exchange import _exchange_inputs as _exchange_inputs
from ._exchange import _exchange_rows as _exchange_rows
from ._exchange import _PendingRows as _PendingRows
from ._exchange import exchange_stats as exchange_stats
from ._exchange import expected_exchange_bytes as expected_exchange_bytes
from ._exchange import reset_exchange_stats as reset_exchange_stats
from ._overlapped import IndexerInputExchange, launch_on_route
from ._overlapped import launch_on_route as _launch_on_route  # noqa: F401  (the name it had here)
from ._plans import (
    PlanCached,
    is_sparsecp_strategy,
    mode_name,
    option,
    planned,
    planning_inputs,
    positive,
    rank_outside,
)
from ._plans import RowTuple as RowTuple
from ._prebuilt import launch_prebuilt
from ._replay import replayable
from ._route import IndexerRoute

__all__ = [
    "IndexerInputExchange",
    "IndexerRoute",
    "IndexerTask",
    "balanced_indexer_select",
    "indexer_route",
    "indexer_task_plan",
    "launch_indexer_inputs",
    "resolve_indexer_balance_block_size",
    "validate_indexer_hybrid_threshold",
]


def resolve_indexer_balance_block_size(mode: str, block_size: int | None) -> int | None:
    """Resolve the greedy-pool query block option, defaulting to 2048 rows.

    None represents an omitted option so none/zigzag remain valid without it.
    Explicit values require greedy/hybrid mode and must be positive integers.
    sparsecp's own strategies (not in the seed) take an optional positive block size
    (``auto`` uses it for its greedy/hybrid candidates) and return it unchanged.
    """
    if is_sparsecp_strategy(mode):
        if block_size is not None and not positive(block_size):
            raise ValueError("indexer_balance_block_size must be a positive integer")
        return block_size
    return _core.resolve_block_size(mode_name(mode), option(block_size))


def validate_indexer_hybrid_threshold(mode: str, min_length: int | None) -> None:
    """Require an explicit raw-token document threshold only for hybrid scheduling.

    The threshold selects complete zigzag fragments independently of CP size and
    the greedy block size. No performance threshold is chosen implicitly.
    sparsecp's own strategies take an optional positive threshold (``auto`` uses it for
    its hybrid candidate).

    Args:
        mode: Selected Indexer load-balancing strategy.
        min_length: Explicit positive raw-token document threshold for hybrid.
    """
    if is_sparsecp_strategy(mode):
        if min_length is not None and not positive(min_length):
            raise ValueError("indexer_zigzag_min_length must be a positive integer")
        return
    _core.validate_hybrid_threshold(mode == "hybrid", option(min_length))


@dataclass(frozen=True, order=True)
class IndexerTask:
    """A contiguous query interval in the original document coordinates."""

    document: int
    start: int
    end: int

    @property
    def length(self) -> int:
        """Return the number of real query rows, excluding any synthetic padding."""
        return self.end - self.start


@PlanCached
def indexer_task_plan(lengths: tuple[int, ...], size: int, ratio: int, mode: str,
                      block_size: int | None = None, zigzag_min_length: int | None = None,
                      **strategy_params: Any) -> tuple:
    """Assign real queries using zigzag, greedy or a shared-budget hybrid plan.

    Cached like the seed's (``cache_info()``, ``cache_clear()``; the same inputs return the
    same tuple), in the one cache that ``indexer_route`` uses too.

    Args:
        lengths: Global document lengths in packed order.
        size: CP group size; total packed tokens must divide this value.
        ratio: Compression ratio used by the unchanged Indexer kernel.
        mode: 'zigzag' pairs document tails and heads after removing the leading
            remainder; 'greedy' weights blocks by the number of causal Q/K pairs;
            'hybrid' keeps long-document zigzag fragments and greedily places
            their leading remainders together with all shorter documents. sparsecp also
            accepts 'none' (every rank keeps its rows) and its own strategies
            (``sparsecp.strategies()``: 'spill', 'auto', ...).
        block_size: Maximum original query rows per greedy task, before adjacent
            tasks assigned to one rank are merged. Greedy/hybrid default to 2048.
            Explicit values require greedy/hybrid and must be positive and at most local Q
            to guarantee its per-worker row bound. Omit this option for zigzag.
        zigzag_min_length: Hybrid-only minimum document length in original tokens.
            Must be specified explicitly. Eligible fragments remain whole,
            independently of block_size. Documents shorter than 2*size enter the
            greedy pool because they have no complete zigzag fragments.
        **strategy_params: sparsecp strategies only: their parameters
            (``sparsecp.strategy_params``), e.g. ``target_imbalance`` for 'spill'.

    Returns:
        A sorted, disjoint task list (tuple of IndexerTask) for each rank. Greedy/hybrid
        cap each worker at twice the original local query count; zigzag preserves equal
        row counts.
    """
    entry = planned(planning_inputs(lengths, size, ratio, mode, block_size, zigzag_min_length, strategy_params))
    return entry.tasks(lambda plan: tuple(tuple(IndexerTask(*task) for task in plan.tasks(rank))
                                          for rank in range(size)))


@PlanCached
def indexer_route(lengths: tuple[int, ...], size: int, rank: int, ratio: int, mode: str,
                  block_size: int | None = None, zigzag_min_length: int | None = None,
                  **strategy_params: Any) -> IndexerRoute:
    """Keep self-owned tasks local and communicate the remaining rows in owner order.

    Cached like the seed's (``cache_info()``, ``cache_clear()``): the same inputs return the
    same route object; every rank's route of one batch comes from one plan.

    Args:
        lengths: Shared document lengths in raw tokens.
        size: Number of ranks in the CP group.
        rank: Current rank within the CP group.
        ratio: Compression ratio used by the Indexer.
        mode: Zigzag, greedy or hybrid task allocation ('none' and sparsecp's strategies
            too, see indexer_task_plan).
        block_size: Maximum initial greedy-pool task size in Q rows.
        zigzag_min_length: Hybrid-only long-document threshold.
        **strategy_params: sparsecp strategies only: their parameters.

    Returns:
        Immutable input/result route with a local-task bypass.
    """
    if rank_outside(rank, size):  # the seed's first check, before the lengths are looked at
        raise ValueError("Indexer balance rank must be inside its CP group")
    entry = planned(planning_inputs(lengths, size, ratio, mode, block_size, zigzag_min_length, strategy_params))
    return entry.route(integer("rank", rank), IndexerRoute.from_core)


# --------------------------------------------------------------------------------------
# The seed's exchange entry points.

_SELECT_AXES_TEXT = "Indexer qr, weights and rotary embeddings must have matching batch/token axes and device"
_LAUNCH_AXES_TEXT = "Indexer qr, weights and rotary embeddings must share token axes and device"


@replayable("balanced_indexer_select")  # record / replay (sparsecp.torch.SelectionReplay)
@torch.no_grad()
def balanced_indexer_select(query_residual: torch.Tensor, weights: torch.Tensor,
                            position_embeddings: tuple[torch.Tensor, torch.Tensor], selector: Callable,
                            lengths: tuple[int, ...], ratio: int, mode: str, group: Any,
                            block_size: int | None = None, zigzag_min_length: int | None = None, *,
                            routes: Any = None, **strategy_params: Any) -> torch.Tensor:
    """Redistribute low-rank selection inputs and return TopK to the original owners.

    Args:
        query_residual: Local low-rank query residual [1, local tokens, q_lora_rank].
        weights: Local merge weights [1, local tokens, heads].
        position_embeddings: Original per-token cos/sin, each [1, local tokens, rotary/2].
            All payload dtypes are preserved; tensors of equal dtype share a collective.
        selector: Callable (qr, weights, (cos, sin), segments) that projects Indexer Q
            with the current layer parameters and selects against the planned Index K bank
            (``sparsecp.torch.IndexerSelector`` is one). It runs without autograd; owner-side
            Q and weights retain their KL gradients. Returns [1, worker rows, topk].
        lengths: Global original document lengths; no per-document CP padding is added.
        ratio: Compression ratio used by this selection layer.
        mode: 'zigzag', 'greedy' or 'hybrid' (or 'none', 'spill', 'auto', ...), identical
            on all CP ranks.
        group: Original sequence-ordered CP process group.
        block_size: Greedy task length in original query rows; see indexer_task_plan.
        zigzag_min_length: Hybrid-only minimum original document length.
        routes: This batch's routes from ``sparsecp.torch.prebuild`` (made ahead, e.g. in
            the data loader): nothing is planned here; with a capacity, the fixed-capacity
            exchange (``_prebuilt.py``: staging buffers reused every step; the ids
            returned are a copy).
        **strategy_params: sparsecp strategies only: their parameters.

    Returns:
        This rank's own rows' selected ids, [1, local tokens, topk] (the selector's dtype,
        int32 for sparsecp's selectors).

    Raises:
        ValueError: on every rank, when any rank's inputs are invalid or the ranks' inputs
            differ (the seed's texts for the checks it has).
    """
    inputs = (query_residual, weights, *position_embeddings)
    exchange = _launch_inputs(inputs, lengths, ratio, mode, group, block_size, zigzag_min_length, strategy_params,
                              _SELECT_AXES_TEXT, routes)
    balanced_qr, balanced_weights, cos, sin = exchange.wait()
    # A selector failing on one rank must not leave its peers in the result exchange.
    selected, failure = capture(lambda: selector(balanced_qr, balanced_weights, (cos, sin), exchange.route.segments)[0])
    return exchange._launch_result(selected, failure).wait().unsqueeze(0)


@replayable("launch_indexer_inputs")  # record / replay (sparsecp.torch.SelectionReplay)
@torch.no_grad()
def launch_indexer_inputs(
    query_residual: torch.Tensor, weights: torch.Tensor, embeddings: tuple,
    lengths: tuple[int, ...], ratio: int, mode: str, group: Any,
    block_size: int | None = None, zigzag_min_length: int | None = None, *,
    routes: Any = None, **strategy_params: Any,
) -> IndexerInputExchange:
    """Launch all selection input fields without waiting for worker readiness.

    Args:
        query_residual: Owner qr, shaped [1, local Q, q_lora_rank].
        weights: Owner Indexer merge weights [1, local Q, heads].
        embeddings: Original cos/sin, each [1, local Q, rotary/2]; retain their dtypes and
            positions.
        lengths: Global document lengths for contiguous CP ownership.
        ratio: Key compression ratio.
        mode: Existing zigzag, greedy or hybrid task assignment (or 'none', 'spill',
            'auto', ...).
        group: CP process group.
        block_size: Greedy task length in original query rows.
        zigzag_min_length: Hybrid long-document threshold.
        routes: This batch's routes from ``sparsecp.torch.prebuild``: nothing is planned
            here; with a capacity, the fixed-capacity exchange (a ``FixedInputExchange``,
            same interface).
        **strategy_params: sparsecp strategies only: their parameters.

    Returns:
        Single-use handle retaining transfer storage until wait.
    """
    inputs = (query_residual, weights, *embeddings)
    return _launch_inputs(inputs, lengths, ratio, mode, group, block_size, zigzag_min_length, strategy_params,
                          _LAUNCH_AXES_TEXT, routes)


def _launch_inputs(inputs: tuple, lengths: Any, ratio: int, mode: str, group: Any, block_size: int | None,
                   zigzag_min_length: int | None, params: dict[str, Any], axes_text: str,
                   routes: Any = None) -> IndexerInputExchange:
    """Check and agree, then launch every dtype group of the inputs to the workers."""
    if routes is not None:  # prebuilt at data time: nothing planned here
        return launch_prebuilt(inputs, lengths, ratio, mode, group, block_size, zigzag_min_length, params,
                               axes_text, routes)
    route = launch_checks(inputs, lengths, ratio, mode, group, block_size, zigzag_min_length, params, axes_text,
                          IndexerRoute.from_core)
    return launch_on_route(inputs, route, group)
