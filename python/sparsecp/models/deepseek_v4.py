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
``dp_shard_cp``), with no hand all-reduce; the order matters (``_cp_training``'s docstring,
docs/guide/deepseek-v4.md "Training with FSDP2 over data x context")::

    cp_v4.context_parallel(model, mesh["cp"], mode="spill")       # a 1-D DeviceMesh or a group
    for layer in model.model.layers:
        fully_shard(layer, mesh=flat)                              # flat = mesh["dp", "cp"]._flatten()
    fully_shard(model, mesh=flat)
    labels = cp_v4.shard_labels(input_ids, lengths, mesh["cp"], labels=user_labels)  # -100 kept
    loss = cp_v4.causal_lm_loss(out.logits, labels, lengths, group=flat)  # for FSDP2's mean

``out.logits`` are this rank's rows' logits, equal to the unmodified model run on each
document alone (not to the model run on the packed row, which attends across documents).
Per attention layer (``_v4_attention.py``): the sliding-window halo and each document's
compressed-bank prefix come from lower ranks (backward SUMs into the owners), each rank
compresses the windows it owns, and the CSA indexer's selection is balanced across ranks with
``balanced_indexer_select`` (``mode``: 'none', 'zigzag', 'greedy', 'hybrid', 'spill', ...).

The indexer's training signal (transformers' indexer has none: its ``topk`` gives no gradient):
``context_parallel(..., indexer_kl_coeff=c)`` adds, per CSA layer, the seed's
``shared_compressed_indexer_kl_loss`` on each row's owner (at the model's ``index_topk``);
``indexer_kl_loss(model)`` returns this rank's share of their sum for the last forward, to add
to the loss. It only reaches indexer parameters and changes no logit.

Activation checkpointing (``model.gradient_checkpointing_enable()``, non-reentrant, the
transformers default) recomputes the layers without selecting again: each layer replays the ids
of its first forward (no selector call, no selection collective).

``ModelSelector`` and ``FusedSelector`` are the two worker selectors (``selector="model"`` /
``"fused"``). With ``mode="spill"`` (or "auto") ``context_parallel`` calibrates spill's cost
model on the layer's own selector in the first forward (rank 0 times it, every rank plans with
its fit; cached per process) and refits it from every rank's measured selection times
(``_cp_calibration``); ``cost_model=`` (e.g. ``sparsecp.torch.calibrate`` over one of these
selectors) or ``calibrate=False`` skip that.

transformers is an optional dependency (``pip install 'sparsecp[models]'``), imported when a
function here is first called. The tested version is 5.23; any other runs only if the upstream
modules this integration re-implements have the same source (``UPSTREAM_FINGERPRINTS``),
otherwise ``ImportError`` names the version and the modules that differ.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from ..torch.attention import BACKENDS as ATTENTION_BACKENDS
from . import _cp_training
from ._cp_checks import agree_parameters, kl_coeff_option, refuse_labels, refuse_model_loss_under_cp
from ._cp_layer import BatchCheck, check_and_agree, indexer_kl_share
from ._cp_training import all_reduce_gradients, count_valid_tokens, pad_to_multiple, resolve_group
from ._v4_attention import cp_attention_forward
from ._v4_calibration import v4_calibration
from ._v4_selector import FusedSelector, ModelSelector
from ._v4_state import ContextParallelState, ContextParallelStats

__all__ = [
    "ContextParallelState",
    "ContextParallelStats",
    "FusedSelector",
    "ModelSelector",
    "all_reduce_gradients",
    "causal_lm_loss",
    "context_parallel",
    "context_parallel_state",
    "count_valid_tokens",
    "indexer_kl_loss",
    "pad_to_multiple",
    "router_aux_loss",
    "shard_batch",
    "shard_labels",
]

TRANSFORMERS_NEEDED = "5.23"
# The transformers objects this integration re-implements or relies on (the attention layer,
# its compressors, indexer and rotary; the model's forward, which takes our attention_mask
# sentinel; the router and the load-balancing loss reproduced under CP), with the SHA-256 of
# their source in transformers 5.23 (``_cp_training.upstream_fingerprints``). Another version
# runs only if all of them are unchanged; otherwise ``_modeling()`` refuses it, naming them.
UPSTREAM_FINGERPRINTS = {
    "DeepseekV4Attention": "7488877da3dee472",
    "DeepseekV4HCACompressor": "6ae7fd0c744b3a24",
    "DeepseekV4CSACompressor": "d2ca031682522c3a",
    "DeepseekV4Indexer": "f9ce58af472da7b8",
    "DeepseekV4IndexerScorer": "e80cbb0e2d1871c3",
    "DeepseekV4RotaryEmbedding": "ac6fc29ea41ec20a",
    "apply_rotary_pos_emb": "d938fef910b008b2",
    "rotate_half": "cb42e3220a99f5f5",
    "DeepseekV4DecoderLayer": "b88513b6cbf223d8",
    "DeepseekV4Model": "057830a0476866cb",
    "DeepseekV4ForCausalLM": "6e03d45f66692675",
    "DeepseekV4TopKRouter": "4af59fb0446362f2",
    "load_balancing_loss_func": "ba57772e23a0d78b",
}
_SELECTORS = ("model", "fused")


def _modeling() -> Any:
    """transformers' DeepSeek-V4 modeling module, with a clear error when it is missing or its
    modules differ from transformers 5.23's (the tested version; see UPSTREAM_FINGERPRINTS)."""
    try:
        from transformers.models.deepseek_v4 import modeling_deepseek_v4
    except ImportError as error:
        try:
            import transformers
            found = f"transformers {transformers.__version__} has no DeepseekV4"
        except ImportError:
            found = "transformers is not installed"
        raise ImportError(f"sparsecp.models.deepseek_v4 needs transformers >= {TRANSFORMERS_NEEDED} "
                          f"(DeepseekV4ForCausalLM): {found}; pip install 'transformers>={TRANSFORMERS_NEEDED}' "
                          "or pip install 'sparsecp[models]'") from error
    _cp_training.check_upstream(modeling_deepseek_v4, UPSTREAM_FINGERPRINTS, TRANSFORMERS_NEEDED,
                                "sparsecp.models.deepseek_v4")
    return modeling_deepseek_v4


def _group_shape(group: Any) -> tuple[int, int]:
    return _cp_training.group_shape(group, "CP group")


def context_parallel_state(model: Any) -> ContextParallelState | None:
    """The state ``context_parallel`` attached to ``model`` (None when it is not context-parallel)."""
    return getattr(model, "_sparsecp_context_parallel", None)


def context_parallel(model: Any, group: Any = None, mode: str = "spill", *, block_size: int | None = None,
                     zigzag_min_length: int | None = None, selector: str = "model",
                     indexer_kl_coeff: float | None = None,
                     attention_backend: str | None = None, **strategy_params: Any) -> Any:
    """Make a ``DeepseekV4ForCausalLM`` / ``DeepseekV4Model`` context-parallel over ``group``, in place.

    Args:
        model: transformers' DeepSeek-V4 model, the same weights on every rank, not yet
            sharded (replicated: reduce gradients with ``all_reduce_gradients``; or call
            ``fully_shard`` over the dp x cp mesh after this call).
        group: The CP process group (None: the default group) or a 1-D DeviceMesh (``mesh["cp"]``),
            in sequence-shard rank order; a mesh of more dimensions is refused.
        mode: The indexer selection's balancing strategy, as ``balanced_indexer_select`` takes
            it: the seed's 'zigzag', 'greedy', 'hybrid', or 'none' and sparsecp's own
            ('spill', 'auto', ...).
        block_size, zigzag_min_length, **strategy_params: The strategy's options (the seed's
            names; sparsecp strategies' parameters). For 'spill' and 'auto', without
            ``cost_model=``, the cost model is calibrated on the layer's own selector in the
            first forward (cached per process) and refitted from every rank's measured
            selection times: ``calibrate=False`` turns that off, ``calibrate="once"`` keeps
            the first fit (``context_parallel_state(model).calibration.report``).
        selector: Where workers score rows: 'model' (the model's own indexer math in torch,
            any device and dtype) or 'fused' (sparsecp's fused C++ kernel, CPU, float32).
        indexer_kl_coeff: Enables the indexer KL loss with this coefficient (the seed's
            ``loss_coeff``, over the whole packed sequence: ``coeff / S`` times the sum of row
            losses); read it with ``indexer_kl_loss(model)``.
        attention_backend: ``sparsecp.torch.sparse_attention``'s backend for every attention layer:
            None (default) picks per input (the C++ kernel for CPU tensors; on a GPU FlashMLA's
            forward or cuDNN-frontend's backward where installed and able, then Triton; else the
            chunked torch path); 'cpu', 'flashmla', 'cudnn', 'triton' or 'torch' forces one. The
            one taken is ``context_parallel_state(model).attention_path``.

    Returns:
        ``model``, whose forward now takes this rank's shard (``shard_batch``) and
        ``document_lengths=`` and returns this rank's rows. ``config.use_cache`` is set to
        False: generation (a KV cache) is out of scope.

    Raises:
        TypeError: ``model`` is not a transformers DeepSeek-V4 model.
        ValueError: the model is already context-parallel or already sharded by ``fully_shard``,
            ``group`` is a mesh of more than one dimension, or an option is invalid.
    """
    modeling = _modeling()
    _cp_training.refuse_fsdp_before(model, "context_parallel")
    group = resolve_group(group, "context_parallel's group")  # a 1-D DeviceMesh gives its group
    base = model.model if isinstance(model, modeling.DeepseekV4ForCausalLM) else model
    if not isinstance(base, modeling.DeepseekV4Model):
        raise TypeError(f"context_parallel needs a transformers DeepseekV4ForCausalLM or DeepseekV4Model, got "
                        f"{type(model).__name__}")
    if context_parallel_state(model) is not None or context_parallel_state(base) is not None:
        raise ValueError("this DeepSeek-V4 model is already context-parallel (context_parallel was called on it)")
    if selector not in _SELECTORS:
        raise ValueError(f"selector must be one of {_SELECTORS}, got {selector!r}")
    indexer_kl_coeff = kl_coeff_option(indexer_kl_coeff)
    if attention_backend is not None and attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS} or None, got {attention_backend!r}")
    if not isinstance(mode, str) or not mode:
        raise ValueError(f"mode must be a strategy name, got {mode!r}")
    size, rank = _group_shape(group)
    config = base.config
    state = ContextParallelState(
        group=group, size=size, rank=rank, mode=mode, block_size=block_size, zigzag_min_length=zigzag_min_length,
        strategy_params=dict(strategy_params), selector=selector,
        kl_coeff=indexer_kl_coeff, window=int(config.sliding_window),
        rope_dim=int(config.qk_rope_head_dim), rope=modeling.apply_rotary_pos_emb)
    # -- spill's cost model on the layer's own selector (_cp_calibration: issue 36) --
    calibrate = state.strategy_params.pop("calibrate", True)
    # --
    state.attention_backend = attention_backend
    _check_strategy(state, config)
    agree_parameters(base, group, "context_parallel")
    compressions = set()
    for layer in base.layers:
        attention = layer.self_attn
        attention.forward = functools.partial(cp_attention_forward, attention, state)
        if attention.compressor is not None:
            compressions.add((int(attention.compressor.compress_rate), hasattr(attention.compressor, "indexer")))
    state.compressions = tuple(sorted(compressions))
    if state.kl_coeff is not None and not any(overlap for _, overlap in state.compressions):
        raise ValueError(f"indexer_kl_coeff={indexer_kl_coeff} trains the Lightning Indexer, but this model has no "
                         "compressed sparse attention layer (no indexer): leave indexer_kl_coeff unset")
    state.calibration = v4_calibration(state, base, calibrate)  # checks calibrate=; None without a CSA layer
    config.use_cache = False
    refuse_model_loss_under_cp()
    _whole_row_load_balancing(modeling)
    base.register_forward_pre_hook(functools.partial(_before_model_forward, state), with_kwargs=True)
    base.register_forward_hook(functools.partial(_after_model_forward, state))
    if model is not base:
        model.register_forward_pre_hook(_before_causal_lm_forward, with_kwargs=True)
    base._sparsecp_context_parallel = state
    model._sparsecp_context_parallel = state
    _cp_training.note_cp_group(group)  # the legacy causal_lm_loss checks its labels over it
    return model


def _check_strategy(state: ContextParallelState, config: Any) -> None:
    """The strategy's name and options, checked here (on a one-document plan whose shards fit any
    block size) rather than in the first forward."""
    from ..torch import indexer_route

    ratio = int(config.compress_rates.get("compressed_sparse_attention", 4))
    local = max(4096, 2 * int(state.block_size or 0))
    indexer_route((state.size * local,), state.size, state.rank, ratio, state.mode, state.block_size,
                  state.zigzag_min_length, **state.strategy_params)


def _before_causal_lm_forward(module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    refuse_labels("deepseek_v4", args, kwargs)


_ROUTER_STATE = "_sparsecp_router_state"  # on a CP forward's router logits: the state (its CP group)
_WHOLE_ROW = "_sparsecp_whole_row"  # on a load-balancing loss of the whole packed row


def _after_model_forward(state: ContextParallelState, module: Any, args: tuple, output: Any) -> Any:
    """Tags the router logits of a CP forward (``output_router_logits``) with the state, so that
    the load-balancing loss made of them, whichever module makes it, is the whole packed row's."""
    logits = getattr(output, "router_logits", None)
    if logits:
        for tensor in logits:
            if isinstance(tensor, torch.Tensor):
                setattr(tensor, _ROUTER_STATE, state)
    return output


def _router_state(gate_logits: Any) -> ContextParallelState | None:
    if isinstance(gate_logits, (tuple, list)) and gate_logits:
        return getattr(gate_logits[0], _ROUTER_STATE, None)
    return None


def _whole_row_load_balancing(modeling: Any) -> None:
    """transformers' ``load_balancing_loss_func`` (the one ``DeepseekV4ForCausalLM.forward`` calls
    for ``aux_loss``) gives the whole packed row's loss for a CP forward's router logits, however
    the CP model was wrapped: ``context_parallel(model.model)`` leaves the outer CausalLM
    unhooked, and its ``aux_loss`` was each shard's own (the loss is a product of two batch
    statistics, not a sum over rows). Wrapped once per process; router logits that no CP forward
    tagged go to transformers' function unchanged."""
    original = modeling.load_balancing_loss_func
    if getattr(original, _WHOLE_ROW, False):
        return

    @functools.wraps(original)
    def load_balancing_loss_under_cp(gate_logits: Any, num_experts: Any = None, top_k: Any = 2,
                                     attention_mask: Any = None) -> Any:
        state = _router_state(gate_logits)
        if state is None:
            return original(gate_logits, num_experts, top_k, attention_mask)
        loss = _cp_training.load_balancing_loss(gate_logits, int(num_experts), int(top_k), state.group,
                                                row_mask=attention_mask)
        setattr(loss, _WHOLE_ROW, True)
        return loss

    setattr(load_balancing_loss_under_cp, _WHOLE_ROW, True)
    modeling.load_balancing_loss_func = load_balancing_loss_under_cp


def router_aux_loss(output: Any, model: Any) -> torch.Tensor:
    """The MoE load-balancing loss of the whole packed row (what the model's ``aux_loss`` is on
    one process), from ``model(..., output_router_logits=True)``'s output.

    Under CP ``output.aux_loss`` already is this value (the model's own would be of this rank's
    rows only; the loss is a product of two batch statistics, not a sum over rows), whether
    ``context_parallel`` was given the CausalLM or its ``.model`` (then the outer CausalLM's
    ``aux_loss`` too): the router statistics are all-reduced over the CP group first
    (``_cp_training.load_balancing_loss``). ``model``: the CP model, or a CausalLM whose
    ``.model`` is. Every CP rank holds the same value; add ``config.router_aux_loss_coef`` times
    it to each rank's loss when gradients are averaged (FSDP2 over dp x cp, DDP); with gradients
    summed over the CP ranks (``all_reduce_gradients`` without ``average``), divide it by the CP
    size. Padding documents count as rows, as in the model run without an attention mask."""
    if context_parallel_state(model) is None and context_parallel_state(getattr(model, "model", None)) is not None:
        model = model.model
    state = _state(model)
    if getattr(output, "router_logits", None) is None:
        raise ValueError("router_aux_loss needs the output of model(..., output_router_logits=True)")
    aux = getattr(output, "aux_loss", None)
    if aux is not None and getattr(aux, _WHOLE_ROW, False):
        return aux
    config = model.config
    return _cp_training.load_balancing_loss(output.router_logits, int(config.num_local_experts),
                                            int(config.num_experts_per_tok), state.group)


def _before_model_forward(state: ContextParallelState, module: Any, args: tuple,
                          kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The forward's one agreement (``_cp_layer.check_and_agree``: the batch checked on every rank
    with one host read, one all-gather of every rank's verdict and fingerprint), then the batch's
    layout planned on the host and moved to the device once. The layers then run their
    collectives with no further agreement and no host round trip."""
    check = BatchCheck(model="DeepSeek-V4", group=state.group, size=state.size, rank=state.rank,
                       vocab=int(module.config.vocab_size),
                       positions=lambda lengths: state.batch(lengths).row_position,
                       options=(("mode", state.mode), ("indexer_kl_coeff", state.kl_coeff),
                                ("selector", state.selector)))
    # The one all-gather also carries this rank's selector seconds of the last forward: spill's
    # cost-model refit (_cp_calibration) needs every rank's, with no collective of its own.
    times = None if state.calibration is None else state.calibration.local_times(state)
    agreed = check_and_agree(check, args, kwargs, times)
    if state.calibration is not None and state.size > 1:
        state.calibration.received_times(agreed.times)
    lengths = agreed.lengths
    state.stats.forwards += 1
    context = state.start_forward(lengths, agreed.tokens.device, agreed.padding_tokens)
    kwargs = dict(kwargs)
    # The forward's context travels to its layers in their keyword arguments; transformers hands a
    # checkpointed layer's recompute the same ones, so a recompute replays its own forward's ids.
    kwargs["sparsecp_forward"] = context
    kwargs["document_lengths"] = lengths  # a generator given by the caller is consumed once, here
    kwargs.pop("padding_tokens", None)  # ours: the model's forward does not take it
    kwargs["attention_mask"] = {"sparsecp": None}  # no [S, S] mask: the CP layers mask by document
    kwargs["use_cache"] = False
    return args, kwargs


def indexer_kl_loss(model: Any, group: Any = None) -> torch.Tensor | None:
    """This rank's share of the indexer KL of the last forward with gradients (sum over
    CSA layers), or None when ``indexer_kl_coeff`` was not given. Add it to the loss before
    ``backward()``; the shares of a CP group sum to the KL of its packed sequence. ``group``: the
    group gradients are averaged over (FSDP2's flattened dp x cp mesh, as ``causal_lm_loss``
    takes it): the share is then scaled by the CP size for that average (``_cp_layer.indexer_kl_share``)."""
    return indexer_kl_share(_state(model), group)


def _state(model: Any) -> ContextParallelState:
    state = context_parallel_state(model)
    if state is None:
        raise ValueError("this model is not context-parallel: call sparsecp.models.deepseek_v4.context_parallel first")
    return state


def _cp_shape(document_lengths: Any, tokens: int, group: Any) -> tuple[tuple[int, ...], int, int, int]:
    return _cp_training.shard_shape(document_lengths, tokens, group)


def shard_batch(input_ids: torch.Tensor, document_lengths: Any, group: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's contiguous shard of a packed sequence and its positions (``[1, S / cp]``
    each; ``group``: a ProcessGroup or 1-D DeviceMesh). See ``_cp_training.shard_batch``."""
    return _cp_training.shard_batch(input_ids, document_lengths, group)


def shard_labels(input_ids: torch.Tensor, document_lengths: Any, group: Any = None,
                 labels: torch.Tensor | None = None, ignore_index: int = -100) -> torch.Tensor:
    """Next-token labels of this rank's rows ``[1, S / cp]``, never crossing a document, from
    ``labels`` aligned with ``input_ids`` (``-100`` kept; None: ``input_ids``). See
    ``_cp_training.shard_labels``."""
    return _cp_training.shard_labels(input_ids, document_lengths, group, labels, ignore_index)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, document_lengths: Any = None,
                   ignore_index: int = -100, *, group: Any = None, num_items_in_batch: Any = None) -> torch.Tensor:
    """This rank's term of the mean next-token cross entropy over the valid tokens of the global
    batch: with ``group=`` (FSDP2's dp x cp mesh) scaled for gradients averaged over it; without,
    the legacy share for gradients summed over the CP group. See ``_cp_training.causal_lm_loss``."""
    return _cp_training.causal_lm_loss(logits, labels, document_lengths, ignore_index, group=group,
                                       num_items_in_batch=num_items_in_batch)
