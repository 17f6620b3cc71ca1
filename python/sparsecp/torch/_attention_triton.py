"""Triton kernels for ``sparse_attention`` forward and backward.

The contract is ``_attention_reference.reference_sparse_attention``'s (token-major ``q``, one K=V
``kv``, int32 ``indices`` with ``-1``, optional ``sinks``, ``lse`` over the keys only). One program
takes one row and a block of heads and walks the row's columns in blocks, gathering the listed
``kv`` rows; qk dims that are not a power of two are split into a main part and a masked tail
(576 = 512 + 64). The backward is FlashAttention's recipe: ``Delta = rowsum(dO * O)``, ``P``
recomputed from ``lse`` and the sink; ``dsinks = -sum_rows exp(sink - L) * Delta`` in torch.

The key gradient is deterministic by default: the row kernel writes each (head block, row,
column) contribution ``scale * dS^T Q + P^T dO`` to a float32 buffer (row chunks keep it within
``CONTRIB_BUDGET_BYTES``); a stable sort of the chunk's key ids lists, for each key, the entries
that name it in a fixed order, and one program per key (and 128 of its columns) sums them in that
order into a float32 ``dkv``. No atomics. ``deterministic=False`` adds the contributions with
``tl.atomic_add`` instead.

Under ``TRITON_INTERPRET=1`` (set before this module is imported) the kernels run on CPU tensors.
"""
from __future__ import annotations

import os
from typing import Any

import torch

try:
    import triton  # type: ignore[import-untyped]
    import triton.language as tl  # type: ignore[import-untyped]
except ImportError:  # the kernels below are then plain functions that nothing calls
    triton = None
    tl = None

__all__ = ["available", "supports", "forward", "backward"]

# Float32 key-gradient contributions held at once by the deterministic backward.
CONTRIB_BUDGET_BYTES = 1 << 30
# Largest qk dim the kernels are sized for (V3.2's 576 = 512 + 64).
_MAX_QK_DIM = 576
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Shared memory per block the bf16/fp16 kernels take at 512 and 576 (at most 121 KiB on sm_80, sm_90
# and sm_100; the compile-only tests keep it under 227 KiB), so sm_86/sm_89's 99 KiB is refused.
_SHARED_NEEDED = 124 * 1024


def available() -> bool:
    """Whether Triton imports."""
    return triton is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def supports(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
             sinks: torch.Tensor | None) -> str | None:
    """None when these kernels can take the input, else a short reason."""
    if not available():
        return "triton does not import"
    if q.dim() != 3 or kv.dim() != 2 or indices.dim() != 2:
        return "shapes: q [rows, heads, qk_dim], kv [keys, qk_dim], indices [rows, columns]"
    if q.shape[2] != kv.shape[1] or indices.shape[0] != q.shape[0]:
        return "q, kv and indices disagree on qk_dim or rows"
    if q.shape[1] < 1 or q.shape[2] < 1:
        return "no heads or empty qk_dim"
    if q.shape[2] > _MAX_QK_DIM:
        return f"qk_dim {q.shape[2]} > {_MAX_QK_DIM}"
    if q.dtype not in _DTYPES or kv.dtype != q.dtype:
        return f"dtypes q {q.dtype}, kv {kv.dtype}: need one of float32, bfloat16, float16"
    if indices.dtype not in (torch.int32, torch.int64):
        return f"indices dtype {indices.dtype}: need int32"
    if sinks is not None and (sinks.dim() != 1 or sinks.shape[0] != q.shape[1] or not sinks.is_floating_point()):
        return "sinks must be float [heads]"
    tensors = [q, kv, indices] + ([sinks] if sinks is not None else [])
    if any(t.device != q.device for t in tensors):
        return "tensors on different devices"
    if q.device.type == "cuda":
        properties = torch.cuda.get_device_properties(q.device)
        if properties.major < 8:
            return f"sm_{properties.major}{properties.minor}: needs sm_80 or newer"
        shared = getattr(properties, "shared_memory_per_block_optin", None)
        if shared is not None and shared < _SHARED_NEEDED:
            return f"{shared} bytes of shared memory per block: the kernels need {_SHARED_NEEDED}"
        return None
    if q.device.type == "cpu" and _interpreting():
        return None
    return f"device {q.device.type} (CPU needs TRITON_INTERPRET=1)"


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _dims(qk_dim: int, value_dim: int) -> tuple[int, int]:
    """(main, tail) widths: main covers the values, tail (0 for none) the rest of qk_dim."""
    main = max(16, _pow2(value_dim))
    rest = qk_dim - main
    tail = max(16, _pow2(rest)) if rest > 0 else 0
    return main, tail


def _config(heads: int, qk_dim: int, value_dim: int, dtype: torch.dtype) -> dict[str, int]:
    """Block sizes and launch settings shared by the launches and the compile-only checks."""
    main, tail = _dims(qk_dim, value_dim)
    wide = main + tail > 256
    return {
        "DM": main, "DT": tail,
        "FWD_BH": min(64, max(16, _pow2(heads))), "FWD_BC": 16 if wide else 32,
        "FWD_WARPS": 8, "FWD_STAGES": 2,
        "BWD_BH": min(32 if wide else 64, max(16, _pow2(heads))), "BWD_BC": 16 if wide else 32,
        "BWD_WARPS": 8, "BWD_STAGES": 2,
        "GATHER_BE": 16, "GATHER_BD": 128, "GATHER_WARPS": 4,
    }


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def _jit(fn: Any) -> Any:
    return triton.jit(fn) if triton is not None else fn


@_jit
def _mask2(rows_ok, d, LIMIT: tl.constexpr, PARTIAL: tl.constexpr):
    """``rows_ok[:, None]``, and ``d < LIMIT`` only where the block is wider than the data."""
    m = rows_ok[:, None]
    if PARTIAL:
        m = m & (d[None, :] < LIMIT)
    return m

@_jit
def _sparse_attention_fwd(Q, KV, IDX, SINKS, OUT, LSE, columns, scale,
                         stride_qr, stride_qh, stride_kv, stride_ir, stride_or, stride_oh, stride_lr,
                         HEADS: tl.constexpr, QK_DIM: tl.constexpr, V_DIM: tl.constexpr,
                         HAS_SINKS: tl.constexpr, HAS_TAIL: tl.constexpr,
                         BH: tl.constexpr, BC: tl.constexpr, DM: tl.constexpr, DT: tl.constexpr,
                         PRECISION: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    hmask = h < HEADS
    dm = tl.arange(0, DM)
    q_rows = Q + r * stride_qr + h[:, None] * stride_qh
    q = tl.load(q_rows + dm[None, :], mask=_mask2(hmask, dm, QK_DIM, QK_DIM < DM), other=0.0)
    if HAS_TAIL:
        dt = DM + tl.arange(0, DT)
        qt = tl.load(q_rows + dt[None, :], mask=_mask2(hmask, dt, QK_DIM, QK_DIM < DM + DT), other=0.0)
    m = tl.full([BH], float("-inf"), tl.float32)
    lsum = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, DM], tl.float32)
    for c0 in range(0, columns, BC):
        c = c0 + tl.arange(0, BC)
        idx = tl.load(IDX + r * stride_ir + c, mask=c < columns, other=-1)
        valid = idx >= 0
        k_rows = KV + tl.where(valid, idx, 0).to(tl.int64)[:, None] * stride_kv
        k = tl.load(k_rows + dm[None, :], mask=_mask2(valid, dm, QK_DIM, QK_DIM < DM), other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if HAS_TAIL:
            kt = tl.load(k_rows + dt[None, :], mask=_mask2(valid, dt, QK_DIM, QK_DIM < DM + DT), other=0.0)
            s += tl.dot(qt, tl.trans(kt), input_precision=PRECISION)
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        lsum = lsum * alpha + tl.sum(p, 1)
        # The values are k's first V_DIM columns; the columns past them are never stored.
        acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), k, input_precision=PRECISION)
        m = m_new
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    denominator = lsum
    if HAS_SINKS:
        sink = tl.load(SINKS + h, mask=hmask, other=float("-inf"))
        denominator += tl.exp(sink - m_safe)
    denominator = tl.where(denominator > 0, denominator, 1.0)
    out = acc / denominator[:, None]
    out_ptrs = OUT + r * stride_or + h[:, None] * stride_oh + dm[None, :]
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=_mask2(hmask, dm, V_DIM, V_DIM < DM))
    lse = tl.where(lsum > 0, m_safe + tl.log(tl.where(lsum > 0, lsum, 1.0)), float("-inf"))
    tl.store(LSE + r * stride_lr + h, lse, mask=hmask)

@_jit
def _sparse_attention_bwd_rows(Q, KV, IDX, DO, LDEN, DELTA, DQ, DKV, CONTRIB,
                              row0, chunk_rows, columns, scale,
                              stride_qr, stride_qh, stride_kv, stride_ir, stride_dor, stride_doh,
                              stride_lr, stride_dqr, stride_dqh, stride_dkv,
                              HEADS: tl.constexpr, QK_DIM: tl.constexpr, V_DIM: tl.constexpr,
                              ATOMIC: tl.constexpr, HAS_TAIL: tl.constexpr,
                              BH: tl.constexpr, BC: tl.constexpr, DM: tl.constexpr, DT: tl.constexpr,
                              PRECISION: tl.constexpr):
    local = tl.program_id(0).to(tl.int64)
    r = row0 + local
    hb = tl.program_id(1)
    h = hb * BH + tl.arange(0, BH)
    hmask = h < HEADS
    dm = tl.arange(0, DM)
    q_rows = Q + r * stride_qr + h[:, None] * stride_qh
    q = tl.load(q_rows + dm[None, :], mask=_mask2(hmask, dm, QK_DIM, QK_DIM < DM), other=0.0)
    # dO is zero past V_DIM, so k's main part serves as the values.
    do = tl.load(DO + r * stride_dor + h[:, None] * stride_doh + dm[None, :],
                 mask=_mask2(hmask, dm, V_DIM, V_DIM < DM), other=0.0)
    lden = tl.load(LDEN + r * stride_lr + h, mask=hmask, other=0.0)
    delta = tl.load(DELTA + r * stride_lr + h, mask=hmask, other=0.0)
    dq = tl.zeros([BH, DM], tl.float32)
    if HAS_TAIL:
        dt = DM + tl.arange(0, DT)
        qt = tl.load(q_rows + dt[None, :], mask=_mask2(hmask, dt, QK_DIM, QK_DIM < DM + DT), other=0.0)
        dqt = tl.zeros([BH, DT], tl.float32)
    # Entry (head block, local row, column) of the contribution buffer, QK_DIM floats each.
    contrib_rows = CONTRIB + ((hb * chunk_rows + local) * columns) * QK_DIM
    for c0 in range(0, columns, BC):
        c = c0 + tl.arange(0, BC)
        cmask = c < columns
        idx = tl.load(IDX + r * stride_ir + c, mask=cmask, other=-1)
        valid = idx >= 0
        key = tl.where(valid, idx, 0).to(tl.int64)
        k_rows = KV + key[:, None] * stride_kv
        k = tl.load(k_rows + dm[None, :], mask=_mask2(valid, dm, QK_DIM, QK_DIM < DM), other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if HAS_TAIL:
            kt = tl.load(k_rows + dt[None, :], mask=_mask2(valid, dt, QK_DIM, QK_DIM < DM + DT), other=0.0)
            s += tl.dot(qt, tl.trans(kt), input_precision=PRECISION)
        p = tl.where(hmask[:, None] & valid[None, :], tl.exp(s * scale - lden[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(k), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        ds_in = ds.to(k.dtype)
        dq += tl.dot(ds_in, k, input_precision=PRECISION)
        if HAS_TAIL:
            dqt += tl.dot(ds_in, kt, input_precision=PRECISION)
        # This block's key contributions: scale * dS^T Q + P^T dO (main part, then the tail).
        ds_t = tl.trans((ds * scale).to(k.dtype))
        g = tl.dot(ds_t, q, input_precision=PRECISION)
        g += tl.dot(tl.trans(p.to(k.dtype)), do, input_precision=PRECISION)
        dkv_rows = DKV + key[:, None] * stride_dkv
        entry = contrib_rows + c.to(tl.int64)[:, None] * QK_DIM
        if ATOMIC:
            tl.atomic_add(dkv_rows + dm[None, :], g, mask=_mask2(valid, dm, QK_DIM, QK_DIM < DM), sem="relaxed")
        else:
            tl.store(entry + dm[None, :], g, mask=_mask2(cmask, dm, QK_DIM, QK_DIM < DM))
        if HAS_TAIL:
            gt = tl.dot(ds_t, qt, input_precision=PRECISION)
            if ATOMIC:
                tl.atomic_add(dkv_rows + dt[None, :], gt, mask=_mask2(valid, dt, QK_DIM, QK_DIM < DM + DT),
                              sem="relaxed")
            else:
                tl.store(entry + dt[None, :], gt, mask=_mask2(cmask, dt, QK_DIM, QK_DIM < DM + DT))
    dq_rows = DQ + r * stride_dqr + h[:, None] * stride_dqh
    tl.store(dq_rows + dm[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=_mask2(hmask, dm, QK_DIM, QK_DIM < DM))
    if HAS_TAIL:
        tl.store(dq_rows + dt[None, :], (dqt * scale).to(DQ.dtype.element_ty),
                 mask=_mask2(hmask, dt, QK_DIM, QK_DIM < DM + DT))

@_jit
def _key_gradient_gather(CONTRIB, ORDER, STARTS, DKV, stride_dkv,
                        QK_DIM: tl.constexpr, BE: tl.constexpr, BD: tl.constexpr):
    key = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    dmask = d < QK_DIM
    start = tl.load(STARTS + key)
    end = tl.load(STARTS + key + 1)
    if end > start:
        acc = tl.zeros([BD], tl.float32)
        for e0 in range(start, end, BE):
            e = e0 + tl.arange(0, BE)
            emask = e < end
            entry = tl.load(ORDER + e, mask=emask, other=0)
            vals = tl.load(CONTRIB + entry[:, None] * QK_DIM + d[None, :],
                           mask=emask[:, None] & dmask[None, :], other=0.0)
            acc += tl.sum(vals, 0)
        ptrs = DKV + key * stride_dkv + d
        tl.store(ptrs, tl.load(ptrs, mask=dmask, other=0.0) + acc, mask=dmask)


_KERNELS = {"fwd": _sparse_attention_fwd, "bwd_rows": _sparse_attention_bwd_rows, "gather": _key_gradient_gather}


def _check(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, value_dim: int,
           sinks: torch.Tensor | None) -> None:
    reason = supports(q, kv, indices, sinks)
    if reason is not None:
        raise ValueError(f"triton sparse attention cannot take this input: {reason}")
    if not 1 <= value_dim <= q.shape[2]:
        raise ValueError(f"value_dim {value_dim} not in [1, qk_dim {q.shape[2]}]")


def forward(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float, value_dim: int,
            sinks: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [rows, heads, value_dim] in q's dtype, lse [rows, heads] float32)``."""
    value_dim = int(value_dim)
    _check(q, kv, indices, value_dim, sinks)
    rows, heads, qk_dim = q.shape
    columns = indices.shape[1]
    out = torch.zeros(rows, heads, value_dim, dtype=q.dtype, device=q.device)
    lse = torch.full((rows, heads), float("-inf"), dtype=torch.float32, device=q.device)
    if rows == 0 or columns == 0:
        return out, lse
    q, kv = q.contiguous(), kv.contiguous()
    indices = indices.to(torch.int32).contiguous()
    sinks32 = sinks.detach().float().contiguous() if sinks is not None else lse
    cfg = _config(heads, qk_dim, value_dim, q.dtype)
    grid = (rows, -(-heads // cfg["FWD_BH"]))
    _KERNELS["fwd"][grid](
        q, kv, indices, sinks32, out, lse, columns, float(scale),
        q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), out.stride(0), out.stride(1), lse.stride(0),
        HEADS=heads, QK_DIM=qk_dim, V_DIM=value_dim, HAS_SINKS=sinks is not None, HAS_TAIL=cfg["DT"] > 0,
        BH=cfg["FWD_BH"], BC=cfg["FWD_BC"], DM=cfg["DM"], DT=max(cfg["DT"], 16),
        PRECISION=_precision(q.dtype), num_warps=cfg["FWD_WARPS"], num_stages=cfg["FWD_STAGES"])
    return out, lse


def backward(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float, value_dim: int,
             sinks: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor, *,
             deterministic: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(dq, dkv, dsinks or None)``: dq and dkv in the inputs' dtypes, dsinks in sinks' dtype."""
    value_dim = int(value_dim)
    _check(q, kv, indices, value_dim, sinks)
    rows, heads, qk_dim = q.shape
    keys, columns = kv.shape[0], indices.shape[1]
    dq = torch.zeros_like(q, memory_format=torch.contiguous_format)
    dkv32 = torch.zeros(keys, qk_dim, dtype=torch.float32, device=q.device)
    delta = (grad_out.float() * out.float()).sum(-1)                        # [rows, heads]
    lse = lse.float()
    if sinks is not None:
        lden = torch.logaddexp(lse, sinks.detach().float()[None, :])
        p_sink = torch.where(torch.isfinite(lden), torch.exp(sinks.detach().float()[None, :] - lden),
                             torch.zeros_like(lden))
        dsinks: torch.Tensor | None = (-(p_sink * delta).sum(0)).to(sinks.dtype)
    else:
        lden = lse
        dsinks = None
    if rows == 0 or columns == 0:
        return dq, dkv32.to(kv.dtype), dsinks
    lden = torch.where(torch.isfinite(lden), lden, torch.zeros_like(lden)).contiguous()
    delta = delta.contiguous()
    q, kv = q.contiguous(), kv.contiguous()
    grad_out = grad_out.contiguous()
    indices = indices.to(torch.int32).contiguous()
    cfg = _config(heads, qk_dim, value_dim, q.dtype)
    kernels = _KERNELS
    head_blocks = -(-heads // cfg["BWD_BH"])
    per_row = head_blocks * columns * qk_dim * 4
    chunk = rows if not deterministic else max(1, min(rows, CONTRIB_BUDGET_BYTES // per_row))
    contrib = dkv32 if not deterministic else torch.empty(head_blocks * chunk * columns * qk_dim,
                                                          dtype=torch.float32, device=q.device)
    for row0 in range(0, rows, chunk):
        n = min(chunk, rows - row0)
        kernels["bwd_rows"][(n, head_blocks)](
            q, kv, indices, grad_out, lden, delta, dq, dkv32, contrib,
            row0, chunk, columns, float(scale),
            q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), grad_out.stride(0), grad_out.stride(1),
            lden.stride(0), dq.stride(0), dq.stride(1), dkv32.stride(0),
            HEADS=heads, QK_DIM=qk_dim, V_DIM=value_dim, ATOMIC=not deterministic, HAS_TAIL=cfg["DT"] > 0,
            BH=cfg["BWD_BH"], BC=cfg["BWD_BC"], DM=cfg["DM"], DT=max(cfg["DT"], 16),
            PRECISION=_precision(q.dtype), num_warps=cfg["BWD_WARPS"], num_stages=cfg["BWD_STAGES"])
        if deterministic:
            _gather_key_gradient(kernels["gather"], cfg, indices[row0:row0 + n], head_blocks, chunk,
                                 contrib, dkv32)
    return dq, dkv32.to(kv.dtype), dsinks


def _gather_key_gradient(kernel: Any, cfg: dict[str, int], indices: torch.Tensor, head_blocks: int,
                         chunk: int, contrib: torch.Tensor, dkv32: torch.Tensor) -> None:
    """Adds one row chunk's contributions to ``dkv32``, each key's in entry order (no atomics)."""
    keys, qk_dim = dkv32.shape
    n, columns = indices.shape
    # Entry (head block, local row, column) = (hb * chunk + row) * columns + column.
    ids = indices.long()
    ids = torch.where(ids >= 0, ids, torch.full_like(ids, keys))
    if n < chunk:   # the last chunk: the buffer's rows n..chunk-1 hold stale data, never listed
        ids = torch.cat([ids, torch.full((chunk - n, columns), keys, dtype=ids.dtype, device=ids.device)])
    flat = ids.reshape(1, -1).expand(head_blocks, -1).reshape(-1)
    order = torch.sort(flat, stable=True).indices                         # entries grouped by key, in order
    counts = torch.bincount(flat, minlength=keys + 1)[:keys]
    starts = torch.zeros(keys + 1, dtype=torch.int64, device=flat.device)
    torch.cumsum(counts, 0, out=starts[1:])
    grid = (keys, -(-qk_dim // cfg["GATHER_BD"]))
    if keys == 0:
        return
    kernel[grid](contrib, order, starts, dkv32, dkv32.stride(0),
                 QK_DIM=qk_dim, BE=cfg["GATHER_BE"], BD=cfg["GATHER_BD"], num_warps=cfg["GATHER_WARPS"])


_POINTER_TYPES = {"IDX": "*i32", "ORDER": "*i64", "STARTS": "*i64", "SINKS": "*fp32", "LSE": "*fp32",
                  "LDEN": "*fp32", "DELTA": "*fp32", "DKV": "*fp32", "CONTRIB": "*fp32"}


def _compile_specs(heads: int, qk_dim: int, value_dim: int, dtype: str = "bf16", columns: int = 640) -> list[
        tuple[str, Any, dict[str, str], dict[str, Any], dict[tuple[int, ...], Any], dict[str, int]]]:
    """``(name, kernel, signature, constexprs, attrs, options)`` for each kernel as the launches
    would specialize it at this shape (16-byte aligned pointers, strides and ``columns`` a
    multiple of 16), for ``triton.compile`` against a named target: the compile-only checks."""
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    cfg = _config(heads, qk_dim, value_dim, torch_dtype)
    kernels = _KERNELS
    shape = {"HEADS": heads, "QK_DIM": qk_dim, "V_DIM": value_dim, "HAS_TAIL": cfg["DT"] > 0, "DM": cfg["DM"],
             "DT": max(cfg["DT"], 16), "PRECISION": _precision(torch_dtype)}
    plans: list[tuple[str, str, dict[str, Any], dict[str, int]]] = [
        ("fwd", "fwd", dict(shape, HAS_SINKS=True, BH=cfg["FWD_BH"], BC=cfg["FWD_BC"]),
         {"num_warps": cfg["FWD_WARPS"], "num_stages": cfg["FWD_STAGES"]}),
        ("bwd_rows", "bwd_rows", dict(shape, ATOMIC=False, BH=cfg["BWD_BH"], BC=cfg["BWD_BC"]),
         {"num_warps": cfg["BWD_WARPS"], "num_stages": cfg["BWD_STAGES"]}),
        ("bwd_rows_atomic", "bwd_rows", dict(shape, ATOMIC=True, BH=cfg["BWD_BH"], BC=cfg["BWD_BC"]),
         {"num_warps": cfg["BWD_WARPS"], "num_stages": cfg["BWD_STAGES"]}),
        ("gather", "gather", {"QK_DIM": qk_dim, "BE": cfg["GATHER_BE"], "BD": cfg["GATHER_BD"]},
         {"num_warps": cfg["GATHER_WARPS"], "num_stages": 1}),
    ]
    specs = []
    for name, kernel_name, constexprs, options in plans:
        fn = kernels[kernel_name]
        signature: dict[str, str] = {}
        attrs: dict[tuple[int, ...], Any] = {}
        for i, arg in enumerate(fn.arg_names):
            if arg in constexprs:
                signature[arg] = "constexpr"
                continue
            if arg.isupper():
                signature[arg] = _POINTER_TYPES.get(arg, f"*{dtype}")
            else:
                signature[arg] = "fp32" if arg == "scale" else "i32"
            if arg.isupper() or arg.startswith("stride") or (arg == "columns" and columns % 16 == 0):
                attrs[(i,)] = [["tt.divisibility", 16]]
        specs.append((name, fn, signature, constexprs, attrs, options))
    return specs
