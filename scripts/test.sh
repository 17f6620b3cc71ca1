#!/usr/bin/env bash
# Every test: installs what is missing; runs the threaded kernel tests under
# ThreadSanitizer (scripts/tsan.sh); then builds with ASan+UBSan and -Werror and runs
# the whole CTest suite (unit, golden, property, multi-rank, fuzz smoke and packaging
# tests) and, at the same time, the Python package's tests (scripts/pytest.sh: a
# project-local .venv with torch, `pip install .`, pytest). The last line summarises both.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# The Python test environment downloads while the C++ builds compile (network vs CPU).
mkdir -p build
bash scripts/pytest.sh --venv-only > build/python-venv.log 2>&1 &
venv_job=$!
# If a step below fails, stop the environment job (and its pip) instead of leaving it behind.
trap 'if kill -0 "$venv_job" 2>/dev/null; then pkill -TERM -P "$venv_job" || true; kill "$venv_job" || true; fi' EXIT
bash scripts/tsan.sh
cmake --preset asan >/dev/null
cmake --build --preset asan
# CTest and the Python suite run at once: each alone leaves a core idle much of the time (CTest's
# long single tests at the end of its -j2 run: fuzz_smoke, package_consumer; pytest's
# one-process tests), and together they took about a quarter less wall time than one after the
# other (docs/RESULTS.md, "The test command's time"). CTest's output goes to build/ctest.log,
# printed whole when it ends, so the two runners' lines do not interleave.
echo "test.sh: CTest runs beside pytest; its output follows pytest's (build/ctest.log)" >&2
ctest --preset asan -j2 "$@" > build/ctest.log 2>&1 &
ctest_job=$!
trap 'for job in "$venv_job" "$ctest_job"; do if kill -0 "$job" 2>/dev/null; then pkill -TERM -P "$job" || true; kill "$job" || true; fi; done' EXIT
pytest_status=0
if wait "$venv_job"; then
  bash scripts/pytest.sh || pytest_status=$?
else
  pytest_status=$?
  cat build/python-venv.log
  echo "test.sh: making the Python test environment failed (log above)" >&2
fi
ctest_status=0
wait "$ctest_job" || ctest_status=$?
cat build/ctest.log
verdict() { if [ "$1" -eq 0 ]; then echo passed; else echo "FAILED (status $1)"; fi; }
echo "test.sh: CTest $(verdict $ctest_status); pytest $(verdict $pytest_status)"
exit $(( ctest_status != 0 || pytest_status != 0 ))
