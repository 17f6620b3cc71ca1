"""sparsecp.torch.calibrate: the fit recovers a known cost from the selector's times, a
fit over the residual bound is refused, and a real torch selector calibrates on CPU."""
from __future__ import annotations

import random

import pytest
import torch

import sparsecp
import sparsecp.torch as sct
from sparsecp.torch.calibrate import segment_sums

RATIO, TOPK = 4, 32


class Recording:
    """A selector that records the segments of each call (returns nothing useful)."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[int, int, int, int, int]]] = []

    def __call__(self, qr, weights, rope, segments):  # noqa: ANN001, ANN204
        assert qr.shape[1] == weights.shape[1] == rope[0].shape[1] == max(s[1] for s in segments)
        self.calls.append(list(segments))
        return torch.zeros((1, qr.shape[1], TOPK), dtype=torch.int32)


def model_timer(selector: Recording, k: float, a: float, b: float, c: float, noise: float = 0.0,
                seed: int = 0):  # noqa: ANN201
    rng = random.Random(seed)

    def timer(call):  # noqa: ANN001, ANN202
        call()
        rows, visible, capped, _ = segment_sums(selector.calls[-1], RATIO, TOPK)
        return (k + a * rows + b * visible + c * capped) * (1 + rng.uniform(-noise, noise))
    return timer


def test_recovers_a_known_cost_from_the_selector_times() -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    selector = Recording()
    fit = sct.calibrate(selector, q_rank=8, heads=2, keys=2000, ratio=RATIO, topk=TOPK, rope_dim=4, rows=64,
                        visible=(0, 16, 32, 48, 256, 1024), repeats=3,
                        timer=model_timer(selector, 2e-5, 3e-6, 40e-9, 70e-9, noise=0.005, seed=seed))
    assert fit.model.unit == "ns" and fit.model.topk == TOPK
    assert fit.model.a == pytest.approx(3000, rel=0.05)
    assert fit.model.b == pytest.approx(40, rel=0.05)
    assert fit.model.c == pytest.approx(70, rel=0.1)
    assert fit.rms_relative_residual < 0.02
    # Every point ran at rows and rows / 4, repeats times, plus one warm-up call.
    assert len(fit.points) == 12 and len(selector.calls) == 12 * 3 + 1
    assert sorted({p.target for p in fit.points}) == [0, 16, 32, 48, 256, 1024]
    # predict() is the fitted line on any segments.
    held_out = [(0, 40, 0, 300, 1), (40, 50, 300, 310, 3)]
    rows, visible, capped, _ = segment_sums(held_out, RATIO, TOPK)
    assert fit.predict(held_out, RATIO) == pytest.approx(2e-5 + 3e-6 * rows + 40e-9 * visible + 70e-9 * capped,
                                                         rel=0.05)


def test_points_beyond_the_bank_are_left_out_and_too_few_refused() -> None:
    selector = Recording()
    fit = sct.calibrate(selector, q_rank=8, heads=2, keys=100, ratio=RATIO, topk=TOPK, rope_dim=4, rows=16,
                        visible=(0, 16, 64, 4096), timer=model_timer(selector, 0, 1e-6, 1e-8, 1e-8))
    assert sorted({p.target for p in fit.points}) == [0, 16, 64]
    assert all(max(s[3] for s in call) <= 100 for call in selector.calls)
    with pytest.raises(ValueError, match="at least 3 different visible-key points within the selector's 100 keys"):
        sct.calibrate(selector, q_rank=8, heads=2, keys=100, ratio=RATIO, topk=TOPK, rope_dim=4, rows=16,
                      visible=(0, 4096, 8192))


def test_a_fit_over_the_residual_bound_is_refused() -> None:
    selector = Recording()
    rng = random.Random(3)

    def busy(call):  # noqa: ANN001, ANN202
        call()
        return rng.uniform(1e-4, 1e-2)  # times unrelated to the work: a machine busy with other programs
    refused = r"cost model fit refused: its rms relative residual .* exceeds the bound of 20%"
    with pytest.raises(ValueError, match=refused):
        sct.calibrate(selector, q_rank=8, heads=2, keys=2000, ratio=RATIO, topk=TOPK, rope_dim=4,
                      max_residual=0.2, timer=busy)
    with pytest.raises(ValueError, match="max_residual must be finite and non-negative, got -1"):
        sct.calibrate(selector, q_rank=8, heads=2, keys=2000, ratio=RATIO, topk=TOPK, rope_dim=4, max_residual=-1)


def test_a_candidate_layer_calibrates_with_its_cap_and_quantum() -> None:
    """A selector that scores at most 256 candidates per row (widths in steps of 64): the
    fit recovers its cost with the cap and quantum given, and the model carries them."""
    selector = Recording()
    cap, quantum = 256, 64

    def timer(call):  # noqa: ANN001, ANN202
        call()
        rows, widths, capped, _ = segment_sums(selector.calls[-1], RATIO, TOPK, cap, quantum)
        return 1e-5 + 2e-6 * rows + 50e-9 * widths + 30e-9 * capped
    fit = sct.calibrate(selector, q_rank=8, heads=2, keys=4000, ratio=RATIO, topk=TOPK, rope_dim=4, rows=64,
                        visible=(0, 16, 64, 200, 512, 2048), candidates=cap, quantum=quantum, timer=timer)
    assert (fit.model.candidates, fit.model.quantum) == (cap, quantum)
    assert fit.model.b == pytest.approx(50, rel=1e-6) and fit.model.c == pytest.approx(30, rel=1e-6)
    long_rows = [(0, 64, 0, 2000, 0)]  # every row sees far more than 256 keys
    assert segment_sums(long_rows, RATIO, TOPK, cap, quantum)[1] == 64 * cap
    assert fit.predict(long_rows, RATIO) == pytest.approx(1e-5 + 64 * (2e-6 + 50e-9 * cap + 30e-9 * TOPK))
    with pytest.raises(ValueError, match="quantum"):
        sct.calibrate(selector, q_rank=8, heads=2, keys=4000, ratio=RATIO, topk=TOPK, rope_dim=4, quantum=0,
                      timer=timer)


def test_the_refit_estimator_refuses_a_fit_over_its_bound() -> None:
    start = sparsecp.CostModel.linear(7, 2, 1, TOPK)
    refit = sparsecp.CostModelRefit(start, 3, 0.1)
    refit.add_step([(100, 1000, 500, 0.1), (100, 1000, 500, 0.3), (200, 2000, 1000, 0.2), (200, 2000, 1000, 0.6)])
    assert refit.kept_previous and refit.refused and refit.refused_residual > 0.1
    assert refit.model.a == 7
    refit.add_step([(100, 1000, 500, 0.1), (200, 1000, 900, 0.2), (300, 5000, 1000, 0.5)])
    assert refit.steps == 2 and refit.samples == 7  # the window keeps both steps' samples


def test_the_core_procedure_passes_each_point_s_segments() -> None:
    """sparsecp.calibrate_cost_model (the procedure under calibrate): measure gets each
    point's rows and segments, whose rows centre on the point's target."""
    calls: list[tuple[int, int, tuple[tuple[int, int, int, int, int], ...]]] = []

    def measure(target: int, rows: int, segments: tuple[tuple[int, int, int, int, int], ...]) -> float:
        calls.append((target, rows, segments))
        widths, capped = segment_sums(segments, RATIO, TOPK)[1:3]
        return 1e-4 + 1e-6 * rows + 1e-8 * widths + 2e-8 * capped

    model, per_call, rms, points = sparsecp.calibrate_cost_model(measure, RATIO, 64, [0, 100, 300], TOPK, repeats=2)
    assert len(calls) == 1 + 2 * 6 and rms < 1e-6 and per_call == pytest.approx(1e-4)
    assert (model.a, model.b, model.c) == pytest.approx((1000, 10, 20))
    assert [(p[0], p[1]) for p in points] == [(0, 64), (0, 16), (100, 64), (100, 16), (300, 64), (300, 16)]
    for target, rows, segments in calls:
        rows_seen, widths, _, _ = segment_sums(segments, RATIO, TOPK)
        assert rows_seen == rows and max(s[1] for s in segments) == rows
        if target == 0:
            assert widths == 0
        elif rows == 64:
            assert widths / rows == pytest.approx(target, abs=1)

    def fails(target: int, rows: int, segments: tuple[tuple[int, int, int, int, int], ...]) -> float:
        raise KeyError("the selector's own error")
    with pytest.raises(KeyError, match="the selector's own error"):
        sparsecp.calibrate_cost_model(fails, RATIO)


def test_a_torch_selector_calibrates_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARSECP_TORCH_PATH", "1")  # the device fallback path, forced on CPU
    generator = torch.Generator().manual_seed(1)
    heads, head_dim, q_rank, keys = 2, 16, 12, 600
    selector = sct.IndexerSelector(torch.randn((heads * head_dim, q_rank), generator=generator),
                                   torch.randn((keys, head_dim), generator=generator), RATIO, TOPK, rope_dim=8)
    fit = sct.calibrate(selector, q_rank=q_rank, heads=heads, keys=keys, ratio=RATIO, topk=TOPK, rope_dim=8,
                        rows=32, visible=(0, 16, 64, 256), dtype=torch.float32, max_residual=0)
    assert isinstance(fit.model, sparsecp.CostModel) and fit.model.unit == "ns"
    assert min(fit.model.a, fit.model.b, fit.model.c) >= 0 and fit.model.a + fit.model.b + fit.model.c > 0
    assert "IndexerSelector" in fit.model.note and fit.device == "cpu"
    assert all(p.seconds > 0 for p in fit.points)


def test_the_heap_term_is_fitted_and_predicted() -> None:
    """A selector whose times carry a top-k admission term (d per expected admission, rows up
    to 16x topk keys): calibrate recovers d beside a, b, c, and predict() prices it."""
    selector = Recording()

    def timer(call):  # noqa: ANN001, ANN202
        call()
        rows, widths, capped, heap = segment_sums(selector.calls[-1], RATIO, TOPK)
        return 1e-5 + 2e-6 * rows + 10e-9 * widths + 30e-9 * capped + 50e-9 * heap
    fit = sct.calibrate(selector, q_rank=8, heads=2, keys=4000, ratio=RATIO, topk=TOPK, rope_dim=4, rows=64,
                        visible=(0, 16, 32, 64, 128, 256, 512), timer=timer, heap_term=True)
    assert (fit.model.a, fit.model.b, fit.model.c, fit.model.d) == pytest.approx((2000, 10, 30, 50), rel=1e-6)
    # Without heap_term (the default: torch.topk and GPU selects keep no running top-k) d stays 0.
    plain = sct.calibrate(selector, q_rank=8, heads=2, keys=4000, ratio=RATIO, topk=TOPK, rope_dim=4, rows=64,
                          visible=(0, 16, 32, 64, 128, 256, 512), timer=timer)
    assert plain.model.d == 0 and plain.rms_relative_residual > 10 * fit.rms_relative_residual
    assert all(p.heap >= 0 for p in fit.points) and max(p.heap for p in fit.points) > 0
    long_rows = [(0, 64, 0, 2000, 0)]
    rows, widths, capped, heap = segment_sums(long_rows, RATIO, TOPK)
    assert heap == pytest.approx(sum(fit.model.heap((4 * 2000 - 64 + p + 1) // RATIO) for p in range(64)))
    assert fit.predict(long_rows, RATIO) == pytest.approx(1e-5 + 1e-9 * (2000 * rows + 10 * widths + 30 * capped
                                                                         + 50 * heap))
    # The same through fit_cost_model's optional heap column, and nothing fitted without it.
    sums = [segment_sums(call, RATIO, TOPK) for call in selector.calls[1:13]]
    seconds = [2e-6 * r + 10e-9 * w + 30e-9 * c + 50e-9 * h for r, w, c, h in sums]
    columns = list(zip(*sums))
    model = sparsecp.fit_cost_model(columns[0], columns[1], columns[2], seconds, topk=TOPK, heap=list(columns[3]))[0]
    assert model.d == pytest.approx(50, rel=1e-6)
    assert sparsecp.fit_cost_model(columns[0], columns[1], columns[2], seconds, topk=TOPK)[0].d == 0
    with pytest.raises(ValueError, match="one heap value per sample, got 1 for 12 samples"):
        sparsecp.fit_cost_model(columns[0], columns[1], columns[2], seconds, topk=TOPK, heap=[1.0])


def test_the_refit_takes_samples_with_or_without_the_heap_sum() -> None:
    refit = sparsecp.CostModelRefit(sparsecp.CostModel.linear(1, 1, 1, TOPK), 2, heap_term=True)
    refit.add_step([(100, 1000, 500, 0.1, 20.0), (100, 2000, 500, 0.2)])
    assert refit.samples == 2
    with pytest.raises(ValueError, match=r"sample 1 must be \(rows, widths, capped, seconds\[, heap\]\), got 3"):
        refit.add_step([(100, 1000, 500, 0.1), (1, 2, 3)])
    with pytest.raises(ValueError, match="heap -1"):
        refit.add_step([(100, 1000, 500, 0.1, -1.0)])
    assert refit.samples == 2  # a refused step leaves the window as it was


def test_a_refitted_model_reaches_the_plan_cache() -> None:
    """Issue 30 item 1: CostModel compared and hashed by identity and CostModelRefit.model was
    the same object updated in place, so the torch plan/route cache kept the plan made with
    the first step's coefficients (945 / 1103 rows per rank below where the refitted model
    gives 1024 / 1024). The README's refit loop, its planning part: the second step plans with
    the refitted model."""
    lengths, cp = (1200, 300, 44, 504), 2
    refit = sparsecp.CostModelRefit(sparsecp.CostModel.linear(0, 1, 0, TOPK), window=1)  # start: causal pairs
    first = refit.model
    tasks = sct.indexer_task_plan(lengths, cp, RATIO, "spill", cost_model=first)
    rows_before = [sum(task.length for task in rank) for rank in tasks]
    # This job's selector costs the same per row whatever it sees: 2 us a row.
    samples = []
    for rows, document in ((64, 0), (128, 0), (300, 3), (500, 1), (44, 2)):
        task = [(document, max(0, lengths[document] - rows), lengths[document])]
        rows_, widths, capped, heap = sparsecp.cost_sample(task, RATIO, TOPK)
        samples.append((rows_, widths, capped, 2e-6 * rows_, heap))
    refit.add_step(samples)
    assert not refit.kept_previous
    model = refit.model
    assert model is not first and model != first and first == sparsecp.CostModel.linear(0, 1, 0, TOPK)
    assert model.a == pytest.approx(2000, rel=1e-6) and model.b == pytest.approx(0, abs=1e-6)
    tasks = sct.indexer_task_plan(lengths, cp, RATIO, "spill", cost_model=model)
    rows_after = [sum(task.length for task in rank) for rank in tasks]
    expected = sparsecp.plan(lengths, cp, RATIO, "spill", cost_model=model).rows.tolist()  # no cache
    assert rows_after == expected == [1024, 1024] and rows_before != rows_after
    route = sct.indexer_route(lengths, cp, 0, RATIO, "spill", cost_model=model)
    assert route.query_count == 1024


def test_cost_models_are_values() -> None:
    """Equal models compare and hash equal (a cache finds an equal fresh model), fields are
    read-only (replace() makes a changed copy), and they pickle."""
    import pickle

    model = sparsecp.CostModel.linear(1.5, 2, 0.25, TOPK).replace(d=3, candidates=64, quantum=8, unit="ns",
                                                                   note="a note")
    same = sparsecp.CostModel(a=1.5, b=2, c=0.25, d=3, topk=TOPK, candidates=64, quantum=8, unit="ns",
                              note="a note")
    assert model == same and hash(model) == hash(same) and model.id == same.id and len({model, same}) == 1
    assert model != same.replace(note="another") and model != same.replace(a=1.25) and model != "a model"
    assert pickle.loads(pickle.dumps(model)) == model
    with pytest.raises(AttributeError):
        model.a = 2  # type: ignore[misc]
    assert sparsecp.CostModel() == sparsecp.CostModel.linear(0, 1, 0, 512)


def test_prebuilt_routes_with_a_cost_model_pickle_and_match_an_equal_model() -> None:
    """prebuild(..., cost_model=CostModel) was unpicklable (the README says prebuilt routes
    pickle for data-loader workers), and an equal but distinct model failed the prebuilt
    check ("differ in params")."""
    import pickle

    from sparsecp.torch._prebuilt import prebuilt_layer

    lengths = (1200, 300, 44, 504)
    routes = sct.prebuild(lengths, 2, 1, [RATIO], "spill", cost_model=sparsecp.CostModel.linear(3, 1, 0, TOPK))
    copy = pickle.loads(pickle.dumps(routes))
    assert copy.route(RATIO) == routes.route(RATIO)
    equal = sparsecp.CostModel.linear(3, 1, 0, TOPK)
    layer = prebuilt_layer(copy, lengths, 2, 1, RATIO, "spill", None, None, {"cost_model": equal})
    assert layer.route == routes.route(RATIO)
    with pytest.raises(ValueError, match="differ in params"):
        prebuilt_layer(copy, lengths, 2, 1, RATIO, "spill", None, None, {"cost_model": equal.replace(a=4)})


@pytest.mark.parametrize("returns, text", [
    (lambda rows: None, r"returned NoneType, not ids \[1, 16, 32\] \(int32 or int64\)"),
    (lambda rows: torch.zeros((rows, TOPK), dtype=torch.int32),
     r"returned torch.int32 \(16, 32\) on cpu; ids must be \[1, 16, 32\]"),
    (lambda rows: torch.zeros((1, rows, TOPK // 2), dtype=torch.int32),
     r"returned torch.int32 \(1, 16, 16\) on cpu; ids must be \[1, 16, 32\]"),
    (lambda rows: torch.zeros((1, rows, TOPK)),
     r"returned torch.float32 \(1, 16, 32\) on cpu; ids must be int32 or int64"),
])
def test_a_selector_that_does_not_return_ids_is_refused_naming_what_it_returned(returns, text) -> None:
    """Issue 35 item 8: calibrate fitted a selector that returns None or a wrong shape."""
    calls = []

    def selector(qr, weights, rope, segments):  # noqa: ANN001, ANN202
        calls.append(qr.shape[1])
        return returns(qr.shape[1])

    with pytest.raises(ValueError, match=r"^calibrate: the selector test_a_selector_that_does_not_return_ids_is_"
                                         r"refused_naming_what_it_returned.<locals>.selector " + text):
        sct.calibrate(selector, q_rank=8, heads=2, keys=2000, ratio=RATIO, topk=TOPK, rope_dim=4, rows=16,
                      visible=(0, 16, 32, 48), repeats=1, timer=lambda call: (call(), 1e-3)[1])
    assert calls == [16]  # refused at the first call, before any fit
