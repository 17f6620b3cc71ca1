"""sparsecp: context-parallel load balancing for DeepSeek-style compressed sparse attention.

This package needs no torch: it plans. Which CP rank runs the Lightning Indexer's top-k
selection for which query rows of a packed batch (``plan``), and how one rank's rows move
(``route``), computed by sparsecp's C++ planners: the seed's modes (``none``, ``zigzag``,
``greedy``, ``hybrid``, bit-exact), sparsecp's own (``spill``, ``auto``) and the peers'
(``per-doc-zigzag``, ``round-robin``, ``snake``, ``lpt-search``); ``strategies()`` lists
them. The KV dispatch routes of main attention are here too (``sliding_window_route``,
``document_prefix_route``).

``sparsecp.torch`` is the seed's PyTorch module (Huawei hyper_parallel's
``indexer_balance``), drop-in: ``import sparsecp.torch as indexer_balance``.

Example::

    import sparsecp
    plan = sparsecp.plan([5000, 300, 2699, 1], cp=4, ratio=4, mode="spill")
    plan.imbalance, plan.rows_moved, plan.imbalance_bound, plan.rows_moved_bound
    route = sparsecp.route(plan, [5000, 300, 2699, 1], cp=4, rank=1, ratio=4)
    route.send_rows        # numpy int64, the seed's IndexerRoute.send_rows
"""
from __future__ import annotations

import operator
import os
from typing import Any, NamedTuple, Sequence, Union

from . import _core
from ._core import (
    CostModel,
    Plan,
    PlanningFingerprint,
    Route,
    RowBytes,
    SequenceDispatchRoute,
    StrategyParams,
    compressed_document_offsets,
    compressed_owner_offsets,
    document_boundaries,
    document_prefix_route,
    generate_batch,
    load_cost_model,
    save_cost_model,
    sliding_window_route,
)

__version__ = "0.2.0"

__all__ = [
    "CostModel",
    "Plan",
    "PlanningFingerprint",
    "Route",
    "RowBytes",
    "SequenceDispatchRoute",
    "Strategy",
    "StrategyParams",
    "compressed_document_offsets",
    "compressed_owner_offsets",
    "document_boundaries",
    "document_prefix_route",
    "generate_batch",
    "kernel_isa",
    "load_cost_model",
    "plan",
    "route",
    "save_cost_model",
    "sliding_window_route",
    "strategies",
    "strategy_params",
]


class Strategy(NamedTuple):
    """A registered balancing strategy (``sparsecp simulate --list`` shows the same)."""

    name: str
    source: str
    summary: str
    unit: str


def strategies() -> list[Strategy]:
    """Every registered strategy, in listing order: the seed's modes, the peers, sparsecp's own."""
    return [Strategy(name, source, summary, unit) for name, source, summary, unit, _ in _core.strategies()]


_PARAMETERS = tuple(name for name in dir(StrategyParams) if not name.startswith("_") and name != "validate")


def _cost_model(value: Any) -> CostModel:
    """A CostModel from a model, a file path, or (a, b, c, topk)."""
    if isinstance(value, CostModel):
        return value
    if isinstance(value, (str, os.PathLike)):
        return load_cost_model(os.fspath(value))
    a, b, c, topk = value
    return CostModel.linear(float(a), float(b), float(c), operator.index(topk))


def strategy_params(**params: Any) -> StrategyParams:
    """StrategyParams from keywords: block_size, zigzag_min_length, target_imbalance,
    max_received_fragments, cost_model (a CostModel, a file from ``sparsecp calibrate``, or
    (a, b, c, topk)), bandwidth_gbps, row_bytes (a RowBytes or a dict of its fields),
    wlb_split_length, snake_block, lpt_align, lpt_row_cap, lpt_search_steps,
    lpt_fragment_cap, lpt_cost ("magi" or "causal"), window, topk.

    Raises:
        TypeError: an unknown parameter name or a value of the wrong type.
        ValueError: an invalid value (the C++ validation's text).
    """
    result = StrategyParams()
    for name, value in params.items():
        if name not in _PARAMETERS:
            raise TypeError(f"unknown strategy parameter '{name}' (known: {', '.join(_PARAMETERS)})")
        if name == "cost_model" and value is not None:
            value = _cost_model(value)
        elif name == "row_bytes" and isinstance(value, dict):
            row_bytes = RowBytes()
            for field, number in value.items():
                setattr(row_bytes, field, number)
            value = row_bytes
        setattr(result, name, value)
    result.validate()
    return result


def _lengths(lengths: Sequence[int]) -> tuple[int, ...]:
    """Document lengths as a tuple of Python ints (rejects floats and other non-integers)."""
    if type(lengths) is tuple:
        return lengths
    return tuple(map(operator.index, lengths))


def plan(lengths: Sequence[int], cp: int, ratio: int, mode: str = "zigzag", **strategy_params_: Any) -> Plan:
    """Plan a packed batch with any registered strategy.

    Args:
        lengths: Document lengths in packed order; their sum must divide by ``cp``.
        cp: CP group size.
        ratio: Compression ratio of the layer (one key per ``ratio`` raw tokens).
        mode: A strategy name (``strategies()``); the seed's modes plan exactly as the seed,
            with unset options resolved per batch (greedy/hybrid block
            ``min(2048, local rows)``, hybrid ``zigzag_min_length`` = local rows).
        **strategy_params_: See ``strategy_params``.

    Returns:
        A Plan: ``tasks(rank)`` (list of (document, start, end)), ``rows`` and ``work`` per
        rank (numpy int64), ``imbalance`` (max work / mean), ``rows_moved``, and two lower
        bounds: ``imbalance_bound`` (no row-granular plan can balance better) and
        ``rows_moved_bound`` (the fewest rows any plan as balanced as this one must move);
        ``unit_bound`` is the bound at the strategy's own granularity.

    Raises:
        ValueError: invalid lengths, cp, ratio or parameters, or an unknown strategy (the
            message lists the registered ones).
    """
    lengths = _lengths(lengths)
    made = _core.plan_strategy(mode, lengths, cp, ratio, strategy_params(**strategy_params_))
    made.batch = (lengths, cp, ratio)  # what route() checks its arguments against
    return made


def route(plan_or_mode: Union[Plan, str], lengths: Sequence[int], cp: int, rank: int, ratio: int,
          **strategy_params_: Any) -> Route:
    """One rank's route under a plan, or under a strategy named by ``plan_or_mode``.

    The route's fields carry the seed's IndexerRoute names as read-only numpy int64
    arrays (views of the C++ route, no copy): ``segments`` [n, 5] (q_begin, q_end,
    key_begin, key_end, residual), ``input_splits``, ``output_splits``, ``send_rows``,
    ``receive_rows``, ``local_sources``, ``local_targets``, and ``query_count`` (int).

    Raises:
        ValueError: a rank outside [0, cp), inputs the plan was not made for, or anything
            ``plan`` rejects.
    """
    lengths = _lengths(lengths)
    if isinstance(plan_or_mode, Plan):
        made = plan_or_mode
        if strategy_params_:
            raise TypeError("route(plan, ...) takes no strategy parameters: the plan is made")
        batch = getattr(made, "batch", None) or (tuple(made.lengths.tolist()), made.cp, made.ratio)
        if batch[1] != cp or batch[2] != ratio or (batch[0] is not lengths and batch[0] != lengths):
            raise ValueError(
                f"route: the plan was made for cp {made.cp}, ratio {made.ratio} and "
                f"{len(made.lengths)} documents, got cp {cp}, ratio {ratio} and {len(lengths)} documents"
            )
        return _core.route_from_plan(made, rank)
    return _core.route_strategy(plan_or_mode, lengths, cp, rank, ratio, strategy_params(**strategy_params_))


def kernel_isa() -> str:
    """The SIMD kernels the CPU selection and KL loss run (avx512, avx2 or portable).

    The environment variable ``SPARSECP_ISA`` (portable, avx2, avx512) forces one, for
    every kernel called with ``isa="auto"``; an ISA the CPU lacks raises ValueError.
    """
    return _core.kernel_isa()
