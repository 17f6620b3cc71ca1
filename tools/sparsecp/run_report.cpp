#include "run_report.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "calibration.hpp"
#include "sparsecp/io/output_set.hpp"
#include "sparsecp/io/report_svg.hpp"
#include "sparsecp/kernels/isa.hpp"
#include "sparsecp/planning/strategy.hpp"

namespace sparsecp::cli {

bool verified(const std::vector<Summary>& summaries) {
  return std::all_of(summaries.begin(), summaries.end(), [](const Summary& s) {
    return s.mismatched_rows == 0 && s.unstable_repeats == 0;
  });
}

namespace {

double hidden(const OverlapFigures& o, double wait) {
  return o.alone > 0 ? std::clamp(1.0 - wait / o.alone, 0.0, 1.0) : 0.0;
}

nlohmann::ordered_json summary_json(const Summary& s) {
  nlohmann::ordered_json out;
  out["mode"] = s.runs->strategy->name();
  out["parameters"] = s.runs->parameters;
  out["ranks"] = nlohmann::ordered_json::array();
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    const RankFigures& f = s.ranks[r];
    out["ranks"].push_back({{"rank", r},
                            {"rows", f.rows},
                            {"work", f.work},
                            {"select_cpu_s", f.select_cpu},
                            {"select_wall_s", f.select_wall},
                            {"input_wait_s", f.input_wait},
                            {"result_wait_s", f.result_wait},
                            {"bytes_sent", f.bytes_sent},
                            {"bytes_received", f.bytes_received},
                            {"predicted_bytes_sent", f.predicted_sent},
                            {"predicted_bytes_received", f.predicted_received}});
  }
  out["work_imbalance"] = s.work_imbalance;
  out["time_imbalance"] = s.time_imbalance;
  out["slowest_select_cpu_s"] = {
      {"min", s.slowest.min}, {"median", s.slowest.median}, {"max", s.slowest.max}};
  out["step_wall_s"] = {
      {"min", s.step_wall.min}, {"median", s.step_wall.median}, {"max", s.step_wall.max}};
  out["exchange_s"] = {{"min", s.exchange_wall.min},
                       {"median", s.exchange_wall.median},
                       {"max", s.exchange_wall.max}};
  out["speedup_slowest_rank"] = {{"median", s.speedup},
                                 {"low", s.speedup_low},
                                 {"high", s.speedup_high},
                                 {"outside_noise", s.significant}};
  out["busiest_rank_bytes_sent"] = s.busiest_sent;
  out["busiest_rank_bytes_received"] = s.busiest_received;
  out["total_bytes_moved"] = s.total_sent;
  out["bytes_match_route"] = s.bytes_match;
  out["mismatched_rows"] = s.mismatched_rows;
  out["unstable_repeats"] = s.unstable_repeats;
  if (s.overlap) {
    const OverlapFigures& o = *s.overlap;
    out["overlap"] = {{"rank", s.overlap_rank},
                      {"exchange_alone_s", o.alone},
                      {"owner_projection_wall_s", o.work},
                      {"wait_after_projection_s", o.wait_after},
                      {"wait_after_polled_projection_s", o.wait_polled},
                      {"hidden_fraction", hidden(o, o.wait_after)},
                      {"hidden_fraction_polled", hidden(o, o.wait_polled)}};
  }
  return out;
}

}  // namespace

void print_json(const RunFlags& flags, const Job& job, const std::vector<Summary>& summaries,
                const std::vector<Comparison>& pairs) {
  nlohmann::ordered_json out;
  out["verified"] = verified(summaries);
  out["load_average"] = job.load_average;
  out["cores"] = job.cores;
  out["machine"] = {{"cpu", machine_name()},
                    {"isa", kernel_isa_name(resolve_kernel_isa(KernelIsa::kAuto))}};
  out["concurrent_selections"] = flags.concurrent_selections;
  out["cp"] = job.cp;
  out["batch"] = job.batch.describe();
  out["documents"] = job.lengths.size();
  out["tokens"] = job.model.local * job.cp;
  out["ratio"] = flags.ratio;
  out["model"] = {{"heads", flags.model.heads},       {"head_dim", flags.model.head_dim},
                  {"rope_dim", flags.model.rope_dim}, {"q_rank", flags.model.q_rank},
                  {"topk", flags.model.topk},         {"seed", flags.model_seed},
                  {"threads", flags.threads}};
  if (job.params.cost_model || !job.cost.source.empty()) {
    nlohmann::ordered_json cost;
    if (job.params.cost_model) {
      cost = {{"a_ns", job.params.cost_model->a},
              {"b_ns", job.params.cost_model->b},
              {"c_ns", job.params.cost_model->c},
              {"d_ns", job.params.cost_model->d},
              {"id", cost_model_id(*job.params.cost_model)}};
    }
    cost["source"] = job.cost.source;
    out["cost_model"] = cost;
  }
  if (!job.adapt.empty()) {
    const auto model_json = [](const CostModel& m) {
      return nlohmann::ordered_json{{"a_ns", m.a}, {"b_ns", m.b},    {"c_ns", m.c},
                                    {"d_ns", m.d}, {"unit", m.unit}, {"id", cost_model_id(m)}};
    };
    out["adapt"] = nlohmann::ordered_json::array();
    for (size_t i = 0; i < job.adapt.size(); ++i) {
      const AdaptStep& step = job.adapt[i];
      out["adapt"].push_back({{"step", i + 1},
                              {"strategy", step.strategy},
                              {"planned_with", model_json(step.planned_with)},
                              {"time_imbalance", step.time_imbalance},
                              {"slowest_select_cpu_s", step.slowest_seconds},
                              {"refitted", model_json(step.refitted)},
                              {"kept_previous", step.kept_previous},
                              {"refused_rms_relative_residual", step.refused_residual},
                              {"rms_relative_residual", step.rms_residual},
                              {"window_samples", step.window_samples}});
    }
  }
  out["sizing"] = {{"text", job.sizing},
                   {"scaled", job.scaled},
                   {"requested_tokens", job.requested_tokens},
                   {"round_s", job.round_seconds},
                   {"time_budget_s", flags.time_budget}};
  out["too_few_repeats"] = job.too_few_repeats;
  out["repeats"] = summaries.front().runs->repeats.size();
  out["repeats_stopped"] = job.stopped;
  out["strategies"] = nlohmann::ordered_json::array();
  for (const Summary& s : summaries) out["strategies"].push_back(summary_json(s));
  out["comparisons"] = nlohmann::ordered_json::array();
  for (const Comparison& c : pairs) {
    out["comparisons"].push_back(
        {{"a", c.a->strategy->name()},
         {"b", c.b->strategy->name()},
         {"a_over_b", {{"median", c.ratio.median}, {"low", c.ratio.low}, {"high", c.ratio.high}}},
         {"outside_noise", c.outside_noise}});
  }
  std::printf("%s\n", out.dump(2).c_str());
}

namespace {

void print_rank_table(const Summary& s) {
  std::printf("\n%s%s%s\n", std::string(s.runs->strategy->name()).c_str(),
              s.runs->parameters.empty() ? "" : ": ", s.runs->parameters.c_str());
  std::printf("  %4s %9s %16s %14s %14s %14s %14s %12s\n", "rank", "rows", "work (pairs)",
              "select CPU ms", "select wall ms", "bytes sent", "bytes received", "bytes = route");
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    const RankFigures& f = s.ranks[r];
    std::printf("  %4zu %9lld %16lld %14.1f %14.1f %14lld %14lld %12s\n", r,
                static_cast<long long>(f.rows), static_cast<long long>(f.work), f.select_cpu * 1e3,
                f.select_wall * 1e3, static_cast<long long>(f.bytes_sent),
                static_cast<long long>(f.bytes_received), f.bytes_match() ? "yes" : "NO");
  }
}

// Under load the ranks wait for cores, and the times say more about the other programs.
std::string load_warning(const Job& job) {
  if (job.cores <= 0 || job.load_average <= static_cast<double>(job.cores)) return "";
  char text[200];
  std::snprintf(text, sizeof text,
                "warning: the load average was %.1f at start, above this machine's %lld cores: "
                "other programs compete for the CPUs and the times are unreliable",
                job.load_average, static_cast<long long>(job.cores));
  return text;
}

// Which of two strategies is faster, or that the repeats cannot tell.
void print_comparison(const Comparison& c) {
  const std::string a(c.a->strategy->name()), b(c.b->strategy->name());
  if (c.outside_noise) {
    const bool b_faster = c.ratio.median > 1;
    const std::string& fast = b_faster ? b : a;
    const double factor = b_faster ? c.ratio.median : 1 / c.ratio.median;
    const double low = b_faster ? c.ratio.low : 1 / c.ratio.high;
    const double high = b_faster ? c.ratio.high : 1 / c.ratio.low;
    std::printf("  %-8s vs %-8s %s is faster: %.2fx (%.2f-%.2f)\n", a.c_str(), b.c_str(),
                fast.c_str(), factor, low, high);
  } else {
    std::printf("  %-8s vs %-8s within noise of each other: %s / %s = %.2fx (%.2f-%.2f) ~\n",
                a.c_str(), b.c_str(), a.c_str(), b.c_str(), c.ratio.median, c.ratio.low,
                c.ratio.high);
  }
}

std::string coefficients(const CostModel& m) {
  char text[96];
  std::snprintf(text, sizeof text, "%.4g / %.4g / %.4g / %.4g %s", m.a, m.b, m.c, m.d,
                m.unit.c_str());
  return text;
}

// --adapt's steps: the model each planned with, the balance it reached, the refit.
void print_adapt(const Job& job) {
  if (job.adapt.empty()) return;
  std::printf(
      "--adapt: %s's cost model refitted after each step from that step's per-rank selection "
      "CPU times (%s's; none's from the first step; a sliding window):\n",
      job.adapt.front().strategy.c_str(), job.adapt.front().strategy.c_str());
  std::printf("  %4s %42s %9s %11s %42s %9s %8s\n", "step", "planned with a / b / c / d",
              "time imb", "slowest ms", "refitted a / b / c / d", "rms res", "samples");
  for (size_t i = 0; i < job.adapt.size(); ++i) {
    const AdaptStep& step = job.adapt[i];
    char residual[32];
    std::snprintf(residual, sizeof residual, "%.1f%%", 100 * step.rms_residual);
    char refused[64];
    std::snprintf(refused, sizeof refused, "kept (fit refused: %.0f%%)",
                  100 * step.refused_residual);
    const char* kept = step.refused_residual > 0 ? refused : "kept (no fit yet)";
    std::printf("  %4zu %42s %9.3f %11.1f %42s %9s %8lld\n", i + 1,
                coefficients(step.planned_with).c_str(), step.time_imbalance,
                step.slowest_seconds * 1e3,
                step.kept_previous ? kept : coefficients(step.refitted).c_str(),
                step.kept_previous ? "-" : residual, static_cast<long long>(step.window_samples));
  }
}

// The job's batch, model, cost model and repeats, then each strategy's per-rank table.
void print_header(const RunFlags& flags, const Job& job, const std::vector<Summary>& summaries) {
  if (const std::string warning = load_warning(job); !warning.empty()) {
    std::printf("%s\n", warning.c_str());
  }
  std::printf(
      "sparsecp run: %lld ranks, %s: %zu documents, %lld tokens (%lld per rank), ratio %lld\n",
      static_cast<long long>(job.cp), job.batch.describe().c_str(), job.lengths.size(),
      static_cast<long long>(job.model.local * job.cp), static_cast<long long>(job.model.local),
      static_cast<long long>(flags.ratio));
  std::printf("machine: %s, %s kernels, %lld cores\n", machine_name().c_str(),
              kernel_isa_name(resolve_kernel_isa(KernelIsa::kAuto)),
              static_cast<long long>(job.cores));
  std::printf(
      "model: %s, bank %lld keys; bf16 qr/Wq_b/keys, fp32 weights/RoPE; seed %llu; %d "
      "selection thread(s) per rank\n",
      flags.model.describe().c_str(), static_cast<long long>(job.model.bank),
      static_cast<unsigned long long>(flags.model_seed), flags.threads);
  if (!job.cost.source.empty()) {
    std::printf("cost model for spill/auto: %s%s; %s\n",
                describe_cost_model(job.params.cost_model, "causal pairs").c_str(),
                job.params.cost_model
                    ? (" (id " + cost_model_id(*job.params.cost_model) + ")").c_str()
                    : "",
                job.cost.source.c_str());
  }
  if (!job.sizing.empty()) std::printf("%s\n", job.sizing.c_str());
  print_adapt(job);
  const size_t repeats = summaries.front().runs->repeats.size();
  char turns[96] = "ranks may share cores";
  if (flags.concurrent_selections > 0) {
    std::snprintf(turns, sizeof turns, "ranks select in turns, %lld at a time",
                  static_cast<long long>(flags.concurrent_selections));
  }
  std::printf(
      "times: each rank's selection CPU time (%s); %zu interleaved repeat(s) (%s), per-rank "
      "figures are medians\n",
      turns, repeats, job.stopped.c_str());
  for (const Summary& s : summaries) print_rank_table(s);
}

// One line per strategy: slowest rank, speedup, imbalances, bytes, verification.
void print_side_by_side(const std::vector<Summary>& summaries) {
  std::printf("\nside by side (slowest rank = the rank with the most selection CPU time):\n");
  std::printf("  %-8s %26s %22s %9s %9s %21s %12s %9s\n", "mode", "slowest rank ms min/med/max",
              "speedup vs none", "work imb", "time imb", "busiest sent/recv MB", "total MB",
              "verified");
  for (const Summary& s : summaries) {
    char speedup[64];
    if (s.runs == summaries.front().runs) {
      std::snprintf(speedup, sizeof speedup, "baseline");
    } else {
      std::snprintf(speedup, sizeof speedup, "%.2fx (%.2f-%.2f)%s", s.speedup, s.speedup_low,
                    s.speedup_high, s.significant ? "" : "~");
    }
    char slowest[64];
    std::snprintf(slowest, sizeof slowest, "%.0f / %.0f / %.0f", s.slowest.min * 1e3,
                  s.slowest.median * 1e3, s.slowest.max * 1e3);
    char traffic[48];
    std::snprintf(traffic, sizeof traffic, "%.1f / %.1f", static_cast<double>(s.busiest_sent) / 1e6,
                  static_cast<double>(s.busiest_received) / 1e6);
    std::printf("  %-8s %26s %22s %9.3f %9.3f %21s %12.1f %9s\n",
                std::string(s.runs->strategy->name()).c_str(), slowest, speedup, s.work_imbalance,
                s.time_imbalance, traffic, static_cast<double>(s.total_sent) / 1e6,
                s.mismatched_rows == 0 && s.unstable_repeats == 0 ? "yes" : "NO");
  }
  std::printf(
      "  speedup = the median over repeats of none's slowest-rank time / the strategy's in the "
      "same repeat, with its 95%% interval;\n  ~ = within noise (the interval holds 1): not a "
      "measurable difference. work imb = busiest rank's causal pairs / mean; time imb = slowest "
      "rank's median time / mean.\n");
  std::printf(
      "\nthe step, wall (input exchange + selection + result exchange; per repeat the "
      "slowest rank):\n  %-8s %30s %30s\n",
      "mode", "step ms min/med/max", "exchanges ms min/med/max");
  for (const Summary& s : summaries) {
    std::printf("  %-8s %12.1f / %6.1f / %6.1f %12.1f / %6.1f / %6.1f\n",
                std::string(s.runs->strategy->name()).c_str(), s.step_wall.min * 1e3,
                s.step_wall.median * 1e3, s.step_wall.max * 1e3, s.exchange_wall.min * 1e3,
                s.exchange_wall.median * 1e3, s.exchange_wall.max * 1e3);
  }
}

// Pairwise comparisons, overlap, byte check and the verdict.
void print_footer(const Job& job, const std::vector<Summary>& summaries,
                  const std::vector<Comparison>& pairs) {
  if (job.too_few_repeats) {
    std::printf(
        "each pair: too few repeats to compare: %zu round(s), and a verdict needs %lld (the "
        "fewest whose ratios give a 95%% interval); no strategy is called faster (%s)\n",
        summaries.front().runs->repeats.size(), static_cast<long long>(kRoundsForVerdict),
        job.stopped.c_str());
  } else {
    std::printf("each pair (the same per-repeat ratios and intervals):\n");
    for (const Comparison& c : pairs) print_comparison(c);
  }
  for (const Summary& s : summaries) {
    if (!s.overlap) continue;
    const OverlapFigures& o = *s.overlap;
    std::printf(
        "overlap, %s (rank %lld, the slowest exchange): input exchange alone %.2f ms; the "
        "owner's own Index-Q projection while it is in flight %.2f ms wall; wait after it "
        "%.2f ms (%.0f%% hidden), with test() between blocks %.2f ms (%.0f%% hidden)\n",
        std::string(s.runs->strategy->name()).c_str(), static_cast<long long>(s.overlap_rank),
        o.alone * 1e3, o.work * 1e3, o.wait_after * 1e3, 100 * hidden(o, o.wait_after),
        o.wait_polled * 1e3, 100 * hidden(o, o.wait_polled));
  }
  const bool bytes_match = std::all_of(summaries.begin(), summaries.end(),
                                       [](const Summary& s) { return s.bytes_match; });
  std::printf("bytes moved equal the route's prediction on every rank: %s\n",
              bytes_match ? "yes" : "NO");
  if (verified(summaries)) {
    std::printf(
        "verified: every strategy's top-k equals none's bit for bit on every rank (%lld rows)\n",
        static_cast<long long>(job.model.local * job.cp));
  } else {
    for (const Summary& s : summaries) {
      if (s.mismatched_rows || s.unstable_repeats) {
        std::printf("NOT VERIFIED: %s: %lld rows differ from none; %lld repeats not reproducible\n",
                    std::string(s.runs->strategy->name()).c_str(),
                    static_cast<long long>(s.mismatched_rows),
                    static_cast<long long>(s.unstable_repeats));
      }
    }
  }
}

}  // namespace

void print_text(const RunFlags& flags, const Job& job, const std::vector<Summary>& summaries,
                const std::vector<Comparison>& pairs) {
  print_header(flags, job, summaries);
  print_side_by_side(summaries);
  print_footer(job, summaries, pairs);
}

void write_svg(const RunFlags& flags, const Job& job, const std::vector<Summary>& summaries) {
  const size_t rounds = summaries.front().runs->repeats.size();
  RankSection time{
      "Selection CPU time per rank (median over " + std::to_string(rounds) + " rounds)",
      "ms CPU",
      {}};
  RankSection work{"Causal (query, key) pairs each rank selects", "pairs", {}};
  std::string names;
  for (const Summary& s : summaries) {
    RankSeries t{std::string(s.runs->strategy->name()), {}};
    RankSeries w{t.strategy, {}};
    for (const RankFigures& f : s.ranks) {
      t.values.push_back(f.select_cpu * 1e3);
      w.values.push_back(static_cast<double>(f.work));
    }
    names += (names.empty() ? "" : ", ") + t.strategy;
    time.series.push_back(std::move(t));
    work.series.push_back(std::move(w));
  }
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  char subtitle[512];
  std::snprintf(subtitle, sizeof subtitle,
                "%s: %zu documents, %lld tokens; %s; %s (%s kernels), %s; sparsecp run --svg",
                job.batch.describe().c_str(), job.lengths.size(),
                static_cast<long long>(job.model.local * job.cp), flags.model.describe().c_str(),
                machine_name().c_str(), kernel_isa_name(resolve_kernel_isa(KernelIsa::kAuto)),
                date);
  const std::string title = "sparsecp run: " + names + " on " + std::to_string(job.cp) + " ranks";
  const std::vector<RankSection> sections = {time, work};
  OutputSet output;  // whole or absent (io/output_set.hpp)
  output.add_text(flags.svg, render_rank_bars_svg(title, subtitle, sections), "--svg");
  output.commit();
  std::fprintf(stderr, "wrote %s\n", flags.svg.c_str());
}

}  // namespace sparsecp::cli
