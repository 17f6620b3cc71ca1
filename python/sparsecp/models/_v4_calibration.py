"""spill's cost model for a context-parallel DeepSeek-V4: ``_cp_calibration`` over the layer's
own worker selector (``ModelSelector`` or ``FusedSelector``), built from its first CSA indexer
(every CSA layer of the model has the same indexer shape)."""
from __future__ import annotations

from typing import Any

import torch

from ._cp_calibration import SelectionCalibration, calibrate_option
from ._v4_selector import _CHUNK_ROWS, FusedSelector, ModelSelector

__all__ = ["v4_calibration"]


def v4_calibration(state: Any, base: Any, option: Any) -> SelectionCalibration | None:
    """The calibration ``context_parallel`` attaches (None: the model has no CSA indexer)."""
    option = calibrate_option(option)
    indexers = [layer.self_attn.compressor.indexer for layer in base.layers
                if layer.self_attn.compressor is not None and hasattr(layer.self_attn.compressor, "indexer")]
    if not indexers:
        return None
    indexer = indexers[0]
    rope_dim = state.rope_dim

    def make_selector(bank: torch.Tensor) -> Any:
        if state.selector == "fused":
            return FusedSelector(indexer, bank, rope_dim)
        return ModelSelector(indexer, bank, state.rope)

    q_proj = indexer.q_b_proj.weight
    dims = {"q_rank": int(q_proj.shape[1]), "heads": int(indexer.num_heads), "head_dim": int(indexer.head_dim),
            "rope_dim": int(rope_dim), "ratio": int(indexer.compress_rate), "topk": int(indexer.index_topk)}
    ratios = [int(i.compress_rate) for i in indexers]
    return SelectionCalibration(state.mode, state.strategy_params, option, make_selector, state.selector, dims,
                                q_proj, ratios, rows=2 * _CHUNK_ROWS)  # no heap term: fitted on the
    # example's real routes it did not predict held-out batches better for either selector (fused: 0.17 with
    # it against 0.07 without, an overfit of the machine's noise)
