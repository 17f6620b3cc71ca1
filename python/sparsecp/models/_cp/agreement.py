"""The forward's one agreement: every rank checks its batch, then one all-gather of every rank's
verdict and fingerprint, so that bad input raises the same ``ValueError`` on every rank instead
of a hang in the layers' collectives (SYSTEM.md: every entry point that communicates agrees
across ranks before any data moves)."""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from .checks import BATCH_DIGEST
from .training import document_lengths

__all__ = ["AgreedBatch", "BatchCheck", "check_and_agree", "lengths_key"]


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
    # the gradient exchanges since the last forward whose peer ran another forward's backward
    # (rows.BackwardOrder.take: a device count, or None), read with the batch's checks
    backward_order: Callable[[], torch.Tensor | None] = lambda: None


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
                         f"got {shape}: a [B, S] micro-batch is one packed row of its rows' documents, "
                         "pack_rows(input_ids, lengths per row) then shard_batch (exact: attention never crosses "
                         "a document)")
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
    mismatched = check.backward_order()
    checks = [(positions[0].long() != expected).sum(),
              mismatched if mismatched is not None else torch.zeros((), dtype=torch.int64)]
    if input_ids is not None:
        checks += [input_ids.min(), input_ids.max()]
    values = torch.stack([c.long().to(positions.device) for c in checks]).tolist()  # the one host read
    if values[1]:
        raise ValueError(f"rank {check.rank}: {values[1]} gradient exchange(s) of an earlier backward met a peer "
                         "in another forward's backward: the backwards ran in a different order on the CP ranks, "
                         "so those gradients were wrong; run forwards and backwards in the same order on every "
                         "rank (DDP's and FSDP2's contract too)")
    del values[1]
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
    cost-model refit, ``_cp.calibration``) rides on the same all-gather: every rank gets every
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
