"""What ``context_parallel`` attaches to a DeepSeek-V4 model: its options, per-batch layouts,
the layers' recorded selections, the KL losses of the last forward, and counters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ._v4_layout import BatchLayout
from ._v4_selector import SelectorClock

__all__ = ["ContextParallelState", "ContextParallelStats", "lengths_key"]

_LAYOUTS_KEPT = 8
_RECORDS_KEPT = 16


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
    stats: ContextParallelStats = field(default_factory=ContextParallelStats)
    clock: SelectorClock = field(default_factory=SelectorClock)
    layouts: dict[tuple[int, ...], BatchLayout] = field(default_factory=dict)
    recorded: dict[int, dict[Any, torch.Tensor]] = field(default_factory=dict)
    forwards: int = 0  # numbers each model forward; its layers' records are keyed by it
    kl_losses: list[torch.Tensor] = field(default_factory=list)

    def layout(self, lengths: Any) -> BatchLayout:
        """The batch's layout (made by the model's forward; layers only look it up)."""
        key = lengths_key(lengths)
        if key not in self.layouts:
            raise ValueError("sparsecp: a context-parallel DeepSeek-V4 layer ran for document_lengths its model's "
                             "forward did not see; call the model, not its layers")
        return self.layouts[key]

    def record_ids(self, layer: int, key: Any, ids: torch.Tensor) -> None:
        """Keep a layer's selection for its recompute (the last ``_RECORDS_KEPT`` forwards')."""
        records = self.recorded.setdefault(layer, {})
        while len(records) >= _RECORDS_KEPT:
            records.pop(next(iter(records)))
        records[key] = ids.to(torch.int32)

    def recorded_ids(self, layer: int, key: Any) -> torch.Tensor:
        """The selection a layer recorded in the forward that ``key`` (forward number, lengths) names."""
        ids = self.recorded.get(layer, {}).get(key)
        if ids is None:
            raise RuntimeError(f"sparsecp: layer {layer} is recomputed for a forward whose selection it no longer "
                               f"holds (it keeps the last {_RECORDS_KEPT} forwards'; run their backwards sooner)")
        return ids.long()

    def last_ids(self, layer: int) -> torch.Tensor:
        """The ids a layer selected in the last forward ([local rows, topk] bank rows, -1 padded)."""
        return next(reversed(self.recorded[layer].values())).long()

    def prepare(self, lengths: tuple[int, ...]) -> BatchLayout:
        if lengths not in self.layouts:
            while len(self.layouts) >= _LAYOUTS_KEPT:
                self.layouts.pop(next(iter(self.layouts)))
            self.layouts[lengths] = BatchLayout(lengths, self.size, self.rank, self.window)
        return self.layouts[lengths]



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
