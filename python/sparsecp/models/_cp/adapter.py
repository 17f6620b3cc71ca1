"""What a model supplies to sparsecp's context-parallel engine: the ``ModelAdapter`` protocol.

The engine (``sparsecp.models.context_parallel``) runs every model's forward the same way:

1. at ``context_parallel`` time: the options checked and compared across ranks, the weights
   compared across ranks, each attention module's class swapped for a cached
   ``ContextParallel<Name>`` subclass whose forward is the adapter's ``attention_forward``, a
   forward pre-hook on the adapter's ``base`` module;
2. per forward, in that pre-hook: the batch checked on every rank and agreed across ranks in one
   all-gather (``agreement.check_and_agree``), the batch's layout planned on the host
   (``adapter.layout``) and moved to the device once, with every rank's selection route, and a
   ``ForwardContext`` handed to the layers in their keyword arguments (``FORWARD_KWARG``);
3. per attention layer (the adapter's ``attention_forward``, built from the engine's pieces):
   its rows gathered along the layout's routes (``state.gather``: backward SUMs into the
   owners), the balanced selection or, in a recompute, its replay (``select.select_or_replay``
   with a selector built on ``selector.ChunkedTopKSelector``), the attention over each row's
   listed keys (``state.attend``: ``sparsecp.torch.sparse_attention``), the optional indexer KL
   (``context.add_kl``);
4. ``undo_context_parallel``: every class, hook and patch taken back.

An adapter is a small object; ``sparsecp.models.deepseek_v4`` and ``deepseek_v32`` each define
one for transformers' models (on ``transformers_adapter.TransformersAdapter``), and
docs/guide/your-model.md walks through one for a model written in plain PyTorch.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from .calibration import SelectionCalibration
    from .state import ContextParallelState

__all__ = ["ModelAdapter"]


@runtime_checkable
class ModelAdapter(Protocol):
    """What a model supplies to the engine (see the module docstring).

    Attributes:
        name: The model's name in messages ("DeepSeek-V4").
        module_name: Where its users find ``shard_labels`` and ``causal_lm_loss`` (messages).
        ratio: The indexer's compression ratio (1: it scores every earlier token), for the
            strategy check at ``context_parallel`` time.
    """

    name: str
    module_name: str
    ratio: int

    def base(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module whose forward takes the packed shard (``input_ids``, ``position_ids``,
        ``document_lengths`` and ``**kwargs`` that it hands on to every attention module);
        ``TypeError`` when ``model`` is not this adapter's model."""
        ...

    def attention_modules(self, base: torch.nn.Module) -> Sequence[torch.nn.Module]:
        """The modules made context-parallel (one per layer)."""
        ...

    def prepare(self, state: ContextParallelState, base: torch.nn.Module) -> None:
        """Read the model into the adapter (ratios, window, rotary functions) and refuse options
        it cannot run (``ValueError``); called once, before anything is changed."""
        ...

    def attention_forward(self, module: torch.nn.Module, state: ContextParallelState, *args: Any,
                          **kwargs: Any) -> Any:
        """A swapped module's forward under context parallelism; ``kwargs[FORWARD_KWARG]`` is
        the forward's ``ForwardContext`` (``state.context(...)`` checks it)."""
        ...

    def layout(self, lengths: tuple[int, ...], size: int, rank: int) -> Any:
        """The batch's host layout for one rank: pure integer planning with ``row_position``
        (each own row's position in its document) and ``on(device, routes, kl, plan_key)``
        (the device tables one forward's layers read; ``routes(ratio)`` gives every rank's
        selection route). ``_cp.prefix.PrefixLayout`` is the one for ratio 1."""
        ...

    def vocab_size(self, base: torch.nn.Module) -> int:
        """Token ids at or above it are refused in the forward's agreement."""
        ...

    def calibration(self, state: ContextParallelState, base: torch.nn.Module) -> SelectionCalibration | None:
        """spill's cost model on the layer's own selector (None: the model does not select)."""
        ...

    def install(self, model: torch.nn.Module, base: torch.nn.Module, state: ContextParallelState) -> None:
        """Anything else the model needs (hooks, process-wide patches), each with its undo
        appended to ``state.undo``."""
        ...

    def forward_kwargs(self, kwargs: dict[str, Any]) -> None:
        """The base forward's keyword arguments after the agreement, adjusted in place (e.g.
        transformers' mask placeholder)."""
        ...
