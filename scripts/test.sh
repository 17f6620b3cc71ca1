#!/usr/bin/env bash
# Every test: installs what is missing, builds with ASan+UBSan and -Werror, and runs
# the whole CTest suite (unit, golden, property, multi-rank and packaging tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset asan >/dev/null
cmake --build --preset asan
ctest --preset asan -j2 "$@"
