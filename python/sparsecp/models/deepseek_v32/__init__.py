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
bank is every earlier token of the document. Per attention layer (``_attention.py``) each
rank gathers its rows' document prefix of the MLA latent (``_cp/prefix.py``'s ``PrefixLayout``; backward
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
layer's own selector and refits it from the measured selection times (``_cp/calibration.py``, as
``deepseek_v4`` does); ``calibrate=False`` or ``cost_model=`` skip that.

Activation checkpointing (``model.activation_checkpointing_enable()``, non-reentrant) recomputes
the layers without selecting again: each layer replays the ids of its first forward.

FSDP2 and meshes: every ``group`` takes a ProcessGroup or a 1-D ``DeviceMesh``; see
``_cp/training.py`` for the order with ``fully_shard`` and the loss over a dp x cp mesh.

transformers is an optional dependency (``pip install 'sparsecp[models]'``), imported when a
function here is first called.
"""
from __future__ import annotations

from ..._publish import publish as _publish
from .._cp.public import *  # noqa: F403  (the functions every model exports)
from .._cp.public import __all__ as _public
from .._cp.public import entry_point
from .._cp.transformers_adapter import TRANSFORMERS_TESTED as TRANSFORMERS_NEEDED
from ._adapter import UPSTREAM_FINGERPRINTS, V32Adapter
from ._selector import FusedSelector, ModelSelector

__all__ = [*_public, "context_parallel", "V32Adapter", "UPSTREAM_FINGERPRINTS", "TRANSFORMERS_NEEDED",
           "FusedSelector", "ModelSelector"]

context_parallel = entry_point(V32Adapter, __name__, """\
Make a ``DeepseekV32ForCausalLM`` / ``DeepseekV32Model`` context-parallel over ``group``, in place.

    Args:
        model: transformers' DeepSeek-V3.2 model, the same weights on every rank (they stay
            replicated; sum their gradients with ``all_reduce_gradients``, or shard them with
            FSDP2 afterwards).
        group: The CP process group or 1-D DeviceMesh (None: the default group), in
            sequence-shard rank order.
        mode, block_size, zigzag_min_length, selector, indexer_kl_coeff, attention_backend,
            calibrate, **strategy_params: The options (``sparsecp.models.ContextParallelOptions``
            documents each; the strategy plans at ratio 1, any document lengths), or all of
            them at once as ``options=``. What the calibration did:
            ``context_parallel_state(model).calibration.report``.

    Returns:
        ``model``, whose forward now takes this rank's shard (``shard_batch``) and
        ``document_lengths=`` and returns this rank's rows; each attention module is a
        ``ContextParallelDeepseekV32Attention`` (``print(model)`` shows them) until
        ``undo_context_parallel(model)``. ``config.use_cache`` is False meanwhile: generation
        (a KV cache) is out of scope.

    Raises:
        TypeError: ``model`` is not a transformers DeepSeek-V3.2 model.
        ValueError: the model is already context-parallel, an option is invalid, or the ranks
            were given different options or hold different weights (raised on every rank).
    """)

_publish(__name__, globals())  # help() names this module, not the private one defining it
