#!/usr/bin/env python3
"""Run the seed's planner and routes on a fixed set of cases and write golden data.

The output (tests/data/golden_cases.json) is what tests/golden_test.cpp replays
against sparsecp::plan_tasks, make_route and indexer_route. Every case is
deterministic: the random families draw from random.Random with fixed seeds, so
rerunning this script reproduces the file byte for byte.

Format (top level): {"format": 1, "row_lists": "...", "cases": [case, ...]}. A case:
  id, family               readable name ("family/detail") and its group
  lengths, cp, ratio, mode, block_size, zigzag_min_length   the inputs (null = omitted)
  and then one of
  plan, routes             success: plan[r] = [[document, start, end], ...] from
                           indexer_task_plan; routes[r] = indexer_route(rank=r) fields.
                           The four row lists (send_rows, receive_rows, local_sources,
                           local_targets) are stored as runs [first, count] of
                           consecutive integers (the JSON would be ~40x larger as
                           plain lists); segments are lists of 5 integers.
  plan_error, route_rank, route_error
                           failure: the seed's ValueError text of indexer_task_plan
                           (null when the plan itself is valid, e.g. a bad rank) and of
                           indexer_route(rank=route_rank).
  plan_comparable: false   mode 'none' where the seed's text is its rejection of the
  route_comparable: false  mode ("Indexer task mode must be ...") but sparsecp accepts
                           'none' as its no-balancing baseline; the test checks
                           sparsecp's own 'none' semantics (every rank keeps its own
                           rows, nothing is sent) for that part instead.

Usage:
  python3 tools/golden/reindent.py SEED_FILE /tmp/seedref
  python3 tools/golden/make_golden.py --seed-module /tmp/seedref/indexer_balance_seed.py \
      --out tests/data/golden_cases.json
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from seed_module import load_seed  # noqa: E402

MODES = ("zigzag", "greedy", "hybrid")
NONE_REJECTED = "Indexer task mode must be 'zigzag', 'greedy' or 'hybrid'"


def runs(rows) -> list[list[int]]:
    """Encode a row list as [first, count] runs of consecutive integers."""
    result = []
    for row in rows:
        if result and result[-1][0] + result[-1][1] == row:
            result[-1][1] += 1
        else:
            result.append([row, 1])
    return result


def fit(lengths: list[int], cp: int) -> list[int]:
    """Lengthen the last document so the total divides by cp (lengths stay >= 1)."""
    lengths = [max(1, int(n)) for n in lengths]
    lengths[-1] += (-sum(lengths)) % cp
    return lengths


class Builder:
    def __init__(self, seed):
        self.seed = seed
        self.cases: list[dict] = []
        self.ids: set[str] = set()

    def _inputs(self, family, detail, lengths, cp, ratio, mode, block, threshold):
        case_id = f"{family}/{detail}"
        assert case_id not in self.ids, case_id
        self.ids.add(case_id)
        return {"id": case_id, "family": family, "lengths": list(lengths), "cp": cp, "ratio": ratio,
                "mode": mode, "block_size": block, "zigzag_min_length": threshold}

    def ok(self, family, detail, lengths, cp, ratio, mode, block=None, threshold=None):
        """A case the seed plans; records plan and every rank's route."""
        seed = self.seed
        case = self._inputs(family, detail, lengths, cp, ratio, mode, block, threshold)
        lengths = tuple(lengths)
        seed.indexer_task_plan.cache_clear()
        seed.indexer_route.cache_clear()
        plan = seed.indexer_task_plan(lengths, cp, ratio, mode, block, threshold)
        routes = [seed.indexer_route(lengths, cp, rank, ratio, mode, block, threshold) for rank in range(cp)]
        check_consistent(seed, lengths, cp, ratio, plan, routes)
        case["plan"] = [[[t.document, t.start, t.end] for t in tasks] for tasks in plan]
        case["routes"] = [{
            "segments": [list(s) for s in route.segments],
            "input_splits": list(route.input_splits),
            "output_splits": list(route.output_splits),
            "send_rows": runs(route.send_rows),
            "receive_rows": runs(route.receive_rows),
            "local_sources": runs(route.local_sources),
            "local_targets": runs(route.local_targets),
            "query_count": route.query_count,
        } for route in routes]
        self.cases.append(case)

    def error(self, family, detail, lengths, cp, ratio, mode, block=None, threshold=None, rank=0):
        """A case where the seed raises; records the texts of plan and route."""
        seed = self.seed
        case = self._inputs(family, detail, lengths, cp, ratio, mode, block, threshold)
        lengths = tuple(lengths)
        case["plan_error"] = capture(lambda: seed.indexer_task_plan(lengths, cp, ratio, mode, block, threshold))
        case["route_rank"] = rank
        case["route_error"] = capture(lambda: seed.indexer_route(lengths, cp, rank, ratio, mode, block, threshold))
        assert case["route_error"] is not None, case["id"]
        # The seed rejects mode 'none' in _validate_task_plan; sparsecp plans it.
        if mode == "none":
            for part in ("plan", "route"):
                if case[f"{part}_error"] == NONE_REJECTED:
                    case[f"{part}_comparable"] = False
        self.cases.append(case)


def capture(call) -> str | None:
    try:
        call()
    except ValueError as error:
        return str(error)
    return None


def check_consistent(seed, lengths, cp, ratio, plan, routes):
    """Sanity of the seed itself (and of the re-indentation): coverage, zigzag fast
    path == full-plan route, and what r sends to q is what q expects from r."""
    boundaries = [0]
    for n in lengths:
        boundaries.append(boundaries[-1] + n)
    local = boundaries[-1] // cp
    owner_of = []  # global row per worker position, per rank
    for tasks in plan:
        rows = [boundaries[t.document] + p for t in tasks for p in range(t.start, t.end)]
        owner_of.append(rows)
    assert sorted(r for rows in owner_of for r in rows) == list(range(boundaries[-1]))
    for rank, route in enumerate(routes):
        assert route == seed._route_from_tasks(plan, lengths, rank, ratio)
        assert route.query_count == len(owner_of[rank])
    for owner, route in enumerate(routes):
        cursor = 0
        for peer in range(cp):
            sent = route.send_rows[cursor:cursor + route.input_splits[peer]]
            cursor += route.input_splits[peer]
            begin = sum(routes[peer].output_splits[:owner])
            positions = routes[peer].receive_rows[begin:begin + routes[peer].output_splits[owner]]
            assert [owner * local + row for row in sent] == [owner_of[peer][p] for p in positions]
        assert [owner * local + row for row in route.local_sources] == \
            [owner_of[owner][p] for p in route.local_targets]


def lognormal(rng, count, median, sigma=1.0):
    return [max(1, int(round(median * math.exp(rng.gauss(0.0, sigma))))) for _ in range(count)]


def lognormal_total(rng, total, median, sigma=1.0):
    """Lognormal lengths until `total` tokens; the last document is cut to fit."""
    lengths = []
    while sum(lengths) < total:
        lengths.append(max(1, int(round(median * math.exp(rng.gauss(0.0, sigma))))))
    lengths[-1] -= sum(lengths) - total
    if lengths[-1] < 1:
        lengths.pop()
        lengths[-1] += total - sum(lengths)
    return lengths


def build(seed) -> list[dict]:
    b = Builder(seed)
    rng = random.Random(20260520)

    # The SYSTEM.md example, every mode and a few blocks/thresholds.
    example = (5000, 300, 2699, 1)
    b.ok("system_example", "zigzag", example, 4, 4, "zigzag")
    # local 2000 < the default block 2048: greedy/hybrid need an explicit block here.
    b.error("system_example", "greedy_default_block", example, 4, 4, "greedy")
    for block in (1, 7, 300, 2000):
        b.ok("system_example", f"greedy_b{block}", example, 4, 4, "greedy", block)
    for threshold in (1, 299, 300, 301, 2699, 2700, 5000, 5001):
        b.ok("system_example", f"hybrid_t{threshold}", example, 4, 4, "hybrid", 64, threshold)
    b.error("system_example", "hybrid_default_block", example, 4, 4, "hybrid", None, 1000)

    # Single-token documents.
    for cp in (1, 2, 3, 8, 16):
        for count in sorted({cp, 3 * cp, 40 * cp}):
            lengths = [1] * count
            local = count // cp
            b.ok("single_token", f"n{count}_cp{cp}_zigzag", lengths, cp, 4, "zigzag")
            b.ok("single_token", f"n{count}_cp{cp}_greedy", lengths, cp, 1, "greedy", max(1, local // 2))
            b.ok("single_token", f"n{count}_cp{cp}_hybrid", lengths, cp, 4, "hybrid", local, 1)
    # Single-token documents mixed with long ones.
    for cp in (2, 4, 7):
        lengths = fit([1, 1, 1, 500, 1, 1, 37, 1, 900, 1], cp)
        for mode in MODES:
            block = 16 if mode != "zigzag" else None
            threshold = 37 if mode == "hybrid" else None
            b.ok("single_token", f"mixed_cp{cp}_{mode}", lengths, cp, 4, mode, block, threshold)

    # One document.
    for cp in (1, 2, 3, 5, 8, 13, 32, 64):
        for per_rank in (1, 2, 7, 40):
            n = cp * per_rank
            for mode in MODES:
                block = max(1, per_rank // 2) if mode != "zigzag" else None
                threshold = n if mode == "hybrid" else None
                b.ok("one_document", f"n{n}_cp{cp}_{mode}", [n], cp, 4, mode, block, threshold)

    # cp = 1: everything stays local.
    for trial in range(4):
        lengths = lognormal(rng, rng.randint(1, 9), 200)
        for mode in MODES:
            block = rng.randint(1, sum(lengths)) if mode != "zigzag" else None
            threshold = rng.choice(lengths) if mode == "hybrid" else None
            b.ok("cp1", f"t{trial}_{mode}", lengths, 1, 4, mode, block, threshold)

    # Large groups: cp 16..64 on small batches.
    for cp in (16, 24, 31, 32, 48, 64):
        for trial in range(2):
            local = rng.choice((1, 3, 20, 45))
            lengths = fit(lognormal(rng, max(1, cp * local // 60 + 1), 60), cp)
            local = sum(lengths) // cp
            for mode in MODES:
                block = rng.randint(1, local) if mode != "zigzag" else None
                threshold = rng.choice(lengths) if mode == "hybrid" else None
                b.ok("cp_large", f"cp{cp}_t{trial}_{mode}", lengths, cp, 4, mode, block, threshold)

    # Ratios 1, 4, 128, and larger than every document.
    for ratio in (1, 2, 4, 5, 128, 5000):
        for trial in range(2):
            cp = rng.choice((2, 4, 6, 8))
            lengths = fit(lognormal(rng, rng.randint(3, 12), 180), cp)
            local = sum(lengths) // cp
            for mode in MODES:
                block = rng.randint(1, local) if mode != "zigzag" else None
                threshold = sorted(lengths)[len(lengths) // 2] if mode == "hybrid" else None
                b.ok("ratio", f"r{ratio}_t{trial}_{mode}", lengths, cp, ratio, mode, block, threshold)

    # Block sizes from 1 to the local count.
    lengths = fit([333, 1, 90, 1025, 64, 7, 480], 4)
    local = sum(lengths) // 4
    for block in sorted({1, 2, 3, 31, 64, 127, local // 2, local - 1, local}):
        b.ok("block", f"greedy_b{block}", lengths, 4, 4, "greedy", block)
        b.ok("block", f"hybrid_b{block}", lengths, 4, 4, "hybrid", block, 480)
    lengths = fit([4096, 2100, 1900], 2)  # local >= 2048: the default block applies
    b.ok("block", "greedy_default_cp2", lengths, 2, 4, "greedy")
    b.ok("block", "hybrid_default_cp2", lengths, 2, 4, "hybrid", None, 2100)

    # Hybrid thresholds around document lengths.
    lengths = fit([17, 64, 65, 200, 3, 1000, 15, 16], 8)
    for threshold in sorted({1, 15, 16, 17, 63, 64, 65, 66, 199, 200, 201, 999, 1000, 1001, 10**9}):
        b.ok("hybrid_threshold", f"t{threshold}", lengths, 8, 4, "hybrid", 24, threshold)

    # Zigzag remainders: lengths at every residue around 2*cp, documents shorter than 2*cp.
    for cp in (2, 3, 4, 5):
        lengths = fit([2 * cp * k + r for k in (0, 1, 3) for r in range(2 * cp) if 2 * cp * k + r > 0], cp)
        b.ok("zigzag_remainder", f"cp{cp}_zigzag", lengths, cp, 4, "zigzag")
        b.ok("zigzag_remainder", f"cp{cp}_hybrid", lengths, cp, 4, "hybrid", 5, 2 * cp)
        b.ok("zigzag_remainder", f"cp{cp}_greedy", lengths, cp, 4, "greedy", 5)
    for cp in (4, 8):  # all documents shorter than 2*cp: zigzag is pure remainder pooling
        lengths = fit([rng.randint(1, 2 * cp - 1) for _ in range(3 * cp)], cp)
        for mode in MODES:
            block = 3 if mode != "zigzag" else None
            threshold = 1 if mode == "hybrid" else None
            b.ok("zigzag_remainder", f"short_cp{cp}_{mode}", lengths, cp, 4, mode, block, threshold)

    # Equal costs: many identical documents (exercises the greedy tie order).
    for cp in (3, 4, 6):
        lengths = [60] * (2 * cp)
        for block in (7, 60):
            b.ok("ties", f"cp{cp}_greedy_b{block}", lengths, cp, 4, "greedy", block)
            b.ok("ties", f"cp{cp}_hybrid_b{block}", lengths, cp, 4, "hybrid", block, 61)

    # Random batches: lognormal, uniform, bimodal, with random options.
    for trial in range(60):
        cp = rng.choice((1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32))
        kind = rng.choice(("lognormal", "uniform", "bimodal"))
        total_target = rng.randint(cp, 3000)
        if kind == "lognormal":
            lengths = lognormal_total(rng, total_target, max(1, total_target // (4 * cp) or 1))
        elif kind == "uniform":
            lengths = []
            while sum(lengths) < total_target:
                lengths.append(rng.randint(1, max(1, total_target // 5)))
        else:
            lengths = [rng.choice((rng.randint(1, 8), rng.randint(200, 900))) for _ in range(rng.randint(1, 8))]
        lengths = fit(lengths, cp)
        local = sum(lengths) // cp
        mode = MODES[trial % 3]
        ratio = rng.choice((1, 4, 4, 4, 128))
        block = rng.randint(1, local) if mode != "zigzag" else None
        threshold = rng.choice(lengths) + rng.choice((-1, 0, 1)) if mode == "hybrid" else None
        if threshold is not None:
            threshold = max(1, threshold)
        b.ok("random", f"t{trial}_{kind}_{mode}", lengths, cp, ratio, mode, block, threshold)

    # A few larger batches (up to ~20000 tokens).
    for total, cp in ((8192, 8), (12000, 16), (20000, 32), (16384, 64)):
        lengths = fit(lognormal_total(rng, total, total // cp // 4), cp)
        local = sum(lengths) // cp
        b.ok("large", f"n{total}_cp{cp}_zigzag", lengths, cp, 4, "zigzag")
        b.ok("large", f"n{total}_cp{cp}_greedy", lengths, cp, 4, "greedy", max(1, local // 4))
        b.ok("large", f"n{total}_cp{cp}_hybrid", lengths, cp, 4, "hybrid", max(1, local // 4), local)

    add_errors(b)
    return b.cases


def add_errors(b: Builder) -> None:
    good = [300, 1, 99, 200]  # 600 tokens: local 150 on 4 ranks
    # Bad lengths / ratio / cp / divisibility (checked first, in every mode).
    for mode in MODES:
        extra = {"block": 10} if mode != "zigzag" else {}
        if mode == "hybrid":
            extra["threshold"] = 5
        b.error("bad_input", f"empty_{mode}", [], 4, 4, mode, **extra)
        b.error("bad_input", f"zero_length_{mode}", [300, 0, 100, 200], 4, 4, mode, **extra)
        b.error("bad_input", f"negative_length_{mode}", [300, -1, 101, 200], 4, 4, mode, **extra)
        b.error("bad_input", f"ratio0_{mode}", good, 4, 0, mode, **extra)
        b.error("bad_input", f"ratio_negative_{mode}", good, 4, -4, mode, **extra)
        b.error("bad_input", f"indivisible_{mode}", [300, 1, 99, 201], 4, 4, mode, **extra)
        b.error("bad_input", f"indivisible_cp7_{mode}", good, 7, 4, mode, **extra)
        b.error("bad_input", f"cp0_{mode}", good, 0, 4, mode, **extra)
        b.error("bad_input", f"cp_negative_{mode}", good, -2, 4, mode, **extra, rank=0)
        b.error("bad_input", f"more_ranks_than_tokens_{mode}", [3], 4, 4, mode, **extra)
    # Lengths are checked before the block size and the hybrid threshold.
    b.error("order", "lengths_before_block", [0], 1, 4, "greedy", 0)
    b.error("order", "lengths_before_hybrid_threshold", [5, 0], 1, 4, "hybrid", None, None)
    b.error("order", "lengths_before_zigzag_block", [5, 5], 3, 4, "zigzag", 4)
    # Block size errors.
    b.error("block_size", "zigzag_with_block", good, 4, 4, "zigzag", 10)
    b.error("block_size", "zigzag_with_block_1", good, 4, 4, "zigzag", 1)
    for mode in ("greedy", "hybrid"):
        threshold = 100 if mode == "hybrid" else None
        b.error("block_size", f"{mode}_block0", good, 4, 4, mode, 0, threshold)
        b.error("block_size", f"{mode}_block_negative", good, 4, 4, mode, -3, threshold)
        b.error("block_size", f"{mode}_block_over_local", good, 4, 4, mode, 151, threshold)
        b.error("block_size", f"{mode}_default_block_over_local", good, 4, 4, mode, None, threshold)
        b.error("block_size", f"{mode}_block_over_local_cp1", [5, 6], 1, 4, mode, 12, threshold)
    # The block size is checked before the hybrid threshold.
    b.error("order", "hybrid_block_over_local_before_missing_threshold", good, 4, 4, "hybrid", 151, None)
    b.error("order", "hybrid_block0_before_bad_threshold", good, 4, 4, "hybrid", 0, 0)
    b.error("order", "greedy_block0_before_threshold", good, 4, 4, "greedy", 0, 10)
    # Hybrid threshold errors.
    b.error("hybrid_threshold", "missing", good, 4, 4, "hybrid", 10, None)
    b.error("hybrid_threshold", "zero", good, 4, 4, "hybrid", 10, 0)
    b.error("hybrid_threshold", "negative", good, 4, 4, "hybrid", 10, -5)
    b.error("hybrid_threshold", "zigzag_with_threshold", good, 4, 4, "zigzag", None, 100)
    b.error("hybrid_threshold", "greedy_with_threshold", good, 4, 4, "greedy", 10, 100)
    b.error("hybrid_threshold", "greedy_default_block_with_threshold", [4096], 1, 4, "greedy", None, 1)
    # Bad modes (lengths valid: sparsecp parses the mode before anything else).
    for mode in ("", "Zigzag", "zig-zag", "balanced", "GREEDY", " hybrid"):
        b.error("bad_mode", f"mode_{mode.strip() or 'empty'}{'_space' if mode.startswith(' ') else ''}",
                good, 4, 4, mode)
    # Rank outside the group (checked by indexer_route before anything else).
    for mode in MODES:
        extra = {"block": 10} if mode != "zigzag" else {}
        if mode == "hybrid":
            extra["threshold"] = 100
        b.error("bad_rank", f"rank_eq_cp_{mode}", good, 4, 4, mode, **extra, rank=4)
        b.error("bad_rank", f"rank_negative_{mode}", good, 4, 4, mode, **extra, rank=-1)
        b.error("bad_rank", f"rank_before_lengths_{mode}", [0], 4, 4, mode, **extra, rank=9)
        b.error("bad_rank", f"rank_before_block_{mode}", good, 4, 4, mode, block=0, rank=4)
    # Mode 'none': only errors raised before the seed rejects the mode are comparable.
    b.error("none", "block_given", good, 4, 4, "none", 10)
    b.error("none", "block0_given", good, 4, 4, "none", 0)
    b.error("none", "bad_lengths", [300, 0], 4, 4, "none")
    b.error("none", "indivisible", good, 7, 4, "none")
    b.error("none", "bad_rank", good, 4, 4, "none", rank=4)
    # Mode 'none' on valid input: the seed has no plan; sparsecp keeps rows at home.
    for lengths, cp in ((good, 4), ([5000, 300, 2699, 1], 4), ([7], 1), ([1] * 12, 3)):
        b.error("none", f"baseline_n{sum(lengths)}_cp{cp}", lengths, cp, 4, "none")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed-module", required=True, help="indexer_balance_seed.py from reindent.py")
    parser.add_argument("--out", required=True, type=pathlib.Path, help="output JSON file")
    args = parser.parse_args()
    seed = load_seed(args.seed_module)
    cases = build(seed)
    document = {
        "format": 1,
        "source": "seed indexer_balance.py lines 36-407 (shared/seeds/001_62db9f214129356d.txt), "
                  "re-indented by tools/golden/reindent.py; generated by tools/golden/make_golden.py",
        "row_lists": "send_rows, receive_rows, local_sources and local_targets are runs [first, count] "
                     "of consecutive integers",
        "cases": cases,
    }
    text = json.dumps(document, separators=(",", ":"))
    # One case per line keeps diffs of regenerated data readable.
    text = text.replace(',{"id":', ',\n{"id":').replace('"cases":[{', '"cases":[\n{')
    args.out.write_text(text + "\n", encoding="utf-8")
    ok = sum(1 for c in cases if "plan" in c)
    print(f"wrote {args.out}: {len(cases)} cases ({ok} planned, {len(cases) - ok} errors), "
          f"{len(text) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
