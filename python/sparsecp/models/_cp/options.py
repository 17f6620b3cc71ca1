"""Every option of ``context_parallel``, in one dataclass, checked once."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...torch.attention import BACKENDS as ATTENTION_BACKENDS
from .calibration import calibrate_option
from .checks import kl_coeff_option
from .state import plan_key

__all__ = ["SELECTORS", "ContextParallelOptions"]

SELECTORS = ("model", "fused")


@dataclass(frozen=True)
class ContextParallelOptions:
    """How ``context_parallel`` runs a model (the same on every rank: ``context_parallel``
    compares them across its group before anything else moves).

    Attributes:
        mode: The indexer selection's balancing strategy, as ``balanced_indexer_select`` takes it:
            the seed's 'zigzag', 'greedy', 'hybrid' or 'none', and sparsecp's own ('spill',
            'auto', ...).
        block_size, zigzag_min_length: The seed's strategy options.
        strategy_params: sparsecp strategies' parameters (e.g. ``cost_model=``, ``max_shed=``).
        selector: Where workers score rows: 'model' (the model's own indexer math in torch, any
            device and dtype) or 'fused' (sparsecp's fused C++ kernel, CPU, float32).
        indexer_kl_coeff: Enables the indexer KL loss with this coefficient (over the whole
            packed sequence: ``coeff / S`` times the sum of row losses); ``indexer_kl_loss(model)``
            reads it.
        attention_backend: ``sparsecp.torch.sparse_attention``'s backend for every attention
            layer: None picks per input (the C++ kernel for CPU tensors; on a GPU FlashMLA's
            forward or cuDNN-frontend's backward where installed and able, then Triton; else the
            chunked torch path); 'cpu', 'flashmla', 'cudnn', 'triton' or 'torch' forces one.
        calibrate: spill's (and auto's) cost model on the layer's own selector: True calibrates
            it in the first forward and refits it from every rank's measured selector seconds;
            "once" calibrates without the refit; False plans with the strategy's default model.
            A ``cost_model=`` in ``strategy_params`` skips both.
    """

    mode: str = "spill"
    block_size: int | None = None
    zigzag_min_length: int | None = None
    strategy_params: Mapping[str, Any] = field(default_factory=dict)
    selector: str = "model"
    indexer_kl_coeff: float | None = None
    attention_backend: str | None = None
    calibrate: bool | str = True

    @classmethod
    def from_arguments(cls, options: ContextParallelOptions | None, given: dict[str, Any],
                       strategy_params: dict[str, Any]) -> ContextParallelOptions:
        """``context_parallel``'s options: ``options=`` or its keyword arguments (not both)."""
        if options is None:
            return cls(**given, strategy_params=dict(strategy_params)).checked()
        if not isinstance(options, ContextParallelOptions):
            raise TypeError(f"options must be a sparsecp.models.ContextParallelOptions, got {type(options).__name__}")
        defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.name != "strategy_params"}
        changed = sorted([name for name, value in given.items() if value != defaults[name]] + list(strategy_params))
        if changed:
            raise ValueError(f"context_parallel takes its options either as options= or as keyword arguments, not "
                             f"both: got options= and {', '.join(changed)}")
        return options.checked()

    def checked(self) -> ContextParallelOptions:
        """These options, checked (a ``ValueError`` naming the bad value), with the KL
        coefficient as a float."""
        if not isinstance(self.mode, str) or not self.mode:
            raise ValueError(f"mode must be a strategy name, got {self.mode!r}")
        if self.selector not in SELECTORS:
            raise ValueError(f"selector must be one of {SELECTORS}, got {self.selector!r}")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS} or None, got "
                             f"{self.attention_backend!r}")
        calibrate_option(self.calibrate)
        if not isinstance(self.strategy_params, Mapping):
            raise TypeError(f"strategy_params must be a mapping, got {type(self.strategy_params).__name__}")
        return dataclasses.replace(self, indexer_kl_coeff=kl_coeff_option(self.indexer_kl_coeff),
                                   strategy_params=dict(self.strategy_params))

    def fingerprint(self) -> tuple[tuple[str, str], ...]:
        """The options as text, compared across ranks (a cost model by its coefficients' text)."""
        fields = [(f.name, repr(getattr(self, f.name))) for f in dataclasses.fields(self)
                  if f.name != "strategy_params"]
        params = sorted((f"strategy_params[{k!r}]", repr(plan_key(v) if k == "cost_model" else v))
                        for k, v in self.strategy_params.items())
        return (*fields, *params)
