"""DeepSeek-V4's interleaved RoPE in fewer passes (``models/deepseek_v4/_rope.py``) against the
model's ``apply_rotary_pos_emb``: the same values forward and backward, rounding for rounding."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers.models.deepseek_v4", reason="transformers >= 5.23 (DeepseekV4) not installed")

from transformers.models.deepseek_v4 import modeling_deepseek_v4 as modeling  # noqa: E402

from sparsecp.models.deepseek_v4._rope import InterleavedRope  # noqa: E402

SEED = 20261206


def _run(rope: object, x0: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, grad_seed: int,
         transposed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    batch, length, width = x0.shape
    x = x0.clone().requires_grad_()
    view = x.view(batch, length, heads, width // heads)
    view = view.transpose(1, 2) if transposed else view.permute(0, 2, 1, 3).contiguous()
    y = rope(view, cos, sin)  # type: ignore[operator]
    y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(grad_seed)))
    assert x.grad is not None
    return y.detach(), x.grad


# (batch, rows, heads, head_dim, rope_dim): the indexer's 32 x 64 all-rope heads, attention heads
# with untouched leading channels, one head, odd pair counts.
SHAPES = [(1, 64, 32, 64, 64), (1, 37, 3, 10, 6), (2, 5, 1, 8, 8), (1, 9, 4, 130, 64), (1, 1, 2, 2, 2)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("transposed", [True, False])
def test_equals_the_models_rope_forward_and_backward(shape: tuple[int, ...], transposed: bool) -> None:
    batch, rows, heads, head_dim, rope_dim = shape
    print(f"seed {SEED}")
    g = torch.Generator().manual_seed(SEED)
    x0 = torch.randn(batch, rows, heads * head_dim, generator=g) * 3
    x0.view(-1)[::7] = 0.0  # zeros: their products keep their signs in both
    cos, sin = torch.randn(batch, rows, rope_dim // 2, generator=g), torch.randn(batch, rows, rope_dim // 2,
                                                                                  generator=g)
    want = _run(modeling.apply_rotary_pos_emb, x0, cos, sin, heads, 5, transposed)
    fast = InterleavedRope(modeling.apply_rotary_pos_emb)
    got = _run(fast, x0, cos, sin, heads, 5, transposed)
    assert torch.equal(got[0], want[0]), "forward"
    assert torch.equal(got[1], want[1]), "backward"
    # the conjugate rotation (the attention output's rope(x, cos, -sin)) too
    assert torch.equal(_run(fast, x0, cos, -sin, heads, 6, transposed)[1],
                       _run(modeling.apply_rotary_pos_emb, x0, cos, -sin, heads, 6, transposed)[1])


def test_non_finite_values_stay_where_the_model_puts_them() -> None:
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(1, 2, 6, 8, generator=g)
    x[0, 1, 3, 5] = float("nan")
    x[0, 0, 2, 0] = float("inf")
    cos, sin = torch.randn(1, 6, 3, generator=g), torch.randn(1, 6, 3, generator=g)
    want = modeling.apply_rotary_pos_emb(x, cos, sin)
    got = InterleavedRope(modeling.apply_rotary_pos_emb)(x, cos, sin)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = ~torch.isnan(want)
    assert torch.equal(got[finite], want[finite])


def test_other_inputs_take_the_models_function() -> None:
    calls: list[torch.dtype] = []

    def model_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1) -> torch.Tensor:
        calls.append(x.dtype)
        return modeling.apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim)

    fast = InterleavedRope(model_rope)
    cos, sin = torch.randn(1, 4, 2), torch.randn(1, 4, 2)
    fast(torch.randn(1, 2, 4, 4, dtype=torch.float64), cos.double(), sin.double())  # float64
    fast(torch.randn(1, 2, 4, 4).bfloat16(), cos, sin)  # bf16 x
    fast(torch.randn(1, 2, 4, 4), cos.requires_grad_(), sin)  # a rotary table that wants a gradient
    assert calls == [torch.float64, torch.bfloat16, torch.float32]
    fast(torch.randn(1, 2, 4, 4), cos.detach(), sin)
    assert len(calls) == 3  # float32 with plain tables: the fast path
    with pytest.raises(RuntimeError):  # a shape the model rejects is rejected by the model's function
        fast(torch.randn(1, 2, 5, 4), cos.detach(), sin)


@pytest.mark.parametrize("batches", [(1, 3), (3, 1)])
def test_tables_of_different_batches_equal_the_models_rope(batches: tuple[int, int]) -> None:
    """cos with one batch and sin with every batch (or the reverse) broadcast as the model's
    function broadcasts them: no table is read past its end or in place of the other's batch."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(3, 2, 5, 8, generator=g)
    cos, sin = torch.randn(batches[0], 5, 4, generator=g), torch.randn(batches[1], 5, 4, generator=g)
    want = modeling.apply_rotary_pos_emb(x, cos, sin)
    assert torch.equal(InterleavedRope(modeling.apply_rotary_pos_emb)(x, cos, sin), want)


def test_the_kernel_rejects_tables_of_different_shapes() -> None:
    from sparsecp import _core

    x, out = torch.randn(3, 2, 5, 8), torch.empty(3, 2, 5, 8)
    with pytest.raises(ValueError, match=r"cos and sin must have the same shape, got \[1, 5, 4\] and \[3, 5, 4\]"):
        _core.interleaved_rope(x, torch.randn(1, 5, 4), torch.randn(3, 5, 4), out)


def test_the_kernel_rejects_an_out_that_overlaps_and_takes_one_in_place() -> None:
    from sparsecp import _core

    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(1, 4, 5, 8, generator=g)
    cos, sin = torch.randn(1, 5, 4, generator=g), torch.randn(1, 5, 4, generator=g)
    message = "interleaved rope out must not overlap itself, nor its memory span cos's, sin's or x's"
    with pytest.raises(ValueError, match=message):  # every head written to the same memory
        _core.interleaved_rope(x, cos, sin, torch.empty(1, 1, 5, 8).expand(1, 4, 5, 8))
    buffer = torch.randn(240, generator=g)
    with pytest.raises(ValueError, match=message):  # out half over x
        _core.interleaved_rope(buffer[:160].view(1, 4, 5, 8), cos, sin, buffer[80:].view(1, 4, 5, 8))
    with pytest.raises(ValueError, match=message):  # out over cos
        _core.interleaved_rope(x, buffer[100:120].view(1, 5, 4), sin, buffer[:160].view(1, 4, 5, 8))
    want = modeling.apply_rotary_pos_emb(x, cos, sin)
    y = x.clone()
    _core.interleaved_rope(y, cos, sin, y)  # in place, with x's own strides
    assert torch.equal(y, want)


def test_a_second_derivative_raises_instead_of_dropping_the_rope() -> None:
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(1, 2, 5, 8, generator=g, requires_grad=True)
    cos, sin = torch.randn(1, 5, 4, generator=g), torch.randn(1, 5, 4, generator=g)
    y = InterleavedRope(modeling.apply_rotary_pos_emb)(x, cos, sin)
    (grad,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()
