#!/usr/bin/env python3
"""Time the seed's planner+routes and sparsecp's side by side, in one run.

For each case (tokens, cp) and mode (zigzag, greedy, hybrid) on a lognormal batch
whose median document is a quarter of the local shard:

  seed     in-process: clear the seed's lru caches (indexer_task_plan, indexer_route),
           then call indexer_route for every rank. One repetition is therefore "plan
           once + route every rank", which is what a training step on all ranks does.
           Median over --seed-repeat repetitions, divided by cp.
  sparsecp `sparsecp route --lengths-file F --cp N --ratio R --mode M --all-ranks
           --repeats K --json`, run right after the seed on the same batch: the tool
           times the same work in-process (plan once + every rank's route, median of
           K) and reports seconds_per_rank.

Batches come from `sparsecp batch --dist lognormal --tokens T --cp N --seed S`
(the same lengths the C++ benchmarks use). Greedy and hybrid use the default block
size (2048); hybrid's zigzag_min_length defaults to the local row count (documents
at least one shard long keep their zigzag chunks), printed in the table.

--keep-heap runs both sides (this script re-executes itself, and sparsecp inherits
the setting) with GLIBC_TUNABLES that stop glibc from returning freed blocks to the
kernel (mmap_threshold 1 GiB, trim_threshold 4 GiB). Without it, each repetition's
multi-MiB route lists come from fresh pages, and the page faults (system time)
dominate sparsecp's figure on a busy machine; with it, the comparison measures the
planner and route builder rather than the kernel's page zeroing.

--verify additionally compares every rank's route of the cases up to 1M tokens
field by field (sparsecp `route --all-ranks --json --full` against the seed).

Usage:
  python3 tools/golden/reindent.py SEED_FILE /tmp/seedref
  python3 tools/golden/compare_seed_speed.py --seed-module /tmp/seedref/indexer_balance_seed.py \
      --sparsecp build/native/sparsecp [--json] [--verify]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from seed_module import load_seed  # noqa: E402

DEFAULT_CASES = ((1 << 20, 8), (1 << 22, 32), (1 << 20, 64))
MODES = ("zigzag", "greedy", "hybrid")
VERIFY_MAX_TOKENS = 1 << 20
KEEP_HEAP_TUNABLES = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296"


def parse_case(text: str) -> tuple[int, int]:
    tokens, cp = text.lower().split("x")
    scale = {"k": 1 << 10, "m": 1 << 20}
    tokens = int(tokens[:-1]) * scale[tokens[-1]] if tokens[-1] in scale else int(tokens)
    return tokens, int(cp)


def case_name(tokens: int, cp: int) -> str:
    return f"{tokens >> 20}M/{cp}" if tokens % (1 << 20) == 0 else f"{tokens}/{cp}"


def batch_lengths(sparsecp: str, tokens: int, cp: int, seed: int) -> list[int]:
    out = subprocess.run([sparsecp, "batch", "--dist", "lognormal", "--tokens", str(tokens), "--cp", str(cp),
                          "--seed", str(seed)], check=True, capture_output=True, text=True).stdout
    lengths = [int(v) for v in out.replace(",", " ").split()]
    assert sum(lengths) == tokens and min(lengths) >= 1, "unexpected batch output"
    return lengths


def time_seed(seed, lengths: tuple, cp: int, ratio: int, mode: str, threshold, repeat: int) -> float:
    """Median seconds of one repetition (plan once + every rank's route)."""
    samples = []
    for _ in range(repeat):
        seed.indexer_task_plan.cache_clear()
        seed.indexer_route.cache_clear()
        gc.collect()
        start = time.perf_counter()
        routes = [seed.indexer_route(lengths, cp, rank, ratio, mode, None, threshold) for rank in range(cp)]
        samples.append(time.perf_counter() - start)
        del routes  # freeing millions of ints stays outside the timed region
    seed.indexer_task_plan.cache_clear()
    seed.indexer_route.cache_clear()
    return statistics.median(samples)


def sparsecp_route(sparsecp: str, lengths_file: str, cp: int, ratio: int, mode: str, threshold,
                   repeat: int, full: bool = False) -> dict:
    command = [sparsecp, "route", "--lengths-file", lengths_file, "--cp", str(cp), "--ratio", str(ratio),
               "--mode", mode, "--all-ranks", "--repeats", str(repeat), "--json"]
    if threshold is not None:
        command += ["--zigzag-min-length", str(threshold)]
    if full:
        command.append("--full")
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def verify(seed, sparsecp, lengths_file, lengths, cp, ratio, mode, threshold) -> str:
    result = sparsecp_route(sparsecp, lengths_file, cp, ratio, mode, threshold, 1, full=True)
    for rank, theirs in enumerate(result["routes"]):
        ours = seed.indexer_route(lengths, cp, rank, ratio, mode, None, threshold)
        for field in ("segments", "input_splits", "output_splits", "send_rows", "receive_rows",
                      "local_sources", "local_targets", "query_count"):
            expected = getattr(ours, field)
            expected = [list(s) for s in expected] if field == "segments" else \
                (list(expected) if isinstance(expected, tuple) else expected)
            if theirs[field] != expected:
                return f"rank {rank} {field} differs"
    seed.indexer_task_plan.cache_clear()
    seed.indexer_route.cache_clear()
    return "identical"


def machine() -> str:
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "unknown CPU"
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--seed-module", required=True, help="indexer_balance_seed.py written by reindent.py")
    parser.add_argument("--sparsecp", required=True, help="the sparsecp tool (a Release build)")
    parser.add_argument("--case", action="append", type=parse_case, metavar="TOKENSxCP",
                        help="e.g. 1Mx8 (repeatable; default: 1Mx8, 4Mx32, 1Mx64)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated (default: %(default)s)")
    parser.add_argument("--ratio", type=int, default=4, help="compression ratio (default: %(default)s)")
    parser.add_argument("--batch-seed", type=int, default=1, help="seed of the lognormal batch (default: 1)")
    parser.add_argument("--seed-repeat", type=int, default=3,
                        help="seed repetitions per case, median reported (default: %(default)s)")
    parser.add_argument("--cpp-repeat", type=int, default=21,
                        help="sparsecp --repeat per case, median reported (default: %(default)s)")
    parser.add_argument("--hybrid-threshold", type=int, default=0,
                        help="hybrid zigzag_min_length; 0 = the local row count (default)")
    parser.add_argument("--verify", action="store_true",
                        help=f"also compare all routes field by field for cases up to {VERIFY_MAX_TOKENS} tokens")
    parser.add_argument("--keep-heap", action="store_true",
                        help="run both sides with GLIBC_TUNABLES that keep freed memory in the heap")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args()
    if args.keep_heap and os.environ.get("GLIBC_TUNABLES") != KEEP_HEAP_TUNABLES:
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "GLIBC_TUNABLES": KEEP_HEAP_TUNABLES})

    seed = load_seed(args.seed_module)
    cases = args.case or list(DEFAULT_CASES)
    modes = [m for m in args.modes.split(",") if m]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for tokens, cp in cases:
            lengths = batch_lengths(args.sparsecp, tokens, cp, args.batch_seed)
            lengths_file = f"{scratch}/batch_{tokens}_{cp}.txt"
            pathlib.Path(lengths_file).write_text(",".join(map(str, lengths)) + "\n")
            local = tokens // cp
            for mode in modes:
                threshold = (args.hybrid_threshold or local) if mode == "hybrid" else None
                seed_seconds = time_seed(seed, tuple(lengths), cp, args.ratio, mode, threshold, args.seed_repeat) / cp
                cpp = sparsecp_route(args.sparsecp, lengths_file, cp, args.ratio, mode, threshold, args.cpp_repeat)
                row = {
                    "case": case_name(tokens, cp), "tokens": tokens, "cp": cp, "mode": mode,
                    "documents": len(lengths), "local_rows": local, "zigzag_min_length": threshold,
                    "seed_seconds_per_rank": seed_seconds, "seed_repeat": args.seed_repeat,
                    "cpp_seconds_per_rank": cpp["seconds_per_rank"], "cpp_repeat": cpp["repeats"],
                    "speedup": seed_seconds / cpp["seconds_per_rank"],
                    "seed_ns_per_local_row": seed_seconds * 1e9 / local,
                    "cpp_ns_per_local_row": cpp["seconds_per_rank"] * 1e9 / local,
                }
                if args.verify and tokens <= VERIFY_MAX_TOKENS:
                    row["routes"] = verify(seed, args.sparsecp, lengths_file, tuple(lengths), cp, args.ratio,
                                           mode, threshold)
                rows.append(row)
                if not args.json:
                    print_row(row, first=len(rows) == 1)
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(), "python": platform.python_version(),
        "allocator": "GLIBC_TUNABLES=" + os.environ.get("GLIBC_TUNABLES", "") if os.environ.get("GLIBC_TUNABLES")
                     else "glibc defaults",
        "ratio": args.ratio, "batch": f"lognormal, seed {args.batch_seed}, median document = local/4",
        "min_speedup": min(r["speedup"] for r in rows), "results": rows,
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"\nmin speedup {summary['min_speedup']:.0f}x (target >= 100x); {summary['machine']}, "
              f"Python {summary['python']}, {summary['allocator']}, {summary['date']}")
    return 0


def print_row(row: dict, first: bool) -> None:
    if first:
        print(f"{'case':8} {'mode':7} {'docs':>5} {'local rows':>10} {'min_length':>10} {'seed ms/rank':>12} "
              f"{'C++ us/rank':>11} {'ratio':>7} {'seed ns/row':>11} {'C++ ns/row':>10}" +
              ("  routes" if "routes" in row else ""))
    threshold = "-" if row["zigzag_min_length"] is None else str(row["zigzag_min_length"])
    print(f"{row['case']:8} {row['mode']:7} {row['documents']:>5} {row['local_rows']:>10} {threshold:>10} "
          f"{row['seed_seconds_per_rank'] * 1e3:>12.2f} {row['cpp_seconds_per_rank'] * 1e6:>11.1f} "
          f"{row['speedup']:>6.0f}x {row['seed_ns_per_local_row']:>11.1f} {row['cpp_ns_per_local_row']:>10.2f}"
          + (f"  {row['routes']}" if "routes" in row else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main())
