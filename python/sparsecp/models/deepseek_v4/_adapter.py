"""DeepSeek-V4's adapter to sparsecp's CP engine (``_cp.adapter.ModelAdapter``): what the model
supplies (its attention layer's CP forward, its batch layout with a sliding window and compressed
banks, its selectors' calibration) and its one extra patch: the MoE load-balancing loss of the
whole packed row."""
from __future__ import annotations

import functools
from typing import Any

import torch

from .._cp import training
from .._cp.transformers_adapter import ProcessPatch, TransformersAdapter
from ._attention import cp_attention_forward
from ._calibration import v4_calibration
from ._layout import BatchLayout
from ._rope import InterleavedRope

__all__ = ["UPSTREAM_FINGERPRINTS", "V4Adapter", "WHOLE_ROW"]

# The transformers objects this integration re-implements or relies on (the attention layer,
# its compressors, indexer and rotary; the model's forward, which takes our attention_mask
# sentinel; the router and the load-balancing loss reproduced under CP), with the SHA-256 of
# their source in transformers 5.23 (``_cp.training.upstream_fingerprints``). Another version
# runs only if all of them are unchanged; otherwise ``context_parallel`` refuses it, naming them.
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
_ROUTER_STATE = "_sparsecp_router_state"  # on a CP forward's router logits: the state (its CP group)
WHOLE_ROW = "_sparsecp_whole_row"  # on a load-balancing loss of the whole packed row


class V4Adapter(TransformersAdapter):
    """transformers' ``DeepseekV4ForCausalLM`` / ``DeepseekV4Model`` (see the package docstring)."""

    name = "DeepSeek-V4"
    module_name = "deepseek_v4"
    modeling_module = "transformers.models.deepseek_v4.modeling_deepseek_v4"
    causal_lm_class = "DeepseekV4ForCausalLM"
    model_class = "DeepseekV4Model"
    fingerprints = UPSTREAM_FINGERPRINTS

    def __init__(self) -> None:
        super().__init__()
        self.rope = InterleavedRope(self.modeling.apply_rotary_pos_emb)  # the model's, in fewer passes
        self.window = self.rope_dim = 0
        self.ratio = 4
        self.compressions: tuple[tuple[int, bool], ...] = ()  # (ratio, CSA?) of the compressed layers

    def prepare(self, state: Any, base: Any) -> None:
        config = base.config
        self.window, self.rope_dim = int(config.sliding_window), int(config.qk_rope_head_dim)
        self.ratio = int(config.compress_rates.get("compressed_sparse_attention", 4))
        modules: list[Any] = list(self.attention_modules(base))
        self.compressions = tuple(sorted({(int(a.compressor.compress_rate), hasattr(a.compressor, "indexer"))
                                          for a in modules if a.compressor is not None}))
        if state.kl_coeff is not None and not any(overlap for _, overlap in self.compressions):
            raise ValueError(f"indexer_kl_coeff={state.kl_coeff} trains the Lightning Indexer, but this model has no "
                             "compressed sparse attention layer (no indexer): leave indexer_kl_coeff unset")

    def attention_forward(self, module: torch.nn.Module, state: Any, *args: Any, **kwargs: Any) -> Any:
        return cp_attention_forward(module, state, *args, **kwargs)

    def layout(self, lengths: tuple[int, ...], size: int, rank: int) -> BatchLayout:
        return BatchLayout(lengths, size, rank, self.window, self.compressions)

    def calibration(self, state: Any, base: torch.nn.Module) -> Any:
        return v4_calibration(state, base, state.options.calibrate)  # None without a CSA layer

    def install(self, model: torch.nn.Module, base: torch.nn.Module, state: Any) -> None:
        super().install(model, base, state)
        handle = base.register_forward_hook(functools.partial(_tag_router_logits, state))
        state.undo.append(handle.remove)
        state.undo.append(_load_balancing_patch(self.modeling).acquire())


def _tag_router_logits(state: Any, module: Any, args: tuple, output: Any) -> Any:
    """Tags the router logits of a CP forward (``output_router_logits``) with the state, so that
    the load-balancing loss made of them, whichever module makes it, is the whole packed row's."""
    logits = getattr(output, "router_logits", None)
    if logits:
        for tensor in logits:
            if isinstance(tensor, torch.Tensor):
                setattr(tensor, _ROUTER_STATE, state)
    return output


def router_state(gate_logits: Any) -> Any:
    if isinstance(gate_logits, (tuple, list)) and gate_logits:
        return getattr(gate_logits[0], _ROUTER_STATE, None)
    return None


def _whole_row(original: Any) -> Any:
    """transformers' ``load_balancing_loss_func`` (the one ``DeepseekV4ForCausalLM.forward`` calls
    for ``aux_loss``) giving the whole packed row's loss for a CP forward's router logits, however
    the CP model was wrapped: ``context_parallel(model.model)`` leaves the outer CausalLM
    unhooked, and its ``aux_loss`` was each shard's own (the loss is a product of two batch
    statistics, not a sum over rows). Router logits that no CP forward tagged go to
    transformers' function unchanged."""
    @functools.wraps(original)
    def load_balancing_loss_under_cp(gate_logits: Any, num_experts: Any = None, top_k: Any = 2,
                                     attention_mask: Any = None) -> Any:
        state = router_state(gate_logits)
        if state is None:
            return original(gate_logits, num_experts, top_k, attention_mask)
        loss = training.load_balancing_loss(gate_logits, int(num_experts), int(top_k), state.group,
                                            row_mask=attention_mask)
        setattr(loss, WHOLE_ROW, True)
        return loss
    return load_balancing_loss_under_cp


_PATCHES: dict[int, ProcessPatch] = {}


def _load_balancing_patch(modeling: Any) -> ProcessPatch:
    if id(modeling) not in _PATCHES:
        _PATCHES[id(modeling)] = ProcessPatch(lambda: modeling.load_balancing_loss_func,
                                              lambda value: setattr(modeling, "load_balancing_loss_func", value),
                                              _whole_row)
    return _PATCHES[id(modeling)]
