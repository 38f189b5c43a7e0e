#!/usr/bin/env bash
# gpu-build.sh [BUILD_DIR] — builds for the GPU machine (sm_90a, Release) into build-gpu/ and
# bundles the shared libraries that machine lacks (cJSON, Criterion and its dependencies) into
# BUILD_DIR/device-libs, then strips what need not travel. See docs/gpu-testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMIXKV_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null
cmake --build "$build" -j "$(nproc)"
bundle=../shared/device/bundle-libs.sh
if [ -x "$bundle" ]; then
  "$bundle" "$build"
else
  # The same job as shared/device/bundle-libs.sh, for checkouts without ../shared.
  mkdir -p "$build/device-libs"
  for f in "$build"/tests/gpu_tests "$build"/tests/cpu_tests "$build"/mixkv "$build"/bench_memmgr; do
    [ -x "$f" ] || continue
    ldd "$f" | awk '/=> \// {print $3}' | grep -E 'libcjson|libcriterion|libnanomsg|libgit2|libprotobuf-c|libboxfort|libffi' \
      | while read -r lib; do cp -L -u "$lib" "$build/device-libs/"; done
  done
fi
# Keep only what runs there: object files and CMake state stay here.
find "$build" -name '*.o' -delete
du -sh "$build" | awk '{print "gpu-build: " $2 " is " $1 " (carry it in the device call)"}'
