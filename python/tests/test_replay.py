"""Selection record and replay (sparsecp.torch.SelectionReplay, selection_replay_contexts):
activation recompute and RL replay return the recorded ids with no planning, no collective at
all and no selection work, bit for bit, and a replay of a different call raises naming the
difference, on every rank, at the step's one agreement (verify_replays).

The multi-rank tests run the two-layer indexer model of replay_model.py on 4 gloo ranks; the
others run the selection ops in this process."""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rank_tasks  # noqa: E402
import replay_model  # noqa: E402
from multirank import RankError, pool_of, results_or_raise  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import sparsecp.torch as sct  # noqa: E402
from sparsecp import _core  # noqa: E402

SEED = int(os.environ.get("SPARSECP_TEST_SEED", "20261201"))
SIZE = 4
LOCAL = sum(replay_model.LENGTHS) // SIZE


def test_recompute_replays_every_selection_bit_for_bit():
    """Checkpointing with replay (context_fn, reentrant + SelectionReplay, selective) makes
    the collectives and selector calls of a step those of the run without checkpointing, and
    its top-k and every parameter gradient are that run's bit for bit. Checkpointing without
    replay selects (and communicates) twice: the counts can tell."""
    seed = SEED + 301
    print(f"seed {seed}")
    pool = pool_of(SIZE)
    runs = {variant: results_or_raise(pool.run(replay_model.step, variant, seed, timeout=120))
            for variant in replay_model.VARIANTS}
    plain = runs["plain"]
    expected = {"embed.weight"} | {f"layers.{i}.{name}.weight" for i in range(2)
                                   for name in ("q_a", "q_b", "weights_proj", "key_proj", "out")}
    for rank in range(SIZE):
        counts = plain[rank]["counts"]
        # Layer 0 and layer 1 each: one agreement all-reduce before the inputs move, one before
        # the results return, and one all-to-all per dtype group each way (fp32: one group).
        assert counts["collectives"] == 8, counts
        assert counts["selector calls"] == 2 and counts["empty selector calls"] == 0, counts
        assert set(plain[rank]["grads"]) == expected, sorted(plain[rank]["grads"])
        for name, grad in plain[rank]["grads"].items():
            assert np.abs(grad).max() > 0, (name, rank)
    assert [r["counts"]["selector rows"] for r in plain] != [2 * LOCAL] * SIZE  # spill moved rows
    assert max(int((r["topk"][0] >= 0).sum(-1).max()) for r in plain) == replay_model.TOPK  # a real top-512

    twice = runs["checkpoint"]
    for rank in range(SIZE):
        assert twice[rank]["counts"]["collectives"] == 2 * plain[rank]["counts"]["collectives"]
        assert twice[rank]["counts"]["selector calls"] == 2 * plain[rank]["counts"]["selector calls"]

    for variant in ("context_fn", "reentrant", "selective"):
        for rank in range(SIZE):
            got, want = runs[variant][rank], plain[rank]
            for key in ("selector calls", "selector rows"):
                assert got["counts"][key] == want["counts"][key], (variant, rank, key, got["counts"])
            # The recompute moves nothing: no collective for any replayed call (layer 0's
            # balanced_indexer_select, layer 1's launch and launch_result), neither all-to-all
            # nor agreement; the step's verify_replays agrees on the three once.
            assert got["counts"]["collectives"] == want["counts"]["collectives"], (variant, rank, got["counts"])
            assert got["counts"]["collectives"] - got["forward counts"]["collectives"] == 0, (variant, rank)
            assert got["replayed calls"] == 3 and got["verify collectives"] == 1, (variant, rank, got)
            # The overlapped layer's recompute hands the selector zero rows (its code calls it).
            assert got["counts"]["empty selector calls"] == 1, (variant, rank, got["counts"])
            assert got["forward counts"]["collectives"] == want["counts"]["collectives"], (variant, rank)
            assert got["loss"] == want["loss"], (variant, rank)
            for layer, (a, b) in enumerate(zip(got["topk"], want["topk"])):
                assert np.array_equal(a, b), (variant, rank, layer)
            assert set(got["grads"]) == set(want["grads"]), variant
            for name, grad in want["grads"].items():
                assert np.array_equal(got["grads"][name], grad), (variant, rank, name)
    for rank in range(SIZE):  # nothing replayed: the step's agreement still makes its one all-reduce
        assert plain[rank]["replayed calls"] == twice[rank]["replayed calls"] == 0
        assert plain[rank]["verify collectives"] == twice[rank]["verify collectives"] == 1
    for rank in range(SIZE):  # without replay the recompute selects again: the same ids, the same gradients
        for name, grad in plain[rank]["grads"].items():
            assert np.array_equal(twice[rank]["grads"][name], grad), (rank, name)


def test_a_replay_of_another_call_raises_naming_the_difference():
    seed = SEED + 302
    print(f"seed {seed}")
    results = results_or_raise(pool_of(SIZE).run(replay_model.mismatched_replay, seed, timeout=120))
    lengths = replay_model.LENGTHS
    for rank, errors in enumerate(results):
        prefix = "Selection replay: call 1 (balanced_indexer_select) differs from its recording: "
        assert errors["lengths"] == prefix + f"lengths: document 0 has {lengths[0]} tokens recorded, " \
                                             f"{lengths[0] - 4} now", errors
        assert errors["ratio"] == prefix + "ratio 1 recorded, 2 now", errors
        assert errors["shape"] == prefix + f"qr shape (1, {LOCAL}, 16) recorded, (1, {LOCAL - 1}, 16) now", errors
        assert errors["group"] == prefix + (f"rank {rank} recorded, 0 now" if rank else "group size 4 recorded, 1 now")
        assert errors["entry point"] == ("Selection replay: call 1 (launch_indexer_inputs) differs from its "
                                         "recording: the recording has balanced_indexer_select here"), errors
        assert errors["past the end"] == ("Selection replay: call 2 (balanced_indexer_select) is past the end of "
                                          "the recording (1 calls recorded)"), errors
        # The failed replays made no collective; each case's verify_replays made its agreement
        # and the reason's all-reduce (6 cases): no all-to-all.
        assert errors["replayed collectives"] == "0", errors
        assert errors["collectives"] == "12", errors


def test_rl_rollout_recording_replays_in_training_with_one_agreement():
    """Recorded in a no-grad rollout, replayed after another step in the training forward and
    backward on other activations (another batch): the rollout's ids, no selector call and no
    collective; the step's verify_replays agrees once on the six replayed calls (one
    all-reduce: a mismatch on one rank raises on every rank)."""
    seed = SEED + 303
    print(f"seed {seed}")
    results = results_or_raise(pool_of(SIZE).run(replay_model.rl_replay, seed, timeout=120))
    for rank, result in enumerate(results):
        assert result["calls"] == ("balanced_indexer_select", "launch_indexer_inputs")
        assert result["nbytes"] == 2 * LOCAL * replay_model.TOPK * 4  # int32 [local, topk] per layer
        counts = result["counts"]
        assert counts["collectives"] == 0 and counts["selector calls"] == 0, counts
        assert result["verified"] == 2 * 3 and result["verify collectives"] == 1, result  # 3 calls, twice
        for layer in range(2):
            assert np.array_equal(result["training"][layer], result["rollout"][layer]), (rank, layer)
            assert np.array_equal(result["again"][layer], result["rollout"][layer]), (rank, layer)
    # The other batch selects other ids (rows that see more than top-k keys): the replay did not select.
    assert any(not np.array_equal(r["other"][layer], r["rollout"][layer]) for r in results for layer in range(2))


@pytest.mark.parametrize("early_stop", [True, False])
def test_rl_replay_under_checkpoint_early_stop_keeps_the_rollout_ids(early_stop):
    """Issue 30 item 2: with torch's default checkpoint early stop, the overlapped layer's
    recompute ended between its launch and launch_result, a process-wide window count stayed
    at 1, and the layer recomputed next selected anew on the training activations instead of
    replaying the rollout's ids (its gradients differed)."""
    seed = SEED + 309
    print(f"seed {seed}")
    results = results_or_raise(pool_of(2).run(replay_model.early_stop_rl, seed, early_stop, timeout=120))
    for rank, result in enumerate(results):
        assert result["calls"] == ("select_indices", "launch_indexer_inputs")
        for layer in range(2):
            assert np.array_equal(result["training ids"][layer], result["rollout ids"][layer]), (rank, layer)
        assert set(result["grads"]) == set(result["reference"])
        for name, grad in result["reference"].items():
            assert np.array_equal(result["grads"][name], grad), (rank, name)
    # The training batch chooses other ids: a recompute that selected anew would be seen.
    assert any(not np.array_equal(r["fresh ids"][0], r["rollout ids"][0]) for r in results)


@pytest.mark.parametrize("case", ["lengths", "mode", "past the end", "routes", "topk"])
def test_a_replay_mismatch_on_one_rank_raises_on_every_rank(case):
    """Issue 30 item 3: a replayed call made no collective, so one that differed on one rank
    raised there alone and the others blocked in their next collective until the group's
    timeout. Now the failed call is held on its rank (it returns all -1 ids and keeps the rank
    in step) and the step's verify_replays (one all-reduce) raises on every rank, the odd rank
    its own error, the others naming it and its reason."""
    seed = SEED + 310
    print(f"seed {seed}")
    pool = pool_of(SIZE)
    errors = pool.run(replay_model.one_rank_replay_mismatch, seed, case, timeout=60)
    odd = SIZE - 1
    assert all(error is not None and not isinstance(error, RankError) for error in errors), errors
    own = errors[odd]
    expected = {"lengths": "differs from its recording: lengths: document 0",
                "mode": "differs from its recording: mode spill recorded, greedy now",
                "past the end": "is past the end of the recording (1 calls recorded)",
                "routes": "prebuilt for other inputs",
                "topk": f"the selector's topk {replay_model.TOPK // 2} differs from the recording's "
                        f"{replay_model.TOPK}"}[case]
    assert expected in own[1], own
    for rank in range(odd):
        assert errors[rank][0] == "ValueError", errors[rank]
        assert errors[rank][1].startswith(f"Selection replay aborted: rank {odd} rejected its inputs: "), errors[rank]
        assert expected in errors[rank][1], errors[rank]
    assert all(results_or_raise(pool.run(rank_tasks.still_works)))


@pytest.mark.parametrize("then", ["verify", "call"])
def test_a_replay_past_the_end_against_a_peer_s_real_call_raises_on_both_ranks(then):
    """Issue 35 item 7: one rank replays past the end of its recording while its peer has left
    the replay and makes a real call. The ranks took different branches of the agreement (one
    all-reduced the 512-value reason, the other the fingerprint's components) and gloo aborted
    the process. Now the replayed call makes no collective and is held; the last rank's next
    agreement (its verify_replays, or a real call of its own) pairs with the peer's real call's,
    and both take the branch the reduced verdict names: both raise, and the group works on."""
    pool = pool_of(2)
    results = results_or_raise(pool.run(replay_model.past_the_end_against_a_real_call, SEED + 312, then, timeout=60))
    past = "Selection replay: call 2 (balanced_indexer_select) is past the end of the recording (1 calls recorded)"
    assert results[1]["error"] == ("RuntimeError", past), results[1]
    assert results[1]["replay collectives"] == 0 and results[1]["stand-in"] == ((1, LOCAL * 2, replay_model.TOPK), -1)
    assert results[0]["error"] == ("ValueError", f"Indexer input exchange aborted: rank 1 rejected its inputs: "
                                                 f"RuntimeError: {past}"), results[0]
    assert all(result["after equal"] for result in results)
    assert all(results_or_raise(pool.run(rank_tasks.still_works)))


@pytest.mark.parametrize("case", ["flags", "points", "replays"])
def test_every_rank_takes_the_agreement_branch_the_reduced_verdict_names(case):
    """The agreement decides every branch from values all ranks reduced: a rank reporting
    invalid ranks first (a failed selector, a replay) paired with one comparing fingerprints
    first, ranks at different agreement points, ranks whose replays differ: each raises on
    both ranks, and nothing aborts."""
    pool = pool_of(2)
    errors = results_or_raise(pool.run(replay_model.agreement_branches, case, timeout=60))
    if case == "flags":
        assert errors == ["rank 0's own failure",
                          "Indexer input exchange aborted: rank 0 rejected its inputs: rank 0's own failure"], errors
    elif case == "points":
        for rank, error in enumerate(errors):
            at = "Indexer result exchange" if rank == 0 else "Indexer input exchange"
            assert error.startswith(f"{at}: the CP ranks are at different sparsecp collectives (this rank at {at}; "
                                    "the ranks' points include "), error
            assert "Indexer result exchange" in error.split("include")[1], error
            assert "Indexer input exchange" in error.split("include")[1], error
    else:
        for rank, error in enumerate(errors):
            assert error.startswith("Selection replay: the CP ranks replayed different selection calls since their "
                                    f"last agreement (0 to 1 replayed calls; this rank {1 - rank})"), error
    assert all(results_or_raise(pool.run(rank_tasks.still_works)))


def test_an_exception_between_launch_and_launch_result_leaves_later_calls_recorded():
    """Issue 30 item 2: an exception caught between an overlapped launch and its launch_result
    inside an outer record() left a window open: later calls were neither recorded nor
    replayed. The window belongs to the dropped handle now."""
    results = results_or_raise(pool_of(2).run(replay_model.exception_inside_a_recording, SEED + 311, timeout=60))
    for calls in results:
        assert calls == ("launch_indexer_inputs", "select_indices"), calls


def test_overlapped_handles_in_a_recording_and_a_replay():
    seed = SEED + 304
    print(f"seed {seed}")
    results = results_or_raise(pool_of(SIZE).run(replay_model.handle_semantics, seed, timeout=120))
    twice_inputs = "Indexer input exchange cannot be consumed twice"
    twice_rows = "Indexer communication handle cannot be consumed twice"
    for rank, out in enumerate(results):
        assert out["worker rows"] > 0 and not out["recorded replayed"] and out["replayed"]
        for key in ("recorded twice", "replayed twice", "plain twice"):
            assert out[key] == twice_inputs, (rank, key, out[key])
        for key in ("recorded pending twice", "replayed pending twice", "plain pending twice"):
            assert out[key] == twice_rows, (rank, key, out[key])
        assert out["plain type"] == "IndexerInputExchange"
        assert out["replayed worker shapes"] == [(1, 0, 16), (1, 0, 2), (1, 0, 4), (1, 0, 4)]
        assert out["replayed route"] == (0, 0, (0,) * SIZE)
        assert out["replayed selected"] == (0, replay_model.TOPK)
        assert out["non-empty result"].startswith("Selection replay: a replayed exchange's worker has no rows")
        assert out["recorded ids"].shape == (LOCAL, replay_model.TOPK)
        for key in ("replayed ids", "skipped ids", "plain ids"):
            assert np.array_equal(out[key], out["recorded ids"]), (rank, key)


# --------------------------------------------------------------------------------------
# In one process: select_indices and packed_indexer_select.

def _selection_inputs(rows: int = 40, keys: int = 30, topk: int = 8, seed: int = SEED):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(rows, 2, 16, generator=generator)
    key = torch.randn(keys, 16, generator=generator)
    weights = torch.rand(rows, 2, generator=generator)
    segments = ((0, 25, 0, 12, 1), (25, rows, 12, 30, 1))  # documents of 25 and 37 tokens
    return query, key, weights, segments, 2, topk


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the C++ selection kernel's calls."""
    calls = []
    select_topk = _core.select_topk
    monkeypatch.setattr(_core, "select_topk", lambda *args: (calls.append(1), select_topk(*args))[1])
    return calls


def test_select_indices_replays_without_selecting(kernel_calls):
    print(f"seed {SEED}")
    query, key, weights, segments, ratio, topk = _selection_inputs()
    replay = sct.SelectionReplay()
    assert not replay.recorded
    with replay.record():
        recorded = sct.select_indices(query, key, weights, segments, ratio, topk)
    assert replay.recorded and len(replay) == 1 and len(kernel_calls) == 1
    assert replay.nbytes == query.shape[0] * topk * 4
    recorded_copy = recorded.clone()
    recorded.fill_(-5)  # the caller's tensor: the recording holds its own copy
    with replay.replay():  # other values, same call: the recording's ids (RL keeps the rollout's choice)
        replayed = sct.select_indices(query + 1, key, weights, segments, ratio, topk)
    assert len(kernel_calls) == 1 and torch.equal(replayed, recorded_copy)
    assert torch.equal(replayed, sct.select_indices(query, key, weights, segments, ratio, topk))  # no session
    assert len(kernel_calls) == 2
    replayed.fill_(-6)
    with replay.replay():  # entered again: from the first call, unchanged by the caller's edits
        assert torch.equal(sct.select_indices(query, key, weights, segments, ratio, topk), recorded_copy)


def test_a_recorded_call_records_once_with_its_inner_calls(monkeypatch):
    monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")  # packed_indexer_select then calls select_indices
    query, key, weights, segments, ratio, topk = _selection_inputs()
    replay = sct.SelectionReplay()
    with replay.record():
        recorded = sct.packed_indexer_select(query[None], key[None], weights[None], segments, ratio, topk)
    assert replay.calls() == ("packed_indexer_select",)
    with replay.replay():
        assert torch.equal(sct.packed_indexer_select(query[None], key[None], weights[None], segments, ratio, topk),
                           recorded)


def test_replay_errors_name_the_difference():
    query, key, weights, segments, ratio, topk = _selection_inputs()
    replay = sct.SelectionReplay()
    with pytest.raises(RuntimeError, match=r"replay\(\): nothing was recorded"):
        with replay.replay():
            pass
    with replay.record():
        sct.select_indices(query, key, weights, segments, ratio, topk)
    prefix = r"Selection replay: call 1 \(select_indices\) differs from its recording: "
    cases = [
        ((query, key, weights, segments, ratio, topk * 2), "topk 8 recorded, 16 now"),
        ((query, key, weights, ((0, 25, 0, 12, 1), (25, 40, 12, 30, 0)), ratio, topk),
         r"segments: segment 1 \(25, 40, 12, 30, 1\) recorded, \(25, 40, 12, 30, 0\) now"),
        ((query, key, weights, segments[:1], ratio, topk), "segments: 2 recorded, 1 now"),
        ((query, key[:29], weights, segments, ratio, topk), r"key shape \(30, 16\) recorded, \(29, 16\) now"),
        ((query.bfloat16(), key, weights, segments, ratio, topk),
         "query dtype torch.float32 recorded, torch.bfloat16 now"),
    ]
    for args, text in cases:
        with pytest.raises(ValueError, match=prefix + text):
            with replay.replay():
                sct.select_indices(*args)
    with pytest.raises(ValueError, match=r"call 1 \(packed_indexer_select\) differs from its recording: the "
                                         r"recording has select_indices here"):
        with replay.replay():
            sct.packed_indexer_select(query[None], key[None], weights[None], segments, ratio, topk)
    with pytest.raises(RuntimeError, match=r"call 2 \(select_indices\) is past the end of the recording "
                                           r"\(1 calls recorded\)"):
        with replay.replay():
            sct.select_indices(query, key, weights, segments, ratio, topk)
            sct.select_indices(query, key, weights, segments, ratio, topk)
    with pytest.raises(RuntimeError, match="already recording or replaying"):
        with replay.replay(), replay.record():
            pass


def test_a_failed_recording_is_not_replayable():
    query, key, weights, segments, ratio, topk = _selection_inputs()
    replay = sct.SelectionReplay()
    with pytest.raises(ValueError, match="topk"):
        with replay.record():
            sct.select_indices(query, key, weights, segments, ratio, 0)
    assert not replay.recorded
    with pytest.raises(RuntimeError, match="nothing was recorded"):
        with replay.replay():
            pass


def test_a_recording_inside_a_replay_records_what_the_replay_returns(kernel_calls):
    """RL replay around a checkpointed region: the region's recording takes the outer replay's
    ids, and its own replay (the recompute) returns them."""
    query, key, weights, segments, ratio, topk = _selection_inputs()
    rollout, region = sct.SelectionReplay(), sct.SelectionReplay()
    with rollout.record():
        recorded = sct.select_indices(query, key, weights, segments, ratio, topk)
    with rollout.replay():
        with region.record():
            inner = sct.select_indices(query * 2, key, weights, segments, ratio, topk)
        with region.replay():
            again = sct.select_indices(query * 3, key, weights, segments, ratio, topk)
    assert len(kernel_calls) == 1 and torch.equal(inner, recorded) and torch.equal(again, recorded)


def test_checkpoint_context_fn_in_one_process(kernel_calls):
    """checkpoint(use_reentrant=False, context_fn=selection_replay_contexts) around a function
    whose ids gather a differentiable tensor: the kernel runs once, the gradient is the
    un-checkpointed one."""
    query, key, weights, segments, ratio, topk = _selection_inputs()
    values = torch.randn(key.shape[0], 3, requires_grad=True)

    def region(values: torch.Tensor) -> torch.Tensor:
        ids = sct.select_indices(query, key, weights, segments, ratio, topk).long()
        picked = values[ids.clamp_min(0)] * (ids >= 0)[..., None]
        return picked.sin().sum()

    region(values).backward()
    want = values.grad.clone()
    values.grad = None
    kernel_calls.clear()
    checkpoint(region, values, use_reentrant=False, context_fn=sct.selection_replay_contexts).backward()
    assert len(kernel_calls) == 1 and torch.equal(values.grad, want)
    forward, recompute = sct.selection_replay_contexts()
    assert hasattr(forward, "__enter__") and hasattr(recompute, "__exit__")


def test_training_step_example_with_checkpointing():
    """python/examples/train_indexer_step.py's --checkpoint: the step under activation
    checkpointing, with and without replay, gives the un-checkpointed step's ids, loss and
    gradients bit for bit (4 gloo ranks, spill)."""
    import rank_tasks

    seed = SEED + 305
    print(f"seed {seed}")
    config = dict(lengths=(2900, 300, 700, 45, 151), hidden=32, q_lora_rank=16, heads=2, head_dim=32, rope_dim=16,
                  att_heads=2, att_dim=16)
    pool = pool_of(SIZE)
    runs = {mode: results_or_raise(pool.run(rank_tasks.train_indexer_step, mode, seed, config, timeout=120))
            for mode in ("spill", "spill+plain", "spill+replay")}
    for mode in ("spill+plain", "spill+replay"):
        for got, want in zip(runs[mode], runs["spill"]):
            assert got["loss"] == want["loss"] and np.array_equal(got["topk"], want["topk"]), mode
            assert got["rows_selected"] == want["rows_selected"], mode
            for name, grad in want["grads"].items():
                assert np.array_equal(got["grads"][name], grad), (mode, name)


def test_invalid_inputs_inside_a_recording_fail_on_every_rank():
    seed = SEED + 306
    print(f"seed {seed}")
    results = results_or_raise(pool_of(SIZE).run(replay_model.invalid_while_recording, seed, timeout=60))
    for rank, error in enumerate(results):
        assert error.startswith("ValueError: ") and error.endswith("; recorded False"), (rank, error)
        assert "lengths" in error or "rank 1" in error, (rank, error)


def test_check_inputs_tells_layers_sharing_one_replay_apart(kernel_calls):
    """Two layers with identical calls share one SelectionReplay and recompute in reverse
    order (reentrant checkpointing): without check_inputs layer 1 silently gets layer 0's
    ids; with it the swapped replay raises naming the input, and the in-order one replays."""
    query, key, weights, segments, ratio, topk = _selection_inputs()
    layers = (query, query.flip(0) * 2)  # same shapes, other values: another layer's Q
    for check in (False, True):
        replay = sct.SelectionReplay(check_inputs=check)
        with replay.record():
            recorded = [sct.select_indices(q, key, weights, segments, ratio, topk) for q in layers]
        assert not torch.equal(recorded[0], recorded[1])
        with replay.replay():
            if not check:  # the known gap: the first replayed call takes the first recording
                assert torch.equal(sct.select_indices(layers[1], key, weights, segments, ratio, topk), recorded[0])
                continue
            with pytest.raises(ValueError, match=r"call 1 \(select_indices\) differs from its recording: its query "
                                                 r"values differ .*one SelectionReplay per recomputed layer"):
                sct.select_indices(layers[1], key, weights, segments, ratio, topk)
        with replay.replay():
            replayed = [sct.select_indices(q.clone(), key, weights, segments, ratio, topk) for q in layers]
        assert all(torch.equal(a, b) for a, b in zip(replayed, recorded))
    assert len(kernel_calls) == 4  # two recordings of two calls; no replay selected
    unchecked = sct.SelectionReplay()
    with unchecked.record():
        sct.select_indices(query, key, weights, segments, ratio, topk)
    unchecked.check_inputs = True
    with pytest.raises(ValueError, match="recorded without check_inputs"), unchecked.replay():
        sct.select_indices(query, key, weights, segments, ratio, topk)


def test_a_compiled_function_replays_each_recording_not_a_traced_one():
    """torch.compile around a selection call: each replay returns its own recording's ids
    (no stale ids baked into a compiled graph), and outside a session it selects."""
    query, key, weights, segments, ratio, topk = _selection_inputs()

    def layer(q):
        return sct.select_indices(q, key, weights, segments, ratio, topk) + 0

    first, second = sct.SelectionReplay(), sct.SelectionReplay()
    with first.record():
        recorded_first = layer(query)
    with second.record():
        recorded_second = layer(-query)
    assert not torch.equal(recorded_first, recorded_second)
    compiled = torch.compile(layer, backend="eager")
    with first.replay():
        assert torch.equal(compiled(query), recorded_first)
    with second.replay():
        assert torch.equal(compiled(query), recorded_second)
    assert torch.equal(compiled(query * 2), layer(query * 2))  # no session: selects
