#!/usr/bin/env bash
# The Python package's tests: a project-local virtual environment (.venv) with the pinned
# requirements of python/requirements-test.txt (torch from PyPI), `pip install .` of this
# checkout into it, then pytest (python/tests: gloo multi-rank tests, seed parity, kernels),
# then ruff and mypy over the Python tree (pyproject.toml [tool.ruff], [tool.mypy]): a test
# failure or a lint or type finding fails the command.
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
#   scripts/pytest.sh --lint-only           only ruff and mypy (seconds; no install, no tests)
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
# ruff over the whole tree, mypy over python/sparsecp (both configured in pyproject.toml).
lint() {
  echo "pytest.sh: ruff check, mypy" >&2
  local failed=0
  "$venv/bin/ruff" check --quiet . || failed=1
  "$venv/bin/mypy" --no-error-summary || failed=1
  return "$failed"
}
if [ "${1:-}" = "--lint-only" ]; then
  lint
  exit
fi
echo "pytest.sh: pip install . (build folder build/python)" >&2
start=$(date +%s)
"$venv/bin/pip" install --quiet --no-deps --no-build-isolation \
  --config-settings=build-dir="build/python/{wheel_tag}" .
echo "pytest.sh: installed in $(( $(date +%s) - start )) s" >&2
# 2 cores are shared by up to 4 ranks: one thread each. Every multi-rank task has its own
# timeout (python/tests/multirank.py); `timeout` bounds the whole run as a last resort.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1
status=0
timeout 1200 "$venv/bin/python" -m pytest -p no:cacheprovider -q -ra python/tests "$@" || status=$?
lint || status=$((status ? status : 1))
exit "$status"
