"""Rank tasks for test_v4_bounded.py: host syncs counted per forward and backward, replay
records' lifetime, and the Index K rows a rank gathers."""
from __future__ import annotations

import gc
import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import v4_tasks

_PACKAGE = os.sep + "sparsecp" + os.sep
# Host reads: each blocks the host until the device has produced the value (on a GPU).
_TENSOR_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")
_OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "all_reduce", "barrier", "all_gather")
# A read that runs only on CPU tensors, where it waits for nothing (kl.py's backward: an
# incoming gradient of exactly 1 hands its saved gradients over without a copy).
_CPU_ONLY = ("backward",)


@contextmanager
def counting_host_syncs() -> Iterator[Counter]:
    """Counts the host reads of tensor data and the object / verdict collectives that
    sparsecp's own code makes (the caller's frame is in the sparsecp package), by call site."""
    counts: Counter = Counter()
    patched: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str) -> None:
        original = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            frame = sys._getframe(1)
            where = frame.f_code.co_filename
            if _PACKAGE in where and not (where.endswith("kl.py") and frame.f_code.co_name in _CPU_ONLY):
                counts[f"{os.path.basename(where)}:{frame.f_lineno} {name}"] += 1
            return original(*args, **kwargs)
        setattr(owner, name, counted)
        patched.append((owner, name, original))

    for name in _TENSOR_READS:
        wrap(torch.Tensor, name)
    wrap(torch, "equal")
    for name in _OBJECT_COLLECTIVES:
        wrap(dist, name)
    try:
        yield counts
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def _layer_types(layers: int) -> dict[str, Any]:
    base = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
            "compressed_sparse_attention"]
    types = (base * (layers // 4 + 1))[:layers]
    return {"num_hidden_layers": layers, "layer_types": types, "mlp_layer_types": ["hash_moe"] + ["moe"] * (layers - 1)}


def host_syncs(rank: int, size: int, layers: int, kl: bool) -> dict[str, Any]:
    """One checkpointed training step of a ``layers``-layer model, after one warm-up step (the
    batch's layout is planned and moved then): the host syncs of its forward and backward."""
    from sparsecp.models import deepseek_v4 as cp_v4

    model = v4_tasks.tiny_model(torch.float64, **_layer_types(layers))
    model.activation_checkpointing_enable()
    model.train()
    cp_v4.context_parallel(model, None, "spill", indexer_kl_coeff=0.1 if kl else None)
    lengths = (13, 17, 11, 7)
    input_ids = v4_tasks.packed_ids(lengths)
    ids, positions = cp_v4.shard_batch(input_ids, lengths)
    labels = cp_v4.shard_labels(input_ids, lengths)
    counts = {}
    for _ in range(2):  # the second step: the layout is planned and moved by the first
        with counting_host_syncs() as forward:
            logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
            kl_loss = cp_v4.indexer_kl_loss(model) if kl else 0
        loss = cp_v4.causal_lm_loss(logits, labels, lengths) + kl_loss
        with counting_host_syncs() as backward:
            loss.backward()
        counts = {"forward": dict(forward), "backward": dict(backward)}
    return counts


def v32_host_syncs(rank: int, size: int, layers: int) -> dict[str, Any]:
    """``host_syncs`` for DeepSeek-V3.2 (``sparsecp.models.deepseek_v32``): a checkpointed step
    with the indexer KL, after a warm-up step."""
    import v32_tasks

    from sparsecp.models import deepseek_v32 as cp_v32

    model = v32_tasks.tiny_model(torch.float64, num_hidden_layers=layers)
    model.activation_checkpointing_enable()
    model.train()
    cp_v32.context_parallel(model, None, "spill", indexer_kl_coeff=0.1)
    lengths = (13, 17, 11, 7)
    input_ids = v32_tasks.packed_ids(lengths)
    ids, positions = cp_v32.shard_batch(input_ids, lengths)
    labels = cp_v32.shard_labels(input_ids, lengths)
    counts = {}
    for _ in range(2):  # the second step: the layout is planned and moved by the first
        with counting_host_syncs() as forward:
            logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
            kl_loss = cp_v32.indexer_kl_loss(model)
        loss = cp_v32.causal_lm_loss(logits, labels, lengths) + kl_loss
        with counting_host_syncs() as backward:
            loss.backward()
        counts = {"forward": dict(forward), "backward": dict(backward)}
    return counts


def records_after_steps(rank: int, size: int, steps: tuple[int, ...]) -> dict[str, Any]:
    """Checkpointed training steps, each followed by an evaluation forward: after each count in
    ``steps``, the forward contexts still alive and the tensors gc can see."""
    from sparsecp.models import deepseek_v4 as cp_v4
    from sparsecp.models._cp import forward as _cp_layer

    model = v4_tasks.tiny_model(torch.float64)
    model.activation_checkpointing_enable()
    # calibrate=False: a refit every forward plans new routes, whose device tables the bounded
    # caches (the batch layout's last 4, the routes' last 32) hold until they are full.
    cp_v4.context_parallel(model, None, "spill", indexer_kl_coeff=0.1, calibrate=False)
    lengths = (13, 17, 11, 7)
    input_ids = v4_tasks.packed_ids(lengths)
    ids, positions = cp_v4.shard_batch(input_ids, lengths)
    labels = cp_v4.shard_labels(input_ids, lengths)
    seen: dict[str, Any] = {"contexts": {}, "tensors": {}}
    done = 0
    for target in steps:
        while done < target:
            model.train()
            logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
            loss = cp_v4.causal_lm_loss(logits, labels, lengths) + cp_v4.indexer_kl_loss(model)
            loss.backward()
            model.zero_grad(set_to_none=False)  # the gradient buffers stay: the same tensors every step
            del logits, loss
            model.eval()
            with torch.no_grad():
                model(input_ids=ids, position_ids=positions, document_lengths=lengths)
            done += 1
        gc.collect()
        state = cp_v4.context_parallel_state(model)
        state.kl_losses = []  # the last training forward's KL: a caller's to drop
        gc.collect()
        seen["contexts"][target] = sum(isinstance(o, _cp_layer.ForwardContext) for o in gc.get_objects())
        seen["tensors"][target] = sum(isinstance(o, torch.Tensor) for o in gc.get_objects())
    return seen


def unbackpropagated_kl(rank: int, size: int, model_name: str) -> dict[str, Any]:
    """Checkpointed forwards with the KL on whose KL is never backpropagated (logged, not even
    asked for, an evaluation pass with gradients): after each, with its outputs deleted and
    ``gc.collect()``, which forward contexts are still alive (weak references) and how many
    ForwardContext objects and tensors gc sees; then with the state's KL dropped."""
    import importlib
    import weakref

    from sparsecp.models._cp import forward as _cp_layer

    tasks = importlib.import_module(f"{model_name}_tasks")
    cp = importlib.import_module("sparsecp.models." + {"v4": "deepseek_v4", "v32": "deepseek_v32"}[model_name])
    model = tasks.tiny_model(torch.float64)
    model.activation_checkpointing_enable()
    cp.context_parallel(model, None, "spill", indexer_kl_coeff=0.1, calibrate=False)
    state = cp.context_parallel_state(model)
    contexts: list[Any] = []
    begin = state.begin_forward

    def watched(*args: Any) -> Any:
        context = begin(*args)
        contexts.append(weakref.ref(context))
        return context

    state.begin_forward = watched  # type: ignore[method-assign]
    lengths = (13, 17, 11, 7)
    input_ids = tasks.packed_ids(lengths)
    ids, positions = cp.shard_batch(input_ids, lengths)

    def live() -> dict[str, Any]:
        gc.collect()
        return {"alive": [i for i, ref in enumerate(contexts) if ref() is not None],
                "contexts": sum(isinstance(o, _cp_layer.ForwardContext) for o in gc.get_objects()),
                "tensors": sum(isinstance(o, torch.Tensor) for o in gc.get_objects())}

    seen = []
    logged = []
    for step in range(6):
        model.train(step % 3 != 2)  # every third: an evaluation pass with gradients
        out = model(input_ids=ids, position_ids=positions, document_lengths=lengths)
        if step % 3 == 0:  # the KL logged only
            kl = cp.indexer_kl_loss(model)
            logged.append(float(kl.detach()))
            del kl
        del out
        seen.append(live())
    state.kl_losses = []  # the last forward with gradients' KL, which the state keeps until the next one
    seen.append(live())
    return {"seen": seen, "logged": logged}


def index_bank_rows(rank: int, size: int, lengths: tuple[int, ...], mode: str) -> dict[str, int]:
    """The Index K rows this rank gathers for its selection against the whole bank's."""
    from sparsecp.models import deepseek_v4 as cp_v4

    model = v4_tasks.tiny_model(torch.float64)
    cp_v4.context_parallel(model, None, mode)
    state = cp_v4.context_parallel_state(model)
    input_ids = v4_tasks.packed_ids(lengths)
    ids, positions = cp_v4.shard_batch(input_ids, lengths)
    with torch.no_grad():
        model(input_ids=ids, position_ids=positions, document_lengths=lengths)
    layout = next(reversed(state.batch(lengths)._device.values()))  # the tables the forward made
    tables = layout.compressions[(4, True)]
    assert tables.index_bank is not None
    plan = tables.index_bank.plan
    return {"gathered": plan.rows, "received": plan.received_rows, "whole": tables.layout.entries,
            "segments_rows": int(sum(int(ke) - int(kb) for _, _, kb, ke, _ in tables.route.segments.array.tolist()))}
