// One name for one thing: every option of every command, as `--help` shows it, is in the
// one table below, so a new option either reuses a name (and its meaning) or is added
// here on purpose. The old spellings stay accepted but hidden (docs/guide/cli.md, "Options every
// command shares").
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "support/tool_runner.hpp"

namespace {

using sparsecp::testing::run_tool;
using ::testing::HasSubstr;

// Canonical option names and what each means, in every command that has it.
const std::map<std::string, std::string>& canonical_names() {
  static const std::map<std::string, std::string> names = {
      {"--help", "this help"},
      {"--help-all", "every command's help"},
      // the batch
      {"--lengths", "document lengths in packed order"},
      {"--lengths-file", "a file of document lengths"},
      {"--dist", "generated batch: length distribution (a list where a command sweeps)"},
      {"--tokens", "generated batch: total tokens"},
      {"--scale", "generated batch: typical document length"},
      {"--seed", "generator seed (a list or ranges where a command sweeps)"},
      {"--cp", "CP group size in ranks (a list where a command sweeps)"},
      {"--ratio", "key compression ratio"},
      {"--batches", "dispatch sweep: generated batches per CP size"},
      // strategies (StrategyParams fields)
      {"--mode", "strategy"},
      {"--strategies", "simulate: the strategies to compare"},
      {"--list", "list the strategies"},
      {"--block-size", "block_size"},
      {"--zigzag-min-length", "zigzag_min_length"},
      {"--target-imbalance", "target_imbalance"},
      {"--max-received-fragments", "max_received_fragments"},
      {"--cost-model", "cost model file"},
      {"--layer-kind", "which model of a cost-model file with a model per layer kind"},
      {"--ranks-per-node", "ranks per node of the node map (topology-aware plans)"},
      {"--owner-cost", "spill: owner-side cost per owned row, a,c (the KL on each row's owner)"},
      {"--bandwidth-gbps", "bandwidth_gbps"},
      {"--wlb-split-length", "wlb_split_length"},
      {"--snake-block", "snake_block"},
      {"--lpt-align", "lpt_align"},
      {"--lpt-row-cap", "lpt_row_cap"},
      {"--lpt-search-steps", "lpt_search_steps"},
      {"--lpt-fragment-cap", "lpt_fragment_cap"},
      {"--lpt-cost", "lpt_cost"},
      {"--window", "sliding window in tokens"},
      // the model's shape
      {"--heads", "index heads"},
      {"--head-dim", "index head dimension"},
      {"--rope-dim", "rotated channels per head"},
      {"--q-rank", "q_lora_rank"},
      {"--topk", "selected keys per row"},
      {"--att-heads", "main attention heads"},
      {"--att-dim", "main attention head dimension"},
      {"--model-seed", "seed of the model tensors"},
      // measuring
      {"--repeats", "repetitions"},
      {"--max-repeats", "run: most repetitions"},
      {"--time-budget", "run: seconds of measuring"},
      {"--threads", "threads"},
      {"--isa", "kernel ISA"},
      {"--sgemm-size", "bench: reference sgemm size"},
      {"--rows", "rows"},
      {"--doc-length", "tokens per document"},
      {"--documents", "documents"},
      {"--dtype", "fp32, bf16 or both"},
      {"--no-baseline", "bench select: skip the baseline"},
      {"--verify-rows", "bench kl: rows checked"},
      {"--visible", "calibrate: visible keys per point"},
      {"--max-residual", "calibrate: the residual bound a fit must meet"},
      // run
      {"--no-calibrate", "run: no start-up calibration"},
      {"--no-cache", "run: calibrate anew, save nothing"},
      {"--overlap", "run: measure the overlap"},
      {"--no-agreement-check", "run: skip the agreement check"},
      {"--adapt", "run: steps refitting the cost model from the job's own times"},
      {"--adapt-window", "run: steps the refit keeps"},
      {"--concurrent-selections", "run: ranks selecting at a time, taking turns"},
      // route / dispatch
      {"--rank", "one rank"},
      {"--all-ranks", "every rank"},
      {"--full", "route: every rank's route in JSON"},
      {"--kind", "dispatch: swa or prefix"},
      // tensors (select, kl)
      {"--keys", "Index K bank"},
      {"--weights", "merge weights"},
      {"--q", "Index Q"},
      {"--q-residual", "low-rank query residual"},
      {"--wq", "Wq_b"},
      {"--wq-layout", "Wq_b layout"},
      {"--cos", "RoPE cos"},
      {"--sin", "RoPE sin"},
      {"--segments", "packed segments"},
      {"--index-query", "Index Q"},
      {"--index-key", "Index K bank"},
      {"--attention-query", "main attention Q"},
      {"--attention-key", "main attention compressed keys"},
      {"--indices", "selected ids"},
      {"--sinks", "attention-sink logits"},
      {"--attention-scale", "teacher logit scale"},
      {"--loss-coeff", "loss coefficient"},
      {"--main-key-offset", "compact teacher bank offset"},
      {"--reference", "the plain reference"},
      // output
      {"--out", "output file"},
      {"--out-dir", "output folder"},
      {"--json", "JSON output"},
      {"--csv", "CSV output"},
      {"--svg", "SVG charts"},
      {"--all-batches", "simulate: every batch"},
  };
  return names;
}

// Spellings kept for scripts: accepted, never shown.
const std::vector<std::string>& hidden_names() {
  static const std::vector<std::string> names = {
      "--repeat",    "--seeds",       "--block",   "--target",      "--fragments", "--bandwidth",
      "--lpt-steps", "--index-heads", "--qr-rank", "--q-lora-rank", "--sweep"};
  return names;
}

// `text` without the values of its "plan_ms" fields (timings differ between runs).
std::string without_timings(std::string text) {
  const std::string key = "\"plan_ms\":";
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at)) {
    size_t end = at + key.size();
    while (end < text.size() &&
           std::string_view("0123456789.e+-").find(text[end]) != std::string_view::npos) {
      ++end;
    }
    text.erase(at, end - at);
  }
  return text;
}

// The commands `sparsecp --help` lists, with `bench`'s own.
std::vector<std::string> commands() {
  const auto help = run_tool("--help");
  EXPECT_EQ(help.status, 0) << help.err;
  std::vector<std::string> found;
  const size_t list = help.out.find("Subcommands:");
  EXPECT_NE(list, std::string::npos) << help.out;
  std::istringstream lines(list == std::string::npos ? "" : help.out.substr(list));
  std::string line;
  while (std::getline(lines, line)) {
    // "  name   description": two spaces, then a lower-case command name.
    if (line.size() < 3 || line.compare(0, 2, "  ") != 0 ||
        !std::islower(static_cast<unsigned char>(line[2]))) {
      continue;
    }
    size_t end = 2;
    while (end < line.size() && std::islower(static_cast<unsigned char>(line[end]))) ++end;
    if (end < line.size() && line[end] != ' ') continue;
    found.push_back(line.substr(2, end - 2));
  }
  EXPECT_GE(found.size(), 11u) << help.out;
  std::vector<std::string> all;
  for (const std::string& command : found) {
    if (command == "bench") {
      all.push_back("bench select");
      all.push_back("bench kl");
    } else {
      all.push_back(command);
    }
  }
  return all;
}

// Every long option name a command's --help shows ("--name" at the start of an entry,
// aliases after commas, flag defaults like {false} dropped).
std::set<std::string> option_names(const std::string& help) {
  std::set<std::string> names;
  std::istringstream lines(help);
  std::string line;
  const auto name_char = [](char c) {
    return std::islower(static_cast<unsigned char>(c)) ||
           std::isdigit(static_cast<unsigned char>(c)) || c == '-';
  };
  while (std::getline(lines, line)) {
    // An entry starts "  -": its first field (up to a space) lists the option's names.
    if (line.compare(0, 3, "  -") != 0) continue;
    const std::string field = line.substr(2, line.find(' ', 2) - 2);
    for (size_t at = field.find("--"); at != std::string::npos; at = field.find("--", at + 2)) {
      size_t end = at + 2;
      while (end < field.size() && name_char(field[end])) ++end;
      if (end > at + 2) names.insert(field.substr(at, end - at));
    }
  }
  return names;
}

TEST(OptionNames, EveryCommandUsesTheCanonicalNames) {
  std::map<std::string, std::vector<std::string>> users;  // name -> commands
  for (const std::string& command : commands()) {
    const auto help = run_tool(command + " --help");
    ASSERT_EQ(help.status, 0) << command << ": " << help.err;
    const std::set<std::string> names = option_names(help.out);
    EXPECT_GE(names.size(), 2u) << command << ":\n" << help.out;
    for (const std::string& name : names) {
      users[name].push_back(command);
      EXPECT_TRUE(canonical_names().count(name))
          << "sparsecp " << command << " --help shows " << name
          << ", which is not in the table of canonical option names (tests/cli/"
             "option_names_test.cpp): reuse a name with the same meaning, or add it";
    }
    for (const std::string& hidden : hidden_names()) {
      EXPECT_EQ(names.count(hidden), 0u)
          << "sparsecp " << command << " --help shows the old spelling " << hidden;
    }
  }
  // The shared options really are shared.
  for (const char* shared : {"--cp", "--seed", "--repeats", "--mode", "--block-size", "--topk"}) {
    EXPECT_GE(users[shared].size(), 3u) << shared;
  }
}

TEST(OptionNames, OldSpellingsStillWork) {
  struct Case {
    std::string old_form, canonical_form;
  };
  const std::vector<Case> cases = {
      {"route --tokens 4096 --cp 4 --mode greedy --all-ranks --repeat 2 --json",
       "route --tokens 4096 --cp 4 --mode greedy --all-ranks --repeats 2 --json"},
      {"plan --lengths 5000,300,2699,1 --cp 4 --mode greedy --block 500 --json",
       "plan --lengths 5000,300,2699,1 --cp 4 --mode greedy --block-size 500 --json"},
      {"plan --lengths 5000,300,2699,1 --cp 4 --mode spill --target 1.2 --fragments 2 --json",
       "plan --lengths 5000,300,2699,1 --cp 4 --mode spill --target-imbalance 1.2 "
       "--max-received-fragments 2 --json"},
      {"simulate --cp 4 --tokens 4096 --dist lognormal --seeds 1-2 --strategies zigzag --json",
       "simulate --cp 4 --tokens 4096 --dist lognormal --seed 1-2 --strategies zigzag --json"},
      {"simulate --cp 4 --tokens 4096 --seeds 1 --strategies zigzag --qr-rank 64 --json",
       "simulate --cp 4 --tokens 4096 --seed 1 --strategies zigzag --q-rank 64 --json"},
      {"dispatch --kind swa --tokens 4096 --sweep 2,4 --seeds 2 --json",
       "dispatch --kind swa --tokens 4096 --cp 2,4 --batches 2 --json"},
  };
  for (const Case& c : cases) {
    const auto old_run = run_tool(c.old_form);
    const auto new_run = run_tool(c.canonical_form);
    ASSERT_EQ(old_run.status, 0) << c.old_form << ": " << old_run.err;
    ASSERT_EQ(new_run.status, 0) << c.canonical_form << ": " << new_run.err;
    if (c.old_form.rfind("route", 0) == 0) continue;  // timings differ
    EXPECT_EQ(without_timings(old_run.out), without_timings(new_run.out)) << c.old_form;
  }
}

TEST(OptionNames, DispatchDefaultsToEightRanksLikeTheOthers) {
  const auto outcome = run_tool("dispatch --kind swa --tokens 65536 --json");
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  EXPECT_THAT(outcome.out, HasSubstr("\"cp\":8"));
}

TEST(OptionNames, TopLevelHelpWrapsEveryDescription) {
  const auto help = run_tool("--help");
  ASSERT_EQ(help.status, 0);
  std::istringstream lines(help.out);
  std::string line;
  while (std::getline(lines, line)) {
    EXPECT_LE(line.size(), 120u) << "a line of sparsecp --help is not wrapped:\n" << line;
  }
}

}  // namespace
