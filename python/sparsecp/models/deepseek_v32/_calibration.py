"""spill's cost model for a context-parallel DeepSeek-V3.2: ``_cp.calibration`` over the layer's
own worker selector (``ModelSelector`` or ``FusedSelector``), built from its first indexer
(every layer of the model has the same indexer shape), at ratio 1."""
from __future__ import annotations

from typing import Any

import torch

from .._cp.calibration import SelectionCalibration, calibrate_option, plain_linear_like
from .._cp.selector import CHUNK_ROWS
from ._selector import FusedSelector, ModelSelector

__all__ = ["v32_calibration"]


class _StandIn(torch.nn.Module):
    """The indexer's shapes and constants with a plain random ``wq_b``
    (``_cp.calibration.plain_linear_like``: under FSDP2 the real one is a shard in the forward hook)."""

    def __init__(self, indexer: Any) -> None:
        super().__init__()
        self.wq_b = plain_linear_like(indexer.wq_b.weight)
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
            ModelSelector(indexer, bank, state.adapter.rope)

        def run(qr: torch.Tensor, weights: torch.Tensor, position_embeddings: Any, segments: Any) -> torch.Tensor:
            # calibrate hands cos / sin of rope_dim / 2 (the kernel's convention); the model's rotary
            # rows are cat(freqs, freqs), which the selectors take
            cos, sin = position_embeddings
            return selector(qr, weights, (torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)), segments)
        return run

    weight = real.wq_b.weight
    dims = {"q_rank": int(weight.shape[1]), "heads": int(real.n_heads), "head_dim": int(real.head_dim),
            "rope_dim": int(real.qk_rope_head_dim), "ratio": 1, "topk": int(real.index_topk)}
    # heap_term for sparsecp's kernel (a running top-k per row), as DeepSeek-V4's calibration does
    return SelectionCalibration(state.mode, state.strategy_params, option, make_selector, f"v32-{state.selector}",
                                dims, weight, [1] * len(base.layers), rows=2 * CHUNK_ROWS,
                                heap_term=state.selector == "fused")
