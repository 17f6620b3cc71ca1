"""Lightning Indexer selection on packed segments: the seed's packed indexer call.

A worker's rows come as segments ``(q_begin, q_end, key_begin, key_end, residual)``
(``IndexerRoute.segments``): rows [q_begin, q_end) hold one document piece whose last
row sits at document position ``end - 1``, ``end = (key_end - key_begin) * ratio +
residual``; the row at position p sees bank keys ``[key_begin, key_begin + (p + 1) //
ratio)``. Per row the result is the ``topk`` best visible key ids by

    I[t, s] = sum_h w[t, h] * ReLU(q[t, h, :] . k[s, :])

ties to the lower id, sorted ascending, padded with -1; rows that see no key are all -1.
A row's result depends only on its own inputs (never on the batch, tile or thread count).

Kernels by device:

* CPU tensors run sparsecp's fused C++ kernel in place (zero copy for C-contiguous
  inputs; AVX-512 / AVX2 / portable picked at run time).
* Tensors on any other device run ``_select_torch``: chunked torch code with the same
  semantics (ties to the lower id by a stable sort, ascending, -1 padding), the path until
  a device kernel exists. Setting the environment variable ``SPARSECP_TORCH_PATH=1``
  sends CPU tensors through it too (tests use it to check both paths agree).

Precision follows the key bank, as the C++ kernel: fp32 keys score fp32 q; bf16 keys
score q rounded to bf16, products accumulated in fp32; weights are used in fp32. On
inputs whose dot products are exact in fp32 (small integers) both paths return identical
ids; on general floats they can differ where two scores tie to the last bit.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import _core
from .._checks import integer, integer_table
from ._plans import RowTuple
from ._replay import replayable
from ._threads import cpu_threads

__all__ = [
    "IndexerSelector",
    "TndPlan",
    "csa_tnd_plan",
    "packed_indexer_select",
    "project_index_query",
    "select_indices",
]

_FLOATS = (torch.float32, torch.bfloat16)
# Bytes of the [rows, heads, keys] score block one chunk of the torch path may hold.
_TORCH_CHUNK_BYTES = 64 << 20
# Rows per chunk at most: a chunk scores the rectangle of keys its last row sees, so a
# long chunk from a document's start scores twice the causal triangle; 256 rows keep the
# extra under 128 / ratio keys per row, and the path's time close to a + b * sum(vis).
_TORCH_CHUNK_ROWS = 256


def _torch_path(device: torch.device) -> bool:
    """True when tensors on ``device`` take the pure-torch path (and while torch.compile
    traces: the C++ kernels are opaque to it; the custom ops in ops.py wrap them)."""
    return (device.type != "cpu" or torch.compiler.is_compiling()
            or os.environ.get("SPARSECP_TORCH_PATH", "") == "1")


def segment_array(segments: Any) -> np.ndarray:
    """Segments as a C-contiguous int64 [n, 5] numpy array (a view when already one).

    Values must be integers (``_checks``): 0.9, 32.7 or "8" raise naming the entry."""
    array = getattr(segments, "array", None)  # IndexerRoute.segments (RowTuple)
    array = integer_table("segments", segments if array is None else array, 5)
    if array.ndim != 2 or array.shape[1] != 5:
        raise ValueError("Indexer segments must be (q_begin, q_end, key_begin, key_end, residual) tuples")
    return array


def _check_float(tensor: Any, name: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"Indexer {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in _FLOATS:
        raise ValueError(f"Indexer {name} must be float32 or bfloat16, got {tensor.dtype}")


def _check_selection(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, topk: int) -> tuple[int, int]:
    """Validate select_indices' tensors; returns (heads, head_dim)."""
    for tensor, name in ((query, "query"), (key, "key"), (weights, "weights")):
        _check_float(tensor, name)
    if key.device != query.device or weights.device != query.device:
        raise ValueError(f"Indexer query, key and weights must share a device, got {query.device}, "
                         f"{key.device} and {weights.device}")
    if key.ndim != 2 or weights.ndim != 2 or query.ndim not in (2, 3):
        raise ValueError(f"Indexer selection expects query [rows, heads, head_dim], key [keys, head_dim] and "
                         f"weights [rows, heads], got {tuple(query.shape)}, {tuple(key.shape)} and "
                         f"{tuple(weights.shape)}")
    heads, head_dim = weights.shape[1], key.shape[1]
    width = query.shape[1] * (query.shape[2] if query.ndim == 3 else 1)
    if (query.shape[0] != weights.shape[0] or width != heads * head_dim
            or (query.ndim == 3 and query.shape[2] != head_dim)):
        raise ValueError(f"Indexer query {tuple(query.shape)} does not match weights {tuple(weights.shape)} "
                         f"([rows, heads]) and key {tuple(key.shape)} ([keys, head_dim])")
    if isinstance(topk, (bool, np.bool_)) or not isinstance(topk, (int, np.integer)) or topk < 1:
        raise ValueError(f"Indexer topk must be a positive integer, got {topk!r}")
    return heads, head_dim


def check_select_rows(query: Any, key: Any, weights: Any, key_begin: Any, visible: Any, topk: Any) -> None:
    """``torch.ops.sparsecp.select_rows``' checks, one set for every device and path (the CPU
    kernel's and the dense torch version's): ``select_indices``' dtype, device, shape and topk
    rules, int64 ``key_begin`` / ``visible`` of [rows] on query's device, and every row's keys
    inside the bank (``0 <= key_begin``, ``0 <= visible <= keys - key_begin``). The values are
    read on the host (a sync on a GPU), except while a CUDA graph is being captured, where
    nothing may be read (the fixed path's values come from ``prebuild``, checked there)."""
    heads, head_dim = _check_selection(query, key, weights, topk)
    _core.check_select_config(heads, head_dim, 1, topk)
    rows = query.shape[0]
    for tensor, name in ((key_begin, "key_begin"), (visible, "visible")):
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64 or tuple(tensor.shape) != (rows,):
            described = (f"{tensor.dtype} {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor)
                         else type(tensor).__name__)
            raise ValueError(f"Indexer select_rows {name} must be int64 [{rows}], got {described}")
        if tensor.device != query.device:
            raise ValueError(f"Indexer select_rows {name} is on {tensor.device}, query on {query.device}")
    if query.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return
    keys = key.shape[0]
    bad = (key_begin < 0) | (visible < 0) | (visible > keys - key_begin)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        begin, count = int(key_begin[row]), int(visible[row])
        raise ValueError(f"Indexer select_rows row {row} sees keys [{begin}, {begin} + {count}), outside the bank of "
                         f"{keys} keys")


def kernel_arg(tensor: torch.Tensor) -> Any:
    """``tensor`` as a C++ kernel's array argument: nanobind's ndarray parameters take
    tensors through DLPack, without a copy (their stubs name numpy arrays)."""
    return tensor


def _contiguous(tensor: torch.Tensor) -> Any:
    return kernel_arg(tensor if tensor.is_contiguous() else tensor.contiguous())


def flat_segments(segments: Any) -> list[int]:
    """Segments as one flat list of Python ints (a custom op's ``int[]`` argument): 5 per
    segment. Traceable by torch.compile for tuples of 5-tuples and lists of them (the seed's
    form), an ``IndexerRoute.segments`` (its flat tuple, made with the route) and numpy
    tables."""
    if isinstance(segments, RowTuple):  # IndexerRoute.segments
        return list(segments.flat())
    array = getattr(segments, "array", None)
    if array is not None or isinstance(segments, np.ndarray):
        return [int(value) for value in np.asarray(segments if array is None else array).reshape(-1).tolist()]
    return [int(value) for segment in segments for value in segment]


def select_indices(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, segments: Any, ratio: int,
                   topk: int, *, threads: int = 0) -> torch.Tensor:
    """Top-k compressed keys of every query row of packed segments.

    Inside ``torch.compile`` (``fullgraph=True`` too) the call is the custom op
    ``torch.ops.sparsecp.select_indices`` (segments as a flat ``int[]``, 5 per segment), whose
    kernel is this function's eager path: the same ids, recorded and replayed alike.

    Args:
        query: Index Q, [rows, heads, head_dim] (or [rows, heads * head_dim]), float32 or
            bfloat16.
        key: The compressed Index K bank, [keys, head_dim], float32 or bfloat16.
        weights: Merge weights, [rows, heads], float32 or bfloat16 (already scaled by
            head_dim^-0.5 * heads^-0.5).
        segments: (q_begin, q_end, key_begin, key_end, residual) per piece (an
            IndexerRoute's ``segments``, a sequence of 5-tuples, or an int64 [n, 5] array).
        ratio: Compression ratio.
        topk: Ids per row.
        threads: CPU kernel threads (0: torch's, ``torch.get_num_threads()``); never changes results.

    Returns:
        int32 [rows, topk] on query's device: ascending ids, -1 padded.

    Raises:
        ValueError: wrong dtypes, devices or shapes, or invalid segments.
    """
    if torch.compiler.is_compiling():
        return torch.ops.sparsecp.select_indices(query, key, weights, flat_segments(segments), ratio, topk, threads)
    return _select_indices(query, key, weights, segments, ratio, topk, threads=threads)


@replayable("select_indices")  # record / replay (sparsecp.torch.SelectionReplay)
@torch.no_grad()
def _select_indices(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, segments: Any, ratio: int,
                    topk: int, *, threads: int = 0) -> torch.Tensor:
    """select_indices, eager (the custom op's kernel too)."""
    ratio, threads = integer("ratio", ratio, 1), integer("threads", threads, 0)
    heads, head_dim = _check_selection(query, key, weights, topk)
    _core.check_select_config(heads, head_dim, ratio, topk)  # before the output is allocated
    table = segment_array(segments)
    if _torch_path(query.device):
        return _select_torch(query, key, weights, table, ratio, topk)
    rows = query.shape[0]
    out = torch.empty((rows, topk), dtype=torch.int32)
    _core.select_topk(_contiguous(query.detach()), _contiguous(weights.detach()), _contiguous(key.detach()), table,
                      kernel_arg(out), heads, head_dim, ratio, topk, cpu_threads(threads))
    return out


def _select_torch(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, table: np.ndarray, ratio: int,
                  topk: int) -> torch.Tensor:
    """The device-agnostic path: per segment and row chunk, materialise [chunk, heads, keys]
    scores (bounded by _TORCH_CHUNK_BYTES and _TORCH_CHUNK_ROWS), order by a stable descending sort (ties to the
    lower id), keep each row's visible keys, sort ascending, pad -1."""
    if not isinstance(ratio, int) or isinstance(ratio, bool) or ratio < 1:
        raise ValueError(f"Indexer ratio must be a positive integer, got {ratio!r}")
    rows, heads, head_dim = query.shape[0], weights.shape[1], key.shape[1]
    _check_segments(table, rows, key.shape[0], ratio)
    device = query.device
    out = torch.full((rows, topk), -1, dtype=torch.int32, device=device)
    q = query.reshape(rows, heads, head_dim)
    q = q.to(torch.bfloat16).float() if key.dtype == torch.bfloat16 else q.float()
    k = key.float()
    w = weights.float()
    sentinel = torch.iinfo(torch.int32).max
    for q_begin, q_end, key_begin, key_end, residual in table.tolist():
        end = (key_end - key_begin) * ratio + residual  # one past the last row's document position
        first_position = end - (q_end - q_begin)
        start = q_begin + max(0, ratio - 1 - first_position)  # rows at p < ratio - 1 see no key
        chunk = max(1, min(_TORCH_CHUNK_ROWS, _TORCH_CHUNK_BYTES // (4 * heads * max(1, end // ratio))))
        while start < q_end:
            stop = min(q_end, start + chunk)
            positions = torch.arange(first_position + start - q_begin, first_position + stop - q_begin,
                                     device=device)
            visible = torch.div(positions + 1, ratio, rounding_mode="floor")
            span = (first_position + stop - q_begin) // ratio  # keys the chunk's last row sees
            scores = torch.einsum("rhd,kd->rhk", q[start:stop], k[key_begin:key_begin + span]).clamp_min_(0)
            scores = (scores * w[start:stop, :, None]).sum(dim=1)
            columns = torch.arange(span, device=device)
            scores.masked_fill_(columns[None, :] >= visible[:, None], float("-inf"))
            order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :topk]
            kept = torch.arange(order.shape[1], device=device)[None, :] < visible[:, None]
            ids = torch.where(kept, order + key_begin, torch.full_like(order, sentinel))
            ids = torch.sort(ids, dim=1).values
            out[start:stop, :ids.shape[1]] = torch.where(ids == sentinel, -1, ids).to(torch.int32)
            start = stop
    return out


def _check_segments(table: np.ndarray, rows: int, keys: int, ratio: int) -> None:
    """The C++ kernel's segment checks (kernels/select.hpp), in numpy."""
    if not len(table):
        return
    q_begin, q_end, key_begin, key_end, residual = table.T
    end = (key_end - key_begin) * ratio + residual
    bad = ((q_begin < 0) | (q_end < q_begin) | (q_end > rows) | (key_begin < 0) | (key_end < key_begin)
           | (key_end > keys) | (residual < 0) | (residual >= ratio) | (q_end - q_begin > end))
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        raise ValueError(f"Indexer segment {index} {tuple(table[index].tolist())} is invalid for {rows} rows, "
                         f"{keys} keys and ratio {ratio}")
    order = np.argsort(q_begin, kind="stable")
    if (q_begin[order][1:] < q_end[order][:-1]).any():
        raise ValueError("Indexer segments overlap")


class TndPlan:
    """The packed (TND) layout of the query rows that see at least one key.

    Seed ``csa_tnd_plan(segments, ratio)``: per segment only the rows that see a key are
    kept, packed back to back in segment order (T rows). ``query(x)`` gathers them from a
    [1, Q, ...] tensor into [T, ...]; ``key(key)`` is the bank [K, head_dim] of a [1, K,
    head_dim] key; ``restore(indices, result)`` scatters packed [T, topk] results back into
    [1, Q, topk] (or [Q, topk]); ``covers_queries(n)`` is true when the packed rows are
    rows 0..n-1 in order (the packed result already is the answer). ``segments`` are the
    packed rows' segments; ``actual_seq_lengths_query`` / ``actual_seq_lengths_key`` are
    the cumulative counts the TND kernels take.
    """

    def __init__(self, core: _core.TndPlan) -> None:
        self.core = core
        sequences = core.sequences
        row_begin, row_end, packed_begin, first_position, key_begin, key_end = sequences.T
        count = row_end - row_begin
        residual = first_position + count - (key_end - key_begin) * core.ratio
        self.segments = np.stack([packed_begin, packed_begin + count, key_begin, key_end, residual], axis=1)
        self._row_ids: np.ndarray | None = None  # expanded on first use
        self._device_ids: dict[torch.device, torch.Tensor] = {}

    @property
    def row_ids(self) -> np.ndarray:
        """Original row of every packed row (int64 [T])."""
        if self._row_ids is None:
            self._row_ids = self.core.packed_row_ids()
        return self._row_ids

    @property
    def packed_rows(self) -> int:
        return self.core.packed_rows

    @property
    def actual_seq_lengths_query(self) -> np.ndarray:
        return self.core.query_offsets()[1:]

    @property
    def actual_seq_lengths_key(self) -> np.ndarray:
        return self.core.key_offsets()[1:]

    def covers_queries(self, rows: int) -> bool:
        return self.core.covers_queries(rows)

    def _ids(self, device: torch.device) -> torch.Tensor:
        ids = self._device_ids.get(device)
        if ids is None:
            ids = self._device_ids[device] = torch.from_numpy(np.array(self.row_ids)).to(device)
        return ids

    def query(self, tensor: torch.Tensor) -> torch.Tensor:
        """[1, Q, ...] -> the packed rows [T, ...]."""
        return tensor[0].index_select(0, self._ids(tensor.device))

    def key(self, key: torch.Tensor) -> torch.Tensor:
        """[1, K, head_dim] -> the bank [K, head_dim]."""
        return key[0]

    def restore(self, indices: torch.Tensor, result: torch.Tensor) -> None:
        """Scatter packed [T, topk] ids into result [1, Q, topk] or [Q, topk], in place."""
        target = result[0] if result.ndim == 3 else result
        target.index_copy_(0, self._ids(result.device), indices.to(target.dtype))


def csa_tnd_plan(segments: Any, ratio: int) -> TndPlan | None:
    """Seed ``csa_tnd_plan``: the TND plan of the rows that see a key, None when none does."""
    core = _core.csa_tnd_plan(segment_array(segments), integer("ratio", ratio, 1))
    return None if core is None else TndPlan(core)


@replayable("packed_indexer_select")  # record / replay (sparsecp.torch.SelectionReplay)
@torch.no_grad()
def packed_indexer_select(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, segments: Any,
                          ratio: int, topk: int) -> torch.Tensor:
    """The seed's packed indexer call (``_select_indices`` on packed segments).

    Args:
        query: Index Q [1, Q, heads, head_dim], float32 or bfloat16.
        key: Index K bank [1, K, head_dim].
        weights: Merge weights [1, Q, heads].
        segments, ratio, topk: As select_indices.

    Returns:
        int32 [1, Q, topk]: all -1 when no row sees a key.

    Raises:
        ValueError: "Packed Lightning Indexer requires batch size one" for batch > 1.
    """
    ratio = integer("ratio", ratio, 1)
    if query.shape[0] != 1:
        raise ValueError("Packed Lightning Indexer requires batch size one")
    if query.ndim < 3 or key.ndim != 3 or weights.ndim != 3:
        raise ValueError(f"Packed Lightning Indexer expects query [1, Q, heads, head_dim], key [1, K, head_dim] and "
                         f"weights [1, Q, heads], got {tuple(query.shape)}, {tuple(key.shape)} and "
                         f"{tuple(weights.shape)}")
    # Every check before anything is sized by the segments: O(segments), no per-row ids.
    heads, head_dim = _check_selection(query[0], key[0], weights[0], topk)
    _core.check_select_config(heads, head_dim, ratio, topk)
    table = segment_array(segments)
    _check_segments(table, query.shape[1], key.shape[1], ratio)
    plan = csa_tnd_plan(table, ratio)
    if plan is None:
        return torch.full((*query.shape[:2], topk), -1, device=query.device, dtype=torch.int32)
    if not _torch_path(query.device):  # the fused kernel skips rows that see nothing itself
        return select_indices(query[0], key[0], weights[0], segments, ratio, topk).unsqueeze(0)
    indices = select_indices(plan.query(query), plan.key(key), plan.query(weights), plan.segments, ratio, topk)
    if plan.covers_queries(query.shape[1]):
        return indices.unsqueeze(0)
    result = torch.full((*query.shape[:2], topk), -1, device=query.device, dtype=torch.int32)
    plan.restore(indices, result)
    return result


@torch.no_grad()
def project_index_query(query_residual: torch.Tensor, wq_b: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        head_dim: int, rope_dim: int, weight_layout: str = "out_in") -> torch.Tensor:
    """Worker Index Q (seed ``_project_worker_index_query``): RoPE(qr @ Wq_b).

    Args:
        query_residual: [rows, q_rank] (or [1, rows, q_rank]), float32 or bfloat16.
        wq_b: [heads * head_dim, q_rank] ("out_in": ``q_b_proj.weight``) or [q_rank,
            heads * head_dim] ("in_out"), qr's dtype.
        cos, sin: [rows, rope_dim / 2] (or [1, rows, rope_dim / 2]), float32 or bfloat16.
        head_dim: Channels per head.
        rope_dim: Trailing channels of each head rotated in interleaved pairs.

    Returns:
        float32 [rows, heads, head_dim]. With bf16 inputs the values are bf16-exact (the
        GEMM's result and RoPE's are rounded to bf16, as the seed's bf16 Linear and
        ``_apply_v41_rope`` do).
    """
    head_dim, rope_dim = integer("head_dim", head_dim, 1), integer("rope_dim", rope_dim, 0)
    qr, cos, sin = (t[0] if t.ndim == 3 else t for t in (query_residual, cos, sin))
    if qr.dtype not in _FLOATS or wq_b.dtype != qr.dtype:
        raise ValueError(f"Indexer qr and Wq_b must share a float32 or bfloat16 dtype, got {qr.dtype} and {wq_b.dtype}")
    weight = wq_b if weight_layout == "out_in" else wq_b.t()
    width = weight.shape[0]
    if width % head_dim:
        raise ValueError(f"Indexer query width {width} is not divisible by head_dim {head_dim}")
    if not _torch_path(qr.device):
        out = torch.empty((qr.shape[0], width), dtype=torch.float32)
        _core.project_index_query(_contiguous(qr.detach()), _contiguous(wq_b.detach()), _contiguous(cos.detach()),
                                  _contiguous(sin.detach()), kernel_arg(out), width // head_dim, head_dim, rope_dim,
                                  weight_layout == "out_in", threads=cpu_threads(0))
        return out.view(qr.shape[0], width // head_dim, head_dim)
    return _project_torch(qr, weight, cos, sin, head_dim, rope_dim)


def _project_torch(qr: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int,
                   rope_dim: int) -> torch.Tensor:
    bf16 = qr.dtype == torch.bfloat16
    q = qr.float() @ weight.float().t()
    if bf16:
        q = q.to(torch.bfloat16).float()
    q = q.view(qr.shape[0], -1, head_dim)
    if rope_dim:
        c, s = cos.float()[:, None, :], sin.float()[:, None, :]
        x0 = q[..., head_dim - rope_dim::2]
        x1 = q[..., head_dim - rope_dim + 1::2]
        rotated = torch.stack((x0 * c - x1 * s, x1 * c + x0 * s), dim=-1).flatten(-2)
        q = torch.cat((q[..., :head_dim - rope_dim], rotated), dim=-1)
        if bf16:
            q = q.to(torch.bfloat16).float()
    return q


class IndexerSelector:
    """A worker-side selector for ``balanced_indexer_select`` / the overlapped path.

    ``selector(qr, weights, (cos, sin), segments)`` projects Index Q with the layer's
    ``wq_b`` and RoPE (``project_index_query``) and selects ``topk`` keys of ``key`` per
    row (``select_indices``); returns int32 [1, rows, topk]. On CPU both steps run fused
    in C++ on the tensors in place (``select_worker_rows``); elsewhere in torch.

    Args:
        wq_b: [heads * head_dim, q_rank] (``q_b_proj.weight``; ``weight_layout="in_out"``
            for [q_rank, heads * head_dim]), float32 or bfloat16 like qr.
        key: The compressed Index K bank [keys, head_dim] (or [1, keys, head_dim]).
        ratio: Compression ratio.
        topk: Ids per row.
        head_dim: Channels per head (default: key's last dimension).
        rope_dim: Rotated trailing channels per head (64 in DeepSeek-V4).
        threads: CPU kernel threads (0: torch's, ``torch.get_num_threads()``).
    """

    def __init__(self, wq_b: torch.Tensor, key: torch.Tensor, ratio: int, topk: int, head_dim: int | None = None,
                 rope_dim: int = 64, weight_layout: str = "out_in", threads: int = 0) -> None:
        if weight_layout not in ("out_in", "in_out"):
            raise ValueError(f"weight_layout must be 'out_in' or 'in_out', got {weight_layout!r}")
        self.key = key[0] if key.ndim == 3 else key
        self.wq_b, self.ratio, self.topk = wq_b, integer("ratio", ratio, 1), integer("topk", topk, 1)
        self.head_dim = integer("head_dim", head_dim, 1) if head_dim is not None else int(self.key.shape[-1])
        self.rope_dim = integer("rope_dim", rope_dim, 0)
        self.weight_layout, self.threads = weight_layout, integer("threads", threads, 0)
        width = wq_b.shape[0] if weight_layout == "out_in" else wq_b.shape[1]
        if width % self.head_dim:
            raise ValueError(f"Indexer query width {width} is not divisible by head_dim {self.head_dim}")
        self.heads = width // self.head_dim

    def __call__(self, query_residual: torch.Tensor, weights: torch.Tensor, position_embeddings: Sequence[torch.Tensor],
                 segments: Any) -> torch.Tensor:
        cos, sin = position_embeddings
        qr, w, c, s = (t[0] if t.ndim == 3 else t for t in (query_residual, weights, cos, sin))
        if torch.compiler.is_compiling():  # the custom op (traceable, fullgraph too): the eager path as its kernel
            return torch.ops.sparsecp.select_worker_rows(
                qr, w, c, s, self.wq_b, self.key, flat_segments(segments), self.heads, self.head_dim, self.rope_dim,
                self.ratio, self.topk, self.weight_layout == "out_in", self.threads).unsqueeze(0)
        return select_worker_rows(qr, w, c, s, self.wq_b, self.key, segments, self.heads, self.head_dim,
                                  self.rope_dim, self.ratio, self.topk, self.weight_layout == "out_in",
                                  self.threads).unsqueeze(0)


@torch.no_grad()
def select_worker_rows(qr: torch.Tensor, w: torch.Tensor, c: torch.Tensor, s: torch.Tensor, wq_b: torch.Tensor,
                       key: torch.Tensor, segments: Any, heads: int, head_dim: int, rope_dim: int, ratio: int,
                       topk: int, out_in: bool, threads: int) -> torch.Tensor:
    """IndexerSelector's selection, eager (the custom op's kernel too): int32 [rows, topk]."""
    layout = "out_in" if out_in else "in_out"
    if _torch_path(qr.device):
        q = project_index_query(qr, wq_b, c, s, head_dim, rope_dim, layout)
        return select_indices(q, key, w, segments, ratio, topk)
    for tensor, name in ((qr, "qr"), (w, "weights"), (c, "cos"), (s, "sin"), (wq_b, "Wq_b"), (key, "key")):
        _check_float(tensor, name)
        if tensor.device != qr.device:
            raise ValueError(f"Indexer {name} is on {tensor.device}, qr on {qr.device}")
    out = torch.empty((qr.shape[0], topk), dtype=torch.int32)
    _core.select_worker_rows(_contiguous(qr.detach()), _contiguous(w.detach()), _contiguous(c.detach()),
                             _contiguous(s.detach()), _contiguous(wq_b.detach()), _contiguous(key.detach()),
                             segment_array(segments), kernel_arg(out), heads, head_dim, rope_dim, ratio, topk, out_in,
                             cpu_threads(threads))
    return out
