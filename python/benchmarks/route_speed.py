#!/usr/bin/env python3
"""Planning plus every rank's route from Python, against the C++ tool and the seed's Python,
measured side by side in one run.

For each mode (zigzag, greedy, hybrid) on a lognormal batch (`sparsecp.generate_batch`,
the same as `sparsecp batch --dist lognormal --tokens T --cp N --seed S`), one repetition
is "plan once + build every rank's route", what a training step on all ranks does; each
route is dropped after it is built, as each rank keeps only its own (the tool does the
same). The minimum over the repetitions, divided by cp (on a shared machine the minimum is
the run least disturbed by other processes; the medians are printed too; the seed's figure
is the median of its --seed-repeat repetitions, as compare_seed_speed.py reports it):

  sparsecp.route   `sparsecp.plan(...)` once, then `sparsecp.route(plan, ..., rank)`
                   (zigzag: `sparsecp.route("zigzag", ..., rank)`, the per-rank fast path)
  indexer_route    the seed-compatible `sparsecp.torch.indexer_route(lengths, cp, rank, ...)`
                   with its lru caches cleared before each repetition (like the seed's)
  C++ tool         `sparsecp route --all-ranks --repeats K --json` (in-process timing)
  seed             the seed's own indexer_balance.py (tools/golden/reindent.py), caches
                   cleared before each repetition

Greedy/hybrid use block 2048; hybrid's zigzag_min_length is the local row count. Run it
with GLIBC_TUNABLES that keep freed memory in the heap (--keep-heap, as
tools/golden/compare_seed_speed.py and the tool's own mallopt do) so that page faults of
freshly mapped route buffers do not dominate. Like the tool, nothing runs between
repetitions (the seed's timing, from compare_seed_speed.py, collects garbage before each
of its repetitions; a gc.collect() right before the Python loops leaves caches cold and
made indexer_route up to 3x slower on this machine).

Usage:
  python3 tools/golden/reindent.py /tmp/seedref
  .venv/bin/python python/benchmarks/route_speed.py --seed-module /tmp/seedref/indexer_balance_seed.py \\
      --sparsecp build/native/sparsecp [--case 1Mx64] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "golden"))
import compare_seed_speed as seed_speed  # noqa: E402
from seed_module import load_seed  # noqa: E402

import sparsecp  # noqa: E402
import sparsecp.torch as indexer_balance  # noqa: E402


def timings(samples: list, cp: int) -> tuple[float, float]:
    """(minimum, median) seconds per rank of all-rank repetitions."""
    return min(samples) / cp, statistics.median(samples) / cp


def time_sparsecp_route(lengths: tuple, cp: int, ratio: int, mode: str, threshold, repeat: int) -> tuple:
    options = {"zigzag_min_length": threshold} if threshold is not None else {}

    def run() -> None:
        if mode == "zigzag":
            for rank in range(cp):
                sparsecp.route("zigzag", lengths, cp, rank, ratio)
            return
        plan = sparsecp.plan(lengths, cp, ratio, mode, **options)
        for rank in range(cp):
            sparsecp.route(plan, lengths, cp, rank, ratio)

    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return timings(samples, cp)


def time_indexer_route(lengths: tuple, cp: int, ratio: int, mode: str, threshold, repeat: int) -> tuple:
    samples = []
    for _ in range(repeat):
        indexer_balance.indexer_route.cache_clear()
        indexer_balance.indexer_task_plan.cache_clear()
        start = time.perf_counter()
        for rank in range(cp):
            indexer_balance.indexer_route(lengths, cp, rank, ratio, mode, None, threshold)
        samples.append(time.perf_counter() - start)
    indexer_balance.indexer_route.cache_clear()
    indexer_balance.indexer_task_plan.cache_clear()
    return timings(samples, cp)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--seed-module", required=True, help="indexer_balance_seed.py written by reindent.py")
    parser.add_argument("--sparsecp", required=True, help="the sparsecp tool (a native or release build)")
    parser.add_argument("--case", action="append", type=seed_speed.parse_case, metavar="TOKENSxCP",
                        help="e.g. 1Mx64 (repeatable; default 1Mx64)")
    parser.add_argument("--modes", default="zigzag,greedy,hybrid")
    parser.add_argument("--ratio", type=int, default=4)
    parser.add_argument("--batch-seed", type=int, default=1)
    parser.add_argument("--repeats", dest="repeat", type=int, default=21, help="Python and C++ repetitions (median)")
    parser.add_argument("--repeat", dest="repeat", type=int, help=argparse.SUPPRESS)  # the old spelling
    parser.add_argument("--seed-repeat", type=int, default=3)
    parser.add_argument("--keep-heap", action="store_true", help="re-run with GLIBC_TUNABLES keeping freed memory")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.keep_heap and os.environ.get("GLIBC_TUNABLES") != seed_speed.KEEP_HEAP_TUNABLES:
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "GLIBC_TUNABLES": seed_speed.KEEP_HEAP_TUNABLES})
    seed = load_seed(args.seed_module)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for tokens, cp in args.case or [(1 << 20, 64)]:
            lengths = tuple(sparsecp.generate_batch("lognormal", tokens, cp, args.batch_seed))
            lengths_file = f"{scratch}/batch.txt"
            pathlib.Path(lengths_file).write_text(",".join(map(str, lengths)) + "\n")
            local = tokens // cp
            for mode in args.modes.split(","):
                threshold = local if mode == "hybrid" else None
                tool = seed_speed.sparsecp_route(args.sparsecp, lengths_file, cp, args.ratio, mode, threshold,
                                                 args.repeat)
                cpp = (tool["seconds_min_all_ranks"] / cp, tool["seconds_per_rank"])
                python_route = time_sparsecp_route(lengths, cp, args.ratio, mode, threshold, args.repeat)
                seed_api = time_indexer_route(lengths, cp, args.ratio, mode, threshold, args.repeat)
                seed_python = seed_speed.time_seed(seed, lengths, cp, args.ratio, mode, threshold,
                                                   args.seed_repeat) / cp
                row = {"case": seed_speed.case_name(tokens, cp), "mode": mode, "documents": len(lengths),
                       "local_rows": local, "cpp_us": cpp[0] * 1e6, "sparsecp_route_us": python_route[0] * 1e6,
                       "indexer_route_us": seed_api[0] * 1e6, "seed_us": seed_python * 1e6,
                       "median_us": {"cpp": cpp[1] * 1e6, "sparsecp_route": python_route[1] * 1e6,
                                     "indexer_route": seed_api[1] * 1e6},
                       "sparsecp_route_vs_cpp": python_route[0] / cpp[0], "indexer_route_vs_cpp": seed_api[0] / cpp[0],
                       "seed_vs_indexer_route": seed_python / seed_api[0]}
                rows.append(row)
                if not args.json:
                    if len(rows) == 1:
                        print(f"{'case':7} {'mode':7} {'C++ us/rank':>11} {'sparsecp.route':>14} {'x C++':>6} "
                              f"{'indexer_route':>13} {'x C++':>6} {'seed us/rank':>12} {'seed / indexer_route':>21}"
                              f"   (medians: C++, sparsecp.route, indexer_route)")
                    print(f"{row['case']:7} {mode:7} {row['cpp_us']:>11.1f} {row['sparsecp_route_us']:>14.1f} "
                          f"{row['sparsecp_route_vs_cpp']:>6.2f} {row['indexer_route_us']:>13.1f} "
                          f"{row['indexer_route_vs_cpp']:>6.2f} {row['seed_us']:>12.0f} "
                          f"{row['seed_vs_indexer_route']:>20.0f}x   ({cpp[1] * 1e6:.1f}, {python_route[1] * 1e6:.1f}, "
                          f"{seed_api[1] * 1e6:.1f})", flush=True)
    summary = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": seed_speed.machine(),
               "python": platform.python_version(), "allocator": os.environ.get("GLIBC_TUNABLES", "glibc defaults"),
               "results": rows}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"{summary['machine']}, Python {summary['python']}, {summary['allocator']}, {summary['date']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
