"""tools/compare/head_tail_fold.py, the count behind RESULTS' head-tail folding figures:
folding balances one causal sequence (what it is made for) and not a packed batch."""
from __future__ import annotations

import importlib.util
import os

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "compare", "head_tail_fold.py")


def _module():
    spec = importlib.util.spec_from_file_location("head_tail_fold", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_folding_balances_one_sequence():
    fold = _module().fold
    for cp in (2, 4, 8, 64):
        imbalance, moved = fold([1 << 20], cp, 4)  # one document: work grows along the sequence
        assert imbalance == pytest.approx(1.0, abs=2e-3), cp
        assert moved == 0.5


def test_folding_leaves_packed_documents_unbalanced():
    fold = _module().fold
    # One document over the first 6 of 8 chunks, then short ones: ranks 1 and 2 get the long
    # document's middle and tail, ranks 0 and 3 its head and the short documents.
    imbalance, _ = fold([6 * 4096] + [16] * 512, 4, 4)
    assert imbalance > 1.5
    row_work = _module().row_work([3, 5], 2)
    assert row_work.tolist() == [0, 1, 1, 0, 1, 1, 2, 2]  # floor((p + 1) / ratio) per document
