"""Context parallelism for transformers' DeepSeek-V3.2 (``DeepseekV32ForCausalLM``), with sparsecp.

transformers (5.23) ships ``DeepseekV32ForCausalLM``: multi-head latent attention (MLA), DeepSeek
Sparse Attention with a Lightning Indexer (``DeepseekV32Indexer``) that scores every earlier
token (compression ratio 1) and keeps its top ``index_topk`` (2048), and DeepSeek MoE, with no
context parallelism; on a packed row it attends across documents, and its indexer gets no
gradient. This module makes it context-parallel over a process group, in place, for training
on packed batches:

    from sparsecp.models import deepseek_v32 as cp_v32

    cp_v32.context_parallel(model, group, mode="spill")            # weights stay replicated
    ids, positions = cp_v32.shard_batch(input_ids, lengths, group)  # this rank's [1, S / cp]
    out = model(input_ids=ids, position_ids=positions, document_lengths=lengths)
    labels = cp_v32.shard_labels(input_ids, lengths, group)
    loss = cp_v32.causal_lm_loss(out.logits, labels, lengths)      # this rank's share
    loss.backward()
    cp_v32.all_reduce_gradients(model, group)                      # then optimizer.step()

``out.logits`` are this rank's rows' logits, equal to the unmodified model run on each document
alone. It is the machinery of ``deepseek_v4`` with no compressor and no sliding window: the key
bank is every earlier token of the document. Per attention layer (``_v32_attention.py``) each
rank gathers its rows' document prefix of the MLA latent (``_cp_prefix.PrefixLayout``; backward
SUMs into the owners), the indexer's selection is balanced across ranks on a route planned once
per batch (``mode``: 'none', 'zigzag', 'greedy', 'hybrid', 'spill', ...; any document lengths,
no divisibility rule), and each row attends its selected latent rows in bounded memory.

The indexer's training signal: ``context_parallel(..., indexer_kl_coeff=c)`` adds, per layer, the
indexer KL at the model's ``index_topk`` (``sparsecp.torch.kl.indexer_kl_loss_any_topk``; the
seed's own function keeps its TopK512 rule) on each row's owner; ``indexer_kl_loss(model)``
returns this rank's share of their sum for the last forward, to add to the loss. It only
reaches indexer parameters and changes no logit. ``model(..., padding_tokens=n)`` names the
batch's last document as padding (``pad_to_multiple``'s): the KL leaves its rows out and is the
mean over the other tokens.

With ``mode="spill"`` (or "auto") ``context_parallel`` calibrates spill's cost model on the
layer's own selector and refits it from the measured selection times (``_cp_calibration``, as
``deepseek_v4`` does); ``calibrate=False`` or ``cost_model=`` skip that.

Activation checkpointing (``model.gradient_checkpointing_enable()``, non-reentrant) recomputes
the layers without selecting again: each layer replays the ids of its first forward.

FSDP2 and meshes: every ``group`` takes a ProcessGroup or a 1-D ``DeviceMesh``; see
``_cp_training`` for the order with ``fully_shard`` and the loss over a dp x cp mesh.

transformers is an optional dependency (``pip install 'sparsecp[models]'``), imported when a
function here is first called.
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
from ._v32_attention import cp_attention_forward
from ._v32_calibration import v32_calibration
from ._v32_selector import FusedSelector, ModelSelector
from ._v32_state import RATIO, ContextParallelState, ContextParallelStats

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
    "shard_batch",
    "shard_labels",
]

TRANSFORMERS_NEEDED = "5.23"
# The transformers objects this integration re-implements or relies on (the attention layer, its
# indexer, both RoPEs, the mscale of the attention's scaling; the decoder layer and models, whose
# forwards take our attention_mask sentinel and pass our keyword arguments to the attention), with
# the SHA-256 of their source in transformers 5.23. Another version runs only if all are unchanged.
UPSTREAM_FINGERPRINTS = {
    "DeepseekV32Attention": "b6baa01641fb5e3a",
    "DeepseekV32Indexer": "d9ab3cddb0751e8a",
    "DeepseekV32RotaryEmbedding": "872f02cd182f01dc",
    "apply_rotary_pos_emb": "ea234325c15de475",
    "apply_rotary_pos_emb_interleave": "8ed90f4983a65a1e",
    "rotate_half": "f714a4b1160c694e",
    "yarn_apply_mscale": "29fd53a32b6e62df",
    "DeepseekV32DecoderLayer": "b7fc667add41430b",
    "DeepseekV32Model": "d5680bf13bc0b683",
    "DeepseekV32ForCausalLM": "898d1fe1910c1955",
}
_SELECTORS = ("model", "fused")
_NAME = "DeepSeek-V3.2"


def _modeling() -> Any:
    """transformers' DeepSeek-V3.2 modeling module, with a clear error when it is missing or its
    modules differ from transformers 5.23's (the tested version; see UPSTREAM_FINGERPRINTS)."""
    try:
        from transformers.models.deepseek_v32 import modeling_deepseek_v32
    except ImportError as error:
        try:
            import transformers
            found = f"transformers {transformers.__version__} has no DeepseekV32"
        except ImportError:
            found = "transformers is not installed"
        raise ImportError(f"sparsecp.models.deepseek_v32 needs transformers >= {TRANSFORMERS_NEEDED} "
                          f"(DeepseekV32ForCausalLM): {found}; pip install 'transformers>={TRANSFORMERS_NEEDED}' "
                          "or pip install 'sparsecp[models]'") from error
    _cp_training.check_upstream(modeling_deepseek_v32, UPSTREAM_FINGERPRINTS, TRANSFORMERS_NEEDED,
                                "sparsecp.models.deepseek_v32")
    return modeling_deepseek_v32


def context_parallel_state(model: Any) -> ContextParallelState | None:
    """The state ``context_parallel`` attached to ``model`` (None when it is not context-parallel)."""
    return getattr(model, "_sparsecp_context_parallel", None)


def context_parallel(model: Any, group: Any = None, mode: str = "spill", *, block_size: int | None = None,
                     zigzag_min_length: int | None = None, selector: str = "model",
                     indexer_kl_coeff: float | None = None,
                     attention_backend: str | None = None, calibrate: bool | str = True,
                     **strategy_params: Any) -> Any:
    """Make a ``DeepseekV32ForCausalLM`` / ``DeepseekV32Model`` context-parallel over ``group``, in place.

    Args:
        model: transformers' DeepSeek-V3.2 model, the same weights on every rank (they stay
            replicated; sum their gradients with ``all_reduce_gradients``, or shard them with
            FSDP2 afterwards).
        group: The CP process group or 1-D DeviceMesh (None: the default group), in
            sequence-shard rank order.
        mode: The indexer selection's balancing strategy at ratio 1, as ``indexer_route`` takes
            it: the seed's 'zigzag', 'greedy', 'hybrid', or 'none', and sparsecp's own ('spill',
            'auto', ...).
        block_size, zigzag_min_length, **strategy_params: The strategy's options.
        selector: Where workers score rows: 'model' (the model's own indexer math in torch, any
            device and dtype) or 'fused' (sparsecp's fused C++ kernel, CPU, float32).
        indexer_kl_coeff: Enables the indexer KL loss with this coefficient (over the whole
            packed sequence: ``coeff / S`` times the sum of row losses); read it with
            ``indexer_kl_loss(model)``.
        attention_backend: ``sparsecp.torch.sparse_attention``'s backend for every attention layer:
            None (default) picks per input (the C++ kernel for CPU tensors; on a GPU FlashMLA's
            forward or cuDNN-frontend's backward where installed and able, then Triton; else the
            chunked torch path); 'cpu', 'flashmla', 'cudnn', 'triton' or 'torch' forces one. The
            one taken is ``context_parallel_state(model).attention_path``.
        calibrate: spill's (and auto's) cost model on the layer's own selector
            (``_cp_calibration``): True (default) calibrates it in the first forward (rank 0
            times the selector, broadcasts the fit) and refits it from every rank's measured
            selector seconds, carried by each forward's one agreement; "once" calibrates
            without the refit; False plans with the strategy's default model. A
            ``cost_model=`` given in ``strategy_params`` skips both. What it did:
            ``context_parallel_state(model).calibration.report``.

    Returns:
        ``model``, whose forward now takes this rank's shard (``shard_batch``) and
        ``document_lengths=`` and returns this rank's rows. ``config.use_cache`` is set to
        False: generation (a KV cache) is out of scope.

    Raises:
        TypeError: ``model`` is not a transformers DeepSeek-V3.2 model.
        ValueError: the model is already context-parallel, or an option is invalid.
    """
    modeling = _modeling()
    _cp_training.refuse_fsdp_before(model, "context_parallel")
    group = resolve_group(group, "context_parallel's group")
    base = model.model if isinstance(model, modeling.DeepseekV32ForCausalLM) else model
    if not isinstance(base, modeling.DeepseekV32Model):
        raise TypeError(f"context_parallel needs a transformers DeepseekV32ForCausalLM or DeepseekV32Model, got "
                        f"{type(model).__name__}")
    if context_parallel_state(model) is not None or context_parallel_state(base) is not None:
        raise ValueError("this DeepSeek-V3.2 model is already context-parallel (context_parallel was called on it)")
    if selector not in _SELECTORS:
        raise ValueError(f"selector must be one of {_SELECTORS}, got {selector!r}")
    indexer_kl_coeff = kl_coeff_option(indexer_kl_coeff)
    if attention_backend is not None and attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS} or None, got {attention_backend!r}")
    if not isinstance(mode, str) or not mode:
        raise ValueError(f"mode must be a strategy name, got {mode!r}")
    size, rank = _cp_training.group_shape(group, "CP group")
    state = ContextParallelState(
        group=group, size=size, rank=rank, mode=mode, block_size=block_size, zigzag_min_length=zigzag_min_length,
        strategy_params=dict(strategy_params), selector=selector,
        kl_coeff=indexer_kl_coeff, rope=modeling.apply_rotary_pos_emb,
        mla_rope=modeling.apply_rotary_pos_emb_interleave)
    state.attention_backend = attention_backend
    _check_strategy(state)
    agree_parameters(base, group, "context_parallel")
    state.calibration = v32_calibration(state, base, calibrate)  # checks calibrate=
    for layer in base.layers:
        attention = layer.self_attn
        attention.forward = functools.partial(cp_attention_forward, attention, state)
    base.config.use_cache = False
    refuse_model_loss_under_cp()
    base.register_forward_pre_hook(functools.partial(_before_model_forward, state), with_kwargs=True)
    if model is not base:
        model.register_forward_pre_hook(_before_causal_lm_forward, with_kwargs=True)
    base._sparsecp_context_parallel = state
    model._sparsecp_context_parallel = state
    _cp_training.note_cp_group(group)  # the legacy causal_lm_loss checks its labels over it
    return model


def _check_strategy(state: ContextParallelState) -> None:
    """The strategy's name and options, checked here (on a one-document plan whose shards fit any
    block size) rather than in the first forward."""
    from ..torch import indexer_route

    local = max(4096, 2 * int(state.block_size or 0))
    indexer_route((state.size * local,), state.size, state.rank, RATIO, state.mode, state.block_size,
                  state.zigzag_min_length, **state.strategy_params)


def _before_causal_lm_forward(module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    refuse_labels("deepseek_v32", args, kwargs)


def _before_model_forward(state: ContextParallelState, module: Any, args: tuple,
                          kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The forward's one agreement (``_cp_layer.check_and_agree``), then the batch's layout planned
    on the host and moved to the device once; the layers run with no further agreement."""
    check = BatchCheck(model=_NAME, group=state.group, size=state.size, rank=state.rank,
                       vocab=int(module.config.vocab_size),
                       positions=lambda lengths: state.batch(lengths).row_position,
                       options=(("mode", state.mode), ("indexer_kl_coeff", state.kl_coeff),
                                ("selector", state.selector)))
    # The forward's one all-gather also carries this rank's selector seconds of the last forward:
    # spill's cost-model refit (_cp_calibration) needs every rank's, with no collective of its own.
    agreed = check_and_agree(check, args, kwargs, state.calibration.local_times(state))
    state.calibration.received_times(agreed.times)
    lengths = agreed.lengths
    state.stats.forwards += 1
    context = state.start_forward(lengths, agreed.tokens.device, agreed.padding_tokens)
    kwargs = dict(kwargs)
    kwargs.pop("padding_tokens", None)  # ours: the model's forward does not take it
    # The forward's context travels to its layers in their keyword arguments; transformers hands a
    # checkpointed layer's recompute the same ones, so a recompute replays its own forward's ids.
    kwargs["sparsecp_forward"] = context
    kwargs["document_lengths"] = lengths  # a generator given by the caller is consumed once, here
    kwargs["attention_mask"] = {"indexed_attention": None}  # no [S, S] mask: the CP layers mask by document
    kwargs["use_cache"] = False
    return args, kwargs


def indexer_kl_loss(model: Any, group: Any = None) -> torch.Tensor | None:
    """This rank's share of the indexer KL of the last forward with gradients (sum over
    layers), or None when ``indexer_kl_coeff`` was not given. Add it to the loss before
    ``backward()``; the shares of a CP group sum to the KL of its packed sequence. ``group``: the
    group gradients are averaged over (FSDP2's flattened dp x cp mesh, as ``causal_lm_loss``
    takes it): the share is then scaled by the CP size for that average (``_cp_layer.indexer_kl_share``)."""
    return indexer_kl_share(_state(model), group)


def _state(model: Any) -> ContextParallelState:
    state = context_parallel_state(model)
    if state is None:
        raise ValueError("this model is not context-parallel: call sparsecp.models.deepseek_v32.context_parallel first")
    return state


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
    the share for gradients summed over the CP group. See ``_cp_training.causal_lm_loss``."""
    return _cp_training.causal_lm_loss(logits, labels, document_lengths, ignore_index, group=group,
                                       num_items_in_batch=num_items_in_batch)
