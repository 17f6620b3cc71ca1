"""Rank tasks of test_v4_calibration.py: what ``context_parallel`` does about spill's cost model."""
from __future__ import annotations

from typing import Any

import torch
import v4_tasks

LENGTHS = (300, 40, 9, 163, 100)  # 612 tokens: 306 a rank on 2


def _forward(model: Any, lengths: tuple[int, ...], seed: int = 3) -> None:
    from sparsecp.models import deepseek_v4 as cp_v4

    ids, positions = cp_v4.shard_batch(v4_tasks.packed_ids(lengths, seed), lengths)
    out = model(input_ids=ids, position_ids=positions, document_lengths=lengths)
    out.logits.sum().backward()


def _summary(model: Any) -> dict[str, Any]:
    from sparsecp.models import deepseek_v4 as cp_v4

    state = cp_v4.context_parallel_state(model)
    calibration = state.calibration
    report = calibration.report
    model_id = None if report.model is None else report.model.id
    terms = None if report.model is None else (report.model.a, report.model.b, report.model.c)
    return {"source": report.source, "model": model_id, "terms": terms, "seconds": report.seconds,
            "active": calibration.active, "refit_steps": None if calibration.refit is None else calibration.refit.steps,
            "history": list(report.history), "predictions": [[list(x) for x in f] for f in report.predictions],
            "prediction_residual": report.prediction_residual(),
            "share_residual": report.prediction_residual(shares=True), "heap_term": calibration.heap_term,
            "by_refit": list(report.predicted_by_refit)}


def calibrates_once(rank: int, size: int) -> dict[str, Any]:
    """Two spill models in one process: the first calibrates in its first forward, the second
    reuses the cached fit; three more forwards feed the refit."""
    from sparsecp.models import deepseek_v4 as cp_v4
    from sparsecp.models._cp import calibration as _cp_calibration

    _cp_calibration.clear_cache()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    first = cp_v4.context_parallel(v4_tasks.tiny_model(torch.float32), None, "spill")
    before = _summary(first)
    _forward(first, LENGTHS)
    after_first = _summary(first)
    second = cp_v4.context_parallel(v4_tasks.tiny_model(torch.float32), None, "spill")
    _forward(second, LENGTHS)
    cached = _summary(second)
    for seed in (4, 5, 6):
        _forward(first, (612 - 2 * seed, 2 * seed), seed)
    fused = cp_v4.context_parallel(v4_tasks.tiny_model(torch.float32), None, "spill", selector="fused")
    torch.set_num_threads(threads)  # the pool's next tests run in this process
    return {"before": before, "first": after_first, "cached": cached, "later": _summary(first),
            "cache_size": len(_cp_calibration._CACHE), "fused_heap_term": _summary(fused)["heap_term"]}


def skips(rank: int, size: int, case: str) -> dict[str, Any]:
    """``cost_model=`` given, ``calibrate=False``, or a strategy without a cost model: no calibration."""
    import sparsecp
    from sparsecp.models import deepseek_v4 as cp_v4
    from sparsecp.models._cp import calibration as _cp_calibration

    _cp_calibration.clear_cache()
    options: dict[str, Any] = {"given": {"cost_model": sparsecp.CostModel.linear(1000, 50, 0, 3)},
                               "off": {"calibrate": False}, "zigzag": {}}[case]
    model = cp_v4.context_parallel(v4_tasks.tiny_model(torch.float32), None, "zigzag" if case == "zigzag" else "spill",
                                   **options)
    _forward(model, LENGTHS)
    _forward(model, LENGTHS, 4)
    return {**_summary(model), "cache_size": len(_cp_calibration._CACHE)}


def bad_option(rank: int, size: int) -> str:
    from sparsecp.models import deepseek_v4 as cp_v4

    try:
        cp_v4.context_parallel(v4_tasks.tiny_model(torch.float32), None, "spill", calibrate="yes")
    except ValueError as error:
        return str(error)
    return "no error"


def calibrates_from_disk(rank: int, size: int) -> dict[str, Any]:
    """A later process (this one with its in-process cache forgotten) reads rank 0's fit from the
    disk cache instead of calibrating; a damaged file is calibrated anew and rewritten;
    ``SPARSECP_CACHE_DIR=off`` reads and writes nothing."""
    import glob
    import os

    from sparsecp.models import deepseek_v4 as cp_v4
    from sparsecp.models._cp import calibration as _cp_calibration

    def fresh_model() -> dict[str, Any]:
        _cp_calibration._CACHE.clear()  # what a new process starts with
        model = cp_v4.context_parallel(v4_tasks.tiny_model(torch.float32), None, "spill")
        _forward(model, LENGTHS)
        return _summary(model)

    _cp_calibration.clear_cache()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # restored below: the pool's next tests run in this process
    folder = _cp_calibration.cache_folder()
    files = lambda: sorted(glob.glob(os.path.join(folder, "model-cost-*.json")))  # noqa: E731
    out: dict[str, Any] = {"first": fresh_model(), "files": len(files())}
    out["from_disk"] = fresh_model()
    for damage in ("{not json", "[]"):  # unreadable, and JSON of another shape
        if rank == 0:
            with open(files()[0], "w", encoding="utf-8") as damaged:
                damaged.write(damage)
        out[f"after {damage}"] = fresh_model()
    out["rewritten"] = fresh_model()
    saved = os.environ["SPARSECP_CACHE_DIR"]
    os.environ["SPARSECP_CACHE_DIR"] = "off"
    try:
        out["off"] = fresh_model()
    finally:
        os.environ["SPARSECP_CACHE_DIR"] = saved
    out["files_at_end"] = len(files())
    torch.set_num_threads(threads)
    return out
