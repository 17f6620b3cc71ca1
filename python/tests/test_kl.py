"""shared_compressed_indexer_kl_loss: gradcheck in float64 (the torch path), the fused CPU
kernel against the torch path (what other devices run) and the C++ double-precision
reference on random inputs of awkward shapes (1, primes, empty rows, duplicate ids, -1
padding, a compact bank), autograd wiring (which inputs get gradients, scaling by the
incoming gradient, loss_coeff 0), zero copy, determinism, and the seed's error texts."""
from __future__ import annotations

import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import sparsecp  # noqa: E402
import sparsecp.torch as sct  # noqa: E402
from sparsecp.torch import kl as kl_module  # noqa: E402

SEED = int(os.environ.get("SPARSECP_TEST_SEED", "20261201"))
KL = sct.shared_compressed_indexer_kl_loss


@pytest.fixture
def torch_path(monkeypatch):
    """Run CPU tensors through the chunked torch implementation."""
    monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")


def make_inputs(seed: int, batch: int = 2, rows: int = 7, heads: int = 3, head_dim: int = 5, att_heads: int = 2,
                att_dim: int = 6, keys: int = 11, topk: int = 13, offset: int = 0, extra_keys: int = 2,
                dtype: torch.dtype = torch.float32, ids_dtype: torch.dtype = torch.int64) -> dict:
    """Random inputs: merge weights small enough that the student is not saturated, 20%
    padding, 10% duplicated ids, 10% empty rows; ids name rows [offset, offset + keys)."""
    print(f"inputs from seed {seed}")
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return ((torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1) * scale).to(dtype)

    ids = torch.randint(0, keys, (batch, rows, topk), generator=generator) + offset
    ids[torch.rand(batch, rows, topk, generator=generator) < 0.2] = -1
    duplicate = torch.rand(batch, rows, topk, generator=generator) < 0.1
    ids[..., 1:][duplicate[..., 1:]] = ids[..., :-1][duplicate[..., 1:]]
    ids[torch.rand(batch, rows, generator=generator) < 0.1] = -1
    return dict(
        index_query=rand(batch, rows, heads, head_dim),
        index_key=rand(batch, offset + keys + extra_keys, head_dim),
        merge_weight=rand(batch, rows, heads, scale=4.0 / (heads * head_dim) ** 0.5),
        attention_query=rand(batch, att_heads, rows, att_dim),
        compressed_key=rand(batch, keys, att_dim),
        topk_indices=ids.to(ids_dtype),
        sinks=rand(att_heads, scale=2.0),
        main_key_offset=offset,
        attention_scale=att_dim ** -0.5,
    )


def run(inputs: dict, loss_coeff: float = 1.0, grad_scale: float = 1.0, kl: Any = KL, **extra) -> tuple:
    """Loss and the gradients autograd gives the three student inputs (``kl``: the entry point)."""
    leaves = {name: inputs[name].detach().clone().requires_grad_() for name in
              ("index_query", "index_key", "merge_weight")}
    args = {**inputs, **leaves}
    loss = kl(args["index_query"], args["index_key"], args["merge_weight"], args["attention_query"],
              args["compressed_key"], args["topk_indices"], args["sinks"], attention_scale=args["attention_scale"],
              loss_coeff=loss_coeff, main_key_offset=args["main_key_offset"], **extra)
    (loss * grad_scale).backward()
    return loss.detach(), leaves["index_query"].grad, leaves["index_key"].grad, leaves["merge_weight"].grad


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    norm = float(b.double().norm())
    diff = float((a.double() - b.double()).norm())
    return diff / norm if norm else diff


def core_reference(inputs: dict, loss_coeff: float = 1.0) -> tuple:
    """The C++ double-precision reference (kernels/indexer_kl.hpp indexer_kl_loss_reference)."""
    grads = [torch.empty(inputs[name].shape, dtype=torch.float32) for name in
             ("index_query", "index_key", "merge_weight")]
    loss = sparsecp._core.indexer_kl_loss(
        *(inputs[name].contiguous() for name in ("index_query", "index_key", "merge_weight", "attention_query",
                                                 "compressed_key", "topk_indices", "sinks")),
        *grads, inputs["attention_scale"], loss_coeff, inputs["main_key_offset"], reference=True)
    return (torch.tensor(loss), *grads)


GRADCHECK_SHAPES = [
    # batch, rows, heads, head_dim, att_heads, att_dim, keys, topk, offset
    (1, 1, 1, 1, 1, 1, 1, 1, 0),
    (2, 5, 2, 3, 2, 4, 7, 9, 0),
    (1, 4, 3, 2, 1, 3, 5, 5, 3),
    (2, 3, 1, 4, 3, 2, 6, 8, 2),
]


@pytest.mark.parametrize("shape", GRADCHECK_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gradcheck_float64(shape):
    """torch.autograd.gradcheck (central differences, float64) of the loss in index_query,
    index_key and merge_weight; float64 inputs take the torch path."""
    batch, rows, heads, head_dim, att_heads, att_dim, keys, topk, offset = shape
    seed = SEED + sum(shape) * 7
    print(f"seed {seed}")
    inputs = make_inputs(seed, batch, rows, heads, head_dim, att_heads, att_dim, keys, topk, offset,
                         dtype=torch.float64)
    inputs["merge_weight"] = inputs["merge_weight"] * 3  # a less flat student

    def loss(q, k, w):
        return KL(q, k, w, inputs["attention_query"], inputs["compressed_key"], inputs["topk_indices"],
                  inputs["sinks"], attention_scale=inputs["attention_scale"], loss_coeff=1.7,
                  main_key_offset=offset)

    leaves = [inputs[n].clone().requires_grad_() for n in ("index_query", "index_key", "merge_weight")]
    assert loss(*leaves).dtype == torch.float64
    assert torch.autograd.gradcheck(loss, leaves, eps=1e-6, atol=1e-8, rtol=1e-6)


def test_finite_differences_cover_every_student_input():
    """Hand-rolled central differences on a few coordinates (gradcheck's inputs can hide a
    zero gradient: here each checked coordinate has a non-zero derivative)."""
    seed = SEED + 5
    print(f"seed {seed}")
    inputs = make_inputs(seed, 1, 6, 2, 3, 2, 4, 7, 9, 1, dtype=torch.float64)
    loss, *grads = run(inputs, loss_coeff=2.0)
    for name, grad in zip(("index_query", "index_key", "merge_weight"), grads):
        flat = grad.flatten()
        for index in torch.argsort(flat.abs(), descending=True)[:3].tolist():
            moved = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
            eps = 1e-6
            moved[name].view(-1)[index] += eps
            up = run(moved, loss_coeff=2.0)[0]
            moved[name].view(-1)[index] -= 2 * eps
            down = run(moved, loss_coeff=2.0)[0]
            numeric = float((up - down) / (2 * eps))
            assert abs(numeric - float(flat[index])) <= 1e-6 * max(1.0, abs(numeric)), (name, index)
            assert abs(numeric) > 1e-6


CASES = [
    # batch, rows, heads, head_dim, att_heads, att_dim, keys, topk, offset
    (1, 1, 1, 1, 1, 1, 1, 1, 0),
    (1, 7, 3, 5, 2, 6, 11, 13, 0),
    (2, 13, 4, 16, 3, 17, 31, 37, 5),
    (3, 29, 2, 32, 5, 64, 97, 97, 0),
    (1, 61, 8, 64, 4, 96, 600, 512, 7),  # K >= 512: TopK must be 512
    (2, 0, 2, 8, 2, 8, 5, 5, 0),  # no rows
]


@pytest.mark.parametrize("case", CASES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_fused_cpu_kernel_equals_torch_path_and_reference(case, dtype, ids_dtype, monkeypatch):
    batch, rows, heads, head_dim, att_heads, att_dim, keys, topk, offset = case
    seed = SEED + 31 * sum(case) + (dtype == torch.bfloat16) + 2 * (ids_dtype == torch.int32)
    print(f"seed {seed}")
    inputs = make_inputs(seed, batch, rows, heads, head_dim, att_heads, att_dim, keys, topk, offset, dtype=dtype,
                         ids_dtype=ids_dtype)
    fused = run(inputs, loss_coeff=0.9)
    monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")
    torch_result = run(inputs, loss_coeff=0.9)
    monkeypatch.delenv("SPARSECP_TORCH_PATH")
    reference = core_reference(inputs, loss_coeff=0.9)
    for got in (fused, torch_result):
        assert got[0].dtype == torch.float32
        assert [g.dtype for g in got[1:]] == [dtype] * 3
        assert [g.shape for g in got[1:]] == [inputs[n].shape for n in ("index_query", "index_key", "merge_weight")]
    # fp32 math in both (bf16 inputs are widened exactly); bf16 gradients are rounded once.
    tolerance = 2e-5 if dtype == torch.float32 else 8e-3
    for got, want, what in ((fused, torch_result, "fused vs torch"), (fused, reference, "fused vs reference"),
                            (torch_result, reference, "torch vs reference")):
        assert abs(float(got[0]) - float(want[0])) <= 1e-5 * max(1e-3, abs(float(want[0]))), what
        for g, w in zip(got[1:], want[1:]):
            assert relative(g, w) <= tolerance, what
    if rows and keys > 1:  # one key: teacher and student both put all mass on it
        assert float(fused[0]) > 0
    if offset:  # rows of the bank outside the compact view get exactly zero gradient
        assert not fused[2][:, :offset].any() and not fused[2][:, offset + keys:].any()


def test_float64_torch_path_matches_fused_kernel():
    """The float64 path (gradcheck's) computes what the fused fp32 kernel computes."""
    seed = SEED + 17
    print(f"seed {seed}")
    inputs = make_inputs(seed, 2, 19, 4, 16, 3, 24, 40, 48, 3)
    fused = run(inputs)
    double = run({k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                  for k, v in inputs.items()})
    assert double[0].dtype == torch.float64 and double[1].dtype == torch.float64
    assert abs(float(fused[0]) - float(double[0])) <= 1e-6 * float(double[0])
    for g, w in zip(fused[1:], double[1:]):
        assert relative(g, w) <= 1e-5


@pytest.mark.parametrize("path", ["fused", "torch"])
def test_gradients_go_to_the_student_only_and_scale_with_the_incoming_gradient(path, monkeypatch):
    if path == "torch":
        monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")
    inputs = make_inputs(SEED + 7)
    teacher = {n: inputs[n].clone().requires_grad_() for n in ("attention_query", "compressed_key", "sinks")}
    student = {n: inputs[n].clone().requires_grad_() for n in ("index_query", "index_key", "merge_weight")}
    loss = KL(student["index_query"], student["index_key"], student["merge_weight"], teacher["attention_query"],
              teacher["compressed_key"], inputs["topk_indices"], teacher["sinks"],
              attention_scale=inputs["attention_scale"], loss_coeff=1.0)
    assert loss.requires_grad and loss.shape == ()
    (loss * 2.5).backward()
    assert all(t.grad is None for t in teacher.values())
    base = run(inputs)
    for name, want in zip(("index_query", "index_key", "merge_weight"), base[1:]):
        torch.testing.assert_close(student[name].grad, want * 2.5, rtol=1e-6, atol=0)
    # Only some student inputs require a gradient: the others get none, nothing fails.
    q = inputs["index_query"].clone().requires_grad_()
    grad_q, = torch.autograd.grad(KL(q, inputs["index_key"], inputs["merge_weight"], inputs["attention_query"],
                                     inputs["compressed_key"], inputs["topk_indices"], inputs["sinks"],
                                     attention_scale=inputs["attention_scale"], loss_coeff=1.0), q)
    torch.testing.assert_close(grad_q, base[1], rtol=0, atol=0)


@pytest.mark.parametrize("path", ["fused", "torch"])
def test_zero_loss_coeff_gives_zero_loss_and_gradients(path, monkeypatch):
    if path == "torch":
        monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")
    inputs = make_inputs(SEED + 8)
    inputs["topk_indices"] = inputs["topk_indices"].clone()
    inputs["topk_indices"][0, 0, 0] = 10 ** 6  # ids are not inspected when nothing is computed
    loss, *grads = run(inputs, loss_coeff=0.0)
    assert float(loss) == 0.0 and all(not g.any() for g in grads)


def test_fused_path_reads_inputs_in_place_and_is_deterministic(monkeypatch):
    inputs = make_inputs(SEED + 9, 2, 33, 4, 32, 3, 40, 50, 64, 0, dtype=torch.bfloat16, ids_dtype=torch.int32)
    names = ("index_query", "index_key", "merge_weight", "attention_query", "compressed_key", "topk_indices", "sinks")
    seen = []
    original = sparsecp._core.indexer_kl_loss

    def spy(*args, **kwargs):
        seen.append([sparsecp._core.array_address(a) for a in args[:7]])
        return original(*args, **kwargs)

    monkeypatch.setattr(sparsecp._core, "indexer_kl_loss", spy)
    KL(*(inputs[n] for n in names), attention_scale=1.0, loss_coeff=1.0)
    assert seen[0] == [inputs[n].data_ptr() for n in names]
    one = run(inputs, threads=1)
    two = run(inputs, threads=2)
    three = run(inputs, threads=3)
    for a, b in ((one, two), (one, three)):
        assert all(torch.equal(x, y) for x, y in zip(a, b))  # bit for bit for any thread count


def test_head_major_views_are_accepted():
    """attention_query as attention often holds it ([B, S, Hm, Dm] transposed): copied once,
    same result."""
    inputs = make_inputs(SEED + 10)
    sequence_major = inputs["attention_query"].transpose(1, 2).contiguous()
    viewed = dict(inputs, attention_query=sequence_major.transpose(1, 2))
    assert not viewed["attention_query"].is_contiguous()
    assert all(torch.equal(a, b) for a, b in zip(run(inputs), run(viewed)))


def test_scratch_is_independent_of_the_row_count():
    sizes = set()
    for rows in (1, 64, 1024):
        inputs = make_inputs(SEED, 1, rows, 8, 64, 4, 128, 600, 512)
        tensors = [inputs[n] for n in ("index_query", "index_key", "merge_weight", "attention_query",
                                       "compressed_key", "topk_indices", "sinks")]
        sizes.add(sct.indexer_kl_scratch_bytes(*tensors, threads=2))
    assert len(sizes) == 1 and 0 < sizes.pop() < 4 << 20


def test_threads_zero_means_torchs_thread_count():
    """sparsecp's kernels run on their own OpenMP runtime, which does not see
    torch.set_num_threads: threads=0 must resolve to torch's count, not to every core (the
    per-thread scratch shows which count a call resolved to)."""
    from sparsecp.torch._threads import cpu_threads

    inputs = make_inputs(SEED, 1, 64, 8, 64, 4, 128, 600, 512)
    tensors = [inputs[n] for n in ("index_query", "index_key", "merge_weight", "attention_query",
                                   "compressed_key", "topk_indices", "sinks")]
    one, two = (sct.indexer_kl_scratch_bytes(*tensors, threads=t) for t in (1, 2))
    assert one != two  # the scratch is per thread, so it tells the thread counts apart
    saved = torch.get_num_threads()
    try:
        for count, scratch in ((1, one), (2, two)):
            torch.set_num_threads(count)
            assert cpu_threads(0) == count and cpu_threads(3) == 3
            assert sct.indexer_kl_scratch_bytes(*tensors) == scratch
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("path", ["fused", "torch"])
def test_errors_carry_the_seeds_texts(path, monkeypatch):
    if path == "torch":
        monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")
    inputs = make_inputs(SEED + 11, keys=11, topk=13)

    def call(**changes):
        args = {**inputs, **changes}
        return KL(args["index_query"], args["index_key"], args["merge_weight"], args["attention_query"],
                  args["compressed_key"], args["topk_indices"], args["sinks"],
                  attention_scale=args["attention_scale"], loss_coeff=1.0,
                  main_key_offset=args["main_key_offset"], **args.get("extra", {}))

    ids = inputs["topk_indices"]
    with pytest.raises(ValueError, match=r"^Fused KL indices must have shape \[B, Q, TopK\] matching Indexer Q"):
        call(topk_indices=ids[:, :-1])
    with pytest.raises(ValueError, match=r"^Fused KL requires ordinary TopK512 selections, allowing padding for "
                                         r"a compact bank; got K=11, TopK=10$"):
        call(topk_indices=ids[..., :10])
    bad = ids.clone()
    bad[1, 2, 3] = 11
    with pytest.raises(ValueError, match=r"topk id 11 at \[1, 2, 3\] is outside the bank's keys \[0, 11\)"):
        call(topk_indices=bad)
    with pytest.raises(ValueError, match="must be float32, bfloat16 or float64, got torch.float16"):
        call(sinks=inputs["sinks"].half())
    with pytest.raises(ValueError, match="topk_indices must be int32 or int64"):
        call(topk_indices=ids.short())
    with pytest.raises(TypeError, match="index_query must be a torch.Tensor"):
        call(index_query=inputs["index_query"].numpy())
    with pytest.raises(ValueError, match="query_chunk_size must be positive"):
        call(extra={"query_chunk_size": 0})
    with pytest.raises(ValueError, match="main_key_offset"):
        call(main_key_offset=1)  # ids below the offset


def test_ids_on_another_device_raise_the_seeds_text():
    """The meta device stands in for an accelerator: shapes are checked first, then the device."""
    inputs = make_inputs(SEED + 12)
    with pytest.raises(ValueError, match=r"^Fused KL indices must share Indexer Q's device, got meta and cpu$"):
        KL(inputs["index_query"], inputs["index_key"], inputs["merge_weight"], inputs["attention_query"],
           inputs["compressed_key"], inputs["topk_indices"].to("meta"), inputs["sinks"],
           attention_scale=1.0, loss_coeff=1.0)
    with pytest.raises(ValueError, match="sinks must share Indexer Q's device"):
        KL(inputs["index_query"], inputs["index_key"], inputs["merge_weight"], inputs["attention_query"],
           inputs["compressed_key"], inputs["topk_indices"], inputs["sinks"].to("meta"),
           attention_scale=1.0, loss_coeff=1.0)


def test_float64_and_other_devices_take_the_torch_path(monkeypatch):
    calls = []
    original = kl_module.kl_loss_and_grads_torch

    def spy(*args, **kwargs):
        calls.append(args[0].dtype)
        return original(*args, **kwargs)

    monkeypatch.setattr(kl_module, "kl_loss_and_grads_torch", spy)
    inputs = make_inputs(SEED + 13)
    run(inputs)
    assert calls == []
    run({k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inputs.items()})
    assert calls == [torch.float64]


def test_unit_incoming_gradient_hands_the_saved_gradients_over(monkeypatch):
    """loss.backward() (incoming gradient 1): the gradient buffers computed in the forward
    become .grad without a copy; a retained graph still gives the same gradients again."""
    inputs = make_inputs(SEED + 14)
    made = []
    original = kl_module._loss_and_grads

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        made.append([g.data_ptr() for g in result[1:]])  # no reference kept: that would force a copy
        return result

    monkeypatch.setattr(kl_module, "_loss_and_grads", spy)
    student = [inputs[n].clone().requires_grad_() for n in ("index_query", "index_key", "merge_weight")]
    teacher = [inputs[n] for n in ("attention_query", "compressed_key", "topk_indices", "sinks")]
    KL(*student, *teacher, attention_scale=1.0, loss_coeff=1.0).backward()
    assert [t.grad.data_ptr() for t in student] == made[0]
    first = [t.grad.clone() for t in student]
    for t in student:
        t.grad = None
    loss = KL(*student, *teacher, attention_scale=1.0, loss_coeff=1.0)
    loss.backward(retain_graph=True)
    loss.backward()
    assert all(torch.equal(t.grad, 2 * g) for t, g in zip(student, first))  # the saved ones were not handed over


SUPPORTED_ISAS = [isa for isa in ("portable", "avx2", "avx512") if sparsecp._core.kernel_isa_supported(isa)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["index_query", "index_key", "merge_weight", "attention_query", "compressed_key",
                                  "sinks"])
def test_nan_propagates_like_the_torch_path_on_every_isa(name, dtype, monkeypatch):
    """One NaN in any input: the fused kernel, on every ISA this CPU runs (SPARSECP_ISA),
    is NaN exactly where the chunked torch formulation is (it used to ReLU NaN away)."""
    inputs = make_inputs(SEED + 77, dtype=dtype)
    flat = inputs[name].view(-1)
    flat[flat.numel() // 2] = float("nan")
    monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")
    want = run(inputs)
    monkeypatch.delenv("SPARSECP_TORCH_PATH")
    assert any(bool(t.isnan().any()) for t in want)
    for isa in SUPPORTED_ISAS:
        monkeypatch.setenv("SPARSECP_ISA", isa)
        assert sparsecp.kernel_isa() == isa
        got = run(inputs)
        for g, w, what in zip(got, want, ("loss", "index_query", "index_key", "merge_weight")):
            assert torch.equal(g.isnan(), w.isnan()), (isa, what)


def test_unknown_or_unsupported_isa_in_the_environment_raises(monkeypatch):
    inputs = make_inputs(SEED + 78)
    monkeypatch.setenv("SPARSECP_ISA", "avx3")
    with pytest.raises(ValueError, match="SPARSECP_ISA must be auto, portable, avx2 or avx512, got 'avx3'"):
        run(inputs)
    with pytest.raises(ValueError, match="SPARSECP_ISA must be"):
        sparsecp.kernel_isa()
    for isa in ("avx2", "avx512"):
        if not sparsecp._core.kernel_isa_supported(isa):
            monkeypatch.setenv("SPARSECP_ISA", isa)
            with pytest.raises(ValueError, match="is not supported by this CPU"):
                run(inputs)


def test_any_topk_takes_the_kernel_below_the_seeds_rule_with_any_thread_count(monkeypatch):
    from sparsecp.torch.kl import indexer_kl_loss_any_topk

    # 40 keys and 6 ids a row: below the seed's TopK512 rule (min(512, K) <= TopK), as a small
    # model's own index_topk; the fused kernel takes it (any_topk), whatever the thread count.
    inputs = make_inputs(SEED + 31, 2, 29, 4, 16, 3, 24, 40, 6, 0, ids_dtype=torch.int32)
    calls = []
    original = sparsecp._core.indexer_kl_loss

    def spy(*args, **kwargs):
        calls.append((args[13], kwargs["any_topk"]))  # the thread count, the any-top-k flag
        return original(*args, **kwargs)

    monkeypatch.setattr(sparsecp._core, "indexer_kl_loss", spy)
    runs = [run(inputs, kl=indexer_kl_loss_any_topk, threads=threads) for threads in (0, 1, 3)]
    assert calls == [(torch.get_num_threads(), True), (1, True), (3, True)]  # 0: torch's count
    for other in runs[1:]:
        assert all(torch.equal(x, y) for x, y in zip(runs[0], other))  # bit for bit
    monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")
    want = run(inputs, kl=indexer_kl_loss_any_topk)
    for got, expected in zip(runs[0], want):
        assert relative(got, expected) < 1e-5
    with pytest.raises(ValueError, match="Indexer KL thread count must be non-negative, got -1"):
        run(inputs, kl=indexer_kl_loss_any_topk, threads=-1)
    names = ("index_query", "index_key", "merge_weight", "attention_query", "compressed_key", "topk_indices", "sinks")
    with pytest.raises(ValueError, match="Fused KL requires ordinary TopK512 selections"):
        sct.indexer_kl_scratch_bytes(*(inputs[n] for n in names))  # the seed's rule, as its entry point
    bound = sct.indexer_kl_scratch_bytes(*(inputs[n] for n in names), any_topk=True, threads=2)
    fewer = make_inputs(SEED + 32, 1, 3, 4, 16, 3, 24, 40, 6, 0, ids_dtype=torch.int32)  # B and S smaller
    assert bound > 0 and bound == sct.indexer_kl_scratch_bytes(*(fewer[n] for n in names), any_topk=True, threads=2)
