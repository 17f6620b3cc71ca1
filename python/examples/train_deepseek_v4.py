#!/usr/bin/env python3
"""Train a small transformers DeepSeek-V4 under context parallelism, one strategy against another.

Every step, each strategy (``--modes``, interleaved: none, zigzag, hybrid, spill, and spill on
its default cost model, by default) trains its own copy of the same randomly initialised
``DeepseekV4ForCausalLM`` on the same packed batch, split contiguously over ``--ranks`` gloo
ranks with ``sparsecp.models.deepseek_v4``: the sliding-window halo and compressed-bank
prefixes move between ranks, the CSA indexer's top-k selection is balanced by the strategy,
the indexer trains on its KL loss, AdamW updates the replicated weights. The copies see the
same data and must report the same losses (each equals the model run one document at a time);
what differs is where the selection work runs.

Batches: ``--tokens`` tokens per step packed from documents of sparsecp's long-tailed
``lognormal`` generator (``sparsecp.generate_batch("lognormal", tokens, cp, seed)``: most
documents short, a few as long as a whole shard or longer), one seed per step.

Sizes (the defaults): hidden 128, 4 layers (sliding, CSA, HCA, CSA), 4 attention heads of 64,
window 64, CSA ratio 4, HCA ratio 32, an indexer of 32 heads of 64 (V4.1's head count, half its
head width) with top-k 128, 4 experts (2 active) of width 64, 16384 tokens a step (4096 a rank).
The indexer scores every visible compressed key of every row (``len / 4`` keys at the end of a
document, each against 32 heads), so with documents of thousands of tokens it is a real part of
the step, while the rest of the model (a 128-wide MoE transformer) stays small enough for a CPU:
the regime the balancing is for.

Per step and strategy it prints the loss (summed over ranks), the step time (slowest rank), and
per rank the indexer's share of the step (owner-side indexer work, selection exchange and
worker selection); at the end, medians per strategy: step time, the selection work's imbalance
(max / mean of the ranks' selector seconds), the indexer's share, bytes each rank sent (halo,
compressor rows, bank prefixes, Index K bank; selection exchange), and each rank's peak memory
against one process running the whole batch (resident set growth during the steps).

spill calibrates its cost model on the worker selector by itself (``context_parallel``: rank 0
times the selector in the first forward, every rank refits from the measured selection times of
later steps); ``NAME-uncalibrated`` runs a strategy with ``calibrate=False`` (spill on causal
pairs). The step is also charged in CPU seconds (each rank's own work: with more ranks than
cores, a rank's wall time counts its peers' turns on the core): per strategy the slowest rank's
step, its gain over the first strategy's, and the bound a perfect balancer of the first
strategy's selection could reach, ``(R + I * m) / (R + m)`` (m: the mean of the ranks' selector
seconds, I: their max / mean, R: the rest of the step, the mean of the ranks' step CPU seconds
less their selector seconds). Each gain and each ratio to the first strategy is the median of the
per-step ratios with its 95% interval, "within noise" where that interval holds 1 (``sparsecp
run``'s convention: a difference is claimed only from 6 steps); a run of one strategy (``--modes
spill``) compares nothing. The driver shared with the V3.2 example is ``cp_training_driver.py``.

With ``--dp D`` it trains the way large models are trained: D x ``--ranks`` gloo processes on a
``(dp, cp)`` DeviceMesh, each dp row its own packed batch, ``context_parallel`` over
``mesh["cp"]``, then FSDP2 (``fully_shard``) of every layer and the model over the flattened
dp x cp mesh (no hand all-reduce), the loss the mean over the valid tokens of the global batch
(``causal_lm_loss(..., group=flat)``) plus the KL times the CP size. Each rank then reports its
parameter, gradient and AdamW-state bytes (the replicated run reports them too: every rank holds
the whole model).

Usage::

    python python/examples/train_deepseek_v4.py --ranks 4
    python python/examples/train_deepseek_v4.py --ranks 2 --dp 2 --modes spill --steps 2 --tokens 4096
    python python/examples/train_deepseek_v4.py --ranks 4 --steps 5 --selector fused --json out.json
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import cp_training_driver as driver


def model_config(args: argparse.Namespace) -> Any:
    from transformers import DeepseekV4Config

    return DeepseekV4Config(
        vocab_size=512, hidden_size=args.hidden, moe_intermediate_size=args.hidden // 2, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, head_dim=64, q_lora_rank=64, num_experts_per_tok=2,
        n_routed_experts=4, n_shared_experts=1,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 32},
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"], sliding_window=64, o_groups=2, o_lora_rank=64,
        index_n_heads=args.index_heads, index_head_dim=64, index_topk=args.topk, hc_mult=2, hc_sinkhorn_iters=5,
        max_position_embeddings=1 << 20, attn_implementation="eager", experts_implementation="eager")


def build_model(args: argparse.Namespace) -> Any:
    """The V4 of the flags. It initialises its attention sinks, position biases and hash-routing
    table to 0; they get random values here, so every part of the model is exercised."""
    import torch
    from transformers import DeepseekV4ForCausalLM

    model = DeepseekV4ForCausalLM(model_config(args))
    generator = torch.Generator().manual_seed(args.seed)
    experts = model.config.n_routed_experts
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, tensor in tensors.items():
            leaf = name.rpartition(".")[2]
            if leaf in ("sinks", "position_bias"):
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.5)
            elif leaf == "tid2eid":
                tensor.copy_(torch.randint(0, experts, tensor.shape, generator=generator))
    return model


def describe(args: argparse.Namespace) -> str:
    return f"CSA's top-{args.topk} of the compressed keys, {args.index_heads} index heads"


EXAMPLE = driver.Example(title="DeepSeek-V4", models="sparsecp.models.deepseek_v4", build_model=build_model,
                         describe=describe, baseline_steps=2)


def main() -> int:
    parser = driver.argument_parser(__doc__, modes="none,zigzag,hybrid,spill,spill-uncalibrated", steps=5)
    parser.add_argument("--selector", default="model",
                        help="workers score with the model's torch math ('model') or sparsecp's fused CPU kernel "
                             "('fused'); 'model,fused' runs every strategy with each, interleaved")
    args = parser.parse_args()
    driver.check_arguments(parser, args)
    return driver.train(EXAMPLE, args)


if __name__ == "__main__":
    sys.exit(main())
