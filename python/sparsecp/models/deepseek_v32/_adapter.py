"""DeepSeek-V3.2's adapter to sparsecp's CP engine (``_cp.adapter.ModelAdapter``): its MLA
attention layer's CP forward over the ratio-1 layout (``_cp.prefix.PrefixLayout``: the key bank
is every earlier token of the document) and its selectors' calibration."""
from __future__ import annotations

from typing import Any

import torch

from .._cp.prefix import PrefixLayout
from .._cp.transformers_adapter import TransformersAdapter
from ._attention import cp_attention_forward
from ._calibration import v32_calibration

__all__ = ["UPSTREAM_FINGERPRINTS", "V32Adapter"]

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


class V32Adapter(TransformersAdapter):
    """transformers' ``DeepseekV32ForCausalLM`` / ``DeepseekV32Model`` (see the package docstring)."""

    name = "DeepSeek-V3.2"
    module_name = "deepseek_v32"
    ratio = 1  # the indexer scores every earlier token
    modeling_module = "transformers.models.deepseek_v32.modeling_deepseek_v32"
    causal_lm_class = "DeepseekV32ForCausalLM"
    model_class = "DeepseekV32Model"
    fingerprints = UPSTREAM_FINGERPRINTS

    def __init__(self) -> None:
        super().__init__()
        self.rope = self.modeling.apply_rotary_pos_emb  # the indexer's half-split RoPE
        self.mla_rope = self.modeling.apply_rotary_pos_emb_interleave  # the attention's interleaved RoPE

    def prepare(self, state: Any, base: torch.nn.Module) -> None:
        pass  # every layer selects, at ratio 1

    def attention_forward(self, module: torch.nn.Module, state: Any, *args: Any, **kwargs: Any) -> Any:
        return cp_attention_forward(module, state, *args, **kwargs)

    def layout(self, lengths: tuple[int, ...], size: int, rank: int) -> PrefixLayout:
        return PrefixLayout(lengths, size, rank)

    def calibration(self, state: Any, base: torch.nn.Module) -> Any:
        return v32_calibration(state, base, state.options.calibrate)
