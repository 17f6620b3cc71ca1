"""Applying and undoing context parallelism on a model, through its ``ModelAdapter``.

``apply`` swaps each attention module's class for a cached ``ContextParallel<Name>`` subclass
(torchtitan's recipe for transformers' modules: ``print(model)`` shows every CP module, and the
class, unlike a per-instance ``forward``, is what ``torch.compile`` and FSDP2 see) and registers
the model's forward pre-hook; everything it changes is recorded in the state, and ``undo_context_parallel``
takes it all back, leaving a model whose forward equals one never made parallel.
"""
from __future__ import annotations

import functools
import sys
import weakref
from typing import Any

import torch
import torch.distributed as dist

from .adapter import ModelAdapter
from .agreement import BatchCheck, check_and_agree
from .checks import agree_parameters
from .forward import FORWARD_KWARG
from .options import ContextParallelOptions
from .report import BalanceReport
from .report import balance_report as _balance_report
from .state import ContextParallelState, indexer_kl_share
from .training import group_shape, note_cp_group, note_fsdp_sharded, refuse_fsdp_before, resolve_group

__all__ = ["apply", "balance_report", "check_weights", "context_parallel_state", "indexer_kl_loss",
           "undo_context_parallel"]

STATE_ATTRIBUTE = "_sparsecp_context_parallel"  # on the model (and its base): the state
_MODULE_STATE = "_sparsecp_state"  # on each swapped module: the state its forward runs with
_CLASSES: dict[type, type] = {}  # original class -> its ContextParallel subclass


def _context_parallel_class(original: Any) -> type:
    """The cached ``ContextParallel<Name>`` subclass of ``original``: its forward is the state's
    adapter's ``attention_forward``. Registered under its name in this module, so a model holding
    it pickles and deep-copies."""
    if original in _CLASSES:
        return _CLASSES[original]

    # Run eagerly inside a compiled block (torchtitan compiles per block): the layer plans on the
    # host, reads clocks and launches asynchronous collectives, none of which Dynamo can trace; one
    # graph break around it, and the block's norms, projections and MoE compile.
    @torch.compiler.disable
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = getattr(self, _MODULE_STATE)
        return state.adapter.attention_forward(self, state, *args, **kwargs)

    def extra_repr(self: Any) -> str:
        state = getattr(self, _MODULE_STATE)
        mine = f"context_parallel(ranks={state.size}, mode={state.mode!r}, selector={state.selector!r})"
        return ", ".join(text for text in (original.extra_repr(self), mine) if text)

    name = f"ContextParallel{original.__name__}"
    made = type(name, (original,), {"forward": forward, "extra_repr": extra_repr, "__module__": __name__,
                                    "__qualname__": name, "_sparsecp_original": original})
    if hasattr(sys.modules[__name__], name):  # another class of the same name (another module)
        name = f"{name}_{len(_CLASSES)}"
        made.__name__ = made.__qualname__ = name
    setattr(sys.modules[__name__], name, made)
    _CLASSES[original] = made
    return made


def context_parallel_state(model: Any) -> ContextParallelState | None:
    """The state ``context_parallel`` attached to ``model`` (None when it is not context-parallel)."""
    return getattr(model, STATE_ATTRIBUTE, None)


def state_of(model: Any) -> ContextParallelState:
    state = context_parallel_state(model)
    if state is None:
        raise ValueError(f"this {type(model).__name__} is not context-parallel: call context_parallel on it first "
                         "(sparsecp.models.deepseek_v4's, deepseek_v32's, or sparsecp.models' with your adapter)")
    return state


def indexer_kl_loss(model: Any, group: Any = None) -> torch.Tensor | None:
    """This rank's share of the indexer KL of the last forward with gradients (the sum over its
    selecting layers), or None when ``indexer_kl_coeff`` was not given. Add it to the loss before
    ``backward()``; the shares of a CP group sum to the KL of its packed sequence. ``group``: the
    group gradients are averaged over (FSDP2's flattened dp x cp mesh, as ``causal_lm_loss`` takes
    it): the share is then scaled by the CP size for that average."""
    return indexer_kl_share(state_of(model), group)


def balance_report(model: Any, reset: bool = True, *, step_seconds: float | None = None) -> BalanceReport:
    """Whether balancing helps in this training loop: every rank's selection seconds and their
    imbalance, the selection's share of the step, the bound a perfect balancer could reach, the
    bytes each rank sent, and spill's cost-model prediction error, over the forwards since
    ``context_parallel`` or the last report (``reset=False`` keeps the window open).
    ``print(report)`` gives one line; its fields are the numbers. Collective over the CP group:
    call it on every rank at the same point of the loop (e.g. every N steps). ``step_seconds``:
    this rank's step seconds over the window, where its thread also ran other work (by default,
    the thread's CPU seconds since the last report)."""
    return _balance_report(state_of(model), reset, step_seconds)


def check_weights(model: Any) -> None:
    """Raise on every rank unless every CP rank holds the same weights now (one all-reduce of each
    parameter's float64 sum and sum of squares; ``context_parallel`` makes the same check once).
    The contract is DDP's: weights change only through the same optimizer step on every rank; a
    rank that loads or edits weights alone computes silently wrong logits for the rows whose keys
    it owns. Call it after such a load, or every N steps as a guard (collective: every rank). With
    FSDP2-sharded weights each rank holds its own shard: there is nothing to compare."""
    state = state_of(model)
    if state.fsdp_sharded:
        return
    agree_parameters(state.adapter.base(model), state.group, "check_weights")


def _agree_options(options: ContextParallelOptions, group: Any, size: int, rank: int) -> None:
    """Raise on every rank unless every rank was given the same options (one all-gather)."""
    if size == 1:
        return
    mine = options.fingerprint()
    everyone: list[Any] = [None] * size
    dist.all_gather_object(everyone, mine, group=group)
    for other, theirs in enumerate(everyone):
        for (name, value), (_, their_value) in zip(mine, theirs):
            if value != their_value:
                raise ValueError(f"context_parallel: the CP ranks were given different options: rank {rank} has "
                                 f"{name}={value}, rank {other} has {name}={their_value}")
        if len(theirs) != len(mine):
            raise ValueError(f"context_parallel: the CP ranks were given different strategy options: rank {rank} "
                             f"has {[n for n, _ in mine]}, rank {other} has {[n for n, _ in theirs]}")


def apply(model: Any, adapter: ModelAdapter, group: Any, options: ContextParallelOptions) -> Any:
    """Make ``model`` context-parallel over ``group`` through ``adapter``, in place (the body of
    every ``context_parallel``; see ``sparsecp.models.context_parallel``)."""
    refuse_fsdp_before(model, "context_parallel")
    group = resolve_group(group, "context_parallel's group")  # a 1-D DeviceMesh gives its group
    base = adapter.base(model)
    if context_parallel_state(model) is not None or context_parallel_state(base) is not None:
        raise ValueError(f"this {adapter.name} model is already context-parallel (context_parallel was called on it; "
                         "undo_context_parallel takes it back)")
    options = options.checked()
    size, rank = group_shape(group, "CP group")
    state = ContextParallelState(
        adapter=adapter, options=options, group=group, size=size, rank=rank, mode=options.mode,
        block_size=options.block_size, zigzag_min_length=options.zigzag_min_length,
        strategy_params=dict(options.strategy_params), selector=options.selector, kl_coeff=options.indexer_kl_coeff,
        attention_backend=options.attention_backend)
    adapter.prepare(state, base)
    _check_strategy(state, adapter.ratio)
    _agree_options(options, group, size, rank)
    agree_parameters(base, group, "context_parallel")
    state.calibration = adapter.calibration(state, base)
    # From here on every change is recorded in the state: undo takes them back, and so does a
    # failure half-way (the model is left as it was given, never half made parallel).
    try:
        for module in adapter.attention_modules(base):
            module.__class__ = _context_parallel_class(type(module))
            setattr(module, _MODULE_STATE, state)
            state.modules.append(module)
        handle = base.register_forward_pre_hook(functools.partial(_before_forward, state), with_kwargs=True)
        state.undo.append(handle.remove)
        adapter.install(model, base, state)
        holders = {id(model): model, id(base): base}.values()
        for holder in holders:
            setattr(holder, STATE_ATTRIBUTE, state)
            state.undo.append(functools.partial(delattr, holder, STATE_ATTRIBUTE))
        state.roots = tuple(weakref.ref(holder) for holder in holders)
    except BaseException:
        _take_back(state)
        raise
    note_cp_group(group)  # the legacy causal_lm_loss checks its labels over it
    return model


def undo_context_parallel(model: Any) -> Any:
    """Take back everything ``context_parallel`` did to ``model`` (see the public docstring)."""
    state = context_parallel_state(model)
    if state is None:
        raise ValueError("undo_context_parallel: this model is not context-parallel (context_parallel was not called "
                         "on it, or it was undone already)")
    for module in state.modules:
        cls = type(module)
        original = next((c.__dict__["_sparsecp_original"] for c in cls.__mro__ if "_sparsecp_original" in c.__dict__),
                        None)
        if original is None:
            raise RuntimeError(f"undo_context_parallel: {type(module).__name__} is no longer a context-parallel "
                               "module: its class was changed after context_parallel")
        if cls is not _CLASSES[original]:  # wrapped again (fully_shard on the attention module itself)
            raise ValueError(f"undo_context_parallel: the attention module's class {cls.__name__} was wrapped after "
                             "context_parallel (fully_shard on it?); undo before wrapping it")
    _take_back(state)
    return model


def _take_back(state: ContextParallelState) -> None:
    """Every recorded change undone, newest first: patches, hooks and attributes, then classes."""
    for restore in reversed(state.undo):
        restore()
    for module in state.modules:
        module.__class__ = type(module)._sparsecp_original  # type: ignore[attr-defined]
        if hasattr(module, _MODULE_STATE):
            delattr(module, _MODULE_STATE)
    state.modules.clear()
    state.undo.clear()
    state.layouts.clear()


def _check_strategy(state: ContextParallelState, ratio: int) -> None:
    """The strategy's name and options, checked here (on a one-document plan whose shards fit any
    block size) rather than in the first forward."""
    from ...torch import indexer_route

    local = max(4096, 2 * int(state.block_size or 0))
    indexer_route((state.size * local,), state.size, state.rank, ratio, state.mode, state.block_size,
                  state.zigzag_min_length, **state.strategy_params)


def _forward_settings(state: ContextParallelState, module: Any,
                      kwargs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """What this forward adds or changes collectives by, beyond the options: every rank must agree
    (a rank recomputing its layers where its peers do not would abort in the backward; one
    returning router logits where its peers do not would wait in the load-balancing loss). Also
    notes whether FSDP2 (``fully_shard``) wraps the model or any module of it: its losses then need
    ``group=``. One walk over the outermost module the state knows (the model holds the base)."""
    from torch.distributed.fsdp import FSDPModule

    root = state.roots[0]() if state.roots else None
    checkpointing = sharded = False
    for each in (root if root is not None else module).modules():
        checkpointing = checkpointing or bool(getattr(each, "gradient_checkpointing", False))
        sharded = sharded or isinstance(each, FSDPModule)
    state.fsdp_sharded = sharded
    return (("activation checkpointing", bool(module.training and checkpointing)),
            ("output_router_logits", bool(kwargs.get("output_router_logits"))))


def _before_forward(state: ContextParallelState, module: Any, args: tuple,
                    kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The forward's one agreement (``agreement.check_and_agree``: the batch checked on every rank
    with one host read, one all-gather of every rank's verdict and fingerprint), then the batch's
    layout planned on the host and moved to the device once. The layers then run their
    collectives with no further agreement and no host round trip."""
    adapter = state.adapter
    check = BatchCheck(model=adapter.name, group=state.group, size=state.size, rank=state.rank,
                       vocab=adapter.vocab_size(module), positions=lambda lengths: state.batch(lengths).row_position,
                       options=(*state.options.fingerprint(), *_forward_settings(state, module, kwargs)),
                       backward_order=state.backward_order.take)
    # The one all-gather also carries this rank's selector seconds of the last forward: spill's
    # cost-model refit (calibration) needs every rank's, with no collective of its own.
    times = None if state.calibration is None else state.calibration.local_times(state)
    agreed = check_and_agree(check, args, kwargs, times)
    if state.calibration is not None and state.size > 1:
        state.calibration.received_times(agreed.times)
    lengths = agreed.lengths
    if state.fsdp_sharded:  # found by _forward_settings
        note_fsdp_sharded(state.group)
    state.stats.forwards += 1
    context = state.start_forward(lengths, agreed.tokens.device, agreed.padding_tokens)
    kwargs = dict(kwargs)
    # The forward's context travels to its layers in their keyword arguments; transformers hands a
    # checkpointed layer's recompute the same ones, so a recompute replays its own forward's ids.
    kwargs[FORWARD_KWARG] = context
    kwargs["document_lengths"] = lengths  # a generator given by the caller is consumed once, here
    kwargs.pop("padding_tokens", None)  # ours: the model's forward does not take it
    adapter.forward_kwargs(kwargs)
    return args, kwargs
