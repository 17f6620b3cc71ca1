"""transformers' DeepSeek-V4 under context parallelism equals the model run one document at a time.

A tiny random ``DeepseekV4ForCausalLM`` (v4_tasks.tiny_config: sliding, two CSA layers of ratio
4 and an HCA layer of ratio 8, window 6, top-k 3) on 1, 2 and 4 gloo ranks, float64, against the
unmodified model run on each document alone.

Tolerances. Every path runs in float64, but the model itself computes some steps in float32
whatever its parameters' dtype: the hyper-connections (``DeepseekV4HyperConnection``: ``.float()``),
the compressors' gate softmax (``softmax(dtype=torch.float32)``) and the indexer score
(``DeepseekV4IndexerScorer``: ``q.float()``). Those float32 results depend on how many rows a
call holds (a shard of S / cp rows against a whole document), so the CP and per-document runs
agree to float32 rounding, not to float64's: logits within 1e-6 of the largest logit, each
gradient within 1e-4 of its tensor's largest entry (the worst seen: 2e-5, a hyper-connection
scale summed over every token). The indexer's ids must be identical (same sets per row).
"""
from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("transformers.models.deepseek_v4", reason="transformers >= 5.23 (DeepseekV4) not installed")

import model_tasks  # noqa: E402
import v4_tasks  # noqa: E402
from multirank import pool_of, results_or_raise  # noqa: E402

LOGIT_TOLERANCE = 1e-6
GRAD_TOLERANCE = 1e-4
RATIO = 4

# Documents shorter than the window (6) and than the ratios (4, 8), of length 1, one spanning
# ranks 0-2 of 4 with shard boundaries inside CSA and HCA windows (12 and 24 fall at positions
# 9 and 21 of the 30-token document).
AWKWARD = (1, 2, 30, 5, 2, 8)
OPTIONS = {"none": {}, "zigzag": {}, "greedy": {"block_size": 4}, "hybrid": {"block_size": 4,
                                                                             "zigzag_min_length": 16},
           "spill": {}}


@functools.cache
def oracle(lengths: tuple[int, ...], steps: int = 0) -> dict:
    return v4_tasks.per_document_oracle(v4_tasks.tiny_model(), v4_tasks.packed_ids(lengths), lengths, steps=steps)


def assert_matches_oracle(results: list[dict], lengths: tuple[int, ...], size: int, what: str) -> None:
    expected = oracle(lengths)
    model_tasks.assert_close(expected, results, what, logits=LOGIT_TOLERANCE, grads=GRAD_TOLERANCE, loss=1e-9)
    for rank, result in enumerate(results):
        assert len(result["ids"]) == result["selecting_layers"] > 0, f"{what}: rank {rank} kept no ids to compare"
        differences = model_tasks.compare_ids(result["ids"], expected["ids"], lengths, size, rank, RATIO,
                                              expected["scores"])
        assert not differences, f"{what}: rank {rank} indexer ids differ from the model's own: {differences[:4]}"


@pytest.mark.parametrize("size", [1, 2, 4])
def test_every_strategy_equals_the_model_run_per_document(size: int) -> None:
    lengths = AWKWARD
    runs = [(lengths, mode, options) for mode, options in OPTIONS.items()]
    per_rank = results_or_raise(pool_of(size).run(v4_tasks.cp_runs, runs, timeout=600))
    for index, (_, mode, _) in enumerate(runs):
        results = [rank_results[index] for rank_results in per_rank]
        assert_matches_oracle(results, lengths, size, f"{size} ranks, mode {mode}")
        assert all(r["selections"] == 2 for r in results), "one balanced selection per CSA layer"


@pytest.mark.parametrize("lengths", [
    (48,),                    # one document across every rank
    (1,) * 8 + (40,),         # eight one-token documents, then a long one
    (3, 3, 3, 3, 36),         # documents shorter than the window and the ratio
    (13, 17, 11, 7),          # primes: every shard boundary inside a compression window
])
def test_awkward_batches(lengths: tuple[int, ...]) -> None:
    results = results_or_raise(pool_of(4).run(v4_tasks.cp_run, lengths, "spill", timeout=600))
    assert_matches_oracle(results, lengths, 4, f"batch {lengths}")


def test_gradient_checkpointing_replays_the_selection() -> None:
    lengths = AWKWARD
    options = OPTIONS["hybrid"]
    plain, recomputed = (results_or_raise(pool_of(4).run(
        functools.partial(v4_tasks.cp_run, checkpointing=checkpointing, **options), lengths, "hybrid", timeout=600))
        for checkpointing in (False, True))
    for rank, (a, b) in enumerate(zip(plain, recomputed)):
        assert b["replays"] == 2 and a["replays"] == 0, f"rank {rank}: each CSA layer replays once when recomputed"
        assert (a["selections"], a["selector_calls"]) == (b["selections"], b["selector_calls"]), \
            f"rank {rank}: recompute must not select again"
        for name, grad in a["grads"].items():
            assert torch.equal(grad, b["grads"][name]), f"rank {rank}: gradient of {name} changed by recompute"
    assert_matches_oracle(recomputed, lengths, 4, "gradient checkpointing")


def test_indexer_kl_trains_the_indexer_and_changes_nothing_else() -> None:
    lengths = AWKWARD
    coeff = 0.5
    off, on = (results_or_raise(pool_of(4).run(functools.partial(v4_tasks.cp_run, kl=kl), lengths, "spill",
                                               timeout=600)) for kl in (None, coeff))
    expected = v4_tasks.kl_reference(v4_tasks.tiny_model(), v4_tasks.packed_ids(lengths), lengths, coeff)
    assert expected > 0
    assert on[0]["kl"] == pytest.approx(expected, rel=1e-6), (on[0]["kl"], expected)
    for rank, (a, b) in enumerate(zip(off, on)):
        assert torch.equal(a["logits"], b["logits"]), f"rank {rank}: the KL changed the logits"
        indexer = [name for name in a["grads"] if ".indexer." in name]
        assert len(indexer) == 2 * 6
        for name, grad in a["grads"].items():
            if name in indexer:
                assert not grad.any(), f"{name} has a gradient without the KL (the model's indexer has none)"
                assert torch.isfinite(b["grads"][name]).all() and b["grads"][name].any(), \
                    f"rank {rank}: {name} got no gradient from the KL"
            else:
                assert torch.equal(grad, b["grads"][name]), f"rank {rank}: the KL changed the gradient of {name}"


def test_fused_selector_selects_like_the_model() -> None:
    """sparsecp's fused CPU kernel (float32) picks the model's ids on this batch."""
    lengths = (13, 17, 11, 7)
    results = results_or_raise(pool_of(2).run(functools.partial(v4_tasks.cp_run, selector="fused"), lengths,
                                              "spill", timeout=600))
    expected = oracle(lengths)
    for rank, result in enumerate(results):
        assert not model_tasks.compare_ids(result["ids"], expected["ids"], lengths, 2, rank, RATIO)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float32_and_bfloat16_train(dtype: torch.dtype) -> None:
    lengths = (13, 17, 11, 7)
    results = results_or_raise(pool_of(2).run(functools.partial(v4_tasks.cp_run, dtype=dtype, kl=1.0), lengths,
                                              "spill", timeout=600))
    expected = oracle(lengths)
    logits = torch.cat([r["logits"] for r in results]).double()
    assert torch.isfinite(logits).all()
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    assert float((logits - expected["logits"]).abs().max()) <= tolerance * float(expected["logits"].abs().max())
    for name, grad in results[0]["grads"].items():
        assert torch.isfinite(grad).all(), name


def test_readme_section_and_guide_page_run_on_two_ranks() -> None:
    """The README's "A DeepSeek-V4 model from transformers" section and the blocks of
    guide/deepseek-v4.md, as written, on 2 gloo ranks."""
    import readme_snippets

    readme = readme_snippets.deepseek_v4_readme_snippets()
    guide = readme_snippets.code_blocks(readme_snippets.read("docs/guide/deepseek-v4.md"), "python")
    assert len(readme) == 1 and len(guide) == 1
    results = results_or_raise(pool_of(2).run(v4_tasks.run_doc_snippets, readme, guide, timeout=300))
    for rank, result in enumerate(results):
        assert result["logits"] == (1, 1012, 256), rank
        # the guide's loop: 3 steps of one CSA layer, each selecting once and replaying in the recompute
        assert result["indexer_grad"] and result["replays"] == 3 and result["selections"] == 3, (rank, result)


@pytest.mark.parametrize("size", [2, 4])
def test_strategies_whose_workers_may_receive_no_rows(size: int) -> None:
    """'snake' and 'lpt-search' can leave a worker with no rows to select: the model selector
    returns no ids for it (it used to raise reshaping an empty tensor), and the run equals the
    model run per document."""
    runs = [(AWKWARD, mode, {}) for mode in ("snake", "lpt-search")]
    per_rank = results_or_raise(pool_of(size).run(v4_tasks.cp_runs, runs, timeout=600))
    for index, (_, mode, _) in enumerate(runs):
        assert_matches_oracle([rank_results[index] for rank_results in per_rank], AWKWARD, size,
                              f"{size} ranks, {mode}")


def test_uses_that_used_to_mislead() -> None:
    """Nine micro-batches of different lengths under checkpointing before one backward give the
    gradients of nine backwards; the KL survives an evaluation forward; reentrant checkpointing
    with the KL names the cause; document_lengths may be a generator."""
    for rank, out in enumerate(results_or_raise(pool_of(2).run(v4_tasks.misuse_runs, timeout=600))):
        assert out["nine micro-batches"] <= 1e-12, (rank, out)
        first, after_eval = out["kl after eval"]
        assert first == after_eval and first > 0, (rank, out)
        assert out["generator lengths"] == 0, (rank, out)
        assert "use_reentrant=True" in out["reentrant"], (rank, out)


def test_the_indexer_kl_skips_the_padding_document() -> None:
    """A batch padded to a multiple of the CP size (``pad_to_multiple``) with ``padding_tokens=``:
    the KL and the indexer's gradients equal the unpadded batch's (its rows count neither in the
    sum nor in the mean's denominator)."""
    results = results_or_raise(pool_of(2).run(v4_tasks.padding_kl, timeout=300))
    for rank, out in enumerate(results):
        plain, padded = out["plain"], out["padded"]
        assert padded["padding"] > 0, out
        assert padded["kl"] == pytest.approx(plain["kl"], rel=1e-12) and plain["kl"] > 0, (rank, out)
        for name, grad in plain["grads"].items():
            scale = max(float(grad.abs().max()), 1e-12)
            assert float((padded["grads"][name] - grad).abs().max()) <= 1e-9 * scale, (rank, name)
