#!/usr/bin/env python3
"""serve_targets.py -- issue 20's end-to-end targets, checked on measured runs.

Reads what the device wrote and prints each target with the figures it rests on and whether
it is met:

  --forward F [F ...]  `bench_forward_cuda --json` files of the fp16 cache: the decode step
                       within 1.25x of its roofline (the weights read once plus the stored KV
                       at the copy rate) at batch 64 x 4K, every other shape shown beside it;
                       the prefill's projection GEMMs at 60% or more of the square GEMM.
  --long F [F]         a `mixkv serve-bench --json` run of both engines on long generations
                       (prompts 1K to 2K, outputs 4K and longer): mixkv at 2.5x the fp16
                       baseline's output tokens/s or more.
  --long-prompt F [F]  the same on long prompts (prompts 4K and longer, outputs up to 1K):
                       1.5x or more.
  --phases F [F ...]   serve-bench runs with `--phases`: mixkv's cache step calls under 2% of
                       its time.

Each ratio also says how the run's lengths compare with the issue's workload (long
generations: prompts 1K to 2K, outputs 4K to 8K; long prompts: prompts 4K to 16K, outputs 256
to 1K): as stated, or inside it but not all of it, or outside it. That does not change the
verdict; a run that covers only part of the workload is not the issue's whole claim.

Both engines of a ratio come from one file (one device call), or from two files, one engine
each, whose workload (model, dtype, requests, lengths, seed, KV budget, batch cap, graphs) and
device are the same: the fp16 baseline of a long run may not fit in one call beside mixkv.
Run the two calls back to back on one warm machine. Exit status 0 when every
target given is met, 1 when one is not, 2 on a bad file. Standard library only; nothing in
the build or the tests needs it.
"""
import argparse
import json
import sys


def load(path, fmt_key, fmt):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"serve_targets: {path}: {e}", file=sys.stderr)
        sys.exit(2)
    if doc.get(fmt_key) != fmt:
        print(f"serve_targets: {path}: not a {fmt} file", file=sys.stderr)
        sys.exit(2)
    return doc


def engines(path):
    doc = load(path, "schema", "mixkv-serve-bench")
    runs = doc.get("runs") or []
    if not runs:
        print(f"serve_targets: {path}: no runs", file=sys.stderr)
        sys.exit(2)
    return doc, {e["engine"]: e for e in runs[0]["engines"]}


def verdict(ok):
    return "met" if ok else "NOT MET"


# Issue 20's workloads: (prompt min, max), (output min, max) in tokens.
WORKLOADS = {
    "long generations": ((1024, 2048), (4096, 8192)),
    "long prompts": ((4096, 16384), (256, 1024)),
}


def coverage(doc, what):
    """How a run's lengths compare with the issue's workload of that name."""
    (p0, p1), (o0, o1) = WORKLOADS[what]
    pr, orr = (doc["prompt_len_min"], doc["prompt_len_max"]), (doc["output_len_min"], doc["output_len_max"])
    if pr == (p0, p1) and orr == (o0, o1):
        return "the issue's workload as stated"
    inside = p0 <= pr[0] <= pr[1] <= p1 and o0 <= orr[0] <= orr[1] <= o1
    return (f"{'inside' if inside else 'outside'} the issue's workload (prompts {p0}-{p1}, outputs {o0}-{o1}), "
            f"not all of it")


# What two files must share for their engines to be compared.
SAME_RUN = ("model", "weights", "backend", "device", "dtype", "requests", "lengths_file", "prompt_len_min",
            "prompt_len_max", "output_len_min", "output_len_max", "kv_mib", "max_batch", "tp", "graph_horizon",
            "seed")


def ratio_target(paths, want, what):
    doc, e = engines(paths[0])
    for p in paths[1:]:
        other, e2 = engines(p)
        diff = [k for k in SAME_RUN if doc.get(k) != other.get(k)]
        if "device" not in doc:
            diff.append("device (not recorded)")
        if diff:
            print(f"serve_targets: {paths[0]} and {p} differ in {', '.join(diff)}", file=sys.stderr)
            sys.exit(2)
        for k, v in e2.items():
            if k in e:
                print(f"serve_targets: {k} runs in both {paths[0]} and {p}", file=sys.stderr)
                sys.exit(2)
            e[k] = v
    if "fp16" not in e or "mixkv" not in e:
        print(f"serve_targets: {' '.join(paths)}: needs both engines", file=sys.stderr)
        sys.exit(2)
    f, m = e["fp16"], e["mixkv"]
    r = m["output_tokens_per_second"] / f["output_tokens_per_second"]
    steps_f, steps_m = f["seconds"] / f["steps"] * 1e3, m["seconds"] / m["steps"] * 1e3
    on = f" on {doc['device']}" if "device" in doc else ""
    print(f"{what}{on} ({doc['requests']} requests, prompts {doc['prompt_len_min']}-{doc['prompt_len_max']}, "
          f"outputs {doc['output_len_min']}-{doc['output_len_max']}, graphs {doc.get('graph_horizon', 0)}): "
          f"mixkv {m['output_tokens_per_second']:.0f} / fp16 {f['output_tokens_per_second']:.0f} tok/s = "
          f"{r:.2f}x (target {want}x): {verdict(r >= want)}")
    print(f"  mean batch {m['mean_batch']:.1f} / {f['mean_batch']:.1f} = {m['mean_batch'] / f['mean_batch']:.2f}x, "
          f"step {steps_m:.1f} / {steps_f:.1f} ms; lengths {coverage(doc, what)}")
    return r >= want


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--forward", nargs="+", default=[])
    ap.add_argument("--long", nargs="+", metavar="F", help="one file of both engines, or two of one each")
    ap.add_argument("--long-prompt", nargs="+", metavar="F")
    ap.add_argument("--phases", nargs="+", default=[])
    a = ap.parse_args()
    if not (a.forward or a.long or a.long_prompt or a.phases):
        ap.error("nothing to check")
    ok = True
    if a.forward:
        runs = [load(p, "format", "mixkv-bench-forward-cuda") for p in a.forward]
        base = [d for d in runs if d.get("cache") == "fp16"]
        if not base:
            print("serve_targets: --forward: no run of the fp16 cache", file=sys.stderr)
            sys.exit(2)
        judged = False
        for d in sorted(base, key=lambda d: (d["batch"], d["context"])):
            r = d["step_over_roofline"]
            g = d.get("step_ms_greedy_graph", 0.0)
            graphs = f", with graphs {g / d['roofline_ms']:.2f}x" if g > 0 else ""
            target = d["batch"] == 64 and d["context"] == 4096
            tail = f" (target 1.25x): {verdict(r <= 1.25)}" if target else ""
            print(f"decode step {d['batch']} x {d['context']} on {d['device']}: {d['step_ms_device']:.2f} ms, "
                  f"roofline {d['roofline_ms']:.2f} ms, {r:.2f}x{graphs}{tail}")
            if target:
                judged = True
                ok &= r <= 1.25
            gf = d["prefill_gemm_only_fraction"]
            print(f"  prefill GEMMs {d['prefill_gemm_only_tflops']:.0f} TFLOP/s, {100 * gf:.0f}% of the square "
                  f"GEMM (target 60%): {verdict(gf >= 0.6)}")
            ok &= gf >= 0.6
        if not judged:
            print("decode step: no 64 x 4K run of the fp16 cache given: the roofline target is not judged")
            ok = False
    if a.long:
        ok &= ratio_target(a.long, 2.5, "long generations")
    if a.long_prompt:
        ok &= ratio_target(a.long_prompt, 1.5, "long prompts")
    for p in a.phases:
        _, e = engines(p)
        m = e.get("mixkv")
        if not m or "phases_s" not in m:
            print(f"serve_targets: {p}: no mixkv run with --phases", file=sys.stderr)
            sys.exit(2)
        share = m["phases_s"]["cache"] / m["seconds"]
        print(f"cache step calls ({p.split('/')[-1]}): {m['phases_s']['cache']:.2f} of {m['seconds']:.1f} s, "
              f"{100 * share:.2f}% (target under 2%): {verdict(share < 0.02)}")
        ok &= share < 0.02
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
