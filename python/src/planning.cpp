// sparsecp._core planning: strategies, plans, routes, bounds and the KV dispatch routes.
//
// Routes are returned as bound C++ objects; their fields are numpy views of the route's
// own vectors (no copy, kept alive by the route object), so building every rank's route
// from Python costs the C++ planner plus a constant.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/io/cost_model_file.hpp"
#include "sparsecp/planning/calibration.hpp"
#include "sparsecp/planning/compression_plan.hpp"
#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/cost_model_fit.hpp"
#include "sparsecp/planning/cost_model_refit.hpp"
#include "sparsecp/planning/dispatch.hpp"
#include "sparsecp/planning/lower_bound.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/route.hpp"
#include "sparsecp/planning/row_bytes.hpp"
#include "sparsecp/planning/spill.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "sparsecp/planning/workload.hpp"
#include "sparsecp/transport/agreement.hpp"
#include "sparsecp/transport/exchange.hpp"

namespace sparsecp::python {
namespace {

static_assert(sizeof(Task) == 3 * sizeof(int64_t), "Task must be three packed int64 values");

using Lengths = std::vector<int64_t>;
using Option = std::optional<int64_t>;

PlanOptions seed_options(std::string_view mode, Option block_size, Option zigzag_min_length) {
  return PlanOptions{
      .mode = parse_mode(mode), .block_size = block_size, .zigzag_min_length = zigzag_min_length};
}

bool is_seed_mode(std::string_view name) {
  return name == "none" || name == "zigzag" || name == "greedy" || name == "hybrid";
}

// The seed API given a name that is not one of its modes: the batch is validated first
// (the seed's order), then the name must be a registered strategy. An unknown name gets
// the seed's text followed by the strategies sparsecp also accepts.
const Strategy& seed_api_strategy(std::string_view name, std::span<const int64_t> lengths,
                                  int64_t cp, int64_t ratio) {
  validate_plan_inputs(lengths, cp, ratio, Mode::kNone, std::nullopt);
  for (const Strategy* strategy : all_strategies()) {
    if (strategy->name() == name) return *strategy;
  }
  std::string known;
  for (const Strategy* strategy : all_strategies()) {
    if (is_seed_mode(strategy->name())) continue;
    known += (known.empty() ? "" : ", ") + std::string(strategy->name());
  }
  SPARSECP_FAIL("indexer_load_balance must be 'none', 'zigzag', 'greedy' or 'hybrid'",
                " (sparsecp also accepts its strategies: ", known, "; got '", name, "')");
}

// Strategy parameters for the seed API's two options on top of `extra` (or the defaults).
StrategyParams with_options(std::optional<StrategyParams> extra, Option block_size,
                            Option zigzag_min_length) {
  StrategyParams params = extra.value_or(StrategyParams{});
  if (block_size) params.block_size = block_size;
  if (zigzag_min_length) params.zigzag_min_length = zigzag_min_length;
  return params;
}

// The seed's indexer_task_plan: plan_tasks for its modes (its validation and texts), the
// registered strategy for any other name, with the seed API's two options.
Plan plan_seed(Lengths lengths, int64_t cp, int64_t ratio, std::string_view mode, Option block_size,
               Option zigzag_min_length, std::optional<StrategyParams> extra) {
  if (!is_seed_mode(mode)) {
    const Strategy& strategy = seed_api_strategy(mode, lengths, cp, ratio);
    return strategy.plan(lengths, cp, ratio,
                         with_options(std::move(extra), block_size, zigzag_min_length));
  }
  SPARSECP_CHECK(!extra, "the seed's mode '", mode,
                 "' takes only block_size and zigzag_min_length");
  TaskPlan tasks =
      plan_tasks(lengths, cp, ratio, seed_options(mode, block_size, zigzag_min_length));
  return Plan(std::move(tasks), std::move(lengths), cp, ratio, std::string(mode));
}

// The seed's indexer_route: one rank's route (zigzag's fast path plans only that rank).
IndexerRoute route_seed(const Lengths& lengths, int64_t cp, int64_t rank, int64_t ratio,
                        std::string_view mode, Option block_size, Option zigzag_min_length,
                        std::optional<StrategyParams> extra) {
  if (!is_seed_mode(mode)) {
    SPARSECP_CHECK(rank >= 0 && rank < cp, "Indexer balance rank must be inside its CP group");
    const Strategy& strategy = seed_api_strategy(mode, lengths, cp, ratio);
    return strategy.route(lengths, cp, rank, ratio,
                          with_options(std::move(extra), block_size, zigzag_min_length));
  }
  SPARSECP_CHECK(!extra, "the seed's mode '", mode,
                 "' takes only block_size and zigzag_min_length");
  return indexer_route(lengths, cp, rank, ratio, seed_options(mode, block_size, zigzag_min_length));
}

nb::tuple expected_bytes(const IndexerRoute& route, int64_t input_row_bytes, int64_t topk) {
  const ExchangeBytes bytes = expected_exchange_bytes(route, input_row_bytes, topk);
  return nb::make_tuple(bytes.inputs_sent, bytes.inputs_received, bytes.results_sent,
                        bytes.results_received);
}

template <typename Getter>
auto route_field(Getter getter) {
  return [getter](nb::handle self) {
    const IndexerRoute& route = nb::cast<const IndexerRoute&>(self);
    return view_int64(getter(route), self);
  };
}

// Every field of a cost model, in declaration order: its value (equality, hash, pickle).
nb::tuple cost_model_state(const CostModel& model) {
  return nb::make_tuple(model.a, model.b, model.c, model.d, model.topk, model.candidates,
                        model.quantum, model.unit, model.note);
}

void bind_params(nb::module_& m) {
  // A value: its fields are read-only (``replace`` makes a changed copy), it compares and
  // hashes by every field (the terms, unit and note: what the model's id hashes), and it
  // pickles. Caches key on it (the torch plan and route caches), so a model that changed in
  // place would keep returning plans made with its old terms.
  using Text = std::optional<std::string>;
  using Real = std::optional<double>;
  using Count = std::optional<int64_t>;
  nb::class_<CostModel>(m, "CostModel",
                        "Per-row selection cost a + b * vis + c * min(topk, vis) + d * heap(vis), "
                        "heap(vis) = topk * ln(max(vis, topk) / topk) "
                        "(include/sparsecp/planning/cost_model.hpp). A value: read-only fields "
                        "(replace() gives a changed copy), equal and hashed by every field, "
                        "picklable.")
      .def(
          "__init__",
          [](CostModel* self, double a, double b, double c, double d, int64_t topk,
             int64_t candidates, int64_t quantum, std::string unit, std::string note) {
            new (self) CostModel{.a = a,
                                 .b = b,
                                 .c = c,
                                 .d = d,
                                 .topk = topk,
                                 .candidates = candidates,
                                 .quantum = quantum,
                                 .unit = std::move(unit),
                                 .note = std::move(note)};
          },
          nb::kw_only(), nb::arg("a") = 0.0, nb::arg("b") = 1.0, nb::arg("c") = 0.0,
          nb::arg("d") = 0.0, nb::arg("topk") = 512, nb::arg("candidates") = 0,
          nb::arg("quantum") = 1, nb::arg("unit") = "pairs", nb::arg("note") = "")
      .def_static("linear", &CostModel::linear, nb::arg("a"), nb::arg("b"), nb::arg("c"),
                  nb::arg("topk"))
      .def_ro("a", &CostModel::a)
      .def_ro("b", &CostModel::b)
      .def_ro("c", &CostModel::c)
      .def_ro("d", &CostModel::d)
      .def_ro("topk", &CostModel::topk)
      .def_ro("candidates", &CostModel::candidates)
      .def_ro("quantum", &CostModel::quantum)
      .def_ro("unit", &CostModel::unit)
      .def_ro("note", &CostModel::note)
      .def_prop_ro(
          "id", [](const CostModel& model) { return cost_model_id(model); },
          "16 hex digits: a hash of the terms, unit and note (what reports print)")
      .def(
          "replace",
          [](const CostModel& model, Real a, Real b, Real c, Real d, Count topk, Count candidates,
             Count quantum, Text unit, Text note) {
            CostModel copy = model;
            copy.a = a.value_or(copy.a);
            copy.b = b.value_or(copy.b);
            copy.c = c.value_or(copy.c);
            copy.d = d.value_or(copy.d);
            copy.topk = topk.value_or(copy.topk);
            copy.candidates = candidates.value_or(copy.candidates);
            copy.quantum = quantum.value_or(copy.quantum);
            if (unit) copy.unit = *unit;
            if (note) copy.note = *note;
            return copy;
          },
          nb::kw_only(), nb::arg("a") = nb::none(), nb::arg("b") = nb::none(),
          nb::arg("c") = nb::none(), nb::arg("d") = nb::none(), nb::arg("topk") = nb::none(),
          nb::arg("candidates") = nb::none(), nb::arg("quantum") = nb::none(),
          nb::arg("unit") = nb::none(), nb::arg("note") = nb::none(),
          "A copy with the given fields changed (the model itself never changes).")
      .def("row", &CostModel::row, nb::arg("visible"))
      .def("heap", &CostModel::heap, nb::arg("visible"),
           "Expected admissions into the full running top-k of a row that sees `visible` keys.")
      .def("__eq__",
           [](const CostModel& x, nb::handle other) {
             if (!nb::isinstance<CostModel>(other)) return false;
             const CostModel& y = nb::cast<const CostModel&>(other);
             return cost_model_state(x).equal(cost_model_state(y));
           })
      .def("__hash__", [](const CostModel& model) { return nb::hash(cost_model_state(model)); })
      .def("__getstate__", [](const CostModel& model) { return cost_model_state(model); })
      .def("__setstate__",
           [](CostModel& self, const std::tuple<double, double, double, double, int64_t, int64_t,
                                                int64_t, std::string, std::string>& state) {
             const auto& [a, b, c, d, topk, candidates, quantum, unit, note] = state;
             new (&self) CostModel{.a = a,
                                   .b = b,
                                   .c = c,
                                   .d = d,
                                   .topk = topk,
                                   .candidates = candidates,
                                   .quantum = quantum,
                                   .unit = unit,
                                   .note = note};
           })
      .def("__repr__", [](const CostModel& model) { return format_cost_model(model); });
  m.def("load_cost_model", &load_cost_model, nb::arg("path"),
        "Reads a cost model file (`sparsecp calibrate` writes them).");
  m.def("save_cost_model", &save_cost_model, nb::arg("path"), nb::arg("model"));
  m.def(
      "fit_cost_model",
      [](const std::vector<double>& rows, const std::vector<double>& visible,
         const std::vector<double>& capped, const std::vector<double>& seconds, int64_t topk,
         bool per_call_term, int64_t candidates, int64_t quantum, double max_residual,
         const std::optional<std::vector<double>>& heap) {
        SPARSECP_CHECK(rows.size() == visible.size() && rows.size() == capped.size() &&
                           rows.size() == seconds.size(),
                       "fit_cost_model needs one rows, visible, capped and seconds value per "
                       "sample, got ",
                       rows.size(), ", ", visible.size(), ", ", capped.size(), " and ",
                       seconds.size());
        SPARSECP_CHECK(!heap || heap->size() == rows.size(),
                       "fit_cost_model needs one heap value per sample, got ",
                       heap ? heap->size() : 0, " for ", rows.size(), " samples");
        std::vector<CostSample> samples;
        for (size_t i = 0; i < rows.size(); ++i) {
          samples.push_back({.rows = rows[i],
                             .visible = visible[i],
                             .capped = capped[i],
                             .seconds = seconds[i],
                             .heap = heap ? (*heap)[i] : 0.0});
        }
        const CostFit fit = fit_cost_model(samples, {.per_call_term = per_call_term,
                                                     .topk = topk,
                                                     .candidates = candidates,
                                                     .quantum = quantum,
                                                     .max_rms_relative_residual = max_residual});
        return nb::make_tuple(fit.model, fit.per_call_seconds, fit.rms_relative_residual,
                              fit.predicted);
      },
      nb::arg("rows"), nb::arg("visible"), nb::arg("capped"), nb::arg("seconds"),
      nb::arg("topk") = 512, nb::arg("per_call_term") = false, nb::arg("candidates") = 0,
      nb::arg("quantum") = 1, nb::arg("max_rms_relative_residual") = 0.0,
      nb::arg("heap").none() = nb::none(),
      "Non-negative least-squares fit of seconds = k + a*rows + b*visible + c*capped + "
      "d*heap (planning/cost_model_fit.hpp): (CostModel in ns, k seconds, rms relative "
      "residual, predicted seconds per sample). `visible` sums widths under the model's "
      "candidate cap and quantum and `heap` the expected top-k admissions "
      "(cost_sample's; heap=None fits no d), which the model carries; a fit whose rms "
      "relative residual exceeds max_rms_relative_residual (> 0) raises ValueError.");
  m.def(
      "calibrate_cost_model",
      [](const nb::callable& measure, int64_t ratio, int64_t rows,
         const std::vector<int64_t>& visible, int64_t topk, int64_t candidates, int64_t quantum,
         int64_t keys, int repeats, double max_residual, bool heap_term) {
        const CalibrationGrid grid{.ratio = ratio,
                                   .rows = rows,
                                   .visible = visible,
                                   .topk = topk,
                                   .candidates = candidates,
                                   .quantum = quantum,
                                   .keys = keys,
                                   .heap_term = heap_term,
                                   .repeats = repeats,
                                   .max_residual = max_residual};
        // Each point's segments become a Python tuple once (immutable: a selector cannot
        // change what later calls see), not once per timed call.
        std::map<const CalibrationPoint*, nb::tuple> segments;
        const Calibration fit = calibrate_cost_model(grid, [&](const CalibrationPoint& point) {
          auto [at, fresh] = segments.try_emplace(&point);
          if (fresh) {
            nb::list list;
            for (const Segment& s : point.segments) {
              list.append(nb::make_tuple(s.q_begin, s.q_end, s.key_begin, s.key_end, s.residual));
            }
            at->second = nb::tuple(list);
          }
          const nb::object seconds = measure(point.target, point.rows, at->second);
          double value = 0;
          SPARSECP_CHECK(
              nb::try_cast<double>(seconds, value) && !nb::isinstance<nb::bool_>(seconds),
              "calibrate: the timer must return seconds as a number, got ",
              nb::cast<std::string>(nb::repr(seconds)), " (",
              nb::cast<std::string>(nb::type_name(seconds.type())), ") at the point of ",
              point.target, " visible keys over ", point.rows, " rows");
          return value;
        });
        nb::list points;
        for (const CalibrationPoint& p : fit.points) {
          points.append(nb::make_tuple(p.target, p.rows, p.sums.visible, p.sums.capped,
                                       p.sums.seconds, p.predicted, p.sums.heap));
        }
        return nb::make_tuple(fit.model, fit.per_call_seconds, fit.rms_relative_residual, points);
      },
      nb::arg("measure"), nb::arg("ratio"), nb::arg("rows") = 64,
      nb::arg("visible") = std::vector<int64_t>{0, 64, 256, 448, 512, 640, 1024, 2048, 4096},
      nb::arg("topk") = 512, nb::arg("candidates") = 0, nb::arg("quantum") = 1, nb::arg("keys") = 0,
      nb::arg("repeats") = 3, nb::arg("max_residual") = 0.5, nb::arg("heap_term") = false,
      "The library's calibration procedure (planning/calibration.hpp) on any selector: "
      "measure(target, rows, segments) -> seconds times one call on rows [0, rows) of the "
      "caller's inputs and the given worker segments (5-tuples). One warm-up call, then "
      "`repeats` interleaved rounds over every point (each visible-key target at rows and "
      "rows / 4; targets reaching beyond `keys` > 0 left out), medians, and the non-negative "
      "fit with a per-call term (and the top-k admission term d when heap_term: for selectors "
      "that keep a running top-k, such as sparsecp's CPU kernel). Returns (CostModel in ns, "
      "per-call "
      "seconds, rms relative "
      "residual, [(target, rows, sum of widths, sum min(topk, vis), median seconds, "
      "predicted seconds, sum of top-k admissions)]); a fit over max_residual (> 0) raises "
      "ValueError. Exceptions "
      "from measure pass through unchanged.");
  m.def(
      "cost_sample",
      [](const std::vector<std::tuple<int64_t, int64_t, int64_t>>& tasks, int64_t ratio,
         int64_t topk, int64_t candidates, int64_t quantum) {
        std::vector<Task> list;
        for (const auto& [document, start, end] : tasks) list.push_back({document, start, end});
        const CostSample s = cost_sample(list, ratio, topk, 0, candidates, quantum);
        return nb::make_tuple(s.rows, s.visible, s.capped, s.heap);
      },
      nb::arg("tasks"), nb::arg("ratio"), nb::arg("topk") = 512, nb::arg("candidates") = 0,
      nb::arg("quantum") = 1,
      "(rows, sum of widths, sum min(topk, vis), sum of expected top-k admissions) of "
      "a task list of (document, start, end); widths are the visible-key counts under the "
      "candidate cap (0 = none) and quantum.");

  nb::class_<CostModelRefit>(
      m, "CostModelRefit",
      "Refits a cost model from a job's own per-rank selection times over a sliding window "
      "of steps (planning/cost_model_refit.hpp): add_step each step's samples, plan the next "
      "step with .model.")
      .def(nb::init<CostModel, int64_t, double, std::optional<bool>>(), nb::arg("start"),
           nb::arg("window") = 4, nb::arg("max_rms_relative_residual") = kDefaultRefitResidualBound,
           nb::arg("heap_term").none() = nb::none(),
           "heap_term: fit the top-k admission term d (default: when the start model has one)")
      .def(
          "add_step",
          [](CostModelRefit& refit, const std::vector<std::vector<double>>& samples) {
            std::vector<CostSample> list;
            for (size_t i = 0; i < samples.size(); ++i) {
              const std::vector<double>& s = samples[i];
              SPARSECP_CHECK(s.size() == 4 || s.size() == 5, "add_step: sample ", i,
                             " must be (rows, widths, capped, seconds[, heap]), got ", s.size(),
                             " values");
              list.push_back({.rows = s[0],
                              .visible = s[1],
                              .capped = s[2],
                              .seconds = s[3],
                              .heap = s.size() == 5 ? s[4] : 0.0});
            }
            refit.add_step(list);
          },
          nb::arg("samples"),
          "One step's samples: (rows, sum of widths, sum min(topk, vis), seconds[, sum of heap "
          "admissions]) per rank (cost_sample of its task list, with the model's candidate "
          "cap and quantum; step_cost_samples gathers them).")
      // A copy: the refit's next step makes a new model, never changes one handed out
      // (a cached plan keyed on it would keep the old terms).
      .def_prop_ro(
          "model", [](const CostModelRefit& refit) { return refit.model(); },
          "The model to plan the next step with: a new value after each step that refits")
      .def_prop_ro("kept_previous", &CostModelRefit::kept_previous)
      .def_prop_ro("refused", &CostModelRefit::refused)
      .def_prop_ro("refused_residual", &CostModelRefit::refused_residual)
      .def_prop_ro("rms_relative_residual",
                   [](const CostModelRefit& r) {
                     return r.last_fit() ? r.last_fit()->rms_relative_residual : 0.0;
                   })
      .def_prop_ro("steps", &CostModelRefit::steps)
      .def_prop_ro("samples", &CostModelRefit::samples);

  nb::class_<RowBytes>(m, "RowBytes", "Bytes of one moved row (planning/row_bytes.hpp).")
      .def(nb::init<>())
      .def_rw("qr_rank", &RowBytes::qr_rank)
      .def_rw("qr_bytes", &RowBytes::qr_bytes)
      .def_rw("index_heads", &RowBytes::index_heads)
      .def_rw("weight_bytes", &RowBytes::weight_bytes)
      .def_rw("rope_pairs", &RowBytes::rope_pairs)
      .def_rw("rope_bytes", &RowBytes::rope_bytes)
      .def_rw("topk", &RowBytes::topk)
      .def_rw("index_bytes", &RowBytes::index_bytes)
      .def("input_bytes", &RowBytes::input_bytes)
      .def("result_bytes", &RowBytes::result_bytes);

  nb::class_<StrategyParams>(m, "StrategyParams",
                             "Parameters of every strategy (planning/strategy.hpp); each "
                             "strategy reads only its own.")
      .def(nb::init<>())
      .def_rw("block_size", &StrategyParams::block_size)
      .def_rw("zigzag_min_length", &StrategyParams::zigzag_min_length)
      .def_rw("target_imbalance", &StrategyParams::target_imbalance)
      .def_rw("max_received_fragments", &StrategyParams::max_received_fragments)
      .def_rw("ranks_per_node", &StrategyParams::ranks_per_node)
      .def_rw("cost_model", &StrategyParams::cost_model)
      .def_rw("bandwidth_gbps", &StrategyParams::bandwidth_gbps)
      .def_rw("row_bytes", &StrategyParams::row_bytes)
      .def_rw("wlb_split_length", &StrategyParams::wlb_split_length)
      .def_rw("snake_block", &StrategyParams::snake_block)
      .def_rw("lpt_align", &StrategyParams::lpt_align)
      .def_rw("lpt_row_cap", &StrategyParams::lpt_row_cap)
      .def_rw("lpt_search_steps", &StrategyParams::lpt_search_steps)
      .def_rw("lpt_fragment_cap", &StrategyParams::lpt_fragment_cap)
      .def_prop_rw(
          "lpt_cost",
          [](const StrategyParams& p) { return std::string(row_cost_name(p.lpt_cost)); },
          [](StrategyParams& p, std::string_view name) { p.lpt_cost = parse_row_cost(name); })
      .def_rw("window", &StrategyParams::window)
      .def_rw("topk", &StrategyParams::topk)
      .def_rw("owner_load", &StrategyParams::owner_load)
      .def("validate", &validate_strategy_params);
  m.def(
      "owner_cost",
      [](Lengths lengths, int64_t cp, int64_t ratio, const CostModel& model) {
        return owner_cost(lengths, cp, ratio, model);
      },
      nb::arg("lengths"), nb::arg("cp"), nb::arg("ratio"), nb::arg("model"),
      "Per rank, model.row(visible) summed over its contiguous rows (planning/spill.hpp): "
      "with CostModel.linear(a, 0, c, topk), the owner-side KL cost a + c * min(topk, vis) "
      "per owned row, for StrategyParams.owner_load.");
}

void bind_plans(nb::module_& m) {
  m.def(
      "strategies",
      [] {
        std::vector<std::tuple<std::string, std::string, std::string, std::string, int>> out;
        for (const Strategy* s : all_strategies()) {
          out.emplace_back(s->name(), s->source(), s->summary(), s->unit(), s->listing_order());
        }
        return out;
      },
      "Every registered strategy as (name, source, summary, unit, listing order).");

  nb::class_<Plan>(m, "Plan", "A strategy's plan of one batch (planning/batch_plan.hpp).",
                   nb::dynamic_attr())
      .def_prop_ro("strategy", [](const Plan& plan) { return std::string(plan.strategy()); })
      .def_prop_ro("cp", &Plan::cp)
      .def_prop_ro("ratio", &Plan::ratio)
      .def_prop_ro(
          "lengths",
          [](nb::handle self) {
            const std::span<const int64_t> lengths = nb::cast<const Plan&>(self).lengths();
            const size_t shape[1] = {lengths.size()};
            return Int64Array(lengths.data(), 1, shape, self);
          },
          kView)
      .def(
          "tasks_array",
          [](nb::handle self, int64_t rank) {
            const Plan& plan = nb::cast<const Plan&>(self);
            SPARSECP_CHECK(rank >= 0 && rank < plan.cp(),
                           "Indexer balance rank must be inside its CP group");
            const std::span<const Task> tasks = plan.tasks().tasks(rank);
            const size_t shape[2] = {tasks.size(), 3};
            return Int64Array(reinterpret_cast<const int64_t*>(tasks.data()), 2, shape, self);
          },
          nb::arg("rank"), "This rank's tasks as an int64 [tasks, 3] (document, start, end) view.")
      .def(
          "tasks",
          [](const Plan& plan, int64_t rank) {
            SPARSECP_CHECK(rank >= 0 && rank < plan.cp(),
                           "Indexer balance rank must be inside its CP group");
            std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
            for (const Task& task : plan.tasks().tasks(rank)) {
              out.emplace_back(task.document, task.start, task.end);
            }
            return out;
          },
          nb::arg("rank"), "This rank's tasks as a list of (document, start, end).")
      .def_prop_ro("task_count", [](const Plan& plan) { return plan.tasks().task_count(); })
      .def_prop_ro(
          "rows",
          [](const Plan& plan) { return own_int64(std::vector<int64_t>(plan.stats().rows)); },
          kView)
      .def_prop_ro(
          "work",
          [](const Plan& plan) { return own_int64(std::vector<int64_t>(plan.stats().work)); },
          kView)
      .def_prop_ro(
          "cost", [](const Plan& plan) { return std::vector<double>(plan.stats().cost); },
          "Per rank: the cost model's load of the rows it selects (causal pairs by default).")
      .def_prop_ro("total_work", [](const Plan& plan) { return plan.stats().total_work; })
      .def_prop_ro("imbalance", [](const Plan& plan) { return plan.stats().imbalance; })
      .def_prop_ro("rows_moved", [](const Plan& plan) { return plan.stats().rows_moved; })
      .def_prop_ro("imbalance_bound", [](const Plan& plan) { return plan.balance_bound().bound; })
      .def_prop_ro("rows_moved_bound",
                   [](const Plan& plan) { return plan.rows_moved_bound().total; })
      .def_prop_ro("unit_bound", &Plan::unit_bound)
      .def_prop_ro(
          "padding_rows",
          [](const Plan& plan) { return own_int64(std::vector<int64_t>(plan.padding_rows())); },
          kView)
      .def_prop_ro("largest_unit_work", &Plan::largest_unit_work)
      .def_prop_ro("note", [](const Plan& plan) { return plan.note(); });

  m.def(
      "plan_strategy",
      [](std::string_view name, Lengths lengths, int64_t cp, int64_t ratio,
         const StrategyParams& params) {
        return find_strategy(name).plan(lengths, cp, ratio, params);
      },
      nb::arg("name"), nb::arg("lengths"), nb::arg("cp"), nb::arg("ratio"), nb::arg("params"),
      nb::call_guard<nb::gil_scoped_release>(),
      "Strategy `name`'s plan (unset defaults resolved by resolve_seed_options).");
  m.def("plan_seed", &plan_seed, nb::arg("lengths"), nb::arg("cp"), nb::arg("ratio"),
        nb::arg("mode"), nb::arg("block_size").none(), nb::arg("zigzag_min_length").none(),
        nb::arg("params").none() = nb::none(), nb::call_guard<nb::gil_scoped_release>(),
        "The seed's indexer_task_plan (plan_tasks, the seed's validation and texts); other "
        "registered strategy names plan through the strategy with these two options.");
  m.def(
      "plan_seed",
      [](const PlanningFingerprint& batch, int64_t cp, int64_t ratio, std::string_view mode,
         Option block_size, Option zigzag_min_length, std::optional<StrategyParams> extra) {
        return plan_seed(batch.lengths(), cp, ratio, mode, block_size, zigzag_min_length,
                         std::move(extra));
      },
      nb::arg("batch"), nb::arg("cp"), nb::arg("ratio"), nb::arg("mode"),
      nb::arg("block_size").none(), nb::arg("zigzag_min_length").none(),
      nb::arg("params").none() = nb::none(), nb::call_guard<nb::gil_scoped_release>(),
      "The same, on the document lengths a PlanningFingerprint already holds (so a call that "
      "agreed on its inputs does not pass its lengths into C++ again).");

  m.def(
      "resolve_block_size",
      [](std::string_view mode, Option block_size) {
        return resolve_block_size(parse_mode(mode), block_size);
      },
      nb::arg("mode"), nb::arg("block_size").none(), "Seed resolve_indexer_balance_block_size.");
  m.def(
      "validate_hybrid_threshold",
      [](bool hybrid, Option min_length) {
        validate_hybrid_threshold(hybrid ? Mode::kHybrid : Mode::kNone, min_length);
      },
      nb::arg("hybrid"), nb::arg("min_length").none(),
      "Seed validate_indexer_hybrid_threshold (mode reduced to 'is hybrid').");
}

void bind_routes(nb::module_& m) {
  nb::class_<IndexerRoute>(m, "Route",
                           "One rank's route (planning/route.hpp); fields are read-only int64 "
                           "numpy views of the route's own memory.")
      .def_prop_ro(
          "segments",
          [](nb::handle self) {
            const IndexerRoute& route = nb::cast<const IndexerRoute&>(self);
            const size_t shape[2] = {route.segments.size(), 5};
            return Int64Array(reinterpret_cast<const int64_t*>(route.segments.data()), 2, shape,
                              self);
          },
          kView)
      .def_prop_ro("input_splits",
                   route_field([](const IndexerRoute& r) -> const auto& { return r.input_splits; }),
                   kView)
      .def_prop_ro(
          "output_splits",
          route_field([](const IndexerRoute& r) -> const auto& { return r.output_splits; }), kView)
      .def_prop_ro("send_rows",
                   route_field([](const IndexerRoute& r) -> const auto& { return r.send_rows; }),
                   kView)
      .def_prop_ro("receive_rows",
                   route_field([](const IndexerRoute& r) -> const auto& { return r.receive_rows; }),
                   kView)
      .def_prop_ro(
          "local_sources",
          route_field([](const IndexerRoute& r) -> const auto& { return r.local_sources; }), kView)
      .def_prop_ro(
          "local_targets",
          route_field([](const IndexerRoute& r) -> const auto& { return r.local_targets; }), kView)
      .def_ro("query_count", &IndexerRoute::query_count)
      .def_prop_ro("owner_rows",
                   [](const IndexerRoute& r) {
                     return static_cast<int64_t>(r.send_rows.size() + r.local_sources.size());
                   })
      .def("expected_bytes", &expected_bytes, nb::arg("input_row_bytes"), nb::arg("topk"),
           "(inputs_sent, inputs_received, results_sent, results_received): the bytes this "
           "rank moves to and from other ranks (expected_exchange_bytes).")
      .def("__eq__", [](const IndexerRoute& a, const IndexerRoute& b) { return a == b; });

  m.def("route_seed", &route_seed, nb::arg("lengths"), nb::arg("cp"), nb::arg("rank"),
        nb::arg("ratio"), nb::arg("mode"), nb::arg("block_size").none(),
        nb::arg("zigzag_min_length").none(), nb::arg("params").none() = nb::none(),
        nb::call_guard<nb::gil_scoped_release>(),
        "The seed's indexer_route (seed validation and texts; zigzag's fast path).");
  m.def(
      "route_seed",
      [](const PlanningFingerprint& batch, int64_t cp, int64_t rank, int64_t ratio,
         std::string_view mode, Option block_size, Option zigzag_min_length,
         std::optional<StrategyParams> extra) {
        return route_seed(batch.lengths(), cp, rank, ratio, mode, block_size, zigzag_min_length,
                          std::move(extra));
      },
      nb::arg("batch"), nb::arg("cp"), nb::arg("rank"), nb::arg("ratio"), nb::arg("mode"),
      nb::arg("block_size").none(), nb::arg("zigzag_min_length").none(),
      nb::arg("params").none() = nb::none(), nb::call_guard<nb::gil_scoped_release>(),
      "The same, on the document lengths a PlanningFingerprint already holds.");
  m.def(
      "route_strategy",
      [](std::string_view name, const Lengths& lengths, int64_t cp, int64_t rank, int64_t ratio,
         const StrategyParams& params) {
        return find_strategy(name).route(lengths, cp, rank, ratio, params);
      },
      nb::arg("name"), nb::arg("lengths"), nb::arg("cp"), nb::arg("rank"), nb::arg("ratio"),
      nb::arg("params"), nb::call_guard<nb::gil_scoped_release>(),
      "Strategy::route: any strategy's route of one rank.");
  m.def(
      "route_from_plan", [](const Plan& plan, int64_t rank) { return plan.route(rank); },
      nb::arg("plan"), nb::arg("rank"), nb::call_guard<nb::gil_scoped_release>(),
      "make_route: a rank's route under a plan made beforehand.");
}

void bind_workload(nb::module_& m) {
  m.def(
      "generate_batch",
      [](std::string distribution, int64_t tokens, int64_t cp, uint64_t seed, int64_t scale) {
        return generate_batch(WorkloadSpec{.distribution = std::move(distribution),
                                           .tokens = tokens,
                                           .scale = scale,
                                           .cp = cp,
                                           .seed = seed});
      },
      nb::arg("distribution") = "lognormal", nb::arg("tokens") = int64_t{1} << 20,
      nb::arg("cp") = 8, nb::arg("seed") = 1, nb::arg("scale") = 0,
      "Document lengths of a seeded generated batch (`sparsecp batch`); scale 0 = a quarter "
      "of the local shard.");
  m.def(
      "workload_distributions",
      [] {
        std::vector<std::string> names;
        for (const std::string_view name : workload_distributions()) names.emplace_back(name);
        return names;
      },
      "The distributions generate_batch knows.");
}

void bind_dispatch(nb::module_& m) {
  nb::class_<SequenceDispatchRoute>(m, "SequenceDispatchRoute",
                                    "One rank's KV dispatch route (planning/dispatch.hpp).")
      .def_ro("size", &SequenceDispatchRoute::size)
      .def_ro("rank", &SequenceDispatchRoute::rank)
      .def_ro("global_start", &SequenceDispatchRoute::global_start)
      .def_ro("global_end", &SequenceDispatchRoute::global_end)
      .def_ro("local_start", &SequenceDispatchRoute::local_start)
      .def_ro("local_length", &SequenceDispatchRoute::local_length)
      .def_ro("send_begin", &SequenceDispatchRoute::send_begin)
      .def_ro("send_splits", &SequenceDispatchRoute::send_splits)
      .def_ro("receive_splits", &SequenceDispatchRoute::receive_splits)
      .def_ro("exchange_needed", &SequenceDispatchRoute::exchange_needed)
      .def_prop_ro("kind",
                   [](const SequenceDispatchRoute& r) {
                     switch (r.kind) {
                       case DispatchRouteKind::kSlidingWindow:
                         return "sliding_window";
                       case DispatchRouteKind::kDocumentPrefix:
                         return "document_prefix";
                       case DispatchRouteKind::kIntervals:
                         break;
                     }
                     return "intervals";
                   })
      .def_ro("boundaries", &SequenceDispatchRoute::boundaries)
      .def_ro("raw_local_length", &SequenceDispatchRoute::raw_local_length)
      .def_ro("window", &SequenceDispatchRoute::window)
      .def_ro("ratio", &SequenceDispatchRoute::ratio)
      .def_prop_ro("block_rows", &SequenceDispatchRoute::block_rows)
      .def_prop_ro("received_rows", &SequenceDispatchRoute::received_rows)
      .def_prop_ro("sent_rows", &SequenceDispatchRoute::sent_rows)
      .def("__eq__",
           [](const SequenceDispatchRoute& a, const SequenceDispatchRoute& b) { return a == b; });
  m.def(
      "sliding_window_route",
      [](const Lengths& boundaries, int64_t local_length, int64_t size, int64_t rank,
         int64_t window) {
        return sliding_window_route(boundaries, local_length, size, rank, window);
      },
      nb::arg("boundaries"), nb::arg("local_length"), nb::arg("size"), nb::arg("rank"),
      nb::arg("window"), "Seed sliding_window_route: the raw-KV halo of sliding-window attention.");
  m.def(
      "document_prefix_route",
      [](const Lengths& boundaries, int64_t local_length, int64_t size, int64_t rank,
         int64_t ratio) {
        return document_prefix_route(boundaries, local_length, size, rank, ratio);
      },
      nb::arg("boundaries"), nb::arg("local_length"), nb::arg("size"), nb::arg("rank"),
      nb::arg("ratio"),
      "Seed document_prefix_route: compressed-KV document prefixes (ratio 1, 2).");
  m.def(
      "dispatch_route_from_intervals",
      [](const Lengths& interval_starts, const Lengths& owner_offsets, int64_t rank) {
        return dispatch_route_from_intervals(interval_starts, owner_offsets, rank);
      },
      nb::arg("interval_starts"), nb::arg("owner_offsets"), nb::arg("rank"),
      "The generic route builder: rank q gathers bank rows [interval_starts[q], "
      "owner_offsets[q + 1]) (planning/dispatch.hpp).");
  m.def(
      "compressed_document_offsets",
      [](const Lengths& boundaries, int64_t ratio) {
        return compressed_document_offsets(boundaries, ratio);
      },
      nb::arg("boundaries"), nb::arg("ratio"));
  m.def(
      "compressed_owner_offsets",
      [](const Lengths& boundaries, int64_t ratio, int64_t local_length) {
        return compressed_owner_offsets(boundaries, ratio, local_length);
      },
      nb::arg("boundaries"), nb::arg("ratio"), nb::arg("local_length"));
  m.def(
      "document_boundaries", [](const Lengths& lengths) { return document_boundaries(lengths); },
      nb::arg("lengths"));
}

}  // namespace

void bind_planning(nb::module_& m) {
  bind_params(m);
  bind_plans(m);
  bind_routes(m);
  bind_dispatch(m);
  bind_workload(m);
}

}  // namespace sparsecp::python
