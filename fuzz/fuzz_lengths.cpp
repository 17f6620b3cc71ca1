// libFuzzer target: the CLI's document-lengths parser (tools/sparsecp/batch_input.cpp,
// used by --lengths and --lengths-file of every command).
//
// Any text must either parse or raise sparsecp::Error (never another exception, a
// crash or UB). Parsed lengths are non-empty and print back to text that parses to the
// same values (so what a user sees in a report is what was planned).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "batch_input.hpp"
#include "sparsecp/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int64_t> lengths;
  try {
    lengths = sparsecp::cli::parse_lengths(text, "fuzz");
  } catch (const sparsecp::Error&) {
    return 0;
  }
  if (lengths.empty()) {
    std::fprintf(stderr, "parse_lengths returned no lengths without an error\n");
    std::abort();
  }
  std::string printed;
  for (const int64_t length : lengths) printed += std::to_string(length) + ",";
  if (sparsecp::cli::parse_lengths(printed, "fuzz") != lengths) {
    std::fprintf(stderr, "lengths do not survive printing and parsing again\n");
    std::abort();
  }
  return 0;
}
