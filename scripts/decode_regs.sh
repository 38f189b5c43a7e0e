#!/bin/bash
# decode_regs.sh [BUILD_DIR] — registers, spills and stack of every tensor-core decode kernel of a
# CUDA build (ptxas -v on each generated translation unit; no GPU needed), one line per kernel:
# head_dim, the high and low formats (key bits, value bits, key groups, value groups), the pass
# (the separate pass's kernel, or the fused write-back's), registers, spill stores / loads in bytes. The kernels keep 3 blocks per SM at 168 registers or fewer.
set -euo pipefail
B=${1:-build}
[ -f "$B/CMakeFiles/mixkv_attention.dir/includes_CUDA.rsp" ] || { echo "decode_regs: $B is not a CUDA build" >&2; exit 2; }
cd "$B"
flags=$(grep -E "^CUDA_FLAGS" CMakeFiles/mixkv_attention.dir/flags.make | sed 's/^CUDA_FLAGS = //; s/--generate-code=[^ ]*//; s/--Werror=all-warnings//')
printf "%-5s %-14s %-14s %-9s %5s %8s\n" dim high low pass regs spills
for tu in generated/decode_tc_K*.cu; do
  nvcc -DMKV_HAVE_CUDA=1 --options-file CMakeFiles/mixkv_attention.dir/includes_CUDA.rsp $flags \
       -arch=sm_90a -Xptxas -v -c "$tu" -o /dev/null 2>&1 |
  awk '/Compiling entry function/ && /decode_kernel/ {
         d = $0; sub(/.*decode_kernelILi/, "", d); sub(/E.*/, "", d)
         # the formats: tc_fmtILi<kb>ELi<vb>ELi<kg>ELi<vg>E, the second one of a two-format
         # kernel mangled as NS1_ILi...E (S2_ where it repeats the first)
         s = $0; sub(/.*tc_fmtILi/, "", s); hi = s; sub(/E[^L].*/, "", hi); gsub(/ELi/, ",", hi)
         lo = hi
         if (match(s, /NS1_ILi[0-9ELi]*E/)) { lo = substr(s, RSTART + 7, RLENGTH - 7); sub(/E+$/, "", lo); gsub(/ELi/, ",", lo) }
         hi = "K" hi; lo = "K" lo; pass = ($0 ~ /Lb1ELb1EEEv/) ? "pieces" : ($0 ~ /Lb1ELb0EEEv/) ? "fused" : "separate"; want = 1; next }
       want && /spill stores/ { st = $5; ld = $9 }
       want && /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") r = $(i + 1)
         printf "%-5s %-14s %-14s %-9s %5s %4s/%-4s\n", d, hi, lo, pass, r, st, ld; want = 0 }'
done
