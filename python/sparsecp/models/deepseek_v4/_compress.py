"""The compressed entries a rank owns, computed as transformers' DeepSeek-V4 compressors do.

``DeepseekV4HCACompressor`` turns each closed window of ``m`` tokens into one entry: a
softmax-gated (gate + ``position_bias``, softmax in float32 as the model does) sum of the
window's ``kv_proj`` rows, ``kv_norm``, then RoPE at the window's first position ``w * m``.
``DeepseekV4CSACompressor`` and the Lightning Indexer's own compressor project to two series
(``[..., :head_dim]`` = Ca, ``[..., head_dim:]`` = Cb); entry ``w`` gates ``2m`` slots: window
``w - 1``'s Ca then window ``w``'s Cb (entry 0's Ca slots: zero value, ``-inf`` gate).

Run on one document alone, the model computes every entry of the document; here a rank
computes only the entries it owns, from the rows gathered by ``CompressionLayout.compressor``
(each document's windows restart at its first token), so entries of one document are the same
values wherever they are computed: the same per-entry operations in the same slot order.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ._layout import DeviceCompression

__all__ = ["owned_entries"]


def owned_entries(compressor: Any, block: torch.Tensor, tables: DeviceCompression, head_dim: int,
                  rope: Callable[..., torch.Tensor]) -> torch.Tensor:
    """This rank's compressed entries ``[owned entries, head_dim]``.

    Args:
        compressor: The model's module holding ``kv_proj``, ``gate_proj``, ``position_bias``,
            ``kv_norm`` and ``rotary_emb`` (a CSA or HCA compressor, or the indexer).
            Its entries are float32 softmax-gated sums, as the model computes them.
        block: The gathered layer input rows ``[rows, hidden]`` of ``layout.compressor``.
        tables: The ratio's tables on the device (which rows fill which slots; positions).
        head_dim: The entry width (the model's ``head_dim`` or ``index_head_dim``).
        rope: The model's ``apply_rotary_pos_emb``.
    """
    m = tables.layout.ratio
    # No early return for a rank that owns no entry: its empty result must stay connected to
    # `block` (and so to the dispatch that gathered it), or its backward would skip a
    # collective its peers run.
    kv = compressor.kv_proj(block)
    gate = compressor.gate_proj(block)
    rows = tables.slot_rows
    valid = rows >= 0
    safe = rows.clamp_min(0)
    bias = compressor.position_bias  # [m, width]
    if tables.layout.overlap:
        ca = valid[:, :m, None]
        ca_kv = kv[safe[:, :m], :head_dim].masked_fill(~ca, 0)
        ca_gate = (gate[safe[:, :m], :head_dim] + bias[:, :head_dim]).masked_fill(~ca, float("-inf"))
        cb_kv = kv[safe[:, m:], head_dim:]
        cb_gate = gate[safe[:, m:], head_dim:] + bias[:, head_dim:]
        slot_kv, slot_gate = torch.cat([ca_kv, cb_kv], dim=1), torch.cat([ca_gate, cb_gate], dim=1)
    else:
        slot_kv, slot_gate = kv[safe], gate[safe] + bias
    weights = slot_gate.softmax(dim=1, dtype=torch.float32).to(slot_kv.dtype)
    compressed = compressor.kv_norm((slot_kv * weights).sum(dim=1))[None]  # [1, entries, head_dim]
    positions = tables.positions
    cos, sin = compressor.rotary_emb(compressed, position_ids=positions, layer_type=compressor.rope_layer_type)
    return rope(compressed.unsqueeze(1), cos, sin)[0, 0]
