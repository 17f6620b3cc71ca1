#include "batch_input.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "command.hpp"
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
    if (text[position] == '#') {  // a comment: skip to the end of its line
      position = std::min(text.size(), text.find('\n', position));
      continue;
    }
    size_t end = position;
    while (end < text.size() && !separator(text[end]) && text[end] != '#') ++end;
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

void check_input_file(const std::string& path, std::string_view flag) {
  std::error_code error;  // a missing file is reported by the reader ("cannot open")
  const auto status = std::filesystem::status(path, error);
  SPARSECP_CHECK(status.type() != std::filesystem::file_type::directory, flag, " ", path,
                 ": is a directory, not a file");
}

std::vector<int64_t> read_lengths_file(const std::string& path) {
  check_input_file(path, "--lengths-file");
  std::ifstream file(path, std::ios::binary);
  SPARSECP_CHECK(file.good(), "cannot open lengths file '", path, "'");
  std::ostringstream text;
  text << file.rdbuf();
  return parse_lengths(text.str(), path);
}

std::string lengths_file_help() {
  return "Lengths file (--lengths-file): one packed batch per file, its document lengths in "
         "packed order\nseparated by commas, spaces or newlines; '#' starts a comment. "
         "'sparsecp batch ... > batch.txt' writes one.";
}

int64_t checked_total(std::span<const int64_t> lengths) {
  int64_t total = 0;
  for (const int64_t length : lengths) {
    SPARSECP_CHECK(!__builtin_add_overflow(total, length, &total),
                   "Indexer balance document lengths sum beyond 64 bits (document of ", length,
                   " tokens)");
  }
  return total;
}

void check_repeats(int64_t value, std::string_view option) {
  SPARSECP_CHECK(value >= 1 && value <= kMaxRepeats, option, " must be within [1, ", kMaxRepeats,
                 "], got ", value);
}

namespace {

int64_t parse_integer(std::string_view token, std::string_view option) {
  int64_t value = 0;
  const auto [stop, status] = std::from_chars(token.data(), token.data() + token.size(), value);
  SPARSECP_CHECK(!token.empty() && status == std::errc() && stop == token.data() + token.size(),
                 option, ": '", printable(token), "' is not an integer");
  return value;
}

}  // namespace

std::vector<int64_t> parse_integer_list(std::string_view text, std::string_view option,
                                        bool ranges) {
  std::vector<int64_t> values;
  for (const std::string& item : parse_name_list(text, option)) {
    const size_t dash = ranges ? item.find('-', 1) : std::string::npos;
    if (dash == std::string::npos) {
      values.push_back(parse_integer(item, option));
    } else {
      const int64_t first = parse_integer(std::string_view(item).substr(0, dash), option);
      const int64_t last = parse_integer(std::string_view(item).substr(dash + 1), option);
      SPARSECP_CHECK(first <= last && last - first < kMaxSweepBatches, option, ": bad range '",
                     printable(item), "' (at most ", kMaxSweepBatches, " values)");
      for (int64_t value = first; value <= last; ++value) values.push_back(value);
    }
    SPARSECP_CHECK(static_cast<int64_t>(values.size()) <= kMaxSweepBatches, option, ": more than ",
                   kMaxSweepBatches, " values");
  }
  return values;
}

std::vector<std::string> parse_name_list(std::string_view text, std::string_view option) {
  std::vector<std::string> names;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    SPARSECP_CHECK(comma > begin, option, ": empty entry in '", printable(text), "'");
    names.emplace_back(text.substr(begin, comma - begin));
    begin = comma + 1;
  }
  return names;
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
  tokens_option =
      command.add_option("--tokens", tokens, "Generated batch: total tokens (a multiple of --cp)")
          ->capture_default_str();
  command
      .add_option("--scale", scale,
                  "Generated batch: typical document length (lognormal: the median); 0 = a "
                  "quarter of the local shard")
      ->capture_default_str();
  command.add_option("--seed", seed, "Generated batch: random seed")
      ->check(unsigned_64_bit())
      ->capture_default_str();
}

void add_cp_and_ratio(CLI::App& command, int64_t* cp, int64_t& ratio) {
  if (cp != nullptr) {
    command.add_option("--cp", *cp, "CP group size (ranks); the batch's tokens must divide by it")
        ->capture_default_str();
  }
  command.add_option("--ratio", ratio, "Key compression ratio of the indexer layer")
      ->capture_default_str();
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

bool BatchOptions::default_size() const {
  return lengths.empty() && lengths_file.empty() &&
         (tokens_option == nullptr || tokens_option->count() == 0);
}

std::string BatchOptions::describe() const {
  if (!lengths.empty()) return "--lengths";
  if (!lengths_file.empty()) return lengths_file;
  std::ostringstream text;
  text << distribution << " batch of " << tokens << " tokens, seed " << seed;
  return text.str();
}

}  // namespace sparsecp::cli
