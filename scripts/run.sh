#!/usr/bin/env bash
# run.sh — sets up, builds and runs mixkv's main job. Until `mixkv bench` arrives (issue 3),
# the main job is the memory-manager benchmark (bench_memmgr) at Llama-3-8B's KV shape, whose
# final cache state is then checked and summarised by `mixkv inspect`.
# Results: results/bench_memmgr.json, results/memmgr_dump.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
mkdir -p results
./build/bench_memmgr --json results/bench_memmgr.json --dump results/memmgr_dump.json "$@"
echo
./build/mixkv inspect results/memmgr_dump.json | head -n 40
echo
echo "results: results/bench_memmgr.json (benchmark), results/memmgr_dump.json (cache dump)"
