#!/usr/bin/env bash
# run.sh [mixkv bench options] — sets up, builds and runs mixkv's main job: `mixkv bench` on its
# built-in default (docs/cli.md), writing results/bench.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
mkdir -p results
./build/mixkv bench --json results/bench.json "$@"
echo
echo "results: results/bench.json (schema: docs/results-schema.md)"
