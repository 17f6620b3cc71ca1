// sparsecp CLI: the batches of a sweep (`simulate`, `spill`), from flags.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "sparsecp/planning/simulate.hpp"

namespace sparsecp::cli {

// The batches of a sweep (`simulate`, `spill`): --lengths (one batch), --lengths-file
// (one batch per file, repeatable), else generated batches for every --dist x --seed,
// each sized --tokens for its CP size; and the CP sizes --cp.
struct SweepOptions {
  std::string lengths;
  std::vector<std::string> lengths_files;
  std::string cps;
  std::string distributions;
  std::string seeds;
  int64_t tokens = 1 << 20;
  int64_t scale = 0;

  // Declares the options with the given defaults.
  void add_to(CLI::App& command, std::string default_cps, std::string default_distributions,
              std::string default_seeds);

  // The sweep as the library's SweepSpec (planning/simulate.hpp) without strategies:
  // CP sizes and either the given batches (named "--lengths" or by their file) or the
  // generator settings. Throws Error naming a bad option (an unparsable list, more than
  // kMaxSweepBatches batches, an unreadable file).
  SweepSpec spec() const;
  // The given batches (--lengths or files) or empty when the sweep generates them.
  bool given() const { return !lengths.empty() || !lengths_files.empty(); }
};

}  // namespace sparsecp::cli
