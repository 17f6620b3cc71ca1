"""The code blocks of the README and of the user guide (docs/guide/*.md), extracted as
written, and the rank tasks that run them (test_docs.py, test_fixed.py).

Which blocks run where:
- README.md's quick start: alone, on each rank (quick_start_snippets).
- docs/guide/pytorch.md: in order, one namespace per rank (pytorch_snippets; its last
  section, "Calibrating your own selector", runs once, after them: calibrate_snippets).
- docs/guide/training.md: each section after the PyTorch page's snippets
  (training_snippets(title)).
- Any other page's python blocks are run by a test module that names the page (its path
  under docs/, e.g. "guide/deepseek-v4.md"), and the README's DeepSeek-V4 section's by a
  test module that names the section (DEEPSEEK_V4_SECTION): test_docs.py checks that one does.
"""
from __future__ import annotations

import glob
import os
import re
from typing import Any

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
README = os.path.join(ROOT, "README.md")
GUIDE = os.path.join(ROOT, "docs", "guide")


def path_of(page: str) -> str:
    """``page`` relative to the repository root ("README.md", "docs/guide/cli.md")."""
    return os.path.join(ROOT, page)


def read(page: str) -> str:
    with open(path_of(page), encoding="utf-8") as file:
        return file.read()


def pages() -> list[str]:
    """Every documentation page whose code blocks must run: the README and the guide."""
    guide = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(GUIDE, "*.md")))
    return ["README.md", *guide]


def heading_section(text: str, title: str, level: int = 2) -> str:
    """The part of ``text`` under the first heading of ``level`` (2: "## ") that starts with
    ``title``, up to the next heading of that level or a higher one (lines inside code
    fences are not headings)."""
    lines = text.splitlines(keepends=True)
    fenced, start = False, None
    for number, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or not line.startswith("#"):
            continue
        marks = len(line) - len(line.lstrip("#"))
        if start is None:
            if marks == level and line[marks:].startswith(" " + title):
                start = number
        elif marks <= level and line[marks:marks + 1] == " ":
            return "".join(lines[start:number])
    if start is None:
        raise KeyError(f"no heading {'#' * level} {title}")
    return "".join(lines[start:])


def section(title: str) -> str:
    """The README's text under ``## title``, up to the next ``## `` heading."""
    return heading_section(read("README.md"), title)


def code_blocks(text: str, language: str = "") -> list[str]:
    """The fenced code blocks of ``text`` opened with ```language (any when empty)."""
    blocks = re.findall(r"^```([a-z]*)\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)
    return [body for lang, body in blocks if not language or lang == language]


def quick_start_snippets() -> list[str]:
    return code_blocks(section("Quick start from PyTorch"), "python")


DEEPSEEK_V4_SECTION = "A DeepSeek-V4 model from transformers"


def deepseek_v4_readme_snippets() -> list[str]:
    """The python blocks of the README's DeepSeek-V4 section: run by the test module of the
    DeepSeek-V4 page (test_docs.py checks that a test module names this section's title)."""
    return code_blocks(section(DEEPSEEK_V4_SECTION), "python")


CALIBRATE_SECTION = "Calibrating your own selector"


def pytorch_snippets() -> list[str]:
    """The python blocks of the PyTorch page, in order, but its calibration section."""
    text = read("docs/guide/pytorch.md")
    calibrate = heading_section(text, CALIBRATE_SECTION)
    return code_blocks(text.replace(calibrate, ""), "python")


def calibrate_snippets() -> list[str]:
    return code_blocks(heading_section(read("docs/guide/pytorch.md"), CALIBRATE_SECTION), "python")


def training_snippets(*titles: str) -> list[str]:
    """The python blocks of the training-loop page's sections ``titles``, in that order."""
    text = read("docs/guide/training.md")
    return [block for title in titles for block in code_blocks(heading_section(text, title), "python")]


REPLAY_SUBSECTIONS = ("Activation checkpointing", "RL: record in the rollout, replay in training")
REFIT_SUBSECTION = "Spill's cost model from the job's own times"
FIXED_SUBSECTIONS = ("Prebuilt routes and fixed capacity", "torch.compile")


def replay_snippets() -> list[str]:
    return training_snippets(*REPLAY_SUBSECTIONS)


def refit_snippets() -> list[str]:
    return training_snippets(REFIT_SUBSECTION)


def run_blocks(namespace: dict[str, Any], blocks: list[str], origin: str) -> None:
    for index, snippet in enumerate(blocks):
        exec(compile(snippet, f"{origin} snippet {index + 1}", "exec"), namespace)  # noqa: S102 (the docs, as written)


def run_quick_start(rank: int, size: int, snippets: list[str]) -> dict[str, Any]:
    """The README's quick start, alone; then the same call with mode "none" (every rank its
    own rows) for comparison."""
    import torch

    import sparsecp.torch as indexer_balance

    namespace: dict[str, Any] = {"__name__": "readme"}
    run_blocks(namespace, snippets, "README.md quick start")
    ids = namespace["ids"]
    args = [namespace[name] for name in ("qr", "weights")]
    none = indexer_balance.balanced_indexer_select(
        *args, (namespace["angles"].cos()[None], namespace["angles"].sin()[None]), namespace["selector"],
        namespace["lengths"], namespace["ratio"], "none", namespace["group"])
    return {"local": namespace["local"], "shape": tuple(ids.shape), "dtype": str(ids.dtype),
            "equal_to_none": bool(torch.equal(ids, none))}


def run_calibrate(rank: int, size: int, pytorch: list[str], calibrate: list[str]) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "guide"}
    run_blocks(namespace, pytorch, "docs/guide/pytorch.md")
    run_blocks(namespace, calibrate, "docs/guide/pytorch.md calibration")
    model = namespace["fit"].model
    return {"unit": model.unit, "terms": [model.a, model.b, model.c, model.d]}


def run_refit_snippets(rank: int, size: int, pytorch: list[str], refit: list[str]) -> dict[str, Any]:
    """The PyTorch snippets, then the refit snippet, in one namespace."""
    import torch

    namespace: dict[str, Any] = {"__name__": "guide"}
    run_blocks(namespace, [*pytorch, *refit], "docs/guide")
    model = namespace["refit"].model
    return {"steps": namespace["refit"].steps, "samples": namespace["refit"].samples,
            "unit": model.unit, "kept_previous": namespace["refit"].kept_previous,
            "equal": bool(torch.equal(namespace["own_ids"].unsqueeze(0), namespace["topk_ids"]))}


def run_replay_snippets(rank: int, size: int, pytorch: list[str], replay: list[str]) -> dict[str, Any]:
    """The PyTorch snippets, then the replay snippets, in one namespace; counts the all-to-alls
    of each replay snippet (sparsecp.torch.exchange_stats)."""
    import sparsecp.torch as indexer_balance

    namespace: dict[str, Any] = {"__name__": "guide"}
    run_blocks(namespace, pytorch, "docs/guide/pytorch.md")
    exchanges = []
    for index, snippet in enumerate(replay):
        indexer_balance.reset_exchange_stats()
        run_blocks(namespace, [snippet], f"docs/guide/training.md replay {index + 1}")
        exchanges.append(indexer_balance.exchange_stats()["exchanges"])
    return {"local": namespace["local"], "exchanges": exchanges, "retained": namespace["retained"],
            "loss": float(namespace["loss"].detach()),
            "grad": bool(namespace["index_query"].grad.abs().sum() > 0),
            "rollout_ids": tuple(namespace["rollout_ids"].shape)}


def run_snippets(rank: int, size: int, snippets: list[str]) -> dict[str, Any]:
    """Runs the PyTorch page's snippets in one namespace on this rank (the pool's process
    group is initialised, as the page assumes); returns what the test checks."""
    namespace: dict[str, Any] = {"__name__": "guide"}
    run_blocks(namespace, snippets, "docs/guide/pytorch.md")
    topk_ids, own_ids, loss = namespace["topk_ids"], namespace["own_ids"], namespace["loss"]
    return {
        "local": namespace["local"],
        "topk_ids": (tuple(topk_ids.shape), str(topk_ids.dtype)),
        "own_ids": tuple(own_ids.shape),
        "cos": tuple(namespace["cos"].shape),
        "bank": tuple(namespace["index_key_bank"].shape),
        "loss": float(loss),
        "grad": namespace["index_query"].grad is not None and bool(namespace["index_query"].grad.abs().sum() > 0),
        "valid_ids": bool(((topk_ids >= -1) & (topk_ids < namespace["keys"])).all()),
    }
