#include "bench_driver.hpp"

#include <cblas.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "batch_input.hpp"
#include "command.hpp"
#include "sparsecp/error.hpp"

namespace sparsecp::cli {

CLI::App& bench_command(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == "bench") return *sub;
  }
  CLI::App* bench = app.add_subcommand(
      "bench", "Time sparsecp's kernels on generated data (see 'sparsecp bench <kernel> --help')");
  bench->require_subcommand(1);
  return *bench;
}

void BenchRunFlags::add_to(CLI::App& bench) {
  bench.add_option("--threads", threads, "Threads (0 = OpenMP default)")->capture_default_str();
  bench
      .add_option(names("--repeats", {"--repeat"}), repeat,
                  "Repetitions, interleaved (at most 10000); medians are reported")
      ->capture_default_str();
  bench.add_option("--sgemm-size", sgemm_size, "N of the reference N x N x N sgemm")
      ->capture_default_str();
  bench.add_option("--seed", seed, "Seed of the generated data")
      ->check(unsigned_64_bit())
      ->capture_default_str();
}

void BenchRunFlags::validate() const {
  check_repeats(repeat, "--repeats");
  SPARSECP_CHECK(sgemm_size >= 1 && sgemm_size <= 65536,
                 "--sgemm-size must be within [1, 65536], got ", sgemm_size);
}

void time_interleaved(std::vector<TimedPath>& paths, int64_t repeats, const Progress* progress) {
  const double started = wall_seconds();
  for (int64_t i = 0; i < repeats; ++i) {
    for (size_t p = 0; p < paths.size(); ++p) {
      TimedPath& path = paths[p];
      if (progress != nullptr) {
        // Time left: the repeats done so far predict the rest.
        const double done =
            static_cast<double>(i) + static_cast<double>(p) / static_cast<double>(paths.size());
        const double left =
            done > 0 ? (wall_seconds() - started) * (static_cast<double>(repeats) - done) / done
                     : 0;
        progress->tick("repeat %lld of %lld: %s%s%s", static_cast<long long>(i + 1),
                       static_cast<long long>(repeats), path.name.c_str(),
                       done > 0 ? "; about " : "",
                       done > 0 ? (human_seconds(left) + " left").c_str() : "");
      }
      const double start = wall_seconds();
      path.run();
      path.seconds.push_back(wall_seconds() - start);
    }
  }
}

TimedPath sgemm_path(int64_t n) {
  auto buffers = std::make_shared<std::vector<float>>(static_cast<size_t>(3 * n * n), 0.5f);
  return {"sgemm", [buffers, n] {
            float* a = buffers->data();
            const int size = static_cast<int>(n);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, size, size, size, 1.0f, a, size,
                        a + n * n, size, 0.0f, a + 2 * n * n, size);
          }};
}

double sgemm_gflops(const TimedPath& path, int64_t n) {
  const double flops =
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  return flops / path.median_seconds() / 1e9;
}

std::string blas_core_name() { return openblas_get_corename(); }

KernelIsa parse_isa(const std::string& name) { return parse_kernel_isa(name, "--isa"); }

std::vector<KernelIsa> bench_isas(const std::string& name) {
  if (name == "all") {
    std::vector<KernelIsa> isas;
    for (const KernelIsa isa : {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
      if (kernel_isa_supported(isa)) isas.push_back(isa);
    }
    return isas;
  }
  const std::vector<std::string> known{"auto", "portable", "avx2", "avx512"};
  SPARSECP_CHECK(std::find(known.begin(), known.end(), name) != known.end(),
                 "--isa must be auto, portable, avx2, avx512 or all, got '", name, "'");
  return {resolve_kernel_isa(parse_isa(name))};
}

}  // namespace sparsecp::cli
