"""A compact DSA model in plain PyTorch (not transformers'), and its sparsecp adapter.

``TinyDSA`` is a decoder of ``DSABlock``s: each attention keeps, per token, the top-k earlier tokens
of a Lightning-Indexer-style score (``sum_h w_h ReLU(q_h . k)``, ties to the earlier token) and
attends them with one shared K=V row per token (MQA). Run on one document, it is the reference.

``TinyDSAAdapter`` is everything sparsecp needs to train it under context parallelism (the guide
docs/guide/your-model.md walks through it): the ratio-1 layout (``PrefixLayout``), the attention
layer's CP forward from the engine's pieces, and a worker selector on ``ChunkedTopKSelector``.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from sparsecp.models import FORWARD_KWARG, ChunkedTopKSelector, PrefixLayout, select_or_replay


class DSAAttention(nn.Module):
    def __init__(self, layer: int, hidden: int, heads: int, head_dim: int, index_heads: int, index_dim: int,
                 topk: int) -> None:
        super().__init__()
        self.layer, self.heads, self.head_dim, self.topk = layer, heads, head_dim, topk
        self.index_heads, self.index_dim = index_heads, index_dim
        self.wq, self.wkv = nn.Linear(hidden, heads * head_dim), nn.Linear(hidden, head_dim)
        self.wo = nn.Linear(heads * head_dim, hidden)
        self.index_q, self.index_k = nn.Linear(hidden, index_heads * index_dim), nn.Linear(hidden, index_dim)
        self.index_w = nn.Linear(hidden, index_heads)

    def index_scores(self, q: torch.Tensor, keys: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """[rows, keys]: ``sum_h w[r, h] ReLU(q[r, h] . keys[k])`` (q [rows, heads, dim], w [rows, heads])."""
        return (torch.relu(torch.einsum("rhd,kd->rhk", q, keys)) * w[:, :, None]).sum(1)

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """One document ``x`` [1, L, hidden]."""
        rows = x.shape[1]
        q_index = self.index_q(x)[0].view(rows, self.index_heads, self.index_dim)
        scores = self.index_scores(q_index, self.index_k(x)[0], self.index_w(x)[0])
        causal = torch.ones(rows, rows, dtype=torch.bool, device=x.device).tril()
        order = torch.sort(scores.masked_fill(~causal, float("-inf")), dim=1, descending=True, stable=True).indices
        keep = torch.zeros_like(causal).scatter_(1, order[:, :self.topk], True) & causal
        q, kv = self.wq(x)[0].view(rows, self.heads, self.head_dim), self.wkv(x)[0]
        logits = torch.einsum("lhd,kd->hlk", q, kv) * self.head_dim ** -0.5
        attended = torch.einsum("hlk,kd->lhd", logits.masked_fill(~keep, float("-inf")).softmax(-1), kv)
        return self.wo(attended.reshape(1, rows, -1))


class DSABlock(nn.Module):
    def __init__(self, layer: int, hidden: int, **attention: int) -> None:
        super().__init__()
        self.norm, self.attn = nn.LayerNorm(hidden), DSAAttention(layer, hidden, **attention)
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))

    def run(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        x = x + self.attn(self.norm(x), **kwargs)  # the model hands its keyword arguments on
        return x + self.mlp(x)


class TinyDSA(nn.Module):
    def __init__(self, vocab: int = 61, hidden: int = 24, layers: int = 2, checkpointing: bool = False,
                 **attention: int) -> None:
        super().__init__()
        settings = dict(heads=3, head_dim=8, index_heads=4, index_dim=6, topk=3) | attention
        self.vocab, self.checkpointing = vocab, checkpointing
        self.embed, self.head = nn.Embedding(vocab, hidden), nn.Linear(hidden, vocab, bias=False)
        self.blocks = nn.ModuleList(DSABlock(i, hidden, **settings) for i in range(layers))

    def forward(self, input_ids: torch.Tensor, position_ids: Any = None, **kwargs: Any) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = checkpoint(block.run, x, use_reentrant=False, **kwargs) if self.checkpointing else \
                block.run(x, **kwargs)
        return self.head(x)


class TinySelector(ChunkedTopKSelector):
    """The indexer's math on a worker's rows: the owners send the layer input as the residual."""

    ratio = 1

    def __init__(self, attention: DSAAttention, bank: Any) -> None:
        super().__init__(bank)
        self.attention, self.topk = attention, attention.topk

    def chunk_inputs(self, residual: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attn = self.attention
        return attn.index_q(residual)[0].view(residual.shape[1], attn.index_heads, attn.index_dim), weights[0]

    def merge_width(self, rows: int, queries: torch.Tensor) -> int:
        return max(self.topk, 4096)

    def scores(self, queries: torch.Tensor, weights: torch.Tensor, begin: int, end: int) -> torch.Tensor:
        return self.attention.index_scores(queries, self.bank[begin:end], weights)


class TinyDSAAdapter:
    """``sparsecp.models.ModelAdapter`` for ``TinyDSA``."""

    name, module_name, ratio = "TinyDSA", "tests", 1

    def base(self, model: nn.Module) -> nn.Module:
        if not isinstance(model, TinyDSA):
            raise TypeError(f"TinyDSAAdapter takes a TinyDSA, got {type(model).__name__}")
        return model

    def attention_modules(self, base: Any) -> list[nn.Module]:
        return [block.attn for block in base.blocks]

    def prepare(self, state: Any, base: nn.Module) -> None:
        if state.kl_coeff is not None:
            raise ValueError("TinyDSA has no indexer KL: leave indexer_kl_coeff unset")

    def layout(self, lengths: tuple[int, ...], size: int, rank: int) -> PrefixLayout:
        return PrefixLayout(lengths, size, rank)  # ratio 1: each row's document prefix

    def vocab_size(self, base: Any) -> int:
        return int(base.vocab)

    def calibration(self, state: Any, base: nn.Module) -> None:
        return None  # spill plans with its default cost model

    def install(self, model: nn.Module, base: nn.Module, state: Any) -> None:
        pass

    def forward_kwargs(self, kwargs: dict[str, Any]) -> None:
        pass

    def attention_forward(self, attn: Any, state: Any, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        context = state.context(kwargs.get(FORWARD_KWARG))
        layout, rows = context.layout, x.shape[1]
        q, kv = attn.wq(x)[0].view(rows, attn.heads, attn.head_dim), attn.wkv(x)[0]
        prefix = state.gather(kv, layout.prefix, context)  # each own row's document prefix, from its owners
        no_rope = x.new_zeros(1, rows, 1)

        def inputs() -> tuple[torch.Tensor, ...]:
            return x.detach(), attn.index_w(x), no_rope, no_rope

        ids, _ = select_or_replay(state, context, attn.layer, layout, lambda: attn.index_k(x.detach())[0], inputs,
                                  lambda bank: TinySelector(attn, bank), attn.topk)
        indices = torch.where(ids >= 0, ids - layout.batch.prefix_start, -1).to(torch.int32)
        attended = state.attend(q, prefix, indices, attn.head_dim ** -0.5)  # [rows, heads, head_dim]
        return attn.wo(attended.reshape(1, rows, -1))
