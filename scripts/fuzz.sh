#!/usr/bin/env bash
# fuzz.sh [SECONDS_PER_TARGET] [TARGET...] — builds the libFuzzer targets (build-fuzz/: clang,
# -DMIXKV_FUZZ=ON, CUDA off, no Criterion) and runs each one (all of fuzz/fuzz_*.c, or those
# named: safetensors, config, ...) for SECONDS_PER_TARGET seconds (default 60), one at a time,
# from a copy of its seed corpus fuzz/corpus/NAME/ (the committed corpus is never modified) and
# with fuzz/NAME.dict when present. Fails on the first crash, leak, undefined behaviour,
# timeout (10 s per input) or out-of-memory (2 GB), printing the reproducer. docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
build=${MIXKV_FUZZ_BUILD:-build-fuzz}

cc=${CC:-}
if [ -z "$cc" ]; then
  for c in clang clang-14; do command -v "$c" >/dev/null 2>&1 && cc=$c && break; done
fi
if [ -z "$cc" ]; then
  echo "fuzz: clang not found (scripts/setup.sh installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi
CC=$cc cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMIXKV_FUZZ=ON -DMIXKV_CUDA=OFF \
  -DMIXKV_TESTS=OFF -DMIXKV_WERROR="${MIXKV_WERROR:-OFF}" >/dev/null
cmake --build "$build" --target mkv_fuzz_all -j "$(nproc)"

if [ $# -gt 0 ]; then targets=("$@"); else mapfile -t targets <"$build/fuzz/targets.txt"; fi
work=$(mktemp -d /tmp/mkv_fuzz_run.XXXXXX)
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

failed=()
for t in "${targets[@]}"; do
  [ -n "$t" ] || continue
  bin=$build/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz: no target '$t' (fuzz/fuzz_$t.c)" >&2; exit 1; }
  corpus=$work/$t
  artifacts=$build/fuzz/artifacts/$t
  mkdir -p "$corpus" "$artifacts"
  [ -d "fuzz/corpus/$t" ] && cp -r "fuzz/corpus/$t/." "$corpus/"
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=("-dict=fuzz/$t.dict")
  echo "fuzz: $t for ${secs}s ($(find "$corpus" -type f | wc -l) seeds)"
  log=$work/$t.log
  if "$bin" "$corpus" "${dict[@]}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
       -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1; then
    grep -E '^stat::(number_of_executed_units|new_units_added|peak_rss_mb)' "$log" |
      sed "s/^/fuzz: $t: /" || true
  else
    tail -n 60 "$log" >&2
    repro=$(grep -oE "(Test unit|artifact) written to [^ ]+" "$log" | tail -n 1 | awk '{print $NF}')
    echo "fuzz: $t FAILED; reproducer: ${repro:-(none written, see the log above)}" >&2
    [ -n "$repro" ] && echo "fuzz: reproduce with: $bin $repro" >&2
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${secs}s each: no crash, leak or undefined behaviour"
