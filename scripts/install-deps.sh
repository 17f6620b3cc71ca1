#!/usr/bin/env bash
# Installs, from Debian 12's packages, whatever the build and tests need and is missing.
# Safe to run repeatedly: it only calls apt-get when a package is not installed.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git
  libopenmpi-dev openmpi-bin          # the distributed engine (MPI)
  libopenblas-dev                     # BLAS for the Index-Q projection
  libdnnl-dev                         # oneDNN: the attention kernel's products (AMX, AVX512_BF16)
  libcli11-dev nlohmann-json3-dev     # command line and JSON
  libgtest-dev libgmock-dev libbenchmark-dev   # tests and benchmarks
  python3                             # test-data checks and seed comparisons
  python3-venv python3-dev            # the Python package: its test environment and extension
  clang libomp-14-dev libclang-rt-14-dev       # fuzzing (libFuzzer) and TSan with OpenMP (Archer)
)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
