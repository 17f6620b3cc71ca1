"""Rank tasks for test_model_adapter.py: TinyDSA (a model that is not transformers') under sparsecp's
engine through its own adapter, against its per-document run; and ``undo_context_parallel`` on
every adapter."""
from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from tiny_dsa import TinyDSA, TinyDSAAdapter

VOCAB = 61


def packed_ids(lengths: tuple[int, ...], seed: int = 3) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, sum(lengths)), generator=torch.Generator().manual_seed(seed))


def tiny_model(seed: int = 0, **settings: Any) -> TinyDSA:
    torch.manual_seed(seed)
    return TinyDSA(vocab=VOCAB, **settings).double()


def per_document(model: TinyDSA, input_ids: torch.Tensor, lengths: tuple[int, ...]) -> dict[str, Any]:
    """The model run on each document alone: logits [S, vocab], the mean next-token loss over the
    batch, and every parameter's gradient (zeros where none)."""
    model = copy.deepcopy(model)
    count, start, logits = sum(lengths) - len(lengths), 0, []
    for length in lengths:
        ids = input_ids[:, start:start + length]
        out = model(ids)
        logits.append(out[0])
        if length > 1:
            (torch.nn.functional.cross_entropy(out[0, :-1], ids[0, 1:], reduction="sum") / count).backward()
        start += length
    return {"logits": torch.cat(logits).detach(),
            "grads": {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in model.named_parameters()}}


def cp_run(rank: int, size: int, lengths: tuple[int, ...], mode: str, checkpointing: bool = False) -> dict[str, Any]:
    """One rank's CP training forward and backward of TinyDSA: its rows' logits, the all-reduced
    gradients, counters, and what ``print(model)`` shows."""
    import sparsecp.models as cp

    model = tiny_model(checkpointing=checkpointing)
    cp.context_parallel(model, TinyDSAAdapter(), None, mode=mode)
    state = cp.context_parallel_state(model)
    input_ids = packed_ids(lengths)
    ids, positions = cp.shard_batch(input_ids, lengths)
    logits = model(ids, position_ids=positions, document_lengths=lengths)
    cp.causal_lm_loss(logits, cp.shard_labels(input_ids, lengths), lengths).backward()
    cp.all_reduce_gradients(model)
    return {"logits": logits[0].detach(), "printed": repr(model), "selections": state.stats.selections,
            "replays": state.stats.replays,
            "grads": {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in model.named_parameters()}}


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def _case(which: str) -> tuple[torch.nn.Module, Any, Any, Any]:
    """(model, make it CP, its packed ids of lengths, its plain forward's logits)."""
    import sparsecp.models as cp

    if which == "tiny":
        adapter = TinyDSAAdapter()
        return (tiny_model(), lambda m: cp.context_parallel(m, adapter, None, mode="spill"), packed_ids,
                lambda m, ids: m(ids))
    import v4_tasks
    import v32_tasks

    from sparsecp.models import deepseek_v4, deepseek_v32

    tasks, module = (v4_tasks, deepseek_v4) if which == "v4" else (v32_tasks, deepseek_v32)
    return (tasks.tiny_model(torch.float64), lambda m: module.context_parallel(m, None, "spill", calibrate=False),
            tasks.packed_ids, lambda m, ids: m(input_ids=ids).logits)


def undo_leaves_the_original(rank: int, size: int, which: str) -> dict[str, Any]:
    """A model made context-parallel, trained one step under CP, then undone, against a copy never
    made parallel: the same module classes, repr, hooks, config and process-wide patches, and a
    forward (on a packed row, no CP) equal bit for bit; then it can be made parallel again."""
    from transformers.loss import loss_utils
    from transformers.models.deepseek_v4 import modeling_deepseek_v4

    import sparsecp.models as cp

    model, make, packed, plain = _case(which)
    lengths = (5, 11) if which == "tiny" else (13, 7)
    original = copy.deepcopy(model)
    patched_before = loss_utils.LOSS_MAPPING["ForCausalLM"], modeling_deepseek_v4.load_balancing_loss_func
    make(model)
    printed = repr(model)
    swapped = [type(m).__name__ for m in cp.context_parallel_state(model).modules]
    ids, positions = cp.shard_batch(packed(lengths), lengths)
    out = model(input_ids=ids, position_ids=positions, document_lengths=lengths)
    (out if isinstance(out, torch.Tensor) else out.logits).sum().backward()
    patched = (loss_utils.LOSS_MAPPING["ForCausalLM"], modeling_deepseek_v4.load_balancing_loss_func)
    cp.undo_context_parallel(model)
    with torch.no_grad():
        same = torch.equal(plain(model, packed(lengths)), plain(original, packed(lengths)))
    config = getattr(model, "config", None)
    result = {"printed": printed, "swapped": swapped, "same_forward": same, "repr_equal": repr(model) == repr(original),
              "classes_equal": [type(m) for m in model.modules()] == [type(m) for m in original.modules()],
              "hooks": _hooks(model), "state_gone": cp.context_parallel_state(model) is None,
              # wrapped while CP (functools.wraps sets __wrapped__; an earlier task's CP model in this
              # process may hold the patches already, so "before" need not be transformers' own)
              "patched": [hasattr(f, "__wrapped__") for f in patched],
              "restored": [a is b for a, b in zip((loss_utils.LOSS_MAPPING["ForCausalLM"],
                                                   modeling_deepseek_v4.load_balancing_loss_func), patched_before)],
              "config_equal": config is None or config.to_dict() == original.config.to_dict()}
    make(model)  # an undone model can be made context-parallel again
    cp.undo_context_parallel(model)
    if dist.is_initialized():
        dist.barrier()
    return result


def run_guide(rank: int, size: int, blocks: list[str]) -> dict[str, Any]:
    """The python blocks of docs/guide/your-model.md, as written, in one fresh namespace."""
    import sparsecp.models as cp

    namespace: dict[str, Any] = {"__name__": "guide"}
    for index, block in enumerate(blocks):
        exec(compile(block, f"docs/guide/your-model.md snippet {index + 1}", "exec"), namespace)  # noqa: S102
    model = namespace["model"]
    return {"logits": tuple(namespace["logits"].shape), "undone": cp.context_parallel_state(model) is None,
            "grads": all(p.grad is not None for n, p in model.named_parameters() if not n.endswith(
                ("index_q.weight", "index_q.bias", "index_k.weight", "index_k.bias", "index_w.weight",
                 "index_w.bias")))}


class _FailingAdapter(TinyDSAAdapter):
    def install(self, model: torch.nn.Module, base: torch.nn.Module, state: Any) -> None:
        raise RuntimeError("an install that fails half-way")


def failed_apply(rank: int, size: int) -> dict[str, Any]:
    """``context_parallel`` whose adapter fails after the classes are swapped: the model is left
    as it was given."""
    import sparsecp.models as cp

    model, original = tiny_model(), tiny_model()
    try:
        cp.context_parallel(model, _FailingAdapter(), None, mode="spill")
        error = ""
    except RuntimeError as caught:
        error = str(caught)
    return {"error": error, "classes": [type(m) for m in model.modules()] == [type(m) for m in original.modules()],
            "hooks": _hooks(model), "state": cp.context_parallel_state(model) is None,
            "repr": repr(model) == repr(original)}
