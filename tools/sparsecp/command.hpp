// sparsecp CLI: how subcommands join the tool.
//
// Each subcommand lives in its own cmd_<name>.cpp and registers itself with a
// file-scope `const sparsecp::cli::Registration`, so adding a command never edits
// main.cpp. Registration functions add a CLI11 subcommand and set its callback; the
// callback throws sparsecp::Error for bad input (main prints "error: ..." and exits
// with status 2) and may throw sparsecp::cli::ExitStatus to end with another status.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace sparsecp::cli {

using RegisterCommand = std::function<void(CLI::App& app)>;

// All registered commands, in registration order (sorted by name by main).
std::vector<std::pair<const char*, RegisterCommand>>& command_registry();

struct Registration {
  Registration(const char* name, RegisterCommand add) {
    command_registry().emplace_back(name, std::move(add));
  }
};

// Thrown by a command that wants the tool to exit with `status` after printing its
// own output (e.g. a verification that failed).
struct ExitStatus {
  int status;
};

// For unsigned 64-bit flags (seeds): CLI11 would wrap "-1" to 2^64 - 1 and saturate values
// past it, silently running with a seed the user did not give; accept decimal digits that
// fit in 64 bits only.
inline CLI::Validator unsigned_64_bit() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
          return "must be a non-negative integer, got '" + text + "'";
        }
        errno = 0;
        std::strtoull(text.c_str(), nullptr, 10);
        return errno == ERANGE ? "must be at most 2^64 - 1, got " + text : std::string();
      },
      "", "unsigned 64-bit");
}

// Old spellings of options, kept so that scripts keep working: CLI11 accepts every name
// of an option, and HelpFormatter leaves these out of --help. One name per meaning across
// commands (docs/guide/architecture.md "Vocabulary"; tests/cli/option_names_test.cpp holds the
// table).
inline std::set<std::string>& hidden_option_names() {
  static std::set<std::string> names;
  return names;
}

// CLI11's name list for an option: the canonical `name` first, then its hidden old
// spellings, e.g. names("--repeats", {"--repeat"}) == "--repeats,--repeat".
inline std::string names(const std::string& name, std::initializer_list<const char*> old) {
  std::string all = name;
  for (const char* alias : old) {
    hidden_option_names().insert(alias);
    all += std::string(",") + alias;
  }
  return all;
}

// CLI11's help, without the hidden old spellings of options.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* option, bool positional) const override {
    const std::string all = CLI::Formatter::make_option_name(option, positional);
    if (positional) return all;
    std::string shown;
    size_t begin = 0;
    while (begin < all.size()) {
      const size_t comma = std::min(all.find(',', begin), all.size());
      const std::string name = all.substr(begin, comma - begin);
      if (hidden_option_names().count(name.substr(0, name.find('{'))) == 0) {
        shown += (shown.empty() ? "" : ",") + name;
      }
      begin = comma + 1;
    }
    return shown;
  }
};

}  // namespace sparsecp::cli
