"""sparsecp's engine on a model that is not transformers' (``tiny_dsa.TinyDSA`` through its own
``TinyDSAAdapter``), exact against its per-document run; and every adapter applied visibly and
undone completely (``undo_context_parallel``).

Tolerances: float64 throughout; the CP attention (sparsecp's kernel over each row's selected keys)
sums in another order than the per-document run's dense masked softmax: logits within 1e-10 of the
largest, gradients within 1e-9 of their tensor's largest entry.
"""
from __future__ import annotations

import functools

import adapter_tasks
import pytest
import torch
from multirank import pool_of, results_or_raise

LENGTHS = (1, 2, 17, 5, 3, 12)  # a one-token document, documents shorter than the top-k (3), one across ranks


@functools.cache
def oracle(lengths: tuple[int, ...]) -> dict:
    return adapter_tasks.per_document(adapter_tasks.tiny_model(), adapter_tasks.packed_ids(lengths), lengths)


def assert_exact(results: list[dict], lengths: tuple[int, ...], what: str) -> None:
    expected = oracle(lengths)
    logits = torch.cat([r["logits"] for r in results])
    scale = float(expected["logits"].abs().max())
    assert float((logits - expected["logits"]).abs().max()) <= 1e-10 * scale, what
    for name, want in expected["grads"].items():
        for rank, result in enumerate(results):
            bound = 1e-9 * max(float(want.abs().max()), 1e-12)
            error = float((result["grads"][name] - want).abs().max())
            assert error <= bound, f"{what}: rank {rank} gradient of {name} differs by {error:.3g}"


def test_the_oracle_selects() -> None:
    """Rows of the 17-token document keep 3 of up to 17 keys, not merely the nearest ones."""
    model = adapter_tasks.tiny_model()
    x = model.embed(adapter_tasks.packed_ids((17,)))
    attention = model.blocks[0].attn
    scores = attention.index_scores(attention.index_q(x)[0].view(17, 4, 6), attention.index_k(x)[0],
                                    attention.index_w(x)[0])
    chosen = torch.sort(scores.masked_fill(~torch.ones(17, 17, dtype=torch.bool).tril(), float("-inf")), dim=1,
                        descending=True, stable=True).indices[:, :3]
    assert sum(int(i) < t - 2 for t in range(3, 17) for i in chosen[t]) > 5


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("mode", ["none", "zigzag", "spill"])
def test_a_third_adapter_equals_its_per_document_run(size: int, mode: str) -> None:
    results = results_or_raise(pool_of(size).run(adapter_tasks.cp_run, LENGTHS, mode, timeout=300))
    assert_exact(results, LENGTHS, f"{size} ranks, {mode}")
    assert all(r["selections"] == 2 for r in results), "one balanced selection per layer"


def test_a_third_adapter_replays_under_checkpointing() -> None:
    results = results_or_raise(pool_of(2).run(functools.partial(adapter_tasks.cp_run, checkpointing=True),
                                              LENGTHS, "spill", timeout=300))
    assert all(r["replays"] == 2 and r["selections"] == 2 for r in results)
    assert_exact(results, LENGTHS, "checkpointing")


@pytest.mark.parametrize("which", ["tiny", "v4", "v32"])
def test_print_shows_every_cp_module_and_undo_gives_back_the_original(which: str) -> None:
    pytest.importorskip("transformers.models.deepseek_v32", reason="transformers >= 5.23 not installed")
    for result in results_or_raise(pool_of(2).run(adapter_tasks.undo_leaves_the_original, which, timeout=300)):
        layers = 2 if which == "tiny" else 3 if which == "v32" else 4
        names = {"tiny": "DSAAttention", "v4": "DeepseekV4Attention", "v32": "DeepseekV32Attention"}
        assert result["swapped"] == [f"ContextParallel{names[which]}"] * layers, result["swapped"]
        assert f"ContextParallel{names[which]}(\n" in result["printed"], result["printed"]
        assert "context_parallel(ranks=2, mode='spill', selector='model')" in result["printed"]
        assert result["same_forward"] and result["repr_equal"] and result["classes_equal"], result
        assert result["hooks"] == 0 and result["state_gone"] and result["config_equal"], result
        if which != "tiny":
            assert result["patched"][0] and (result["patched"][1] or which == "v32"), result
        assert all(result["restored"]), result


def test_an_object_that_is_no_adapter_is_refused() -> None:
    import sparsecp.models as cp

    with pytest.raises(TypeError, match="must implement sparsecp.models.ModelAdapter; object lacks name"):
        cp.context_parallel(adapter_tasks.tiny_model(), object())


def test_guide_your_model_runs_on_two_ranks() -> None:
    import readme_snippets

    blocks = readme_snippets.code_blocks(readme_snippets.read("docs/guide/your-model.md"), "python")
    assert blocks
    for result in results_or_raise(pool_of(2).run(adapter_tasks.run_guide, blocks, timeout=120)):
        assert result == {"logits": (1, 8, 61), "undone": True, "grads": True}, result


def test_a_process_patch_is_restored_after_its_last_release() -> None:
    """transformers' loss mapping and V4's load-balancing loss are patched once per process while
    any CP model needs them: restored when the last is undone, a release counted once."""
    from sparsecp.models._cp.transformers_adapter import ProcessPatch

    def original() -> None:
        pass

    box: dict[str, object] = {"f": original}
    patch = ProcessPatch(lambda: box["f"], lambda value: box.__setitem__("f", value), lambda f: ("wrapped", f))
    first, second = patch.acquire(), patch.acquire()
    assert box["f"] == ("wrapped", original)
    first()
    first()  # a second call of one release is no second release
    assert box["f"] == ("wrapped", original), "another model still needs the patch"
    second()
    assert box["f"] is original
    again = patch.acquire()
    box["f"] = "replaced by someone else"
    again()
    assert box["f"] == "replaced by someone else", "a patch replaced since is left alone"


def test_a_failure_half_way_leaves_the_model_as_it_was() -> None:
    for result in results_or_raise(pool_of(2).run(adapter_tasks.failed_apply, timeout=120)):
        assert result == {"error": "an install that fails half-way", "classes": True, "hooks": 0, "state": True,
                          "repr": True}, result
