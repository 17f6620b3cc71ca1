"""What every model's public module exports alike (``from .._cp.public import *``), and the
factory of its ``context_parallel``."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .engine import apply, balance_report, check_weights, context_parallel_state, indexer_kl_loss, undo_context_parallel
from .options import ContextParallelOptions
from .report import BalanceReport
from .state import ContextParallelState, ContextParallelStats
from .training import (
    ShardLabels,
    all_reduce_gradients,
    causal_lm_loss,
    count_valid_tokens,
    pack_rows,
    pad_to_multiple,
    shard_batch,
    shard_labels,
)

__all__ = ["BalanceReport", "ContextParallelOptions", "ContextParallelState", "ContextParallelStats", "ShardLabels",
           "all_reduce_gradients", "balance_report", "causal_lm_loss", "check_weights", "context_parallel_state",
           "count_valid_tokens", "indexer_kl_loss", "pack_rows", "pad_to_multiple", "shard_batch", "shard_labels",
           "undo_context_parallel"]


def entry_point(make_adapter: Callable[[], Any], module: str, doc: str) -> Callable[..., Any]:
    """A model's ``context_parallel`` (of ``module``, documented by ``doc``) over the adapter
    ``make_adapter()`` makes."""
    def context_parallel(model: Any, group: Any = None, mode: str = "spill", *, block_size: int | None = None,
                         zigzag_min_length: int | None = None, selector: str = "model",
                         indexer_kl_coeff: float | None = None, attention_backend: str | None = None,
                         calibrate: bool | str = True, options: ContextParallelOptions | None = None,
                         **strategy_params: Any) -> Any:
        given = dict(mode=mode, block_size=block_size, zigzag_min_length=zigzag_min_length, selector=selector,
                     indexer_kl_coeff=indexer_kl_coeff, attention_backend=attention_backend, calibrate=calibrate)
        return apply(model, make_adapter(), group, ContextParallelOptions.from_arguments(options, given,
                                                                                        strategy_params))
    context_parallel.__doc__, context_parallel.__module__ = doc, module
    context_parallel.__qualname__ = "context_parallel"
    return context_parallel
