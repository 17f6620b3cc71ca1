"""hyper_parallel's head-tail folding (`dsa_cp_fold.py`) on packed batches, beside spill.

Head-tail folding splits the packed sequence into 2N chunks and has rank r compute its DSA
ops on chunks 2r and 2N-2r-1 (against all-gathered keys), which balances one causal sequence
whose work grows along it. On a packed batch of documents, a row's selection work grows
along its own document instead: the row at document position p scores floor((p+1)/ratio)
keys. This script counts, on the same seeded batches as `sparsecp simulate` (CP 4-64;
lognormal, Pareto and mixture batches of 1,048,576 tokens; seeds 1-5; ratio 4), each
rank's causal work under the fold, its imbalance (busiest rank / mean) and the rows that
leave their contiguous owner, beside spill's plan of the same batch (sparsecp.plan).
Counting only: the result does not depend on the machine.

    python3 tools/compare/head_tail_fold.py          # after `pip install .`
"""
from __future__ import annotations

import statistics

import numpy as np

import sparsecp


def row_work(lengths: list[int], ratio: int) -> np.ndarray:
    """Each packed row's causal work: floor((p + 1) / ratio) at document position p."""
    return np.concatenate([(np.arange(n, dtype=np.int64) + 1) // ratio for n in lengths])


def fold(lengths: list[int], cp: int, ratio: int) -> tuple[float, float]:
    """(imbalance, fraction of rows moved) of head-tail folding on this batch."""
    work = row_work(lengths, ratio)
    chunk = len(work) // (2 * cp)
    chunks = work[: chunk * 2 * cp].reshape(2 * cp, chunk).sum(axis=1)
    loads = np.array([chunks[2 * r] + chunks[2 * cp - 2 * r - 1] for r in range(cp)])
    moved = sum(chunk for r in range(cp) if 2 * cp - 2 * r - 1 != 2 * r + 1)  # the mirrored chunk
    return float(loads.max() / loads.mean()), moved / len(work)


def main() -> None:
    print("cp  workload  | fold imbalance  rows moved | spill imbalance  rows moved   (medians of seeds 1-5)")
    for cp in (4, 8, 16, 32, 64):
        for workload in ("lognormal", "pareto", "mixture"):
            folds, spills = [], []
            for seed in range(1, 6):
                lengths = list(sparsecp.generate_batch(workload, 1 << 20, cp, seed))
                folds.append(fold(lengths, cp, 4))
                plan = sparsecp.plan(lengths, cp, 4, "spill")
                spills.append((plan.imbalance, plan.rows_moved / sum(lengths)))
            f = [statistics.median(x) for x in zip(*folds)]
            s = [statistics.median(x) for x in zip(*spills)]
            print(f"{cp:3d} {workload:9s} | {f[0]:14.3f} {100 * f[1]:10.1f}% | {s[0]:15.3f} {100 * s[1]:10.1f}%")


if __name__ == "__main__":
    main()
