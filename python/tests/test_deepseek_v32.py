"""transformers' DeepSeek-V3.2 under context parallelism equals the model run one document at a time.

A tiny random ``DeepseekV32ForCausalLM`` (v32_tasks.tiny_config: MLA with 4 heads, a dense layer
and two MoE layers, an indexer of 8 heads keeping the top 4 of every earlier token) on 1, 2 and
4 gloo ranks, float64, against the unmodified model run on each document alone.

Tolerances. Every path runs in float64, but the model computes some steps in float32 whatever
its parameters' dtype: ``DeepseekV32RMSNorm`` (``.to(torch.float32)``), the router and the indexer
score (``q.float()``). Those float32 results depend on how many rows a call holds (a shard of
S / cp rows against a whole document) and the attention here sums in another order (MLA's
absorbed form), so the CP and per-document runs agree to float32 rounding: logits within 1e-6
of the largest logit, each gradient within 1e-5 of its tensor's largest entry (the worst seen:
2e-7), the loss to 1e-8. The indexer's ids must be identical (same sets per row); a difference
is reported with the model's scores of the disputed ids.

Runs are batched several to a rank-pool task (``v32_tasks.cp_runs``): the file runs on 2 cores.
"""
from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("transformers.models.deepseek_v32", reason="transformers >= 5.23 (DeepseekV32) not installed")

import model_tasks  # noqa: E402
import training_tasks  # noqa: E402
import v32_tasks  # noqa: E402
from multirank import pool_of, results_or_raise  # noqa: E402

LOGIT_TOLERANCE = 1e-6
GRAD_TOLERANCE = 1e-5
LOSS_TOLERANCE = 1e-8
LAYERS = 3  # every V3.2 layer selects

# A document of one token, documents shorter than the top-k (4), one spanning ranks 0-2 of 4 (30
# tokens, shards of 12): rows see 1 to 30 keys and keep 4.
AWKWARD = (1, 2, 30, 5, 2, 8)
OPTIONS = {"none": {}, "zigzag": {}, "greedy": {"block_size": 4},
           "hybrid": {"block_size": 4, "zigzag_min_length": 16}, "spill": {}}


@functools.cache
def oracle(lengths: tuple[int, ...], steps: int = 0) -> dict:
    return v32_tasks.per_document_oracle(v32_tasks.tiny_model(), v32_tasks.packed_ids(lengths), lengths, steps=steps)


def assert_matches_oracle(results: list[dict], lengths: tuple[int, ...], size: int, what: str) -> None:
    expected = oracle(lengths)
    model_tasks.assert_close(expected, results, what, logits=LOGIT_TOLERANCE, grads=GRAD_TOLERANCE, loss=LOSS_TOLERANCE)
    for rank, result in enumerate(results):
        assert len(result["ids"]) == LAYERS, f"{what}: rank {rank} kept {len(result['ids'])} layers' ids"
        differences = model_tasks.compare_ids(result["ids"], expected["ids"], lengths, size, rank, 1,
                                              expected["scores"])
        assert not differences, f"{what}: rank {rank} indexer ids differ from the model's own: {differences[:4]}"


def test_the_oracle_selects() -> None:
    """The batch makes the indexer matter: in every layer, rows of the 30-token document keep 4 of
    up to 30 keys, and not merely the nearest ones (the selection is not a sliding window)."""
    expected = oracle(AWKWARD)
    for layer, documents in enumerate(expected["ids"]):
        ids = documents[2]  # the 30-token document's [30, 4]
        far = [(t, i) for t in range(4, 30) for i in ids[t].tolist() if i < t - 3]
        assert ids.shape == (30, 4) and len(far) > 10, f"layer {layer}: {far}"


@pytest.mark.parametrize("size", [1, 2, 4])
def test_every_strategy_equals_the_model_run_per_document(size: int) -> None:
    runs = [(AWKWARD, mode, options) for mode, options in OPTIONS.items()]
    per_rank = results_or_raise(pool_of(size).run(v32_tasks.cp_runs, runs, timeout=600))
    for index, (_, mode, _) in enumerate(runs):
        results = [rank_results[index] for rank_results in per_rank]
        assert_matches_oracle(results, AWKWARD, size, f"{size} ranks, mode {mode}")
        assert all(r["selections"] == LAYERS for r in results), "one balanced selection per layer"


AWKWARD_BATCHES = [
    (48,),                    # one document across every rank
    (1,) * 8 + (40,),         # eight one-token documents, then a long one
    (3, 3, 3, 3, 36),         # documents shorter than the top-k
    (13, 17, 11, 7),          # primes: every shard boundary inside a document
]


def test_awkward_batches() -> None:
    runs = [(lengths, mode, OPTIONS[mode]) for lengths in AWKWARD_BATCHES for mode in ("spill", "hybrid")]
    per_rank = results_or_raise(pool_of(4).run(v32_tasks.cp_runs, runs, timeout=600))
    for index, (lengths, mode, _) in enumerate(runs):
        assert_matches_oracle([r[index] for r in per_rank], lengths, 4, f"batch {lengths}, mode {mode}")


def test_gradient_checkpointing_replays_the_selection() -> None:
    options = OPTIONS["hybrid"]
    runs = [(AWKWARD, "hybrid", dict(options, checkpointing=checkpointing)) for checkpointing in (False, True)]
    per_rank = results_or_raise(pool_of(4).run(v32_tasks.cp_runs, runs, timeout=600))
    for rank, (plain, recomputed) in enumerate(per_rank):
        assert recomputed["replays"] == LAYERS and plain["replays"] == 0, f"rank {rank}: each layer replays once"
        assert (plain["selections"], plain["selector_calls"]) == (recomputed["selections"],
                                                                  recomputed["selector_calls"]), \
            f"rank {rank}: recompute must not select again"
        for name, grad in plain["grads"].items():
            assert torch.equal(grad, recomputed["grads"][name]), f"rank {rank}: gradient of {name} changed by recompute"
    assert_matches_oracle([r[1] for r in per_rank], AWKWARD, 4, "gradient checkpointing")


def test_indexer_kl_trains_the_indexer_and_changes_nothing_else() -> None:
    coeff = 0.5
    runs = [(AWKWARD, "spill", {"kl": kl}) for kl in (None, coeff)] + \
        [(AWKWARD, "spill", {"kl": coeff, "checkpointing": True})]
    per_rank = results_or_raise(pool_of(2).run(v32_tasks.cp_runs, runs, timeout=600))
    expected = v32_tasks.kl_reference(v32_tasks.tiny_model(), v32_tasks.packed_ids(AWKWARD), AWKWARD, coeff)
    assert expected > 0
    for rank, (off, on, recomputed) in enumerate(per_rank):
        assert on["kl"] == pytest.approx(expected, rel=1e-6), (on["kl"], expected)
        assert torch.equal(off["logits"], on["logits"]), f"rank {rank}: the KL changed the logits"
        indexer = [name for name in off["grads"] if ".indexer." in name]
        assert len(indexer) == LAYERS * 5
        for name, grad in off["grads"].items():
            if name in indexer:
                assert not grad.any(), f"{name} has a gradient without the KL (the model's indexer has none)"
                assert torch.isfinite(on["grads"][name]).all() and on["grads"][name].any(), \
                    f"rank {rank}: {name} got no gradient from the KL"
            else:
                assert torch.equal(grad, on["grads"][name]), f"rank {rank}: the KL changed the gradient of {name}"
        assert recomputed["kl"] == pytest.approx(on["kl"], rel=1e-12) and recomputed["replays"] == LAYERS
        for name, grad in on["grads"].items():
            assert torch.allclose(grad, recomputed["grads"][name], rtol=1e-10, atol=1e-14), \
                f"rank {rank}: recompute changed the KL gradient of {name}"


def test_indexer_kl_leaves_the_padding_document_out() -> None:
    """``padding_tokens=`` names the last document padding (pad_to_multiple's): the KL is the mean
    over the other tokens, equal to the formula on the batch without it."""
    coeff, unpadded = 0.5, (13, 17, 11)
    padded = unpadded + (3,)  # 44 tokens: the padding sits on rank 1's last rows
    per_rank = results_or_raise(pool_of(2).run(v32_tasks.cp_runs, [(padded, "spill", {"kl": coeff, "padding": True})],
                                               timeout=600))
    expected = v32_tasks.kl_reference(v32_tasks.tiny_model(), v32_tasks.packed_ids(padded)[:, :sum(unpadded)],
                                      unpadded, coeff)
    for rank, (result,) in enumerate(per_rank):
        assert result["kl"] == pytest.approx(expected, rel=1e-6), (rank, result["kl"], expected)


def test_fused_selector_selects_like_the_model() -> None:
    """sparsecp's fused CPU kernel (float32, channels permuted into its layout) picks the model's ids."""
    lengths = (13, 17, 11, 7)
    runs = [(lengths, "spill", {"selector": "fused"}), (AWKWARD, "greedy", {"selector": "fused", "block_size": 4})]
    per_rank = results_or_raise(pool_of(2).run(v32_tasks.cp_runs, runs, timeout=600))
    for index, (batch, _, _) in enumerate(runs):
        expected = oracle(batch)
        for rank, results in enumerate(per_rank):
            differences = model_tasks.compare_ids(results[index]["ids"], expected["ids"], batch, 2, rank, 1,
                                                  expected["scores"])
            assert not differences, differences[:4]


def test_float32_and_bfloat16_train() -> None:
    """float32 agrees with the float64 oracle to float32 rounding. bfloat16 flips some of the
    indexer's near ties, in the model itself too: its error against float64 is bounded by the
    unmodified bfloat16 model's own (run per document) instead."""
    lengths = (13, 17, 11, 7)
    runs = [(lengths, "spill", {"dtype": dtype, "kl": 1.0}) for dtype in (torch.float32, torch.bfloat16)]
    per_rank = results_or_raise(pool_of(2).run(v32_tasks.cp_runs, runs, timeout=600))
    expected = oracle(lengths)["logits"]
    scale = float(expected.abs().max())
    model_bf16 = v32_tasks.per_document_oracle(v32_tasks.tiny_model(torch.bfloat16), v32_tasks.packed_ids(lengths),
                                               lengths)["logits"].double()
    for index in range(2):
        errors = (torch.cat([r[index]["logits"] for r in per_rank]).double() - expected).abs()
        assert torch.isfinite(errors).all()
        if index == 0:
            assert float(errors.max()) <= 1e-5 * scale, float(errors.max())
        else:
            own = (model_bf16 - expected).abs()
            assert float(errors.mean()) <= 1.5 * float(own.mean()), (float(errors.mean()), float(own.mean()))
            assert float(errors.max()) <= 1.5 * float(own.max()), (float(errors.max()), float(own.max()))
        for name, grad in per_rank[0][index]["grads"].items():
            assert torch.isfinite(grad).all(), name


def test_guide_page_runs_on_two_ranks() -> None:
    """The python block of docs/guide/deepseek-v32.md, as written, on 2 gloo ranks."""
    import readme_snippets

    blocks = readme_snippets.code_blocks(readme_snippets.read("docs/guide/deepseek-v32.md"), "python")
    assert len(blocks) == 1
    results = results_or_raise(pool_of(2).run(v32_tasks.run_guide, blocks, timeout=300))
    for rank, result in enumerate(results):
        assert result["logits"] == (1, 512, 256), rank
        # the guide's loop: 3 steps of 2 layers, each selecting once and replaying in the recompute
        assert result["indexer_grad"] and result["replays"] == 6 and result["selections"] == 6, (rank, result)


def test_fsdp2_over_dp_x_cp_equals_every_document_alone() -> None:
    """4 gloo ranks, dp 2 x cp 2, activation checkpointing, fully_shard over the flattened mesh,
    FSDP2's default mean: two AdamW steps equal one process running every document alone, the
    loss the mean over the valid labels of both dp rows (-100 prompts, padding documents)."""
    steps, lr = 2, 1e-2
    expected = training_tasks.fsdp_oracle(steps, lr, 2, kind="v32")
    assert expected["losses"][1] != pytest.approx(expected["losses"][0], rel=1e-6), "the steps changed nothing"
    train = functools.partial(training_tasks.fsdp_train, checkpointing=True, kind="v32")
    results = results_or_raise(pool_of(4).run(train, 2, steps, 1, lr, timeout=300))
    for rank, result in enumerate(results):
        assert result["sharded"] == "DTensor", f"rank {rank}'s parameters are not FSDP2 shards"
        assert result["losses"] == pytest.approx(expected["losses"], rel=1e-8), (rank, result["losses"])
        for step, (got, want) in enumerate(zip(result["params"], expected["params"])):
            for name, value in want.items():
                gap = float((got[name] - value).abs().max())
                assert gap <= 0.1 * lr, f"rank {rank} step {step}: {name} is {gap:.3g} from the oracle"


def test_spill_calibrates_its_cost_model_on_the_layers_selector() -> None:
    """context_parallel(mode="spill") fits spill's cost model to the V3.2 selector in the first
    forward (rank 0 times it, every rank plans with the same fit) and refits it from the measured
    times of later forwards; the selection is still the model's own."""
    lengths = (13, 17, 11, 7)
    results = results_or_raise(pool_of(2).run(v32_tasks.calibrated_spill, lengths, 5, timeout=600))
    expected = oracle(lengths)
    for rank, result in enumerate(results):
        assert result["source"] == "calibrated" and result["model"] is not None, (rank, result["history"])
        assert result["model"] == results[0]["model"], "every rank must plan with the same cost model"
        # forwards 1-4's (injected) times refit the model: exactly, whatever the machine's load
        assert result["refits"] >= 1, ("the times of forwards 1-4 refit the model", result["history"])
        assert result["refit_residual"] < 1e-6, result["history"]
        assert not model_tasks.compare_ids(result["ids"], expected["ids"], lengths, 2, rank, 1,
                                           expected["scores"])
    logits = torch.cat([r["logits"] for r in results])
    assert float((logits - expected["logits"]).abs().max()) <= LOGIT_TOLERANCE * float(expected["logits"].abs().max())
