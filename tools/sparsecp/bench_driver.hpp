// sparsecp CLI: the shared driver of the `bench <kernel>` commands (the nccl-tests
// habit: every benchmark times its paths the same way and reports the same figures).
//
// Paths are timed interleaved — path 1, path 2, ..., then again — so that a drift in the
// machine's load hits every path alike, and each reports the median of its repeats with
// its spread. Every benchmark also times the machine's own BLAS sgemm in the same loop,
// so that rates can be given as a fraction of what this machine's matrix multiply does
// right now (ratios measured side by side, not against a figure from another day).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sparsecp/kernels/select.hpp"
#include "timing.hpp"

namespace sparsecp::cli {

// The parent `bench` command; every `bench <kernel>` registers under it.
CLI::App& bench_command(CLI::App& app);

// One timed path of a benchmark.
struct TimedPath {
  TimedPath(std::string path_name, std::function<void()> work)
      : name(std::move(path_name)), run(std::move(work)) {}
  std::string name;
  std::function<void()> run;
  std::vector<double> seconds;  // wall time of each repeat
  Spread spread() const { return Spread::of(seconds); }
  double median_seconds() const { return spread().median; }
};

// Runs every path `repeats` times, interleaved (see above).
void time_interleaved(std::vector<TimedPath>& paths, int64_t repeats);

// A square N x N x N sgemm, as a TimedPath; its rate is sgemm_gflops(path, n).
TimedPath sgemm_path(int64_t n);
double sgemm_gflops(const TimedPath& path, int64_t n);

// "auto" / "portable" / "avx2" / "avx512" -> KernelIsa; Error naming the value otherwise.
KernelIsa parse_isa(const std::string& name);

}  // namespace sparsecp::cli
