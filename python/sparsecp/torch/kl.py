"""The Lightning Indexer's training loss with autograd (hyper_parallel's
``shared_compressed_indexer_kl_loss``).

A sparse KL divergence, per query row, between the main attention's distribution over the
row's selected keys (the teacher: per-head softmax with an attention-sink logit, sink
column dropped, summed over heads, L1-normalised; a constant) and the indexer's own
``log_softmax`` scores over the same keys (the student), times ``loss_coeff / (B * S)``.
The math, the shapes and the error texts are those of the fused C++ kernel
(``include/sparsecp/kernels/indexer_kl.hpp``), which follows the seed's function:

    I[j]  = sum_h w[t, h] * ReLU(q[t, h] . Kidx[ids[t, j]])        (student scores)
    p[j]  = normalised sum over heads hm of softmax([scale * qatt[hm, t] . Katt[s_j] ...,
            sinks[hm]])[j]                                          (teacher, sink dropped)
    loss  = loss_coeff / (B * S) * sum_t sum_j p[j] * (log p[j] - log_softmax(I)[j])

As in the seed's project, the forward pass computes the loss *and* the three gradients
(index query, index key, merge weights); the backward only scales them by the incoming
gradient (an incoming gradient of exactly 1 on CPU, as ``loss.backward()`` gives, hands
them over without a copy, so a step holds one set of gradient buffers, not two). The
teacher inputs (``attention_query``, ``compressed_key``, ``sinks``) get no gradient: they
are treated as detached, as are the ids.

Kernels by device and dtype:

* CPU tensors of float32 / bfloat16 run sparsecp's fused C++ kernel on the tensors in place
  (zero copy for C-contiguous inputs): no per-row intermediate, scratch independent of the
  row count (``indexer_kl_scratch_bytes``), bit-identical results for any thread count.
* Tensors on any other device, float64 tensors (``torch.autograd.gradcheck``), and CPU
  tensors while the environment variable ``SPARSECP_TORCH_PATH=1`` is set run the chunked
  torch implementation of the same math (``_kl_torch.kl_loss_and_grads_torch``), which holds
  ``[query_chunk_size, TopK, ...]`` intermediates: the path until a device kernel exists.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from .. import _core
from ._kl_torch import kl_loss_and_grads_torch
from ._threads import cpu_threads
from .select import _torch_path, kernel_arg

__all__ = ["indexer_kl_scratch_bytes", "shared_compressed_indexer_kl_loss"]

_KERNEL_FLOATS = (torch.float32, torch.bfloat16)
_FLOATS = (torch.float32, torch.bfloat16, torch.float64)
_NAMES = ("index_query", "index_key", "merge_weight", "attention_query", "compressed_key", "topk_indices",
          "sinks")


def _check_inputs(tensors: tuple[Any, ...], query_chunk_size: Any, main_key_offset: Any, threads: Any) -> None:
    """Types, dtypes and devices; the shapes and values are checked by the kernels (the
    seed's texts)."""
    for tensor, name in zip(tensors, _NAMES):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"Indexer KL {name} must be a torch.Tensor, got {type(tensor).__name__}")
        if name == "topk_indices":
            if tensor.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"Indexer KL topk_indices must be int32 or int64, got {tensor.dtype}")
        elif tensor.dtype not in _FLOATS:
            raise ValueError(f"Indexer KL {name} must be float32, bfloat16 or float64, got {tensor.dtype}")
    query = tensors[0]
    for tensor, name in zip(tensors, _NAMES):
        if name != "topk_indices" and tensor.device != query.device:
            raise ValueError(f"Indexer KL {name} must share Indexer Q's device, got {tensor.device} and "
                             f"{query.device}")
    for value, name in ((query_chunk_size, "query_chunk_size"), (main_key_offset, "main_key_offset"),
                        (threads, "threads")):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"Indexer KL {name} must be an int, got {type(value).__name__}")
    if query_chunk_size < 1:
        raise ValueError(f"query_chunk_size must be positive, got {query_chunk_size}")
    if threads < 0:
        raise ValueError(f"Indexer KL thread count must be non-negative, got {threads}")


def _fused(tensors: tuple[torch.Tensor, ...]) -> bool:
    """True when the fused C++ kernel takes these tensors (CPU, float32 / bfloat16)."""
    return (not _torch_path(tensors[0].device) and all(t.device.type == "cpu" for t in tensors)
            and all(t.dtype in _KERNEL_FLOATS for t, name in zip(tensors, _NAMES) if name != "topk_indices"))


def _contiguous(tensor: torch.Tensor) -> Any:
    tensor = tensor.detach()
    return kernel_arg(tensor if tensor.is_contiguous() else tensor.contiguous())


_Arrays = tuple[Any, Any, Any, Any, Any, Any, Any]


def _arrays(tensors: tuple[torch.Tensor, ...]) -> _Arrays:
    """The seven inputs as the C++ kernels take them (detached, C-contiguous)."""
    q, k, w, attention_query, compressed_key, topk, sinks = (_contiguous(t) for t in tensors)
    return q, k, w, attention_query, compressed_key, topk, sinks


def _seed_topk(tensors: tuple[torch.Tensor, ...]) -> bool:
    """Whether the selection meets the seed's TopK512 rule (``min(512, K) <= TopK <= 512``)."""
    topk_indices, compressed_key = tensors[5], tensors[4]
    keys = compressed_key.shape[-2] if compressed_key.ndim == 3 else 0
    return keys >= 1 and topk_indices.ndim == 3 and min(512, keys) <= topk_indices.shape[-1] <= 512


def _loss_and_grads(tensors: tuple[torch.Tensor, ...], attention_scale: float, loss_coeff: float,
                    main_key_offset: int, query_chunk_size: int, threads: int, seed_topk: bool = True,
                    check_ids: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, grad_index_query, grad_index_key, grad_merge_weight) by the path the tensors
    take; loss float32 (float64 when any float input is float64), gradients float32 (float64
    likewise), on the inputs' device. ``seed_topk`` False waives the seed's TopK512 rule (any
    1 <= TopK <= 512 ids per row, a model's own ``index_topk``): the fused kernel takes those too
    (``any_topk``), the torch path anything else."""
    if _fused(tensors) and (seed_topk or _seed_topk(tensors) or 1 <= tensors[5].shape[-1] <= 512):
        query, key, weight = tensors[:3]
        grad_q = torch.empty(query.shape, dtype=torch.float32)
        grad_k = torch.empty(key.shape, dtype=torch.float32)
        grad_w = torch.empty(weight.shape, dtype=torch.float32)
        loss = _core.indexer_kl_loss(*_arrays(tensors), kernel_arg(grad_q), kernel_arg(grad_k), kernel_arg(grad_w),
                                     float(attention_scale), float(loss_coeff), main_key_offset, cpu_threads(threads),
                                     any_topk=not seed_topk)
        return torch.tensor(loss, dtype=torch.float32), grad_q, grad_k, grad_w
    q, k, w, attention_query, compressed_key, topk, sinks = (t.detach() for t in tensors)
    loss, grad_q, grad_k, grad_w = kl_loss_and_grads_torch(
        q, k, w, attention_query, compressed_key, topk, sinks, attention_scale, loss_coeff, main_key_offset,
        query_chunk_size, seed_topk=seed_topk, check_ids=check_ids)
    return loss.to(grad_q.dtype), grad_q, grad_k, grad_w


class _SharedCompressedIndexerKlLoss(torch.autograd.Function):
    """Loss in the forward with its gradients saved; backward scales them (seed's design)."""

    @staticmethod
    def forward(ctx: Any, index_query: torch.Tensor, index_key: torch.Tensor, merge_weight: torch.Tensor,
                attention_query: torch.Tensor, compressed_key: torch.Tensor, topk_indices: torch.Tensor,
                sinks: torch.Tensor, attention_scale: float, loss_coeff: float, main_key_offset: int,
                query_chunk_size: int, threads: int, seed_topk: bool = True, check_ids: bool = True) -> torch.Tensor:
        tensors = (index_query, index_key, merge_weight, attention_query, compressed_key, topk_indices, sinks)
        loss, grad_q, grad_k, grad_w = _loss_and_grads(tensors, attention_scale, loss_coeff, main_key_offset,
                                                       query_chunk_size, threads, seed_topk, check_ids)
        ctx.save_for_backward(grad_q, grad_k, grad_w)
        ctx.dtypes = (index_query.dtype, index_key.dtype, merge_weight.dtype)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # An incoming gradient of exactly 1 (a loss summed into the total; checked on CPU
        # only, where it costs no device sync) hands the saved gradients over as they are:
        # autograd frees its saved copy first (or copies, when the graph is retained), so no
        # second gradient-sized buffer is made.
        unit = grad_loss.device.type == "cpu" and bool(grad_loss == 1)
        grads: list[torch.Tensor | None] = []
        for grad, dtype, needed in zip(ctx.saved_tensors, ctx.dtypes, ctx.needs_input_grad[:3]):
            if not needed:
                grads.append(None)
            else:
                grads.append((grad if unit else grad * grad_loss.to(grad.dtype)).to(dtype))
        return (*grads, *(None,) * (len(ctx.needs_input_grad) - 3))  # nothing for the ids, teacher, options


def shared_compressed_indexer_kl_loss(
    index_query: torch.Tensor, index_key: torch.Tensor, merge_weight: torch.Tensor,
    attention_query: torch.Tensor, compressed_key: torch.Tensor, topk_indices: torch.Tensor,
    sinks: torch.Tensor, *, attention_scale: float, loss_coeff: float, query_chunk_size: int = 256,
    main_key_offset: int = 0, threads: int = 0,
) -> torch.Tensor:
    """The indexer's sparse KL loss against the attention-sink teacher, with autograd.

    Seed: hyper_parallel's ``shared_compressed_indexer_kl_loss``, same arguments and order.
    Gradients flow to ``index_query``, ``index_key`` and ``merge_weight`` only; they are
    computed in this call (forward) and scaled by the incoming gradient in the backward.

    Args:
        index_query: Indexer Q ``[B, S, H, D]`` (after RoPE), float32 or bfloat16 (float64:
            torch path).
        index_key: The compressed Index K bank ``[B, Ki, D]``; the student's keys are rows
            ``[main_key_offset, main_key_offset + K)``.
        merge_weight: ``[B, S, H]``, already scaled by ``head_dim**-0.5 * heads**-0.5``.
        attention_query: Main attention Q ``[B, Hm, S, Dm]``, **head-major** as attention
            uses it (a non-contiguous view is copied once).
        compressed_key: The teacher's (compact) compressed key bank ``[B, K, Dm]``.
        topk_indices: ``[B, S, TopK]`` int32 or int64 rows of ``index_key``, ``-1`` padded
            (a duplicated id counts twice); ``min(512, K) <= TopK <= 512``.
        sinks: Attention-sink logits ``[Hm]``.
        attention_scale: Scale of the teacher's logits ``qatt . Katt`` (``Dm**-0.5``
            usually).
        loss_coeff: The loss is ``loss_coeff / (B * S)`` times the sum of row losses; ``0``
            returns a zero loss with zero gradients without computing.
        query_chunk_size: Query rows per chunk of the torch path (bounds its
            ``[chunk, TopK, Dm]`` intermediates); the fused kernel needs no chunking.
        main_key_offset: Compact teacher bank (seed 000): ``compressed_key`` holds rows
            ``[main_key_offset, main_key_offset + K)`` of ``index_key``'s bank and ids are
            ``index_key`` rows; rows of ``index_key`` outside that range get zero gradient.
            The seed's caller slices ``index_key`` and shifts the ids instead; both give the
            same loss and gradients.
        threads: Fused kernel threads (0: torch's, ``torch.get_num_threads()``); never changes results.

    Returns:
        The scalar loss: float32 (float64 when any float input is float64), on the inputs'
        device.

    Raises:
        ValueError: the seed's texts ("Fused KL indices must have shape [B, Q, TopK]
            matching Indexer Q", "Fused KL requires ordinary TopK512 selections, allowing
            padding for a compact bank; got K=..., TopK=...", "Fused KL indices must share
            Indexer Q's device, got ..."), an id outside the bank (named with its position),
            and any other shape, dtype or option mismatch.
        TypeError: an argument that is not a tensor (or an int option that is not an int).

    Example::

        loss = shared_compressed_indexer_kl_loss(q, k_bank, w, q_attention, k_attention, topk, sinks,
                                                 attention_scale=512 ** -0.5, loss_coeff=1.0)
        loss.backward()   # q.grad, k_bank.grad, w.grad
    """
    tensors = (index_query, index_key, merge_weight, attention_query, compressed_key, topk_indices, sinks)
    _check_inputs(tensors, query_chunk_size, main_key_offset, threads)
    if torch.compiler.is_compiling():  # traced: the custom op (below), same kernel and gradients
        return indexer_kl_loss(*tensors, attention_scale=attention_scale, loss_coeff=loss_coeff,
                               query_chunk_size=query_chunk_size, main_key_offset=main_key_offset, threads=threads)
    return _SharedCompressedIndexerKlLoss.apply(*tensors, float(attention_scale), float(loss_coeff),
                                                operator.index(main_key_offset), query_chunk_size, threads)


def indexer_kl_scratch_bytes(index_query: torch.Tensor, index_key: torch.Tensor, merge_weight: torch.Tensor,
                             attention_query: torch.Tensor, compressed_key: torch.Tensor,
                             topk_indices: torch.Tensor, sinks: torch.Tensor, *, main_key_offset: int = 0,
                             threads: int = 0, any_topk: bool = False) -> int:
    """Upper bound of the fused CPU kernel's scratch memory in bytes for these shapes, dtypes
    and ``threads`` (0: torch's, ``torch.get_num_threads()``), beyond the three gradients it returns:
    independent of B and S. The tensors must be CPU float32 / bfloat16 (their values are not
    read). ``any_topk``: for ``indexer_kl_loss_any_topk``'s selections (any 1 <= TopK <= 512),
    not only those the seed's TopK512 rule accepts."""
    tensors = (index_query, index_key, merge_weight, attention_query, compressed_key, topk_indices, sinks)
    _check_inputs(tensors, 1, main_key_offset, threads)
    if not all(t.device.type == "cpu" for t in tensors):
        raise ValueError("indexer_kl_scratch_bytes describes the fused CPU kernel: pass CPU tensors")
    return _core.indexer_kl_scratch_bytes(*_arrays(tensors), main_key_offset, cpu_threads(threads),
                                          any_topk=bool(any_topk))


def indexer_kl_loss_any_topk(
    index_query: torch.Tensor, index_key: torch.Tensor, merge_weight: torch.Tensor,
    attention_query: torch.Tensor, compressed_key: torch.Tensor, topk_indices: torch.Tensor,
    sinks: torch.Tensor, *, attention_scale: float, loss_coeff: float, query_chunk_size: int = 256,
    main_key_offset: int = 0, trusted_ids: bool = False, threads: int = 0,
) -> torch.Tensor:
    """``shared_compressed_indexer_kl_loss`` at any top-k (for a model's own ``index_topk``).

    The seed's entry point keeps its TopK512 rule (``min(512, K) <= TopK <= 512``, its NPU
    op's limit). A model whose indexer keeps another number of ids per row (small test
    configurations, V4 variants) calls this instead: the same math, arguments and gradients;
    selections the seed accepts take the fused kernel where it applies, others the chunked torch
    path. ``trusted_ids``: the ids come from the caller's own selection against these banks (a
    model layer's): the torch path skips reading them back to check their range, a host sync
    per call on a GPU. ``threads``: the fused kernel's threads (0: torch's, ``torch.get_num_threads()``), as
    in ``shared_compressed_indexer_kl_loss``."""
    tensors = (index_query, index_key, merge_weight, attention_query, compressed_key, topk_indices, sinks)
    _check_inputs(tensors, query_chunk_size, main_key_offset, threads)
    return _SharedCompressedIndexerKlLoss.apply(*tensors, float(attention_scale), float(loss_coeff),
                                                operator.index(main_key_offset), query_chunk_size, threads, False,
                                                not trusted_ids)


# --------------------------------------------------------------------------------------
# The loss as a torch.library custom op (torch.ops.sparsecp.indexer_kl_loss): what
# torch.compile traces; sparsecp.torch.ops documents it with the selection ops.

@torch.library.custom_op("sparsecp::indexer_kl_loss", mutates_args=())
def _indexer_kl_loss(index_query: torch.Tensor, index_key: torch.Tensor, merge_weight: torch.Tensor,
                     attention_query: torch.Tensor, compressed_key: torch.Tensor, topk_indices: torch.Tensor,
                     sinks: torch.Tensor, attention_scale: float, loss_coeff: float, main_key_offset: int,
                     query_chunk_size: int, threads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                   torch.Tensor]:
    """(loss, grad_index_query, grad_index_key, grad_merge_weight): this module's forward."""
    tensors = (index_query, index_key, merge_weight, attention_query, compressed_key, topk_indices, sinks)
    _check_inputs(tensors, query_chunk_size, main_key_offset, threads)
    loss, grad_q, grad_k, grad_w = _loss_and_grads(tensors, attention_scale, loss_coeff, main_key_offset,
                                                   query_chunk_size, threads)
    return loss.clone(), grad_q, grad_k, grad_w  # clone: a fresh tensor, never an alias


@_indexer_kl_loss.register_fake
def _(index_query: torch.Tensor, index_key: torch.Tensor, merge_weight: torch.Tensor, attention_query: torch.Tensor,
      compressed_key: torch.Tensor, topk_indices: torch.Tensor, sinks: torch.Tensor, attention_scale: float,
      loss_coeff: float, main_key_offset: int, query_chunk_size: int,
      threads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    floats = (index_query, index_key, merge_weight, attention_query, compressed_key, sinks)
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in floats) else torch.float32
    return (index_query.new_empty((), dtype=dtype), index_query.new_empty(index_query.shape, dtype=dtype),
            index_key.new_empty(index_key.shape, dtype=dtype), merge_weight.new_empty(merge_weight.shape, dtype=dtype))


def _kl_setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    _, grad_q, grad_k, grad_w = output
    ctx.save_for_backward(grad_q, grad_k, grad_w)
    ctx.dtypes = (inputs[0].dtype, inputs[1].dtype, inputs[2].dtype)
    ctx.mark_non_differentiable(grad_q, grad_k, grad_w)


def _kl_backward(ctx: Any, grad_loss: torch.Tensor, *unused: Any) -> tuple[torch.Tensor | None, ...]:
    grads = tuple((grad * grad_loss.to(grad.dtype)).to(dtype) for grad, dtype in zip(ctx.saved_tensors, ctx.dtypes))
    return (*grads, None, None, None, None, None, None, None, None, None)


torch.library.register_autograd("sparsecp::indexer_kl_loss", _kl_backward, setup_context=_kl_setup_context)


def indexer_kl_loss(index_query: torch.Tensor, index_key: torch.Tensor, merge_weight: torch.Tensor,
                    attention_query: torch.Tensor, compressed_key: torch.Tensor, topk_indices: torch.Tensor,
                    sinks: torch.Tensor, *, attention_scale: float, loss_coeff: float, query_chunk_size: int = 256,
                    main_key_offset: int = 0, threads: int = 0) -> torch.Tensor:
    """``shared_compressed_indexer_kl_loss`` through the custom op (same arguments,
    results and gradients): traceable by torch.compile with ``fullgraph=True``."""
    return torch.ops.sparsecp.indexer_kl_loss(index_query, index_key, merge_weight, attention_query,
                                              compressed_key, topk_indices, sinks, float(attention_scale),
                                              float(loss_coeff), operator.index(main_key_offset),
                                              operator.index(query_chunk_size), operator.index(threads))[0]
