"""DeepSeek-V4 under CP trained the way large models are trained (issue 37): FSDP2 over a
dp x cp mesh with no hand all-reduce, user labels with -100 and padding documents, the mean over
the valid tokens of the global batch (gradient accumulation included), the MoE load-balancing
loss of the whole packed row, an indexer that learns from its KL, clear errors on every rank,
and the transformers version check.

Tolerances. The model computes its hyper-connections, the compressors' gate softmax and the
indexer score in float32 whatever the parameters' dtype (test_deepseek_v4.py's docstring), so
CP and per-document gradients agree to float32 rounding, not float64's. Losses agree to 1e-8
relative. Parameters after AdamW steps are compared within 0.1 * lr: Adam's first steps move an
entry by about lr times the sign of its gradient, so an entry whose gradient is within float32
rounding of zero may move either way (the worst seen: 0.034 * lr, a hyper-connection weight).
"""
from __future__ import annotations

import copy
import functools

import pytest
import torch

pytest.importorskip("transformers.models.deepseek_v4", reason="transformers (DeepseekV4) not installed")

import model_tasks  # noqa: E402
import training_tasks  # noqa: E402
import v4_tasks  # noqa: E402
from multirank import pool_of, results_or_raise  # noqa: E402

LR = 1e-3
STEPS = 2
DP = 2


@functools.cache
def oracle() -> dict:
    return training_tasks.fsdp_oracle(STEPS, LR, DP)


def assert_follows_oracle(results: list[dict], what: str) -> None:
    expected = oracle()
    assert expected["losses"][1] != pytest.approx(expected["losses"][0], rel=1e-6), "the steps changed nothing"
    for rank, result in enumerate(results):
        assert result["sharded"] == "DTensor", f"{what}: rank {rank}'s parameters are not FSDP2 shards"
        assert result["losses"] == pytest.approx(expected["losses"], rel=1e-8), (what, rank, result["losses"])
        for step, (got, want) in enumerate(zip(result["params"], expected["params"])):
            for name, value in want.items():
                gap = float((got[name] - value).abs().max())
                assert gap <= 0.1 * LR, f"{what}: rank {rank} step {step}: {name} is {gap:.3g} from the oracle"


def test_fsdp2_over_dp_x_cp_equals_every_document_alone() -> None:
    """4 gloo ranks, dp 2 x cp 2, fully_shard over the flattened mesh, FSDP2's default mean:
    two AdamW steps equal one process running every document alone, the loss the mean over the
    valid labels of both dp rows (-100 prompts, padding documents)."""
    results = results_or_raise(pool_of(4).run(training_tasks.fsdp_train, DP, STEPS, 1, LR, timeout=300))
    assert_follows_oracle(results, "dp 2 x cp 2")


def test_gradient_accumulation_equals_one_batch() -> None:
    """Each dp row as two micro-batches (with activation checkpointing), their losses over
    num_items_in_batch = the valid labels of both, every rank: the same steps as one batch."""
    results = results_or_raise(pool_of(4).run(functools.partial(training_tasks.fsdp_train, checkpointing=True),
                                              DP, STEPS, 2, LR, timeout=300))
    assert_follows_oracle(results, "two micro-batches")


def test_fsdp2_with_the_indexer_kl_equals_replicated_weights() -> None:
    """The KL's graph leaves each layer through the indexer's parameters, not the layer's
    output (its inputs are detached); FSDP2 still reduces those gradients: two steps with the
    KL (times the CP size) equal replicated weights whose gradients are averaged over the same
    flattened mesh, and the indexer moved."""
    fsdp, replicated = (results_or_raise(pool_of(4).run(
        functools.partial(training_tasks.fsdp_train, kl=0.5, replicated=flag), DP, STEPS, 1, LR, timeout=300))
        for flag in (False, True))
    start = dict(v4_tasks.tiny_model(torch.float64).named_parameters())
    for rank, (a, b) in enumerate(zip(fsdp, replicated)):
        for name, value in b["params"][-1].items():
            gap = float((a["params"][-1][name] - value).abs().max())
            assert gap <= 1e-12, f"rank {rank}: {name} differs by {gap:.3g} under FSDP2"
        moved = max(float((b["params"][-1][n] - start[n].detach()).abs().max()) for n in start if ".indexer." in n)
        assert moved > 0.5 * LR, "the KL did not train the indexer"


@pytest.mark.parametrize("inner", [False, True])
def test_router_aux_loss_is_the_whole_packed_rows(inner: bool) -> None:
    """out.aux_loss under CP 2 equals transformers' load_balancing_loss_func on the router
    logits of the whole row (each document run alone), and so do the routers' gradients when
    averaged over the CP ranks. ``inner`` (issue 43, item 16): context_parallel(model.model), the
    outer CausalLM unhooked, whose aux_loss was each shard's own and router_aux_loss returned it."""
    lengths = (13, 17, 11, 7)
    results = results_or_raise(pool_of(2).run(training_tasks.router_aux, lengths, inner, timeout=300))
    expected = training_tasks.router_aux_oracle(lengths)
    for rank, result in enumerate(results):
        for what in ("aux", "out.aux_loss", "router_aux_loss(out, model)"):
            assert result[what] == pytest.approx(expected["aux"], rel=1e-6), (rank, what, result, expected["aux"])
        for name, want in expected["grads"].items():
            gap = float((result["grads"][name] - want).abs().max())
            assert gap <= 1e-5 * float(want.abs().max()), f"rank {rank}: {name}'s gradient is {gap:.3g} off"


def test_the_indexer_learns_from_its_kl() -> None:
    """20 AdamW steps under CP 2 on one fixed batch: with the indexer KL in the loss, the
    indexer's recall of the attention's own top-k rises (0.38 -> 0.62 when written) and the KL
    falls (0.109 -> 0.05); the same steps without it leave the recall where it was (the
    indexer gets no other gradient) and the KL does not fall."""
    model = v4_tasks.tiny_model(torch.float64)
    input_ids = v4_tasks.packed_ids(training_tasks.KL_LENGTHS)
    before = training_tasks.attention_recall(model, input_ids, training_tasks.KL_LENGTHS)
    recall, kls = {}, {}
    for train_kl in (False, True):
        result = results_or_raise(pool_of(2).run(training_tasks.kl_training, 1.0, train_kl, 20, 1e-2,
                                                 timeout=300))[0]
        trained = v4_tasks.tiny_model(torch.float64)
        trained.load_state_dict(result["state"], strict=False)  # buffers (hash table) are not parameters
        recall[train_kl] = training_tasks.attention_recall(trained, input_ids, training_tasks.KL_LENGTHS)
        kls[train_kl] = result["kls"]
    assert recall[True] >= before + 0.15, (before, recall)
    assert recall[False] <= before + 0.05, (before, recall)
    last = {k: sum(v[-3:]) / 3 for k, v in kls.items()}
    assert last[True] <= 0.6 * kls[True][0], kls[True]
    assert last[False] >= 0.9 * kls[False][0], kls[False]


@pytest.mark.parametrize(("case", "message"), [
    ("labels shape", "labels must be aligned with input_ids (shape (1, 32)), got shape (1, 31)"),
    ("2-D mesh", "got a 2-D mesh (dp=2 x cp=2): pass the CP dimension, mesh['cp']"),
    ("2-D mesh shard_batch", "got a 2-D mesh (dp=2 x cp=2)"),
    ("fsdp first", "already sharded by fully_shard (FSDP2); call context_parallel on the plain model first"),
    ("loss labels", "labels (1, 4) do not match logits (1, 5, 7)"),
    ("fsdp loss without group", "causal_lm_loss without group=: this model's weights are FSDP2 shards"),
    ("fsdp kl without group", "indexer_kl_loss without group=: this model's weights are FSDP2 shards"),
    ("all_reduce after fsdp", "are DTensor shards (fully_shard / FSDP2)"),
    ("legacy count with masks", "the legacy count (S - documents) would be wrong; pass group="),
    ("num_items_in_batch 0", "num_items_in_batch must be a positive number (the valid tokens of the optimizer step, "
                             "count_valid_tokens), got 0"),
    ("num_items_in_batch -4 tensor", "num_items_in_batch must be a positive number (the valid tokens of the "
                                     "optimizer step, count_valid_tokens), got -4"),
    ("num_items_in_batch a string", "num_items_in_batch must be a positive number (the valid tokens of the "
                                    "optimizer step, count_valid_tokens), got '12'"),
    ("float labels", "labels must be integer token ids (and -100), got dtype torch.float64"),
    ("labels not shifted", "causal_lm_loss: labels learned at a document's last token, which predicts nothing (its "
                           "label must be ignore_index, -100): rank 0 of the loss group has 1; rank 1 of the loss "
                           "group has 2"),
    ("flat mesh as the CP group", "context-parallel ranks disagree on the batch"),
    ("pad_to_multiple a tensor", "pad_to_multiple's multiple must be the CP size (a positive int) or the CP group (a "
                                 "ProcessGroup or 1-D DeviceMesh), got tensor(4) (Tensor)"),
    ("pad_to_multiple a float", "pad_to_multiple's multiple must be the CP size (a positive int) or the CP group (a "
                                "ProcessGroup or 1-D DeviceMesh), got 4.0 (float)"),
    ("pad_to_multiple a bool", "pad_to_multiple's multiple must be the CP size (a positive int) or the CP group (a "
                               "ProcessGroup or 1-D DeviceMesh), got True (bool)"),
])
@pytest.mark.parametrize("kind", model_tasks.KINDS)
def test_bad_training_input_raises_on_every_rank(case: str, message: str, kind: str) -> None:
    errors = results_or_raise(pool_of(4).run(training_tasks.bad_training_input, case, kind, timeout=120))
    for rank, error in enumerate(errors):
        assert error.startswith("ValueError") and message in error, f"rank {rank}: {error!r}"


@pytest.mark.parametrize("form", ["legacy", "group", "num_items"])
@pytest.mark.parametrize(("case", "message"), [
    ("-1 on rank 1", "labels must be token ids in [0, 97) or ignore_index (-100) for tokens not learned: rank 1 of "
                     "the loss group has 1 (e.g. -1)"),
    ("vocab on rank 0", "labels must be token ids in [0, 97) or ignore_index (-100) for tokens not learned: rank 0 "
                        "of the loss group has 2 (e.g. 97)"),
])
@pytest.mark.parametrize("kind", model_tasks.KINDS)
def test_one_rank_s_bad_labels_raise_on_every_rank(case: str, message: str, form: str, kind: str) -> None:
    """Issue 43, item 3: a -1 or a label at or above the vocabulary on one rank raised IndexError
    in cross_entropy on that rank only, and its peer waited in the next collective until the
    group's timeout; the check now rides on the loss's all-reduce and every rank raises, naming
    the rank, the count and a value (in every form of the loss)."""
    errors = results_or_raise(pool_of(2).run(training_tasks.rank_local_labels, case, form, kind, timeout=60))
    for rank, error in enumerate(errors):
        assert error.startswith("ValueError") and message in error, f"rank {rank}: {error!r}"


@pytest.mark.parametrize("kind", model_tasks.KINDS)
@pytest.mark.parametrize("case", ["masks on both ranks", "masks on rank 0"])
def test_the_legacy_loss_counts_its_masks_over_the_cp_group(case: str, kind: str) -> None:
    """Issue 43, item 15: the legacy loss (no group=) refuses labels that mask more tokens than
    the documents' ends on every rank, counted over the CP group: masks spread over the shards
    (each within the old per-shard bound) gave a loss over S - documents (silently wrong), and a
    shard over it raised on that rank only while its peer waited in the next collective."""
    errors = results_or_raise(pool_of(2).run(training_tasks.rank_local_labels, case, "legacy", kind, timeout=60))
    for rank, error in enumerate(errors):
        assert error.startswith("ValueError"), f"rank {rank}: {error!r}"
        assert "labels learn 40 tokens of the CP batch, not S - documents = 44" in error, f"rank {rank}: {error!r}"
        assert "the legacy count (S - documents) would be wrong; pass group=" in error, f"rank {rank}: {error!r}"


def test_int32_input_ids_and_a_numpy_multiple_train_as_int64_does() -> None:
    """int32 input_ids (their labels stay int32) give the int64 run's logits and loss, where the
    loss used to fail inside cross_entropy ("expected scalar type Long"); pad_to_multiple and
    num_items_in_batch take numpy integers (a numpy multiple used to be taken for a group)."""
    for rank, result in enumerate(results_or_raise(pool_of(2).run(training_tasks.int_widths, timeout=120))):
        narrow, wide = result["torch.int32"], result["torch.int64"]
        assert narrow["labels dtype"] == "torch.int32" and narrow["lengths"] == wide["lengths"] == (13, 17, 11, 3)
        assert narrow["loss"] == wide["loss"], rank
        assert torch.equal(narrow["logits"], wide["logits"]), rank


@pytest.mark.parametrize(("average", "bucket_bytes"), [(False, 32 << 20), (True, 64)])
def test_all_reduce_gradients_sums_or_averages_in_buckets(average: bool, bucket_bytes: int) -> None:
    """The replicated path: every rank ends with the sum (or mean) of every rank's gradients,
    a missing gradient counting as zero, whatever the bucket size (64 bytes: most gradients
    alone, reduced in place)."""
    results = results_or_raise(pool_of(2).run(training_tasks.reduce_gradients, average, bucket_bytes, timeout=120))
    expected = {}
    for rank in range(2):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3), torch.nn.Linear(3, 2))
        x = torch.full((4, 5), float(rank + 1))
        (model[1](model[0](x)) if rank % 2 else model(x)).sum().backward()
        for name, p in model.named_parameters():
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            expected[name] = expected.get(name, 0) + grad / (2 if average else 1)
    for rank, result in enumerate(results):
        for name, want in expected.items():
            assert torch.allclose(result[name], want, rtol=1e-6, atol=1e-7), (rank, name)


def test_a_changed_transformers_is_refused_naming_the_version() -> None:
    """The installed transformers (5.23) matches the recorded fingerprints; a module whose
    source differs is refused, naming the installed version and the module."""
    import transformers
    from transformers.models.deepseek_v4 import modeling_deepseek_v4

    from sparsecp.models import deepseek_v4 as cp_v4
    from sparsecp.models._cp import training as _cp_training

    assert cp_v4.V4Adapter().modeling is modeling_deepseek_v4
    changed = dict(cp_v4.UPSTREAM_FINGERPRINTS, DeepseekV4Indexer="0" * 16)
    with pytest.raises(ImportError, match=rf"transformers {transformers.__version__}'s differ: DeepseekV4Indexer"):
        _cp_training.check_upstream(modeling_deepseek_v4, changed, cp_v4.TRANSFORMERS_NEEDED, "deepseek_v4")


def test_pack_rows_lays_rows_end_to_end_and_names_bad_lengths() -> None:
    from sparsecp.models import pack_rows, shard_batch

    rows = torch.arange(12).view(3, 4)
    ids, lengths, labels = pack_rows(rows, [(1, 3), (4,), (2, 2)], labels=rows + 100)
    assert ids.tolist() == [list(range(12))] and lengths == (1, 3, 4, 2, 2)
    assert labels is not None and labels.tolist() == [list(range(100, 112))]
    assert pack_rows(rows)[1] == (4, 4, 4) and pack_rows(rows)[2] is None  # a row is one document
    for lengths, message in (([(4,), (4,)], "lengths give 2 rows' documents, but input_ids has 3 rows"),
                             ([(4,), (3,), (4,)], r"row 1's document lengths \(3,\) sum to 3, not the row's 4"),
                             ([(4,), (0, 4), (4,)], "each of the 3 rows its document lengths"),
                             ((4, 4, 4), "each of the 3 rows its document lengths")):
        with pytest.raises(ValueError, match=message):
            pack_rows(rows, lengths)
    with pytest.raises(ValueError, match=r"\[B, S\] micro-batch, got shape \(12,\)"):
        pack_rows(rows.reshape(-1))
    with pytest.raises(ValueError, match=r"labels must be aligned with input_ids \(shape \(3, 4\)\)"):
        pack_rows(rows, labels=rows[:2])
    with pytest.raises(ValueError, match="pack_rows"):  # the packed-row helpers name it for [B, S]
        shard_batch(rows, (4, 4, 4))


def test_shard_labels_marks_survive_a_trainer_s_copies() -> None:
    """``shard_labels(..., loss_group=)``'s mark and group survive what a trainer does to a batch
    (move, copy, stack, slice); a loss, a mask or floats made from them are plain tensors."""
    from sparsecp.models import ShardLabels

    labels = torch.arange(6).view(1, 6).as_subclass(ShardLabels)
    labels.loss_group, labels.ignore_index = "group", -1
    for copied in (labels.to(torch.int32), labels.clone(), labels[:, 2:], torch.stack([labels[0], labels[0]]),
                   copy.deepcopy(labels)):
        assert isinstance(copied, ShardLabels) and (copied.loss_group, copied.ignore_index) == ("group", -1)
    for plain in (labels != -1, labels.float(),
                  torch.nn.functional.cross_entropy(torch.zeros(6, 7), labels[0].plain())):
        assert type(plain) is torch.Tensor
