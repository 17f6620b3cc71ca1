// sparsecp: one cost model per layer kind, chosen by ratio or by name.
//
// One model cannot price every indexer layer: DeepSeek-V4.1's ratio 4 CSA layers, its
// ratio 128 HCA layers and its later candidate layers (a fixed 16K-candidate set: the
// model's `candidates` term) cost differently per row. A model set names each kind:
//
//     # sparsecp cost models, one per layer kind
//     [csa]
//     ratio 4
//     a 61.5
//     b 0.0412
//     c 0.0031
//     topk 512
//     [hca]
//     ratio 128
//     ...
//     [candidates]
//     ratio 4
//     candidates 16384
//     ...
//
// A section `[name]` (letters, digits, '-' and '_') holds one model in cost_model.hpp's
// form plus an optional `ratio N`, the compression ratio of the layers it prices. A text
// without sections is the single-model form (every older file): one unnamed model for any
// ratio. Errors name the origin, the line and the bad field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecp/planning/cost_model.hpp"

namespace sparsecp {

struct LayerCostModel {
  std::string kind;              // the section's name; empty for a single-model file
  std::optional<int64_t> ratio;  // the layers' compression ratio; unset: any ratio
  CostModel model;
};

struct CostModelSet {
  std::vector<LayerCostModel> layers;  // in file order, kinds distinct

  // The model for a layer at `ratio`: the one named `kind` when given (its ratio, if it
  // states one, must be `ratio`), else the only model whose ratio is `ratio` or unset.
  // Throws InvalidInputError naming the kind or ratio and the kinds there are (several
  // models fit the ratio: name one).
  const CostModel& select(int64_t ratio, std::string_view kind = {}) const;
};

// The section form above, or a single model (one unnamed layer); `origin` prefixes errors.
CostModelSet parse_cost_model_set(std::string_view text, std::string_view origin);

// The section form (round-trips through parse_cost_model_set); a set of one unnamed model
// is written in the single-model form.
std::string format_cost_model_set(const CostModelSet& set);

}  // namespace sparsecp
