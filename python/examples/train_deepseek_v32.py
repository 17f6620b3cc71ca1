#!/usr/bin/env python3
"""Train a small transformers DeepSeek-V3.2 under context parallelism, one strategy against another.

Every step, each strategy (``--modes``, interleaved: none, zigzag, greedy, hybrid, spill, and
spill on its default cost model by default) trains its own copy of the same randomly initialised
``DeepseekV32ForCausalLM`` on the same packed batch, split contiguously over ``--ranks`` gloo
ranks with ``sparsecp.models.deepseek_v32``: each rank gathers its rows' document prefix of the
MLA latent, the indexer's top-k selection over every earlier token (ratio 1) is balanced by the
strategy, the indexer trains on its KL loss, AdamW updates the replicated weights. The copies see the same
data and must report the same losses (each equals the model run one document at a time); what
differs is where the selection work runs. spill calibrates its cost model on the worker selector
by itself (``context_parallel``: rank 0 times the selector in the first forward, every rank refits
from the measured selection times of later forwards); ``NAME-uncalibrated`` runs a strategy with
``calibrate=False`` (spill on causal pairs).

Batches: ``--tokens`` tokens per step packed from documents of sparsecp's long-tailed
``lognormal`` generator (``sparsecp.generate_batch("lognormal", tokens, cp, seed)``), one seed
per step. At ratio 1 the indexer scores every earlier token of a row's document against every
index head, so its work grows with the square of the document length: with documents of
thousands of tokens it is a large part of the step of this small model (about 40% at the
defaults), the regime the balancing is for.

Sizes (the defaults): hidden 128, 3 layers (one dense MLP, two MoE of 4 experts, 2 active), MLA
with 4 heads (latent 64, rope 32, nope 32, value 32), an indexer of 32 heads of 64 keeping the top
128, 16384 tokens a step (4096 a rank).

Per step and strategy it prints the loss (summed over ranks), the step time (slowest rank) and
per rank the indexer's share of the step; at the end, medians per strategy: step time, the
slowest rank's selector CPU seconds and its ratio to the first strategy's in the same step, the
selection's imbalance (max / mean of the ranks' selector CPU seconds: with more ranks than cores,
wall time would count a rank's peers' turns on the core), bytes each rank sent (latent prefixes
and Index K rows; selection exchange), and per rank the parameter, gradient and AdamW bytes and
the resident-set growth during the steps, against one process running the whole batch. The step
is also charged in CPU seconds: per strategy the slowest rank's step, its gain over the first
strategy's, and the bound ``(R + I * m) / (R + m)`` a perfect balancer of the first strategy's
selection could reach (m: the mean of the ranks' selector seconds, I: their max / mean, R: the
rest of the step). Each gain and ratio to the first strategy is the median of the per-step
ratios with its 95% interval, "within noise" where that interval holds 1 (``sparsecp run``'s
convention: a difference is claimed only from 6 steps); a run of one strategy compares nothing.
The driver shared with the V4 example is ``cp_training_driver.py``.

Usage::

    python python/examples/train_deepseek_v32.py --ranks 4
    python python/examples/train_deepseek_v32.py --ranks 2 --modes none,spill --steps 2 --tokens 4096
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import cp_training_driver as driver


def build_model(args: argparse.Namespace) -> Any:
    """The V3.2 of the flags."""
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM

    return DeepseekV32ForCausalLM(DeepseekV32Config(
        vocab_size=512, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        moe_intermediate_size=args.hidden // 2, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=4, n_group=2, topk_group=1, num_experts_per_tok=2, kv_lora_rank=64,
        q_lora_rank=64, qk_rope_head_dim=32, v_head_dim=32, qk_nope_head_dim=32, index_topk=args.topk,
        index_head_dim=64, index_n_heads=args.index_heads, first_k_dense_replace=1,
        max_position_embeddings=1 << 20, experts_implementation="eager"))


def describe(args: argparse.Namespace) -> str:
    return f"top-{args.topk} of every earlier token, {args.index_heads} index heads"


EXAMPLE = driver.Example(title="DeepSeek-V3.2", models="sparsecp.models.deepseek_v32", build_model=build_model,
                         describe=describe)


def main() -> int:
    parser = driver.argument_parser(__doc__, modes="none,zigzag,greedy,hybrid,spill,spill-uncalibrated", steps=3)
    parser.add_argument("--selector", default="model", choices=("model", "fused"),
                        help="workers score with the model's torch math or sparsecp's fused CPU kernel")
    args = parser.parse_args()
    driver.check_arguments(parser, args)
    return driver.train(EXAMPLE, args)


if __name__ == "__main__":
    sys.exit(main())
