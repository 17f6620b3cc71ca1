#!/usr/bin/env bash
# Every test: installs what is missing; runs the threaded kernel tests under
# ThreadSanitizer (scripts/tsan.sh); then builds with ASan+UBSan and -Werror and runs
# the whole CTest suite (unit, golden, property, multi-rank, fuzz smoke and packaging
# tests); then the Python package's tests (scripts/pytest.sh: a project-local .venv with
# torch, `pip install .`, pytest). The last line summarises both suites.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/tsan.sh
cmake --preset asan >/dev/null
cmake --build --preset asan
ctest_status=0
ctest --preset asan -j2 "$@" || ctest_status=$?
pytest_status=0
bash scripts/pytest.sh || pytest_status=$?
verdict() { if [ "$1" -eq 0 ]; then echo passed; else echo "FAILED (status $1)"; fi; }
echo "test.sh: CTest $(verdict $ctest_status); pytest $(verdict $pytest_status)"
exit $(( ctest_status != 0 || pytest_status != 0 ))
