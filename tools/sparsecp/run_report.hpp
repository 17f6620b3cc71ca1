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

}  // namespace sparsecp::cli
