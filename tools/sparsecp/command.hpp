// sparsecp CLI: how subcommands join the tool.
//
// Each subcommand lives in its own cmd_<name>.cpp and registers itself with a
// file-scope `const sparsecp::cli::Registration`, so adding a command never edits
// main.cpp. Registration functions add a CLI11 subcommand and set its callback; the
// callback throws sparsecp::Error for bad input (main prints "error: ..." and exits
// with status 2) and may throw sparsecp::cli::ExitStatus to end with another status.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
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

// The `bench` parent command, created by the first `bench <kernel>` registration that
// asks for it: each kernel's file registers its own `sparsecp bench <kernel>` under it.
inline CLI::App* bench_command(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == "bench") return sub;
  }
  CLI::App* bench = app.add_subcommand(
      "bench", "Time sparsecp's kernels on generated data (see 'sparsecp bench <kernel> --help')");
  bench->require_subcommand(1);
  return bench;
}

}  // namespace sparsecp::cli
