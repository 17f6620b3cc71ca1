"""Context parallelism for transformers' DeepSeek-V4 (``DeepseekV4ForCausalLM``), with sparsecp.

transformers (5.8 and later; this module tests 5.23) ships ``DeepseekV4ForCausalLM``: sliding-window attention,
compressed sparse attention (CSA: ratio 4, overlapped compressor windows, a Lightning Indexer
with its own compressor), heavily compressed attention (HCA), attention sinks, grouped output
projection, hyper-connections and hash / routed MoE, with no context parallelism. This module
makes it context-parallel over a process group, in place, for training on packed batches:

    from sparsecp.models import deepseek_v4 as cp_v4

    cp_v4.context_parallel(model, group, mode="spill")           # weights stay replicated
    ids, positions = cp_v4.shard_batch(input_ids, lengths, group)  # this rank's [1, S / cp]
    out = model(input_ids=ids, position_ids=positions, document_lengths=lengths)
    labels = cp_v4.shard_labels(input_ids, lengths, group)
    loss = cp_v4.causal_lm_loss(out.logits, labels, lengths)      # this rank's share
    loss.backward()
    cp_v4.all_reduce_gradients(model, group)                      # then optimizer.step()

Weights may instead be sharded by FSDP2 over the flattened dp x cp mesh (torchtitan's
``dp_shard_cp``), with no hand all-reduce; the order matters (``_cp/training.py``'s docstring,
docs/guide/deepseek-v4.md "Training with FSDP2 over data x context")::

    cp_v4.context_parallel(model, mesh["cp"], mode="spill")       # a 1-D DeviceMesh or a group
    for layer in model.model.layers:
        fully_shard(layer, mesh=flat)                              # flat = mesh["dp", "cp"]._flatten()
    fully_shard(model, mesh=flat)
    labels = cp_v4.shard_labels(input_ids, lengths, mesh["cp"], labels=user_labels)  # -100 kept
    loss = cp_v4.causal_lm_loss(out.logits, labels, lengths, group=flat)  # for FSDP2's mean

``out.logits`` are this rank's rows' logits, equal to the unmodified model run on each
document alone (not to the model run on the packed row, which attends across documents).
Per attention layer (``_attention.py``): the sliding-window halo and each document's
compressed-bank prefix come from lower ranks (backward SUMs into the owners), each rank
compresses the windows it owns, and the CSA indexer's selection is balanced across ranks with
``balanced_indexer_select`` (``mode``: 'none', 'zigzag', 'greedy', 'hybrid', 'spill', ...).

The indexer's training signal (transformers' indexer has none: its ``topk`` gives no gradient):
``context_parallel(..., indexer_kl_coeff=c)`` adds, per CSA layer, the seed's
``shared_compressed_indexer_kl_loss`` on each row's owner (at the model's ``index_topk``);
``indexer_kl_loss(model)`` returns this rank's share of their sum for the last forward, to add
to the loss. It only reaches indexer parameters and changes no logit.

Activation checkpointing (``model.activation_checkpointing_enable()``, non-reentrant, the
transformers default) recomputes the layers without selecting again: each layer replays the ids
of its first forward (no selector call, no selection collective).

``ModelSelector`` and ``FusedSelector`` are the two worker selectors (``selector="model"`` /
``"fused"``). With ``mode="spill"`` (or "auto") ``context_parallel`` calibrates spill's cost
model on the layer's own selector in the first forward (rank 0 times it, every rank plans with
its fit; cached in the process and on disk) and refits it from every rank's measured selection times
(``_cp/calibration.py``); ``cost_model=`` (e.g. ``sparsecp.torch.calibrate`` over one of these
selectors) or ``calibrate=False`` skip that.

transformers is an optional dependency (``pip install 'sparsecp[models]'``), imported when a
function here is first called. The tested version is 5.23; any other runs only if the upstream
modules this integration re-implements have the same source (``UPSTREAM_FINGERPRINTS``),
otherwise ``ImportError`` names the version and the modules that differ.
"""
from __future__ import annotations

from typing import Any

from torch import Tensor

from ..._publish import publish as _publish
from .._cp import engine as _engine
from .._cp import training as _training
from .._cp.public import *  # noqa: F403  (the functions every model exports)
from .._cp.public import __all__ as _public
from .._cp.public import context_parallel_state, entry_point
from .._cp.transformers_adapter import TRANSFORMERS_TESTED as TRANSFORMERS_NEEDED
from ._adapter import UPSTREAM_FINGERPRINTS, WHOLE_ROW, V4Adapter
from ._selector import FusedSelector, ModelSelector

__all__ = [*_public, "context_parallel", "V4Adapter", "router_aux_loss", "UPSTREAM_FINGERPRINTS",
           "TRANSFORMERS_NEEDED", "FusedSelector", "ModelSelector"]

context_parallel = entry_point(V4Adapter, __name__, """\
Make a ``DeepseekV4ForCausalLM`` / ``DeepseekV4Model`` context-parallel over ``group``, in place.

    Args:
        model: transformers' DeepSeek-V4 model, the same weights on every rank, not yet
            sharded (replicated: reduce gradients with ``all_reduce_gradients``; or call
            ``fully_shard`` over the dp x cp mesh after this call).
        group: The CP process group (None: the default group) or a 1-D DeviceMesh (``mesh["cp"]``),
            in sequence-shard rank order; a mesh of more dimensions is refused.
        mode, block_size, zigzag_min_length, selector, indexer_kl_coeff, attention_backend,
            calibrate, **strategy_params: The options (``sparsecp.models.ContextParallelOptions``
            documents each), or all of them at once as ``options=``. For 'spill' and 'auto',
            without ``cost_model=``, the cost model is calibrated on the layer's own selector in
            the first forward (cached in the process and on disk) and refitted from every rank's measured
            selection times (``context_parallel_state(model).calibration.report``). The
            attention backend taken is ``context_parallel_state(model).attention_path``.

    Returns:
        ``model``, whose forward now takes this rank's shard (``shard_batch``) and
        ``document_lengths=`` and returns this rank's rows; each attention module is a
        ``ContextParallelDeepseekV4Attention`` (``print(model)`` shows them) until
        ``undo_context_parallel(model)``. ``config.use_cache`` is False meanwhile: generation
        (a KV cache) is out of scope.

    Raises:
        TypeError: ``model`` is not a transformers DeepSeek-V4 model.
        ValueError: the model is already context-parallel or already sharded by ``fully_shard``,
            ``group`` is a mesh of more than one dimension, an option is invalid, or the ranks
            were given different options or hold different weights (raised on every rank).
    """)


def router_aux_loss(output: Any, model: Any) -> Tensor:
    """The MoE load-balancing loss of the whole packed row (what the model's ``aux_loss`` is on
    one process), from ``model(..., output_router_logits=True)``'s output.

    Under CP ``output.aux_loss`` already is this value (the model's own would be of this rank's
    rows only; the loss is a product of two batch statistics, not a sum over rows), whether
    ``context_parallel`` was given the CausalLM or its ``.model`` (then the outer CausalLM's
    ``aux_loss`` too): the router statistics are all-reduced over the CP group first
    (``_cp.training.load_balancing_loss``). ``model``: the CP model, or a CausalLM whose
    ``.model`` is. Every CP rank holds the same value; add ``config.router_aux_loss_coef`` times
    it to each rank's loss when gradients are averaged (FSDP2 over dp x cp, DDP); with gradients
    summed over the CP ranks (``all_reduce_gradients`` without ``average``), divide it by the CP
    size. Padding documents count as rows, as in the model run without an attention mask."""
    if context_parallel_state(model) is None and context_parallel_state(getattr(model, "model", None)) is not None:
        model = model.model
    state = _engine.state_of(model)
    if getattr(output, "router_logits", None) is None:
        raise ValueError("router_aux_loss needs the output of model(..., output_router_logits=True)")
    aux = getattr(output, "aux_loss", None)
    if aux is not None and getattr(aux, WHOLE_ROW, False):
        return aux
    config = model.config
    return _training.load_balancing_loss(output.router_logits, int(config.num_local_experts),
                                        int(config.num_experts_per_tok), state.group)

_publish(__name__, globals())  # help() names this module, not the private one defining it
