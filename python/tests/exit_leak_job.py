"""One rank of a small training job that ends with its autograd graphs still alive, as a script
written from the README does: ``logits`` and ``loss`` stay in the script's globals until the
interpreter exits. Run by test_exit_leaks.py as ``python exit_leak_job.py RANK SIZE PORT CASE``
(two processes, gloo on loopback); it prints ``done`` and exits.

CASE: ``v4`` (DeepSeek-V4, spill, the indexer KL), ``v4-checkpointing`` (the same with
activation checkpointing), ``v32`` (DeepSeek-V3.2, spill), ``low-level``
(``balanced_indexer_select`` with spill and the indexer KL loss of ``sparsecp.torch``).
"""
from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

rank, size, port, case = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                        timeout=datetime.timedelta(seconds=120))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
lengths = (300, 52, 700, 972)

if case.startswith("v4"):
    import v4_tasks

    from sparsecp.models import deepseek_v4 as cp

    model = v4_tasks.tiny_model(torch.float32, 0)
    if case == "v4-checkpointing":
        model.activation_checkpointing_enable()
    model.train()
    cp.context_parallel(model, None, "spill", indexer_kl_coeff=0.1)
    input_ids = v4_tasks.packed_ids(lengths)
elif case == "v32":
    import v32_tasks

    from sparsecp.models import deepseek_v32 as cp

    lengths = (13, 17, 11, 7)
    model = v32_tasks.tiny_model(torch.float32)
    model.train()
    cp.context_parallel(model, None, "spill")
    input_ids = v32_tasks.packed_ids(lengths)

if case == "low-level":
    import sparsecp.torch as sct

    ratio, topk, heads, head_dim, q_rank = 4, 16, 2, 16, 8
    local = sum(lengths) // size
    mine = slice(rank * local, (rank + 1) * local)
    g = torch.Generator().manual_seed(0)
    wq_b = torch.randn(heads * head_dim, q_rank, generator=g)
    bank = torch.randn(1, sum(n // ratio for n in lengths), head_dim, generator=g, requires_grad=True)
    qr = torch.randn(1, sum(lengths), q_rank, generator=g)[:, mine]
    weights = torch.rand(1, sum(lengths), heads, generator=g)[:, mine]
    positions = torch.cat([torch.arange(n) for n in lengths])[mine].float()
    angles = positions[:, None] * 10000.0 ** (-torch.arange(4) / 4)
    rope = (angles.cos()[None], angles.sin()[None])
    selector = sct.IndexerSelector(wq_b, bank[0].detach(), ratio=ratio, topk=topk, rope_dim=8)
    ids = sct.balanced_indexer_select(qr, weights, rope, selector, lengths, ratio, "spill", None)
    logits = (qr @ wq_b.T).sum() + bank.sum()  # a graph kept alive to the end, as a script's loss
    loss = logits * 2
    loss.backward()
else:
    ids, positions = cp.shard_batch(input_ids, lengths)
    labels = cp.shard_labels(input_ids, lengths)
    logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
    loss = cp.causal_lm_loss(logits, labels, lengths)
    if case.startswith("v4"):
        loss = loss + cp.indexer_kl_loss(model)
    loss.backward()
print("done", flush=True)
dist.destroy_process_group()
