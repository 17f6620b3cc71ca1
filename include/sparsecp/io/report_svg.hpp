// sparsecp: SVG charts of a simulation (`sparsecp simulate --svg FILE`).
//
// One standalone SVG 1.1 document (no scripts, no external fonts or styles), in four
// sections:
//   1. per-rank work of every strategy on one batch, as bars in units of the mean rank
//      work, with the perfect-balance line at 1.0 and each strategy's imbalance;
//   2. median imbalance (max / mean work) versus CP size, one panel per workload, one
//      line per strategy;
//   3. median bytes moved (MiB, inputs out and results back) versus CP size, likewise,
//      with the fewest bytes any plan must move (dashed black);
//   4. median fragments on the busiest rank versus CP size, on a log axis.
// Colours are fixed per strategy (listing order), so one strategy looks the same in
// every panel. Every value written is finite; failed batches are left out.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecp/planning/simulate.hpp"

namespace sparsecp {

// `batch`: the results of the strategies on one batch (same cp, workload and batch),
// for section 1 (skipped when empty). `summary`: median rows (summarize()) for
// sections 2 and 3 (skipped when empty). `title` heads the document.
std::string render_simulation_svg(std::span<const SimulationResult> batch,
                                  std::span<const SummaryRow> summary, std::string_view title);

// Per-rank values of several strategies on one batch, measured or planned (`sparsecp run
// --svg FILE`: each rank's selection CPU time and its causal work). One section per
// quantity, one panel per strategy, bars in units of that strategy's mean rank value with
// the perfect-balance line at 1.0, the tallest bar (the imbalance) in the panel's heading,
// and the absolute value of each bar in its tooltip. Non-finite values are drawn as 0.
struct RankSeries {
  std::string strategy;
  std::vector<double> values;  // one per rank
};
struct RankSection {
  std::string heading;  // e.g. "Selection CPU time per rank (median over 6 rounds)"
  std::string unit;     // of the values, for tooltips: "ms", "pairs"
  std::vector<RankSeries> series;
};
std::string render_rank_bars_svg(std::string_view title, std::string_view subtitle,
                                 std::span<const RankSection> sections);

}  // namespace sparsecp
