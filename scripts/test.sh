#!/usr/bin/env bash
# test.sh [BUILD_DIR] — builds mixkv and runs every test: the GPU suite (each test skips
# cleanly without a CUDA device) and the CPU suite. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bash scripts/build.sh "$build"
status=0
if [ -x "$build/tests/gpu_tests" ]; then
  echo "== GPU tests (skip without a device) =="
  "$build/tests/gpu_tests" --jobs 1 || status=1
fi
echo "== CPU tests =="
"$build/tests/cpu_tests" --jobs "$(nproc)" || status=1
exit $status
