#!/usr/bin/env bash
# Every test: installs what is missing; runs the threaded kernel tests under
# ThreadSanitizer (scripts/tsan.sh); then builds with ASan+UBSan and -Werror and runs
# the whole CTest suite (unit, golden, property, multi-rank, fuzz smoke and packaging
# tests); then the Python package's tests (scripts/pytest.sh: a project-local .venv with
# torch, `pip install .`, pytest). The last line summarises both suites.
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
ctest_status=0
ctest --preset asan -j2 "$@" || ctest_status=$?
pytest_status=0
if wait "$venv_job"; then
  bash scripts/pytest.sh || pytest_status=$?
else
  pytest_status=$?
  cat build/python-venv.log
  echo "test.sh: making the Python test environment failed (log above)" >&2
fi
verdict() { if [ "$1" -eq 0 ]; then echo passed; else echo "FAILED (status $1)"; fi; }
echo "test.sh: CTest $(verdict $ctest_status); pytest $(verdict $pytest_status)"
exit $(( ctest_status != 0 || pytest_status != 0 ))
