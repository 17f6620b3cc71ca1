#!/usr/bin/env bash
# The threaded kernels (selection, indexer KL) under ThreadSanitizer: builds the `tsan` preset
# (build/tsan) with clang, only the kernel test programs, and runs them.
#
# OpenMP and TSan: GCC's libgomp is not TSan-instrumented, so its barriers are
# invisible to TSan and every parallel region reports false races. This script
# builds with clang, whose OpenMP runtime (libomp) tells TSan about its
# synchronisation through the Archer OMPT tool (libarcher.so, loaded via
# OMP_TOOL_LIBRARIES). OpenBLAS runs single-threaded (its own thread pool is not
# instrumented either); the kernels' own threads are all OpenMP. tsan.supp lists what
# is still suppressed and why.
#
#   scripts/tsan.sh [ctest args...]        e.g. scripts/tsan.sh -R Kernel
set -euo pipefail
cd "$(dirname "$0")/.."
tests=(select_kernel_test select_projection_test indexer_kl_test sparse_attention_test)
archer=$(clang++ -print-file-name=libarcher.so 2>/dev/null || true)
if [ ! -f "$archer" ]; then
  for candidate in /usr/lib/llvm-*/lib/libarcher.so; do archer=$candidate; done
fi
[ -f "$archer" ] || { echo "scripts/tsan.sh: libarcher.so (LLVM OpenMP) not found" >&2; exit 1; }

# Warnings as errors stay a g++ matter (the other presets); clang's differ.
cmake --preset tsan -DCMAKE_CXX_COMPILER=clang++ -DSPARSECP_WERROR=OFF >/dev/null
cmake --build --preset tsan --target "${tests[@]}"
export OMP_TOOL_LIBRARIES=$archer
export ARCHER_OPTIONS="verbose=0"
export OPENBLAS_NUM_THREADS=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1 suppressions=$PWD/tsan.supp ${TSAN_OPTIONS:-}"
status=0
for test in "${tests[@]}"; do
  echo "== $test (OMP_NUM_THREADS=$OMP_NUM_THREADS, archer: $archer)"
  start=$(date +%s)
  build/tsan/"$test" --gtest_brief=1 "$@" || status=1
  echo "== $test: $(( $(date +%s) - start )) s"
done
exit $status
