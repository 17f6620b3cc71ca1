#!/usr/bin/env python3
"""Balanced Lightning Indexer selection through sparsecp.torch on gloo ranks, side by side
with the C++ MPI run (`sparsecp run`) on the same model shape and batch.

Every rank (torch.multiprocessing spawn, gloo on 127.0.0.1, one thread each) holds its
contiguous shard of a seeded lognormal batch (`sparsecp.generate_batch`, the tool's
default: 65,536 tokens, seed 1) and calls the seed's API,
`balanced_indexer_select(qr, weights, (cos, sin), selector, lengths, 4, mode, group)`,
with `sparsecp.torch.IndexerSelector` as the worker-side selector (Index-Q projection +
RoPE + fused top-k on CPU tensors, in place). Model shape as `sparsecp run`'s defaults:
16 index heads x 128, RoPE 64, q_rank 256, top-k 512, ratio 4; bf16 qr / Wq_b / keys,
fp32 weights and RoPE; small-integer values, so every mode must return exactly the
unbalanced ('none') top-k, which each repeat checks.

Reported per mode (median of --repeats): each rank's selection CPU time (thread CPU time
of the selector call: the per-rank work, meaningful when ranks share few cores), the
slowest rank, the bytes each rank handed to all_to_all_single against the route's
prediction, and the wall time of the whole call. With --sparsecp PATH the same modes also
run under `mpirun -np RANKS PATH run --mode M --json` and both are printed together.

Usage:
  .venv/bin/python python/benchmarks/balanced_select.py [--modes none,hybrid,spill]
      [--sparsecp build/native/sparsecp] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

HEADS, HEAD_DIM, ROPE_DIM, Q_RANK, TOPK, RATIO = 16, 128, 64, 256, 512, 4


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _small_ints(generator, low: int, high: int, *shape: int):
    import torch

    return torch.randint(low, high + 1, shape, generator=generator).float()


def rank_main(rank: int, size: int, port: int, args: argparse.Namespace, results) -> None:
    import torch
    import torch.distributed as dist

    import sparsecp
    import sparsecp.torch as indexer_balance

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    lengths = tuple(sparsecp.generate_batch("lognormal", args.tokens, size, args.batch_seed))
    total, local = sum(lengths), sum(lengths) // size
    generator = torch.Generator().manual_seed(7)  # identical global tensors on every rank
    qr = _small_ints(generator, -2, 2, total, Q_RANK).bfloat16()
    weights = _small_ints(generator, 1, 4, total, HEADS)
    cos = _small_ints(generator, -1, 1, total, ROPE_DIM // 2)
    sin = _small_ints(generator, -1, 1, total, ROPE_DIM // 2)
    wq_b = _small_ints(generator, -1, 1, HEADS * HEAD_DIM, Q_RANK).bfloat16()
    keys = _small_ints(generator, -2, 2, sum(n // RATIO for n in lengths), HEAD_DIM).bfloat16()
    shard = slice(rank * local, (rank + 1) * local)
    inputs = (qr[shard][None], weights[shard][None], (cos[shard][None], sin[shard][None]))
    selector = indexer_balance.IndexerSelector(wq_b, keys, RATIO, TOPK, head_dim=HEAD_DIM, rope_dim=ROPE_DIM,
                                               threads=1)
    cpu_seconds: list[float] = []

    def timed_selector(*selector_args):
        start = time.thread_time()
        out = selector(*selector_args)
        cpu_seconds.append(time.thread_time() - start)
        return out

    group = dist.group.WORLD
    row_bytes = Q_RANK * 2 + HEADS * 4 + ROPE_DIM * 4
    report = {"rank": rank, "documents": len(lengths), "local": local, "modes": {}}
    reference = None
    for mode in args.modes:
        options = {"block_size": min(2048, local), "zigzag_min_length": local} if mode == "hybrid" else \
            {"block_size": min(2048, local)} if mode == "greedy" else {}
        samples, walls, verified = [], [], True
        for _ in range(args.repeats):
            cpu_seconds.clear()
            indexer_balance.reset_exchange_stats()
            dist.barrier(group)
            start = time.perf_counter()
            selected = indexer_balance.balanced_indexer_select(*inputs, timed_selector, lengths, RATIO, mode, group,
                                                               **options)
            walls.append(time.perf_counter() - start)
            samples.append(sum(cpu_seconds))
            stats = indexer_balance.exchange_stats()
            if reference is None:
                reference = selected
            verified &= bool(torch.equal(selected, reference))
        route = indexer_balance.indexer_route(lengths, size, rank, RATIO, mode, **options)
        expected = indexer_balance.expected_exchange_bytes(route, row_bytes, TOPK)
        report["modes"][mode] = {
            "selection_cpu_ms": statistics.median(samples) * 1e3, "wall_ms": statistics.median(walls) * 1e3,
            "rows": route.query_count, "bytes_sent": stats["bytes_sent"], "bytes_received": stats["bytes_received"],
            "expected_sent": expected.sent, "expected_received": expected.received, "verified": verified,
        }
    results.put(report)
    dist.barrier(group)
    dist.destroy_process_group()


def run_python(args: argparse.Namespace) -> list[dict]:
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    processes = [context.Process(target=rank_main, args=(rank, args.ranks, port, args, results))
                 for rank in range(args.ranks)]
    for process in processes:
        process.start()
    reports = [results.get(timeout=1800) for _ in processes]
    for process in processes:
        process.join()
    return sorted(reports, key=lambda r: r["rank"])


def run_mpi(args: argparse.Namespace, mode: str) -> dict:
    # --no-calibrate: spill on causal pairs, as the Python side plans it; a fixed number
    # of repeats, as the Python side runs.
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.ranks), args.sparsecp, "run",
               "--mode", mode, "--tokens", str(args.tokens), "--seed", str(args.batch_seed), "--repeats",
               str(args.repeats), "--max-repeats", str(args.repeats), "--no-calibrate", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout[done.stdout.index("{"):])


def _bytes_as_expected(measured: dict) -> bool:
    return (measured["bytes_sent"] == measured["expected_sent"]
            and measured["bytes_received"] == measured["expected_received"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--batch-seed", type=int, default=1)
    parser.add_argument("--modes", default="none,hybrid,spill", type=lambda text: text.split(","))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sparsecp", help="the sparsecp tool, to run the same modes under mpirun")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if "none" not in args.modes:
        args.modes.insert(0, "none")  # the reference every mode is checked against
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    reports = run_python(args)
    mpi = {}
    if args.sparsecp:
        for mode in args.modes:
            if mode != "none":
                mpi[mode] = run_mpi(args, mode)
    summary = {"date": started, "machine": platform.processor() or platform.machine(), "ranks": args.ranks,
               "tokens": args.tokens, "documents": reports[0]["documents"], "repeats": args.repeats,
               "python": reports, "mpi": mpi}
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"{args.ranks} gloo ranks, {args.tokens} tokens ({reports[0]['documents']} documents, lognormal seed "
          f"{args.batch_seed}), {reports[0]['local']} rows per rank; {started}")
    print(f"{'mode':8} {'per-rank selection CPU ms':34} {'slowest':>8} {'rows per rank':28} "
          f"{'bytes sent per rank':44} {'= route':>7} {'verified':>8}")
    for mode in args.modes:
        per_rank = [r["modes"][mode] for r in reports]
        cpu = [m["selection_cpu_ms"] for m in per_rank]
        print(f"{mode:8} {', '.join(f'{c:.0f}' for c in cpu):34} {max(cpu):>8.0f} "
              f"{', '.join(str(m['rows']) for m in per_rank):28} "
              f"{', '.join(str(m['bytes_sent']) for m in per_rank):44} "
              f"{str(all(_bytes_as_expected(m) for m in per_rank)):>7} "
              f"{str(all(m['verified'] for m in per_rank)):>8}")
    for result in mpi.values():
        for part in result["strategies"]:  # 'none' (the baseline) and `mode`
            ranks = part["ranks"]
            cpu = [r["select_cpu_s"] * 1e3 for r in ranks]
            print(f"{'MPI ' + part['mode']:8} {', '.join(f'{c:.0f}' for c in cpu):34} {max(cpu):>8.0f} "
                  f"{', '.join(str(r['rows']) for r in ranks):28} "
                  f"{', '.join(str(r['bytes_sent']) for r in ranks):44} "
                  f"{str(part['bytes_match_route']):>7} {str(result['verified']):>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
