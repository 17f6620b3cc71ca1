#include "strategy_flags.hpp"

#include <algorithm>

#include "batch_input.hpp"
#include "command.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/io/cost_model_file.hpp"
#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/plan.hpp"

namespace sparsecp::cli {

void StrategyFlags::add_to(CLI::App& command, const std::string& mode_help, bool with_mode) {
  if (with_mode) {
    // An empty --mode ("", or only commas) must not fall back to the command's default.
    command.add_option("--mode", mode, mode_help)
        ->check(CLI::Validator(
            [](std::string& text) {
              return text.find_first_not_of(", \t\n\r") == std::string::npos
                         ? std::string("is empty: name a strategy ('sparsecp simulate --list')")
                         : std::string();
            },
            "", "non-empty"));
  }
  command.add_option(names("--block-size", {"--block"}), given.block_size,
                     "greedy/hybrid: rows per pooled block [default: 2048, or the rows per rank "
                     "when fewer; a larger explicit block is an error, as in hyper_parallel]");
  command.add_option("--zigzag-min-length", given.zigzag_min_length,
                     "hybrid: documents of at least this many tokens keep their zigzag chunks "
                     "[default: the rows per rank, tokens / cp]");
  command
      .add_option(names("--target-imbalance", {"--target"}), given.target_imbalance,
                  "spill: target imbalance, max load / mean load (>= 1) on the cost model")
      ->capture_default_str();
  command
      .add_option(names("--max-received-fragments", {"--fragments"}), given.max_received_fragments,
                  "spill: most pieces one rank receives from others (0 = unbounded)")
      ->capture_default_str();
  command.add_option("--cost-model", cost_model,
                     "spill/auto: per-row cost model file from `sparsecp calibrate` [default: "
                     "spill balances causal pairs; auto predicts a nominal accelerator]; a file "
                     "with a model per layer kind gives the one for --ratio, or --layer-kind's");
  command.add_option("--layer-kind", layer_kind,
                     "spill/auto: the model of this layer kind (e.g. csa, hca, candidates) in a "
                     "--cost-model file with a model per layer kind [default: the one whose "
                     "ratio is --ratio]");
  command
      .add_option(names("--bandwidth-gbps", {"--bandwidth"}), given.bandwidth_gbps,
                  "auto: exchange bandwidth per rank and direction in GB/s")
      ->capture_default_str();
  command.add_option("--wlb-split-length", given.wlb_split_length,
                     "wlb: documents longer than this many tokens are split over all ranks "
                     "[default: the rows per rank]");
  command.add_option("--snake-block", given.snake_block, "snake: rows per packed block")
      ->capture_default_str();
  command.add_option("--lpt-align", given.lpt_align, "lpt-search: rows per aligned fragment")
      ->capture_default_str();
  command
      .add_option("--lpt-row-cap", given.lpt_row_cap,
                  "lpt-search: per-rank row cap as a multiple (>= 1) of the local rows")
      ->capture_default_str();
  command
      .add_option(names("--lpt-search-steps", {"--lpt-steps"}), given.lpt_search_steps,
                  "lpt-search: most improving local-search steps after LPT")
      ->capture_default_str();
  command
      .add_option("--lpt-fragment-cap", given.lpt_fragment_cap,
                  "lpt-search: fall back to contiguous when a rank has more fragments than this "
                  "(MagiAttention uses 64); 0 = no cap")
      ->capture_default_str();
  command
      .add_option("--lpt-cost", lpt_cost,
                  "lpt-search internal row cost: magi (min(p+1,window)+min(topk,vis)+vis+0.25) "
                  "or causal (vis); reports always use causal work")
      ->capture_default_str();
  command
      .add_option("--window", given.window, "lpt-search: sliding window in tokens (magi row cost)")
      ->capture_default_str();
}

StrategyParams StrategyFlags::params(int64_t ratio, const ModelFlags& model,
                                     bool topk_given) const {
  // A seed mode checks its explicit options first, with the seed's texts and order (a
  // block under zigzag is misplaced before it is zero; hybrid's threshold 0 is not "an
  // explicit positive integer"); omitted options keep their friendly defaults.
  const std::vector<std::string> listed =
      mode.empty() ? std::vector<std::string>{} : parse_name_list(mode, "--mode");
  for (const std::string& name : listed) {
    for (const Mode seed : {Mode::kNone, Mode::kZigzag, Mode::kGreedy, Mode::kHybrid}) {
      if (name != mode_name(seed)) continue;
      resolve_block_size(seed, given.block_size);
      if (given.zigzag_min_length) validate_hybrid_threshold(seed, given.zigzag_min_length);
    }
  }
  StrategyParams params = given;
  if (!cost_model.empty()) {
    check_input_file(cost_model, "--cost-model");
    const CostModelSet set = load_cost_model_set(cost_model);
    try {
      params.cost_model = set.select(ratio, layer_kind);
    } catch (const Error& error) {
      throw InvalidInputError("--cost-model " + cost_model + ": " + error.what());
    }
    // Its c term prices min(topk, visible keys): a model fitted for another top-k prices
    // every row wrongly, so it is refused rather than used without a word.
    SPARSECP_CHECK(!topk_given || params.cost_model->topk == model.topk, "--cost-model ",
                   cost_model, ": the model was fitted for topk ", params.cost_model->topk,
                   ", this command selects --topk ", model.topk, " (calibrate for topk ",
                   model.topk, ", or pass --topk ", params.cost_model->topk, ")");
  } else {
    SPARSECP_CHECK(layer_kind.empty(), "--layer-kind ", layer_kind,
                   " needs --cost-model FILE (a file with a model per layer kind)");
  }
  params.lpt_cost = parse_row_cost(lpt_cost);
  params.row_bytes = model.row_bytes();
  params.topk = model.topk;
  validate_strategy_params(params);
  return params;
}

const Strategy& StrategyFlags::strategy(std::string_view fallback) const {
  const std::vector<const Strategy*> chosen = strategies(fallback);
  SPARSECP_CHECK(chosen.size() == 1, "--mode takes one strategy in this command, got ",
                 chosen.size(), " (", mode, ")");
  return *chosen.front();
}

std::vector<const Strategy*> StrategyFlags::strategies(std::string_view fallback) const {
  const std::vector<std::string> names =
      parse_name_list(mode.empty() ? fallback : std::string_view(mode), "--mode");
  std::vector<const Strategy*> chosen;
  for (const std::string& name : names) {
    const Strategy& strategy = find_strategy(name);
    SPARSECP_CHECK(std::find(chosen.begin(), chosen.end(), &strategy) == chosen.end(),
                   "--mode names ", name, " twice");
    for (const Mode seed : {Mode::kNone, Mode::kZigzag, Mode::kGreedy, Mode::kHybrid}) {
      if (strategy.name() == mode_name(seed)) check_seed_options_used(seed, given);
    }
    chosen.push_back(&strategy);
  }
  return chosen;
}

}  // namespace sparsecp::cli
