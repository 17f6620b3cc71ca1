"""sparsecp.torch.sparse_attention: every CPU backend against the float64 reference on awkward shapes
(no row, every id -1, one column, a key listed twice, -inf and large sinks, value_dim < qk_dim, 64
heads), float64 gradcheck, opcheck of the custom op, torch.compile(fullgraph=True) against eager,
the key gradient across thread counts, and the errors."""
from __future__ import annotations

import os

import pytest
import torch

from sparsecp.torch import attention as attention_module
from sparsecp.torch._attention_reference import reference_sparse_attention
from sparsecp.torch.attention import (
    sparse_attention,
    sparse_attention_backend,
    sparse_attention_backends,
    sparse_attention_gemm,
)

SEED = int(os.environ.get("SPARSECP_TEST_SEED", "20261130"))  # fixed by default; any seed must pass
print(f"test_attention seed {SEED} (SPARSECP_TEST_SEED={SEED} reruns it)")

# (rows, heads, qk_dim, value_dim, keys, columns, sinks): "none", a float tensor, or "-inf" / "large"
SHAPES = [
    (0, 2, 8, 8, 5, 3, "random"),
    (1, 1, 1, 1, 1, 1, None),
    (7, 3, 13, 5, 11, 4, "random"),
    (5, 2, 16, 16, 9, 1, "-inf"),
    (6, 4, 24, 24, 17, 7, "large"),
    (3, 64, 8, 8, 19, 5, "random"),
    (4, 2, 8, 8, 0, 3, "random"),
]


def make(shape: tuple, dtype: torch.dtype, salt: int) -> dict:
    rows, heads, qk, value, keys, columns, sinks = shape
    g = torch.Generator().manual_seed(SEED + salt)
    q = torch.randn(rows, heads, qk, generator=g, dtype=torch.float64).to(dtype)
    kv = torch.randn(keys, qk, generator=g, dtype=torch.float64).to(dtype)
    indices = torch.randint(-1, max(keys, 1), (rows, columns), generator=g, dtype=torch.int32)
    if keys == 0:
        indices.fill_(-1)
    if rows > 1:
        indices[0] = -1  # a row that sees nothing
    if rows > 2 and columns > 1 and keys > 0:
        indices[1, :2] = 0  # a key listed twice
    sink = None
    if sinks == "random":
        sink = torch.randn(heads, generator=g)
    elif sinks == "-inf":
        sink = torch.full((heads,), float("-inf"))
    elif sinks == "large":
        sink = torch.full((heads,), 30.0)
    grad = torch.randn(rows, heads, value, generator=g, dtype=torch.float64).to(dtype)
    return {"q": q, "kv": kv, "indices": indices, "sinks": sink, "value_dim": value, "grad": grad,
            "scale": qk ** -0.5}


def run(x: dict, backend: str | None, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
    """(out, lse, grad q, grad kv, grad sinks or None), differentiated with x's output gradient."""
    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    q = cast(x["q"]).clone().requires_grad_()
    kv = cast(x["kv"]).clone().requires_grad_()
    sinks = None if x["sinks"] is None else x["sinks"].clone().requires_grad_()
    if backend == "reference":
        out, lse = reference_sparse_attention(q, kv, x["indices"], x["scale"], x["value_dim"], sinks)
    else:
        out, lse = sparse_attention(q, kv, x["indices"], x["scale"], value_dim=x["value_dim"], sinks=sinks,
                                    return_lse=True, backend=backend)
    leaves = [t for t in (q, kv, sinks) if t is not None]
    grads = torch.autograd.grad(out, leaves, cast(x["grad"]), allow_unused=True) if out.numel() else \
        [torch.zeros_like(t) for t in leaves]
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]
    return (out, lse, grads[0], grads[1], grads[2] if sinks is not None else None)


def relative(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None or b is None:
        assert a is None and b is None
        return 0.0
    a, b = a.detach().double(), b.detach().double()
    inf = torch.isinf(b)
    assert torch.equal(a[inf], b[inf]), "-inf entries differ"
    a, b = a[~inf], b[~inf]
    # Relative to the reference's norm, and to 1 where the reference is (analytically) zero: a row
    # whose only column has probability 1 has a logit gradient of exactly 0, left as rounding noise.
    return float((a - b).norm() / b.norm().clamp_min(1.0)) if a.numel() else 0.0


TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"rows{s[0]}-heads{s[1]}-cols{s[5]}-sinks{s[6]}" for s in SHAPES])
def test_every_backend_equals_the_reference(shape: tuple, dtype: torch.dtype, backend: str) -> None:
    x = make(shape, dtype, salt=hash((shape, str(dtype))) % 1000)
    got = run(x, backend)
    want = run(x, "reference")
    tol = TOLERANCE[dtype]
    if backend == "torch" and dtype == torch.bfloat16:
        tol = 6e-2  # the torch path's products and logit gradient are bf16, as the model's eager path
    for name, a, b in zip(("out", "lse", "grad q", "grad kv", "grad sinks"), got, want):
        bound = 1e-5 if name == "lse" and dtype == torch.float32 else tol
        assert relative(a, b) <= bound, (name, relative(a, b), backend, dtype, shape, SEED)
    assert got[0].dtype == dtype and got[1].dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


def test_rows_with_no_key_output_zeros() -> None:
    x = make((4, 3, 8, 8, 6, 5, "random"), torch.float32, 1)
    x["indices"].fill_(-1)
    out, lse, dq, dkv, dsinks = run(x, "cpu")
    assert torch.equal(out, torch.zeros_like(out)) and bool(torch.isneginf(lse).all())
    assert not dq.any() and not dkv.any() and dsinks is not None and not dsinks.any()


def test_float64_gradcheck_of_the_kernel() -> None:
    x = make((5, 3, 6, 4, 7, 4, "random"), torch.float64, 2)
    q = x["q"].requires_grad_()
    kv = x["kv"].requires_grad_()
    sinks = x["sinks"].double().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b, c: sparse_attention(a, b, x["indices"], 0.7, value_dim=4, sinks=c, backend="cpu"),
        (q, kv, sinks))


def test_the_custom_op_passes_opcheck() -> None:
    x = make((6, 2, 8, 8, 9, 3, "random"), torch.float32, 3)
    q, kv = x["q"].requires_grad_(), x["kv"].requires_grad_()
    torch.library.opcheck(torch.ops.sparsecp.sparse_attention.default, (q, kv, x["indices"], x["sinks"], 0.5, 8, 0))
    torch.library.opcheck(torch.ops.sparsecp.sparse_attention.default, (q, kv, x["indices"], None, 0.5, 6, 0))


def test_compiled_fullgraph_equals_eager() -> None:
    x = make((9, 4, 16, 12, 13, 5, "random"), torch.float32, 4)

    def step(q: torch.Tensor, kv: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        return (sparse_attention(q, kv, x["indices"], 0.25, value_dim=12, sinks=sinks, backend="cpu") * 2).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    leaves = [x["q"].clone().requires_grad_(), x["kv"].clone().requires_grad_(), x["sinks"].clone().requires_grad_()]
    eager = [t.detach().clone().requires_grad_() for t in leaves]
    got = compiled(*leaves)
    want = step(*eager)
    got.backward()
    want.backward()
    assert torch.equal(got, want)
    for a, b in zip(leaves, eager):
        assert torch.equal(a.grad, b.grad)


def test_the_key_gradient_does_not_depend_on_threads() -> None:
    x = make((33, 8, 24, 24, 11, 9, "random"), torch.float32, 5)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(x, "cpu")
        torch.set_num_threads(2)
        two = run(x, "cpu")
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, two):
        assert a is None and b is None or torch.equal(a, b)


def test_backends_say_why_they_cannot_take_an_input() -> None:
    x = make((3, 2, 8, 8, 5, 2, None), torch.float32, 6)
    found = sparse_attention_backends(x["q"], x["kv"], x["indices"])
    assert found["cpu"] is None and found["torch"] is None
    if os.environ.get("TRITON_INTERPRET") != "1":
        assert found["triton"] is not None  # CPU tensors need the interpreter
        with pytest.raises(ValueError, match="backend 'triton' cannot take this input"):
            sparse_attention(x["q"], x["kv"], x["indices"], 1.0, backend="triton")
    assert sparse_attention_backend(x["q"], x["kv"], x["indices"]) == "cpu"
    half = x["q"].half()
    assert sparse_attention_backend(half, x["kv"].half(), x["indices"]) == "torch"  # the kernel takes no fp16
    assert sparse_attention_gemm(torch.float64) == "blas"
    assert sparse_attention_gemm(torch.bfloat16).split()[0] in ("onednn", "blas")
    # float32 with 1, 2, 4 or 8 heads on AVX-512 and AVX2: the kernel's direct loops; a library
    # on the portable ISA and for other head counts
    import sparsecp

    vector_isa = sparsecp.kernel_isa() in ("avx512", "avx2")
    few = "direct" if vector_isa else sparse_attention_gemm(torch.float32)
    assert [sparse_attention_gemm(torch.float32, heads) for heads in (1, 2, 4, 8)] == [few] * 4
    assert sparse_attention_gemm(torch.float32, 3) == sparse_attention_gemm(torch.float32, 64) == \
        sparse_attention_gemm(torch.float32)
    assert sparse_attention_gemm(torch.bfloat16, 4) == sparse_attention_gemm(torch.bfloat16)
    with pytest.raises(ValueError, match="heads must be a positive int or None, got 0"):
        sparse_attention_gemm(torch.float32, 0)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_errors_name_the_argument(backend: str) -> None:
    x = make((3, 2, 8, 8, 5, 2, None), torch.float32, 7)
    q, kv, ids = x["q"], x["kv"], x["indices"]
    bad = ids.clone()
    bad[2, 1] = 5
    with pytest.raises(ValueError, match=r"index 5 at row 2, column 1 is out of range \[-1, 5\)"):
        sparse_attention(q, kv, bad, 1.0, backend=backend)
    bad[2, 1] = -2
    with pytest.raises(ValueError, match=r"index -2 at row 2, column 1"):
        sparse_attention(q, kv, bad, 1.0, backend=backend)
    with pytest.raises(ValueError, match="indices must be int32, got torch.int64"):
        sparse_attention(q, kv, ids.long(), 1.0, backend=backend)
    with pytest.raises(ValueError, match=r"kv must be \[keys, qk_dim=8\]"):
        sparse_attention(q, kv[:, :4], ids, 1.0, backend=backend)
    with pytest.raises(ValueError, match=r"value_dim must be in \[1, qk_dim=8\], got 9"):
        sparse_attention(q, kv, ids, 1.0, value_dim=9, backend=backend)
    with pytest.raises(ValueError, match="scale must be finite, got nan"):
        sparse_attention(q, kv, ids, float("nan"), backend=backend)
    with pytest.raises(ValueError, match=r"sinks must be \[heads=2\]"):
        sparse_attention(q, kv, ids, 1.0, sinks=torch.zeros(3), backend=backend)
    with pytest.raises(ValueError, match="one floating dtype"):
        sparse_attention(q, kv.double(), ids, 1.0, backend=backend)
    with pytest.raises(ValueError, match="chunk_bytes must be a positive integer"):
        sparse_attention(q, kv, ids, 1.0, backend=backend, chunk_bytes=0)
    with pytest.raises(ValueError, match="backend must be one of cpu, flashmla, cudnn, triton, torch"):
        sparse_attention(q, kv, ids, 1.0, backend="cuda")


def test_select_gemm_names_the_selections_bf16_products(monkeypatch: pytest.MonkeyPatch) -> None:
    import sparsecp

    name = sparsecp.select_gemm()
    assert name in ("vdpbf16ps", "widened") or name.startswith("onednn "), name
    monkeypatch.setenv("SPARSECP_SELECT_GEMM", "native")  # read at each call
    own = sparsecp.select_gemm()
    assert own in ("vdpbf16ps", "widened"), own
    monkeypatch.setenv("SPARSECP_SELECT_GEMM", "onednn")
    forced = sparsecp.select_gemm()
    # oneDNN where it has optimised bf16 products on the avx512 ISA, else the kernel's own
    assert forced == own or forced == sparsecp.attention_gemm("bfloat16"), forced
    assert name in (own, forced), name
    monkeypatch.setenv("SPARSECP_SELECT_GEMM", "amx")
    with pytest.raises(ValueError, match="SPARSECP_SELECT_GEMM must be onednn or native, got 'amx'"):
        sparsecp.select_gemm()
    monkeypatch.setenv("SPARSECP_SELECT_GEMM", "native")
    monkeypatch.setenv("SPARSECP_ISA", "portable")
    assert sparsecp.select_gemm() == "widened"


def test_the_library_is_named_beside_the_kernel_isa() -> None:
    import sparsecp

    assert sparsecp.attention_gemm("float64") == "blas"
    for dtype in ("float32", "bfloat16"):
        assert sparsecp.attention_gemm(dtype).split()[0] in ("onednn", "blas")
    assert sparsecp.attention_gemm("bfloat16") == sparse_attention_gemm(torch.bfloat16)
    vector_isa = sparsecp.kernel_isa() in ("avx512", "avx2")
    assert sparsecp.attention_gemm("float32", heads=4) == ("direct" if vector_isa
                                                            else sparsecp.attention_gemm("float32"))
    with pytest.raises(ValueError, match="dtype must be 'float32', 'bfloat16' or 'float64', got 'half'"):
        sparsecp.attention_gemm("half")


def test_module_lists_its_backends() -> None:
    assert attention_module.BACKENDS == ("cpu", "flashmla", "cudnn", "triton", "torch")
