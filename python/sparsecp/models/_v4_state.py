"""What ``context_parallel`` attaches to a DeepSeek-V4 model: its options, per-batch layouts,
the layers' recorded selections, the KL losses of the last forward, and counters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ._v4_layout import BatchLayout, DeviceLayout
from ._v4_selector import SelectorClock

__all__ = ["ContextParallelState", "ContextParallelStats", "ForwardContext", "lengths_key"]

_LAYOUTS_KEPT = 8  # batch layouts cached for reuse (a forward holds its own: see ForwardContext)


class ForwardContext:
    """One model forward's batch layout (on the device), the ids each CSA layer selected, and its
    KL losses. The forward hands it to its layers in their keyword arguments, and transformers
    hands a checkpointed layer's recompute the same ones: the recompute replays the ids of its
    own forward whatever ran in between, and everything here dies with the last reference to
    the forward (its autograd graph, or the caller's ``indexer_kl_loss``)."""

    def __init__(self, number: int, layout: DeviceLayout, grad: bool, padding_tokens: int = 0) -> None:
        self.number, self.layout, self.grad = number, layout, grad
        batch = layout.batch
        # The indexer KL's rows: every row but the padding document's (the last ``padding_tokens``
        # of the batch), and the count its mean is over.
        self.kl_tokens = batch.boundaries[-1] - padding_tokens
        self.kl_rows: torch.Tensor | None = None
        if padding_tokens and batch.first + batch.local > self.kl_tokens:
            rows = torch.arange(batch.first, batch.first + batch.local) < self.kl_tokens
            self.kl_rows = rows.to(layout.device)
        self.kl_losses: list[torch.Tensor] = []
        self._records: dict[int, torch.Tensor] = {}

    def record(self, layer: int, ids: torch.Tensor) -> None:
        """Keep a layer's selection for its recompute (only a forward with gradients can have one)."""
        if self.grad:
            self._records[layer] = ids.to(torch.int32)

    def replay(self, layer: int) -> torch.Tensor:
        """The ids ``layer`` selected in this forward; freed once replayed (a backward recomputes a
        layer once)."""
        ids = self._records.pop(layer, None)
        if ids is None:
            raise RuntimeError(f"sparsecp: layer {layer} is recomputed for forward {self.number}, whose selection "
                               "it has already replayed or never recorded (a second backward through one graph "
                               "(retain_graph=True) with activation checkpointing, or a recompute of a forward run "
                               "without gradients, is not supported)")
        return ids.long()


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
        layout = self.batch(lengths).on(device, self.compressions, selection, self.kl_coeff is not None and grad)
        self.forwards += 1
        context = ForwardContext(self.forwards, layout, grad, padding_tokens)
        if grad:  # an evaluation forward in between keeps the training forward's KL
            self.kl_losses = context.kl_losses
            self.forwards_with_grad += 1
        if self.keep_last_ids:
            self.last_selection = {}
            record = context.record

            def record_and_keep(layer: int, ids: torch.Tensor) -> None:
                record(layer, ids)
                self.last_selection[layer] = ids.to(torch.int32)
            context.record = record_and_keep  # type: ignore[method-assign]
        return context


def lengths_key(lengths: Any) -> tuple[int, ...]:
    """``document_lengths`` as a tuple of positive ints (the key of the batch's layout)."""
    if lengths is None:
        raise ValueError("sparsecp: a context-parallel DeepSeek-V4 needs document_lengths=... (the lengths of the "
                         "packed documents of the whole sequence, identical on every rank) in model(...)")
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    try:
        values = tuple(int(v) for v in lengths)
    except (TypeError, ValueError) as error:
        raise ValueError(f"document_lengths must be a sequence of positive integers, got {lengths!r}") from error
    if any(not isinstance(v, (int, np.integer)) and not float(v).is_integer() for v in lengths):
        raise ValueError(f"document_lengths must be integers, got {lengths!r}")
    if not values or min(values) < 1:
        raise ValueError(f"document_lengths must be positive, got {values}")
    return values
