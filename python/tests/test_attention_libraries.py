"""The installed-library backends of ``sparse_attention`` ("flashmla", "cudnn") without a GPU.

No GPU and neither library here: stand-in modules with the real call signatures (FlashMLA's
``flash_mla_sparse_fwd``, cuDNN-frontend's ``sparse_attention_backward_wrapper``, as read in their
sources: see ``_attention_flashmla`` / ``_attention_cudnn``) go into ``sys.modules``. Each first
asserts the argument layout the real library takes (shapes, dtypes, contiguity, its lse
convention: ``+inf`` for a row with no key, the sink required by cuDNN), then computes the
contract with the float64 reference. A shim makes CPU tensors look like a CUDA device of a chosen
compute capability to the support checks. What this proves: the adapters convert the contract
to the libraries' calls and back (out, lse, dq, dkv, dsinks equal to the reference), FlashMLA's
forward is paired with cuDNN's backward or else Triton's, and the checks pick and refuse as they
say (architecture, dtype, heads, dims, a missing library), the pick logged once.
"""
from __future__ import annotations

import inspect
import logging
import re
import sys
import types
from typing import Any

import pytest
import torch

from sparsecp.torch import _attention_cudnn, _attention_flashmla, _attention_library, _attention_triton
from sparsecp.torch import attention as attention_module
from sparsecp.torch._attention_reference import reference_sparse_attention
from sparsecp.torch.attention import sparse_attention, sparse_attention_backend, sparse_attention_backends

CUDNN_PARENTS = ("cudnn", "cudnn.deepseek_sparse_attention")


# --- stand-ins with the real signatures -------------------------------------------------------

def _contract_ids(indices: torch.Tensor, keys: int) -> torch.Tensor:
    """FlashMLA: an id at or past s_kv is none, like -1."""
    return torch.where((indices >= 0) & (indices < keys), indices, torch.full_like(indices, -1))


class FlashMLA:
    """``flash_mla`` with ``flash_mla_sparse_fwd`` as in FlashMLA 02fe0d02 (or, with
    ``sinks=False``, the first sparse release's signature without ``attn_sink``)."""

    def __init__(self, sinks: bool = True) -> None:
        self.calls: list[dict[str, Any]] = []
        self.module = types.ModuleType("flash_mla")
        if sinks:
            def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                                     d_v: int = 512, attn_sink: torch.Tensor | None = None,
                                     topk_length: torch.Tensor | None = None, indexer_topk: int = 0) -> Any:
                assert topk_length is None and indexer_topk == 0
                return self.run(q, kv, indices, sm_scale, d_v, attn_sink)
        else:
            def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,  # type: ignore[misc]
                                     sm_scale: float, d_v: int = 512) -> Any:
                return self.run(q, kv, indices, sm_scale, d_v, None)
        self.module.flash_mla_sparse_fwd = flash_mla_sparse_fwd  # type: ignore[attr-defined]

    def run(self, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int,
            attn_sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s_q, h_q, d_qk = q.shape
        assert q.dtype == kv.dtype == torch.bfloat16 and q.stride(-1) == 1
        assert h_q in (64, 128) and d_qk in (512, 576) and d_v == 512
        assert kv.dim() == 3 and kv.shape[1] == 1 and kv.shape[2] == d_qk and kv.stride(-1) == 1
        assert indices.dtype == torch.int32 and indices.dim() == 3 and indices.shape[:2] == (s_q, 1)
        assert indices.shape[2] % 128 == 0 and indices.stride(-1) == 1
        assert isinstance(sm_scale, float)
        if attn_sink is not None:
            assert attn_sink.dtype == torch.float32 and attn_sink.shape == (h_q,) and attn_sink.is_contiguous()
        self.calls.append({"topk": indices.shape[2], "attn_sink": attn_sink is not None})
        ids = _contract_ids(indices[:, 0], kv.shape[0])
        out, lse = reference_sparse_attention(q.double(), kv[:, 0].double(), ids, sm_scale, d_v,
                                              None if attn_sink is None else attn_sink.double())
        lse = lse.float()
        max_logits = torch.zeros_like(lse)
        return out.to(torch.bfloat16), max_logits, torch.where(lse == float("-inf"), float("inf"), lse)


class TupleDict(dict):
    """cuDNN-frontend's result type: a dict of the named results."""


class CuDNN:
    """``cudnn.deepseek_sparse_attention.sparse_attention_backward`` with
    ``sparse_attention_backward_wrapper`` as in cudnn-frontend 35acc09e."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.modules = {name: types.ModuleType(name) for name in CUDNN_PARENTS}
        module = types.ModuleType(_attention_cudnn.MODULE)

        def sparse_attention_backward_wrapper(q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor,
                                              dout: torch.Tensor, lse: torch.Tensor, attn_sink: torch.Tensor,
                                              topk_idxs: torch.Tensor, softmax_scale: float | None = None,
                                              topk_length: torch.Tensor | None = None,
                                              dq: torch.Tensor | None = None, dkv: torch.Tensor | None = None,
                                              block_tile: int = 64, stream: Any = None) -> TupleDict:
            assert topk_length is None and dq is None and dkv is None
            return self.run(q, kv, out, dout, lse, attn_sink, topk_idxs, softmax_scale)
        module.sparse_attention_backward_wrapper = sparse_attention_backward_wrapper  # type: ignore[attr-defined]
        self.modules[_attention_cudnn.MODULE] = module

    def run(self, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
            attn_sink: torch.Tensor, topk_idxs: torch.Tensor, softmax_scale: float | None) -> TupleDict:
        s_q, heads, d = q.shape
        assert q.dtype == kv.dtype == out.dtype == dout.dtype == torch.bfloat16
        assert d in (512, 576) and heads in (64, 128) and kv.dim() == 2 and kv.shape[1] == d
        assert out.shape == dout.shape == (s_q, heads, 512)
        assert all(t.is_contiguous() for t in (q, kv, out, dout, lse, attn_sink, topk_idxs))
        assert lse.dtype == torch.float32 and lse.shape == (s_q, heads)
        assert not bool((lse == float("-inf")).any()), "cuDNN takes FlashMLA's +inf for a row with no key"
        assert attn_sink.dtype == torch.float32 and attn_sink.shape == (heads,)
        assert topk_idxs.dtype == torch.int32 and topk_idxs.shape[0] == s_q
        assert isinstance(softmax_scale, float)
        with torch.enable_grad():  # called from autograd's backward, where grad mode is off
            q64, kv64 = q.double().requires_grad_(), kv.double().requires_grad_()
            sink64 = attn_sink.double().requires_grad_()
            ref_out, ref_lse = reference_sparse_attention(q64, kv64, topk_idxs, softmax_scale, 512, sink64)
            (ref_out.double() * dout.double()).sum().backward()
        expected = torch.where(ref_lse == float("-inf"), float("inf"), ref_lse.float())
        torch.testing.assert_close(lse, expected, rtol=1e-5, atol=1e-5)  # the KV-only lse, FlashMLA's convention
        self.calls.append({"sink": attn_sink.clone()})
        assert q64.grad is not None and kv64.grad is not None and sink64.grad is not None
        return TupleDict(dq=q64.grad.to(q.dtype), dkv=kv64.grad.to(kv.dtype), d_sink=sink64.grad.float())


def _reference_triton_backward(calls: list[dict[str, Any]]) -> Any:
    """A stand-in for ``_attention_triton.backward`` (same signature), recording the lse it got."""
    def backward(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float, value_dim: int,
                 sinks: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor, *,
                 deterministic: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        calls.append({"lse": lse.clone()})
        with torch.enable_grad():  # called from autograd's backward, where grad mode is off
            q64, kv64 = q.detach().double().requires_grad_(), kv.detach().double().requires_grad_()
            s64 = None if sinks is None else sinks.detach().double().requires_grad_()
            ref_out, _ = reference_sparse_attention(q64, kv64, indices, scale, value_dim, s64)
            (ref_out.double() * grad_out.double()).sum().backward()
        assert q64.grad is not None and kv64.grad is not None
        return (q64.grad.to(q.dtype), kv64.grad.to(kv.dtype),
                None if s64 is None or s64.grad is None else s64.grad.to(sinks.dtype))  # type: ignore[union-attr]
    assert list(inspect.signature(backward).parameters)[:9] == list(
        inspect.signature(_attention_triton.backward).parameters)[:9]
    return backward


def _reference_triton_forward(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float,
                              value_dim: int, sinks: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = reference_sparse_attention(q.detach(), kv.detach(), indices, scale, value_dim,
                                          None if sinks is None else sinks.detach())
    return out, lse


# --- the device shim -------------------------------------------------------------------------

@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    """CPU tensors look like a CUDA device of compute capability ``gpu.capability`` (default
    sm_90); neither library is installed until a test installs a stand-in; Triton refuses
    until a test says otherwise; the pick log starts empty."""
    shim = types.SimpleNamespace(capability=(9, 0))
    monkeypatch.setattr(_attention_library, "device_type", lambda tensor: "cuda")
    monkeypatch.setattr(_attention_library, "capability", lambda device: shim.capability)
    for name in ("flash_mla", *CUDNN_PARENTS, _attention_cudnn.MODULE):
        monkeypatch.delitem(sys.modules, name, raising=False)
        monkeypatch.setitem(_attention_library._FAILED, name, f"{name} does not import (stand-in: not installed)")
    def triton_support(reason: str | None) -> None:
        check = lambda *args, **kwargs: reason  # noqa: E731
        monkeypatch.setattr(attention_module, "_triton_support", check)
        monkeypatch.setitem(attention_module._SUPPORT, "triton", check)

    triton_support("triton refused (stand-in)")
    monkeypatch.setattr(attention_module, "_LOGGED", set())

    def install(name: str, module: types.ModuleType) -> None:
        monkeypatch.setitem(sys.modules, name, module)

    def flashmla(sinks: bool = True) -> FlashMLA:
        fake = FlashMLA(sinks)
        install("flash_mla", fake.module)
        return fake

    def cudnn() -> CuDNN:
        fake = CuDNN()
        for name, module in fake.modules.items():
            install(name, module)
        return fake

    def triton(forward: bool = True) -> list[dict[str, Any]]:
        calls: list[dict[str, Any]] = []
        triton_support(None)
        monkeypatch.setattr(_attention_triton, "backward", _reference_triton_backward(calls))
        if forward:
            monkeypatch.setattr(_attention_triton, "forward", _reference_triton_forward)
        return calls

    shim.flashmla, shim.cudnn, shim.triton = flashmla, cudnn, triton
    return shim


# --- inputs ----------------------------------------------------------------------------------

SHAPES = {
    # name: rows, heads, qk, value, keys, columns, sinks
    "v4_k_eq_v_sinks": (6, 64, 512, 512, 41, 37, True),
    "v32_576_512": (5, 128, 576, 512, 30, 130, False),
    "v4_one_column": (4, 64, 512, 512, 9, 1, True),
}


def _inputs(shape: tuple[Any, ...], seed: int) -> dict[str, Any]:
    rows, heads, qk, value, keys, columns, with_sinks = shape
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(rows, heads, qk, generator=g) * 0.3).bfloat16()
    kv = (torch.randn(keys, qk, generator=g) * 0.3).bfloat16()
    indices = torch.randint(-1, keys, (rows, columns), generator=g, dtype=torch.int32)
    indices[1] = -1                                  # a row with no key
    if columns > 3:
        indices[2, :3] = 4                           # one key listed three times
    sinks = torch.randn(heads, generator=g) if with_sinks else None
    if sinks is not None:
        sinks[0], sinks[1] = float("-inf"), 8.0
    grad = torch.randn(rows, heads, value, generator=g).bfloat16()
    return {"q": q, "kv": kv, "indices": indices, "sinks": sinks, "value": value, "grad": grad,
            "scale": qk ** -0.5}


def _run(x: dict[str, Any], backend: str) -> dict[str, Any]:
    q, kv = x["q"].clone().requires_grad_(), x["kv"].clone().requires_grad_()
    sinks = None if x["sinks"] is None else x["sinks"].clone().requires_grad_()
    out, lse = sparse_attention(q, kv, x["indices"], x["scale"], value_dim=x["value"], sinks=sinks,
                                return_lse=True, backend=backend)
    out.backward(x["grad"])
    return {"out": out.detach(), "lse": lse, "dq": q.grad, "dkv": kv.grad,
            "dsinks": None if sinks is None else sinks.grad}


def _reference(x: dict[str, Any]) -> dict[str, Any]:
    q64, kv64 = x["q"].double().requires_grad_(), x["kv"].double().requires_grad_()
    s64 = None if x["sinks"] is None else x["sinks"].double().requires_grad_()
    out, lse = reference_sparse_attention(q64, kv64, x["indices"], x["scale"], x["value"], s64)
    (out * x["grad"].double()).sum().backward()
    return {"out": out.detach(), "lse": lse.float(), "dq": q64.grad, "dkv": kv64.grad,
            "dsinks": None if s64 is None else s64.grad}


def _assert_matches(got: dict[str, Any], want: dict[str, Any], bf16: float = 1e-2) -> None:
    for name in ("out", "dq", "dkv", "dsinks"):
        if want[name] is None:
            assert got[name] is None, name
            continue
        assert got[name] is not None, name
        torch.testing.assert_close(got[name].double(), want[name].double().to(got[name].dtype).double(),
                                   rtol=bf16, atol=bf16 * max(float(want[name].abs().max()), 1e-6), msg=name)
    assert torch.equal(torch.isneginf(got["lse"]), torch.isneginf(want["lse"]))  # -inf: a row with no key
    finite = torch.isfinite(want["lse"])
    torch.testing.assert_close(got["lse"][finite], want["lse"][finite], rtol=1e-5, atol=1e-5)


# --- tests -----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_flashmla_forward_with_cudnn_backward_equals_the_reference(gpu: Any, shape: str) -> None:
    flashmla, cudnn = gpu.flashmla(), gpu.cudnn()
    x = _inputs(SHAPES[shape], 1)
    assert sparse_attention_backend(x["q"], x["kv"], x["indices"], x["sinks"], value_dim=x["value"]) == "flashmla"
    got = _run(x, "flashmla")
    _assert_matches(got, _reference(x))
    assert flashmla.calls[0]["topk"] == -(-SHAPES[shape][5] // 128) * 128  # padded with -1 to the key block
    assert flashmla.calls[0]["attn_sink"] == (x["sinks"] is not None)
    assert len(cudnn.calls) == 1
    if x["sinks"] is None:  # cuDNN needs a sink: -inf, which changes nothing
        assert bool(torch.isneginf(cudnn.calls[0]["sink"]).all())


def test_flashmla_before_attn_sink_gets_the_sink_applied_by_the_adapter(gpu: Any) -> None:
    flashmla = gpu.flashmla(sinks=False)
    gpu.cudnn()
    x = _inputs(SHAPES["v4_k_eq_v_sinks"], 2)
    got = _run(x, "flashmla")
    _assert_matches(got, _reference(x), bf16=2e-2)  # the factor is applied to the bfloat16 output
    assert flashmla.calls[0]["attn_sink"] is False


def test_flashmla_backward_falls_back_to_triton_with_the_contract_lse(gpu: Any) -> None:
    gpu.flashmla()
    calls = gpu.triton(forward=False)
    x = _inputs(SHAPES["v4_k_eq_v_sinks"], 3)
    assert attention_module._flashmla_backward(x["q"], x["kv"], x["indices"], x["sinks"], 512)[0] == "triton"
    got = _run(x, "flashmla")
    want = _reference(x)
    _assert_matches(got, want)
    assert len(calls) == 1
    assert bool(torch.isneginf(calls[0]["lse"][1]).all())  # FlashMLA's +inf handed on as the contract's -inf


def test_flashmla_without_a_backward_is_refused(gpu: Any) -> None:
    gpu.flashmla()
    x = _inputs(SHAPES["v4_k_eq_v_sinks"], 4)
    reason = sparse_attention_backends(x["q"], x["kv"], x["indices"], x["sinks"])["flashmla"]
    assert reason is not None and "no backward" in reason and "triton refused" in reason
    with pytest.raises(ValueError, match="backend 'flashmla' cannot take this input: no backward"):
        sparse_attention(x["q"], x["kv"], x["indices"], x["scale"], sinks=x["sinks"], backend="flashmla")


@pytest.mark.parametrize("shape", ["v4_k_eq_v_sinks", "v32_576_512"])
def test_cudnn_backward_after_triton_forward_equals_the_reference(gpu: Any, shape: str) -> None:
    cudnn = gpu.cudnn()
    gpu.triton()
    x = _inputs(SHAPES[shape], 5)
    assert sparse_attention_backend(x["q"], x["kv"], x["indices"], x["sinks"], value_dim=x["value"]) == "cudnn"
    _assert_matches(_run(x, "cudnn"), _reference(x))
    assert len(cudnn.calls) == 1


def test_empty_inputs_call_no_library(gpu: Any) -> None:
    flashmla, cudnn = gpu.flashmla(), gpu.cudnn()
    x = _inputs(SHAPES["v4_k_eq_v_sinks"], 6)
    x["indices"] = x["indices"][:, :0]
    got = _run(x, "flashmla")
    assert not flashmla.calls and not cudnn.calls
    assert float(got["out"].abs().max()) == 0 and bool(torch.isneginf(got["lse"]).all())
    assert float(got["dq"].abs().max()) == 0 and float(got["dsinks"].abs().max()) == 0


@pytest.mark.parametrize("module", [_attention_flashmla, _attention_cudnn])
def test_support_checks_refuse_what_the_libraries_do_not_take(gpu: Any, module: Any) -> None:
    x = _inputs(SHAPES["v4_k_eq_v_sinks"], 7)
    q, kv, ids, sinks = x["q"], x["kv"], x["indices"], x["sinks"]
    assert "does not import" in module.supports(q, kv, ids, sinks)
    gpu.flashmla()
    gpu.cudnn()
    assert module.supports(q, kv, ids, sinks) is None
    assert module.supports(q, kv, ids, sinks, 512) is None
    for capability in ((9, 0), (10, 0), (10, 3)):
        gpu.capability = capability
        assert module.supports(q, kv, ids, sinks) is None, capability
    for capability in ((8, 0), (8, 9), (9, 1), (12, 0)):
        gpu.capability = capability
        assert f"sm_{capability[0]}{capability[1]}" in module.supports(q, kv, ids, sinks)
    gpu.capability = (9, 0)
    assert "bfloat16" in module.supports(q.float(), kv.float(), ids, sinks)
    assert "heads" in module.supports(q[:, :32], kv, ids, sinks[:32])
    assert "qk_dim 256" in module.supports(q[..., :256], kv[:, :256], ids, sinks)
    assert "value_dim 256" in module.supports(q, kv, ids, sinks, 256)
    assert "int32" in module.supports(q, kv, ids.long(), sinks)
    with pytest.MonkeyPatch.context() as patch:  # the real device check: CPU tensors are refused
        patch.setattr(_attention_library, "device_type", lambda tensor: tensor.device.type)
        assert "not a CUDA device" in module.supports(q, kv, ids, sinks)


def test_the_pick_falls_through_in_order_and_is_logged_once(gpu: Any, caplog: pytest.LogCaptureFixture) -> None:
    x = _inputs(SHAPES["v4_k_eq_v_sinks"], 8)
    args = (x["q"], x["kv"], x["indices"], x["sinks"])
    caplog.set_level(logging.INFO, logger="sparsecp.attention")
    assert sparse_attention_backend(*args) == "torch"           # nothing installed, Triton refused
    reasons = sparse_attention_backends(*args)
    assert "does not import" in reasons["flashmla"] and "does not import" in reasons["cudnn"]
    gpu.triton()
    assert sparse_attention_backend(*args) == "triton"
    gpu.cudnn()
    assert sparse_attention_backend(*args) == "cudnn"
    gpu.flashmla()
    assert sparse_attention_backend(*args) == "flashmla"
    assert sparse_attention_backend(*args, value_dim=256) == "triton"   # FlashMLA and cuDNN take values of 512
    gpu.capability = (8, 0)
    assert sparse_attention_backend(*args) == "triton"
    assert sparse_attention_backend(x["q"].float(), x["kv"].float(), x["indices"], x["sinks"]) == "triton"
    picks = [r.getMessage() for r in caplog.records if r.name == "sparsecp.attention"]
    assert [re.search(r"takes '(\w+)'", m).group(1) for m in picks] == [  # type: ignore[union-attr]
        "torch", "triton", "cudnn", "flashmla"]
    assert "backward cudnn" in picks[3] and "not taken: flashmla:" in picks[1]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "sparsecp.attention")


def test_an_asked_for_library_backend_that_cannot_take_the_input_says_why(gpu: Any) -> None:
    x = _inputs(SHAPES["v4_k_eq_v_sinks"], 9)
    with pytest.raises(ValueError, match="backend 'cudnn' cannot take this input: .*does not import"):
        sparse_attention(x["q"], x["kv"], x["indices"], x["scale"], backend="cudnn")
    gpu.cudnn()
    gpu.flashmla()
    with pytest.raises(ValueError, match="backend 'flashmla' cannot take this input: value_dim 256"):
        sparse_attention(x["q"], x["kv"], x["indices"], x["scale"], value_dim=256, backend="flashmla")
