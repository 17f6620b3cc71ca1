// sparsecp CLI: the packed batch a command works on, from flags, a file or a generator.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecp/planning/workload.hpp"

namespace sparsecp::cli {

// Parses document lengths: integers separated by commas and/or whitespace.
// Throws Error naming the offending token (and `origin`, e.g. a file name).
std::vector<int64_t> parse_lengths(std::string_view text, std::string_view origin);

// Reads and parses a lengths file (see parse_lengths).
std::vector<int64_t> read_lengths_file(const std::string& path);

// --lengths / --lengths-file / --dist / --tokens / --scale / --seed, shared by commands.
struct BatchOptions {
  std::string lengths;
  std::string lengths_file;
  std::string distribution = "lognormal";
  int64_t tokens = 1 << 20;
  int64_t scale = 0;
  uint64_t seed = 1;

  void add_to(CLI::App& command);
  // The batch: explicit lengths, else the file, else the generator (sized for `cp`).
  std::vector<int64_t> load(int64_t cp) const;
  // Where the batch came from, for report headers.
  std::string describe() const;
};

}  // namespace sparsecp::cli
