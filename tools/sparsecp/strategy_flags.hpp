// sparsecp CLI: the balancing-strategy options, declared once and parsed in one place
// into sparsecp::StrategyParams for `plan`, `route`, `run`, `simulate` and `spill`.
//
//   --mode M                 any registered strategy (`sparsecp simulate --list`): the
//                            seed modes none/zigzag/greedy/hybrid, the peers, spill, auto
//   --block-size, --zigzag-min-length   the seed modes' options (defaults resolved against the
//                            batch by sparsecp::resolve_seed_options and printed)
//   --target-imbalance, --max-received-fragments, --cost-model FILE, --layer-kind K,
//   --bandwidth-gbps                spill and auto
//   --wlb-split-length       wlb
//   --snake-block, --lpt-*, --window   the peers' own parameters
// (--topk, which lpt-search's row cost and auto's row bytes use, is a model-shape option:
// model_flags.hpp.)
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "model_flags.hpp"
#include "sparsecp/planning/strategy.hpp"

namespace sparsecp::cli {

struct StrategyFlags {
  std::string mode;        // empty: the command's default
  StrategyParams given;    // the options bind to these fields directly
  std::string cost_model;  // a `sparsecp calibrate` file; empty: none
  std::string layer_kind;  // the model of that kind in a file with a model per layer kind
  std::string lpt_cost = "magi";

  // Declares every option above; `mode_help` says what --mode does in this command
  // (`with_mode` false for commands that choose strategies another way, e.g. simulate's
  // --strategies list).
  void add_to(CLI::App& command, const std::string& mode_help, bool with_mode = true);

  // The parameters, validated; the cost model file is read here, and from a file with a
  // model per layer kind the one --layer-kind names, else the one for `ratio`. `model`
  // supplies topk and the moved-row sizes (auto's bytes); a cost model fitted for another
  // topk than its --topk is refused, naming both. Without `model` (a command with no
  // --topk), the defaults, and a cost model of any topk.
  StrategyParams params(int64_t ratio, const ModelFlags& model) const {
    return params(ratio, model, true);
  }
  StrategyParams params(int64_t ratio) const { return params(ratio, ModelFlags{}, false); }
  StrategyParams params(int64_t ratio, const ModelFlags& model, bool topk_given) const;

  // The strategy --mode names, or `fallback` when --mode was not given; a list is an
  // error here. For a seed mode, --block-size / --zigzag-min-length where the seed forbids
  // them are the seed's errors.
  const Strategy& strategy(std::string_view fallback) const;

  // The strategies of a comma-separated --mode list ("zigzag,hybrid,spill"), in order,
  // each once; `fallback` names them when --mode was not given. Each seed mode checks
  // --block-size / --zigzag-min-length as strategy() does. Throws Error naming an unknown
  // or repeated name.
  std::vector<const Strategy*> strategies(std::string_view fallback) const;
};

}  // namespace sparsecp::cli
