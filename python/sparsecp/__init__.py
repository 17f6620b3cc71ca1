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

import operator as _operator
import os as _os
from collections.abc import Sequence
from typing import Any, NamedTuple

from . import _core
from ._checks import integer, integer_list, optional_integer, real
from ._core import (
    CostModel,
    CostModelRefit,
    Plan,
    PlanningFingerprint,
    Route,
    RowBytes,
    SequenceDispatchRoute,
    StrategyParams,
    calibrate_cost_model,
    cost_sample,
    fit_cost_model,
    load_cost_model,
    save_cost_model,
)
from ._publish import publish as _publish

__version__ = "0.2.0"

__all__ = [
    "CostModel",
    "CostModelRefit",
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
    "attention_gemm",
    "blas_core",
    "select_gemm",
    "calibrate_cost_model",
    "cost_sample",
    "fit_cost_model",
    "load_cost_model",
    "owner_cost",
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
    if isinstance(value, (str, _os.PathLike)):
        return load_cost_model(_os.fspath(value))
    a, b, c, topk = value
    return CostModel.linear(float(a), float(b), float(c), _operator.index(topk))


def strategy_params(**params: Any) -> StrategyParams:
    """StrategyParams from keywords: block_size, zigzag_min_length, target_imbalance,
    max_received_fragments, ranks_per_node (spill's node map: consecutive ranks per node,
    dividing the CP size; 0, the default, for none), cost_model (a CostModel, a file from
    ``sparsecp calibrate``, or (a, b, c, topk)), bandwidth_gbps, row_bytes (a RowBytes or a dict of its fields),
    wlb_split_length, snake_block, lpt_align, lpt_row_cap, lpt_search_steps,
    lpt_fragment_cap, lpt_cost ("magi" or "causal"), window, topk, owner_load (spill and
    auto: one number >= 0 per rank, each rank's unmovable owner-side load in the cost model's
    units, e.g. ``owner_cost`` of its KL loss; spill then balances selection + owner load).

    Raises:
        TypeError: an unknown parameter name or a value of the wrong type.
        ValueError: an invalid value (the C++ validation's text).
    """
    result = StrategyParams()
    for name, value in params.items():
        if name not in _PARAMETERS:
            raise TypeError(f"unknown strategy parameter '{name}' (known: {', '.join(_PARAMETERS)})")
        if name in _OPTIONAL_INTEGERS:
            value = optional_integer(name, value)
        elif name in _INTEGERS:
            value = integer(name, value)
        elif name in _REALS:
            value = real(name, value)
        if name == "cost_model" and value is not None:
            value = _cost_model(value)
        elif name == "owner_load":
            value = _reals(name, value)
        elif name == "row_bytes" and isinstance(value, dict):
            row_bytes = RowBytes()
            for field, number in value.items():
                setattr(row_bytes, field, number)
            value = row_bytes
        setattr(result, name, value)
    result.validate()
    return result


_OPTIONAL_INTEGERS = ("block_size", "zigzag_min_length", "wlb_split_length")
_INTEGERS = ("max_received_fragments", "ranks_per_node", "snake_block", "lpt_align", "lpt_search_steps",
             "lpt_fragment_cap", "window", "topk")
_REALS = ("target_imbalance", "bandwidth_gbps", "lpt_row_cap")


def _reals(name: str, values: Any) -> list[float]:
    """A sequence of numbers (a list, tuple or 1-D numpy array) as Python floats; the error
    names the entry."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name}={values!r}: expected a sequence of numbers, got {type(values).__name__}")
    return [real(f"{name}[{i}]", value) for i, value in enumerate(values)]


def owner_cost(lengths: Sequence[int], cp: int, ratio: int, a: float, c: float, topk: int = 512) -> list[float]:
    """Per rank, the owner-side cost of its contiguous rows: each owned row costs
    ``a + c * min(topk, visible keys)`` (the KL loss, which stays on each row's owner), in
    whatever unit ``a`` and ``c`` are in. Pass the result as ``owner_load`` (in the cost
    model's units) to spill or auto so the rank with the heaviest owner cost selects less.

    Raises:
        ValueError: invalid lengths, cp or ratio, or a, c negative or both 0.
    """
    model = CostModel.linear(real("a", a), 0.0, real("c", c), integer("topk", topk))
    return _core.owner_cost(_lengths(lengths), integer("cp", cp), integer("ratio", ratio), model)


def _lengths(lengths: Sequence[int], name: str = "lengths") -> tuple[int, ...]:
    """Document lengths as a tuple of Python ints (bools, floats and strings raise, naming
    the entry: ``_checks``)."""
    if (type(lengths) is tuple and all(type(length) is int for length in lengths)
            and (not lengths or (min(lengths) >= -(1 << 63) and max(lengths) < 1 << 63))):
        return lengths
    return integer_list(name, lengths)  # names the entry (beyond 64 bits too: it never reaches C++)


def sliding_window_route(boundaries: Sequence[int], local_length: int, size: int, rank: int,
                         window: int) -> SequenceDispatchRoute:
    """Seed ``sliding_window_route``: the raw-KV halo of sliding-window attention
    (planning/dispatch.hpp). Integer arguments follow ``_checks``."""
    return _core.sliding_window_route(_lengths(boundaries, "boundaries"), integer("local_length", local_length),
                                      integer("size", size), integer("rank", rank), integer("window", window))


def document_prefix_route(boundaries: Sequence[int], local_length: int, size: int, rank: int,
                          ratio: int) -> SequenceDispatchRoute:
    """Seed ``document_prefix_route``: compressed-KV document prefixes (ratio 1 or 2)."""
    return _core.document_prefix_route(_lengths(boundaries, "boundaries"), integer("local_length", local_length),
                                       integer("size", size), integer("rank", rank), integer("ratio", ratio))


def compressed_document_offsets(boundaries: Sequence[int], ratio: int) -> Any:
    """Seed ``compressed_document_offsets``: each document's compressed offset, and the total."""
    return _core.compressed_document_offsets(_lengths(boundaries, "boundaries"), integer("ratio", ratio))


def compressed_owner_offsets(boundaries: Sequence[int], ratio: int, local_length: int) -> Any:
    """Seed ``compressed_owner_offsets``: the compressed bank's physical layout."""
    return _core.compressed_owner_offsets(_lengths(boundaries, "boundaries"), integer("ratio", ratio),
                                          integer("local_length", local_length))


def document_boundaries(lengths: Sequence[int]) -> Any:
    """Document boundaries (0, cumulative lengths...) of positive document lengths."""
    return _core.document_boundaries(_lengths(lengths))


def generate_batch(distribution: str = "lognormal", tokens: int = 1 << 20, cp: int = 8, seed: int = 1,
                   scale: int = 0) -> Any:
    """Document lengths of a seeded generated batch (``sparsecp batch``)."""
    return _core.generate_batch(distribution, integer("tokens", tokens), integer("cp", cp),
                                integer("seed", seed, 0, (1 << 64) - 1), integer("scale", scale))


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
    cp, ratio = integer("cp", cp), integer("ratio", ratio)
    made = _core.plan_strategy(mode, lengths, cp, ratio, strategy_params(**strategy_params_))
    made.batch = (lengths, cp, ratio)  # type: ignore[attr-defined]  # a dynamic attribute: what route() checks
    return made


def _batch_difference(batch: tuple, lengths: tuple, cp: int, ratio: int) -> str:
    """What differs between the inputs a plan was made for and the ones given."""
    made_lengths, made_cp, made_ratio = batch
    parts = []
    if made_cp != cp:
        parts.append(f"cp {made_cp}, got {cp}")
    if made_ratio != ratio:
        parts.append(f"ratio {made_ratio}, got {ratio}")
    if tuple(made_lengths) != tuple(lengths):
        first = next((d for d, (a, b) in enumerate(zip(made_lengths, lengths)) if a != b), None)
        if first is not None:
            parts.append(f"document {first} has length {made_lengths[first]}, got {lengths[first]}")
        else:
            parts.append(f"{len(made_lengths)} documents, got {len(lengths)} (the first "
                         f"{min(len(made_lengths), len(lengths))} agree)")
    return "; ".join(parts)


def route(plan_or_mode: Plan | str, lengths: Sequence[int], cp: int, rank: int, ratio: int,
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
    cp, rank, ratio = integer("cp", cp), integer("rank", rank), integer("ratio", ratio)
    if isinstance(plan_or_mode, Plan):
        made = plan_or_mode
        if strategy_params_:
            raise TypeError("route(plan, ...) takes no strategy parameters: the plan is made")
        batch = getattr(made, "batch", None) or (tuple(made.lengths.tolist()), made.cp, made.ratio)
        if batch[1] != cp or batch[2] != ratio or (batch[0] is not lengths and batch[0] != lengths):
            difference = _batch_difference(batch, lengths, cp, ratio)
            raise ValueError(f"route: the plan was made for other inputs: {difference}")
        return _core.route_from_plan(made, rank)
    return _core.route_strategy(plan_or_mode, lengths, cp, rank, ratio, strategy_params(**strategy_params_))


def blas_core() -> str:
    """The OpenBLAS kernel family sparsecp's BLAS calls run on ("SkylakeX", "Haswell", ...).

    OpenBLAS picks it by CPU model when it loads; on a CPU newer than it knows (Debian 12's
    OpenBLAS 0.3.21 on recent Xeons) it falls back to its SSE3 kernels ("Prescott"), several
    times slower. Importing sparsecp then asks OpenBLAS to choose again with
    ``OPENBLAS_CORETYPE`` set to the newest family the CPU runs ("SkylakeX" with AVX-512,
    "Haswell" with AVX2), as the ``sparsecp`` tool does by restarting itself. Your own
    ``OPENBLAS_CORETYPE``, or ``SPARSECP_BLAS_AS_IS=1``, is left alone."""
    return str(_core.blas_core())


def kernel_isa() -> str:
    """The SIMD kernels the CPU selection and KL loss run (avx512, avx2 or portable).

    The environment variable ``SPARSECP_ISA`` (portable, avx2, avx512) forces one, for
    every kernel called with ``isa="auto"``; an ISA the CPU lacks raises ValueError.
    """
    return _core.kernel_isa()


def attention_gemm(dtype: str = "bfloat16", heads: int = 0) -> str:
    """What the sparse attention kernel multiplies ``dtype`` ("float32", "bfloat16", "float64")
    with on this CPU, for calls with ``heads`` query heads (0: more than 8): ``"onednn
    <version>"`` (AMX, AVX512_BF16 or AVX-512 as the CPU has them), ``"blas"`` (float64 always;
    bf16 widened where oneDNN has none or only its reference loops) or ``"direct"`` (float32 with
    1, 2, 4 or 8 heads on AVX-512 and AVX2 CPUs: the kernel's own vector loops, each row's kv
    rows read in place). ``SPARSECP_ATTENTION_GEMM=blas``
    puts the BLAS in oneDNN's place, ``=direct`` the loops wherever they apply."""
    return str(_core.sparse_attention_gemm(dtype, heads=heads))


def select_gemm() -> str:
    """What the CPU selection multiplies bfloat16 Index K with on this CPU (``isa="auto"``):
    ``"onednn <version>"`` (a block's logits over a key tile as one oneDNN product: the default
    where oneDNN's bf16 products run on AMX), ``"vdpbf16ps"`` (the avx512 kernel's own bf16 dot
    products: the default on AVX512_BF16 CPUs without AMX, where they measured faster) or
    ``"widened"`` (bf16 widened to float32 exactly, as float32 Index K is always multiplied).
    ``SPARSECP_SELECT_GEMM=onednn`` or ``=native`` overrides the choice."""
    return str(_core.select_bf16_products())

_publish(__name__, globals())  # help() names this module, not the private one defining it
