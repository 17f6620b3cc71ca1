"""What ``context_parallel`` attaches to a model: ``ContextParallelState`` (options, counters,
batch layouts, the last forward's KL losses) and the KL share it gives the user."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ...torch.attention import sparse_attention, sparse_attention_backend
from .clock import SelectorClock
from .forward import ForwardContext, KLLosses
from .report import ReportMark
from .rows import BackwardOrder, DeviceRowGather, gather_rows
from .training import fsdp_without_group_text, group_shape, resolve_group

__all__ = ["LAYOUTS_KEPT", "ContextParallelState", "ContextParallelStats", "indexer_kl_share", "plan_key"]


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
                         "model.activation_checkpointing_enable() (non-reentrant, the default)")
    total = torch.stack([loss.to(state.kl_losses[0].dtype) for loss in state.kl_losses]).sum()
    if group is None:
        if state.fsdp_sharded:
            raise ValueError(fsdp_without_group_text("indexer_kl_loss"))
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
    """This rank's counters since the last ``reset()`` (``context_parallel_state(model).stats``;
    ``balance_report`` gives every rank's at once).

    Attributes:
        forwards: Model forwards.
        selections: Balanced selections run (one per selecting layer and forward; each sends one
            input and one result exchange).
        replays: Selecting layers recomputed under activation checkpointing that replayed the ids
            their forward recorded instead of selecting again.
        indexer_seconds: Wall seconds of the owner-side indexer work: the index keys, the bank
            gather and the selection, exchanges included.
        dispatch_bytes: Bytes this rank sent for what its rows read on other ranks (window halos,
            document prefixes, banks).
    """

    forwards: int = 0
    selections: int = 0        # balanced selections (each: one input and one result exchange)
    replays: int = 0           # recomputed layers that replayed their recorded ids
    indexer_seconds: float = 0.0  # owner-side indexer work: its keys, the bank gather, selection (incl. exchange)
    dispatch_bytes: int = 0    # bytes this rank sent for what its rows read elsewhere (halos, prefixes, banks)

    def reset(self) -> None:
        for name, value in ContextParallelStats().__dict__.items():
            setattr(self, name, value)


@dataclass(kw_only=True, eq=False)
class ContextParallelState:
    """What ``context_parallel`` attached to a model (``context_parallel_state(model)``), the same
    for every model: its adapter and options, the counters, the forward a layer runs in, the kept
    ids, the batch-layout cache (the adapter's layouts), the KL losses of the last forward with
    gradients, and what ``undo_context_parallel`` takes back."""

    adapter: Any  # the model's ModelAdapter
    options: Any  # the ContextParallelOptions it was made with
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
    # the torch path (sparse_attention's chunk_bytes); None: each backend's own default (1 MiB per
    # thread for the C++ kernel, 64 MiB per chunk for the torch path)
    attention_chunk_bytes: int | None = None
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
    calibration: Any = None  # spill's cost model on the layer's selector (calibration.SelectionCalibration)
    # what undo_context_parallel takes back: the modules whose class was swapped, hook handles,
    # and the restores of everything else context_parallel changed (newest last)
    modules: list[torch.nn.Module] = field(default_factory=list)
    moved_bytes: int = 0  # lifetime bytes this rank sent for other ranks' reads (balance_report's)
    selection_bytes: int = 0  # lifetime bytes this rank sent in its selection exchanges (balance_report's)
    fsdp_sharded: bool = False  # the last forward found the model's weights sharded by FSDP2
    roots: tuple[Any, ...] = ()  # weak references to the model and its base (FSDP2 may wrap either)
    report_mark: ReportMark = field(default_factory=lambda: ReportMark(time.thread_time()))
    undo: list[Callable[[], None]] = field(default_factory=list)
    # gradient exchanges whose peer ran another forward's backward, read by the next agreement
    backward_order: BackwardOrder = field(default_factory=BackwardOrder)

    @property
    def model_name(self) -> str:
        return str(self.adapter.name)

    def batch(self, lengths: tuple[int, ...]) -> Any:
        """The batch's host layout (the adapter's ``layout``; the last ``LAYOUTS_KEPT`` are cached)."""
        return self.cached_batch(lengths, lambda: self.adapter.layout(lengths, self.size, self.rank))

    def start_forward(self, lengths: tuple[int, ...], device: torch.device, padding_tokens: int = 0) -> ForwardContext:
        """Plan (host) and move (device, once per batch) everything this forward's layers read.
        ``padding_tokens``: the batch's last document is padding of this many tokens (the KL
        leaves its rows out)."""
        from ...torch import indexer_route

        params = self.strategy_params if self.calibration is None else \
            self.calibration.strategy_params(self, lengths, device)  # spill's calibrated / refitted cost model

        def routes(ratio: int) -> list[Any]:
            """Every rank's selection route of the batch at ``ratio`` (one plan, cached by sparsecp)."""
            return [indexer_route(lengths, self.size, q, ratio, self.mode, self.block_size, self.zigzag_min_length,
                                  **params) for q in range(self.size)]

        grad = torch.is_grad_enabled()
        layout = self.batch(lengths).on(device, routes, self.kl_coeff is not None and grad,
                                        plan_key(params.get("cost_model")))
        return self.begin_forward(layout, grad, padding_tokens)

    def gather(self, rows: torch.Tensor, table: DeviceRowGather, context: ForwardContext | None = None
               ) -> torch.Tensor:
        """``gather_rows`` over this state's group, counting the bytes this rank sends; with the
        forward's ``context``, its backward is tagged with that forward (``backward_order``)."""
        if self.size > 1 and rows.ndim and len(rows):
            sent = table.plan.sent_rows * rows[0].numel() * rows.element_size()
            self.stats.dispatch_bytes += sent
            self.moved_bytes += sent
        order = None if context is None else (self.backward_order.tag(context.number), self.backward_order)
        return gather_rows(rows, table, self.group, order)

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
