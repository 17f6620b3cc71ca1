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
#include <initializer_list>
#include <string>
#include <vector>

#include "progress.hpp"
#include "sparsecp/kernels/select.hpp"
#include "timing.hpp"

namespace sparsecp::cli {

// The parent `bench` command; every `bench <kernel>` registers under it.
CLI::App& bench_command(CLI::App& app);

// The run options every `bench <kernel>` shares, declared and checked in one place:
// threads, interleaved repeats, the size of the yardstick sgemm, and the data seed.
struct BenchRunFlags {
  int threads = 0;
  int64_t repeat = 3;
  int64_t sgemm_size = 2048;
  uint64_t seed = 1;

  void add_to(CLI::App& bench);
  // Throws Error naming a bad --repeats or --sgemm-size.
  void validate() const;
};

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
// Runs every path once per repeat, interleaved, recording wall times; `progress` (may be
// null) reports each repeat and the time left, at most once a second.
void time_interleaved(std::vector<TimedPath>& paths, int64_t repeats,
                      const Progress* progress = nullptr);

// A square N x N x N sgemm, as a TimedPath; its rate is sgemm_gflops(path, n).
TimedPath sgemm_path(int64_t n);
double sgemm_gflops(const TimedPath& path, int64_t n);

// The kernel OpenBLAS chose for this CPU (e.g. "SkylakeX", "Haswell", "Prescott").
// OpenBLAS picks it by CPU model and falls back to an old one (Prescott: SSE3) on CPUs it
// does not know, which makes its sgemm rate meaningless as a yardstick and slows the
// Index-Q projection; OPENBLAS_CORETYPE=SkylakeX (or Haswell) in the environment forces
// one. Every bench reports it.
std::string blas_core_name();

// "auto" / "portable" / "avx2" / "avx512" -> KernelIsa (every kernel has every ISA);
// Error naming the value otherwise.
KernelIsa parse_isa(const std::string& name);

// The ISAs a bench's --isa names, resolved: "all" is each ISA this CPU runs (portable,
// avx2, avx512), to be timed side by side in one run; "auto" is SPARSECP_ISA or the best
// the CPU has; an ISA the CPU lacks is an error naming it.
std::vector<KernelIsa> bench_isas(const std::string& name);
inline constexpr const char* kBenchIsaHelp =
    "Kernel ISA: auto (SPARSECP_ISA, else the best this CPU runs), portable, avx2, avx512, or "
    "all (each ISA this CPU runs, side by side in one run)";

}  // namespace sparsecp::cli
