#!/usr/bin/env bash
# build.sh [BUILD_DIR] [extra cmake args...] — configures and builds mixkv (default: build/).
# CUDA is on when nvcc is present (default architecture sm_90a), off otherwise. MIXKV_WERROR=ON
# in the environment turns warnings into errors (CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
cuda=ON
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || cuda=OFF
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMIXKV_CUDA="$cuda" \
  -DMIXKV_WERROR="${MIXKV_WERROR:-OFF}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
