"""The model selectors on the device code path, checked on CPU.

* ``_cp_topk.float32_products`` (a half-precision GEMM that writes float32: the selectors' scores
  from operands in the model's dtype on a GPU) takes bfloat16 and float16 operands off the CPU
  only, and gives float32 ``[..., n]`` (checked on meta tensors, where ``torch.mm``'s
  ``out_dtype`` overload is registered as on CUDA).
* The V4 and V3.2 ``ModelSelector`` with that path switched on (its GEMM emulated on CPU: the
  same products, accumulated in float32) return the ids of the float32 path: the reshapes and
  views around the GEMM are right before a GPU ever runs them.
* A checkpointed training step on the device code path (``SPARSECP_TORCH_PATH=1``, the running
  top-k's sort instead of ``nonzero``, ``nonzero`` counted) syncs the host exactly as often as
  test_v4_bounded's CPU count: the agreement's one ``tolist`` and one ``all_gather_object`` per
  forward, none in the backward, at 4 and 8 layers (V4) and 3 layers (V3.2).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sparsecp.models._cp import selector as _cp_selector
from sparsecp.models._cp import topk as _cp_topk
from sparsecp.models.deepseek_v4 import _selector as _v4_selector
from sparsecp.models.deepseek_v32 import _selector as _v32_selector


def test_float32_products_take_half_operands_off_the_cpu_only() -> None:
    a = torch.empty((5, 3, 16), dtype=torch.bfloat16, device="meta")
    b = torch.empty((16, 7), dtype=torch.bfloat16, device="meta")
    if not _cp_topk._mm_takes_out_dtype():
        pytest.skip("this torch's mm has no out_dtype: the selectors keep the float32 lines")
    assert _cp_topk.half_products(a, b)
    assert _cp_topk.half_products(a.half(), b.half())
    out = _cp_topk.float32_products(a, b)
    assert out.dtype == torch.float32 and out.shape == (5, 3, 7)
    assert not _cp_topk.half_products(a.float(), b.float())        # float32: the model's own lines
    assert not _cp_topk.half_products(a, b.float())
    assert not _cp_topk.half_products(torch.empty(2, 4, dtype=torch.bfloat16), torch.empty(4, 3, dtype=torch.bfloat16))


def _emulate_half_path(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[tuple[int, ...]]:
    calls: list[tuple[int, ...]] = []

    def products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        assert a.dtype == b.dtype == torch.bfloat16 and b.dim() == 2  # operands stay in the model's dtype
        calls.append(tuple(a.shape))
        flat = a.reshape(-1, a.shape[-1]).float() @ b.float()  # bf16 products are exact in float32
        return flat.view(*a.shape[:-1], b.shape[1])

    monkeypatch.setattr(module, "half_products", lambda a, b: a.dtype == torch.bfloat16)
    monkeypatch.setattr(module, "float32_products", products)
    return calls


def _v4_selector_inputs(seed: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(seed)
    heads, dim, rank, rows, keys, ratio, topk = 4, 16, 12, 37, 29, 4, 5
    projection = torch.nn.Linear(rank, heads * dim, bias=False)
    with torch.no_grad():
        projection.weight.copy_(torch.randn(heads * dim, rank, generator=g))
    indexer = SimpleNamespace(q_b_proj=projection.bfloat16(), head_dim=dim, compress_rate=ratio, index_topk=topk,
                              scorer=SimpleNamespace(softmax_scale=dim ** -0.5))
    bank = torch.randn(keys, dim, generator=g).bfloat16()
    residual = torch.randn(1, rows, rank, generator=g).bfloat16()
    weights = torch.randn(1, rows, heads, generator=g).bfloat16()
    cos, sin = torch.ones(1, rows, 1).bfloat16(), torch.zeros(1, rows, 1).bfloat16()
    segments = [(0, 20, 0, 13, 2), (20, 37, 13, 29, 0)]
    return indexer, bank, residual, weights, (cos, sin), segments


def test_v4_model_selector_half_path_returns_the_float32_paths_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    indexer, bank, residual, weights, embeddings, segments = _v4_selector_inputs(1)
    rope = lambda q, cos, sin: q  # noqa: E731
    want = _v4_selector.ModelSelector(indexer, bank, rope)(residual, weights, embeddings, segments)
    monkeypatch.setattr(_cp_selector, "CHUNK_ROWS", 8)
    monkeypatch.setattr(_v4_selector, "_SCORE_BYTES", 1)  # every slice and merge runs
    calls = _emulate_half_path(monkeypatch, _v4_selector)
    got = _v4_selector.ModelSelector(indexer, bank, rope)(residual, weights, embeddings, segments)
    assert calls and torch.equal(got, want)


def test_v32_model_selector_half_path_returns_the_float32_paths_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(2)
    heads, dim, rope_dim, rank, rows, topk = 4, 16, 8, 12, 23, 5
    projection = torch.nn.Linear(rank, heads * dim, bias=False)
    with torch.no_grad():
        projection.weight.copy_(torch.randn(heads * dim, rank, generator=g))
    indexer = SimpleNamespace(wq_b=projection.bfloat16(), n_heads=heads, head_dim=dim, qk_rope_head_dim=rope_dim,
                              index_topk=topk, softmax_scale=dim ** -0.5)
    bank = torch.randn(rows, dim, generator=g).bfloat16()
    residual = torch.randn(1, rows, rank, generator=g).bfloat16()
    weights = torch.randn(1, rows, heads, generator=g).bfloat16()
    cos, sin = torch.ones(1, rows, rope_dim).bfloat16(), torch.zeros(1, rows, rope_dim).bfloat16()
    segments = [(0, 10, 0, 10, 0), (10, rows, 10, rows, 0)]

    def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    want = _v32_selector.ModelSelector(indexer, bank, rope)(residual, weights, (cos, sin), segments)
    calls = _emulate_half_path(monkeypatch, _v32_selector)
    got = _v32_selector.ModelSelector(indexer, bank, rope)(residual, weights, (cos, sin), segments)
    assert calls and torch.equal(got, want)


import device_path_tasks  # noqa: E402
from multirank import pool_of, results_or_raise  # noqa: E402


@pytest.mark.parametrize("model, layers", [("v4", 4), ("v4", 8), ("v32", 3)])
def test_the_device_path_syncs_the_host_only_for_the_agreement(model: str, layers: int) -> None:
    if model == "v32":
        pytest.importorskip("transformers.models.deepseek_v32", reason="transformers without DeepseekV32")
    results = results_or_raise(pool_of(2).run(device_path_tasks.device_path_host_syncs, layers, model,
                                              timeout=300))
    for rank, counts in enumerate(results):
        assert sum(counts["backward"].values()) == 0, (rank, counts["backward"])
        kinds = sorted(site.split()[-1] for site in counts["forward"])
        assert kinds == ["all_gather_object", "tolist"], (rank, counts["forward"])
