#!/usr/bin/env python3
"""decode_sass.py -- where the tensor-core decode kernels' item loop spends its instructions,
read from the SASS (no GPU needed).

  decode_sass.py [--build DIR] [--tu PATTERN] [--pass separate|fused|pieces|all]
                 [--depth N] [--lines N] [--json FILE]

Compiles each generated translation unit of a CUDA build (DIR/generated/decode_tc_*.cu, default
build-pc; --tu picks those whose name contains PATTERN) to a cubin with -lineinfo, with the
build's own flags (as scripts/decode_regs.sh does), disassembles it with `nvdisasm -gi`, and
for every decode kernel (--pass: the separate pass's kernels by default) and each of its
sections (high, low) finds the item loop's steady state: the smallest loop whose body holds
both the stage's copies (LDGSTS) and the section's mma (HMMA/IMMA), attributed to the section
by the call in run_section_item its instructions are inlined from. For each it prints:

  - instructions in the loop body, tokens per iteration (subtile_values's two movmatrix per
    16-token subtile),
    instructions per token, and the mma, copy and shuffle counts;
  - the instructions by the step they come from (the chain of inlined functions below
    run_item, --depth names deep; PTX wrappers and CUDA's headers named by their file);
  - with --lines N, the N source lines with the most instructions.

The body is the address range between the loop's head and its back branch: rarely taken
paths laid out inside it (a rescale, a window reload) count as if taken, so read the figures
as a static upper bound per iteration, for comparing builds and formats, not as issue counts
(ncu's are those). The fused kernels inline the values' step twice where their logits may be
compact (both forms in the loop), so their tokens per iteration read double there. --json writes the same as JSON. Exit status 0, 2 on usage or a failed
compile. Standard library, nvcc and nvdisasm only; nothing in the build or the tests needs it.
"""
import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "attention")
HELPER_FILES = ("tc_ptx.cuh", "tc_unpack.cuh")


def fail(msg):
    print("decode_sass: " + msg, file=sys.stderr)
    sys.exit(2)


def build_flags(build):
    flags_make = os.path.join(build, "CMakeFiles/mixkv_attention.dir/flags.make")
    rsp = os.path.join(build, "CMakeFiles/mixkv_attention.dir/includes_CUDA.rsp")
    if not (os.path.exists(flags_make) and os.path.exists(rsp)):
        fail(build + " is not a CUDA build (no mixkv_attention flags)")
    flags = ""
    for line in open(flags_make):
        if line.startswith("CUDA_FLAGS"):
            flags = line.split("=", 1)[1]
    flags = re.sub(r"--generate-code=\S*", "", flags).replace("--Werror=all-warnings", "")
    return ["--options-file", rsp] + flags.split()


def disassemble(build, tu, work):
    cubin = os.path.join(work, os.path.basename(tu) + ".cubin")
    cmd = ["nvcc", "-DMKV_HAVE_CUDA=1"] + build_flags(build) + [
        "-lineinfo", "-arch=sm_90a", "-cubin", tu, "-o", cubin]
    r = subprocess.run(cmd, cwd=build, capture_output=True, text=True)
    if r.returncode != 0:
        fail("nvcc failed on %s:\n%s" % (tu, r.stderr[-2000:]))
    r = subprocess.run(["nvdisasm", "-gi", "-c", cubin], capture_output=True, text=True)
    if r.returncode != 0:
        fail("nvdisasm failed on %s:\n%s" % (cubin, r.stderr[-2000:]))
    return r.stdout


def source_functions():
    """Per source file of attention/, the (first line, name) of each device function."""
    out = {}
    for path in glob.glob(os.path.join(SRC, "*.cu*")) + glob.glob(os.path.join(SRC, "*.h")):
        starts = []
        for i, line in enumerate(open(path, encoding="utf-8", errors="replace")):
            s = line.strip()
            if "__device__" not in line or s.startswith(("*", "//", "/*")):
                continue
            rest = re.sub(r"__\w+__", "", line.split("__device__", 1)[1])
            m = re.search(r"(\w+)\s*\(", rest)
            if m:
                starts.append((i + 1, m.group(1)))
        out[os.path.basename(path)] = starts
    return out


FUNCS = source_functions()


def func_at(f, line):
    best = f.split(".")[0]
    for start, name in FUNCS.get(f, []):
        if start <= line:
            best = name
    return best


def parse(text):
    """Kernels: name -> list of (address, instruction, frames innermost first); labels."""
    kernels = []
    cur = None
    chain, in_chain, pend = [], False, []
    for line in text.split("\n"):
        m = re.match(r"^//-+ \.text\.(\S+) -+", line)
        if m:
            cur = {"name": m.group(1), "ins": [], "labels": {}}
            kernels.append(cur)
            chain, in_chain, pend = [], False, []
            continue
        if cur is None:
            continue
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', line)
        if m:
            if not in_chain:
                chain = []
            in_chain = True
            chain.append((os.path.basename(m.group(1)), int(m.group(2))))
            continue
        in_chain = False
        m = re.match(r"^(\.L_x_\d+):", line)
        if m:
            pend.append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;", line)
        if m:
            for p in pend:
                cur["labels"][p] = len(cur["ins"])
            pend = []
            cur["ins"].append((int(m.group(1), 16), m.group(2), tuple(chain)))
    return kernels


def opcode(text):
    return re.sub(r"^@!?U?P[T0-9]+\s+", "", text).split()[0].split(".")[0]


def section_of(frames):
    """'high' or 'low': the run_item call in run_section_item the instruction comes from."""
    calls = [(f, l) for f, l in frames if f == "tc_decode.cuh" and func_at(f, l) == "run_section_item"]
    if not calls:
        return None
    f, line = calls[0]
    # the low section's call is the later of the two run_item calls
    lines = sorted({l for l in SECTION_CALLS})
    return "low" if lines and line >= lines[-1] else "high"


def run_item_calls():
    path = os.path.join(SRC, "tc_decode.cuh")
    out, inside = [], False
    for i, line in enumerate(open(path)):
        if re.search(r"\brun_section_item\s*\(", line) and "__device__" in line:
            inside = True
        elif inside and re.search(r"\brun_item\s*<", line):
            out.append(i + 1)
        elif inside and line.startswith("}"):
            break
    return out


SECTION_CALLS = run_item_calls()


def step_name(frames, depth):
    names = []
    for f, l in reversed(frames):  # outermost first
        if f in FUNCS:
            names.append(func_at(f, l))
        else:
            names.append(re.sub(r"_intrinsics.*|\..*", "", f))
    if "run_item" in names:
        names = names[names.index("run_item") + 1:]
    else:
        return "(outside run_item)"
    out = []
    for n in names:
        if not out or out[-1] != n:
            out.append(n)
    return " > ".join(out[:depth]) if out else "run_item"


def loops_of(k):
    ins, labels = k["ins"], k["labels"]
    out = []
    for i, (_, text, _) in enumerate(ins):
        m = re.search(r"\bBRA\b.*`\((\.L_x_\d+)\)", text)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            out.append((labels[m.group(1)], i))
    return out


def analyse(k, depth, nlines):
    ins = k["ins"]
    res = {}
    for sec in ("high", "low"):
        best = None
        for s, e in loops_of(k):
            body = ins[s:e + 1]
            ops = collections.Counter(opcode(t) for _, t, _ in body)
            if ops["LDGSTS"] == 0 or ops["HMMA"] + ops["IMMA"] == 0:
                continue
            secs = collections.Counter(section_of(fr) for _, t, fr in body if opcode(t) in ("HMMA", "IMMA"))
            if secs.most_common(1)[0][0] != sec or len([x for x in secs if x]) != 1:
                continue
            if best is None or e - s < best[1] - best[0]:
                best = (s, e)
        if best is None:
            continue
        s, e = best
        body = ins[s:e + 1]
        ops = collections.Counter(opcode(t) for _, t, _ in body)
        # two movmatrix (the weights' transposes) per 16-token subtile in subtile_values
        movm = sum(1 for _, t, fr in body
                   if opcode(t) == "MOVM" and any(func_at(f, l) == "subtile_values" for f, l in fr))
        tokens = 16 * movm // 2
        steps = collections.Counter(step_name(fr, depth) for _, _, fr in body)
        lines = collections.Counter(
            "%s:%d" % fr[0] if fr else "?" for _, _, fr in body)
        res[sec] = {
            "start": "%#x" % body[0][0], "end": "%#x" % body[-1][0],
            "instructions": len(body), "tokens": tokens,
            "per_token": round(len(body) / tokens, 2) if tokens else None,
            "ops": {o: ops[o] for o in ("HMMA", "IMMA", "LDGSTS", "LDSM", "LDS", "SHFL", "MUFU", "I2F", "BRA")},
            "steps": dict(steps.most_common()),
            "lines": dict(lines.most_common(nlines)) if nlines else {},
        }
    return res


def kernel_label(name):
    d = re.search(r"decode_kernelILi(\d+)E", name)
    fmts = re.findall(r"ILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E", name)
    label = "d%s" % (d.group(1) if d else "?")
    for kb, vb, kg, vg in fmts:
        label += " K%sV%s/%sg%s" % (kb, vb, kg, vg)
    pas = "pieces" if name.endswith("Lb1ELb1EEEv7tc_args") else \
        "fused" if name.endswith("Lb1ELb0EEEv7tc_args") else "separate"
    return label, pas


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build-pc")
    ap.add_argument("--tu", default="")
    ap.add_argument("--pass", dest="pas", default="separate", choices=("separate", "fused", "pieces", "all"))
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--lines", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.depth < 1:
        fail("--depth must be >= 1")
    build = os.path.abspath(a.build)
    tus = sorted(t for t in glob.glob(os.path.join(build, "generated", "decode_tc_K*.cu")) if a.tu in os.path.basename(t))
    if not tus:
        fail("no generated decode_tc_K*.cu in %s/generated matching '%s'" % (build, a.tu))
    if len(SECTION_CALLS) != 2:
        fail("cannot find run_section_item's two run_item calls in attention/tc_decode.cuh")
    out = []
    with tempfile.TemporaryDirectory() as work:
        for tu in tus:
            print("decode_sass: %s" % os.path.basename(tu), file=sys.stderr, flush=True)
            for k in parse(disassemble(build, tu, work)):
                if "decode_kernel" not in k["name"]:
                    continue
                label, pas = kernel_label(k["name"])
                if a.pas != "all" and pas != a.pas:
                    continue
                res = analyse(k, a.depth, a.lines)
                out.append({"tu": os.path.basename(tu), "kernel": label, "pass": pas, "sections": res})
                for sec, r in res.items():
                    print("%s, %s pass, %s section: %d instructions a loop of %d tokens (%s a token); "
                          "%s" % (label, pas, sec, r["instructions"], r["tokens"], r["per_token"],
                                  ", ".join("%s %d" % kv for kv in r["ops"].items() if kv[1])))
                    for step, n in r["steps"].items():
                        print("  %5d  %5.1f%%  %s" % (n, 100.0 * n / r["instructions"], step))
                    if r["lines"]:
                        print("  by line:")
                        for line, n in r["lines"].items():
                            print("  %5d  %s" % (n, line))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"schema": "mixkv-decode-sass", "version": 1, "build": a.build, "kernels": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
