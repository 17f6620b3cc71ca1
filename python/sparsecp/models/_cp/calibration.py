"""spill's cost model for a context-parallel model's own selector, fitted without being asked.

``spill`` (and ``auto``) balance a per-row cost model, ``a + b * vis + c * min(topk, vis)`` ns a
row (SYSTEM.md, "Cost models"); its default (causal pairs: ``b`` alone) ignores the fixed
per-row work of a real selector (the query projection and rotary, ~11 us a row for the
example's 32-head DeepSeek-V4 indexer against ~80 ns a visible key), so it sheds too many rows
from long documents. A model's integration attaches a ``SelectionCalibration`` that gives spill
the layer's own selector's model:

1. **Calibrated** on the first forward, before its routes are planned: rank 0 of the CP group
   times the layer's own selector (``make_selector(bank)`` over a random Index K bank, on the
   model's device and dtype) with ``sparsecp.torch.calibrate`` (interleaved repeats, medians,
   non-negative fit) and broadcasts the fit, so every rank plans with the same model. The fit is
   cached in the process, keyed by the selector and everything its time depends on (selector
   kind, heads, head widths, ratio, top-k, dtype, device, torch threads): a second model with the
   same indexer shape (another strategy's copy, a restarted run in the same process) reuses it.
   It is also cached on disk for later processes, in the folder ``sparsecp run`` caches its
   calibrations in (``$SPARSECP_CACHE_DIR``, else ``$XDG_CACHE_HOME/sparsecp``, else
   ``~/.cache/sparsecp``; ``SPARSECP_CACHE_DIR=off``: no disk cache), a small JSON file keyed, as
   the CLI's are, by that key, the timed points, the CPU model, the kernel ISA and the versions of
   torch and sparsecp: a restarted job on the same machine skips the 1-2 s stall of rank 0's first
   step. ``clear_cache()`` forgets both.
   The synthetic points leave out rows that see no key (the selectors skip them, so a point of
   them alone would price a row's projection at nothing; in a packed batch they are only each
   document's first ``ratio - 1`` rows).
2. **Refitted** from the job's own times (``calibrate=True``, the default, where the selector
   runs on the CPU): each forward's agreement (the integration's one all-gather) carries every
   rank's selector CPU seconds of the previous forward, paired here with the sums of the routes
   that forward ran, known on every rank (every rank plans every rank's route): no collective
   or host read of its own. ``sparsecp.CostModelRefit`` fits
   the window, identically on every rank. spill plans with the refit once the window holds
   ``_REFIT_MIN_STEPS`` forwards (a fit of three coefficients on one step's few ranks follows
   their noise) and its fit is not refused (rms relative residual over 0.25 keeps the previous model).
3. **Given or off:** ``cost_model=`` (the user's own) skips both; ``calibrate=False`` plans with
   the strategy's default model; ``calibrate="once"`` calibrates without the refit.

What it cost, and what it fitted, is in ``report`` (``context_parallel_state(model).calibration``).
Model-agnostic: an integration supplies the selector factory and the indexer's dimensions.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["COST_MODEL_MODES", "CalibrationReport", "SelectionCalibration", "cache_folder", "calibrate_option",
           "clear_cache"]

COST_MODEL_MODES = ("spill", "auto")  # the strategies that plan on a cost model
_REFIT_WINDOW = 8  # forwards whose per-rank times the refit fits
_REFIT_MIN_STEPS = 3
_PREDICTIONS_KEPT = 64  # forwards whose predicted and measured times the report keeps (a long run's last)
_HISTORY_KEPT = 64  # model changes the report's history keeps: the first (the calibration) and the last 63
_CACHE: dict[tuple[Any, ...], tuple[Any, float, float]] = {}  # key -> (CostModel, residual, cpu seconds)


_DISK_PREFIX = "model-cost-"
_DISK_PROCEDURE = "sparsecp.models calibration 1"  # changed when the procedure changes: old files are not reused


def cache_folder() -> str | None:
    """Where calibrations are cached on disk, as ``sparsecp run`` caches them:
    ``$SPARSECP_CACHE_DIR``, else ``$XDG_CACHE_HOME/sparsecp``, else ``~/.cache/sparsecp``; None
    when ``SPARSECP_CACHE_DIR=off`` or no home is known."""
    folder = os.environ.get("SPARSECP_CACHE_DIR")
    if folder:
        return None if folder == "off" else folder
    if os.environ.get("XDG_CACHE_HOME"):
        return os.path.join(os.environ["XDG_CACHE_HOME"], "sparsecp")
    home = os.environ.get("HOME")
    return os.path.join(home, ".cache", "sparsecp") if home else None


def clear_cache() -> None:
    """Forget every cached calibration: this process's and the files in ``cache_folder()``."""
    _CACHE.clear()
    folder = cache_folder()
    if folder is not None and os.path.isdir(folder):
        for name in os.listdir(folder):
            if name.startswith(_DISK_PREFIX) and name.endswith(".json"):
                try:
                    os.remove(os.path.join(folder, name))
                except OSError:
                    pass


def _machine_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def _disk_key(key: tuple[Any, ...], targets: list[int], device: torch.device) -> str:
    """The text a file's fit is valid for: the process cache's key, the timed points, and the
    machine and software the times depend on."""
    import sparsecp

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else _machine_name()
    return repr((_DISK_PROCEDURE, key, tuple(targets), where, sparsecp.kernel_isa(), torch.__version__,
                 sparsecp.__version__))


def _disk_path(text: str) -> str | None:
    folder = cache_folder()
    if folder is None:
        return None
    return os.path.join(folder, f"{_DISK_PREFIX}{hashlib.sha256(text.encode()).hexdigest()[:16]}.json")


def _read_disk(text: str) -> tuple[Any, float, float] | None:
    """The fit a file holds for ``text`` (None: none, another key's, or unreadable: calibrate)."""
    path = _disk_path(text)
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            saved = json.load(file)
        if not isinstance(saved, dict) or saved.get("key") != text:
            return None
        import sparsecp

        return sparsecp.CostModel(**saved["model"]), float(saved["residual"]), float(saved["cpu_seconds"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_disk(text: str, model: Any, residual: float, cpu: float) -> str:
    """Saves a fit (written to a temporary file, then renamed: readers never see half a file);
    returns why it was not saved ('' when it was)."""
    path = _disk_path(text)
    if path is None:
        return "no cache folder"
    fields = {name: getattr(model, name) for name in ("a", "b", "c", "d", "topk", "candidates", "quantum", "unit",
                                                      "note")}
    temporary = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # A unique name in the folder (processes of several nodes may share it), then renamed.
        handle, temporary = tempfile.mkstemp(prefix=".model-cost-", suffix=".tmp", dir=os.path.dirname(path))
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump({"key": text, "model": fields, "residual": residual, "cpu_seconds": cpu}, file, indent=1)
        os.replace(temporary, path)
    except OSError as error:
        if temporary is not None and os.path.exists(temporary):
            os.remove(temporary)
        return f"{type(error).__name__}: {error}"
    return ""


def calibrate_option(value: Any) -> bool | str:
    """``calibrate=``'s value, checked: True, False or "once"."""
    if value is True or value is False or value == "once":
        return value
    raise ValueError(f"calibrate must be True (calibrate spill's cost model on the layer's selector, then refit it "
                     f"from measured times), 'once' (no refit) or False, got {value!r}")


@dataclass
class CalibrationReport:
    """What the calibration did (the same on every rank)."""

    source: str = "off"  # "off", "given", "calibrated", "cached" (this process), "cached on disk"
    seconds: float = 0.0  # rank 0's wall seconds in the calibration (0 when cached)
    cpu_seconds: float = 0.0  # the timed selector calls' CPU seconds (those of the original fit when cached)
    rms_relative_residual: float = 0.0  # of the calibration's fit
    model: Any = None  # the CostModel spill plans the next forward with
    refits: int = 0  # forwards whose refit replaced the model
    refit_residual: float = 0.0  # rms relative residual of the last accepted refit
    # One line per model change, bounded (``note``): the first (the calibration) and the last 63
    # refits; ``history_dropped`` counts the refits left out between them.
    history: list[str] = field(default_factory=list)
    history_dropped: int = 0
    # Held out: per forward measured (with the refit on; the last 64), each rank's selector seconds as
    # the model that planned the forward predicted them, and as measured: (predicted, measured) per
    # rank; and whether that model was a refit (else the first fit, timed outside any training step).
    predictions: list[list[tuple[float, float]]] = field(default_factory=list)
    predicted_by_refit: list[bool] = field(default_factory=list)

    def note(self, line: str) -> None:
        """Adds a model change to ``history``: a run that refits every forward keeps its first line
        and its last ``_HISTORY_KEPT - 1``, not one line per forward for the whole run."""
        self.history.append(line)
        extra = len(self.history) - _HISTORY_KEPT
        if extra > 0:
            del self.history[1:1 + extra]
            self.history_dropped += extra

    def prediction_residual(self, shares: bool = False, refit_only: bool = False) -> float:
        """rms relative error of the planning model's predicted per-rank selector seconds over the
        forwards in ``predictions`` (nan when none), on times no fit had seen. ``shares``: of each
        rank's share of its forward (seconds over the ranks' mean), what balancing needs: a model off
        by one factor on every rank (the first fit's synthetic rows, timed outside the step's cache
        traffic) balances as well. ``refit_only``: the forwards a refit planned."""
        errors = []
        for forward, refit in zip(self.predictions, self.predicted_by_refit):
            if refit_only and not refit:
                continue
            predicted = sum(p for p, _ in forward) / len(forward) if shares else 1.0
            measured = sum(m for _, m in forward) / len(forward) if shares else 1.0
            if predicted > 0:  # a model of zeros predicts no share
                errors += [(p / predicted) / (m / measured) - 1 for p, m in forward]
        return (sum(e * e for e in errors) / len(errors)) ** 0.5 if errors else float("nan")

    def __str__(self) -> str:
        if self.model is None:
            return f"cost model: {self.source}"
        m = self.model
        refits = f"{self.refits} refits" + (f", the last's residual {self.refit_residual:.3f}" if self.refits else "")
        held = ""
        if self.predictions:
            refitted = sum(self.predicted_by_refit)
            held = (f"; predicted each rank's next selector seconds to {self.prediction_residual():.3f} rms, its "
                    f"share to {self.prediction_residual(shares=True):.3f}, over {len(self.predictions)} forwards"
                    + (f" ({self.prediction_residual(refit_only=True):.3f} and "
                       f"{self.prediction_residual(shares=True, refit_only=True):.3f} over the {refitted} a refit "
                       "planned)" if refitted else ""))
        heap = f" + d {m.d:.4g} * heap(vis)" if m.d else ""
        return (f"cost model ({self.source}, {self.seconds:.2f} s, residual {self.rms_relative_residual:.3f}; "
                f"{refits}{held}): a {m.a:.4g} + b {m.b:.4g} * vis + c {m.c:.4g} * min(topk, vis){heap} {m.unit}")


class SelectionCalibration:
    """Gives spill the layer's own selector's cost model (see the module docstring).

    Args:
        mode, strategy_params: the integration's strategy and its parameters (``cost_model``
            given there turns calibration off).
        option: ``calibrate=``: True, "once" or False.
        make_selector: ``make_selector(bank)`` -> the worker selector over an Index K bank
            ``[keys, head_dim]`` (the callable ``balanced_indexer_select`` calls).
        selector_name: what the cache tells selectors apart by ("model", "fused", ...).
        dims: the selector's shapes, as ``sparsecp.torch.calibrate`` takes them and the cache
            keys them: ``q_rank``, ``heads``, ``head_dim``, ``rope_dim``, ``ratio``, ``topk``.
        parameter: a parameter of the indexer (its device and dtype are the selector's).
        layer_ratios: the compression ratio of each layer that selects (its routes' sums add up
            to a forward's refit sample).
        rows: rows of each calibration point (a few of the selector's row chunks).
        heap_term: fit the top-k admission term ``d`` too: for a selector that keeps a running
            top-k per row with a heap (sparsecp's fused CPU kernel), not for one that selects
            with a scan or a sort of every score (``torch.topk``; see ``calibrate``).
    """

    def __init__(self, mode: str, strategy_params: dict[str, Any], option: bool | str,
                 make_selector: Callable[[torch.Tensor], Any], selector_name: str, dims: dict[str, int],
                 parameter: torch.Tensor, layer_ratios: list[int], rows: int = 512, heap_term: bool = False) -> None:
        self.option = calibrate_option(option)
        self.heap_term = heap_term
        self.make_selector, self.selector_name, self.dims = make_selector, selector_name, dict(dims)
        self.parameter, self.layer_ratios, self.rows = parameter, list(layer_ratios), rows
        self.report = CalibrationReport()
        self.active = mode in COST_MODEL_MODES and bool(layer_ratios) and self.option is not False
        if strategy_params.get("cost_model") is not None:
            self.active = False
            self.report.source = "given"
        self.refit: Any = None
        self._pending: list[tuple[float, ...]] | None = None  # last forward's per-rank sums
        self._clock_mark: tuple[int, float] = (0, 0.0)
        self._times: list[tuple[float, int] | None] | None = None

    def strategy_params(self, state: Any, lengths: tuple[int, ...], device: torch.device) -> dict[str, Any]:
        """The strategy parameters to plan this forward with: the first call calibrates, later
        ones refit from the previous forward's times. Collective over ``state.group`` when
        active (every rank calls it once per forward, in the model's forward hook)."""
        params = state.strategy_params
        if not self.active:
            return params
        if self.report.model is None:
            self._calibrate(state, lengths, device)
        elif self.refit is not None:
            self._refit(state)
        params = {**params, "cost_model": self.report.model}
        self._pending = self._sums(state, lengths, params) if self.refit is not None else None
        self._clock_mark = (state.clock.lifetime_calls, state.clock.lifetime_seconds)
        return params

    # -- the first forward: rank 0 calibrates, every rank gets its fit ----------------------

    def _key(self, device: torch.device) -> tuple[Any, ...]:
        return (self.selector_name, tuple(sorted(self.dims.items())), str(self.parameter.dtype), str(device),
                torch.get_num_threads(), self.rows, self.heap_term)

    def _calibrate(self, state: Any, lengths: tuple[int, ...], device: torch.device) -> None:
        found: list[Any] = [None]
        if state.rank == 0:
            try:
                found[0] = self._fit(lengths, device)
            except Exception as error:  # every rank must leave the broadcast: send the failure
                found[0] = f"{type(error).__name__}: {error}"
        if state.size > 1:
            source = 0 if state.group is None else dist.get_global_rank(state.group, 0)
            dist.broadcast_object_list(found, src=source, group=state.group)
        if isinstance(found[0], str):
            raise RuntimeError(f"sparsecp: calibrating spill's cost model on rank 0's selector failed ({found[0]}); "
                               "pass cost_model= or calibrate=False to context_parallel")
        model, residual, cpu, wall, source, unsaved = found[0]
        self.report.source, self.report.seconds, self.report.cpu_seconds = source, wall, cpu
        self.report.rms_relative_residual, self.report.model = residual, model
        unsaved = f" (not cached on disk: {unsaved})" if unsaved and unsaved != "no cache folder" else ""
        self.report.note(f"forward {state.forwards + 1}: {source}{unsaved} {self.report}")
        if self.option is True and device.type == "cpu":
            import sparsecp
            self.refit = sparsecp.CostModelRefit(model, window=_REFIT_WINDOW)
        state.layouts.clear()  # a batch planned before (no forward has run yet) replans with the model

    def _fit(self, lengths: tuple[int, ...], device: torch.device) -> tuple[Any, float, float, float, str, str]:
        """(model, residual, CPU seconds, wall seconds, source, why the fit was not saved on disk)."""
        key = self._key(device)
        if key in _CACHE:
            model, residual, cpu = _CACHE[key]
            return model, residual, cpu, 0.0, "cached", ""
        from ...torch.calibrate import calibrate

        d = self.dims
        ratio, topk = d["ratio"], d["topk"]
        longest = max(1, max(lengths) // ratio)  # the batch's deepest visible-key count
        targets = [t for t in (topk // 2, topk, 2 * topk, 4 * topk, 8 * topk, 16 * topk, 32 * topk) if t >= 1]
        targets = sorted({t for t in targets if t <= max(longest, 16 * topk)})  # later batches run longer
        while len(targets) < 3:  # calibrate needs three targets
            targets.append(targets[-1] * 2 if targets else 1)
        text = _disk_key(key, targets, device)
        saved = _read_disk(text)
        if saved is not None:
            _CACHE[key] = saved
            return *saved, 0.0, "cached on disk", ""
        keys = targets[-1] + self.rows  # every point's segment fits
        generator = torch.Generator().manual_seed(0)
        bank = torch.randn(keys, d["head_dim"], generator=generator).to(device=device, dtype=self.parameter.dtype)
        selector = self.make_selector(bank)
        start, cpu_start = time.perf_counter(), time.process_time()
        fit = calibrate(selector, q_rank=d["q_rank"], heads=d["heads"], keys=keys, ratio=ratio, topk=topk,
                        rope_dim=d["rope_dim"], rows=self.rows, visible=targets, device=device,
                        dtype=self.parameter.dtype, max_residual=0, heap_term=self.heap_term)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        model = fit.model.replace(note=f"{fit.model.note}; calibrated by sparsecp.models for spill")
        _CACHE[key] = (model, fit.rms_relative_residual, cpu)
        unsaved = _write_disk(text, model, fit.rms_relative_residual, cpu)
        return model, fit.rms_relative_residual, cpu, wall, "calibrated", unsaved

    # -- later forwards: the refit from every rank's measured times --------------------------

    def _sums(self, state: Any, lengths: tuple[int, ...], params: dict[str, Any]) -> list[tuple[float, ...]]:
        """Every rank's (rows, widths, capped, heap) summed over the selecting layers' routes."""
        from ...torch import indexer_route
        from ...torch.calibrate import segment_sums

        model = params["cost_model"]
        totals = [[0.0, 0.0, 0.0, 0.0] for _ in range(state.size)]
        for ratio in self.layer_ratios:
            for q in range(state.size):
                route = indexer_route(lengths, state.size, q, ratio, state.mode, state.block_size,
                                      state.zigzag_min_length, **params)
                sums = segment_sums(route.segments, ratio, model.topk, model.candidates, model.quantum)
                totals[q] = [t + s for t, s in zip(totals[q], sums)]
        return [tuple(t) for t in totals]

    def local_times(self, state: Any) -> tuple[float, int] | None:
        """This rank's selector CPU seconds and calls since the last forward started (None when
        no refit runs): the integration all-gathers them in its forward's agreement."""
        if self.refit is None:
            return None
        return (state.clock.lifetime_seconds - self._clock_mark[1], state.clock.lifetime_calls - self._clock_mark[0])

    def received_times(self, times: list[tuple[float, int] | None]) -> None:
        """Every rank's ``local_times``, in rank order (before this forward's ``strategy_params``)."""
        self._times = times

    def _refit(self, state: Any) -> None:
        times, self._times = self._times, None
        if state.size == 1:
            times = [self.local_times(state)]
        known = [t for t in times or () if t is not None]
        if len(known) != state.size or self._pending is None or any(int(c) != len(self.layer_ratios)
                                                                    for _, c in known):
            return  # the last forward did not select in every layer on every rank: no sample
        samples = [(rows, widths, capped, s, heap) for (rows, widths, capped, heap), (s, _) in
                   zip(self._pending, known) if rows > 0 and s > 0]
        if not samples:
            return
        m = self.report.model  # the model that planned the forward just measured
        self.report.predictions.append([(1e-9 * (m.a * rows + m.b * widths + m.c * capped + m.d * heap), s)
                                        for rows, widths, capped, s, heap in samples])
        self.report.predicted_by_refit.append(self.report.refits > 0)
        del self.report.predictions[:-_PREDICTIONS_KEPT], self.report.predicted_by_refit[:-_PREDICTIONS_KEPT]
        self.refit.add_step(samples)
        if self.refit.steps < _REFIT_MIN_STEPS or self.refit.kept_previous:
            return
        model = self.refit.model
        if model.id != self.report.model.id:
            self.report.model, self.report.refits = model, self.report.refits + 1
            self.report.refit_residual = self.refit.rms_relative_residual
            self.report.note(f"forward {state.forwards + 1}: refit {self.report}")
            state.layouts.clear()  # replan a batch seen before with the new model


def plain_linear_like(weight: torch.Tensor) -> torch.nn.Linear:
    """A bias-free ``Linear`` of ``weight``'s whole shape (a DTensor's too), dtype and device, with
    plain random values from a generator of its own: the stand-in projection a calibration times.
    The selector's time does not depend on the weights' values; under FSDP2 the real ones are
    shards outside their layer's forward (the calibration runs in the model's forward hook, on
    rank 0 alone, so it may not all-gather them); the ranks' global random states stay equal."""
    local = weight.to_local() if hasattr(weight, "to_local") else weight
    out_features, in_features = (int(n) for n in weight.shape)  # a DTensor's shape is the whole one
    linear = torch.nn.utils.skip_init(torch.nn.Linear, in_features, out_features, bias=False, device=local.device,
                                      dtype=local.dtype)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        linear.weight.copy_(torch.randn((out_features, in_features), generator=generator) * 0.02)
    return linear
