"""spill's cost model for a context-parallel DeepSeek-V3.2: ``_cp_calibration`` over the layer's
own worker selector (``ModelSelector`` or ``FusedSelector``), built from its first indexer
(every layer of the model has the same indexer shape), at ratio 1."""
from __future__ import annotations

from typing import Any

import torch

from ._cp_calibration import SelectionCalibration, calibrate_option
from ._v32_selector import _CHUNK_ROWS, FusedSelector, ModelSelector

__all__ = ["v32_calibration"]


class _StandIn(torch.nn.Module):
    """The indexer's shapes and constants with a plain random ``wq_b``: the selector's time does
    not depend on the weights' values, and under FSDP2 the real ones are DTensor shards outside
    their layer's forward (the calibration runs in the model's forward hook, on rank 0 alone, so
    it may not all-gather them). Its values come from a generator of its own: the ranks' global
    random states stay equal."""

    def __init__(self, indexer: Any) -> None:
        super().__init__()
        weight = indexer.wq_b.weight
        local = weight.to_local() if hasattr(weight, "to_local") else weight
        out_features, in_features = (int(n) for n in weight.shape)  # a DTensor's shape is the whole one
        self.wq_b = torch.nn.utils.skip_init(torch.nn.Linear, in_features, out_features, bias=False,
                                             device=local.device, dtype=local.dtype)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            self.wq_b.weight.copy_(torch.randn((out_features, in_features), generator=generator) * 0.02)
        self.n_heads, self.head_dim = int(indexer.n_heads), int(indexer.head_dim)
        self.qk_rope_head_dim, self.index_topk = int(indexer.qk_rope_head_dim), int(indexer.index_topk)
        self.softmax_scale = float(indexer.softmax_scale)


def v32_calibration(state: Any, base: Any, option: Any) -> SelectionCalibration:
    """The calibration ``context_parallel`` attaches."""
    option = calibrate_option(option)
    real = base.layers[0].self_attn.indexer
    stand_in: list[_StandIn] = []  # made on first use: FSDP2 may move or shard the real one before

    def indexer_shape() -> _StandIn:
        if not stand_in:
            stand_in.append(_StandIn(real))
        return stand_in[0]

    def make_selector(bank: torch.Tensor) -> Any:
        indexer = indexer_shape()
        selector = FusedSelector(indexer, bank) if state.selector == "fused" else \
            ModelSelector(indexer, bank, state.rope)

        def run(qr: torch.Tensor, weights: torch.Tensor, position_embeddings: Any, segments: Any) -> torch.Tensor:
            # calibrate hands cos / sin of rope_dim / 2 (the kernel's convention); the model's rotary
            # rows are cat(freqs, freqs), which the selectors take
            cos, sin = position_embeddings
            return selector(qr, weights, (torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)), segments)
        return run

    weight = real.wq_b.weight
    dims = {"q_rank": int(weight.shape[1]), "heads": int(real.n_heads), "head_dim": int(real.head_dim),
            "rope_dim": int(real.qk_rope_head_dim), "ratio": 1, "topk": int(real.index_topk)}
    return SelectionCalibration(state.mode, state.strategy_params, option, make_selector, f"v32-{state.selector}",
                                dims, weight, [1] * len(base.layers), rows=2 * _CHUNK_ROWS)
