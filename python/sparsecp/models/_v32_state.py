"""What ``deepseek_v32.context_parallel`` attaches to a DeepSeek-V3.2 model: its options, the
per-batch layouts (``PrefixLayout``), the KL losses of the last forward, and counters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ._cp_layer import ContextParallelStats, ForwardContext, StateBookkeeping, plan_key
from ._cp_prefix import PrefixLayout

__all__ = ["ContextParallelState", "ContextParallelStats"]

RATIO = 1  # V3.2's indexer scores every earlier token: a compression ratio of 1


@dataclass(kw_only=True)
class ContextParallelState(StateBookkeeping):
    """What ``context_parallel`` attached to a model (``context_parallel_state(model)``)."""

    model_name = "DeepSeek-V3.2"
    rope: Callable[..., Any]            # the indexer's half-split RoPE (``apply_rotary_pos_emb``)
    mla_rope: Callable[..., Any]        # the attention's interleaved RoPE
    layouts: dict[tuple[int, ...], PrefixLayout] = field(default_factory=dict)

    def batch(self, lengths: tuple[int, ...]) -> PrefixLayout:
        """The batch's host layout (cached for the last few batches)."""
        return self.cached_batch(lengths, lambda: PrefixLayout(lengths, self.size, self.rank))

    def routes(self, lengths: tuple[int, ...], params: dict[str, Any] | None = None) -> list[Any]:
        """Every rank's selection route of the batch at ratio 1 (one plan, cached by sparsecp)."""
        from ..torch import indexer_route

        params = self.strategy_params if params is None else params
        return [indexer_route(lengths, self.size, q, RATIO, self.mode, self.block_size, self.zigzag_min_length,
                              **params) for q in range(self.size)]

    def start_forward(self, lengths: tuple[int, ...], device: torch.device, padding_tokens: int = 0) -> ForwardContext:
        """Plan (host) and move (device, once per batch) everything this forward's layers read.
        ``padding_tokens``: the batch's last document is padding of this many tokens (the KL
        leaves its rows out)."""
        params = self.strategy_params if self.calibration is None else \
            self.calibration.strategy_params(self, lengths, device)  # spill's calibrated / refitted cost model
        model = params.get("cost_model")
        grad = torch.is_grad_enabled()
        layout = self.batch(lengths).on(device, lambda: self.routes(lengths, params),
                                        self.kl_coeff is not None and grad,
                                        plan_key(model))
        return self.begin_forward(layout, grad, padding_tokens)
