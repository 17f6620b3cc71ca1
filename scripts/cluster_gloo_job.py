"""A torch.distributed job for scripts/cluster.sh --torch: balanced Lightning Indexer
selection over gloo, repeated, every step verified against the rank's own local selection.

Every rank builds the same global batch from a seed (small integer values: exact dot
products, so a row's top-k is identical wherever it is computed), takes its shard, and
runs `sparsecp.torch.balanced_indexer_select` --steps times per mode. It prints one line
per rank: the steps verified and the median step time, or the error that stopped it
(a gloo timeout or a closed connection when a link or a peer dies). gloo's timeout is
--timeout seconds, so no collective waits longer than that for a lost peer.

    bash scripts/cluster.sh --nodes 2 --ranks-per-node 2 --rate 200mbit --torch -- \
        .venv/bin/python scripts/cluster_gloo_job.py --steps 20
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
from rank_tasks import RATIO, local_reference, make_case  # type: ignore[import-not-found]  # noqa: E402

import sparsecp.torch as indexer_balance  # noqa: E402


def say(line: str) -> None:
    """One line in one write, so that the ranks' lines do not interleave on a shared pipe."""
    os.write(1, (line + "\n").encode())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="steps per mode")
    parser.add_argument("--tokens-per-rank", type=int, default=2048)
    parser.add_argument("--modes", default="zigzag,hybrid,spill")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=20.0, help="gloo timeout in seconds")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, size = dist.get_rank(), dist.get_world_size()
    case = make_case(rank, size, args.seed, tokens_per_rank=args.tokens_per_rank)
    reference = local_reference(case, rank, size)
    start = time.monotonic()
    done = 0
    try:
        for mode in args.modes.split(","):
            times = []
            # hybrid needs its block and zigzag threshold spelled out: one shard each.
            options = (
                {"block_size": args.tokens_per_rank, "zigzag_min_length": args.tokens_per_rank}
                if mode == "hybrid"
                else {}
            )
            for _ in range(args.steps):
                t0 = time.perf_counter()
                selected = indexer_balance.balanced_indexer_select(
                    case.qr,
                    case.weights,
                    (case.cos, case.sin),
                    case.selector,
                    case.lengths,
                    RATIO,
                    mode,
                    dist.group.WORLD,
                    **options,
                )
                times.append(time.perf_counter() - t0)
                if not torch.equal(selected, reference):
                    say(f"rank {rank}: {mode}: step {len(times)} differs from local selection")
                    return 1
                done += 1
            say(
                f"rank {rank}: {mode}: {len(times)} steps verified bit for bit, median step "
                f"{1e3 * statistics.median(times):.1f} ms"
            )
    except Exception as error:  # noqa: BLE001 - the point is to report whatever stopped the rank
        text = " ".join(str(error).split())[:300]
        say(
            f"rank {rank}: error after {done} verified steps, {time.monotonic() - start:.1f} s in: "
            f"{type(error).__name__}: {text}"
        )
        os._exit(1)  # a dead peer can hang destroy_process_group too
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
