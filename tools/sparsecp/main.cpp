// sparsecp: command-line tool. Subcommands register themselves (see command.hpp).
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "command.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/blas_core.hpp"

namespace sparsecp::cli {
std::vector<std::pair<const char*, RegisterCommand>>& command_registry() {
  static std::vector<std::pair<const char*, RegisterCommand>> registry;
  return registry;
}
}  // namespace sparsecp::cli

namespace {

// OpenBLAS picks its kernels by CPU model when it loads, and on a CPU newer than it
// knows (Debian 12's 0.3.21 on recent Xeons) it falls back to its oldest x86-64 kernel
// (Prescott, SSE3): sgemm, and with it the Index-Q projection, runs several times slower
// than the CPU allows. The choice is made before main() and can only be overridden by
// OPENBLAS_CORETYPE in the environment, so in that case the tool sets it to the newest
// kernel family the CPU supports (SkylakeX for AVX-512, Haswell for AVX2) and executes
// itself again, once. A user's own OPENBLAS_CORETYPE, or SPARSECP_BLAS_AS_IS=1, is
// left alone. Results never change: the kernels give the same sums (fp32 accumulation,
// exact on the tool's seeded inputs), only faster.
void use_the_cpus_blas_kernels(char** argv) {
  const char* wanted = sparsecp::blas_core_for_this_cpu();
  if (wanted == nullptr) return;
  setenv("OPENBLAS_CORETYPE", wanted, 1);
  setenv("SPARSECP_BLAS_AS_IS", "1", 1);  // never loop
  execv("/proc/self/exe", argv);          // returns only on failure: carry on as we are
}

}  // namespace

int main(int argc, char** argv) {
  use_the_cpus_blas_kernels(argv);
  // Routes and selection buffers are megabytes each and rebuilt every step. Keep freed
  // memory in the heap, as a long-running training process does, instead of returning
  // it to the kernel and faulting it back in: measured on `route --all-ranks`, the page
  // faults otherwise cost ~10x the route building itself (docs/RESULTS.md).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  CLI::App app{
      "sparsecp: context-parallel load balancing for DeepSeek-style compressed sparse attention.\n"
      "Plans which CP rank runs the Lightning Indexer's top-k selection for which query rows of a\n"
      "packed batch, routes the rows between ranks, and runs the selection.\n"
      "Run 'sparsecp <command> --help' for a command's options and examples.",
      "sparsecp"};
  app.footer(
      "Errors: invalid input prints one line 'error: <message>' and exits with status 2.\n"
      "Set SPARSECP_ERROR_DETAIL=1 to also print the error's kind and source location.\n"
      "OpenBLAS: on a CPU newer than the installed OpenBLAS knows, the tool sets\n"
      "OPENBLAS_CORETYPE to SkylakeX (AVX-512) or Haswell (AVX2) and restarts itself, since\n"
      "OpenBLAS would otherwise use its SSE3 kernels; SPARSECP_BLAS_AS_IS=1 turns this off.");
  app.formatter(std::make_shared<sparsecp::cli::HelpFormatter>());  // hides old option names
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show the help of every command");
  auto& registry = sparsecp::cli::command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const auto& a, const auto& b) { return std::strcmp(a.first, b.first) < 0; });
  for (auto& [name, add] : registry) add(app);
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(registry.begin(), registry.end(),
                   [&](const auto& entry) { return std::strcmp(entry.first, argv[1]) == 0; })) {
    std::string names;
    for (const auto& entry : registry)
      names += std::string(names.empty() ? "" : ", ") + entry.first;
    std::fprintf(stderr, "error: unknown command '%s' (commands: %s)\n", argv[1], names.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (run 'sparsecp --help' for usage)\n", e.what());
    return 2;
  } catch (const sparsecp::cli::ExitStatus& e) {
    return e.status;
  } catch (const sparsecp::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    // Debug detail (kind, source file and line) only on request: the user's message
    // stays one line.
    if (const char* detail = std::getenv("SPARSECP_ERROR_DETAIL");
        detail && *detail && *detail != '0') {
      std::fprintf(stderr, "error detail: %s\n", e.detail().c_str());
    }
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
