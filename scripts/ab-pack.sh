#!/usr/bin/env bash
# ab-pack.sh — packs an A/B call of bench_attention for the GPU machine (docs/gpu-testing.md):
# two builds' binaries, their shared libraries, the sets of shapes and a run script that
# alternates the builds for a few rounds and writes each run as
# $OUT/r/ab_<set>_<build>_<round>.json (what scripts/bench_ab.py reads).
#
#   scripts/ab-pack.sh [--old-rev REV | --old-bin FILE] [--new-bin FILE] [--rounds N]
#                      [--tests BUILD_DIR [--filter GLOB]] [--out PACK] SETS_FILE
#
#   --old-rev REV   build bench_attention at REV (a worktree under /tmp, configured like
#                   build-pc: d 128, K16V16, K8V4, K4V2 and the K8V4+K4V2 mix, sm_90a)
#   --old-bin FILE  or take a bench_attention built earlier
#   --new-bin FILE  the build under test (default build-pc/bench_attention)
#   --rounds N      rounds (default 3); odd rounds run old then new, even rounds new then old
#   --tests DIR     also carry DIR/tests/gpu_tests and run it after the rounds with --filter
#                   (default 'decode_cuda/*'), the TinyStories fixture beside it
#   --out PACK      the pack (default .gpu-pack/ab.txz; .gpu-pack/ is ignored by git)
#   SETS_FILE       one set a line: NAME ARGS..., NAME without '_' (bench_attention's args,
#                   --json added by the run script); '#' starts a comment
#
# Then, in one device call (carry [".gpu-pack"]):
#   rm -rf $OUT/*; mkdir -p /tmp/ab && rm -rf /tmp/ab/* && tar xJf .gpu-pack/ab.txz -C /tmp/ab \
#     && /tmp/ab/run.sh
# and here: python3 scripts/bench_ab.py summary FILES_AT/r
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
die() { echo "ab-pack: $*" >&2; exit 2; }

old_rev='' old_bin='' new_bin=build-pc/bench_attention rounds=3 tests='' filter='decode_cuda/*'
out=.gpu-pack/ab.txz sets=''
while [ $# -gt 0 ]; do
  case $1 in
    --old-rev) old_rev=${2:?}; shift 2 ;;
    --old-bin) old_bin=${2:?}; shift 2 ;;
    --new-bin) new_bin=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --tests) tests=${2:?}; shift 2 ;;
    --filter) filter=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    -h|--help) usage 0 ;;
    -*) die "unknown option '$1' (--help)" ;;
    *) [ -z "$sets" ] || die "one SETS_FILE only"; sets=$1; shift ;;
  esac
done
[ -n "$sets" ] || usage
[ -f "$sets" ] || die "no sets file '$sets'"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer"
[ -z "$old_rev" ] || [ -z "$old_bin" ] || die "--old-rev and --old-bin exclude each other"
[ -n "$old_rev$old_bin" ] || die "name the old build: --old-rev REV or --old-bin FILE"
[ -x "$new_bin" ] || die "no new build '$new_bin' (cmake --build build-pc --target bench_attention)"
while read -r name _; do
  case $name in ''|'#'*) continue ;; esac
  [[ $name =~ ^[A-Za-z0-9-]+$ ]] || die "set name '$name' must be letters, digits and '-'"
done <"$sets"

stage=$(mktemp -d /tmp/mkv_ab_pack.XXXXXX)
stage_err=$stage/args.err
trap 'rm -rf "$stage"' EXIT
if [ -n "$old_rev" ]; then
  rev=$(git rev-parse --short "$old_rev^{commit}") || die "no commit '$old_rev'"
  wt=/tmp/mkv-ab-old-$rev
  if [ ! -d "$wt" ]; then git worktree add -f --detach "$wt" "$rev" >/dev/null; fi
  echo "ab-pack: building bench_attention at $rev in $wt/build" >&2
  cmake -S "$wt" -B "$wt/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DMIXKV_CUDA=ON -DMIXKV_DECODE_TC_DIMS=128 "-DMIXKV_DECODE_TC_FORMATS=K16V16;K8V4;K4V2" \
    "-DMIXKV_DECODE_TC_MIXES=K8V4+K4V2" -DMIXKV_TESTS=OFF >/dev/null
  cmake --build "$wt/build" --target bench_attention -j "$(nproc)" >/dev/null
  old_bin=$wt/build/bench_attention
fi
[ -x "$old_bin" ] || die "no old build '$old_bin'"
# Each set's arguments as both builds parse them (exit 2: a usage error; here, without a GPU,
# a good command line stops at CUDA's initialisation instead).
while read -r name args; do
  case $name in ''|'#'*) continue ;; esac
  for b in "$old_bin" "$new_bin"; do
    rc=0
    # shellcheck disable=SC2086
    "$b" $args --json /dev/null >/dev/null 2>"$stage_err" || rc=$?
    [ "$rc" -ne 2 ] || die "set '$name': $b refuses its arguments: $(head -c 300 "$stage_err")"
  done
done <"$sets"

rm -f "$stage_err"
mkdir -p "$stage/old" "$stage/new" "$stage/libs"
strip -o "$stage/old/bench_attention" "$old_bin"
strip -o "$stage/new/bench_attention" "$new_bin"
bins=("$old_bin" "$new_bin")
if [ -n "$tests" ]; then
  [ -x "$tests/tests/gpu_tests" ] || die "no $tests/tests/gpu_tests"
  strip -o "$stage/gpu_tests" "$tests/tests/gpu_tests"
  bins+=("$tests/tests/gpu_tests")
  ts=../shared/models/tinystories-656k
  if [ -d "$ts" ]; then cp -rL "$ts" "$stage/ts"; else echo "ab-pack: no $ts; its tests will skip" >&2; fi
fi
# The libraries the GPU machine lacks (it has glibc, libstdc++, CUDA's runtime, cuBLAS, cuRAND
# and NCCL: the same list as ../shared/device/bundle-libs.sh).
skip='/(libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libcurand|libnccl|libnvJitLink|libnvrtc|libstdc\+\+|libgcc_s)\.so'
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | { grep -vE "$skip" || true; } | while read -r lib; do cp -L -u "$lib" "$stage/libs/"; done
grep -vE '^[[:space:]]*(#|$)' "$sets" >"$stage/sets.txt"
cat >"$stage/run.sh" <<EOF
#!/usr/bin/env bash
# Made by scripts/ab-pack.sh: $rounds rounds of the sets in sets.txt, old and new alternated.
set -uo pipefail
here=\$(cd "\$(dirname "\$0")" && pwd)
out=\${OUT:-\$here/out}
mkdir -p "\$out/r"
export LD_LIBRARY_PATH="\$here/libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "\$out/gpu.txt"
status=0
for r in \$(seq 1 $rounds); do
  if [ \$((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  while read -r set args; do
    for b in \$order; do
      echo "ab: round \$r, \$set, \$b" >&2
      # shellcheck disable=SC2086
      "\$here/\$b/bench_attention" \$args --json "\$out/r/ab_\${set}_\${b}_\${r}.json" \
        >>"\$out/bench_\$b.log" 2>&1 || { echo "ab: \$b failed on \$set (bench_\$b.log)" >&2; status=1; }
    done
  done <"\$here/sets.txt"
done
if [ -x "\$here/gpu_tests" ]; then
  [ -d "\$here/ts" ] && export MIXKV_TINYSTORIES="\$here/ts"
  "\$here/gpu_tests" --jobs 1 --filter '$filter' >"\$out/gpu_tests.log" 2>&1 || status=1
  tail -n 3 "\$out/gpu_tests.log"
fi
exit \$status
EOF
chmod +x "$stage/run.sh"
mkdir -p "$(dirname "$out")"
tar cJf "$out" -C "$stage" .
echo "ab-pack: $out, $(du -h "$out" | cut -f1) ($(wc -l <"$stage/sets.txt") sets x $rounds rounds x 2 builds)" >&2
echo "ab-pack: device call (carry [\".gpu-pack\"]): rm -rf \$OUT/*; mkdir -p /tmp/ab && rm -rf /tmp/ab/* && tar xJf $out -C /tmp/ab && /tmp/ab/run.sh" >&2
