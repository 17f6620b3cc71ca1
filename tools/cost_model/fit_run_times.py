#!/usr/bin/env python3
"""Fit the per-row cost model to the selection times a `sparsecp run` job measured.

`sparsecp calibrate` times small synthetic points; this fits the same model,
    time = a * rows + b * sum(vis) + c * sum(min(topk, vis)),
to the per-rank selection CPU times of real jobs, so the two can be compared. Every
strategy of every given `run --json` output contributes one point per rank; the rank's
sums come from re-planning the same batch with `sparsecp plan --json` (rows and causal
pairs are checked against the job's own figures). The fit is non-negative least squares
(the best of all non-negative subsets of a, b, c), as calibrate's.

    mpirun ... sparsecp run --mode zigzag --dist pareto --seed 1 --json > zigzag.json   # etc.
    python3 tools/cost_model/fit_run_times.py --sparsecp build/release/sparsecp \
        --batch "--dist pareto --tokens 65536 --seed 1" zigzag.json greedy.json spill.json \
        [--out fitted_model.txt]

Prints a, b, c in ns and each point's residual; --out writes a model file that
`--cost-model` accepts.
"""
from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
import subprocess
import sys
import tempfile


def plan_ranks(sparsecp: str, batch: list[str], cp: int, ratio: int, strategy: dict, topk: int) -> list[dict]:
    """Re-plan one strategy of a run; per rank: rows, pairs, capped = sum(min(topk, vis))."""
    command = [sparsecp, "plan", *batch, "--cp", str(cp), "--ratio", str(ratio), "--mode", strategy["mode"], "--json"]
    model = re.search(r"cost model a=(\S+) b=(\S+) c=(\S+) ns", strategy.get("parameters", ""))
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as file:
        if model:  # the model spill balanced in the job (printed to 6 digits: enough to re-plan)
            a, b, c = model.groups()
            file.write(f"a {a}\nb {b}\nc {c}\ntopk {topk}\nunit ns\n")
            file.flush()
            command += ["--cost-model", file.name]
        plan = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    ranks = []
    for rank in plan["ranks"]:
        rows = pairs = capped = 0
        for _document, start, end in rank["tasks"]:
            for position in range(start, end):
                visible = (position + 1) // ratio
                rows, pairs, capped = rows + 1, pairs + visible, capped + min(topk, visible)
        ranks.append({"rows": rows, "pairs": pairs, "capped": capped})
    return ranks


def solve(points: list[tuple[list[float], float]], columns: tuple[int, ...]) -> list[float] | None:
    """Least squares on the chosen columns (normal equations, Gaussian elimination)."""
    n = len(columns)
    matrix = [[sum(x[i] * x[j] for x, _ in points) for j in columns] for i in columns]
    vector = [sum(x[i] * y for x, y in points) for i in columns]
    for k in range(n):
        pivot = max(range(k, n), key=lambda r: abs(matrix[r][k]))
        if abs(matrix[pivot][k]) < 1e-30:
            return None
        matrix[k], matrix[pivot], vector[k], vector[pivot] = matrix[pivot], matrix[k], vector[pivot], vector[k]
        for r in range(n):
            if r != k:
                factor = matrix[r][k] / matrix[k][k]
                matrix[r] = [a - factor * b for a, b in zip(matrix[r], matrix[k])]
                vector[r] -= factor * vector[k]
    beta = [0.0, 0.0, 0.0]
    for k, column in enumerate(columns):
        beta[column] = vector[k] / matrix[k][k]
    return beta


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="`sparsecp run --json` outputs of the same batch")
    parser.add_argument("--sparsecp", default="build/release/sparsecp")
    parser.add_argument("--batch", required=True, help="the run's batch flags, e.g. \"--dist pareto --seed 1\"")
    parser.add_argument("--out", help="write the fitted model here")
    args = parser.parse_args()

    points, labels = [], []
    for path in args.runs:
        with open(path) as file:
            run = json.load(file)
        topk = run["model"]["topk"]
        for strategy in run["strategies"]:
            planned = plan_ranks(args.sparsecp, shlex.split(args.batch), run["cp"], run["ratio"], strategy, topk)
            for measured in strategy["ranks"]:
                rank = planned[measured["rank"]]
                if (rank["rows"], rank["pairs"]) != (measured["rows"], measured["work"]):
                    sys.exit(f"{path}: {strategy['mode']} rank {measured['rank']}: the re-planned batch differs from "
                             f"the job's ({rank['rows']} rows, {rank['pairs']} pairs against {measured['rows']}, "
                             f"{measured['work']}); check --batch")
                points.append(([rank["rows"], rank["pairs"], rank["capped"]], measured["select_cpu_s"]))
                labels.append(f"{path} {strategy['mode']} rank {measured['rank']}")

    best, best_error = None, float("inf")
    for size in (1, 2, 3):
        for columns in itertools.combinations(range(3), size):
            beta = solve(points, columns)
            if beta is None or min(beta) < 0:
                continue
            error = sum((sum(b * v for b, v in zip(beta, x)) - y) ** 2 for x, y in points)
            if error < best_error:
                best, best_error = beta, error
    if best is None:
        sys.exit("no non-negative fit")
    a, b, c = (value * 1e9 for value in best)
    residuals = []
    for (x, y), label in zip(points, labels):
        predicted = sum(v * w for v, w in zip(best, x))
        residuals.append((y - predicted) / predicted)
        print(f"  {label}: measured {y * 1e3:.1f} ms, model {predicted * 1e3:.1f} ms ({residuals[-1]:+.1%})")
    rms = (sum(r * r for r in residuals) / len(residuals)) ** 0.5
    print(f"fit over {len(points)} points (ns per row): a = {a:.4g}, b = {b:.4g} per visible key, "
          f"c = {c:.4g} per min(topk, vis); rms relative residual {rms:.1%}")
    if args.out:
        with open(args.out, "w") as file:
            file.write("# sparsecp cost model: per-row cost a + b * vis + c * min(topk, vis)\n"
                       f"a {a}\nb {b}\nc {c}\ntopk {topk}\nunit ns\n"
                       f"note fitted to the selection times of {len(args.runs)} sparsecp run job(s)\n")
        print(f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
