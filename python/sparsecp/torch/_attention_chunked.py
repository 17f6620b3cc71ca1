"""Attention over each row's own gathered keys, in bounded memory (the FlashAttention recipe).

A context-parallel sparse-attention layer attends each query row to a few keys of its own: its
sliding window, the compressed ids its indexer selected, a document prefix. Gathering those keys
for every row of a shard at once (``[rows, columns, head_dim]``) and the logits over them
(``[heads, rows, columns]``) grows with the shard, and at the lengths context parallelism exists
for it is what runs out of memory first. Here the rows go in chunks sized by a byte budget: the
forward keeps each row's output and log-sum-exp, the backward recomputes each chunk's scores from
them (``dS = P * (dP - rowsum(dO * O))``), and the key gradients are summed into the key rows
with ``index_add_``. What is saved for backward is the inputs, the output and the log-sum-exp.

The softmax includes an optional per-head *sink* logit (DeepSeek-V4's ``sinks``): a column with
no value whose probability mass is dropped, exactly as the model's ``cat([logits, sinks])``,
softmax, ``[..., :-1]``. A row that sees no key and has no sink outputs zeros.

Math is done in the inputs' dtype for the products (as the model's eager path does) and in
float32 (float64 for float64 inputs) for the exponentials and sums.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["ColumnSource", "attention_chunk_rows", "sparse_attention"]

# (start, stop) -> (index [rows, columns] int64 into the key rows, valid [rows, columns] bool)
ColumnSource = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]

DEFAULT_CHUNK_BYTES = 64 << 20


def attention_chunk_rows(columns: int, heads: int, head_dim: int, value_dim: int, element_bytes: int,
                         budget: int = DEFAULT_CHUNK_BYTES) -> int:
    """Query rows per chunk so that one chunk's scratch fits ``budget`` bytes: the gathered keys
    and values and their gradients (``[rows, columns, dim]``, twice) and three ``[heads, rows,
    columns]`` score tensors (logits, probabilities, their gradient)."""
    per_row = columns * (2 * (head_dim + value_dim) * element_bytes + 3 * heads * max(element_bytes, 4))
    return max(1, budget // max(per_row, 1))


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunk_scores(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, scale: float) -> torch.Tensor:
    """[heads, rows, columns] logits in the accumulation dtype, -inf where not valid.

    ``keys`` is ``[rows, columns, dim]`` (one key head shared by every query head) or
    ``[rows, columns, heads, dim]``."""
    if keys.ndim == 3:
        logits = torch.einsum("hrd,rcd->hrc", q, keys)
    else:
        logits = torch.einsum("hrd,rchd->hrc", q, keys)
    logits = logits.to(_accumulate_dtype(q.dtype)) * scale
    return logits.masked_fill(~valid[None], float("-inf"))


def _log_sum_exp(logits: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """[heads, rows]: log of the softmax denominator, the sink column included."""
    if sinks is not None:
        sink = sinks.to(logits.dtype)[:, None, None].expand(-1, logits.shape[1], 1)
        logits = torch.cat([logits, sink], dim=-1)
    return torch.logsumexp(logits, dim=-1)


def _probabilities(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """exp(logits - lse), 0 where the row has no finite denominator (it sees nothing)."""
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    return torch.exp(logits - safe[..., None])


class _SparseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor | None,
                sinks: torch.Tensor | None, columns: ColumnSource, scale: float, chunk: int) -> torch.Tensor:
        heads, rows = q.shape[0], q.shape[1]
        value_dim = (keys if values is None else values).shape[-1]
        out = q.new_empty((heads, rows, value_dim))
        lse = torch.empty((heads, rows), dtype=_accumulate_dtype(q.dtype), device=q.device)
        for start in range(0, rows, chunk):
            stop = min(rows, start + chunk)
            index, valid = columns(start, stop)
            gathered_keys = keys[index]
            logits = _chunk_scores(q[:, start:stop], gathered_keys, valid, scale)
            lse[:, start:stop] = _log_sum_exp(logits, sinks)
            probs = _probabilities(logits, lse[:, start:stop]).to(q.dtype)
            gathered = gathered_keys if values is None else values[index]
            del gathered_keys
            if gathered.ndim == 3:
                out[:, start:stop] = torch.einsum("hrc,rcd->hrd", probs, gathered)
            else:
                out[:, start:stop] = torch.einsum("hrc,rchd->hrd", probs, gathered)
        ctx.save_for_backward(q, keys, values, sinks, out, lse)
        ctx.columns, ctx.scale, ctx.chunk = columns, scale, chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        q, keys, values, sinks, out, lse = ctx.saved_tensors
        columns, scale, chunk = ctx.columns, ctx.scale, ctx.chunk
        accumulate = _accumulate_dtype(q.dtype)
        grad_out = grad_out.contiguous()
        grad_q = torch.zeros_like(q)
        grad_keys = torch.zeros_like(keys)
        grad_values = None if values is None else torch.zeros_like(values)
        grad_sinks = None if sinks is None else torch.zeros(sinks.shape, dtype=accumulate, device=sinks.device)
        shared = keys.ndim == 2  # one key head for every query head
        for start in range(0, q.shape[1], chunk):
            stop = min(q.shape[1], start + chunk)
            index, valid = columns(start, stop)
            q_chunk, d_out = q[:, start:stop], grad_out[:, start:stop]
            gathered_keys = keys[index]
            gathered_values = gathered_keys if values is None else values[index]
            logits = _chunk_scores(q_chunk, gathered_keys, valid, scale)
            probs = _probabilities(logits, lse[:, start:stop])  # [heads, rows, columns]
            # rowsum(dO * O): the softmax's backward without the full probability matrix.
            delta = (d_out.to(accumulate) * out[:, start:stop].to(accumulate)).sum(-1)  # [heads, rows]
            if shared:
                d_probs = torch.einsum("hrd,rcd->hrc", d_out, gathered_values).to(accumulate)
            else:
                d_probs = torch.einsum("hrd,rchd->hrc", d_out, gathered_values).to(accumulate)
            d_logits = (probs * (d_probs - delta[..., None])).masked_fill(~valid[None], 0)
            if grad_sinks is not None:  # the sink's value is zero: d(sink) = -p_sink * delta
                chunk_lse = lse[:, start:stop]  # a row with no key and a -inf sink has none to differentiate
                p_sink = torch.where(torch.isfinite(chunk_lse), torch.exp(sinks.to(accumulate)[:, None] - chunk_lse),
                                     torch.zeros_like(chunk_lse))  # [heads, rows]
                grad_sinks -= (p_sink * delta).sum(1)
            d_logits = (d_logits * scale).to(q.dtype)
            probs = probs.to(q.dtype)
            flat = index.reshape(-1)
            if shared and values is None:  # K = V: both gradients in one product over [2 heads]
                grad_q[:, start:stop] = torch.einsum("hrc,rcd->hrd", d_logits, gathered_keys)
                d_keys = torch.einsum("hrc,hrd->rcd", torch.cat([d_logits, probs]), torch.cat([q_chunk, d_out]))
                grad_keys.index_add_(0, flat, d_keys.reshape(flat.shape[0], *keys.shape[1:]))
                continue
            if shared:
                grad_q[:, start:stop] = torch.einsum("hrc,rcd->hrd", d_logits, gathered_keys)
                d_keys = torch.einsum("hrc,hrd->rcd", d_logits, q_chunk)
                d_values = torch.einsum("hrc,hrd->rcd", probs, d_out)
            else:
                grad_q[:, start:stop] = torch.einsum("hrc,rchd->hrd", d_logits, gathered_keys)
                d_keys = torch.einsum("hrc,hrd->rchd", d_logits, q_chunk)
                d_values = torch.einsum("hrc,hrd->rchd", probs, d_out)
            # Columns that are not valid carry zero gradient (their probability and d_logits are 0).
            if grad_values is None:  # per-head K = V
                grad_keys.index_add_(0, flat, (d_keys + d_values).reshape(flat.shape[0], *keys.shape[1:]))
            else:
                grad_keys.index_add_(0, flat, d_keys.reshape(flat.shape[0], *keys.shape[1:]))
                grad_values.index_add_(0, flat, d_values.reshape(flat.shape[0], *grad_values.shape[1:]))
        grad_sinks_out = None if grad_sinks is None else grad_sinks.to(sinks.dtype)
        return grad_q, grad_keys, grad_values, grad_sinks_out, None, None, None


def sparse_attention(q: torch.Tensor, keys: torch.Tensor, columns: ColumnSource, *, scale: float,
                     values: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                     chunk_rows: int) -> torch.Tensor:
    """Each query row's softmax attention over the key rows ``columns`` names for it.

    Args:
        q: ``[heads, rows, dim]``.
        keys: The key rows, ``[keys, dim]`` (one head shared by every query head: DeepSeek-V4's
            K=V) or ``[keys, heads, dim]``.
        columns: ``columns(start, stop)`` gives rows ``[start, stop)``'s ``(index, valid)``,
            each ``[stop - start, columns]``: key rows, and which of them the row attends
            (invalid columns may hold any in-range row).
        scale: Logit scale.
        values: The value rows (``keys``'s layout); None: the keys are also the values.
        sinks: ``[heads]`` sink logits, or None.
        chunk_rows: Query rows per chunk (``attention_chunk_rows``).

    Returns:
        ``[heads, rows, value dim]``, differentiable in ``q``, ``keys``, ``values`` and ``sinks``.
    """
    if chunk_rows < 1:
        raise ValueError(f"sparse attention chunk_rows must be positive, got {chunk_rows}")
    return _SparseAttention.apply(q, keys, values, sinks, columns, float(scale), int(chunk_rows))
