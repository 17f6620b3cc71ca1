"""The README's PyTorch snippets, extracted as written (the ```python blocks of its "Use from
PyTorch" section, in order), and a rank task that runs them (test_readme.py)."""
from __future__ import annotations

import os
import re
from typing import Any

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def section(title: str) -> str:
    """The README's text under ``## title``, up to the next ``## `` heading."""
    with open(README, encoding="utf-8") as file:
        text = file.read()
    start = text.index("\n## " + title)
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def code_blocks(text: str, language: str = "") -> list[str]:
    """The fenced code blocks of ``text`` opened with ```language (any when empty)."""
    blocks = re.findall(r"^```([a-z]*)\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)
    return [body for lang, body in blocks if not language or lang == language]


def pytorch_snippets() -> list[str]:
    return code_blocks(section("Use from PyTorch"), "python")


def subsection(text: str, title: str) -> str:
    """The part of a section's ``text`` under ``### title``, up to the next ``### `` heading."""
    start = text.index("\n### " + title)
    end = text.find("\n### ", start + 1)
    return text[start:end if end >= 0 else len(text)]


REPLAY_SUBSECTIONS = ("Activation checkpointing", "RL: record in the rollout, replay in training")


def replay_snippets() -> list[str]:
    """The python blocks of the "In a training loop" subsections on selection replay."""
    text = section("In a training loop")
    return [block for title in REPLAY_SUBSECTIONS for block in code_blocks(subsection(text, title), "python")]


def refit_snippets() -> list[str]:
    """The python blocks of the "In a training loop" subsection on the cost-model refit."""
    return code_blocks(subsection(section("In a training loop"), "Spill's cost model from the job's own times"),
                       "python")


def run_refit_snippets(rank: int, size: int, pytorch: list[str], refit: list[str]) -> dict[str, Any]:
    """The PyTorch snippets, then the refit snippet, in one namespace."""
    import torch

    namespace: dict[str, Any] = {"__name__": "readme"}
    for index, snippet in enumerate([*pytorch, *refit]):
        exec(compile(snippet, f"README.md snippet {index + 1}", "exec"), namespace)  # noqa: S102
    model = namespace["refit"].model
    return {"steps": namespace["refit"].steps, "samples": namespace["refit"].samples,
            "unit": model.unit, "kept_previous": namespace["refit"].kept_previous,
            "equal": bool(torch.equal(namespace["own_ids"].unsqueeze(0), namespace["topk_ids"]))}


def run_replay_snippets(rank: int, size: int, pytorch: list[str], replay: list[str]) -> dict[str, Any]:
    """The PyTorch snippets, then the replay snippets, in one namespace; counts the all-to-alls
    of each replay snippet (sparsecp.torch.exchange_stats)."""
    import sparsecp.torch as indexer_balance

    namespace: dict[str, Any] = {"__name__": "readme"}
    for index, snippet in enumerate(pytorch):
        exec(compile(snippet, f"README.md PyTorch snippet {index + 1}", "exec"), namespace)  # noqa: S102
    exchanges = []
    for index, snippet in enumerate(replay):
        indexer_balance.reset_exchange_stats()
        exec(compile(snippet, f"README.md training loop snippet {index + 1}", "exec"), namespace)  # noqa: S102
        exchanges.append(indexer_balance.exchange_stats()["exchanges"])
    return {"local": namespace["local"], "exchanges": exchanges, "retained": namespace["retained"],
            "loss": float(namespace["loss"].detach()),
            "grad": bool(namespace["index_query"].grad.abs().sum() > 0),
            "rollout_ids": tuple(namespace["rollout_ids"].shape)}


def run_snippets(rank: int, size: int, snippets: list[str]) -> dict[str, Any]:
    """Runs the snippets in one namespace on this rank (the pool's process group is
    initialised, as the README assumes); returns what the test checks."""
    namespace: dict[str, Any] = {"__name__": "readme"}
    for index, snippet in enumerate(snippets):
        exec(compile(snippet, f"README.md PyTorch snippet {index + 1}", "exec"), namespace)  # noqa: S102 (the README, as written)
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
