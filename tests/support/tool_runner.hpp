// Test helper: runs the built `sparsecp` tool and captures what a user would see.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>

namespace sparsecp::testing {

struct ToolRun {
  int status = -1;  // exit status; -1 if the tool did not exit normally
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `SPARSECP_CLI_PATH <arguments>` through the shell (so quoting works as typed),
// with `environment` (e.g. "SPARSECP_ERROR_DETAIL=1") set for the tool.
inline ToolRun run_tool(const std::string& arguments, const std::string& environment = "") {
  // One stderr file per process and test: CTest runs tests of one program in parallel.
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = test ? test->name() : "none";
  std::replace(name.begin(), name.end(), '/', '_');  // parameterised tests: "Suite/Case"
  const std::string err_path =
      ::testing::TempDir() + "sparsecp_tool_" + std::to_string(getpid()) + "_" + name + ".stderr";
  // One thread: CTest runs tests in parallel on few cores; nothing reads stdin.
  const std::string command = "OMP_NUM_THREADS=1 " + environment + " " + SPARSECP_CLI_PATH + " " +
                              arguments + " 2>" + err_path + " </dev/null";
  ToolRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return run;
  std::array<char, 4096> buffer{};
  size_t read = 0;
  while ((read = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    run.out.append(buffer.data(), read);
  const int status = pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  run.err.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  std::remove(err_path.c_str());
  return run;
}

// Runs a shell command as typed (its own redirections kept); returns (exit status, stdout).
inline std::pair<int, std::string> run_shell(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  if (!pipe) return {-1, ""};
  std::string out;
  std::array<char, 4096> buffer{};
  size_t read = 0;
  while ((read = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) out.append(buffer.data(), read);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace sparsecp::testing
