#!/usr/bin/env python3
"""Fit the per-row cost model to the selection times a `sparsecp run` job measured.

`sparsecp calibrate` times small synthetic points; this fits the same model,
    time = a * rows + b * sum(vis) + c * sum(min(topk, vis)),
to the per-rank selection CPU times of real jobs, so the two can be compared. Every
strategy of every given `run --json` output contributes one point per rank; the rank's
sums come from re-planning the same batch with `sparsecp plan --json` (rows and causal
pairs are checked against the job's own figures). The fit is the library's
(`sparsecp.fit_cost_model`, planning/cost_model_fit.hpp: non-negative least squares, the
same one `calibrate` uses), so the `sparsecp` Python package must be installed
(`pip install .`).

    mpirun ... sparsecp run --mode zigzag --dist pareto --seed 1 --json > zigzag.json   # etc.
    python3 tools/cost_model/fit_run_times.py --sparsecp build/release/sparsecp \
        --batch "--dist pareto --tokens 65536 --seed 1" zigzag.json greedy.json spill.json \
        [--out fitted_model.txt]

Prints a, b, c in ns and each point's residual; --out writes a model file that
`--cost-model` accepts.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile

import sparsecp


def plan_ranks(sparsecp: str, batch: list[str], cp: int, ratio: int, strategy: dict, topk: int) -> list[dict]:
    """Re-plan one strategy of a run; per rank: rows, pairs, capped = sum(min(topk, vis)),
    heap = sum of expected top-k admissions."""
    command = [sparsecp, "plan", *batch, "--cp", str(cp), "--ratio", str(ratio), "--mode", strategy["mode"], "--json"]
    model = re.search(r"cost model a=(\S+) b=(\S+) c=(\S+)(?: d=(\S+))? ns", strategy.get("parameters", ""))
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as file:
        if model:  # the model spill balanced in the job (printed to 6 digits: enough to re-plan)
            a, b, c, d = model.groups()
            file.write(f"a {a}\nb {b}\nc {c}\nd {d or 0}\ntopk {topk}\nunit ns\n")
            file.flush()
            command += ["--cost-model", file.name]
        plan = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    ranks = []
    for rank in plan["ranks"]:
        rows, pairs, capped, heap = sparsecp.cost_sample([tuple(task) for task in rank["tasks"]], ratio, topk)
        ranks.append({"rows": int(rows), "pairs": int(pairs), "capped": capped, "heap": heap})
    return ranks


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
                points.append(([rank["rows"], rank["pairs"], rank["capped"], rank["heap"]], measured["select_cpu_s"]))
                labels.append(f"{path} {strategy['mode']} rank {measured['rank']}")

    columns = list(zip(*(x for x, _ in points)))
    model, _, rms, predicted_seconds = sparsecp.fit_cost_model(
        columns[0], columns[1], columns[2], [y for _, y in points], topk=topk, heap=list(columns[3]))
    a, b, c, d = model.a, model.b, model.c, model.d
    residuals = []
    for (_, y), predicted, label in zip(points, predicted_seconds, labels):
        residuals.append((y - predicted) / predicted)
        print(f"  {label}: measured {y * 1e3:.1f} ms, model {predicted * 1e3:.1f} ms ({residuals[-1]:+.1%})")
    print(f"fit over {len(points)} points (ns per row): a = {a:.4g}, b = {b:.4g} per visible key, "
          f"c = {c:.4g} per min(topk, vis), d = {d:.4g} per top-k admission; rms relative residual {rms:.1%}")
    if args.out:
        with open(args.out, "w") as file:
            file.write("# sparsecp cost model: per-row cost a + b * vis + c * min(topk, vis) + d * heap(vis)\n"
                       f"a {a}\nb {b}\nc {c}\nd {d}\ntopk {topk}\nunit ns\n"
                       f"note fitted to the selection times of {len(args.runs)} sparsecp run job(s)\n")
        print(f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
