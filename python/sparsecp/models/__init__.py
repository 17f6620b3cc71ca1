"""sparsecp.models: models made context-parallel with sparsecp, on one engine.

* ``sparsecp.models.deepseek_v4``: transformers' ``DeepseekV4ForCausalLM`` (sliding window,
  CSA with a Lightning Indexer at ratio 4, HCA, sinks, MoE).
* ``sparsecp.models.deepseek_v32``: transformers' ``DeepseekV32ForCausalLM`` (MLA and DSA: an
  indexer over every earlier token).
* Any other model, through a ``ModelAdapter`` (docs/guide/your-model.md): ``context_parallel(model,
  adapter, group, ...)`` here.

transformers is an optional dependency (``pip install 'sparsecp[models]'``), imported when a
transformers model's ``context_parallel`` is first called; a version other than the tested one
(5.23) runs only if the modules an integration re-implements are unchanged.

The engine (``_cp/``): ``engine`` applies and undoes (each attention module's class swapped for
a cached ``ContextParallel<Name>`` subclass, a forward pre-hook on the model), ``agreement``
checks each forward's batch on every rank in one all-gather, ``state`` plans the batch and holds
the counters, ``rows`` and ``prefix`` move sequence-sharded rows, ``select`` and ``selector``
run the balanced selection and its replay under recompute, ``calibration`` fits spill's cost
model on the model's own selector, ``training`` holds batch and label shards, the loss over the
global batch and gradient reduction. docs/guide/architecture.md draws it.
"""
from __future__ import annotations

from typing import Any

from .._publish import publish as _publish
from ._cp import engine as _engine
from ._cp.adapter import ModelAdapter
from ._cp.engine import balance_report, check_weights, context_parallel_state, indexer_kl_loss, undo_context_parallel
from ._cp.forward import FORWARD_KWARG, ForwardContext, in_recompute
from ._cp.options import ContextParallelOptions
from ._cp.prefix import DevicePrefixLayout, PrefixLayout
from ._cp.report import BalanceReport
from ._cp.select import BankView, select_or_replay
from ._cp.selector import ChunkedTopKSelector, KernelSelector
from ._cp.state import ContextParallelState, ContextParallelStats
from ._cp.training import (
    ShardLabels,
    all_reduce_gradients,
    causal_lm_loss,
    count_valid_tokens,
    pack_rows,
    pad_to_multiple,
    shard_batch,
    shard_labels,
)

__all__ = [
    "FORWARD_KWARG",
    "BankView",
    "ChunkedTopKSelector",
    "BalanceReport",
    "ContextParallelOptions",
    "ContextParallelState",
    "ContextParallelStats",
    "DevicePrefixLayout",
    "ForwardContext",
    "KernelSelector",
    "ModelAdapter",
    "PrefixLayout",
    "ShardLabels",
    "all_reduce_gradients",
    "balance_report",
    "check_weights",
    "causal_lm_loss",
    "context_parallel",
    "context_parallel_state",
    "count_valid_tokens",
    "in_recompute",
    "indexer_kl_loss",
    "pack_rows",
    "pad_to_multiple",
    "select_or_replay",
    "shard_batch",
    "shard_labels",
    "undo_context_parallel",
]


def context_parallel(model: Any, adapter: ModelAdapter, group: Any = None, *,
                     options: ContextParallelOptions | None = None, **given: Any) -> Any:
    """Make ``model`` context-parallel over ``group`` (a ProcessGroup or 1-D DeviceMesh; None: the
    default group) through ``adapter``, in place. The options: ``options=`` or the
    ``ContextParallelOptions`` fields as keyword arguments (any other keyword is a strategy
    parameter). ``sparsecp.models.deepseek_v4.context_parallel`` is this with its adapter.

    Raises:
        TypeError: ``adapter`` does not implement ``ModelAdapter``, or refuses ``model``.
        ValueError: an option is invalid, the model is already context-parallel, or the ranks were
            given different options or hold different weights (on every rank).
    """
    if not isinstance(adapter, ModelAdapter):
        missing = [name for name in ("name", "module_name", "ratio", "base", "attention_modules", "prepare",
                                     "attention_forward", "layout", "vocab_size", "calibration", "install",
                                     "forward_kwargs") if not hasattr(adapter, name)]
        raise TypeError(f"adapter must implement sparsecp.models.ModelAdapter; {type(adapter).__name__} lacks "
                        f"{', '.join(missing)}")
    fields = set(ContextParallelOptions.__dataclass_fields__) - {"strategy_params"}
    named = {key: value for key, value in given.items() if key in fields}
    strategy = {key: value for key, value in given.items() if key not in fields}
    defaults = {name: ContextParallelOptions.__dataclass_fields__[name].default for name in fields}
    return _engine.apply(model, adapter, group,
                         ContextParallelOptions.from_arguments(options, {**defaults, **named}, strategy))

_publish(__name__, globals())  # help() names this module, not the private one defining it
