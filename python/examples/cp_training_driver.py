"""The training run the DeepSeek examples share: strategies against each other, step by step.

``train_deepseek_v4.py`` and ``train_deepseek_v32.py`` each supply an :class:`Example` (its model's
constructor, title and words for the header) and their own flags; this module does the rest,
the same for both models:

- spawns ``--ranks`` x ``--dp`` gloo ranks on loopback (``torch.multiprocessing``, "spawn");
- on each rank, one copy of the same randomly initialised model per strategy (``--modes``, each
  with every ``--selector``), made context-parallel with the model's ``sparsecp.models`` module
  (``context_parallel``; with ``--dp D > 1``, FSDP2 over the flattened dp x cp mesh afterwards);
- trains every copy on the same packed batch of ``lognormal`` documents each step, the strategies
  interleaved step by step, so a slow spell of the machine hits them alike;
- times each step (wall and the calling thread's CPU seconds) and the selector's calls, prints a
  line per step and strategy, then medians per strategy, the step's gain over the first strategy
  with its 95% interval, and memory against one process running the whole batch;
- writes the summary as JSON (``--json``).

Gains follow ``sparsecp run``'s convention (docs/guide/cli.md, "The verdict"): the median over
steps of the per-step ratio, with a distribution-free 95% interval of that median (order
statistics); a difference is claimed only when the interval excludes 1 ("within noise"
otherwise), and only from 6 steps or more (over 6 ratios their min..max holds the median with
probability 97%; over 3, only 75%). A run of one strategy compares nothing.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import importlib
import json
import math
import os
import platform
import resource
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

UNCALIBRATED = "-uncalibrated"  # a mode name ending so plans with calibrate=False (the default cost model)
MODE_OPTIONS: dict[str, dict[str, Any]] = {
    "none": {}, "zigzag": {}, "greedy": {"block_size": 256}, "hybrid": {"block_size": 256, "zigzag_min_length": 1024},
    "spill": {},
}
STEPS_FOR_VERDICT = 6  # the fewest steps whose ratios give a 95% interval of their median (sparsecp run's rounds)
MIB = 2 ** -20


@dataclasses.dataclass(frozen=True)
class Example:
    """What one model's example supplies to the driver.

    Attributes:
        title: The model's name in the header, e.g. ``"DeepSeek-V4"``.
        models: The ``sparsecp.models`` module that makes it context-parallel, e.g.
            ``"sparsecp.models.deepseek_v4"`` (imported on each rank).
        build_model: ``build_model(args)`` returns the transformers ``...ForCausalLM`` the flags
            describe; called after ``torch.manual_seed(args.seed)`` on every rank, so the same
            weights everywhere. A module-level function (it is pickled to the spawned ranks).
        describe: ``describe(args)``, the model's words in the header (e.g. its indexer).
        baseline_steps: Steps of the one-process memory baseline (at most ``--steps``).
    """

    title: str
    models: str
    build_model: Callable[[argparse.Namespace], Any]
    describe: Callable[[argparse.Namespace], str]
    baseline_steps: int = 1


# ---------------------------------------------------------------------------------------
# Flags

def argument_parser(doc: str, modes: str, steps: int) -> argparse.ArgumentParser:
    """The flags every example takes (``--selector`` is the example's own); ``doc``
    is the example's docstring, ``modes`` and ``steps`` its defaults."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4, help="CP ranks (gloo on loopback)")
    parser.add_argument("--dp", type=int, default=1,
                        help="data-parallel rows: with D > 1, D x --ranks processes, FSDP2 over the flattened "
                             "dp x cp mesh (each dp row its own batch) instead of replicated weights")
    parser.add_argument("--modes", default=modes,
                        help="strategies, interleaved every step (the first is the baseline); spill and auto "
                             "calibrate their cost model on the worker selector; NAME-uncalibrated runs NAME with "
                             "calibrate=False")
    parser.add_argument("--steps", type=int, default=steps,
                        help=f"training steps per strategy (a gain is called outside noise from {STEPS_FOR_VERDICT})")
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per packed batch")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--index-heads", type=int, default=32)
    parser.add_argument("--topk", type=int, default=128)
    parser.add_argument("--kl", type=float, default=0.01, help="indexer KL coefficient (the indexer's training signal)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-single", action="store_true", help="skip the one-process memory baseline")
    parser.add_argument("--json", help="also write the summary as JSON to this file")
    return parser


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Splits ``--modes`` and ``--selector`` into lists and names the variants (``mode+selector``
    when there are several selectors); exits through ``parser.error`` on a bad value."""
    args.modes = [m for m in args.modes.split(",") if m]
    args.selectors = [s for s in args.selector.split(",") if s]
    if args.ranks < 1 or args.tokens % args.ranks or not args.modes:
        parser.error("--ranks must divide --tokens, and --modes name at least one strategy")
    if not args.selectors or any(s not in ("model", "fused") for s in args.selectors):
        parser.error(f"--selector takes 'model', 'fused' or both, got {args.selector!r}")
    if args.dp < 1:
        parser.error("--dp must be at least 1")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    args.variants = [m if len(args.selectors) == 1 else f"{m}+{s}" for m in args.modes for s in args.selectors]


# ---------------------------------------------------------------------------------------
# One rank

def batch(args: argparse.Namespace, step: int, row: int = 0) -> tuple[tuple[int, ...], Any]:
    """Step ``step``'s packed batch of dp row ``row`` (row 0: the replicated run's batch)."""
    import torch

    import sparsecp

    seed = args.seed + step + 7919 * row
    lengths = tuple(int(n) for n in sparsecp.generate_batch("lognormal", args.tokens, args.ranks, seed))
    generator = torch.Generator().manual_seed(seed)
    return lengths, torch.randint(0, 512, (1, sum(lengths)), generator=generator)


def rss_bytes() -> int:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_bytes(model: Any, optimizer: Any) -> dict[str, int]:
    """This rank's bytes of parameters, gradients and optimizer state (a DTensor counts its
    local shard only: what FSDP2 keeps between steps)."""
    def size(tensor: Any) -> int:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        return local.numel() * local.element_size()

    parameters = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if hasattr(v, "numel") and v.ndim > 0]
    return {"param_bytes": sum(size(p) for p in parameters),
            "grad_bytes": sum(size(p.grad) for p in parameters if p.grad is not None),
            "optimizer_bytes": sum(size(v) for v in state)}


def calibration_fields(state: Any) -> dict[str, Any]:
    """What spill's calibration did on this rank (empty values for a strategy without one)."""
    report = None if state.calibration is None else state.calibration.report
    return {"calibration": None if report is None else str(report),
            "calibration_seconds": 0.0 if report is None else report.seconds,
            "predictions": [] if report is None else report.predictions,
            "predicted_by_refit": [] if report is None else report.predicted_by_refit}


def make_models(example: Example, args: argparse.Namespace, cp: Any, cp_group: Any, flat: Any) -> dict[str, Any]:
    """One (model, optimizer) per variant, each a copy of the same model made context-parallel."""
    import torch

    torch.manual_seed(args.seed)
    base = example.build_model(args)
    models = {}
    for variant in args.variants:
        mode, _, selector = variant.partition("+")
        strategy = mode.removesuffix(UNCALIBRATED)
        model = copy.deepcopy(base)
        cp.context_parallel(model, cp_group, strategy, selector=selector or args.selectors[0],
                            indexer_kl_coeff=args.kl, calibrate=not mode.endswith(UNCALIBRATED),
                            **MODE_OPTIONS.get(strategy, {}))
        if flat is not None:  # after context_parallel: FSDP2 wraps the CP forwards and hooks
            from torch.distributed.fsdp import fully_shard

            for layer in model.model.layers:
                fully_shard(layer, mesh=flat)
            fully_shard(model, mesh=flat)
        model.train()
        models[variant] = (model, torch.optim.AdamW(model.parameters(), lr=args.lr))
    return models


def run_rank(rank: int, size: int, port: int, example: Example, args: argparse.Namespace, queue: Any) -> None:
    """One gloo rank: trains every variant ``args.steps`` steps, puts a record per step and
    variant on ``queue``, then one with the rank's peak memory growth."""
    import torch
    import torch.distributed as dist

    import sparsecp.torch as sparsecp_torch

    cp = importlib.import_module(example.models)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=1200))
    try:
        cp_group: Any = None
        flat: Any = None
        row = 0
        if args.dp > 1:  # FSDP2 over the flattened dp x cp mesh
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (args.dp, size // args.dp), mesh_dim_names=("dp", "cp"))
            cp_group, flat, row = mesh["cp"], mesh["dp", "cp"]._flatten(), mesh["dp"].get_local_rank()
        models = make_models(example, args, cp, cp_group, flat)
        resident = rss_bytes()
        memories: dict[str, dict[str, int]] = {}
        step_cpu = dict.fromkeys(models, 0.0)
        for step in range(args.steps):
            lengths, input_ids = batch(args, step, row)
            ids, positions = cp.shard_batch(input_ids, lengths, cp_group)
            labels = cp.shard_labels(input_ids, lengths, cp_group)
            for mode, (model, optimizer) in models.items():
                state = cp.context_parallel_state(model)
                assert state is not None
                state.stats.reset()
                state.clock.calls, state.clock.seconds = 0, 0.0
                sparsecp_torch.reset_exchange_stats()
                dist.barrier()
                start, cpu_start = time.perf_counter(), time.thread_time()
                optimizer.zero_grad(set_to_none=True)
                out = model(input_ids=ids, position_ids=positions, document_lengths=lengths)
                if flat is None:  # replicated: shares summed over the CP ranks
                    loss = cp.causal_lm_loss(out.logits, labels, lengths)
                    kl = cp.indexer_kl_loss(model)
                    (loss + kl if kl is not None else loss).backward()
                    cp.all_reduce_gradients(model)
                else:  # FSDP2 averages over dp x cp: each term scaled for that mean
                    loss = cp.causal_lm_loss(out.logits, labels, lengths, group=flat)
                    kl = cp.indexer_kl_loss(model, group=flat)
                    (loss + kl if kl is not None else loss).backward()
                if step == 0:  # after backward, before the step: parameters and gradients (AdamW's
                    # state from the first step on, so it is read after the step)
                    memories[mode] = memory_bytes(model, optimizer)
                optimizer.step()
                seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - cpu_start
                step_cpu[mode] += cpu_seconds
                if step == 0:
                    memories[mode]["optimizer_bytes"] = memory_bytes(model, optimizer)["optimizer_bytes"]
                # reported: the global mean loss and the mean over dp rows of each row's KL
                summed = torch.tensor([float(loss.detach()) / (size if flat is not None else 1),
                                       float(kl.detach()) / args.dp if kl is not None else 0.0])
                dist.all_reduce(summed)
                queue.put({"rank": rank, "step": step, "mode": mode, "seconds": seconds, "cpu_seconds": cpu_seconds,
                           "loss": float(summed[0]), "kl": float(summed[1]), "documents": len(lengths),
                           "longest": max(lengths), "indexer_seconds": state.stats.indexer_seconds,
                           "selector_seconds": state.clock.seconds, "dispatch_bytes": state.stats.dispatch_bytes,
                           "selection_bytes": sparsecp_torch.exchange_stats()["bytes_sent"],
                           **calibration_fields(state), **memories[mode]})
        # The call a training loop makes (collective: every rank, every strategy in the same order),
        # over the whole run; each strategy's own step seconds, since the strategies interleave.
        balance = {mode: str(cp.balance_report(model, step_seconds=step_cpu[mode]))
                   for mode, (model, _) in models.items()}
        queue.put({"rank": rank, "peak_growth": peak_bytes() - resident, "balance": balance})
    except BaseException as error:
        queue.put({"rank": rank, "error": f"{type(error).__name__}: {error}"})
        raise
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------
# Spawning

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spawn(example: Example, size: int, args: argparse.Namespace,
          report: Callable[[list[dict[str, Any]]], None] | None) -> list[dict[str, Any]]:
    """Runs ``size`` ranks and returns their records; ``report`` gets each (step, variant)'s
    records, sorted by rank, as soon as every rank has put its own."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    queue = context.Queue()
    port = free_port()
    processes = [context.Process(target=run_rank, args=(rank, size, port, example, args, queue))
                 for rank in range(size)]
    for process in processes:
        process.start()
    records: list[dict[str, Any]] = []
    finished = 0
    pending: dict[tuple[int, str], list[dict[str, Any]]] = {}
    while finished < len(processes):
        record = queue.get(timeout=3600)
        if "error" in record:
            for process in processes:
                process.kill()
            raise SystemExit(f"rank {record['rank']} failed: {record['error']}")
        records.append(record)
        if "peak_growth" in record:
            finished += 1
            continue
        key = (record["step"], record["mode"])
        pending.setdefault(key, []).append(record)
        if len(pending[key]) == len(processes) and report is not None:
            report(sorted(pending.pop(key), key=lambda r: r["rank"]))
    for process in processes:
        process.join()
    return records


# ---------------------------------------------------------------------------------------
# Figures

@dataclasses.dataclass(frozen=True)
class MedianInterval:
    """The median of per-step ratios and a distribution-free interval of it: ``[x_(k), x_(n-k+1)]``
    of the sorted ratios, with ``k`` the largest whose coverage is at least 95% (``sparsecp run``'s
    ``median_interval``). Over fewer than 6 ratios no ``k`` reaches 95%; ``coverage`` says what
    min..max holds (75% over 3)."""

    median: float
    low: float
    high: float
    coverage: float
    count: int

    @classmethod
    def of(cls, values: list[float]) -> MedianInterval:
        ordered = sorted(values)
        n = len(ordered)
        if n == 0:
            return cls(math.nan, math.nan, math.nan, 0.0, 0)

        def coverage(k: int) -> float:  # 1 - 2 P(B <= k - 1), B ~ Binomial(n, 1/2)
            return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n

        k = 1
        while k < n // 2 and coverage(k + 1) >= 0.95:
            k += 1
        return cls(statistics.median(ordered), ordered[k - 1], ordered[n - k], coverage(k), n)

    def verdict(self) -> str:
        """"within noise" where the interval holds 1; "faster"/"slower" (a ratio of the first
        strategy's time to this one's above/below 1) only from 6 steps; else "too few steps"."""
        if self.low <= 1 <= self.high:
            return "within noise"
        if self.count < STEPS_FOR_VERDICT:
            return "too few steps"
        return "faster" if self.low > 1 else "slower"

    def as_json(self) -> dict[str, Any]:
        return {"median": self.median, "low": self.low, "high": self.high, "coverage": self.coverage,
                "verdict": self.verdict()}


def interval_text(interval: dict[str, Any]) -> str:
    """``median (low-high)`` of a ``MedianInterval.as_json()``, then ``~`` where it holds 1 (within
    noise) and ``?`` where it excludes 1 over too few steps for a verdict."""
    mark = {"within noise": " ~", "too few steps": " ?"}.get(interval["verdict"], "")
    return f"{interval['median']:.3f} ({interval['low']:.3f}-{interval['high']:.3f}){mark}"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(records: list[dict[str, Any]], single: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Medians per variant over the steps, each variant against the first strategy with the same
    selector in the same step; the memory figures."""
    steps = [r for r in records if "step" in r]
    result: dict[str, Any] = {"modes": {}}
    for mode in args.variants:
        mine = [r for r in steps if r["mode"] == mode]
        by_step: dict[int, list[dict[str, Any]]] = {}
        for r in mine:
            by_step.setdefault(r["step"], []).append(r)
        first = args.modes[0] + (f"+{mode.partition('+')[2]}" if "+" in mode else "")  # same selector
        base_steps = {s: [r for r in steps if r["mode"] == first and r["step"] == s] for s in by_step}
        step_time = [max(r["seconds"] for r in rs) for rs in by_step.values()]
        imbalance = [max(r["selector_seconds"] for r in rs) / max(1e-12, statistics.mean(
            r["selector_seconds"] for r in rs)) for rs in by_step.values()]
        share = [statistics.mean(r["indexer_seconds"] / r["seconds"] for r in rs) for rs in by_step.values()]
        slowest_selector = [max(r["selector_seconds"] for r in rs) for rs in by_step.values()]
        against_first = [max(r["selector_seconds"] for r in rs) / max(1e-12, max(
            r["selector_seconds"] for r in base_steps[s])) for s, rs in by_step.items()]
        # The step in CPU seconds (each rank's own work), against the first strategy's with the same
        # selector, and the bound a perfect balancer of that strategy's selection could reach.
        step_cpu = {s: max(r["cpu_seconds"] for r in rs) for s, rs in by_step.items()}
        gain, bound = [], []
        for s in by_step:
            ranks = base_steps[s]
            m = statistics.mean(r["selector_seconds"] for r in ranks)
            imbalance_first = max(r["selector_seconds"] for r in ranks) / max(1e-12, m)
            rest = statistics.mean(r["cpu_seconds"] - r["selector_seconds"] for r in ranks)
            gain.append(max(r["cpu_seconds"] for r in ranks) / step_cpu[s])
            bound.append((rest + imbalance_first * m) / (rest + m))
        step_gain = MedianInterval.of(gain)
        selector_vs_first = MedianInterval.of(against_first)
        calibration = next((r["calibration"] for r in sorted(mine, key=lambda r: (-r["step"], r["rank"]))
                            if r.get("calibration")), None)
        result["modes"][mode] = {
            "step_seconds": median(step_time), "step_cpu_seconds": median(list(step_cpu.values())),
            "step_gain": step_gain.median, "step_gain_interval": step_gain.as_json(),
            "step_bound": median(bound), "step_gain_of_bound": median([g / b for g, b in zip(gain, bound)]),
            "calibration_seconds": max(r.get("calibration_seconds", 0.0) for r in mine),
            "calibration": calibration, "cost_model": calibration,
            # each forward's (predicted, measured) selector seconds per rank, by the model that planned it
            "predictions": max((r["predictions"] for r in mine), key=len),
            "predicted_by_refit": max((r["predicted_by_refit"] for r in mine), key=len),
            "selection_imbalance": median(imbalance), "indexer_share": median(share),
            "slowest_selector_seconds": median(slowest_selector),
            "slowest_selector_vs_first": selector_vs_first.median,
            "slowest_selector_vs_first_interval": selector_vs_first.as_json(),
            "per_step_slowest_selector_vs_first": against_first, "per_step_gain": gain,
            "dispatch_bytes_per_rank": median([r["dispatch_bytes"] for r in mine]),
            "selection_bytes_per_rank": median([r["selection_bytes"] for r in mine]),
            "losses": [by_step[s][0]["loss"] for s in sorted(by_step)]}
    result["peak_growth_per_rank"] = [r["peak_growth"] for r in sorted(
        (r for r in records if "peak_growth" in r), key=lambda r: r["rank"])]
    result["peak_growth_one_process"] = next((r["peak_growth"] for r in single if "peak_growth" in r), None)
    result["balance_report"] = next((r["balance"] for r in records if r.get("rank") == 0 and "balance" in r), {})
    first_step = sorted((r for r in steps if r["step"] == 0 and r["mode"] == args.variants[0]),
                        key=lambda r: r["rank"])
    result["state_bytes_per_rank"] = {name: first_step[0][name]
                                      for name in ("param_bytes", "grad_bytes", "optimizer_bytes")}
    return result


# ---------------------------------------------------------------------------------------
# Printing

def cpu_model() -> str:
    """The CPU's model name, family and model (lscpu's words), for the report's header."""
    try:
        with open("/proc/cpuinfo") as file:
            fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in file)}
    except OSError:
        return platform.machine()
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"


def step_printer(width: int) -> Callable[[list[dict[str, Any]]], None]:
    """Prints one (step, variant)'s line from its ranks' records."""
    def print_step(ranks: list[dict[str, Any]]) -> None:
        first = ranks[0]
        shares = " ".join(f"{100 * r['indexer_seconds'] / r['seconds']:3.0f}%" for r in ranks)
        memory = "  per rank MiB: " + " ".join(f"params {r['param_bytes'] * MIB:.2f} grads {r['grad_bytes'] * MIB:.2f} "
                                               f"adamw {r['optimizer_bytes'] * MIB:.2f}" for r in ranks[:1])
        print(f"step {first['step']}  {first['mode']:{width}s} loss {first['loss']:.6f}  kl {first['kl']:.5f}  "
              f"step {max(r['seconds'] for r in ranks):6.2f} s (CPU {max(r['cpu_seconds'] for r in ranks):5.2f} s)  "
              f"selection {max(r['selector_seconds'] for r in ranks):6.3f} s  indexer share per rank {shares}  "
              f"({first['documents']} documents, longest {first['longest']})"
              + (memory if first["step"] == 0 else ""), flush=True)
    return print_step


def interval_note(args: argparse.Namespace) -> str:
    """What the intervals printed beside the ratios are, over ``args.steps`` steps."""
    coverage = MedianInterval.of([1.0] * args.steps).coverage
    note = (f"in brackets, the {100 * coverage:.0f}% interval of the median over the {args.steps} steps "
            f"(order statistics, as `sparsecp run`); ~ or within noise: the interval holds 1, not a "
            f"measurable difference")
    if args.steps < STEPS_FOR_VERDICT:
        note += (f"; ? or too few steps: it excludes 1, but a verdict needs {STEPS_FOR_VERDICT} steps (the fewest "
                 f"whose min..max holds the median with 95%)")
    return note


def print_summary(result: dict[str, Any], args: argparse.Namespace) -> None:
    compare = len(args.modes) > 1  # a run of one strategy compares nothing
    width = max(16, *(len(v) for v in args.variants))
    rows = result["modes"]
    versus = f"vs {args.modes[0]} (interval)"
    print("\nmedians per strategy over the steps (step: the slowest rank's wall time; selection: the selector's "
          "CPU seconds, the slowest rank's"
          + (", its ratio to the first strategy's in the same step" if compare else "")
          + ", and max / mean over the ranks)")
    if compare:
        print(interval_note(args))
    print(f"{'mode':{width}s} {'step s':>8s} {'slowest sel. s':>15s} " + (f"{versus:>23s} " if compare else "")
          + f"{'sel. imbalance':>15s} {'indexer share':>14s} {'KV bytes/rank':>14s} {'sel. bytes/rank':>16s}")
    for mode, row in rows.items():
        baseline = mode.partition("+")[0] == args.modes[0]
        ratio = "-" if baseline else interval_text(row["slowest_selector_vs_first_interval"])
        print(f"{mode:{width}s} {row['step_seconds']:8.2f} {row['slowest_selector_seconds']:15.3f} "
              + (f"{ratio:>23s} " if compare else "")
              + f"{row['selection_imbalance']:15.2f} {100 * row['indexer_share']:13.0f}% "
              f"{row['dispatch_bytes_per_rank']:14.0f} {row['selection_bytes_per_rank']:16.0f}")
    print("\nthe step in CPU seconds (each rank's own work), medians over the steps: the slowest rank's"
          + (f", its gain over {args.modes[0]}'s with the same selector (the ratio of {args.modes[0]}'s to its own)"
             if compare else "")
          + f", and the bound (R + I*m) / (R + m) of a perfect balancer of {args.modes[0]}'s selection")
    print(f"{'mode':{width}s} {'step CPU s':>11s} {'bound':>7s} "
          + (f"{'gain (interval)':>21s} {'':13s} {'gain/bound':>11s}" if compare else "") + "  cost model")
    for mode, row in rows.items():
        calibration = row["calibration"] or "-"
        if row["calibration_seconds"]:
            calibration += f"; calibration {row['calibration_seconds']:.2f} s on rank 0 (first step)"
        gain = row["step_gain_interval"]
        baseline = mode.partition("+")[0] == args.modes[0]
        versus_text = (f"{'-':>21s} {'':13s} {'-':>11s}" if baseline else
                       f"{interval_text(gain).removesuffix(' ~').removesuffix(' ?'):>21s} {gain['verdict']:13s} "
                       f"{row['step_gain_of_bound']:11.3f}")
        print(f"{mode:{width}s} {row['step_cpu_seconds']:11.2f} {row['step_bound']:7.3f} "
              + (versus_text if compare else "") + f"  {calibration}")
    if compare:
        losses = [row["losses"] for row in rows.values()]
        spread = max(abs(a - b) for run in losses for a, b in zip(run, losses[0]))
        print(f"losses per step agree across strategies to {spread:.2e}")
    if result["balance_report"]:
        print("\nsparsecp.models.balance_report(model) per strategy, over the run (the call a training loop makes):")
        for mode, line in result["balance_report"].items():
            print(f"  {mode}: {line}")
    peaks = ", ".join(f"{p * MIB:.0f}" for p in result["peak_growth_per_rank"])
    one = result["peak_growth_one_process"]
    print(f"peak memory growth per rank (MiB, every strategy's copy): {peaks}"
          + (f"; one process, whole batch, one strategy: {one * MIB:.0f} MiB" if one is not None else ""))


def print_state_bytes(records: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Each rank's parameter, gradient and AdamW bytes after the first step."""
    first = sorted((r for r in records if r.get("step") == 0 and r.get("mode") == args.variants[0]),
                   key=lambda r: r["rank"])
    layout = f"FSDP2 over dp {args.dp} x cp {args.ranks}" if args.dp > 1 else f"replicated over cp {args.ranks}"
    for name in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        print(f"{name.removesuffix('_bytes'):9s} MiB per rank ({layout}): "
              + ", ".join(f"{r[name] * MIB:.2f}" for r in first))


# ---------------------------------------------------------------------------------------
# The run

def train(example: Example, args: argparse.Namespace) -> int:
    """Runs the example (flags already through ``check_arguments``) and prints its report."""
    import torch

    import sparsecp

    layout = f"dp {args.dp} x CP {args.ranks}" if args.dp > 1 else f"CP {args.ranks}"
    steps = f"{args.steps} step" + "s" * (args.steps > 1)
    print(f"# {example.title} (transformers) under {layout}: {args.tokens} tokens/step, lognormal documents, "
          f"{example.describe(args)}, selector {args.selector}, modes {','.join(args.modes)}, {steps}; "
          f"{cpu_model()}, {os.cpu_count()} cores, kernel ISA {sparsecp.kernel_isa()}, torch {torch.__version__}",
          flush=True)
    records = spawn(example, args.ranks * args.dp, args, step_printer(max(16, *(len(v) for v in args.variants))))
    single: list[dict[str, Any]] = []
    if not args.no_single:  # one process, the whole batch, the same model and step (CP size 1)
        one = copy.copy(args)
        one.ranks, one.dp, one.modes, one.variants = 1, 1, args.modes[:1], args.variants[:1]
        one.steps = min(args.steps, example.baseline_steps)
        single = spawn(example, 1, one, None)
    result = summary(records, single, args)
    print_summary(result, args)
    print_state_bytes(records, args)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1)
    return 0
