"""spill's cost model for a context-parallel DeepSeek-V4: ``_cp.calibration`` over the layer's
own worker selector (``ModelSelector`` or ``FusedSelector``), built from its first CSA indexer
(every CSA layer of the model has the same indexer shape)."""
from __future__ import annotations

from typing import Any

import torch

from .._cp.calibration import SelectionCalibration, calibrate_option, plain_linear_like
from .._cp.selector import CHUNK_ROWS
from ._selector import FusedSelector, ModelSelector

__all__ = ["v4_calibration"]


class _Scorer:
    def __init__(self, softmax_scale: float) -> None:
        self.softmax_scale = softmax_scale


class _StandIn(torch.nn.Module):
    """The indexer's shapes and constants with a plain random ``q_b_proj``
    (``_cp.calibration.plain_linear_like``), as DeepSeek-V3.2's calibration does."""

    def __init__(self, indexer: Any) -> None:
        super().__init__()
        self.q_b_proj = plain_linear_like(indexer.q_b_proj.weight)
        self.num_heads, self.head_dim = int(indexer.num_heads), int(indexer.head_dim)
        self.compress_rate, self.index_topk = int(indexer.compress_rate), int(indexer.index_topk)
        self.scorer = _Scorer(float(indexer.scorer.softmax_scale))


def v4_calibration(state: Any, base: Any, option: Any) -> SelectionCalibration | None:
    """The calibration ``context_parallel`` attaches (None: the model has no CSA indexer)."""
    option = calibrate_option(option)
    indexers = [layer.self_attn.compressor.indexer for layer in base.layers
                if layer.self_attn.compressor is not None and hasattr(layer.self_attn.compressor, "indexer")]
    if not indexers:
        return None
    real = indexers[0]
    rope_dim, rope = state.adapter.rope_dim, state.adapter.rope
    stand_in: list[_StandIn] = []  # made on first use: FSDP2 may move or shard the real one before

    def make_selector(bank: torch.Tensor) -> Any:
        if not stand_in:
            stand_in.append(_StandIn(real))
        indexer = stand_in[0]
        if state.selector == "fused":
            return FusedSelector(indexer, bank, rope_dim)
        return ModelSelector(indexer, bank, rope)

    q_proj = real.q_b_proj.weight
    dims = {"q_rank": int(q_proj.shape[1]), "heads": int(real.num_heads), "head_dim": int(real.head_dim),
            "rope_dim": int(rope_dim), "ratio": int(real.compress_rate), "topk": int(real.index_topk)}
    ratios = [int(i.compress_rate) for i in indexers]
    # The fused kernel keeps a running top-k per row (candidates admitted above a threshold), so its
    # time has the top-k admission term: with it, its calibration predicts the example's held-out
    # worker calls to 0.015-0.019 rms relative (0.057-0.072 without). The model selector merges with
    # torch.topk, which scans every score alike: no such term (a free d only follows noise).
    return SelectionCalibration(state.mode, state.strategy_params, option, make_selector, state.selector, dims,
                                q_proj, ratios, rows=2 * CHUNK_ROWS, heap_term=state.selector == "fused")
