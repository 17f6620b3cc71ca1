"""What ``context_parallel`` attaches to a DeepSeek-V4 model: its options, per-batch layouts,
the layers' recorded selections, the KL losses of the last forward, and counters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import _cp_layer
from ._cp_layer import ContextParallelStats, ForwardContext, StateBookkeeping, plan_key
from ._v4_layout import BatchLayout

__all__ = ["ContextParallelState", "ContextParallelStats", "ForwardContext", "lengths_key"]


@dataclass(kw_only=True)
class ContextParallelState(StateBookkeeping):
    """What ``context_parallel`` attached to a model (``context_parallel_state(model)``)."""

    model_name = "DeepSeek-V4"
    window: int
    rope_dim: int
    rope: Callable[..., torch.Tensor]
    compressions: tuple[tuple[int, bool], ...] = ()  # (ratio, CSA?) of the model's compressed layers
    layouts: dict[tuple[int, ...], BatchLayout] = field(default_factory=dict)

    def batch(self, lengths: tuple[int, ...]) -> BatchLayout:
        """The batch's host layout (cached for the last few batches)."""
        return self.cached_batch(lengths, lambda: BatchLayout(lengths, self.size, self.rank, self.window))

    def start_forward(self, lengths: tuple[int, ...], device: torch.device, padding_tokens: int = 0) -> ForwardContext:
        """Plan (host) and move (device, once per batch) everything this forward's layers read.
        ``padding_tokens``: the batch's last document is padding of this many tokens (the KL
        skips its rows)."""
        from ..torch import indexer_route

        params = self.strategy_params if self.calibration is None else \
            self.calibration.strategy_params(self, lengths, device)  # spill's calibrated / refitted cost model

        def selection(ratio: int) -> list[Any]:
            return [indexer_route(lengths, self.size, q, ratio, self.mode, self.block_size, self.zigzag_min_length,
                                  **params) for q in range(self.size)]

        grad = torch.is_grad_enabled()
        model = params.get("cost_model")
        layout = self.batch(lengths).on(device, self.compressions, selection, self.kl_coeff is not None and grad,
                                        plan_key(model))
        return self.begin_forward(layout, grad, padding_tokens)


def lengths_key(lengths: Any) -> tuple[int, ...]:
    """``document_lengths`` as a tuple of positive ints (the key of the batch's layout)."""
    return _cp_layer.lengths_key(lengths, "DeepSeek-V4")
