// sparsecp CLI (`run`): the main job's report, printed by rank 0 once every rank's
// figures are gathered and summarised: per-rank tables, the side-by-side line per
// strategy, pairwise comparisons, overlap and verification; or the same as JSON.
#pragma once

#include <vector>

#include "run_job.hpp"

namespace sparsecp::cli {

// True when every strategy's top-k equals none's on every rank, in every repeat.
bool verified(const std::vector<Summary>& summaries);

void print_text(const RunFlags& flags, const Job& job, const std::vector<Summary>& summaries,
                const std::vector<Comparison>& pairs);
void print_json(const RunFlags& flags, const Job& job, const std::vector<Summary>& summaries,
                const std::vector<Comparison>& pairs);
// --svg FILE: every strategy's per-rank median selection CPU time and causal work as bars
// (io/report_svg.hpp), whole or absent (io/output_set.hpp); the subtitle names the batch,
// the machine (CPU model, kernel ISA) and the date.
void write_svg(const RunFlags& flags, const Job& job, const std::vector<Summary>& summaries);

}  // namespace sparsecp::cli
