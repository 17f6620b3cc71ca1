#include "batch_input.hpp"

#include <cerrno>
#include <charconv>
#include <fstream>
#include <sstream>

#include "sparsecp/error.hpp"

namespace sparsecp::cli {

namespace {

// A token as it can appear in a one-line error message: control and non-ASCII bytes as
// \xHH (a NUL would otherwise end the message), at most 40 bytes shown.
std::string printable(std::string_view token) {
  std::string text;
  for (const char c : token.substr(0, 40)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      text += c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      text += {'\\', 'x', kHex[byte >> 4], kHex[byte & 15]};
    }
  }
  return token.size() > 40 ? text + "..." : text;
}

}  // namespace

std::vector<int64_t> parse_lengths(std::string_view text, std::string_view origin) {
  std::vector<int64_t> lengths;
  size_t position = 0;
  const auto separator = [](char c) {
    return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r';
  };
  while (position < text.size()) {
    while (position < text.size() && separator(text[position])) ++position;
    if (position == text.size()) break;
    size_t end = position;
    while (end < text.size() && !separator(text[end])) ++end;
    const std::string_view token = text.substr(position, end - position);
    int64_t value = 0;
    const auto [stop, status] = std::from_chars(token.data(), token.data() + token.size(), value);
    SPARSECP_CHECK(status != std::errc::result_out_of_range, origin, ": document length '",
                   printable(token), "' (entry ", lengths.size() + 1, ") does not fit in 64 bits");
    SPARSECP_CHECK(status == std::errc() && stop == token.data() + token.size(), origin,
                   ": document length '", printable(token), "' (entry ", lengths.size() + 1,
                   ") is not an integer");
    lengths.push_back(value);
    position = end;
  }
  SPARSECP_CHECK(!lengths.empty(), origin, ": no document lengths given");
  return lengths;
}

std::vector<int64_t> read_lengths_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  SPARSECP_CHECK(file.good(), "cannot open lengths file '", path, "'");
  std::ostringstream text;
  text << file.rdbuf();
  return parse_lengths(text.str(), path);
}

void BatchOptions::add_to(CLI::App& command) {
  auto* explicit_lengths = command.add_option(
      "--lengths", lengths,
      "Document lengths in packed order, separated by commas and/or spaces, e.g. 5000,300,2699,1");
  auto* file = command.add_option("--lengths-file", lengths_file,
                                  "File of document lengths (integers separated by commas and/or "
                                  "whitespace)");
  explicit_lengths->excludes(file);
  // An explicit but empty list must not fall back to the generated batch.
  explicit_lengths->check(CLI::Validator(
      [](std::string& text) {
        return text.find_first_not_of(", \t\n\r") == std::string::npos
                   ? std::string("no document lengths given")
                   : std::string();
      },
      "", "non-empty"));
  command
      .add_option("--dist", distribution,
                  "Generated batch when no lengths are given: fixed, uniform, lognormal, "
                  "pareto, bimodal or mixture")
      ->capture_default_str();
  command.add_option("--tokens", tokens, "Generated batch: total tokens (a multiple of --cp)")
      ->capture_default_str();
  command
      .add_option("--scale", scale,
                  "Generated batch: typical document length (lognormal: the median); 0 = a "
                  "quarter of the local shard")
      ->capture_default_str();
  command.add_option("--seed", seed, "Generated batch: random seed")->capture_default_str();
}

std::vector<int64_t> BatchOptions::load(int64_t cp) const {
  if (!lengths.empty()) return parse_lengths(lengths, "--lengths");
  if (!lengths_file.empty()) return read_lengths_file(lengths_file);
  WorkloadSpec spec;
  spec.distribution = distribution;
  spec.tokens = tokens;
  spec.scale = scale;
  spec.cp = cp;
  spec.seed = seed;
  return generate_batch(spec);
}

std::string BatchOptions::describe() const {
  if (!lengths.empty()) return "--lengths";
  if (!lengths_file.empty()) return lengths_file;
  std::ostringstream text;
  text << distribution << " batch of " << tokens << " tokens, seed " << seed;
  return text.str();
}

}  // namespace sparsecp::cli
