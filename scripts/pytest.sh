#!/usr/bin/env bash
# The Python package's tests: a project-local virtual environment (.venv) with the pinned
# requirements of python/requirements-test.txt (torch from PyPI), `pip install .` of this
# checkout into it, then pytest (python/tests: gloo multi-rank tests, seed parity, kernels).
#
# Cached between runs: the environment is rebuilt only when the requirements file changes
# (stamp .venv/.requirements.sha256); the wheels it was made from stay in .cache/wheels
# (and pip's own cache in .cache/pip), so a rebuild downloads nothing already fetched; the
# extension's CMake build folder is build/python/<wheel tag> (passed to pip here: a plain
# `pip install .` builds in a temporary folder), so reinstalling recompiles only what changed.
#
#   scripts/pytest.sh [pytest args...]      e.g. scripts/pytest.sh -k golden
#   scripts/pytest.sh --venv-only           only make sure .venv is ready (scripts/test.sh runs
#                                           this in the background while the C++ builds)
# PYTHON=/usr/bin/python3 picks the interpreter the environment is made from (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
requirements=python/requirements-test.txt
export PIP_CACHE_DIR=$PWD/.cache/pip PIP_DISABLE_PIP_VERSION_CHECK=1
wanted=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$wanted" ]; then
  echo "pytest.sh: creating $venv from $requirements" >&2
  rm -rf "$venv"
  "${PYTHON:-python3}" -m venv "$venv"
  wheels=.cache/wheels
  mkdir -p "$wheels"
  if ! "$venv/bin/pip" install --quiet --no-index --find-links "$wheels" -r "$requirements" 2>/dev/null; then
    "$venv/bin/pip" download --quiet --dest "$wheels" -r "$requirements"
    "$venv/bin/pip" install --quiet --no-index --find-links "$wheels" -r "$requirements"
  fi
  echo "$wanted" > "$venv/.requirements.sha256"
fi
if [ "${1:-}" = "--venv-only" ]; then
  exit 0
fi
echo "pytest.sh: pip install . (build folder build/python)" >&2
start=$(date +%s)
"$venv/bin/pip" install --quiet --no-deps --no-build-isolation \
  --config-settings=build-dir="build/python/{wheel_tag}" .
echo "pytest.sh: installed in $(( $(date +%s) - start )) s" >&2
# 2 cores are shared by up to 4 ranks: one thread each. Every multi-rank task has its own
# timeout (python/tests/multirank.py); `timeout` bounds the whole run as a last resort.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1
exec timeout 1200 "$venv/bin/python" -m pytest -p no:cacheprovider -q -ra python/tests "$@"
