#!/usr/bin/env python3
"""Eager vs torch.compile(fullgraph=True) of the fixed-capacity indexer step on gloo ranks.

The step (per rank, one thread each): the owner's selection inputs to their workers
(``fixed_inputs_to_workers``, functional all-to-all), the worker's Index-Q projection and
``torch.ops.sparsecp.select_rows``, the ids back (``fixed_results_to_owners``), the KL loss
on the owner's rows (``shared_compressed_indexer_kl_loss``) and its backward. The same
Python function runs eagerly and compiled; each repeat runs both, interleaved, on a fresh
set of leaves, and checks that ids and loss are equal. Also timed: the dynamic path
(``balanced_indexer_select`` with the fused CPU selector, then the same KL and backward).
Reported: medians over --repeats of the slowest rank's step time, after --warmup steps
(compilation excluded; its time is printed separately).

Usage:
  .venv/bin/python python/benchmarks/compiled_step.py [--ranks 2] [--tokens-per-rank 1024]
      [--backend inductor] [--repeats 7]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

HEADS, HEAD_DIM, ROPE_DIM, Q_RANK, TOPK, RATIO, ATT_HEADS, ATT_DIM = 16, 64, 64, 256, 512, 4, 4, 64


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_main(rank: int, size: int, port: int, args: argparse.Namespace, results) -> None:
    import torch
    import torch.distributed as dist

    import sparsecp
    import sparsecp.torch as sct

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    group = dist.group.WORLD
    tokens = size * args.tokens_per_rank
    lengths = tuple(sparsecp.generate_batch("lognormal", tokens, size, 1))
    generator = torch.Generator().manual_seed(0)

    def ints(low: int, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(low, high + 1, shape, generator=generator).float()

    local = args.tokens_per_rank
    shard = slice(rank * local, (rank + 1) * local)
    qr = ints(-2, 2, 1, tokens, Q_RANK).to(torch.bfloat16)[:, shard]
    weights = ints(-2, 2, 1, tokens, HEADS)[:, shard]
    cos, sin = ints(-1, 1, 1, tokens, ROPE_DIM // 2)[:, shard], ints(-1, 1, 1, tokens, ROPE_DIM // 2)[:, shard]
    wq_b = ints(-1, 1, HEADS * HEAD_DIM, Q_RANK).to(torch.bfloat16)
    keys = sum(n // RATIO for n in lengths)
    bank = ints(-2, 2, keys, HEAD_DIM).to(torch.bfloat16)
    capacity = sct.fixed_capacity([lengths], size, [RATIO], "spill")
    routes = sct.prebuild(lengths, size, rank, [RATIO], "spill", capacity=capacity)
    index = sct.fixed_step_indices(qr, weights, (cos, sin), lengths, RATIO, "spill", group, routes=routes)
    layout = routes.layer(RATIO).indices
    teacher = (torch.randn((1, ATT_HEADS, local, ATT_DIM), generator=generator),
               torch.randn((1, keys, ATT_DIM), generator=generator), torch.zeros(ATT_HEADS))

    def leaves() -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        return [torch.randn(shape, generator=g).requires_grad_()
                for shape in ((1, local, HEADS, HEAD_DIM), (1, keys, HEAD_DIM), (1, local, HEADS))]

    def kl(ids: torch.Tensor, leaf: list[torch.Tensor]) -> torch.Tensor:
        return sct.shared_compressed_indexer_kl_loss(leaf[0], leaf[1], leaf[2], teacher[0], teacher[1], ids[None],
                                                     teacher[2], attention_scale=ATT_DIM ** -0.5, loss_coeff=1.0)

    def step(qr: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, index, leaf):
        wqr, ww, wcos, wsin = sct.fixed_inputs_to_workers([qr, weights, cos, sin], index, layout.worker_rows, group)
        query = sct.project_index_query(wqr, wq_b, wcos, wsin, HEAD_DIM, ROPE_DIM)
        ids = torch.ops.sparsecp.select_rows(query, bank, ww, index.key_begin, index.visible, TOPK)
        own = sct.fixed_results_to_owners(ids, index, layout.owner_rows, group)
        return kl(own, leaf), own

    selector = sct.IndexerSelector(wq_b, bank, RATIO, TOPK, head_dim=HEAD_DIM, rope_dim=ROPE_DIM, threads=1)

    def dynamic(leaf):
        own = sct.balanced_indexer_select(qr, weights, (cos, sin), selector, lengths, RATIO, "spill", group)[0]
        return kl(own, leaf), own

    start = time.perf_counter()
    compiled = torch.compile(step, fullgraph=True, backend=args.backend)
    compiled(qr, weights, cos, sin, index, leaves())[0].backward()
    compile_s = time.perf_counter() - start

    def timed(run) -> tuple[float, torch.Tensor, float]:
        leaf = leaves()
        dist.barrier(group)
        begin = time.perf_counter()
        loss, own = run(leaf)
        loss.backward()
        return time.perf_counter() - begin, own, float(loss.detach())

    runs = {"eager": lambda leaf: step(qr, weights, cos, sin, index, leaf),
            "compiled": lambda leaf: compiled(qr, weights, cos, sin, index, leaf),
            "dynamic": dynamic}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for repeat in range(args.warmup + args.repeats):
        outputs = {}
        for name, run in runs.items():
            seconds, own, loss = timed(run)
            outputs[name] = (own.clone(), loss)
            if repeat >= args.warmup:
                times[name].append(seconds)
        assert torch.equal(outputs["eager"][0], outputs["compiled"][0]), "compiled ids differ from eager"
        assert torch.equal(outputs["eager"][0], outputs["dynamic"][0]), "fixed ids differ from dynamic"
        assert outputs["eager"][1] == outputs["compiled"][1], "compiled loss differs from eager"
    results.put((rank, {"times": times, "compile_s": compile_s, "capacity": capacity}))
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tokens-per-rank", type=int, default=1024)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    context = mp.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    processes = [context.Process(target=rank_main, args=(rank, args.ranks, port, args, results))
                 for rank in range(args.ranks)]
    for process in processes:
        process.start()
    by_rank = dict(results.get(timeout=1800) for _ in processes)
    for process in processes:
        process.join()
    names = ("eager", "compiled", "dynamic")
    slowest = {name: [max(by_rank[r]["times"][name][i] for r in by_rank) for i in range(args.repeats)]
               for name in names}
    summary = {name: statistics.median(values) * 1e3 for name, values in slowest.items()}
    summary["compile_s"] = max(r["compile_s"] for r in by_rank.values())
    summary["capacity"] = by_rank[0]["capacity"]
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{args.ranks} ranks x {args.tokens_per_rank} tokens, spill, capacity {summary['capacity']}, "
          f"backend {args.backend}: compile {summary['compile_s']:.1f} s (first call)")
    for name in names:
        print(f"  {name:9s} step {summary[name]:8.2f} ms (median of {args.repeats}, slowest rank)")


if __name__ == "__main__":
    main()
