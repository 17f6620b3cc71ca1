#include "sparsecp/planning/simulate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/node_map.hpp"
#include "sparsecp/planning/workload.hpp"

namespace sparsecp {

namespace {

int64_t max_of(const std::vector<int64_t>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

}  // namespace

int64_t min_rows_to_balance(std::span<const int64_t> lengths, int64_t cp, int64_t ratio) {
  validate_plan_inputs(lengths, cp, ratio, Mode::kNone, std::nullopt);
  int64_t total = 0;
  int64_t total_work = 0;
  int64_t longest = 0;
  for (const int64_t length : lengths) {
    total += length;
    total_work += work_prefix(length, ratio);
    longest = std::max(longest, length);
  }
  const double mean = static_cast<double>(total_work) / static_cast<double>(cp);
  const int64_t local = total / cp;
  int64_t needed = 0;
  // Owner r's document pieces, in document coordinates.
  std::vector<std::pair<int64_t, int64_t>> pieces;
  size_t document = 0;
  int64_t document_start = 0;
  for (int64_t owner = 0; owner < cp; ++owner) {
    pieces.clear();
    const int64_t begin = owner * local;
    const int64_t end = begin + local;
    while (document_start + lengths[document] <= begin) document_start += lengths[document++];
    int64_t start = document_start;
    for (size_t d = document; d < lengths.size() && start < end; start += lengths[d++]) {
      pieces.emplace_back(std::max(begin, start) - start,
                          std::min(end, start + lengths[d]) - start);
    }
    // Rows of cost >= c (cost = visible keys floor((p + 1) / ratio)): p >= c * ratio - 1.
    const auto shed = [&](int64_t c) {
      int64_t rows = 0;
      int64_t work = 0;
      for (const auto& [s, e] : pieces) {
        const int64_t from = std::max(s, c * ratio - 1);
        if (from < e) {
          rows += e - from;
          work += range_work(from, e, ratio);
        }
      }
      return std::make_pair(rows, work);
    };
    const int64_t owned = shed(0).second;
    if (static_cast<double>(owned) <= mean) continue;
    // The largest c such that shedding every row of cost >= c suffices (c = 1 does).
    int64_t low = 1;
    int64_t high = longest / ratio + 1;  // shedding rows of cost >= high sheds nothing
    while (high - low > 1) {
      const int64_t middle = low + (high - low) / 2;
      if (static_cast<double>(owned - shed(middle).second) <= mean) {
        low = middle;
      } else {
        high = middle;
      }
    }
    const auto [rows_above, work_above] = shed(low + 1);
    const double excess = static_cast<double>(owned - work_above) - mean;
    needed += rows_above +
              std::max<int64_t>(
                  0, static_cast<int64_t>(std::ceil(excess / static_cast<double>(low) - 1e-9)));
  }
  return needed;
}

SimulationResult simulate_plan(const Strategy& strategy, std::span<const int64_t> lengths,
                               int64_t cp, int64_t ratio, const StrategyParams& params,
                               const MillisecondClock& clock) {
  SimulationResult result;
  result.strategy = std::string(strategy.name());
  result.cp = cp;
  result.ranks_per_node = std::max<int64_t>(params.ranks_per_node, 0);
  for (const int64_t length : lengths) result.total_rows += length;
  std::optional<Plan> planned;
  try {
    if (params.ranks_per_node != 0) validate_node_map(cp, params.ranks_per_node);
    const double begin = clock ? clock() : 0.0;
    planned.emplace(strategy.plan(lengths, cp, ratio, params));
    result.plan_ms = clock ? clock() - begin : 0.0;
  } catch (const Error& error) {
    result.error = error.what();
    return result;
  }
  const Plan& plan = *planned;
  const PlanStats& stats = plan.stats();
  result.work = stats.work;
  result.rows = stats.rows;
  result.total_work = stats.total_work;
  result.imbalance = stats.imbalance;
  result.rows_moved = stats.rows_moved;
  result.largest_unit_work = plan.largest_unit_work();
  result.padding.assign(plan.padding_rows().begin(), plan.padding_rows().end());
  result.note = plan.note();
  result.fragments = stats.fragments;
  result.rows_sent = stats.rows_sent;
  result.max_rows_moved_per_rank = stats.max_rows_moved_per_rank;
  result.bytes_moved = stats.bytes_moved;
  result.max_bytes_sent_per_rank = stats.max_bytes_sent_per_rank;
  result.fragments_max = max_of(result.fragments);
  result.fragments_total = plan.tasks().task_count();
  result.rows_max = max_of(result.rows);
  for (const int64_t padding : result.padding) result.padding_rows += padding;

  int64_t longest = 0;
  for (const int64_t length : lengths) longest = std::max(longest, length);
  const double mean = static_cast<double>(result.total_work) / static_cast<double>(cp);
  const auto bound = [&](int64_t unit) {
    return mean > 0 ? std::max(mean, static_cast<double>(unit)) / mean : 1.0;
  };
  result.lower_bound = bound(result.largest_unit_work);
  result.row_lower_bound = bound(longest / ratio);
  if (params.ranks_per_node > 0) {
    result.cross_node_rows = cross_node_rows(plan.tasks(), lengths, params.ranks_per_node);
    result.cross_node_bytes =
        params.row_bytes.wire_bytes(result.cross_node_rows, result.cross_node_rows);
  }
  return result;
}

int64_t sweep_batches(const SweepSpec& spec) {
  const size_t per_cp = spec.file_batches.empty() ? spec.distributions.size() * spec.seeds.size()
                                                  : spec.file_batches.size();
  return static_cast<int64_t>(spec.cps.size() * per_cp);
}

void for_each_sweep_batch(const SweepSpec& spec,
                          const std::function<void(const SweepBatch&)>& visit) {
  SPARSECP_CHECK(!spec.cps.empty(), "the sweep needs at least one CP size");
  SPARSECP_CHECK(spec.ratio >= 1, "compression ratio must be positive, got ", spec.ratio);
  for (const int64_t cp : spec.cps) {
    SPARSECP_CHECK(cp >= 1, "CP size must be positive, got ", cp);
  }
  // Each batch: workload name, batch id, and its lengths per CP size (generated
  // batches depend on cp through the default document scale).
  struct Source {
    std::string workload;
    int64_t batch;
    const std::vector<int64_t>* fixed;
    uint64_t seed;
  };
  std::vector<Source> sources;
  if (!spec.file_batches.empty()) {
    for (size_t index = 0; index < spec.file_batches.size(); ++index) {
      const auto& lengths = spec.file_batches[index];
      int64_t total = 0;
      for (const int64_t length : lengths) {
        // Not validated yet (each strategy does that): only the sum must not overflow.
        SPARSECP_CHECK(!__builtin_add_overflow(total, length, &total), "batch ", index + 1,
                       ": document lengths sum beyond 64 bits");
      }
      for (const int64_t cp : spec.cps) {
        SPARSECP_CHECK(total % cp == 0, "batch ", index + 1, " holds ", total,
                       " tokens, which CP size ", cp, " does not divide");
      }
      const std::string name =
          index < spec.file_batch_names.size() ? spec.file_batch_names[index] : "file";
      sources.push_back({name, static_cast<int64_t>(index + 1), &lengths, 0});
    }
  } else {
    SPARSECP_CHECK(!spec.distributions.empty(), "the sweep needs at least one distribution");
    SPARSECP_CHECK(!spec.seeds.empty(), "the sweep needs at least one seed");
    SPARSECP_CHECK(spec.tokens > 0, "token count must be positive, got ", spec.tokens);
    const auto names = workload_distributions();
    for (const auto& name : spec.distributions) {
      SPARSECP_CHECK(std::find(names.begin(), names.end(), name) != names.end(),
                     "unknown workload distribution '", name,
                     "' (expected fixed, uniform, lognormal, pareto, bimodal or mixture)");
    }
    for (const int64_t cp : spec.cps) {
      SPARSECP_CHECK(spec.tokens % cp == 0, "token count ", spec.tokens,
                     " is not divisible by CP size ", cp);
    }
    for (const auto& name : spec.distributions) {
      for (const uint64_t seed : spec.seeds) {
        sources.push_back({name, static_cast<int64_t>(seed), nullptr, seed});
      }
    }
  }
  for (const int64_t cp : spec.cps) {
    for (const Source& source : sources) {
      std::vector<int64_t> generated;
      if (source.fixed == nullptr) {
        generated = generate_batch(WorkloadSpec{.distribution = source.workload,
                                                .tokens = spec.tokens,
                                                .scale = spec.doc_scale,
                                                .cp = cp,
                                                .seed = source.seed});
      }
      const std::vector<int64_t>& lengths = source.fixed ? *source.fixed : generated;
      visit(SweepBatch{cp, source.workload, source.batch, lengths});
    }
  }
}

std::vector<SimulationResult> run_sweep(const SweepSpec& spec,
                                        const std::function<void(int64_t, int64_t)>& progress) {
  SPARSECP_CHECK(!spec.strategies.empty(), "simulate needs at least one strategy");
  const int64_t per_node = spec.params.ranks_per_node;
  SPARSECP_CHECK(per_node >= 0, "ranks per node must be non-negative (0 = no node map), got ",
                 per_node);
  if (per_node > 0) {
    for (const int64_t cp : spec.cps) {
      if (cp >= 1) validate_node_map(cp, per_node);  // (a bad cp: for_each_sweep_batch's text)
    }
  }
  std::vector<SimulationResult> results;
  const int64_t total = sweep_batches(spec);
  int64_t done = 0;
  for_each_sweep_batch(spec, [&](const SweepBatch& batch) {
    int64_t rows_moved_bound = 0;
    try {
      rows_moved_bound = min_rows_to_balance(batch.lengths, batch.cp, spec.ratio);
    } catch (const Error&) {
      // An invalid batch: every strategy reports the error itself.
    }
    int64_t cross_node_bound = 0;
    if (per_node > 0) {
      try {
        cross_node_bound = cross_node_rows_lower_bound(batch.lengths, batch.cp, spec.ratio,
                                                       per_node, spec.params.target_imbalance,
                                                       spec.params.cost_model.value_or(CostModel{}))
                               .total;
      } catch (const Error&) {
        // As above; also a target or cost model spill rejects (its rows say why).
      }
    }
    for (const Strategy* strategy : spec.strategies) {
      SimulationResult result =
          simulate_plan(*strategy, batch.lengths, batch.cp, spec.ratio, spec.params, spec.clock);
      result.workload = batch.workload;
      result.batch = batch.batch;
      result.rows_moved_bound = rows_moved_bound;
      result.bytes_moved_bound =
          spec.params.row_bytes.wire_bytes(rows_moved_bound, rows_moved_bound);
      if (per_node > 0) {
        result.cross_node_bound = cross_node_bound;
        result.cross_node_bytes_bound =
            spec.params.row_bytes.wire_bytes(cross_node_bound, cross_node_bound);
      }
      results.push_back(std::move(result));
    }
    ++done;
    if (progress) progress(done, total);
  });
  return results;
}

double median(std::vector<double> values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

namespace {

SummaryRow row_of(const SimulationResult& r) {
  SummaryRow row;
  row.strategy = r.strategy;
  row.cp = r.cp;
  row.workload = r.workload;
  row.batch = r.batch;
  row.batches = 1;
  row.note = r.error.empty() ? r.note : r.error;
  if (!r.error.empty()) {
    row.failures = 1;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    row.imbalance = row.lower_bound = row.row_lower_bound = row.rows_moved = nan;
    row.moved_fraction = row.max_rows_moved_per_rank = row.bytes_moved = nan;
    row.rows_moved_bound = row.moved_bound_fraction = row.bytes_moved_bound = nan;
    row.max_bytes_sent_per_rank = row.fragments_max = row.rows_max = nan;
    row.padding_rows = row.plan_ms = nan;
    row.ranks_per_node = r.ranks_per_node;
    if (row.ranks_per_node > 0) {
      row.cross_node_rows = row.cross_node_fraction = row.cross_node_bytes = nan;
      row.cross_node_bound = row.cross_node_bound_fraction = row.cross_node_bytes_bound = nan;
    }
    return row;
  }
  row.imbalance = r.imbalance;
  row.lower_bound = r.lower_bound;
  row.row_lower_bound = r.row_lower_bound;
  row.rows_moved = static_cast<double>(r.rows_moved);
  row.moved_fraction =
      r.total_rows > 0 ? static_cast<double>(r.rows_moved) / static_cast<double>(r.total_rows) : 0;
  row.rows_moved_bound = static_cast<double>(r.rows_moved_bound);
  row.bytes_moved_bound = static_cast<double>(r.bytes_moved_bound);
  row.moved_bound_fraction =
      r.total_rows > 0 ? static_cast<double>(r.rows_moved_bound) / static_cast<double>(r.total_rows)
                       : 0;
  row.max_rows_moved_per_rank = static_cast<double>(r.max_rows_moved_per_rank);
  row.bytes_moved = static_cast<double>(r.bytes_moved);
  row.max_bytes_sent_per_rank = static_cast<double>(r.max_bytes_sent_per_rank);
  row.fragments_max = static_cast<double>(r.fragments_max);
  row.rows_max = static_cast<double>(r.rows_max);
  row.padding_rows = static_cast<double>(r.padding_rows);
  row.plan_ms = r.plan_ms;
  row.ranks_per_node = r.ranks_per_node;
  const auto fraction = [&](int64_t rows) {
    return r.total_rows > 0 ? static_cast<double>(rows) / static_cast<double>(r.total_rows) : 0;
  };
  row.cross_node_rows = static_cast<double>(r.cross_node_rows);
  row.cross_node_fraction = fraction(r.cross_node_rows);
  row.cross_node_bytes = static_cast<double>(r.cross_node_bytes);
  row.cross_node_bound = static_cast<double>(r.cross_node_bound);
  row.cross_node_bound_fraction = fraction(r.cross_node_bound);
  row.cross_node_bytes_bound = static_cast<double>(r.cross_node_bytes_bound);
  return row;
}

}  // namespace

std::vector<SummaryRow> per_batch_rows(std::span<const SimulationResult> results) {
  std::vector<SummaryRow> rows;
  rows.reserve(results.size());
  for (const auto& result : results) rows.push_back(row_of(result));
  return rows;
}

std::vector<SummaryRow> summarize(std::span<const SimulationResult> results) {
  std::vector<std::tuple<std::string, int64_t, std::string>> keys;
  std::map<std::tuple<std::string, int64_t, std::string>, std::vector<SummaryRow>> groups;
  for (const auto& result : results) {
    auto key = std::make_tuple(result.strategy, result.cp, result.workload);
    auto [it, inserted] = groups.try_emplace(key);
    if (inserted) keys.push_back(key);
    it->second.push_back(row_of(result));
  }
  std::vector<SummaryRow> rows;
  for (const auto& key : keys) {
    const auto& group = groups[key];
    SummaryRow row;
    std::tie(row.strategy, row.cp, row.workload) = key;
    row.batches = static_cast<int64_t>(group.size());
    std::vector<const SummaryRow*> good;
    for (const auto& one : group) {
      row.ranks_per_node = std::max(row.ranks_per_node, one.ranks_per_node);
      row.failures += one.failures;
      if (row.note.empty()) row.note = one.note;
      if (one.failures == 0) good.push_back(&one);
    }
    const auto med = [&](double SummaryRow::*field) {
      std::vector<double> values;
      for (const SummaryRow* one : good) values.push_back(one->*field);
      return median(std::move(values));
    };
    for (double SummaryRow::*field :
         {&SummaryRow::imbalance, &SummaryRow::lower_bound, &SummaryRow::row_lower_bound,
          &SummaryRow::rows_moved, &SummaryRow::moved_fraction, &SummaryRow::rows_moved_bound,
          &SummaryRow::moved_bound_fraction, &SummaryRow::bytes_moved_bound,
          &SummaryRow::max_rows_moved_per_rank, &SummaryRow::bytes_moved,
          &SummaryRow::max_bytes_sent_per_rank, &SummaryRow::fragments_max, &SummaryRow::rows_max,
          &SummaryRow::padding_rows, &SummaryRow::plan_ms}) {
      row.*field = med(field);
    }
    // The node map's figures.
    for (double SummaryRow::*field :
         {&SummaryRow::cross_node_rows, &SummaryRow::cross_node_fraction,
          &SummaryRow::cross_node_bytes, &SummaryRow::cross_node_bound,
          &SummaryRow::cross_node_bound_fraction, &SummaryRow::cross_node_bytes_bound}) {
      row.*field = med(field);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace sparsecp
