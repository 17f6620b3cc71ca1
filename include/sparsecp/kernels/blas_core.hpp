// The OpenBLAS kernel family in use, and the way onto the CPU's own where OpenBLAS fell back.
//
// OpenBLAS (a DYNAMIC_ARCH build, as Debian's) picks its kernels by CPU model when it loads. On a
// CPU newer than it knows (Debian 12's 0.3.21 on recent Xeons) it falls back to its oldest x86-64
// family (Prescott, SSE3), and every sgemm in sparsecp (the fp32 selection's scores, the Index-Q
// projection, the float32 attention's BLAS products) runs several times slower than the CPU
// allows. OPENBLAS_CORETYPE names a family instead, but OpenBLAS reads it only at its own
// initialisation: the command-line tool sets it and executes itself again; the Python module,
// which cannot, asks OpenBLAS to choose again in the process (use_cpu_blas_core).
#pragma once

#include <string>

namespace sparsecp {

// openblas_get_corename(): "SkylakeX", "Haswell", "Prescott", ...
std::string blas_core_name();

// The family to ask for when OpenBLAS runs a generic one (Prescott, Core2, Nehalem, ... or
// "unknown") on a CPU with AVX-512 F, BW, DQ and VL ("SkylakeX") or AVX2 with FMA ("Haswell");
// nullptr when its choice
// stands, or when OPENBLAS_CORETYPE or SPARSECP_BLAS_AS_IS (a user's choice) is set.
const char* blas_core_for_this_cpu();

// Where blas_core_for_this_cpu() names a family: sets OPENBLAS_CORETYPE to it and re-runs
// OpenBLAS's dynamic-architecture selection in this process (its gotoblas_dynamic_quit and
// gotoblas_dynamic_init, found at run time). Call it before any BLAS call is in flight (at
// load: between OpenBLAS's two steps it has no kernels, and setenv races other threads' getenv).
// Returns the family in use afterwards; unchanged where the build has no such entry
// points. Results never change beyond the last bits of sums: only the kernels do.
std::string use_cpu_blas_core();

// While one lives, OpenBLAS runs each call on its calling thread only. The kernels' OpenMP
// workers call the BLAS for their own blocks; an OpenMP-threaded OpenBLAS sees them "in
// parallel" and stays on one thread, but Debian's default build is pthread-threaded and would
// fan every worker's product out over its own pool: with 2 workers on 2 cores the bf16
// attention ran slower than on one (28-58 against 55-76 GFLOP/s, AMD EPYC, AVX2), and a "one
// thread" call used every core. OpenBLAS's thread count is process-wide: the first guard alive sets
// it to 1, the last one gone restores it (a count under a mutex, so concurrent kernel calls nest);
// other callers of the same OpenBLAS run on one thread meanwhile. Only a pthread-threaded OpenBLAS
// is touched (openblas_get_parallel() == 1); with an OpenMP-threaded or serial one a guard does
// nothing.
class BlasSingleThreaded {
 public:
  BlasSingleThreaded();
  ~BlasSingleThreaded();
  BlasSingleThreaded(const BlasSingleThreaded&) = delete;
  BlasSingleThreaded& operator=(const BlasSingleThreaded&) = delete;

 private:
  bool active_;
};

}  // namespace sparsecp
