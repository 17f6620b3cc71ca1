"""The selection op: the CPU C++ kernel, the pure-torch path (what other devices run) and a
plain numpy reference agree on random small-integer inputs of awkward shapes (1, primes,
empty); the CPU path reads its inputs in place; the packed indexer call, the TND plan,
the projection and the worker selector; bad inputs raise ValueError with a clear text."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sparsecp  # noqa: E402
import sparsecp.torch as sct  # noqa: E402
from sparsecp.torch import select as select_module  # noqa: E402

SEED = int(os.environ.get("SPARSECP_TEST_SEED", "20261201"))


@pytest.fixture
def torch_path(monkeypatch):
    """Run CPU tensors through the pure-torch kernels."""
    monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")


def random_segments(rng: random.Random, rows: int, ratio: int) -> tuple[list, int]:
    """Segments covering some of `rows` rows (gaps allowed), over a bank of documents."""
    segments, bank, row = [], 0, 0
    while row < rows:
        if rng.random() < 0.15:  # a gap: rows no segment covers
            row += rng.randint(1, 3)
            continue
        count = min(rows - row, rng.randint(1, 23))
        end = count + rng.randint(0, 40)  # the document extends before the piece
        keys = end // ratio
        residual = end % ratio
        segments.append((row, row + count, bank, bank + keys, residual))
        bank += keys + rng.randint(0, 3)  # other documents' keys in between
        row += count
    return segments, bank


def reference(query, key, weights, segments, ratio, topk) -> np.ndarray:
    """Plain loops: score every visible key, order by (-score, id), keep topk, sort, pad -1."""
    shape = (query.shape[0], weights.shape[1], key.shape[1])
    q = (query.to(torch.bfloat16) if key.dtype == torch.bfloat16 else query).float().reshape(shape)
    q = q.numpy().astype(np.float64)
    k, w = key.float().numpy().astype(np.float64), weights.float().numpy().astype(np.float64)
    out = np.full((query.shape[0], topk), -1, dtype=np.int32)
    for q_begin, q_end, key_begin, key_end, residual in segments:
        end = (key_end - key_begin) * ratio + residual
        for j, row in enumerate(range(q_begin, q_end)):
            position = end - (q_end - q_begin) + j
            visible = (position + 1) // ratio
            scores = [(-(w[row] * np.maximum(q[row] @ k[key_begin + s], 0)).sum(), key_begin + s)
                      for s in range(visible)]
            chosen = sorted(sorted(scores)[:topk], key=lambda item: item[1])
            out[row, :len(chosen)] = [key_id for _, key_id in chosen]
    return out


def random_case(rng: random.Random, generator: torch.Generator, rows: int, heads: int, head_dim: int, ratio: int,
                dtype: torch.dtype):
    segments, bank = random_segments(rng, rows, ratio)
    query = torch.randint(-3, 4, (rows, heads, head_dim), generator=generator).to(dtype)
    key = torch.randint(-3, 4, (max(bank, 0), head_dim), generator=generator).to(dtype)
    weights = torch.randint(-2, 3, (rows, heads), generator=generator).float()
    return query, key, weights, segments


SHAPES = [(0, 1, 1, 1, 1), (1, 1, 1, 1, 1), (1, 3, 5, 4, 3), (7, 2, 8, 2, 5), (13, 3, 5, 7, 17), (97, 4, 8, 4, 8),
          (61, 1, 3, 1, 2)]


@pytest.mark.parametrize("rows,heads,head_dim,ratio,topk", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpu_kernel_equals_torch_path_and_reference(rows, heads, head_dim, ratio, topk, dtype, monkeypatch):
    seed = SEED + rows * 1000 + topk
    print(f"seed {seed}")
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    for _ in range(3):
        query, key, weights, segments = random_case(rng, generator, rows, heads, head_dim, ratio, dtype)
        cpu = sct.select_indices(query, key, weights, segments, ratio, topk)
        monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")
        portable = sct.select_indices(query, key, weights, segments, ratio, topk)
        monkeypatch.delenv("SPARSECP_TORCH_PATH")
        expected = reference(query, key, weights, segments, ratio, topk)
        assert cpu.dtype == torch.int32 and cpu.shape == (rows, topk)
        assert np.array_equal(cpu.numpy(), expected), f"seed {seed}"
        assert torch.equal(portable, cpu), f"seed {seed}"


def test_torch_path_chunks_long_documents(monkeypatch):
    """The torch path splits rows into chunks under its memory bound: same answer."""
    rng, generator = random.Random(SEED), torch.Generator().manual_seed(SEED)
    query, key, weights, _ = random_case(rng, generator, 300, 2, 4, 1, torch.float32)
    segments = [(0, 300, 0, 300, 0)]
    key = torch.randint(-3, 4, (300, 4), generator=generator).float()
    expected = sct.select_indices(query, key, weights, segments, 1, 16)
    monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")
    monkeypatch.setattr(select_module, "_TORCH_CHUNK_BYTES", 4 * 2 * 300 * 7)  # 7 rows per chunk
    assert torch.equal(sct.select_indices(query, key, weights, segments, 1, 16), expected)


def test_threads_never_change_results():
    rng, generator = random.Random(SEED + 1), torch.Generator().manual_seed(SEED + 1)
    query, key, weights, segments = random_case(rng, generator, 200, 4, 8, 4, torch.bfloat16)
    one = sct.select_indices(query, key, weights, segments, 4, 16, threads=1)
    two = sct.select_indices(query, key, weights, segments, 4, 16, threads=2)
    assert torch.equal(one, two)


def test_cpu_path_reads_inputs_in_place(monkeypatch):
    """Zero copy: the kernel gets the caller's tensors, and the binding reads their memory."""
    rng, generator = random.Random(SEED + 2), torch.Generator().manual_seed(SEED + 2)
    query, key, weights, segments = random_case(rng, generator, 31, 2, 8, 4, torch.bfloat16)
    seen = {}
    original = sparsecp._core.select_topk

    def spy(q, w, k, table, out, *args):
        seen.update(q=sparsecp._core.array_address(q), w=sparsecp._core.array_address(w),
                    k=sparsecp._core.array_address(k), out=out)
        return original(q, w, k, table, out, *args)

    monkeypatch.setattr(sparsecp._core, "select_topk", spy)
    result = sct.select_indices(query, key, weights, segments, 4, 8)
    assert seen["q"] == query.data_ptr() and seen["w"] == weights.data_ptr() and seen["k"] == key.data_ptr()
    assert seen["out"] is result  # written in place, returned as is
    route = sct.indexer_route((31,), 1, 0, 4, "zigzag")
    assert sparsecp._core.array_address(route.local_sources.array) == \
        sparsecp._core.array_address(route.core.local_sources)  # the seed-compatible view is the C++ route's memory


def test_worker_selector_reads_inputs_in_place(monkeypatch):
    seen = []
    original = sparsecp._core.select_worker_rows

    def spy(*args, **kwargs):
        seen.extend(sparsecp._core.array_address(a) for a in args[:6])
        return original(*args, **kwargs)

    monkeypatch.setattr(sparsecp._core, "select_worker_rows", spy)
    generator = torch.Generator().manual_seed(SEED + 3)
    qr = torch.randint(-2, 3, (1, 20, 16), generator=generator).bfloat16()
    weights = torch.randint(-2, 3, (1, 20, 4), generator=generator).float()
    cos = torch.randint(-1, 2, (1, 20, 2), generator=generator).float()
    sin = torch.randint(-1, 2, (1, 20, 2), generator=generator).float()
    wq_b = torch.randint(-1, 2, (32, 16), generator=generator).bfloat16()
    key = torch.randint(-2, 3, (5, 8), generator=generator).bfloat16()
    selector = sct.IndexerSelector(wq_b, key, 4, 4, rope_dim=4)
    selector(qr, weights, (cos, sin), [(0, 20, 0, 5, 0)])
    assert seen == [t.data_ptr() for t in (qr, weights, cos, sin, wq_b, key)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_projection_and_worker_selector_paths_agree(dtype, monkeypatch):
    generator = torch.Generator().manual_seed(SEED + 4)
    rows, heads, head_dim, rope, q_rank = 37, 3, 8, 4, 16
    qr = torch.randint(-2, 3, (1, rows, q_rank), generator=generator).to(dtype)
    weights = torch.randint(-2, 3, (1, rows, heads), generator=generator).float()
    cos = torch.randint(-1, 2, (1, rows, rope // 2), generator=generator).float()
    sin = torch.randint(-1, 2, (1, rows, rope // 2), generator=generator).float()
    wq_b = torch.randint(-1, 2, (heads * head_dim, q_rank), generator=generator).to(dtype)
    key = torch.randint(-2, 3, (40, head_dim), generator=generator).to(dtype)
    segments = [(0, 20, 0, 12, 1), (20, 37, 12, 40, 2)]
    cpu_q = sct.project_index_query(qr, wq_b, cos, sin, head_dim, rope)
    cpu = sct.IndexerSelector(wq_b, key, 4, 6, rope_dim=rope)(qr, weights, (cos, sin), segments)
    in_out = sct.IndexerSelector(wq_b.t().contiguous(), key, 4, 6, rope_dim=rope, weight_layout="in_out")
    assert torch.equal(in_out(qr, weights, (cos, sin), segments), cpu)
    monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")
    torch_q = sct.project_index_query(qr, wq_b, cos, sin, head_dim, rope)
    portable = sct.IndexerSelector(wq_b, key, 4, 6, rope_dim=rope)(qr, weights, (cos, sin), segments)
    assert torch.equal(cpu_q, torch_q)
    assert torch.equal(portable, cpu) and cpu.shape == (1, rows, 6)
    # RoPE as the seed's _apply_v41_rope: interleaved pairs of the trailing rope dims, in fp32
    plain = (qr[0].float() @ wq_b.float().t()).view(rows, heads, head_dim)
    if dtype == torch.bfloat16:
        plain = plain.bfloat16().float()
    x0, x1 = plain[..., head_dim - rope::2], plain[..., head_dim - rope + 1::2]
    c, s = cos[0][:, None], sin[0][:, None]
    assert torch.equal(cpu_q[..., head_dim - rope::2], x0 * c - x1 * s)
    assert torch.equal(cpu_q[..., head_dim - rope + 1::2], x1 * c + x0 * s)
    assert torch.equal(cpu_q[..., :head_dim - rope], plain[..., :head_dim - rope])


@pytest.mark.parametrize("portable", [False, True], ids=["cpu", "torch"])
def test_packed_indexer_call(portable, monkeypatch):
    if portable:
        monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")
    generator = torch.Generator().manual_seed(SEED + 5)
    query = torch.randint(-3, 4, (1, 12, 2, 4), generator=generator).float()
    key = torch.randint(-3, 4, (1, 9, 4), generator=generator).float()
    weights = torch.randint(-2, 3, (1, 12, 2), generator=generator).float()
    with pytest.raises(ValueError, match="^Packed Lightning Indexer requires batch size one$"):
        sct.packed_indexer_select(query.expand(2, -1, -1, -1), key, weights, [(0, 12, 0, 3, 0)], 4, 3)
    # no row sees a key: every row is at a document position below ratio - 1
    nothing = [(0, 2, 0, 0, 2), (2, 4, 0, 0, 2)]
    assert sct.csa_tnd_plan(nothing, 4) is None
    result = sct.packed_indexer_select(query, key, weights, nothing, 4, 3)
    assert result.shape == (1, 12, 3) and result.dtype == torch.int32 and bool((result == -1).all())
    # rows that see nothing at the start of documents, and rows no segment covers
    segments = [(0, 6, 0, 1, 2), (7, 12, 1, 9, 3)]
    plan = sct.csa_tnd_plan(segments, 4)
    assert plan is not None and not plan.covers_queries(12) and plan.packed_rows == 8
    packed = sct.packed_indexer_select(query, key, weights, segments, 4, 3)
    direct = sct.select_indices(query[0], key[0], weights[0], segments, 4, 3)
    assert torch.equal(packed[0], direct)
    assert bool((packed[0, :3] == -1).all()) and bool((packed[0, 6] == -1).all())
    covering = [(0, 12, 0, 12, 0)]
    assert sct.csa_tnd_plan(covering, 1).covers_queries(12)


def test_bad_inputs_raise_value_errors():
    query, key, weights = torch.zeros(4, 2, 8), torch.zeros(3, 8), torch.zeros(4, 2)
    segments = [(0, 4, 0, 3, 0)]
    with pytest.raises(ValueError, match="query must be float32 or bfloat16, got torch.float64"):
        sct.select_indices(query.double(), key, weights, segments, 1, 2)
    with pytest.raises(ValueError, match="key must be float32 or bfloat16, got torch.int64"):
        sct.select_indices(query, key.long(), weights, segments, 1, 2)
    with pytest.raises(ValueError, match="must share a device"):
        sct.select_indices(query, key.to("meta"), weights, segments, 1, 2)
    with pytest.raises(ValueError, match="does not match weights"):
        sct.select_indices(query, key, torch.zeros(4, 3), segments, 1, 2)
    with pytest.raises(ValueError, match="topk must be a positive integer"):
        sct.select_indices(query, key, weights, segments, 1, 0)
    with pytest.raises(ValueError, match="segments must be"):
        sct.select_indices(query, key, weights, [(0, 4, 0)], 1, 2)
    for bad in ([(0, 5, 0, 3, 0)], [(0, 4, 0, 3, 1)], [(0, 4, 0, 9, 0)]):  # rows, residual, keys
        with pytest.raises(ValueError):
            sct.select_indices(query, key, weights, bad, 1, 2)
    with pytest.raises(ValueError, match="^Indexer query width 30 is not divisible by head_dim 8$"):
        sct.project_index_query(torch.zeros(2, 4), torch.zeros(30, 4), torch.zeros(2, 2), torch.zeros(2, 2), 8, 4)


def test_torch_path_validates_segments_like_the_kernel(torch_path):
    query, key, weights = torch.zeros(4, 2, 8), torch.zeros(3, 8), torch.zeros(4, 2)
    for bad in ([(0, 5, 0, 3, 0)], [(0, 4, 0, 3, 1)], [(0, 4, 0, 9, 0)], [(0, 3, 0, 3, 0), (2, 4, 0, 3, 0)]):
        with pytest.raises(ValueError):
            sct.select_indices(query, key, weights, bad, 1, 2)
