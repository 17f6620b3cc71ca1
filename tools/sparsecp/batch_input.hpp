// sparsecp CLI: the packed batch a command works on, from flags, a file or a generator.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecp/planning/workload.hpp"

namespace sparsecp::cli {

// The one lengths-file format every command reads (`--lengths-file`): one packed batch
// per file, its document lengths in packed order as integers separated by commas, spaces
// and/or newlines; '#' starts a comment that runs to the end of its line. `sparsecp
// batch ... > batch.txt` writes one. Commands that take several batches (`simulate`,
// `spill`) take --lengths-file once per batch.
//
// Parses document lengths in that format. Throws Error naming the offending token (and
// `origin`, e.g. a file name).
std::vector<int64_t> parse_lengths(std::string_view text, std::string_view origin);

// Reads and parses a lengths file (see parse_lengths).
std::vector<int64_t> read_lengths_file(const std::string& path);

// Checks that the path given to `flag` (e.g. "--q") is not a directory: an Error naming
// the flag and the path ("--q d: is a directory, not a file"); a missing file is left to
// the reader's own "cannot open" message.
void check_input_file(const std::string& path, std::string_view flag);

// The format above in words, for the footer of every --help that takes --lengths-file.
std::string lengths_file_help();

// sum(lengths), checked: throws Error when it does not fit in 64 bits.
int64_t checked_total(std::span<const int64_t> lengths);

// Caps on counts a user can type (repeats, seeds, sweep sizes): beyond them a command
// fails at once instead of running for days.
inline constexpr int64_t kMaxRepeats = 10000;
inline constexpr int64_t kMaxSweepBatches = 100000;

// Throws Error unless 1 <= value <= kMaxRepeats, naming `option`.
void check_repeats(int64_t value, std::string_view option);

// "4,8,16" and, with `ranges`, "1-5" or "1-3,7": at most kMaxSweepBatches values.
// Throws Error naming `option` and the bad entry.
std::vector<int64_t> parse_integer_list(std::string_view text, std::string_view option,
                                        bool ranges);
// "a,b,c": non-empty names. Throws Error naming `option`.
std::vector<std::string> parse_name_list(std::string_view text, std::string_view option);

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
  // True for the generator's batch at its default size: no --lengths, --lengths-file or
  // --tokens on the command line (`run` may then shrink it to fit the machine).
  bool default_size() const;

  const CLI::Option* tokens_option = nullptr;  // set by add_to
};

// --cp (when `cp` is given) and --ratio, as `plan`, `route` and `run` declare them.
void add_cp_and_ratio(CLI::App& command, int64_t* cp, int64_t& ratio);

}  // namespace sparsecp::cli
