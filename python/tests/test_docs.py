"""The README and the user guide as a reader uses them: every Python block runs (on 2 gloo
ranks, as written), every relative link between pages resolves to a file and, with an
anchor, to a heading there; the README stays a front page with its two set-up commands."""
from __future__ import annotations

import glob
import math
import os
import re

import pytest
import readme_snippets

pytest.importorskip("torch")

from multirank import pool_of, results_or_raise

ROOT = readme_snippets.ROOT


# ---------------------------------------------------------------------------------------
# Links

def _strip_code(text: str) -> str:
    text = re.sub(r"^```.*?^```$", "", text, flags=re.DOTALL | re.MULTILINE)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of ``text``: lower case, every character but
    letters, digits, '_', '-' and spaces dropped, spaces to '-'; repeats get -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    body = re.sub(r"^```.*?^```$", "", text, flags=re.DOTALL | re.MULTILINE)
    for title in re.findall(r"^#{1,6} (.+?)\s*#*\s*$", body, flags=re.MULTILINE):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link: its text
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(text: str) -> list[str]:
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _strip_code(text))


def markdown_pages() -> list[str]:
    found = [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)]
    return ["README.md", *sorted(found)]


def test_anchor_rules_match_githubs():
    text = "# A\n## `run`: the main job\n## Python package (`sparsecp`, `sparsecp.torch`)\n## A\n"
    assert anchors(text) == {"a", "run-the-main-job", "python-package-sparsecp-sparsecptorch", "a-1"}


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in markdown_pages():
        text = readme_snippets.read(page)
        for target in links(text):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else \
                os.path.join(ROOT, page)
            if not os.path.exists(file):
                broken.append(f"{page}: {target} (no such file)")
            elif anchor and file.endswith(".md"):
                with open(file, encoding="utf-8") as handle:
                    if anchor not in anchors(handle.read()):
                        broken.append(f"{page}: {target} (no heading with that anchor)")
    assert not broken, "\n".join(broken)


def test_every_guide_page_is_linked_from_the_readme():
    readme = readme_snippets.read("README.md")
    for page in glob.glob(os.path.join(ROOT, "docs", "guide", "*.md")):
        assert "docs/guide/" + os.path.basename(page) in readme, page


# ---------------------------------------------------------------------------------------
# The README as a front page

def test_readme_is_a_front_page():
    text = readme_snippets.read("README.md")
    lines = text.splitlines()
    assert len(lines) <= 200, f"the README has {len(lines)} lines"
    first_screen = "\n".join(lines[:60])
    assert re.search(r"!\[[^\]]+\]\(docs/[\w/.-]+\.svg\)", first_screen), "the picture is not on the first screen"
    assert "bash scripts/run.sh" in first_screen and "bash scripts/test.sh" in first_screen


def test_readme_keeps_two_setup_commands():
    assert len(readme_snippets.code_blocks(readme_snippets.section("Set-up"))) == 2


def test_readme_quick_start_is_short():
    blocks = readme_snippets.quick_start_snippets()
    assert len(blocks) == 1 and len(blocks[0].splitlines()) <= 30


# ---------------------------------------------------------------------------------------
# Every Python block runs

def _named_by_a_test(name: str) -> bool:
    """Whether a test module other than this one names ``name`` (a page, a section title)."""
    for module in glob.glob(os.path.join(ROOT, "python", "tests", "test_*.py")):
        if os.path.basename(module) == "test_docs.py":
            continue
        with open(module, encoding="utf-8") as handle:
            if name in handle.read():
                return True
    return False


def _tested_elsewhere(page: str) -> bool:
    """A page outside README/pytorch/training whose blocks a test module names (and so runs)."""
    return _named_by_a_test(os.path.relpath(page, "docs"))


def test_every_python_block_is_run_by_a_test():
    run = [*readme_snippets.quick_start_snippets(), *readme_snippets.pytorch_snippets(),
           *readme_snippets.calibrate_snippets(),
           *(readme_snippets.deepseek_v4_readme_snippets()
             if _named_by_a_test(readme_snippets.DEEPSEEK_V4_SECTION) else []),
           *readme_snippets.training_snippets(*readme_snippets.REPLAY_SUBSECTIONS,
                                              *readme_snippets.FIXED_SUBSECTIONS,
                                              readme_snippets.REFIT_SUBSECTION)]
    missing = []
    for page in readme_snippets.pages():
        blocks = readme_snippets.code_blocks(readme_snippets.read(page), "python")
        if page in ("README.md", "docs/guide/pytorch.md", "docs/guide/training.md"):
            missing += [f"{page}: {block.splitlines()[0]}" for block in blocks if block not in run]
        elif blocks and not _tested_elsewhere(page):
            missing.append(f"{page}: {len(blocks)} python block(s), and no test module names the page")
    # Python written in an unmarked block would escape the runner.
    for page in readme_snippets.pages():
        for block in readme_snippets.code_blocks(readme_snippets.read(page), ""):
            if re.search(r"^(import |from \S+ import |\w+ = \w+\.\w+\()", block, flags=re.MULTILINE) and \
                    block not in readme_snippets.code_blocks(readme_snippets.read(page), "python"):
                missing.append(f"{page}: python in a block not marked ```python: {block.splitlines()[0]}")
    assert not missing, "\n".join(missing)


def test_readme_quick_start_runs_on_two_ranks():
    results = results_or_raise(pool_of(2).run(readme_snippets.run_quick_start,
                                              readme_snippets.quick_start_snippets(), timeout=120))
    for rank, result in enumerate(results):
        assert result["shape"] == (1, result["local"], 512) and result["dtype"] == "torch.int32", rank
        assert result["equal_to_none"], rank  # balanced selection equals every rank selecting its own


def test_guide_pytorch_snippets_run_on_two_ranks():
    snippets = readme_snippets.pytorch_snippets()
    assert len(snippets) >= 3, "the PyTorch page lost its python snippets"
    results = results_or_raise(pool_of(2).run(readme_snippets.run_snippets, snippets, timeout=120))
    for rank, result in enumerate(results):
        local = result["local"]
        assert result["topk_ids"] == ((1, local, 512), "torch.int32"), rank
        assert result["own_ids"] == (local, 512), rank
        assert result["cos"] == (1, local, 32), rank
        assert result["bank"] == (1, sum(n // 4 for n in (1200, 300, 44, 504)), 64), rank
        assert result["valid_ids"], rank
        assert math.isfinite(result["loss"]) and result["grad"], rank


def test_guide_calibrate_snippet_runs():
    snippets = readme_snippets.calibrate_snippets()
    assert len(snippets) == 1, "the PyTorch page lost its calibration snippet"
    results = results_or_raise(pool_of(1).run(readme_snippets.run_calibrate, readme_snippets.pytorch_snippets(),
                                              snippets, timeout=180))
    assert results[0]["unit"] == "ns" and all(math.isfinite(t) and t >= 0 for t in results[0]["terms"])


def test_guide_training_loop_replay_snippets_run_on_two_ranks():
    snippets = readme_snippets.replay_snippets()
    assert len(snippets) == 3, "the training page's replay sections lost their python snippets"
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


def test_guide_training_loop_refit_snippet_runs_on_two_ranks():
    snippets = readme_snippets.refit_snippets()
    assert len(snippets) == 1, "the training page's refit section lost its python snippet"
    results = results_or_raise(pool_of(2).run(readme_snippets.run_refit_snippets,
                                              readme_snippets.pytorch_snippets(), snippets, timeout=120))
    for rank, result in enumerate(results):
        assert result["steps"] == 3 and result["samples"] == 3 * 2, rank  # a sample per rank and step
        assert result["unit"] == "ns" or result["kept_previous"], rank
        assert result["equal"], rank  # the refitted plans still select exactly
