"""What every transformers model's adapter does alike: import the modeling module (refusing a
version whose re-implemented modules changed), unwrap ``...ForCausalLM`` to its ``.model``,
refuse ``labels=`` under CP (but ``shard_labels``' marked labels), turn the KV cache off, and hand
the model our mask placeholder.

The process-wide patches (transformers' ``LOSS_MAPPING["ForCausalLM"]``, a modeling module's
function) are counted: installed with the first CP model that needs them and restored when the
last one is undone (``ProcessPatch``).
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .training import ShardLabels, causal_lm_loss, check_upstream

__all__ = ["CAUSAL_LM_LOSS", "NO_MASK_KEY", "ProcessPatch", "TransformersAdapter", "labels_text"]

TRANSFORMERS_TESTED = "5.23"
# The model's attention_mask under CP: no [S, S] mask (the CP layers mask by document). A dict
# makes transformers skip building one; V3.2's model reads its "indexed_attention" entry,
# V4's the first value.
NO_MASK_KEY = "indexed_attention"
_LABELS_POSITION = 5  # ForCausalLM.forward(input_ids, attention_mask, position_ids, past_key_values, inputs_embeds,
#                       labels, ...), DeepSeek-V4's and V3.2's alike


def labels_text(module_name: str) -> str:
    return (f"labels= would be shifted inside this rank's shard (crossing shards and documents); under context "
            f"parallelism pass labels=sparsecp.models.{module_name}.shard_labels(input_ids, document_lengths, "
            "cp_group, loss_group=G) (this rank's labels, already shifted, used as they are: .loss is "
            "causal_lm_loss over G), or compute shard_labels and causal_lm_loss yourself")


class ProcessPatch:
    """One process-wide replacement, reference-counted: ``acquire()`` installs ``wrap(original)``
    on the first call and returns the release, which restores the original after the last
    (unless something replaced the wrapper since, which is then left alone)."""

    def __init__(self, read: Callable[[], Any], write: Callable[[Any], None],
                 wrap: Callable[[Any], Any]) -> None:
        self.read, self.write, self.wrap = read, write, wrap
        self.count, self.original, self.installed = 0, None, None

    def acquire(self) -> Callable[[], None]:
        if self.count == 0:
            self.original = self.read()
            self.installed = self.wrap(self.original)
            self.write(self.installed)
        self.count += 1
        released: list[bool] = []

        def release() -> None:
            if released:
                return
            released.append(True)
            self.count -= 1
            if self.count == 0:
                if self.read() is self.installed:
                    self.write(self.original)
                self.original = self.installed = None
        return release


def _refusing_loss(original: Any) -> Any:
    @functools.wraps(original)
    def causal_lm_loss_outside_cp(*args: Any, **kwargs: Any) -> Any:  # CP_LOSS_MARK set below
        labels = kwargs.get("labels", args[1] if len(args) > 1 else None)
        cp_forward = kwargs.get("document_lengths") is not None
        if isinstance(labels, ShardLabels):
            if not cp_forward:
                raise ValueError("labels made by shard_labels(..., loss_group=) are one CP rank's shifted labels, "
                                 "but this forward is not context-parallel (no document_lengths)")
            if labels.loss_group is None:
                raise ValueError("these ShardLabels carry no loss_group (made by hand, or copied in a way that "
                                 "lost it): make them with shard_labels(..., loss_group=G)")
            logits = kwargs["logits"] if "logits" in kwargs else args[0]
            return causal_lm_loss(logits, labels, group=labels.loss_group, ignore_index=labels.ignore_index,
                                  num_items_in_batch=kwargs.get("num_items_in_batch"))
        if cp_forward:
            raise ValueError(labels_text("deepseek_v4 / deepseek_v32"))
        return original(*args, **kwargs)
    setattr(causal_lm_loss_outside_cp, _CP_LOSS_MARK, True)
    return causal_lm_loss_outside_cp


_CP_LOSS_MARK = "_sparsecp_takes_shard_labels"


def _loss_mapping() -> Any:
    from transformers.loss import loss_utils

    return loss_utils.LOSS_MAPPING


# transformers' causal-LM loss refuses a context-parallel forward's logits, however the CP model
# was wrapped: ``context_parallel(model.model)`` leaves the outer ``...ForCausalLM`` unhooked, and
# its ``labels=`` would shift labels inside each shard. The outer forward hands its keyword
# arguments (``document_lengths``, which only a CP forward takes) to the loss, so the loss is
# wrapped to refuse exactly those calls, but for labels ``shard_labels(..., loss_group=)`` marked
# (``ShardLabels``: already shifted, so used as they are, with sparsecp's loss over their group);
# every other call goes to transformers' function unchanged.
CAUSAL_LM_LOSS = ProcessPatch(lambda: _loss_mapping().get("ForCausalLM"),
                              lambda value: _loss_mapping().__setitem__("ForCausalLM", value), _refusing_loss)


class TransformersAdapter:
    """The base of a transformers model's adapter (see the module docstring). A subclass names
    the modeling module, its classes and the fingerprints of what it re-implements, and supplies
    ``attention_forward``, ``layout``, ``prepare`` and ``calibration``."""

    name = "model"
    module_name = "model"
    ratio = 1
    modeling_module = ""  # e.g. "transformers.models.deepseek_v4.modeling_deepseek_v4"
    causal_lm_class = ""
    model_class = ""
    fingerprints: dict[str, str] = {}

    def __init__(self) -> None:
        self.modeling = self._modeling()

    def _modeling(self) -> Any:
        """transformers' modeling module, with a clear error when it is missing or its modules
        differ from the tested version's (``fingerprints``)."""
        try:
            importlib.import_module(self.modeling_module.rpartition(".")[0])  # the model's package first
            modeling = importlib.import_module(self.modeling_module)
        except ImportError as error:
            try:
                import transformers
                found = f"transformers {transformers.__version__} has no {self.causal_lm_class}"
            except ImportError:
                found = "transformers is not installed"
            raise ImportError(f"sparsecp.models.{self.module_name} needs transformers >= {TRANSFORMERS_TESTED} "
                              f"({self.causal_lm_class}): {found}; pip install 'transformers>={TRANSFORMERS_TESTED}' "
                              "or pip install 'sparsecp[models]'") from error
        check_upstream(modeling, self.fingerprints, TRANSFORMERS_TESTED, f"sparsecp.models.{self.module_name}")
        return modeling

    def base(self, model: torch.nn.Module) -> torch.nn.Module:
        causal_lm, inner = getattr(self.modeling, self.causal_lm_class), getattr(self.modeling, self.model_class)
        base = model.model if isinstance(model, causal_lm) else model
        if not isinstance(base, inner):
            raise TypeError(f"context_parallel needs a transformers {self.causal_lm_class} or {self.model_class}, "
                            f"got {type(model).__name__}")
        return base

    def attention_modules(self, base: Any) -> Sequence[torch.nn.Module]:
        return [layer.self_attn for layer in base.layers]

    def vocab_size(self, base: Any) -> int:
        return int(base.config.vocab_size)

    def install(self, model: torch.nn.Module, base: Any, state: Any) -> None:
        config = base.config
        use_cache = config.use_cache
        config.use_cache = False  # generation (a KV cache) is out of scope
        state.undo.append(lambda: setattr(config, "use_cache", use_cache))
        state.undo.append(CAUSAL_LM_LOSS.acquire())
        if model is not base:
            handle = model.register_forward_pre_hook(functools.partial(_refuse_labels, self.module_name),
                                                     with_kwargs=True)
            state.undo.append(handle.remove)

    def forward_kwargs(self, kwargs: dict[str, Any]) -> None:
        kwargs["attention_mask"] = {NO_MASK_KEY: None}  # no [S, S] mask: the CP layers mask by document
        kwargs["use_cache"] = False



def _refuse_labels(module_name: str, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    """A context-parallel CausalLM's forward pre-hook: ``labels`` by keyword or by position, unless
    ``shard_labels(..., loss_group=)`` made them (``ShardLabels``, used as they are)."""
    labels = kwargs.get("labels", args[_LABELS_POSITION] if len(args) > _LABELS_POSITION else None)
    if labels is not None and not isinstance(labels, ShardLabels):
        raise ValueError(labels_text(module_name))
    if labels is not None and not getattr(module.loss_function, _CP_LOSS_MARK, False):
        # A model whose loss_function was replaced (a kernel library's patch, the user's) would
        # shift the labels again: only sparsecp's wrapper takes them as they are.
        found = getattr(module.loss_function, "__qualname__", module.loss_function)
        raise ValueError(f"labels=ShardLabels need transformers' causal-LM loss as sparsecp wraps it, but this "
                         f"model's loss_function is {found!r} (replaced): it would shift the labels again; compute "
                         "causal_lm_loss on the logits instead")
