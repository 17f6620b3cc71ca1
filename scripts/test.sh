#!/usr/bin/env bash
# Every test: installs what is missing; runs the threaded kernel tests under
# ThreadSanitizer (scripts/tsan.sh); then builds with ASan+UBSan and -Werror and runs
# the whole CTest suite (unit, golden, property, multi-rank, fuzz smoke and packaging
# tests). CTest runs last so its summary closes the output.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/tsan.sh
cmake --preset asan >/dev/null
cmake --build --preset asan
ctest --preset asan -j2 "$@"
