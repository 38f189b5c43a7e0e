#!/usr/bin/env bash
# gpu-run.sh [BUILD_DIR] — runs on the GPU machine (inside a device call): the GPU tests, then
# the benchmarks; logs and JSON under $OUT (or
# results/). Built beforehand here by scripts/gpu-build.sh.
set -uo pipefail
build=${1:-build-gpu}
out=${OUT:-results}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$build/device-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
status=0
"$build/tests/gpu_tests" --jobs 1 --verbose 2>&1 | tee "$out/gpu_tests.log" || status=1
if [ -x "$build/mixkv" ]; then
  "$build/mixkv" bench --quiet --json "$out/bench.json" | tee "$out/bench.txt"
fi
if [ -x "$build/bench_memmgr" ]; then
  "$build/bench_memmgr" --threads 1,4,8,16 --json "$out/bench_memmgr.json" | tee "$out/bench_memmgr.txt"
fi
exit $status
