#!/usr/bin/env bash
# The main job on its built-in default workload: installs what is missing, builds the
# optimised tool, and runs it. Extra arguments go to the tool.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target sparsecp_cli
if [ "$#" -eq 0 ]; then set -- plan; fi
exec ./build/release/sparsecp "$@"
