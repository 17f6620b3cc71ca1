"""Model-agnostic pieces of context-parallel (CP) training on packed batches.

A packed batch is one row ``[1, S]`` of documents laid end to end (``document_lengths``); CP
splits it contiguously, ``S / cp`` rows a rank. Everything here is independent of the model
whose attention is made context-parallel (``deepseek_v4`` now, ``deepseek_v32`` next): which
ranks form the CP group, which rows and positions a rank holds, the next-token labels of its
rows, the loss over the valid tokens of the whole global batch, the gradient reduction of
replicated weights, the MoE load-balancing loss on the whole packed row, and the check that the
installed transformers is the one a model integration re-implements.

**Groups and meshes.** Every ``group`` argument takes a ``torch.distributed`` ``ProcessGroup``
(None: the default group) or a 1-D ``DeviceMesh`` (``mesh["cp"]``, or the flattened
``mesh["dp", "cp"]._flatten()`` for the loss); a mesh of more dimensions is refused, naming its
dimensions, since which of them is the CP one would be a guess.

**Gradient conventions.** A loss here is one rank's term of a sum over ranks. Two ways of
combining the ranks' gradients exist and the loss must match the one used:

* *averaged over a group* (FSDP2's ``fully_shard`` default reduce-scatter, DDP, and
  ``all_reduce_gradients(..., average=True)``): each rank's term is multiplied by the group's
  size; ``causal_lm_loss(..., group=G)`` and ``load_balancing_loss`` do this;
* *summed* (``all_reduce_gradients`` by default, the replicated-weights path): each rank's term
  is its plain share; ``causal_lm_loss`` without ``group`` does this.

The order with FSDP2 (``torch.distributed.fsdp.fully_shard``): build the model, enable activation
checkpointing, ``context_parallel(model, mesh["cp"])``, then ``fully_shard`` each decoder layer
and the model over the flattened dp x cp mesh, then build the optimizer over the (now sharded)
parameters. ``context_parallel`` replaces each attention module's ``forward`` and hooks the
model; ``fully_shard`` keeps both (it swaps the module's class and registers its own hooks), so
the two compose in that order. The other order is refused by ``refuse_fsdp_before``: the
parameters are already ``DTensor`` shards and the hooks would run outside FSDP's.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .checks import BATCH_DIGEST, batch_digest

__all__ = [
    "all_reduce_gradients", "causal_lm_loss", "count_valid_tokens", "document_lengths", "group_shape",
    "load_balancing_loss", "note_cp_group", "pack_rows", "pad_to_multiple", "positions_in_documents",
    "refuse_fsdp_before", "resolve_group", "ShardLabels", "shard_batch", "shard_labels", "shard_shape",
    "upstream_fingerprints", "check_upstream",
]


# ----------------------------------------------------------------------------------------------
# groups and meshes


def resolve_group(group: Any, what: str = "group") -> Any:
    """The ``ProcessGroup`` behind ``group``: a ProcessGroup or None (the default group) is
    returned as is; a 1-D ``DeviceMesh`` gives its group; a mesh of more dimensions raises
    ``ValueError`` naming its dimensions (pass ``mesh["cp"]``, or ``mesh["dp", "cp"]._flatten()``)."""
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:  # torch built without distributed: only process groups exist
        return group
    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            names = group.mesh_dim_names or tuple(f"dim{i}" for i in range(group.ndim))
            shape = " x ".join(f"{n}={s}" for n, s in zip(names, group.mesh.shape))
            raise ValueError(f"{what} must be a ProcessGroup or a 1-D DeviceMesh (one dimension, the ranks it "
                             f"spans), got a {group.ndim}-D mesh ({shape}): pass the CP dimension, mesh['cp'], or "
                             "for the loss the flattened mesh['dp', 'cp']._flatten()")
        return group.get_group()
    return group


def group_shape(group: Any, what: str = "group") -> tuple[int, int]:
    """``(size, rank)`` of ``group`` (a ProcessGroup, 1-D DeviceMesh or None), checked."""
    group = resolve_group(group, what)
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("sparsecp context parallelism needs torch.distributed initialised (a CP process group)")
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"this process (global rank {dist.get_rank()}) is not a member of the {what} it was given")
    return size, rank


_CP_GROUPS: list[Any] = []  # the groups context_parallel was given in this process, most recent last
_CP_GROUPS_KEPT = 8


def note_cp_group(group: Any) -> None:
    """Remember a group ``context_parallel`` made a model context-parallel over (None: the default
    group): the legacy ``causal_lm_loss`` (no ``group=``) checks its labels over it."""
    resolved = dist.group.WORLD if group is None else group
    _CP_GROUPS[:] = [kept for kept in _CP_GROUPS if kept is not resolved][-(_CP_GROUPS_KEPT - 1):] + [resolved]


_SHARDED_GROUPS: list[Any] = []  # CP groups whose model's weights a forward found sharded by FSDP2


def note_fsdp_sharded(group: Any) -> None:
    """Remember that a model context-parallel over ``group`` runs with FSDP2-sharded weights:
    FSDP2 *averages* gradients over its mesh, so its losses need ``group=`` (which scales them for
    that mean); the forms without it (shares summed over the CP ranks) would give gradients 1/W
    of the right size, and are refused for that group."""
    resolved = dist.group.WORLD if group is None else group
    if not any(kept is resolved for kept in _SHARDED_GROUPS):
        _SHARDED_GROUPS[:] = _SHARDED_GROUPS[-(_CP_GROUPS_KEPT - 1):] + [resolved]


def fsdp_without_group_text(what: str) -> str:
    return (f"{what} without group=: this model's weights are FSDP2 shards (fully_shard), and FSDP2 averages "
            "gradients over its mesh, so without group= the gradients come out 1/W of the right size (W the mesh's "
            "ranks); pass group= the mesh fully_shard was given (the flattened dp x cp mesh)")


def _cp_group_of_size(size: int) -> tuple[bool, Any]:
    """``(True, group)`` for the group of ``size`` ranks holding this process that the labels of a
    loss without ``group=`` are checked over: the latest ``context_parallel`` group of that size,
    else the default group if it has that size; ``(False, None)`` when there is none (or
    torch.distributed is not initialised). A group of 1 needs no communication: ``(True, None)``
    (None: this rank alone)."""
    if size == 1:
        return True, None
    if not dist.is_available() or not dist.is_initialized():
        return False, None
    for group in reversed(_CP_GROUPS):
        try:
            if dist.get_world_size(group) == size and dist.get_rank(group) >= 0:
                return True, group
        except (RuntimeError, ValueError):  # a group destroyed since
            continue
    if dist.get_world_size() == size:
        return True, dist.group.WORLD
    return False, None


# ----------------------------------------------------------------------------------------------
# the packed batch and its shards


def document_lengths(lengths: Any) -> tuple[int, ...]:
    """``lengths`` (a sequence or tensor of positive integers) as a tuple of ints, checked."""
    if lengths is None:
        raise ValueError("document_lengths is required: the lengths of the packed documents, in order, summing to "
                         "the sequence length, identical on every rank")
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    try:
        values = tuple(int(v) for v in lengths)
        exact = all(float(v) == int(v) for v in lengths)
    except (TypeError, ValueError) as error:
        raise ValueError(f"document_lengths must be a sequence of positive integers, got {lengths!r}") from error
    if not exact:
        raise ValueError(f"document_lengths must be integers, got {lengths!r}")
    if not values or min(values) < 1:
        raise ValueError(f"document_lengths must be positive, got {values}")
    return values


def shard_shape(lengths: Any, tokens: int, group: Any) -> tuple[tuple[int, ...], int, int, int]:
    """``(lengths, cp size, rank, rows per rank)`` of a packed sequence of ``tokens`` tokens."""
    values = document_lengths(lengths)
    size, rank = group_shape(group, "CP group")
    if sum(values) != tokens:
        raise ValueError(f"document_lengths sum to {sum(values)}, but the sequence has {tokens} tokens")
    if tokens % size:
        raise ValueError(f"the packed sequence has {tokens} tokens, not a multiple of the CP size {size}: pad it "
                         "with a document of its own whose labels are all ignored (pad_to_multiple)")
    return values, size, rank, tokens // size


def positions_in_documents(lengths: Sequence[int]) -> np.ndarray:
    """int64 [S]: each token's position inside its document (0 at each document start)."""
    starts = np.cumsum((0,) + tuple(lengths[:-1]), dtype=np.int64)
    return np.arange(sum(lengths), dtype=np.int64) - np.repeat(starts, lengths)


def _one_row(tensor: torch.Tensor, what: str) -> torch.Tensor:
    row = tensor if tensor.ndim == 2 else tensor[None]
    if row.ndim != 2 or row.shape[0] != 1:
        raise ValueError(f"{what} must be one packed sequence [1, S] (or [S]), got shape {tuple(tensor.shape)}: "
                         "make a [B, S] micro-batch one packed row with pack_rows (exact: attention never "
                         "crosses a document)")
    return row


def pack_rows(input_ids: torch.Tensor, lengths: Any = None, labels: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, tuple[int, ...], torch.Tensor | None]:
    """A ``[B, S]`` micro-batch (torchtitan's shape) as the one packed row a context-parallel
    model takes: its rows laid end to end, ``[1, B * S]``, with their documents' lengths in order.

    Attention never crosses a document, so the packed row gives each token the logits, loss and
    gradients it has in its own row: exact, not an approximation (tested against the model's own
    ``[B, S]`` forward). Then ``shard_batch`` / ``shard_labels`` / ``pad_to_multiple`` as for any
    packed row.

    Args:
        input_ids: ``[B, S]``.
        lengths: Per row, the lengths of its documents (a sequence of B sequences, each summing to
            S); None: each row is one document (a plain causal-LM batch). Padding in a row must
            be a document of its own (labels ``-100``): there is no attention mask.
        labels: Labels aligned with ``input_ids`` ``[B, S]`` (not yet shifted: ``shard_labels``
            shifts them; torchtitan's datasets yield shifted ones), or None.

    Returns:
        ``(input_ids [1, B * S], document lengths, labels [1, B * S] or None)``.
    """
    if input_ids.ndim != 2:
        raise ValueError(f"pack_rows' input_ids must be a [B, S] micro-batch, got shape {tuple(input_ids.shape)}")
    rows, width = (int(n) for n in input_ids.shape)
    if lengths is None:
        per_row: list[tuple[int, ...]] = [(width,)] * rows
    else:
        if isinstance(lengths, torch.Tensor):
            lengths = lengths.tolist()
        try:
            per_row = [document_lengths(row) for row in lengths]
        except (TypeError, ValueError) as error:
            raise ValueError(f"pack_rows' lengths must give each of the {rows} rows its document lengths (a "
                             f"sequence of sequences), got {lengths!r}") from error
        if len(per_row) != rows:
            raise ValueError(f"pack_rows' lengths give {len(per_row)} rows' documents, but input_ids has {rows} rows")
        for index, row in enumerate(per_row):
            if sum(row) != width:
                raise ValueError(f"pack_rows: row {index}'s document lengths {row} sum to {sum(row)}, not the row's "
                                 f"{width} tokens")
    if labels is not None and tuple(labels.shape) != (rows, width):
        raise ValueError(f"labels must be aligned with input_ids (shape {(rows, width)}), got shape "
                         f"{tuple(labels.shape)}")
    packed_labels = None if labels is None else labels.reshape(1, rows * width)
    return input_ids.reshape(1, rows * width), tuple(n for row in per_row for n in row), packed_labels


def shard_batch(input_ids: torch.Tensor, lengths: Any, group: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's contiguous shard of a packed sequence and its positions.

    Args:
        input_ids: The whole packed sequence, ``[1, S]`` (or ``[S]``), identical on every rank.
        lengths: The lengths of its documents, in order, summing to S.
        group: The CP group (ProcessGroup, 1-D DeviceMesh, or None for the default group).

    Returns:
        ``(ids, position_ids)``, each ``[1, S / cp]``: tokens ``[rank * S / cp, (rank + 1) * S / cp)``
        and their positions inside their documents (restarting at 0 at each document start).
    """
    ids = _one_row(input_ids, "shard_batch's input_ids")
    values, _, rank, local = shard_shape(lengths, int(ids.shape[1]), group)
    positions = torch.from_numpy(positions_in_documents(values)[rank * local:(rank + 1) * local]).to(ids.device)
    shard = ids[:, rank * local:(rank + 1) * local]
    # The forward's agreement compares this digest across ranks: a rank handed another batch's
    # shard (same lengths, other tokens) is refused (lost if the shard is copied, e.g. .to()).
    setattr(shard, BATCH_DIGEST, batch_digest(ids))
    return shard, positions[None]


class ShardLabels(torch.Tensor):
    """Labels ``shard_labels(..., loss_group=G)`` made: this rank's *already shifted* next-token
    targets, marked so that a context-parallel ``...ForCausalLM`` takes them as ``labels=`` and
    uses them as they are (``model(**batch).loss``, a Trainer-style loop), never shifting them
    again. Any other ``labels=`` stays refused. The mark (a tensor subclass) and its loss group
    survive ``.to(device)``, ``.clone()``, ``torch.stack`` and slicing.

    Attributes:
        loss_group: The group the loss is a term of (``causal_lm_loss``'s ``group``): with
            FSDP2, the mesh ``fully_shard`` was given (the flattened dp x cp mesh); else the CP
            group with gradients averaged over it.
        ignore_index: The label that is not learned.
    """

    loss_group: Any = None
    ignore_index: int = -100

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = super().__torch_function__(func, types, args, kwargs or {})
        given = [*args, *(kwargs or {}).values()]
        given += [item for a in given if isinstance(a, (tuple, list)) for item in a]  # torch.stack's list
        source = next((a for a in given if isinstance(a, ShardLabels)), None)
        if source is None:
            return result
        outs = result if isinstance(result, (tuple, list)) else (result,)
        kept = []
        for out in outs:
            if isinstance(out, ShardLabels):
                if out.dtype.is_floating_point or out.dtype.is_complex or out.dtype == torch.bool:
                    with torch._C.DisableTorchFunctionSubclass():  # a loss or a mask is not labels
                        out = out.as_subclass(torch.Tensor)
                else:
                    out.loss_group, out.ignore_index = source.loss_group, source.ignore_index
            kept.append(out)
        if isinstance(result, (tuple, list)):
            return type(result)(kept) if isinstance(result, list) or type(result) is tuple else result
        return kept[0]

    def plain(self) -> torch.Tensor:
        """The labels as a plain tensor (what the loss computes on)."""
        return self.as_subclass(torch.Tensor)

    def __deepcopy__(self, memo: dict[int, Any]) -> ShardLabels:
        """A copy of the labels with the same group (a process group is not copied)."""
        with torch._C.DisableTorchFunctionSubclass():
            copied = self.as_subclass(torch.Tensor).clone().as_subclass(ShardLabels)
        copied.loss_group, copied.ignore_index = self.loss_group, self.ignore_index
        memo[id(self)] = copied
        return copied


def shard_labels(input_ids: torch.Tensor, lengths: Any, group: Any = None, labels: torch.Tensor | None = None,
                 ignore_index: int = -100, *, loss_group: Any = None) -> torch.Tensor:
    """Next-token labels of this rank's rows ``[1, S / cp]``, never crossing a document.

    Args:
        input_ids: The whole packed sequence ``[1, S]`` (or ``[S]``).
        lengths: Its document lengths.
        group: The CP group.
        labels: Optional labels aligned with ``input_ids`` (transformers' convention: ``labels[t]``
            is the target of the prediction made at ``t - 1``), ``ignore_index`` where nothing is
            learned (a prompt in supervised fine-tuning, padding). None: ``input_ids`` itself.
        ignore_index: The label that is not learned (-100, transformers' and PyTorch's default).
        loss_group: Given (a ProcessGroup or 1-D DeviceMesh), the labels come back as
            ``ShardLabels`` carrying it, which a context-parallel ``...ForCausalLM`` accepts as
            ``labels=``: its ``.loss`` is then ``causal_lm_loss(logits, labels, group=loss_group,
            num_items_in_batch=...)`` (``num_items_in_batch`` from the forward's keywords, as
            transformers passes it). Not given: a plain tensor for ``causal_lm_loss``.

    Returns:
        Row t's target is ``labels[t + 1]`` when t + 1 is in the same document, else
        ``ignore_index`` (a document's last token predicts nothing). A row's target may come from
        the next rank's shard; ``ignore_index`` in ``labels`` is kept.
    """
    if loss_group is not None:
        group_shape(loss_group, "loss_group")  # a group this process belongs to, checked now
        marked = shard_labels(input_ids, lengths, group, labels, ignore_index).as_subclass(ShardLabels)
        marked.loss_group, marked.ignore_index = loss_group, ignore_index
        return marked
    ids = _one_row(input_ids, "shard_labels' input_ids")
    values, _, rank, local = shard_shape(lengths, int(ids.shape[1]), group)
    source = ids
    if labels is not None:
        source = labels if labels.ndim == 2 else labels[None]
        if tuple(source.shape) != tuple(ids.shape):
            raise ValueError(f"labels must be aligned with input_ids (shape {tuple(ids.shape)}), got shape "
                             f"{tuple(labels.shape)}")
        if source.dtype.is_floating_point or source.dtype.is_complex or source.dtype == torch.bool:
            raise ValueError(f"labels must be integer token ids (and {ignore_index}), got dtype {source.dtype}")
    ends = np.cumsum(values, dtype=np.int64) - 1  # each document's last token predicts nothing
    shifted = torch.full_like(source, ignore_index)
    shifted[:, :-1] = source[:, 1:]
    shifted[:, torch.from_numpy(ends).to(source.device)] = ignore_index
    return shifted[:, rank * local:(rank + 1) * local]


def _pad_multiple(multiple: Any) -> int:
    """``pad_to_multiple``'s multiple as an int: a positive Python or numpy integer (not a bool),
    or the size of a CP group (a ProcessGroup, a 1-D DeviceMesh, None for the default group)."""
    if isinstance(multiple, (int, np.integer)) and not isinstance(multiple, (bool, np.bool_)):
        if multiple < 1:
            raise ValueError(f"pad_to_multiple's multiple must be positive, got {multiple!r}")
        return int(multiple)
    groups: tuple[type, ...] = ()
    if dist.is_available():
        from torch.distributed.device_mesh import DeviceMesh

        groups = (dist.ProcessGroup, DeviceMesh)
    if multiple is None or isinstance(multiple, groups):
        return group_shape(multiple, "CP group")[0]
    raise ValueError(f"pad_to_multiple's multiple must be the CP size (a positive int) or the CP group (a "
                     f"ProcessGroup or 1-D DeviceMesh), got {multiple!r} ({type(multiple).__name__})")


def pad_to_multiple(input_ids: torch.Tensor, lengths: Any, multiple: Any, labels: torch.Tensor | None = None,
                    pad_token_id: int = 0, ignore_index: int = -100
                    ) -> tuple[torch.Tensor, tuple[int, ...], torch.Tensor]:
    """Pads a packed batch to a multiple of the CP size with one document of its own.

    Args:
        input_ids: ``[1, S]`` (or ``[S]``).
        lengths: Its document lengths.
        multiple: The CP size (a positive int, Python's or numpy's), or the CP group / 1-D mesh
            whose size it is (None: the default group).
        labels: Labels aligned with ``input_ids`` (None: ``input_ids``).
        pad_token_id: The padding document's token.
        ignore_index: Its labels: nothing in it is learned.

    Returns:
        ``(input_ids [1, S'], lengths, labels [1, S'])`` with ``S'`` the next multiple: the
        padding is the last document (attention never crosses documents, so it changes no other
        row) and every one of its labels is ``ignore_index`` (the loss never sees it). Unchanged,
        but for the labels returned, when S already is a multiple.
    """
    ids = _one_row(input_ids, "pad_to_multiple's input_ids")
    values = document_lengths(lengths)
    if sum(values) != ids.shape[1]:
        raise ValueError(f"document_lengths sum to {sum(values)}, but the sequence has {ids.shape[1]} tokens")
    size = _pad_multiple(multiple)
    source = ids.clone() if labels is None else (labels if labels.ndim == 2 else labels[None])
    if tuple(source.shape) != tuple(ids.shape):
        raise ValueError(f"labels must be aligned with input_ids (shape {tuple(ids.shape)}), got shape "
                         f"{tuple(labels.shape) if labels is not None else None}")
    pad = -ids.shape[1] % size
    if pad == 0:
        return ids, values, source
    return (torch.cat([ids, ids.new_full((1, pad), pad_token_id)], dim=1), values + (pad,),
            torch.cat([source, source.new_full((1, pad), ignore_index)], dim=1))


# ----------------------------------------------------------------------------------------------
# losses


def count_valid_tokens(labels: torch.Tensor, group: Any = None, ignore_index: int = -100) -> torch.Tensor:
    """The number of learned labels (not ``ignore_index``): this rank's when ``group`` is None,
    else summed over ``group`` (one all-reduce). An int64 tensor on the labels' device, so no
    host round trip. Sum it over the micro-batches of one optimizer step and pass the total as
    ``causal_lm_loss(..., num_items_in_batch=)`` for gradient accumulation."""
    count = (labels != ignore_index).sum().to(torch.int64)
    if group is not None:
        group = resolve_group(group, "group")
        if group_shape(group)[0] > 1:
            dist.all_reduce(count, group=group)
    return count


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, lengths: Any = None, ignore_index: int = -100, *,
                   group: Any = None, num_items_in_batch: Any = None) -> torch.Tensor:
    """This rank's term of the mean next-token cross entropy over the valid tokens of the batch.

    Args:
        logits: This rank's rows' logits ``[1, S / cp, vocab]`` (bfloat16 is summed in float32).
        labels: This rank's rows' targets ``[1, S / cp]`` (``shard_labels``).
        lengths: The document lengths (needed only by the legacy form: no ``group``, no
            ``num_items_in_batch``).
        ignore_index: Targets that are not learned.
        group: The ranks whose gradients are *averaged* and whose tokens share the mean: with
            FSDP2 over the flattened dp x cp mesh, that mesh (or its group). The valid tokens are
            counted over it (one all-reduce) unless ``num_items_in_batch`` is given.
        num_items_in_batch: The number of valid tokens of the whole optimizer step (every rank of
            ``group``, every micro-batch), transformers' name; ``count_valid_tokens`` sums it.

    Returns:
        ``W * sum(rank's token losses) / N``, N the valid tokens of the global batch and W the
        size of ``group`` (1 without). Why W: FSDP2 reduce-scatters gradients with the *mean* over
        its mesh (DDP, too), so the optimizer sees ``(1 / W) * sum_r grad(loss_r)``; with
        ``loss_r = W * s_r / N`` that is ``grad(sum_r s_r / N)``, the gradient of the mean over
        every valid token of the global batch, each token weighted 1 / N whichever rank and
        micro-batch holds it (transformers' ``num_items_in_batch`` convention). The mean of the
        returned values over ``group`` is that global mean (report it with an averaging
        all-reduce). Without ``group`` (W = 1) the gradients must be *summed* over the CP ranks
        (``all_reduce_gradients``), and the sum of the returned values is the mean.

        Legacy form (neither ``group`` nor ``num_items_in_batch``): N = S - documents, every
        next-token label of the CP batch; labels that learn another number of tokens (more
        masked than the documents' ends, wherever they are) raise on every rank (that count
        would be wrong: pass ``group``). The labels are counted over the CP group: the latest
        group of ``S / (this shard's rows)`` ranks that ``context_parallel`` was given in this
        process, else the default group if it has that size (else ``ValueError``).

    Labels are checked on every rank before the loss: a label outside ``[0, vocab)`` that is not
    ``ignore_index`` (a -1 mask, another vocabulary's id) raises ``ValueError`` on every rank of
    the group the labels are counted over, naming each offending rank's count and one value (it
    used to raise ``IndexError`` on its rank only while its peers waited in their next
    collective). The check rides on the valid-token count's all-reduce (``group``, or in the
    legacy form the CP group); with ``num_items_in_batch`` it takes an all-reduce of its own
    over ``group`` (without ``group``, over the latest ``context_parallel`` group, if any). It
    costs one host read of a ``1 + 3 * ranks`` element tensor per call. Where ``lengths`` are
    given, the same all-reduce also refuses labels that are not shifted (a label learned at a
    document's last token, which predicts nothing), on every rank.
    """
    if labels.numel() != logits.numel() // max(int(logits.shape[-1]), 1) or logits.ndim < 2:
        raise ValueError(f"labels {tuple(labels.shape)} do not match logits {tuple(logits.shape)}: one label per "
                         "row of this rank's shard (shard_labels)")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer token ids (and {ignore_index}), got dtype {labels.dtype}")
    if isinstance(labels, ShardLabels):
        labels = labels.plain()
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.dtype in (torch.bfloat16, torch.float16):
        flat = flat.float()
    targets = labels.reshape(-1).to(device=flat.device, dtype=torch.int64)  # int32 ids too (cross_entropy's)
    scale = 1
    if group is not None:
        scale = group_shape(group, "loss group")[0]
    legacy = group is None and num_items_in_batch is None
    values: tuple[int, ...] = ()
    if legacy:
        values = document_lengths(lengths)  # the legacy count needs them (refused on every rank alike)
    elif lengths is not None:
        try:  # only for the not-shifted check: bad lengths on one rank must not raise before the collective
            values = document_lengths(lengths)
        except ValueError:
            values = ()
    if num_items_in_batch is not None:
        count = _items_count(num_items_in_batch, flat.device)
    cp = _labels_cp_size(values, targets.numel(), legacy) if values else None
    found, cp_group = _cp_group_of_size(cp) if cp is not None else (False, None)
    ends = _ends_in_shard(values, targets.numel(), cp_group) if found else None
    if group is not None:
        check_group: Any = resolve_group(group, "loss group")
    else:  # the labels are checked over the CP group (that of context_parallel, or the default group)
        if cp is None:
            found, cp_group = _latest_cp_group()
        check_group = cp_group
        if legacy and not found:
            raise ValueError(f"causal_lm_loss without group= counts the CP batch's labels over its CP group of {cp} "
                             f"ranks (sum(document_lengths) / this shard's {targets.numel()} labels), and this "
                             "process has none: context_parallel was given no group of that size, and the default "
                             "group is not one; pass group= (the CP group, or the group gradients are averaged over) "
                             "or num_items_in_batch=")
        if any(kept is (dist.group.WORLD if check_group is None else check_group) for kept in _SHARDED_GROUPS):
            raise ValueError(fsdp_without_group_text("causal_lm_loss"))
    # The labels' check and the valid-token count: one all-reduce over the group (every rank
    # raises on any rank's bad labels) and one host read.
    valid, learned = _checked_valid_count(targets, int(flat.shape[-1]), ignore_index, check_group, ends)
    if legacy:
        expected = sum(values) - len(values)
        if learned != expected:
            raise ValueError(f"labels learn {learned} tokens of the CP batch, not S - documents = {expected} (every "
                             "next-token label within a document, as shard_labels makes without labels=): the "
                             "legacy count (S - documents) would be wrong; pass group= (the valid tokens are "
                             "counted over it) or num_items_in_batch=")
        count = torch.as_tensor(max(expected, 1), device=flat.device)
    elif num_items_in_batch is None:  # 0 only when no rank has a valid label: then the sum is 0 too
        count = valid.clamp_min(1)
    total = torch.nn.functional.cross_entropy(flat, targets, ignore_index=ignore_index, reduction="sum")
    return total * scale / count.to(total.dtype)


def _labels_cp_size(values: tuple[int, ...], rows: int, legacy: bool) -> int | None:
    """The CP size this shard implies: ``S / rows`` (None where it does not divide, unless the
    legacy count needs it)."""
    if rows == 0 or sum(values) % rows:
        if not legacy:
            return None
        raise ValueError(f"this shard's {rows} labels do not divide the batch's {sum(values)} tokens "
                         "(document_lengths): pass this rank's labels (shard_labels)")
    return sum(values) // rows


def _ends_in_shard(values: tuple[int, ...], rows: int, cp_group: Any) -> torch.Tensor:
    """This shard's rows that are a document's last token (int64, shard-local): their label must
    be ``ignore_index`` (the token predicts nothing), which labels not shifted break."""
    rank = dist.get_rank(cp_group) if cp_group is not None else 0
    ends = np.cumsum(values, dtype=np.int64) - 1 - rank * rows
    return torch.from_numpy(ends[(ends >= 0) & (ends < rows)])


def _latest_cp_group() -> tuple[bool, Any]:
    """The latest group ``context_parallel`` was given, if any (the check of a loss given
    ``num_items_in_batch`` without ``group``)."""
    return (True, _CP_GROUPS[-1]) if _CP_GROUPS and dist.is_available() and dist.is_initialized() else (False, None)


def _checked_valid_count(targets: torch.Tensor, vocab: int, ignore_index: int, group: Any,
                         ends: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """The labels that are learned (not ``ignore_index``), summed over ``group`` (None: this rank
    alone), as an int64 tensor on their device and as an int, after checking every rank's labels.

    A label outside ``[0, vocab)`` that is not ``ignore_index`` (-1 as a mask, a token of another
    vocabulary) made ``cross_entropy`` raise on its rank only, and its peers wait in their next
    collective until the group times out. Here each rank adds its bad labels' count and first
    value in its own slots of the count's all-reduce, so every rank raises the same error, naming
    each rank's count and a value. ``ends`` (this shard's rows that end a document, where the
    document lengths are known): a label learned there means the labels were not shifted (a
    document's last token predicts nothing), counted in a third slot of the same all-reduce."""
    size, rank = group_shape(group, "loss group") if group is not None else (1, 0)
    valid = targets != ignore_index
    bad = valid & ((targets < 0) | (targets >= vocab))
    verdict = torch.zeros(1 + 3 * size, dtype=torch.int64, device=targets.device)
    verdict[0] = valid.sum()
    verdict[1 + 3 * rank] = bad.sum()
    if targets.numel():
        verdict[2 + 3 * rank] = targets[bad.to(torch.uint8).argmax()]  # the first bad label (no host read)
    if ends is not None and ends.numel():
        verdict[3 + 3 * rank] = valid[ends.to(targets.device)].sum()
    if size > 1:
        dist.all_reduce(verdict, group=group)
    read = verdict.tolist()  # the one host read
    who = (lambda r: f"rank {r} of the loss group") if size > 1 else (lambda r: "this rank")
    offenders = [(r, n, v) for r, (n, v) in enumerate(zip(read[1::3], read[2::3])) if n]
    if offenders:
        where = "; ".join(f"{who(r)} has {n} (e.g. {v})" for r, n, v in offenders)
        raise ValueError(f"causal_lm_loss: labels must be token ids in [0, {vocab}) or ignore_index ({ignore_index}) "
                         f"for tokens not learned: {where}; mask with ignore_index, as shard_labels keeps -100")
    unshifted = [(r, n) for r, n in enumerate(read[3::3]) if n]
    if unshifted:
        where = "; ".join(f"{who(r)} has {n}" for r, n in unshifted)
        raise ValueError(f"causal_lm_loss: labels learned at a document's last token, which predicts nothing (its "
                         f"label must be ignore_index, {ignore_index}): {where}; are the labels not shifted (the "
                         "input ids themselves)? make them with shard_labels, which shifts them within each document")
    return verdict[0], read[0]


def _items_count(value: Any, device: torch.device) -> torch.Tensor:
    """``num_items_in_batch`` as a tensor on ``device``, checked: a positive number (Python's or
    numpy's, finite, not a bool) or a one-element real tensor. A count of 0 or below used to be clamped
    to 1, which multiplied the loss by the true count; it is refused, naming it. A tensor on
    another device than the CPU is not read on the host (no sync): its value is not checked, and
    a count of 0 or below there gives an inf or nan loss, never a silently scaled one."""
    what = "num_items_in_batch must be a positive number (the valid tokens of the optimizer step, count_valid_tokens)"
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype.is_complex or value.dtype == torch.bool:
            raise ValueError(f"{what}, got a {value.dtype} tensor of shape {tuple(value.shape)}")
        count = value.reshape(())
        if count.device.type == "cpu" and not 0 < float(count) < float("inf"):
            raise ValueError(f"{what}, got {count.item()!r}")
        return count.to(device)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not 0 < float(value) < np.inf:
        raise ValueError(f"{what}, got {value!r}")
    return torch.tensor(value, device=device)


def load_balancing_loss(router_logits: Sequence[torch.Tensor], num_experts: int, top_k: int, group: Any = None,
                        row_mask: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' MoE load-balancing loss (``load_balancing_loss_func``, Switch Transformer
    eqs. 4-6) of the whole packed row, from the router logits of this rank's rows.

    The loss is ``E * sum_e f_e * P_e``, f_e the share of top-k assignments to expert e and P_e
    its mean softmax probability, each over every row of every layer: a product of two batch
    statistics, not a sum over rows, so a shard's own value is not the row's. The three sums
    (assignments, probabilities, rows) are all-reduced over the CP ``group`` first; the
    probability sums through a differentiable all-reduce, whose backward sums every rank's
    gradient into each rank's rows.

    Every rank then holds the same value, the loss of the whole row, and differentiates it as a
    replicated function of every rank's rows: the CP ranks' gradients add up to ``cp`` times its
    gradient. Averaged over the CP ranks (FSDP2 over dp x cp, DDP) that is the row's gradient,
    and over dp x cp the mean of the rows' (transformers' data-parallel convention). With
    gradients *summed* over the CP ranks (``all_reduce_gradients`` without ``average``) divide
    it by the CP size.

    Args:
        router_logits: Per MoE layer, ``[rows, num_experts]`` logits of this rank's rows.
        num_experts, top_k: As the model's config.
        group: The CP group (None: the default group; no reduction without torch.distributed).
        row_mask: Optional ``[rows]`` weights (1 counts, 0 not), transformers' attention mask.
    """
    if not router_logits:
        raise ValueError("load_balancing_loss needs the router logits of at least one layer (output_router_logits)")
    device = router_logits[0].device
    mask = None if row_mask is None else row_mask.reshape(-1, 1).to(device=device, dtype=torch.float32)
    assigned = torch.zeros(num_experts, dtype=torch.float32, device=device)
    probability = torch.zeros(num_experts, dtype=torch.float32, device=device)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    for logits in router_logits:
        weights = torch.softmax(logits.to(device).float(), dim=-1)
        selected = torch.topk(weights, top_k, dim=-1).indices
        hits = torch.zeros_like(weights).scatter_(1, selected, 1.0)
        if mask is not None:
            hits, weights = hits * mask, weights * mask
        assigned = assigned + hits.sum(0)
        probability = probability + weights.sum(0)
        rows = rows + (mask.sum() if mask is not None else weights.shape[0])
    distributed = dist.is_available() and dist.is_initialized()
    if distributed and group_shape(group, "CP group")[0] > 1:
        group = resolve_group(group, "CP group")
        if group is None:
            group = dist.group.WORLD
        counts = torch.cat([assigned, rows[None]]).detach()
        dist.all_reduce(counts, group=group)
        assigned, rows = counts[:-1], counts[-1]
        probability = _AllReduceSum.apply(probability, group)
    return (assigned / rows * (probability / rows)).sum() * num_experts


class _AllReduceSum(torch.autograd.Function):
    """Sum over a group; backward: the sum of every rank's gradient (the value is used on every
    rank, so each input row feeds every rank's copy)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        total = tensor.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


def all_reduce_gradients(model: Any, group: Any = None, *, average: bool = False,
                         bucket_bytes: int = 32 << 20) -> None:
    """Reduces every trainable parameter's gradient over ``group`` in place, for weights
    replicated on every rank (no FSDP): the sum, or the mean with ``average=True``.

    A parameter with no gradient on a rank (an expert that saw none of its tokens) counts as
    zero (it gets a zero gradient, so every rank reduces the same tensors in the same order).
    Gradients are packed into buckets of at most ``bucket_bytes`` per dtype and device (one
    all-reduce each; a gradient larger than a bucket is reduced in place alone), so the extra
    memory is one bucket, not a copy of every gradient. Parameters sharded by FSDP2
    (``DTensor``) are refused: ``fully_shard`` reduces their gradients itself.
    """
    group = resolve_group(group, "gradient group")
    size, _ = group_shape(group)
    parameters = [p for p in model.parameters() if p.requires_grad]
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed tensors
        DTensor = ()  # type: ignore[assignment,misc]
    sharded = [p for p in parameters if isinstance(p, DTensor)]
    if sharded:
        raise ValueError(f"all_reduce_gradients: {len(sharded)} parameters are DTensor shards (fully_shard / FSDP2): "
                         "FSDP reduces their gradients in backward; do not reduce them again")
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if size == 1:
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    for bucket in _buckets(grads, bucket_bytes):
        if len(bucket) == 1 and bucket[0].is_contiguous():
            dist.all_reduce(bucket[0], group=group)  # in place, no copy
            reduced = [bucket[0]]
            flat = None
        else:
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, group=group)
            reduced = list(torch.split(flat, [g.numel() for g in bucket]))
        for g, r in zip(bucket, reduced):
            if flat is not None:
                g.copy_(r.view_as(g))
            if average:
                g.div_(size)


def _buckets(grads: Iterable[torch.Tensor], bucket_bytes: int) -> Iterable[list[torch.Tensor]]:
    """Consecutive gradients of one dtype and device, at most ``bucket_bytes`` a bucket (a
    larger gradient alone), in parameter order: the same buckets on every rank."""
    open_buckets: dict[Any, tuple[list[torch.Tensor], int]] = {}
    for g in grads:
        key, size = (g.dtype, g.device), g.numel() * g.element_size()
        bucket, used = open_buckets.get(key, ([], 0))
        if bucket and used + size > bucket_bytes:
            yield bucket
            bucket, used = [], 0
        bucket.append(g)
        open_buckets[key] = (bucket, used + size)
    for bucket, _ in open_buckets.values():
        if bucket:
            yield bucket


def refuse_fsdp_before(model: Any, what: str) -> None:
    """Raises when ``model`` already has FSDP2-sharded parameters: ``context_parallel`` must come
    first (it hooks modules and replaces forwards that ``fully_shard`` then wraps)."""
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return
    wrapped = any(isinstance(m, FSDPModule) for m in model.modules())
    if wrapped or any(isinstance(p, DTensor) for p in model.parameters()):
        raise ValueError(f"{what}: the model is already sharded by fully_shard (FSDP2); call context_parallel on "
                         "the plain model first, then fully_shard its layers and the model over the dp x cp mesh")


# ----------------------------------------------------------------------------------------------
# the upstream modules a model integration re-implements


def upstream_fingerprints(module: Any, names: Iterable[str]) -> dict[str, str]:
    """Per name, the first 16 hex digits of the SHA-256 of ``inspect.getsource`` of that object
    of ``module`` (a class or function), or 'missing'."""
    found = {}
    for name in names:
        obj = getattr(module, name, None)
        try:
            source = inspect.getsource(obj) if obj is not None else None
        except (OSError, TypeError):
            source = None
        found[name] = "missing" if source is None else hashlib.sha256(source.encode()).hexdigest()[:16]
    return found


@functools.cache
def _cached_fingerprints(module_name: str, names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    import importlib

    return tuple(upstream_fingerprints(importlib.import_module(module_name), names).items())


def check_upstream(module: Any, expected: dict[str, str], tested: str, integration: str) -> None:
    """Refuses a transformers whose modules differ from the ones ``integration`` re-implements.

    ``expected``: name -> fingerprint (``upstream_fingerprints``) of the tested version
    ``tested``. Raises ``ImportError`` naming the installed version and the modules that differ;
    the check runs once per process (cached)."""
    found = dict(_cached_fingerprints(module.__name__, tuple(sorted(expected))))
    differ = sorted(name for name, digest in expected.items() if found.get(name) != digest)
    if differ:
        try:
            import transformers
            version = transformers.__version__
        except ImportError:  # pragma: no cover - the module came from somewhere
            version = "unknown"
        raise ImportError(f"{integration} re-implements parts of transformers {tested}'s {module.__name__}, and "
                          f"transformers {version}'s differ: {', '.join(differ)} (source fingerprints "
                          f"{ {n: found.get(n) for n in differ} } != {tested}'s { {n: expected[n] for n in differ} }); "
                          f"install transformers {tested} (pip install 'transformers=={tested}')")
