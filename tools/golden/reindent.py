#!/usr/bin/env python3
"""Rebuild the seed's planning code as an importable module in a scratch folder.

The seed (`001_62db9f214129356d.txt`, given on the command line) is a coverage page of the Python module
`indexer_balance.py`: every line reads `<lineno><code>` with the leading indentation
collapsed to at most one space and a trailing non-breaking space appended. Lines
36-407 hold the planner and routes (no torch). This script restores them:

  * it strips the line numbers and the trailing space,
  * re-indents every line from INDENT below (one level per line, worked out by hand
    from the code's structure: `for`/`else`, docstrings, continuation lines),
  * prepends the imports those lines need, and
  * writes `indexer_balance_seed.py` into the output folder given on the command line.

The seed's code never enters this repository: this file holds only indentation
levels, and the output folder must lie outside the repository (e.g. /tmp/seedref).

Usage:
  python3 tools/golden/reindent.py SEED_FILE OUT_DIR
  e.g. python3 tools/golden/reindent.py seeds/001_62db9f214129356d.txt /tmp/seedref
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import re
import sys

FIRST_LINE, LAST_LINE = 36, 407

# Indentation level (4 spaces each) of seed lines 36..407, ten per row; blank lines 0.
# fmt: off
INDENT = [
    0, 1, 0, 1, 1, 1, 1, 2, 1, 2,  # 36-45
    3, 2, 3, 1, 0, 0, 0, 1, 0, 1,  # 46-55
    1, 0, 1, 2, 2, 1, 1, 2, 3, 1,  # 56-65
    2, 3, 2, 0, 0, 0, 0, 1, 0, 1,  # 66-75
    1, 1, 0, 1, 1, 2, 2, 0, 0, 0,  # 76-85
    1, 1, 2, 3, 2, 3, 1, 0, 0, 0,  # 86-95
    1, 1, 0, 0, 0, 1, 0, 0, 0, 1,  # 96-105
    1, 1, 1, 2, 2, 3, 2, 3, 4, 5,  # 106-115
    5, 1, 1, 1, 1, 1, 2, 2, 3, 4,  # 116-125
    4, 3, 3, 3, 3, 1, 0, 0, 0, 1,  # 126-135
    1, 3, 1, 1, 1, 0, 0, 0, 2, 1,  # 136-145
    1, 3, 1, 1, 1, 2, 2, 3, 3, 4,  # 146-155
    3, 2, 3, 2, 2, 2, 3, 0, 0, 0,  # 156-165
    2, 1, 0, 1, 1, 1, 1, 2, 2, 3,  # 166-175
    4, 5, 5, 3, 2, 3, 2, 4, 1, 1,  # 176-185
    0, 0, 0, 2, 1, 1, 2, 1, 1, 2,  # 186-195
    1, 1, 2, 1, 0, 0, 0, 0, 2, 1,  # 196-205
    0, 1, 2, 2, 2, 2, 3, 3, 3, 2,  # 206-215
    3, 3, 3, 2, 3, 3, 3, 0, 1, 2,  # 216-225
    2, 1, 1, 1, 1, 2, 1, 2, 1, 2,  # 226-235
    1, 0, 0, 0, 1, 1, 1, 2, 2, 2,  # 236-245
    1, 0, 0, 0, 1, 1, 1, 1, 1, 2,  # 246-255
    2, 2, 3, 2, 2, 1, 0, 0, 0, 1,  # 256-265
    1, 1, 2, 2, 3, 3, 2, 1, 0, 0,  # 266-275
    0, 1, 1, 2, 1, 2, 1, 2, 0, 0,  # 276-285
    0, 1, 1, 1, 1, 1, 2, 2, 2, 2,  # 286-295
    3, 4, 4, 1, 0, 0, 0, 2, 1, 1,  # 296-305
    1, 1, 2, 2, 2, 2, 1, 2, 2, 2,  # 306-315
    2, 2, 0, 0, 0, 1, 1, 1, 1, 1,  # 316-325
    1, 1, 1, 2, 4, 4, 3, 2, 1, 0,  # 326-335
    0, 0, 0, 1, 0, 1, 1, 1, 1, 1,  # 336-345
    1, 1, 1, 0, 0, 0, 0, 2, 1, 0,  # 346-355
    1, 2, 2, 2, 2, 2, 2, 2, 0, 1,  # 356-365
    2, 1, 1, 2, 1, 2, 2, 2, 2, 2,  # 366-375
    2, 2, 1, 3, 1, 0, 0, 0, 1, 1,  # 376-385
    1, 1, 3, 1, 0, 0, 0, 2, 1, 1,  # 386-395
    1, 2, 2, 2, 2, 2, 2, 1, 1, 1,  # 396-405
    3, 3,                          # 406-407
]
# fmt: on

HEADER = '''"""Seed planner and routes (indexer_balance.py lines 36-407), re-indented by
tools/golden/reindent.py for golden data and speed comparisons. Scratch copy: never
commit this file to the sparsecp repository."""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from heapq import heapify, heappop, heappush
from itertools import accumulate

'''

LINE = re.compile(r"^(\d+)(.*)$")


def seed_lines(seed_path: pathlib.Path) -> dict[int, str]:
    """Map seed line number -> code text (indentation lost) for every numbered line."""
    lines = {}
    for raw in seed_path.read_text(encoding="utf-8").splitlines():
        match = LINE.match(raw)
        if not match:
            continue
        number, code = int(match.group(1)), match.group(2)
        if FIRST_LINE <= number <= LAST_LINE:
            if not code.endswith("\xa0"):
                raise SystemExit(f"seed line {number} lacks the coverage page's trailing space")
            lines[number] = code[:-1].strip()
    missing = [n for n in range(FIRST_LINE, LAST_LINE + 1) if n not in lines]
    if missing:
        raise SystemExit(f"seed lines missing: {missing[:10]}")
    return lines


def rebuild(seed_path: pathlib.Path) -> str:
    assert len(INDENT) == LAST_LINE - FIRST_LINE + 1, len(INDENT)
    lines = seed_lines(seed_path)
    body = []
    for number in range(FIRST_LINE, LAST_LINE + 1):
        code = lines[number]
        level = INDENT[number - FIRST_LINE]
        body.append("    " * level + code if code else "")
    return HEADER + "\n".join(body) + "\n"


def self_check(module_path: pathlib.Path) -> None:
    """Import the rebuilt module and check figures quoted in SYSTEM.md and by hand."""
    spec = importlib.util.spec_from_file_location("indexer_balance_seed", module_path)
    seed = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = seed  # dataclasses look their module up by name
    spec.loader.exec_module(seed)
    lengths, size, ratio = (5000, 300, 2699, 1), 4, 4
    # Contiguous per-rank work of SYSTEM.md: split the batch at multiples of `local`.
    local, bounds = sum(lengths) // size, [0]
    for length in lengths:
        bounds.append(bounds[-1] + length)
    work = []
    for rank in range(size):
        first, last, total = rank * local, (rank + 1) * local, 0
        for document in range(len(lengths)):
            begin, end = max(first, bounds[document]), min(last, bounds[document + 1])
            if begin < end:
                total += seed._task_work(seed.IndexerTask(document, begin - bounds[document],
                                                          end - bounds[document]), ratio)
        work.append(total)
    assert work == [499500, 1499500, 1197000, 848825], work
    # The zigzag fast path must agree with the route derived from the full plan.
    for mode, extra in (("zigzag", {}), ("greedy", {"block_size": 7}),
                        ("hybrid", {"block_size": 13, "zigzag_min_length": 300})):
        plan = seed.indexer_task_plan(lengths, size, ratio, mode, **extra)
        covered = sorted((t.document, r) for tasks in plan for t in tasks for r in range(t.start, t.end))
        assert covered == sorted((d, r) for d, n in enumerate(lengths) for r in range(n)), mode
        for rank in range(size):
            route = seed.indexer_route(lengths, size, rank, ratio, mode, *extra.values())
            assert route == seed._route_from_tasks(plan, lengths, rank, ratio), (mode, rank)
            assert route.query_count == sum(t.length for t in plan[rank])
    # _zigzag_intersections by hand: length 10, 2 ranks -> chunk 2, remainder 2.
    assert list(seed._zigzag_intersections(10, 2, 0, 1, 0, 10)) == [
        (0, 0, 1), (1, 1, 1), (0, 2, 2), (1, 4, 2), (1, 6, 2), (0, 8, 2)]
    try:
        seed.indexer_task_plan((3,), 2, 1, "zigzag")
    except ValueError as error:
        assert "equal contiguous CP partition" in str(error)
    else:
        raise AssertionError("odd total on 2 ranks must fail")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seed", type=pathlib.Path,
                        help="the seed coverage page of indexer_balance.py (001_62db9f214129356d.txt)")
    parser.add_argument("out_dir", type=pathlib.Path, help="scratch folder outside the repository")
    args = parser.parse_args()
    repo = pathlib.Path(__file__).resolve().parents[2]
    out_dir = args.out_dir.resolve()
    if out_dir == repo or repo in out_dir.parents:
        raise SystemExit(f"refusing to write the seed's code inside the repository ({out_dir})")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "indexer_balance_seed.py"
    target.write_text(rebuild(args.seed), encoding="utf-8")
    self_check(target)
    print(f"wrote {target} (self-check passed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
