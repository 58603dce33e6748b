#!/usr/bin/env bash
# Installs ferry's build dependencies (Debian packages), fetches the cuDNN frontend's headers (pip,
# into <build dir>/_deps, reused when present; CMake looks there) and builds ferry into build/.
# Usage: scripts/setup.sh [extra cmake args...]
# Environment: FERRY_BUILD_DIR (default build), FERRY_SKIP_APT=1 to skip apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FERRY_BUILD_DIR:-build}

packages=(build-essential cmake ninja-build pkg-config git
  libopenblas-serial-dev libopenblas0-pthread libdnnl-dev liburing-dev libzstd-dev
  libcli11-dev nlohmann-json3-dev libpcre2-dev libicu-dev libfmt-dev libgtest-dev libgmock-dev
  fio python3 python3-venv python3-pip
  clang libclang-rt-14-dev)  # clang + its libFuzzer/sanitizer runtimes: scripts/fuzz.sh
if [[ "${FERRY_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

# The CUDA backend's attention needs them (headers only). Without pip or a network the build can
# still go on without CUDA; a CUDA configure then fails and names what is missing.
scripts/fetch_cudnn_frontend.sh "$build_dir/_deps" ||
  echo "setup: could not fetch the cuDNN frontend headers; CUDA builds need them" >&2

jobs=$(nproc)
cmake -S . -B "$build_dir" -G Ninja "$@" >/dev/null
cmake --build "$build_dir" -j "$jobs"
