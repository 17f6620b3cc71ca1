"""The DeepSeek-V4 layer at length: bounded-memory attention and selection, only the bank rows a
rank can see, no host sync per layer, replay records that die with their backward.

The pieces are checked against plain references on random awkward inputs (each prints its seed),
and the model paths on 2 gloo ranks against the per-document oracle (test_deepseek_v4.py's)."""
from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from sparsecp.models._cp.rows import merge_intervals, plan_row_gather
from sparsecp.torch._attention_chunked import attention_chunk_rows, sparse_attention


def _seed() -> int:
    seed = random.SystemRandom().randrange(1 << 31)
    print(f"seed {seed}")
    return seed


def test_row_gather_plans_agree_with_each_rank_reading_its_rows_directly() -> None:
    """Every rank's plan, simulated as the all-to-all would run it, gives each rank exactly the
    rows of its intervals in ascending order, and its backward sums every read into its owner."""
    seed = _seed()
    rng = random.Random(seed)
    for _ in range(200):
        size = rng.choice([1, 2, 3, 5])
        cuts = sorted(rng.randrange(0, 40) for _ in range(size - 1))
        owners = [0, *cuts, rng.randrange(cuts[-1] if cuts else 0, 45)]
        total = owners[-1]
        needs = [[(b, min(total, b + rng.randrange(0, 12))) for b in (rng.randrange(0, total + 1)
                                                                     for _ in range(rng.randrange(0, 4)))]
                 for _ in range(size)]
        plans = [plan_row_gather(needs, owners, r) for r in range(size)]
        data = torch.arange(total, dtype=torch.float64) * 10 + 1
        grads_back = torch.zeros(total, dtype=torch.float64)
        for r, plan in enumerate(plans):
            want = [row for b, e in merge_intervals(needs[r]) for row in range(b, e)]
            out = torch.full((plan.rows,), -1.0, dtype=torch.float64)
            local = data[owners[r]:owners[r + 1]]
            out[torch.from_numpy(plan.keep_positions)] = local[torch.from_numpy(plan.keep_index)]
            offset = 0
            for q in range(size):  # rank q's send buffer, its part for r
                sent = plans[q].send_index[sum(plans[q].send_splits[:r]):sum(plans[q].send_splits[:r + 1])]
                rows = data[owners[q]:owners[q + 1]][torch.from_numpy(sent)]
                count = plan.receive_splits[q]
                assert len(rows) == count, (seed, r, q)
                out[torch.from_numpy(plan.receive_positions[offset:offset + count])] = rows
                offset += count
            assert out.tolist() == [row * 10 + 1.0 for row in want], (seed, needs, owners, r)
            for row in want:
                assert plan.locate(row) == want.index(row)
            grads_back[torch.tensor(want, dtype=torch.long)] += 1
        assert all(plan.exchange == plans[0].exchange for plan in plans), seed


def _dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, s: torch.Tensor | None,
                     index: torch.Tensor, valid: torch.Tensor, scale: float) -> torch.Tensor:
    """The model's eager math: gather, mask, softmax with the sink column appended then dropped."""
    shared = k.ndim == 2
    gathered, values = k[index], (k if v is None else v)[index]
    logits = torch.einsum("hld,lcd->hlc" if shared else "hld,lchd->hlc", q, gathered) * scale
    logits = logits.masked_fill(~valid[None], float("-inf"))
    if s is not None:
        sink = s[:, None, None].expand(-1, q.shape[1], 1)
        probs = torch.softmax(torch.cat([logits, sink], -1), -1)[..., :-1]
    else:
        probs = torch.nan_to_num(torch.softmax(logits, -1))
    return torch.einsum("hlc,lcd->hld" if shared else "hlc,lchd->hld", probs, values)


def _columns_of(index: torch.Tensor, valid: torch.Tensor) -> Any:
    return lambda start, stop: (index[start:stop], valid[start:stop])


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("sinks", [True, False])
def test_sparse_attention_equals_the_dense_masked_softmax(shared: bool, sinks: bool) -> None:
    """Forward and every gradient against the model's eager math, for chunks of 1 row, a prime,
    and all rows; a row that sees nothing outputs zeros (or, with a sink, only the sink's mass)."""
    seed = _seed()
    generator = torch.Generator().manual_seed(seed)
    for heads, rows, dim, keys, columns in ((3, 7, 5, 11, 4), (1, 1, 2, 1, 1), (2, 13, 3, 5, 7)):
        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()

        q = randn(heads, rows, dim)
        k = randn(keys, dim) if shared else randn(keys, heads, dim)
        v = None if shared else randn(keys, heads, dim)
        s = randn(heads) if sinks else None
        index = torch.randint(0, keys, (rows, columns), generator=generator)
        valid = torch.rand(rows, columns, generator=generator) > 0.3
        valid[0] = False
        inputs = [t for t in (q, k, v, s) if t is not None]
        grad = torch.randn(heads, rows, dim, generator=generator, dtype=torch.float64)
        want = _dense_attention(q, k, v, s, index, valid, 0.7)
        want_grads = torch.autograd.grad(want, inputs, grad)
        for chunk in (1, 3, rows):
            got = sparse_attention(q, k, _columns_of(index, valid), scale=0.7, values=v, sinks=s, chunk_rows=chunk)
            assert torch.allclose(got, want, atol=1e-12, rtol=0), (seed, chunk)
            assert bool(torch.all(got[:, 0] == 0)), (seed, chunk)  # row 0 sees no key: zero output
            for name, a, b in zip("qkvs", torch.autograd.grad(got, inputs, grad), want_grads):
                assert torch.allclose(a, b, atol=1e-10, rtol=0), (seed, chunk, name, float((a - b).abs().max()))


def test_the_selector_picks_its_merge_columns_alike_on_cpu_and_device_paths() -> None:
    """The running top-k's column pick: nonzero on a CPU, a stable argsort (no host sync) on a
    device; both give each row's chosen columns in ascending order."""
    from sparsecp.models._cp.topk import chosen_columns

    seed = _seed()
    generator = torch.Generator().manual_seed(seed)
    for rows, columns, count in ((1, 1, 1), (3, 17, 5), (7, 64, 13)):
        keys = torch.rand(rows, columns, generator=generator).argsort(dim=1)
        chosen = keys < count  # exactly count per row
        host, device = chosen_columns(chosen, count, False), chosen_columns(chosen, count, True)
        assert torch.equal(host, device), seed
        assert torch.equal(chosen.gather(1, host), torch.ones_like(host, dtype=torch.bool)), seed
        assert bool((host.diff(dim=1) > 0).all()), seed


def test_the_running_top_k_equals_one_stable_sort_of_every_key() -> None:
    """Merging key chunks with ``merge_top`` keeps what one stable descending sort of all the keys
    keeps (ties to the lower id, NaN above every number, -inf masked keys last), for chunk sizes
    1, a prime and all, on scores with many ties."""
    from sparsecp.models._cp.topk import merge_top

    seed = _seed()
    generator = torch.Generator().manual_seed(seed)
    for rows, keys, topk in ((1, 1, 1), (4, 29, 5), (3, 64, 64), (5, 100, 7)):
        scores = torch.randint(0, 6, (rows, keys), generator=generator).float()
        scores[torch.rand(rows, keys, generator=generator) < 0.1] = float("-inf")
        scores[torch.rand(rows, keys, generator=generator) < 0.05] = float("nan")
        want = torch.sort(torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :topk], dim=1).values
        for chunk in (1, 7, keys):
            best_scores = best_ids = None
            for k0 in range(0, keys, chunk):
                part, ids = scores[:, k0:k0 + chunk], torch.arange(k0, min(keys, k0 + chunk))[None].expand(rows, -1)
                if best_scores is not None and best_ids is not None:
                    part, ids = torch.cat([best_scores, part], dim=1), torch.cat([best_ids, ids], dim=1)
                best_scores, best_ids = merge_top(part, ids, topk)
            assert best_ids is not None and torch.equal(best_ids, want), (seed, rows, keys, topk, chunk)


def test_device_tables_follow_the_cost_model_and_stay_bounded() -> None:
    """A batch layout's device tables are keyed by spill's cost model by value (a refit plans
    new routes; an equal model made apart reuses them), and at most a few are kept however
    many refits a repeated batch sees."""
    from sparsecp import CostModel
    from sparsecp.models._cp.state import plan_key
    from sparsecp.models.deepseek_v4._layout import _DEVICE_KEPT, BatchLayout
    from sparsecp.torch import indexer_route

    lengths = (13, 17, 11, 7)
    layout = BatchLayout(lengths, 1, 0, 6, ((4, True),))

    def tables(model: Any) -> Any:
        def selection(ratio: int) -> list[Any]:
            return [indexer_route(lengths, 1, 0, ratio, "spill", cost_model=model)]
        return layout.on(torch.device("cpu"), selection, False, plan_key(model))

    first = tables(CostModel.linear(1.0, 2.0, 0.0, 3))
    assert tables(CostModel.linear(1.0, 2.0, 0.0, 3)) is first  # equal by value: reused
    assert tables(CostModel.linear(1.0, 3.0, 0.0, 3)) is not first
    for b in range(10):
        tables(CostModel.linear(1.0, 4.0 + b, 0.0, 3))
    assert len(layout._device) == _DEVICE_KEPT


def test_attention_chunks_fit_their_budget() -> None:
    assert attention_chunk_rows(256, 64, 512, 512, 2, budget=64 << 20) >= 1
    per_row = 256 * (2 * 1024 * 2 + 3 * 64 * 4)
    assert attention_chunk_rows(256, 64, 512, 512, 2, budget=64 << 20) == (64 << 20) // per_row
    assert attention_chunk_rows(10**9, 64, 512, 512, 2, budget=1) == 1
    with pytest.raises(ValueError, match="chunk_rows must be positive, got 0"):
        sparse_attention(torch.zeros(1, 1, 1), torch.zeros(1, 1), lambda a, b: (None, None), scale=1.0,
                         chunk_rows=0)


pytest.importorskip("transformers.models.deepseek_v4", reason="transformers >= 5.8 (DeepseekV4) not installed")

import v4_bounded_tasks  # noqa: E402
import v4_tasks  # noqa: E402
from multirank import pool_of, results_or_raise  # noqa: E402
from test_deepseek_v4 import assert_matches_oracle  # noqa: E402


def test_the_smallest_chunks_equal_the_model_run_per_document() -> None:
    """One attention row per chunk, two selector rows per chunk and key chunks of top-k keys (so
    every running top-k merge runs), with activation checkpointing, on 2 ranks; with the KL, its
    value and the indexer's gradients equal the default chunks' run."""
    lengths = (1, 2, 30, 5, 2, 8)
    runs = [(lengths, mode, {"tiny_chunks": True, **options}) for mode, options in
            (("spill", {}), ("hybrid", {"block_size": 4, "zigzag_min_length": 16}),
             ("spill", {"checkpointing": True}))]
    runs += [(lengths, "spill", {"kl": 0.5}),
             (lengths, "spill", {"kl": 0.5, "tiny_chunks": True, "checkpointing": True})]
    per_rank = results_or_raise(pool_of(2).run(v4_tasks.cp_runs, runs, timeout=600))
    for index, (_, mode, options) in enumerate(runs[:3]):
        assert_matches_oracle([rank_results[index] for rank_results in per_rank], lengths, 2,
                              f"tiny chunks, {mode} {options}")
    for rank, results in enumerate(per_rank):
        default, tiny = results[3], results[4]
        assert tiny["kl"] == pytest.approx(default["kl"], rel=1e-12) and default["kl"] > 0
        for name, grad in default["grads"].items():
            scale = max(float(grad.abs().max()), 1e-12)
            assert float((tiny["grads"][name] - grad).abs().max()) <= 1e-9 * scale, (rank, name)


def test_a_forward_syncs_the_host_a_fixed_number_of_times_whatever_its_layer_count() -> None:
    """The forward's one agreement (one read of its checks, one all-gather of verdicts); every
    layer after it runs with no host read, in the forward, the recompute and the backward."""
    per_rank = {layers: results_or_raise(pool_of(2).run(v4_bounded_tasks.host_syncs, layers, True, timeout=300))
                for layers in (4, 8)}
    for layers, results in per_rank.items():
        for rank, counts in enumerate(results):
            assert sum(counts["backward"].values()) == 0, (layers, rank, counts["backward"])
            assert sum(counts["forward"].values()) == 2, (layers, rank, counts["forward"])
            kinds = sorted(site.split()[-1] for site in counts["forward"])
            assert kinds == ["all_gather_object", "tolist"], (layers, rank, counts["forward"])


def test_deepseek_v32_syncs_the_host_as_often_whatever_its_layer_count() -> None:
    """The same machinery under DeepSeek-V3.2: 2 host syncs per forward, none in the backward, at
    3 and 6 layers."""
    pytest.importorskip("transformers.models.deepseek_v32", reason="transformers without DeepseekV32")
    for layers in (3, 6):
        for rank, counts in enumerate(results_or_raise(pool_of(2).run(v4_bounded_tasks.v32_host_syncs, layers,
                                                                       timeout=300))):
            assert sum(counts["backward"].values()) == 0, (layers, rank, counts["backward"])
            kinds = sorted(site.split()[-1] for site in counts["forward"])
            assert kinds == ["all_gather_object", "tolist"], (layers, rank, counts["forward"])


def test_replay_records_die_with_their_backward() -> None:
    """Checkpointed training steps with the KL, each followed by an evaluation forward: no forward
    context outlives its backward, and memory after 30 steps equals memory after 2."""
    results = results_or_raise(pool_of(2).run(v4_bounded_tasks.records_after_steps, (2, 30), timeout=300))
    for rank, seen in enumerate(results):
        assert seen["contexts"] == {2: 0, 30: 0}, (rank, seen)
        assert seen["tensors"][30] == seen["tensors"][2], (rank, seen)


@pytest.mark.parametrize("model_name", ["v4", "v32"])
def test_a_kl_never_backpropagated_does_not_keep_its_forward(model_name: str) -> None:
    """Issue 43, item 13: checkpointed forwards with the KL on whose KL is never backpropagated
    (logged, not asked for, an evaluation pass with gradients) are freed once their outputs are
    deleted: at most the last forward stays, held by the state's KL, and gc sees no more tensors
    after 6 forwards than after 3. The KL losses held their context through the checkpoint's
    recompute closure, a cycle through the autograd graph that gc never freed."""
    results = results_or_raise(pool_of(2).run(v4_bounded_tasks.unbackpropagated_kl, model_name, timeout=300))
    for rank, result in enumerate(results):
        seen = result["seen"]
        assert len(result["logged"]) == 2 and all(value > 0 for value in result["logged"]), (rank, result)
        for step, live in enumerate(seen[:-1]):
            # a checkpointed (training) forward's KL holds its context through the recompute;
            # an evaluation pass runs no checkpoint, and its KL holds no context
            expected = [] if step % 3 == 2 else [step]
            assert live["alive"] == expected and live["contexts"] == len(expected), (rank, step, live)
        assert seen[-1]["alive"] == [] and seen[-1]["contexts"] == 0, (rank, seen[-1])
        tensors = [live["tensors"] for live in seen]
        assert tensors[3:6] == tensors[0:3], (rank, tensors)  # the second round of 3 holds no more


def test_a_rank_gathers_only_the_index_k_rows_its_selections_can_see() -> None:
    """Many documents on 4 ranks: each rank's Index K gather is the union of its segments' key
    ranges, a fraction of the whole bank (which every rank used to all-gather)."""
    lengths = (40, 3, 9, 20, 1, 31, 12, 4)
    results = results_or_raise(pool_of(4).run(v4_bounded_tasks.index_bank_rows, lengths, "spill", timeout=300))
    for rank, rows in enumerate(results):
        assert rows["gathered"] <= rows["segments_rows"], (rank, rows)
        assert rows["gathered"] < rows["whole"], (rank, rows)
