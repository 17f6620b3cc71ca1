// sparsecp: cost model files — the text form of planning/cost_model.hpp on disk.
//
// `sparsecp calibrate --out FILE` writes one; `--cost-model FILE` (spill, auto, run)
// and Python's `sparsecp.load_cost_model` read it. The format is parse_cost_model's; the
// CLI's --cost-model also takes a file with a model per layer kind (--layer-kind).
#pragma once

#include <string>

#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/cost_model_set.hpp"

namespace sparsecp {

// Reads a cost model file. Errors name the path (and the line, for a malformed one).
CostModel load_cost_model(const std::string& path);
// Writes `model` (validated first) in format_cost_model's text form, whole or not at all
// (io/output_set.hpp: a temporary beside it, renamed into place). Errors name the path.
void save_cost_model(const std::string& path, const CostModel& model);

// Reads a file holding a model per layer kind (planning/cost_model_set.hpp), or a
// single-model file (one unnamed model for every ratio). Errors name the path and line.
CostModelSet load_cost_model_set(const std::string& path);
// Writes `set` in format_cost_model_set's form, whole or not at all. Errors name the path.
void save_cost_model_set(const std::string& path, const CostModelSet& set);

}  // namespace sparsecp
