"""What ``context_parallel`` attaches to a DeepSeek-V4 model: its options, per-batch layouts,
the layers' recorded selections, the KL losses of the last forward, and counters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import _cp_layer
from ._cp_layer import ForwardContext, SelectorClock, plan_key
from ._v4_layout import BatchLayout

__all__ = ["ContextParallelState", "ContextParallelStats", "ForwardContext", "lengths_key"]

_LAYOUTS_KEPT = 8  # batch layouts cached for reuse (a forward holds its own: see ForwardContext)


@dataclass
class ContextParallelStats:
    """Counters since the last ``reset()`` (per rank)."""

    forwards: int = 0
    selections: int = 0        # balanced_indexer_select calls (each: one input and one result exchange)
    replays: int = 0           # recomputed layers that replayed their recorded ids
    indexer_seconds: float = 0.0  # owner-side indexer work: rotary, Index K bank, selection (incl. exchange)
    dispatch_bytes: int = 0    # bytes this rank sent for halos, compressor rows, bank prefixes, Index K bank

    def reset(self) -> None:
        for name, value in ContextParallelStats().__dict__.items():
            setattr(self, name, value)


@dataclass
class ContextParallelState:
    """What ``context_parallel`` attached to a model (``context_parallel_state(model)``)."""

    group: Any
    size: int
    rank: int
    mode: str
    block_size: int | None
    zigzag_min_length: int | None
    strategy_params: dict[str, Any]
    selector: str
    kl_coeff: float | None
    window: int
    rope_dim: int
    rope: Callable[..., torch.Tensor]
    compressions: tuple[tuple[int, bool], ...] = ()  # (ratio, CSA?) of the model's compressed layers
    attention_chunk_bytes: int = 64 << 20  # scratch budget of one attention row chunk
    keep_last_ids: bool = False  # keep the last forward's ids for ``last_ids`` (tests, diagnostics)
    stats: ContextParallelStats = field(default_factory=ContextParallelStats)
    clock: SelectorClock = field(default_factory=SelectorClock)
    layouts: dict[tuple[int, ...], BatchLayout] = field(default_factory=dict)
    forwards: int = 0  # numbers each model forward
    forwards_with_grad: int = 0
    kl_losses: list[torch.Tensor] = field(default_factory=list)  # the last forward with gradients' KL losses
    last_selection: dict[int, torch.Tensor] = field(default_factory=dict)
    calibration: Any = None  # spill's cost model on the layer's selector (_cp_calibration.SelectionCalibration)

    def context(self, forward: Any) -> ForwardContext:
        """The forward a layer runs in (from its keyword arguments)."""
        if not isinstance(forward, ForwardContext):
            raise ValueError("sparsecp: a context-parallel DeepSeek-V4 layer ran outside its model's forward; call "
                             "the model (model(input_ids=..., position_ids=..., document_lengths=...)), not its "
                             "layers")
        return forward

    def last_ids(self, layer: int) -> torch.Tensor:
        """The ids a layer selected in the last forward ([local rows, topk] bank rows, -1 padded);
        kept only with ``keep_last_ids = True``."""
        if layer not in self.last_selection:
            raise ValueError(f"sparsecp: no ids of layer {layer} are kept; set context_parallel_state(model)"
                             ".keep_last_ids = True before the forward")
        return self.last_selection[layer].long()

    @property
    def recorded(self) -> dict[int, torch.Tensor]:
        """The last forward's kept ids by layer (``keep_last_ids``)."""
        return self.last_selection

    def batch(self, lengths: tuple[int, ...]) -> BatchLayout:
        """The batch's host layout (cached for the last few batches)."""
        if lengths in self.layouts:
            self.layouts[lengths] = self.layouts.pop(lengths)  # most recently used last
        else:
            while len(self.layouts) >= _LAYOUTS_KEPT:
                self.layouts.pop(next(iter(self.layouts)))
            self.layouts[lengths] = BatchLayout(lengths, self.size, self.rank, self.window)
        return self.layouts[lengths]

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
        self.forwards += 1
        if self.keep_last_ids:
            self.last_selection = {}
        context = ForwardContext(self.forwards, layout, grad, self.last_selection if self.keep_last_ids else None,
                                 padding_tokens)
        if grad:  # an evaluation forward in between keeps the training forward's KL
            self.kl_losses = context.kl_losses
            self.forwards_with_grad += 1
        return context


def lengths_key(lengths: Any) -> tuple[int, ...]:
    """``document_lengths`` as a tuple of positive ints (the key of the batch's layout)."""
    return _cp_layer.lengths_key(lengths, "DeepSeek-V4")
