// OpenBLAS's kernel family (blas_core.hpp).
#include "sparsecp/kernels/blas_core.hpp"

#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string_view>

namespace sparsecp {

std::string blas_core_name() { return openblas_get_corename(); }

const char* blas_core_for_this_cpu() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr ||
      std::getenv("SPARSECP_BLAS_AS_IS") != nullptr) {
    return nullptr;
  }
  const std::string core = blas_core_name();
  const std::string_view generic[] = {"Prescott", "prescott", "Core2",   "core2",
                                      "Penryn",   "Nehalem",  "nehalem", "Dunnington",
                                      "Atom",     "Unknown",  "unknown"};
  bool fallback = false;
  for (const std::string_view name : generic) fallback = fallback || core == name;
  if (!fallback) return nullptr;
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  // The instruction sets these families' kernels are written with: a CPU short of one (a VM
  // exposing AVX2 without FMA) keeps OpenBLAS's own choice.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

std::string use_cpu_blas_core() {
  const char* wanted = blas_core_for_this_cpu();
  if (wanted == nullptr) return blas_core_name();
  // Not in cblas.h: the entry points of OpenBLAS's DYNAMIC_ARCH builds that its own load-time
  // constructor and unload-time destructor call; "quit" forgets the choice, "init" makes it
  // again, reading OPENBLAS_CORETYPE.
  using Entry = void (*)();
  auto* quit = reinterpret_cast<Entry>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto* init = reinterpret_cast<Entry>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (quit == nullptr || init == nullptr) return blas_core_name();
  setenv("OPENBLAS_CORETYPE", wanted, 1);
  quit();
  init();
  return blas_core_name();
}

namespace {

std::mutex blas_threads_mutex;
int blas_guards = 0;         // guards alive
int blas_threads_saved = 1;  // OpenBLAS's thread count before the first of them

}  // namespace

// Only a pthread-threaded OpenBLAS (openblas_get_parallel() 1) fans a worker's call out: an
// OpenMP-threaded one stays on the calling thread inside a parallel region, and its
// openblas_set_num_threads would set the caller's OpenMP default; a serial one has no pool.
BlasSingleThreaded::BlasSingleThreaded() : active_(openblas_get_parallel() == 1) {
  if (!active_) return;
  const std::lock_guard<std::mutex> lock(blas_threads_mutex);
  if (blas_guards++ == 0) {
    blas_threads_saved = openblas_get_num_threads();
    if (blas_threads_saved != 1) openblas_set_num_threads(1);
  }
}

BlasSingleThreaded::~BlasSingleThreaded() {
  if (!active_) return;
  const std::lock_guard<std::mutex> lock(blas_threads_mutex);
  if (--blas_guards == 0 && blas_threads_saved != 1) openblas_set_num_threads(blas_threads_saved);
}

}  // namespace sparsecp
