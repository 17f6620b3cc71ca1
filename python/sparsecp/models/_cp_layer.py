"""Model-agnostic pieces of a context-parallel sparse-attention model: the per-forward context,
the forward's one agreement, the balanced selection on an agreed route, the selector clock.

Every sparsecp model integration (``deepseek_v32`` uses this module; ``deepseek_v4`` holds its
own copies of the same pieces in ``_v4_state``, ``_v4_attention``, ``_v4_selector`` and
``deepseek_v4._before_model_forward``) runs one forward the same way:

1. the model's forward pre-hook checks the batch on every rank and agrees on it across ranks
   (``check_and_agree``: one all-gather of each rank's verdict and fingerprint, one host read
   of the token ids' range and the positions), then plans the batch's layout on the host and
   moves it to the device once;
2. the layers receive that forward's ``ForwardContext`` in their keyword arguments (transformers
   hands a checkpointed layer's recompute the same ones), run their collectives with no further
   agreement, and record their selections in it;
3. a layer recomputed by activation checkpointing (``in_recompute``) replays the ids its first
   forward recorded: no selector call and no selection collective.
"""
from __future__ import annotations

import hashlib
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from ..torch._agreement import capture
from ..torch._exchange import launch_rows, to_owners
from ..torch._overlapped import launch_on_route
from ..torch.attention import sparse_attention, sparse_attention_backend
from ._cp_checks import BATCH_DIGEST
from ._cp_training import document_lengths, group_shape, resolve_group

__all__ = ["AgreedBatch", "BankView", "BatchCheck", "ContextParallelStats", "ForwardContext", "KLLosses",
           "SelectorClock", "balanced_select",
           "check_and_agree", "in_recompute", "indexer_kl_share", "lengths_key", "plan_key", "StateBookkeeping"]


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

    The layers' KL losses go to the state (``StateBookkeeping.kl_losses``, the last forward with
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


class SelectorClock:
    """Counts selector calls and the CPU seconds of the calling thread spent in them (per rank).

    CPU time, not wall time: with more ranks than cores (tests, an example on a laptop) a rank's
    wall time counts the time its peers held the core, which makes balanced plans, whose ranks
    all select at once, look slower than they are. For a CUDA selector this measures the host's
    share only; time the device with events (``sparsecp.torch.calibrate`` does)."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0
        # Never reset by callers (who zero calls / seconds per step): the cost-model refit
        # (_cp_calibration) takes each forward's difference.
        self.lifetime_calls = 0
        self.lifetime_seconds = 0.0

    def timed(self, selector: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def run(*args: Any) -> torch.Tensor:
            start = time.thread_time()
            try:
                return selector(*args)
            finally:
                spent = time.thread_time() - start
                self.calls += 1
                self.seconds += spent
                self.lifetime_calls += 1
                self.lifetime_seconds += spent
        return run


class BankView:
    """A worker's part of a key bank: the rows it gathered (``bank``), and where each global bank
    row sits in it (``locate``; a document's prefix is contiguous in both)."""

    def __init__(self, bank: torch.Tensor, locate: Callable[[int], int] | None = None) -> None:
        self.bank = bank
        self.locate = locate if locate is not None else (lambda row: row)


def balanced_select(route: Any, route_rows: Any, inputs: tuple[torch.Tensor, ...], selector: Any, topk: int,
                    group: Any) -> torch.Tensor:
    """``balanced_indexer_select`` on a batch's agreed route, with no agreement round: the owners'
    rows (``inputs``, each ``[1, own rows, width]``) to their workers, ``selector(qr, weights,
    (cos, sin), segments)`` there, int32 ids ``[own rows, topk]`` back to the owners.

    ``route`` is this rank's ``IndexerRoute`` (``indexer_route``), ``route_rows`` its row lists on
    the device (``_exchange._device_rows``), both made once per batch. A selector that raises on
    one rank still completes the result exchange (with -1 padding) before raising there, so its
    peers are not left waiting."""
    exchange = launch_on_route(inputs, route, group)
    qr, weights, cos, sin = exchange.wait()
    selected, failure = capture(lambda: selector(qr, weights, (cos, sin), route.segments)[0])
    back = to_owners(route, route_rows, inputs[0].shape[-2])
    if failure is not None:
        padding = torch.full((route.query_count, topk), -1, dtype=torch.int32, device=qr.device)
        launch_rows(padding, back, group).wait()
        raise failure
    return launch_rows(selected, back, group).wait()


def lengths_key(lengths: Any, model: str) -> tuple[int, ...]:
    """``document_lengths`` as a tuple of positive ints (the key of the batch's layout)."""
    if lengths is None:
        raise ValueError(f"sparsecp: a context-parallel {model} needs document_lengths=... (the lengths of the "
                         "packed documents of the whole sequence, identical on every rank) in model(...)")
    return document_lengths(lengths)


@dataclass(frozen=True)
class BatchCheck:
    """What ``check_and_agree`` needs to know of the model and its CP group."""

    model: str                      # the model's name in messages ("DeepSeek-V3.2")
    group: Any
    size: int
    rank: int
    vocab: int
    positions: Callable[[tuple[int, ...]], np.ndarray]  # the expected positions of this rank's rows
    options: tuple[tuple[str, Any], ...]  # settings every rank must share (mode, KL, selector)


_BATCH = "batch (shard_batch's digest of the whole batch)"


def _fingerprint(check: BatchCheck, lengths: tuple[int, ...], local: int, dtype: Any,
                 batch: str | None) -> tuple[tuple[str, Any], ...]:
    digest = hashlib.sha256(np.asarray(lengths, dtype=np.int64).tobytes()).hexdigest()[:16]
    return (("document count", len(lengths)), ("total tokens", sum(lengths)), ("document lengths", digest),
            (_BATCH, batch), ("shard length", local), ("dtype", str(dtype)),
            ("grad enabled", torch.is_grad_enabled()), *check.options)


class AgreedBatch(NamedTuple):
    """What every rank agreed on (``check_and_agree``)."""

    lengths: tuple[int, ...]  # the packed documents' lengths
    tokens: torch.Tensor      # this rank's input_ids (or inputs_embeds)
    padding_tokens: int       # the last document is padding of this many tokens (0: none)
    times: list[Any]          # every rank's ``times`` (check_and_agree's argument), in rank order


def _check_batch(check: BatchCheck, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple[int, ...], int, Any,
                                                                                          int]:
    """This rank's verdict on its inputs: (lengths, shard rows, embeddings dtype or None, padding
    tokens), or a ValueError naming the bad value."""
    if kwargs.get("use_cache") or kwargs.get("past_key_values") is not None:
        raise ValueError("sparsecp context parallelism trains on packed batches: use_cache=True / past_key_values "
                         "(a KV cache) is not supported; generation is out of scope")
    if kwargs.get("attention_mask") is not None:
        raise ValueError("attention_mask is not supported under context parallelism: documents are isolated by "
                         "document_lengths (pack without padding, or make the padding a document of its own)")
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions=True is not supported under context parallelism: each rank attends "
                         "its rows to a few gathered keys in bounded memory and never forms the [heads, S, S] "
                         "attention matrix")
    input_ids = kwargs.get("input_ids", args[0] if args else None)
    embeds = kwargs.get("inputs_embeds")
    tokens = input_ids if input_ids is not None else embeds
    lengths = lengths_key(kwargs.get("document_lengths"), check.model)
    padding = kwargs.get("padding_tokens", 0) or 0
    if isinstance(padding, bool) or not isinstance(padding, int) or padding not in (0, lengths[-1]):
        raise ValueError(f"padding_tokens must be 0 or the length of the batch's last document ({lengths[-1]}: "
                         f"the padding is a document of its own, as pad_to_multiple makes it), got {padding!r}")
    if tokens is None or tokens.ndim < 2 or tokens.shape[0] != 1:
        shape = None if tokens is None else tuple(tokens.shape)
        raise ValueError(f"a context-parallel {check.model} takes one packed sequence, input_ids [1, S / cp]; "
                         f"got {shape}")
    local = int(tokens.shape[1])
    if local * check.size != sum(lengths):
        raise ValueError(f"rank {check.rank}'s shard has {local} tokens, but document_lengths sum to "
                         f"{sum(lengths)} = {check.size} ranks x {sum(lengths) / check.size:g}: pass this rank's "
                         "shard (shard_batch)")
    positions = kwargs.get("position_ids")
    if positions is None:
        raise ValueError(f"rank {check.rank}: position_ids are missing: pass the positions shard_batch returns "
                         "(each document's tokens numbered from 0)")
    if tuple(positions.shape) != (1, local):
        raise ValueError(f"rank {check.rank}: position_ids must be [1, {local}] (this rank's shard), got "
                         f"{tuple(positions.shape)}")
    expected = torch.from_numpy(check.positions(lengths)).to(positions.device)
    checks = [(positions[0].long() != expected).sum()]
    if input_ids is not None:
        checks += [input_ids.min(), input_ids.max()]
    values = torch.stack([c.long().to(positions.device) for c in checks]).tolist()  # the one host read
    if values[0]:
        raise ValueError(f"rank {check.rank}: position_ids must restart at 0 at each document start "
                         f"({values[0]} of {local} differ from shard_batch's)")
    if input_ids is not None and (values[1] < 0 or values[2] >= check.vocab):
        bad = values[1] if values[1] < 0 else values[2]
        raise ValueError(f"rank {check.rank}: input_ids holds token id {bad}, outside the vocabulary "
                         f"[0, {check.vocab})")
    return lengths, local, embeds.dtype if embeds is not None else None, padding


def check_and_agree(check: BatchCheck, args: Sequence[Any], kwargs: dict[str, Any], times: Any = None) -> AgreedBatch:
    """The forward's one agreement: checks this rank's batch (shapes, positions, token ids in range:
    one host read), then one all-gather of every rank's verdict and fingerprint, so that bad input
    raises the same ``ValueError`` on every rank (this rank's own error first, else the first
    rank's that rejected its inputs, else the first setting two ranks disagree on) instead of a
    hang in the layers' collectives.

    ``padding_tokens=`` (optional) names the batch's last document as padding (``pad_to_multiple``):
    it must be 0 or that document's length; the indexer KL then leaves its rows out. ``times``
    (any picklable value, e.g. this rank's selector seconds of the last forward for spill's
    cost-model refit, ``_cp_calibration``) rides on the same all-gather: every rank gets every
    rank's, with no collective of its own.

    Returns:
        The ``AgreedBatch`` once every rank agrees.
    """
    error: ValueError | None = None
    fingerprint = None
    lengths: tuple[int, ...] | None = None
    padding = 0
    try:
        lengths, local, dtype, padding = _check_batch(check, args, kwargs)
        # shard_batch tags each shard with a digest of the whole batch: a rank handed another
        # batch's shard of the same lengths is refused (an untagged shard, e.g. a copy, is not compared).
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        fingerprint = _fingerprint(check, lengths, local, dtype, getattr(input_ids, BATCH_DIGEST, None)) + \
            (("padding_tokens", padding),)
    except ValueError as caught:
        error = caught
    if check.size > 1:
        everyone: list[Any] = [None] * check.size
        dist.all_gather_object(everyone, (None if error is None else str(error), fingerprint, times),
                               group=check.group)
        if error is not None:  # this rank's own error first
            raise error
        for rank, (message, _, _) in enumerate(everyone):
            if message is not None:
                raise ValueError(f"rank {rank} rejected its inputs: {message}")
        for rank, (_, theirs, _) in enumerate(everyone):
            for (name, mine), (_, other) in zip(fingerprint or (), theirs or ()):
                if mine != other and not (name == _BATCH and None in (mine, other)):
                    raise ValueError(f"context-parallel ranks disagree on the batch: rank {check.rank} has {name} "
                                     f"{mine!r}, rank {rank} has {other!r}")
        gathered = [entry[2] for entry in everyone]
    else:
        if error is not None:
            raise error
        gathered = [times]
    assert lengths is not None
    input_ids = kwargs.get("input_ids", args[0] if args else None)
    tokens = input_ids if input_ids is not None else kwargs.get("inputs_embeds")
    assert tokens is not None  # _check_batch refused a batch without them
    return AgreedBatch(lengths, tokens, padding, gathered)


def indexer_kl_share(state: Any, group: Any = None) -> torch.Tensor | None:
    """This rank's share of the indexer KL of the model's last forward with gradients (the sum of
    its layers' losses), or None when the KL is off (``state.kl_coeff``).

    The shares of one CP group sum to the KL of its packed batch, the convention for gradients
    summed over the CP ranks. ``group``: the group whose ranks' gradients are *averaged*
    (FSDP2's or DDP's flattened data x context group, as ``causal_lm_loss`` takes it): the share
    is then multiplied by the CP size, so that the average over that group is the gradient of the
    mean over its data-parallel batches of each batch's KL."""
    if state.kl_coeff is None:
        return None
    if not state.kl_losses:
        if state.forwards_with_grad == 0:
            raise ValueError("indexer_kl_loss: the model has run no forward with gradients since the KL was enabled")
        raise ValueError("indexer_kl_loss: the last forward with gradients computed no KL: its attention layers ran "
                         "without gradients, as under reentrant activation checkpointing (use_reentrant=True); use "
                         "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})")
    total = torch.stack([loss.to(state.kl_losses[0].dtype) for loss in state.kl_losses]).sum()
    if group is None:
        return total
    size = group_shape(resolve_group(group, "indexer_kl_loss's group"), "indexer_kl_loss's group")[0]
    if size % state.size:
        raise ValueError(f"indexer_kl_loss: its group has {size} ranks, not a multiple of the CP size {state.size}: "
                         "pass the data x context group gradients are averaged over (FSDP2's flattened mesh)")
    return total * state.size


def plan_key(cost_model: Any) -> Any:
    """What a batch's routes depend on beyond its lengths and the strategy: spill's cost model,
    by value (its coefficients; a refit makes a new one), None without one. Part of the key of
    the device tables a batch layout caches."""
    if cost_model is None:
        return None
    names = ("a", "b", "c", "d", "topk", "candidates", "quantum")
    if all(hasattr(cost_model, name) for name in names):
        return tuple(getattr(cost_model, name) for name in names)
    return repr(cost_model)


LAYOUTS_KEPT = 8  # batch layouts a state caches for reuse (a forward holds its own: see ForwardContext)


@dataclass
class ContextParallelStats:
    """Counters since the last ``reset()`` (per rank)."""

    forwards: int = 0
    selections: int = 0        # balanced selections (each: one input and one result exchange)
    replays: int = 0           # recomputed layers that replayed their recorded ids
    indexer_seconds: float = 0.0  # owner-side indexer work: its keys, the bank gather, selection (incl. exchange)
    dispatch_bytes: int = 0    # bytes this rank sent for what its rows read elsewhere (halos, prefixes, banks)

    def reset(self) -> None:
        for name, value in ContextParallelStats().__dict__.items():
            setattr(self, name, value)


@dataclass(kw_only=True)
class StateBookkeeping:
    """What every model's ``ContextParallelState`` holds and does the same way: its options and
    counters, the forward a layer runs in, the kept ids, the batch-layout cache, and the counters
    and KL losses of a new forward. A model's state adds its own fields and ``batch`` / layouts;
    ``model_name`` names the model in messages."""

    model_name = "model"
    group: Any
    size: int
    rank: int
    mode: str
    block_size: int | None
    zigzag_min_length: int | None
    strategy_params: dict[str, Any]
    selector: str
    kl_coeff: float | None
    # scratch budget of one attention row block: per thread for the C++ kernel, per row chunk for
    # the torch path (sparse_attention's chunk_bytes)
    attention_chunk_bytes: int = 64 << 20
    # sparse_attention's backend: None picks per input ('cpu' kernel on CPU tensors, then 'triton',
    # then 'torch'); a name forces it. attention_path: what the last layer call ran.
    attention_backend: str | None = None
    attention_path: str | None = None
    keep_last_ids: bool = False  # keep the last forward's ids for ``last_ids`` (tests, diagnostics)
    stats: ContextParallelStats = field(default_factory=ContextParallelStats)
    clock: SelectorClock = field(default_factory=SelectorClock)
    layouts: dict[tuple[int, ...], Any] = field(default_factory=dict)
    forwards: int = 0  # numbers each model forward
    forwards_with_grad: int = 0
    # the last forward with gradients' KL losses (its context refers to this list only weakly: see ForwardContext)
    kl_losses: list[torch.Tensor] = field(default_factory=list)
    last_selection: dict[int, torch.Tensor] = field(default_factory=dict)
    calibration: Any = None  # spill's cost model on the layer's selector (_cp_calibration.SelectionCalibration)

    def attend(self, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float, *,
               value_dim: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's attention over each row's listed ``kv`` rows (``sparse_attention``'s
        contract) on this state's backend; the backend taken is kept in ``attention_path``."""
        path = sparse_attention_backend(q, kv, indices, sinks, self.attention_backend)
        self.attention_path = path
        return sparse_attention(q, kv, indices, scale, value_dim=value_dim, sinks=sinks, backend=path,
                                chunk_bytes=self.attention_chunk_bytes)

    def context(self, forward: Any) -> ForwardContext:
        """The forward a layer runs in (from its keyword arguments)."""
        if not isinstance(forward, ForwardContext):
            raise ValueError(f"sparsecp: a context-parallel {self.model_name} layer ran outside its model's forward; "
                             "call the model (model(input_ids=..., position_ids=..., document_lengths=...)), not "
                             "its layers")
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

    def cached_batch(self, lengths: tuple[int, ...], make: Callable[[], Any]) -> Any:
        """The batch's host layout, ``make()`` on a miss (the last ``LAYOUTS_KEPT`` are cached)."""
        if lengths in self.layouts:
            self.layouts[lengths] = self.layouts.pop(lengths)  # most recently used last
        else:
            while len(self.layouts) >= LAYOUTS_KEPT:
                self.layouts.pop(next(iter(self.layouts)))
            self.layouts[lengths] = make()
        return self.layouts[lengths]

    def begin_forward(self, layout: Any, grad: bool, padding_tokens: int) -> ForwardContext:
        """A new forward's context over its device ``layout``, and the state's counters."""
        self.forwards += 1
        keep: dict[int, torch.Tensor] | None = None
        if self.keep_last_ids:
            self.last_selection = keep = {}
        losses = None
        if grad:  # an evaluation forward in between keeps the training forward's KL
            self.kl_losses = losses = KLLosses()
            self.forwards_with_grad += 1
        return ForwardContext(self.forwards, layout, grad, keep, padding_tokens, losses)
