#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (fuzz/CMakeLists.txt) and runs each for a
# bounded time, starting from the committed seed corpus fuzz/corpus/<target>.
#
#   fuzz/run.sh [SECONDS] [TARGET...]        default: 20 s for every target
#
# Environment: FUZZ_CXX (default clang++), FUZZ_BUILD_DIR (default build/fuzz), FUZZ_WORK_DIR (where new corpus
# entries and crash files go; default a fresh temporary directory), FUZZ_JOBS
# (parallel build jobs, default 2). The committed corpus is only read; to keep what a
# long run found, merge it back (see fuzz/README.md). Prints one line per target:
# executions, corpus size, coverage, and exits non-zero if any target crashed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
seconds=${1:-20}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz_plan fuzz_strategies fuzz_kv_routes fuzz_lengths fuzz_npy fuzz_segments)
build=${FUZZ_BUILD_DIR:-$root/build/fuzz}
work=${FUZZ_WORK_DIR:-$(mktemp -d)}
cxx=${FUZZ_CXX:-clang++}
command -v "$cxx" >/dev/null || { echo "fuzz/run.sh: $cxx not found" >&2; exit 1; }

if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  CXX=$cxx cmake -S "$here" -B "$build" "${generator[@]}" >/dev/null
fi
cmake --build "$build" -j "${FUZZ_JOBS:-2}" --target "${targets[@]}" >/dev/null

failed=0
for target in "${targets[@]}"; do
  rm -rf "$work/$target/artifacts"
  mkdir -p "$work/$target/corpus" "$work/$target/artifacts"
  log="$work/$target/log.txt"
  status=0
  (cd "$work/$target" && "$build/$target" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/$target/artifacts/" \
      "$work/$target/corpus" $( [ -d "$here/corpus/$target" ] && echo "$here/corpus/$target") \
      >"$log" 2>&1) || status=$?
  executions=$(awk '/stat::number_of_executed_units/ {print $2}' "$log" || true)
  summary=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 | sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+)\/([^ ]+).*/cov \1, features \2, corpus \3 inputs (\4)/' || true)
  crashes=$(find "$work/$target/artifacts" -type f | wc -l)
  printf '%-16s %4ss: %10s executions, %s, %d crash files\n' "$target" "$seconds" \
      "${executions:-?}" "${summary:-no summary}" "$crashes"
  if [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=1
    echo "---- $target failed (status $status); log $log" >&2
    grep -E 'ERROR|invariant|runtime error|SUMMARY' "$log" | head -5 >&2 || true
  fi
done
echo "work directory: $work"
exit $failed
