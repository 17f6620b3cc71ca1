"""The README's PyTorch path as a user copies it: its snippets, extracted from the README
as written, run on 2 gloo ranks; and its set-up stays two commands."""
from __future__ import annotations

import math

import pytest
import readme_snippets

pytest.importorskip("torch")

from multirank import pool_of, results_or_raise


def test_readme_keeps_two_setup_commands():
    assert len(readme_snippets.code_blocks(readme_snippets.section("Set-up"))) == 2


def test_readme_pytorch_snippets_run_on_two_ranks():
    snippets = readme_snippets.pytorch_snippets()
    assert len(snippets) >= 3, "the README's PyTorch section lost its python snippets"
    results = results_or_raise(pool_of(2).run(readme_snippets.run_snippets, snippets, timeout=120))
    for rank, result in enumerate(results):
        local = result["local"]
        assert result["topk_ids"] == ((1, local, 512), "torch.int32"), rank
        assert result["own_ids"] == (local, 512), rank
        assert result["cos"] == (1, local, 32), rank
        assert result["bank"] == (1, sum(n // 4 for n in (1200, 300, 44, 504)), 64), rank
        assert result["valid_ids"], rank
        assert math.isfinite(result["loss"]) and result["grad"], rank


def test_readme_training_loop_replay_snippets_run_on_two_ranks():
    snippets = readme_snippets.replay_snippets()
    assert len(snippets) == 3, "the README's replay subsections lost their python snippets"
    results = results_or_raise(pool_of(2).run(readme_snippets.run_replay_snippets,
                                              readme_snippets.pytorch_snippets(), snippets, timeout=120))
    for rank, result in enumerate(results):
        local = result["local"]
        # Each selection moves inputs and results (one all-to-all each way, fp32 fields): the
        # checkpointed ones only in their forwards, the RL replay not at all.
        assert result["exchanges"] == [4, 2, 2], (rank, result["exchanges"])
        assert result["retained"] == local * 512 * 4, rank
        assert result["rollout_ids"] == (1, local, 512), rank
        assert math.isfinite(result["loss"]) and result["grad"], rank


def test_readme_training_loop_refit_snippet_runs_on_two_ranks():
    snippets = readme_snippets.refit_snippets()
    assert len(snippets) == 1, "the README's refit subsection lost its python snippet"
    results = results_or_raise(pool_of(2).run(readme_snippets.run_refit_snippets,
                                              readme_snippets.pytorch_snippets(), snippets, timeout=120))
    for rank, result in enumerate(results):
        assert result["steps"] == 3 and result["samples"] == 3 * 2, rank  # a sample per rank and step
        assert result["unit"] == "ns" or result["kept_previous"], rank
        assert result["equal"], rank  # the refitted plans still select exactly
