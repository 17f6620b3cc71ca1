"""Rank tasks every model adapter runs alike (test_models.py), over ``kind`` "v4" (DeepSeek-V4,
``v4_tasks``) or "v32" (DeepSeek-V3.2, ``v32_tasks``): the per-document oracle's loop, bad input
on every rank, and gradient accumulation under recompute."""
from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

KINDS = ("v4", "v32")


def model_of(kind: str) -> tuple[Any, Any]:
    """(the model's test module, its sparsecp.models package)."""
    if kind == "v4":
        import v4_tasks

        from sparsecp.models import deepseek_v4
        return v4_tasks, deepseek_v4
    import v32_tasks

    from sparsecp.models import deepseek_v32
    return v32_tasks, deepseek_v32


def per_document_oracle(capture: Callable[[Any], tuple[list, list, list]], model: Any, input_ids: torch.Tensor,
                        lengths: tuple[int, ...], steps: int = 0, lr: float = 1e-2) -> dict[str, Any]:
    """The unmodified model run on each document alone: logits [S, vocab], the batch's mean
    next-token loss, gradients by parameter name, the indexer ids (and scores, where the model's
    ``capture`` records them) per selecting layer and document, and (steps > 0) the loss of each
    of ``steps`` AdamW steps."""
    model = copy.deepcopy(model)
    count = sum(lengths) - len(lengths)
    captured, scores, handles = capture(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr) if steps else None
    losses = []
    first: dict[str, Any] = {}
    for step in range(max(steps, 1)):
        model.zero_grad(set_to_none=True)
        logits, total, start = [], 0.0, 0
        for length in lengths:
            ids = input_ids[:, start:start + length]
            out = model(input_ids=ids, use_cache=False)
            logits.append(out.logits[0])
            if length > 1:
                loss = torch.nn.functional.cross_entropy(out.logits[0, :-1], ids[0, 1:], reduction="sum") / count
                loss.backward()
                total += float(loss.detach())
            start += length
        losses.append(total)
        if optimizer is not None:
            optimizer.step()
        if step == 0:
            first = {"logits": torch.cat(logits).detach(), "loss": total,
                     "grads": {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                               for n, p in model.named_parameters()},
                     "ids": [list(store) for store in captured], "scores": [list(seen) for seen in scores]}
    for handle in handles:
        handle.remove()
    first["losses"] = losses
    return first


def _model_for(kind: str, case: str, rank: int) -> Any:
    tasks, _ = model_of(kind)
    return tasks.tiny_model(torch.float64, seed=1 if case == "weights differ" and rank == 1 else 0)


def _make_cp(kind: str, case: str, model: Any) -> None:
    """``context_parallel`` as the case calls it."""
    tasks, cp = model_of(kind)
    if case == "not a model":
        cp.context_parallel(torch.nn.Linear(2, 2))
    if case == "KL without an indexer":  # DeepSeek-V4 with sliding layers only
        cp.context_parallel(tasks.tiny_model(torch.float64, layer_types=["sliding_attention"] * 4), None, "spill",
                            indexer_kl_coeff=0.1)
    if case == "bad mode":
        cp.context_parallel(model, None, "zagzig")
    if case in ("kl coeff a string", "kl coeff a bool"):
        cp.context_parallel(model, None, "spill", indexer_kl_coeff="0.1" if case.endswith("string") else True)
    if case == "options differ between ranks":
        cp.context_parallel(model, None, "spill", target_imbalance=1.05 if dist_rank() else 1.1)
    cp.context_parallel(model.model if case == "base labels" else model, None, "spill")
    if case == "twice":
        cp.context_parallel(model, None, "spill")


def dist_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def bad_input(rank: int, size: int, kind: str, case: str) -> str:
    """Runs one bad-input case on every rank; returns this rank's error text ('' if none). The
    case (base labels: the inner model made CP, the outer CausalLM called with labels) is one
    of test_models.BAD_INPUT's."""
    tasks, cp = model_of(kind)
    model = _model_for(kind, case, rank)
    lengths = (13, 17, 11, 7)
    input_ids = tasks.packed_ids(lengths)
    try:
        _make_cp(kind, case, model)
        ids, positions = cp.shard_batch(input_ids, lengths)
        kwargs: dict[str, Any] = {"input_ids": ids, "position_ids": positions, "document_lengths": lengths}
        if case == "no lengths":
            del kwargs["document_lengths"]
        elif case == "lengths do not sum":
            kwargs["document_lengths"] = (13, 17, 11, 8)
        elif case == "lengths differ between ranks":
            kwargs["document_lengths"] = lengths if rank else (13, 17, 7, 11)  # rank 0 alone: its positions fit both
        elif case == "wrong shard":
            kwargs["input_ids"] = ids if rank != 1 else input_ids[:, :ids.shape[1] + 2]
        elif case == "positions":
            kwargs["position_ids"] = positions + (rank == size - 1)
        elif case == "padding":
            kwargs["padding_tokens"] = 5
        elif case == "token past the vocabulary":
            if rank == 1:
                kwargs["input_ids"] = ids.clone()
                kwargs["input_ids"][0, 3] = tasks.VOCAB
        elif case == "use_cache":
            kwargs["use_cache"] = True
        elif case in ("labels", "base labels"):
            kwargs["labels"] = ids
        elif case == "shard labels, loss_function replaced":
            model.loss_function = lambda *args, **kwargs: None  # e.g. a kernel library's patch
            kwargs["labels"] = cp.shard_labels(input_ids, lengths, loss_group=torch.distributed.group.WORLD)
        elif case == "shard labels without a group":
            kwargs["labels"] = cp.shard_labels(input_ids, lengths).as_subclass(cp.ShardLabels)
        elif case == "shard_batch":
            cp.shard_batch(input_ids[:, :-1], lengths)
        elif case == "labels by position":
            model(ids, None, positions, None, None, ids, document_lengths=lengths)
        elif case == "output_attentions":
            kwargs["output_attentions"] = True
        elif case == "another batch's shard":
            if rank == 1:
                kwargs["input_ids"] = cp.shard_batch(tasks.packed_ids(lengths, seed=4), lengths)[0]
        elif case == "both ranks bad":
            kwargs["position_ids"] = positions + 1 if rank == 0 else None
        elif case == "no positions":
            del kwargs["position_ids"]
        elif case == "weights changed on one rank later":
            if rank == 1:
                with torch.no_grad():
                    next(model.parameters()).add_(1e-3)
            cp.check_weights(model)
        elif case == "checkpointing on one rank" and rank == 1:
            model.activation_checkpointing_enable()
        elif case == "router logits on one rank" and rank == 1:
            kwargs["output_router_logits"] = True
        model(**kwargs)
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return ""


def two_forwards_then_backward(rank: int, size: int, kind: str, checkpointing: bool) -> dict[str, torch.Tensor]:
    """Gradient accumulation with both forwards before the backwards: two batches of the same
    document lengths (rows see up to 40 tokens and keep a few) but different tokens; returns the
    summed gradients."""
    tasks, cp = model_of(kind)
    model = tasks.tiny_model(torch.float64)
    if checkpointing:
        model.activation_checkpointing_enable()
    cp.context_parallel(model, None, "spill")
    losses = _two_forwards(kind, model)
    (losses[0] + losses[1]).backward()
    cp.all_reduce_gradients(model)
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def _two_forwards(kind: str, model: Any, lengths: tuple[int, ...] = (40, 24)) -> list[torch.Tensor]:
    """The losses of two forwards of the same document lengths and other tokens (seeds 3, 4)."""
    tasks, cp = model_of(kind)
    losses = []
    for seed in (3, 4):
        input_ids = tasks.packed_ids(lengths, seed)
        ids, positions = cp.shard_batch(input_ids, lengths)
        logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
        losses.append(cp.causal_lm_loss(logits, cp.shard_labels(input_ids, lengths), lengths))
    return losses


def cp_run(rank: int, size: int, lengths: tuple[int, ...], mode: str, *, kind: str,
           dtype: torch.dtype = torch.float64, checkpointing: bool = False, selector: str = "model",
           kl: float | None = None, steps: int = 0, lr: float = 1e-2, seed: int = 0, padding: bool = False,
           tiny_chunks: bool = False, **strategy: Any) -> dict[str, Any]:
    """One rank's context-parallel run: its rows' logits, the summed loss, all-reduced gradients,
    its rows' indexer ids per selecting layer, counters, and per-step losses. ``padding``: the
    last document is named padding (``padding_tokens``); ``tiny_chunks``: the smallest chunks the
    layer can take (one attention row per block, two selector rows, the smallest score slices:
    every running top-k merge runs)."""
    from sparsecp.models._cp import selector as engine_selector
    from sparsecp.models.deepseek_v4 import _selector as v4_selector

    saved = engine_selector.CHUNK_ROWS, v4_selector._SCORE_BYTES
    if tiny_chunks:
        engine_selector.CHUNK_ROWS, v4_selector._SCORE_BYTES = 2, 1
    try:
        return _cp_run(kind, lengths, mode, dtype, checkpointing, selector, kl, steps, lr, seed, padding,
                       tiny_chunks, strategy)
    finally:
        engine_selector.CHUNK_ROWS, v4_selector._SCORE_BYTES = saved


def _cp_run(kind: str, lengths: tuple[int, ...], mode: str, dtype: torch.dtype, checkpointing: bool, selector: str,
            kl: float | None, steps: int, lr: float, seed: int, padding: bool, tiny_chunks: bool,
            strategy: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    tasks, cp = model_of(kind)
    model = tasks.tiny_model(dtype, seed)
    if checkpointing:
        model.activation_checkpointing_enable()
    model.train()
    cp.context_parallel(model, None, mode, selector=selector, indexer_kl_coeff=kl, **strategy)
    state = cp.context_parallel_state(model)
    state.keep_last_ids = True  # the ids are compared with the oracle's
    if tiny_chunks:
        state.attention_chunk_bytes = 1
    input_ids = tasks.packed_ids(lengths)
    ids, positions = cp.shard_batch(input_ids, lengths)
    labels = cp.shard_labels(input_ids, lengths)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr) if steps else None
    losses = []
    result: dict[str, Any] = {}
    for step in range(max(steps, 1)):
        model.zero_grad(set_to_none=True)
        state.stats.reset()
        state.clock.calls = 0
        extra = {"padding_tokens": lengths[-1]} if padding else {}
        out = model(input_ids=ids, position_ids=positions, document_lengths=lengths, **extra)
        loss = cp.causal_lm_loss(out.logits, labels, lengths)
        kl_loss = cp.indexer_kl_loss(model)
        (loss if kl_loss is None else loss + kl_loss).backward()
        cp.all_reduce_gradients(model)
        summed = torch.tensor([float(loss.detach()), 0.0 if kl_loss is None else float(kl_loss.detach())],
                              dtype=torch.float64)
        if dist.get_world_size() > 1:
            dist.all_reduce(summed)
        losses.append(float(summed[0]))
        if step == 0:
            result = {"logits": out.logits[0].detach(), "loss": float(summed[0]), "kl": float(summed[1]),
                      "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                      "ids": [state.last_ids(layer).clone() for layer in sorted(state.recorded)],
                      "selecting_layers": sum(getattr(getattr(layer.self_attn, "compressor", None), "indexer", None)
                                              is not None or hasattr(layer.self_attn, "indexer")
                                              for layer in model.model.layers),
                      "selections": state.stats.selections, "replays": state.stats.replays,
                      "selector_calls": state.clock.calls}
        if optimizer is not None:
            optimizer.step()
    result["losses"] = losses
    return result


def cp_runs(rank: int, size: int, runs: list[tuple[tuple[int, ...], str, dict[str, Any]]], *, kind: str) -> list[Any]:
    """Several ``cp_run`` calls in one task: ``(lengths, mode, options)`` each."""
    return [cp_run(rank, size, lengths, mode, kind=kind, **options) for lengths, mode, options in runs]


def assert_close(expected: dict[str, Any], results: list[dict[str, Any]], what: str, *, logits: float,
                 grads: float, loss: float) -> None:
    """The CP ranks' logits (concatenated), loss and every rank's gradients against the oracle's:
    logits within ``logits`` of the largest logit, each gradient within ``grads`` of its tensor's
    largest entry, the loss to ``loss`` relative."""
    import pytest

    got = torch.cat([r["logits"] for r in results])
    scale = float(expected["logits"].abs().max())
    gap = float((got - expected["logits"]).abs().max())
    assert gap <= logits * scale, f"{what}: logits differ by {gap:.3g} (largest logit {scale:.3g})"
    assert results[0]["loss"] == pytest.approx(expected["loss"], rel=loss, abs=0), what
    for name, want in expected["grads"].items():
        for rank, result in enumerate(results):
            bound = grads * max(float(want.abs().max()), 1e-12)
            error = float((result["grads"][name] - want).abs().max())
            assert error <= bound, f"{what}: rank {rank} gradient of {name} differs by {error:.3g} (bound {bound:.3g})"


def balance(rank: int, size: int, kind: str) -> dict[str, Any]:
    """Two training forwards, then ``balance_report`` (a window of both), then one more forward
    and a second report (a window of one)."""
    tasks, cp = model_of(kind)
    model = tasks.tiny_model(torch.float64)
    cp.context_parallel(model, None, "zigzag")
    lengths = (40, 24)
    input_ids = tasks.packed_ids(lengths)
    ids, positions = cp.shard_batch(input_ids, lengths)
    reports = []
    for forwards in (2, 1):
        for _ in range(forwards):
            logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
            cp.causal_lm_loss(logits, cp.shard_labels(input_ids, lengths), lengths).backward()
        reports.append(cp.balance_report(model))
    try:
        cp.balance_report(model, step_seconds=float("nan"))
        refused = ""
    except ValueError as error:
        refused = str(error)
    return {"reports": reports, "line": str(reports[0]), "refused": refused}


def compare_ids(cp_ids: list[torch.Tensor], oracle_ids: list[list[torch.Tensor]], lengths: tuple[int, ...],
                size: int, rank: int, ratio: int = 1, scores: list[list[torch.Tensor]] | None = None) -> list[str]:
    """Rows whose CP ids (bank rows; at ratio 1 token rows) differ from the oracle's, as sets of
    document-local ids the row can see (a model's top-k may also return keys a row does not see
    when it sees fewer than top-k, which its causal mask then drops), each with the model's
    scores of the ids the two disagree on (a gap of 0 is a tie the top-k had to break)."""
    import numpy as np

    from sparsecp import compressed_document_offsets, document_boundaries

    boundaries = list(document_boundaries(lengths))
    keys = list(compressed_document_offsets(boundaries, ratio))
    local = sum(lengths) // size
    differences = []
    for layer, (mine, theirs) in enumerate(zip(cp_ids, oracle_ids)):
        for row in range(local):
            token = rank * local + row
            d = int(np.searchsorted(boundaries, token, side="right") - 1)
            position = token - boundaries[d]
            got = sorted(int(i) - keys[d] for i in mine[row].tolist() if i >= 0)
            want = sorted(int(i) for i in theirs[d][position].tolist() if 0 <= i < (position + 1) // ratio)
            if got != want:
                gap = ""
                if scores is not None:
                    row_scores = scores[layer][d][position]
                    disputed = sorted(set(got) ^ set(want))
                    gap = " (model's scores " + ", ".join(f"{i}: {float(row_scores[i]):.9g}" for i in disputed) + ")"
                differences.append(f"layer {layer} document {d} position {position}: {got} != {want}{gap}")
    return differences


def randomized(model: Any, seed: int, parameters: dict[str, Callable[[torch.Tensor, Any], torch.Tensor]],
               buffers: dict[str, Callable[[torch.Tensor, Any], torch.Tensor]]) -> Any:
    """``model`` with the parameters and buffers whose names end with a key of ``parameters`` /
    ``buffers`` refilled by its function of (the tensor, a generator seeded ``seed + 1``): what a
    model initialises to constants gets random values, the same for the same seed on every rank."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for named, fills in ((model.named_parameters(), parameters), (model.named_buffers(), buffers)):
            for name, tensor in named:
                fill = next((f for suffix, f in fills.items() if name.endswith(suffix)), None)
                if fill is not None:
                    tensor.copy_(fill(tensor, generator))
    return model


def attention_inputs_per_document(model: Any, input_ids: torch.Tensor, lengths: tuple[int, ...],
                                  selecting: Callable[[Any], bool]) -> Iterator[tuple[int, int, Any, Any, Any]]:
    """Runs ``model`` on each document alone without gradients and yields, per layer whose
    attention ``selecting`` names, ``(document length, layer, hidden states, position_ids,
    position_embeddings)`` as that attention received them."""
    inputs: dict[int, tuple[Any, Any, Any]] = {}

    def keep(index: int, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        inputs[index] = (hidden, kwargs.get("position_ids"), kwargs["position_embeddings"])

    hooks = [layer.self_attn.register_forward_pre_hook(functools.partial(keep, index), with_kwargs=True)
             for index, layer in enumerate(model.model.layers) if selecting(layer.self_attn)]
    try:
        start = 0
        with torch.no_grad():
            for length in lengths:
                ids = input_ids[:, start:start + length]
                start += length
                inputs.clear()
                model(input_ids=ids, use_cache=False)
                for index, (hidden, positions, embeddings) in list(inputs.items()):
                    yield length, index, hidden, positions, embeddings
    finally:
        for hook in hooks:
            hook.remove()


def is_csa(attention: Any) -> bool:
    """A DeepSeek-V4 attention with a CSA compressor (a Lightning Indexer)."""
    return attention.compressor is not None and hasattr(attention.compressor, "indexer")


def compiled_blocks(rank: int, size: int, kind: str, backend: str) -> dict[str, Any]:
    """One CP training forward and backward with every decoder layer compiled (torchtitan's
    per-block ``torch.compile``, ``fullgraph=False``) against the same run eager: the largest
    differences of the logits and the gradients, and Dynamo's graph breaks by reason."""
    from torch._dynamo.utils import counters

    tasks, cp = model_of(kind)
    lengths = (13, 17, 11, 7)
    runs = []
    for compiled in (False, True):
        model = tasks.tiny_model(torch.float64)
        cp.context_parallel(model, None, "spill", calibrate=False)
        if compiled:
            torch._dynamo.reset()
            counters.clear()
            for layer in model.model.layers:
                layer.compile(backend=backend)
        ids, positions = cp.shard_batch(tasks.packed_ids(lengths), lengths)
        logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
        cp.causal_lm_loss(logits, cp.shard_labels(tasks.packed_ids(lengths), lengths), lengths).backward()
        runs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (eager, eager_grads), (compiled_logits, compiled_grads) = runs
    breaks = {reason.split("\n")[0]: count for reason, count in counters["graph_break"].items()}
    return {"logits": float((eager - compiled_logits).abs().max() / eager.abs().max()),
            "grads": max(float((g - compiled_grads[n]).abs().max() / g.abs().max().clamp_min(1e-30))
                         for n, g in eager_grads.items()),
            "same_grads": sorted(eager_grads) == sorted(compiled_grads), "breaks": breaks}


def trainer_style(rank: int, size: int, kind: str, inner: bool) -> dict[str, Any]:
    """``model(**batch).loss`` (a Trainer-style loop) with ``labels=shard_labels(..., loss_group=)``,
    copied as a trainer moves a batch (``.to()`` + ``.clone()``), against ``causal_lm_loss`` over the
    same group on the same logits: losses (with and without ``num_items_in_batch``) and gradients.
    ``inner``: ``context_parallel(model.model)``, the outer CausalLM unhooked."""
    import torch.distributed as dist

    tasks, cp = model_of(kind)
    model = tasks.tiny_model(torch.float64)
    cp.context_parallel(model.model if inner else model, None, "spill")
    lengths = (13, 17, 11, 7)
    input_ids = tasks.packed_ids(lengths)
    ids, positions = cp.shard_batch(input_ids, lengths)
    group = dist.group.WORLD
    batch = {"input_ids": ids, "position_ids": positions, "document_lengths": lengths,
             "labels": cp.shard_labels(input_ids, lengths, loss_group=group).to(torch.int64).clone()}
    count = cp.count_valid_tokens(batch["labels"], group) + 5  # as if more micro-batches followed
    out: dict[str, Any] = {"labels_type": type(batch["labels"]).__name__}
    for name, extra in (("mean", {}), ("num_items", {"num_items_in_batch": count})):
        model.zero_grad(set_to_none=True)
        loss = model(**batch, **extra).loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
        plain = cp.shard_labels(input_ids, lengths)
        expected = cp.causal_lm_loss(logits, plain, group=group, **extra)
        expected.backward()
        out[name] = {"loss": float(loss.detach()), "expected": float(expected.detach()),
                     "loss_type": type(loss).__name__,
                     "grads_equal": grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
                     and all(torch.equal(grads[n], p.grad) for n, p in model.named_parameters() if n in grads)}
    summed = torch.tensor([out["mean"]["loss"]], dtype=torch.float64)
    dist.all_reduce(summed)
    out["mean_over_ranks"] = float(summed[0]) / size
    return out


def packed_rows(rank: int, size: int, kind: str) -> dict[str, Any]:
    """A ``[B, S]`` micro-batch of one-document rows made one packed row (``pack_rows``): this
    rank's CP logits and the loss over the CP group, against the unmodified model's own ``[B, S]``
    forward (each row causal: one document)."""
    import torch.distributed as dist

    tasks, cp = model_of(kind)
    model = tasks.tiny_model(torch.float64)
    rows = torch.cat([tasks.packed_ids((16,), seed) for seed in (3, 4, 5)])  # [3, 16]
    reference = copy.deepcopy(model)(input_ids=rows, use_cache=False).logits.detach()
    cp.context_parallel(model, None, "spill")
    input_ids, lengths, _ = cp.pack_rows(rows)
    ids, positions = cp.shard_batch(input_ids, lengths)
    logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
    local = ids.shape[1]
    want = reference.reshape(1, -1, reference.shape[-1])[:, rank * local:(rank + 1) * local]
    loss = cp.causal_lm_loss(logits, cp.shard_labels(input_ids, lengths), group=dist.group.WORLD)
    summed = torch.tensor([float(loss.detach())], dtype=torch.float64)
    dist.all_reduce(summed)
    expected = torch.nn.functional.cross_entropy(reference[:, :-1].reshape(-1, reference.shape[-1]),
                                                 rows[:, 1:].reshape(-1))
    refused = ""
    try:
        model(input_ids=rows, position_ids=torch.arange(16)[None].expand(3, -1), document_lengths=lengths)
    except ValueError as error:
        refused = str(error)
    return {"gap": float((logits.detach() - want).abs().max()), "scale": float(want.abs().max()),
            "loss": float(summed[0]) / size, "expected": float(expected), "refused": refused}


def backwards_in_another_order(rank: int, size: int, kind: str, swapped: bool) -> str:
    """Two forwards of equal lengths (other tokens), then their backwards: in the same order on
    every rank, or (``swapped``) in the other order on rank 1, then a third forward; this rank's
    error text from it ('' if none)."""
    tasks, cp = model_of(kind)
    model = tasks.tiny_model(torch.float64)
    cp.context_parallel(model, None, "spill", calibrate=False)
    lengths = (40, 24)  # the first document spans both ranks: every layer's row gather exchanges
    losses = _two_forwards(kind, model, lengths)
    for loss in (reversed(losses) if swapped and rank == 1 else losses):
        loss.backward()
    ids, positions = cp.shard_batch(tasks.packed_ids(lengths, 5), lengths)
    try:
        model(input_ids=ids, position_ids=positions, document_lengths=lengths)
    except ValueError as error:
        return str(error)
    return ""
