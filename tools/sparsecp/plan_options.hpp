// sparsecp CLI: the planning flags shared by `plan` and `route`.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "batch_input.hpp"
#include "sparsecp/planning/plan.hpp"

namespace sparsecp::cli {

struct PlanFlags {
  BatchOptions batch;
  int64_t cp = 8;
  int64_t ratio = 4;
  std::string mode;  // empty: command-specific default
  std::optional<int64_t> block_size;
  std::optional<int64_t> zigzag_min_length;

  void add_to(CLI::App& command, const std::string& mode_help);
  // Options for `mode` with the user's block size and hybrid threshold.
  PlanOptions options(Mode mode) const;
};

}  // namespace sparsecp::cli
