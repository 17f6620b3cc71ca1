"""One model forward as its layers see it: the ``ForwardContext`` the model's forward pre-hook
makes and hands to every attention layer in its keyword arguments (``FORWARD_KWARG``).

transformers hands a checkpointed layer's recompute the same keyword arguments as its first
forward, so a layer recomputed by activation checkpointing (``in_recompute``) replays the ids
its first forward recorded: no selector call and no selection collective.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

__all__ = ["FORWARD_KWARG", "ForwardContext", "KLLosses", "in_recompute"]

# The keyword argument that carries a forward's context from the model's forward to its attention
# layers (a model's forward must hand its ``**kwargs`` on to them, as transformers' models do).
FORWARD_KWARG = "sparsecp_forward"


def in_recompute() -> bool:
    """True while autograd runs a backward pass: a layer's forward then is a recompute."""
    return torch._C._current_graph_task_id() != -1


class KLLosses(list[torch.Tensor]):
    """A forward's indexer KL losses (a list of tensors that a ``ForwardContext`` can refer to
    weakly)."""


class ForwardContext:
    """One model forward's device layout and the ids each selecting layer chose.

    The forward hands it to its layers in their keyword arguments, and transformers hands a
    checkpointed layer's recompute the same ones: the recompute replays the ids of its own
    forward whatever ran in between, and everything here dies with the last reference to the
    forward's autograd graph.

    The layers' KL losses go to the state (``ContextParallelState.kl_losses``, the last forward with
    gradients'), which the context refers to only weakly: a KL loss's graph holds a checkpointed
    layer's recompute, whose keyword arguments hold this context, so a context holding its losses
    would be a cycle through the autograd graph that not even ``gc`` frees (a forward whose KL is
    never backpropagated: logged only, an evaluation pass with gradients, a warm-up)."""

    def __init__(self, number: int, layout: Any, grad: bool, keep: dict[int, torch.Tensor] | None = None,
                 padding_tokens: int = 0, kl_losses: KLLosses | None = None) -> None:
        self.number, self.layout, self.grad = number, layout, grad
        batch = layout.batch  # boundaries, first, local: the batch's host layout
        # The indexer KL's rows: every row but the padding document's (the last ``padding_tokens``
        # of the batch), and the count its mean is over.
        self.kl_tokens = batch.boundaries[-1] - padding_tokens
        self.kl_rows: torch.Tensor | None = None
        if padding_tokens and batch.first + batch.local > self.kl_tokens:
            rows = torch.arange(batch.first, batch.first + batch.local) < self.kl_tokens
            self.kl_rows = rows.to(layout.device)
        self._kl_losses = None if kl_losses is None else weakref.ref(kl_losses)
        self._records: dict[int, torch.Tensor] = {}
        self._keep = keep  # the state's ``last_selection`` when it keeps the last ids (tests)

    def add_kl(self, loss: torch.Tensor) -> None:
        """Keep a layer's KL loss in the state's list of this forward's (dropped when the forward
        ran without gradients or the state has moved on to a later forward)."""
        losses = None if self._kl_losses is None else self._kl_losses()
        if losses is not None:
            losses.append(loss)

    def record(self, layer: int, ids: torch.Tensor) -> None:
        """Keep a layer's selection for its recompute (only a forward with gradients can have one)."""
        if self.grad:
            self._records[layer] = ids.to(torch.int32)
        if self._keep is not None:
            self._keep[layer] = ids.to(torch.int32)

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

