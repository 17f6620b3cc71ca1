"""What every transformers model adapter guarantees alike, run over both (DeepSeek-V4 and V3.2,
``model_tasks.KINDS``): bad input raises the same error on every rank, a missing or changed
transformers is named, and a recompute replays the selection of the forward it belongs to.
(The per-document parity suites, whose oracles are each model's own math, are
test_deepseek_v4.py and test_deepseek_v32.py; a model that is not transformers' is
test_model_adapter.py.)"""
from __future__ import annotations

import functools
import sys

import pytest
import torch

pytest.importorskip("transformers.models.deepseek_v32", reason="transformers >= 5.23 not installed")

import model_tasks  # noqa: E402
from multirank import pool_of, results_or_raise  # noqa: E402

CAUSAL_LM = {"v4": "DeepseekV4ForCausalLM", "v32": "DeepseekV32ForCausalLM"}
# cases one model alone has
ONLY = {"KL without an indexer": "v4", "output_attentions": "v4", "router logits on one rank": "v4"}

# (case, text on every rank, text on at least one rank); {causal_lm} is the model's class.
BAD_INPUT = [
    ("not a model", "TypeError: context_parallel needs a transformers {causal_lm}", None),
    ("bad mode", "zagzig", None),
    ("twice", "already context-parallel", None),
    ("options differ between ranks", "the CP ranks were given different options: rank",
     "strategy_params['target_imbalance']"),
    ("no lengths", "needs document_lengths=", None),
    ("lengths do not sum", "document_lengths sum to 49", None),
    ("lengths differ between ranks", "context-parallel ranks disagree on the batch", None),
    ("wrong shard", "rank 1", "shard has 26 tokens"),
    ("positions", "position_ids must restart at 0", None),
    ("padding", "padding_tokens must be 0 or the length of the batch's last document (7", None),
    ("token past the vocabulary", "input_ids holds token id 97, outside the vocabulary [0, 97)", None),
    ("use_cache", "generation is out of scope", None),
    ("labels", "shard_labels(input_ids, document_lengths, cp_group, loss_group=G)", None),
    ("shard_batch", "document_lengths sum to 48, but the sequence has 47 tokens", None),
    ("base labels", "shard_labels(input_ids, document_lengths, cp_group, loss_group=G)", None),
    ("labels by position", "shard_labels(input_ids, document_lengths, cp_group, loss_group=G)", None),
    ("shard labels, loss_function replaced", "(replaced): it would shift the labels again", None),
    ("shard labels without a group", "these ShardLabels carry no loss_group", None),
    ("output_attentions", "output_attentions=True is not supported", None),
    ("weights differ", "the CP ranks hold different weights", None),
    ("weights changed on one rank later", "check_weights: the CP ranks hold different weights", None),
    ("another batch's shard", "ranks disagree on the batch: rank", "shard_batch's digest of the whole batch"),
    ("both ranks bad", "rank", None),
    ("no positions", "position_ids are missing", None),
    ("checkpointing on one rank", "ranks disagree on the batch: rank", "activation checkpointing"),
    ("router logits on one rank", "ranks disagree on the batch: rank", "output_router_logits"),
    ("KL without an indexer", "indexer_kl_coeff=0.1 trains the Lightning Indexer, but this model has no", None),
    ("kl coeff a string", "ValueError: indexer_kl_coeff must be a real number (the KL loss's coefficient) or None, "
                          "got '0.1' (str)", None),
    ("kl coeff a bool", "indexer_kl_coeff must be a real number (the KL loss's coefficient) or None, got True (bool)",
     None),
]


@pytest.mark.parametrize(("kind", "case", "every_rank", "single"), [
    (kind, *row) for kind in model_tasks.KINDS for row in BAD_INPUT if ONLY.get(row[0], kind) == kind])
def test_bad_input_raises_on_every_rank(kind: str, case: str, every_rank: str, single: str | None) -> None:
    errors = results_or_raise(pool_of(2).run(model_tasks.bad_input, kind, case, timeout=120))
    if case == "both ranks bad":  # each rank reports its own error, not its peer's
        assert "position_ids must restart at 0" in errors[0] and "position_ids are missing" in errors[1], errors
    for rank, error in enumerate(errors):
        assert every_rank.format(causal_lm=CAUSAL_LM[kind]) in error, f"rank {rank}: {error!r}"
    if single is not None:
        assert any(single in error for error in errors), errors


@pytest.mark.parametrize("kind", model_tasks.KINDS)
def test_missing_transformers_names_the_version(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _, cp = model_tasks.model_of(kind)
    package = "transformers.models.deepseek_v4" if kind == "v4" else "transformers.models.deepseek_v32"
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(ImportError, match=rf"needs transformers >= 5\.23 \({CAUSAL_LM[kind]}\)"):
        cp.context_parallel(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("kind", model_tasks.KINDS)
def test_recompute_replays_its_own_forwards_selection(kind: str) -> None:
    """Two forwards of equal lengths (different tokens) before one backward: each layer's
    recompute replays the ids of the forward it belongs to, not the latest one."""
    plain, recomputed = (results_or_raise(pool_of(2).run(model_tasks.two_forwards_then_backward, kind, checkpointing,
                                                         timeout=300)) for checkpointing in (False, True))
    for rank, (a, b) in enumerate(zip(plain, recomputed)):
        for name, grad in a.items():
            assert torch.equal(grad, b[name]), f"rank {rank}: {name} differs under recompute"


@pytest.mark.parametrize("kind", model_tasks.KINDS)
def test_balance_report_in_the_users_loop(kind: str) -> None:
    results = results_or_raise(pool_of(2).run(model_tasks.balance, kind, timeout=300))
    assert results[0]["reports"] == results[1]["reports"], "every rank gets the same report"
    first, second = results[0]["reports"]
    assert (first.ranks, first.forwards, second.forwards) == (2, 2, 1)
    assert all(s > 0 for s in first.selection_seconds) and all(s > 0 for s in first.step_seconds)
    m = sum(first.selection_seconds) / 2
    rest = sum(first.step_seconds) / 2 - m
    assert first.imbalance == pytest.approx(max(first.selection_seconds) / m)
    assert first.bound == pytest.approx((rest + first.imbalance * m) / (rest + m)) and first.bound >= 1
    assert 0 < first.selection_share < 1
    assert first.moved_bytes[0] > 0, "rank 0 sends the rows rank 1 reads (its window halo / document prefix)"
    assert first.prediction_error is None  # zigzag plans on no cost model
    assert "selection imbalance" in results[0]["line"] and "bound" in results[0]["line"]
    assert all("step_seconds must be a finite number of seconds >= 0, got nan" in r["refused"] for r in results)


@pytest.mark.parametrize(("kind", "size"), [("v4", 4), ("v32", 2)])
def test_three_adamw_steps_follow_the_per_document_run(kind: str, size: int) -> None:
    tasks, _ = model_tasks.model_of(kind)
    lengths = (13, 17, 11, 7)
    expected = tasks.per_document_oracle(tasks.tiny_model(), tasks.packed_ids(lengths), lengths, steps=3)["losses"]
    results = results_or_raise(pool_of(size).run(functools.partial(tasks.cp_run, steps=3), lengths, "spill",
                                                 timeout=600))
    assert results[0]["losses"] == pytest.approx(expected, rel=1e-8), (results[0]["losses"], expected)
    assert expected[2] != pytest.approx(expected[0], rel=1e-6), "the steps changed nothing: the test proves nothing"


@pytest.mark.parametrize("kind", model_tasks.KINDS)
def test_per_block_compile_equals_eager(kind: str) -> None:
    """torchtitan's per-block ``torch.compile`` (every decoder layer, ``fullgraph=False``) of a CP
    model, through AOTAutograd (``aot_eager``: the graphs, functionalization and autograd inductor
    would take, without its code generation): logits and gradients equal eager's, and the CP
    attention is a graph break of its own (it runs eagerly: host planning, clocks, async collectives)."""
    for rank, out in enumerate(results_or_raise(pool_of(2).run(model_tasks.compiled_blocks, kind, "aot_eager",
                                                               timeout=600))):
        assert out["same_grads"] and out["logits"] <= 1e-12 and out["grads"] <= 1e-9, (rank, out)
        assert any("torch.compiler.disable" in reason for reason in out["breaks"]), (rank, out["breaks"])
        assert not any("async_op" in reason or "time function" in reason for reason in out["breaks"]), out["breaks"]


@pytest.mark.parametrize("kind", model_tasks.KINDS)
@pytest.mark.parametrize("inner", [False, True], ids=["causal_lm", "inner"])
def test_trainer_style_loss_takes_shard_labels_as_they_are(kind: str, inner: bool) -> None:
    """``model(**batch).loss`` with ``labels=shard_labels(..., loss_group=)`` (moved and copied as a
    trainer does) is ``causal_lm_loss`` over that group, with and without ``num_items_in_batch``:
    the labels are never shifted again (issue 43 item 8)."""
    tasks, _ = model_tasks.model_of(kind)
    lengths = (13, 17, 11, 7)
    oracle = tasks.per_document_oracle(tasks.tiny_model(), tasks.packed_ids(lengths), lengths)["loss"]
    results = results_or_raise(pool_of(2).run(model_tasks.trainer_style, kind, inner, timeout=300))
    for rank, out in enumerate(results):
        assert out["labels_type"] == "ShardLabels", out
        for name in ("mean", "num_items"):
            assert out[name]["loss"] == out[name]["expected"] and out[name]["grads_equal"], (rank, name, out)
            assert out[name]["loss_type"] == "Tensor", out
        assert out["num_items"]["loss"] < out["mean"]["loss"], "num_items_in_batch (5 more tokens) was not used"
    assert results[0]["mean_over_ranks"] == pytest.approx(oracle, rel=1e-10), (results[0], oracle)


@pytest.mark.parametrize("kind", model_tasks.KINDS)
def test_a_micro_batch_of_rows_is_one_packed_row(kind: str) -> None:
    """torchtitan's ``[B, S]`` micro-batch through ``pack_rows``: logits and loss of the model's own
    ``[B, S]`` forward; ``[B, S / cp]`` given to the model is refused naming ``pack_rows`` (item 7)."""
    for rank, out in enumerate(results_or_raise(pool_of(2).run(model_tasks.packed_rows, kind, timeout=300))):
        assert out["gap"] <= 1e-6 * out["scale"], (rank, out)  # the parity suites' bound (the models' float32 steps)
        assert out["loss"] == pytest.approx(out["expected"], rel=1e-9), (rank, out)  # sums in another order
        assert "pack_rows" in out["refused"] and "(3, 16)" in out["refused"], out["refused"]


@pytest.mark.parametrize("kind", model_tasks.KINDS)
def test_backwards_in_another_order_on_one_rank_are_named_at_the_next_forward(kind: str) -> None:
    """Two forwards, then their backwards in the other order on rank 1 (gradients silently wrong:
    each row gather's backward exchange met the peer's other forward): the next forward raises on
    every rank; the same order on every rank raises nothing (issue 43 item 20)."""
    same = results_or_raise(pool_of(2).run(model_tasks.backwards_in_another_order, kind, False, timeout=300))
    assert same == ["", ""], same
    swapped = results_or_raise(pool_of(2).run(model_tasks.backwards_in_another_order, kind, True, timeout=300))
    for rank, error in enumerate(swapped):
        assert "the backwards ran in a different order on the CP ranks" in error, (rank, error)
