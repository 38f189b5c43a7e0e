#!/usr/bin/env python3
"""bench_ab.py -- gather and read A/B runs of bench_attention (builds or settings alternated in
one device call).

  bench_ab.py combine OUT --what TEXT FILE...
      Writes the `mixkv-bench-attention-ab` file OUT (docs/results-schema.md, its "runs" form):
      every FILE is one `bench_attention --json` run named ab_<set>_<build>_<round>.json (set:
      a group of shapes; build: the build or setting compared; round: an integer), kept whole
      with those three fields added.

  bench_ab.py summary [--builds A,B,...] [--json] FILE_OR_DIR...
      Reads A/B files (either form of the schema: "runs", or the older "rows" with
      "header_of_first_run") or directories of ab_*.json runs, and prints one row per point
      (format, batch, length, and whatever run settings differ between the files: scores,
      no_scores, spread, page_tokens) with each build's mean time over its rounds, the spread
      of those rounds (max - min, in % of the mean), and the last build's time over the first's.
      A ratio whose distance from 1 is under both builds' spreads is marked `~` (within the
      rounds' noise). --builds picks and orders the builds (default: old then new where those are the two,
      else as first seen).
      --json prints the same rows as JSON.

Exit status 0, 2 on a bad file or usage. Standard library only; nothing in the build or the
tests needs it.
"""
import argparse
import glob
import json
import os
import re
import signal
import statistics
import sys

NAME = re.compile(r"^ab_(?P<set>[^_]+)_(?P<build>[^_]+)_(?P<round>\d+)\.json$")
# run settings that tell points apart when they differ between runs
RUN_KEYS = ("scores", "no_scores", "spread", "page_tokens", "kernel", "logits", "hint")


def fail(msg):
    print("bench_ab: " + msg, file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail("%s: %s" % (path, e))


def combine(args):
    runs = []
    for path in args.files:
        m = NAME.match(os.path.basename(path))
        if not m:
            fail("%s: not named ab_<set>_<build>_<round>.json" % path)
        run = load(path)
        if run.get("schema") != "mixkv-bench-attention":
            fail("%s: not a bench_attention --json file" % path)
        run["build"], run["round"], run["set"] = m["build"], int(m["round"]), m["set"]
        runs.append(run)
    runs.sort(key=lambda r: (r["round"], r["set"], r["build"]))
    with open(args.out, "w") as f:
        json.dump({"schema": "mixkv-bench-attention-ab", "what": args.what, "runs": runs}, f, indent=1)
        f.write("\n")
    print("%s: %d runs" % (args.out, len(runs)))


def points(path):
    """Yields (run settings, build, round, result) from an A/B file, a run, or a directory."""
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "ab_*_*_*.json")))
        if not files:
            fail("%s: no ab_<set>_<build>_<round>.json files" % path)
        for f in files:
            m = NAME.match(os.path.basename(f))
            if not m:
                continue
            run = load(f)
            for r in run.get("results", []):
                yield run, m["build"], int(m["round"]), r
        return
    d = load(path)
    schema = d.get("schema")
    if schema == "mixkv-bench-attention-ab" and "runs" in d:
        for run in d["runs"]:
            for r in run.get("results", []):
                yield run, str(run.get("build")), run.get("round", 0), r
    elif schema == "mixkv-bench-attention-ab" and "rows" in d:
        head = d.get("header_of_first_run", {})
        for r in d["rows"]:
            run = dict(head)
            run.update({k: r[k] for k in RUN_KEYS if k in r})
            yield run, str(r.get("build", r.get("hi_item"))), r.get("round", 0), r
    elif schema == "mixkv-bench-attention":
        m = NAME.match(os.path.basename(path))
        for r in d.get("results", []):
            yield d, m["build"] if m else os.path.basename(path), int(m["round"]) if m else 0, r
    else:
        fail("%s: not a bench_attention or A/B file" % path)


def summary(args):
    rows = []
    for path in args.inputs:
        for run, build, rnd, r in points(path):
            if "time_us" not in r:
                continue
            rows.append(({k: run.get(k) for k in RUN_KEYS}, build, rnd, r))
    if not rows:
        fail("no points")
    varying = [k for k in RUN_KEYS if len({repr(s.get(k)) for s, _, _, _ in rows}) > 1]
    seen = list(dict.fromkeys(b for _, b, _, _ in rows))
    builds = args.builds.split(",") if args.builds else (["old", "new"] if sorted(seen) == ["new", "old"] else seen)
    missing = [b for b in builds if b not in seen]
    if missing:
        fail("no build %s (the files hold %s)" % (", ".join(missing), ", ".join(seen)))
    table = {}
    for s, b, rnd, r in rows:
        key = (r["format"], r["batch"], r["length"]) + tuple(s.get(k) for k in varying)
        table.setdefault(key, {}).setdefault(b, []).append(r["time_us"])
    out = []
    for key in sorted(table, key=lambda k: tuple(str(x) if not isinstance(x, (int, float)) else x for x in k)):
        per = table[key]
        if not all(b in per for b in builds):
            continue
        row = {"format": key[0], "batch": key[1], "length": key[2]}
        row.update(dict(zip(varying, key[3:])))
        for b in builds:
            t = per[b]
            mean = statistics.mean(t)
            row[b] = {"mean_us": round(mean, 3), "rounds": len(t),
                      "spread_pct": round(100.0 * (max(t) - min(t)) / mean, 2)}
        first, last = row[builds[0]], row[builds[-1]]
        row["ratio"] = round(last["mean_us"] / first["mean_us"], 4)
        row["within_noise"] = abs(row["ratio"] - 1.0) * 100.0 < max(first["spread_pct"], last["spread_pct"])
        out.append(row)
    if not out:
        fail("no point was measured by every build of %s" % ", ".join(builds))
    if args.json:
        json.dump({"builds": builds, "varying": varying, "rows": out}, sys.stdout, indent=1)
        print()
        return
    head = "%-12s %5s %6s " % ("format", "batch", "length") + "".join("%-10s " % k for k in varying)
    head += "".join("%16s" % (b + " us (+-%)") for b in builds) + "  %s/%s" % (builds[-1], builds[0])
    print(head)
    for row in out:
        line = "%-12s %5d %6d " % (row["format"], row["batch"], row["length"])
        line += "".join("%-10s " % row[k] for k in varying)
        line += "".join("%10.2f (%4.1f)" % (row[b]["mean_us"], row[b]["spread_pct"]) for b in builds)
        line += "  %.4f%s" % (row["ratio"], " ~" if row["within_noise"] else "")
        print(line)


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under head
    p = argparse.ArgumentParser(description="Gather and read A/B runs of bench_attention.")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("combine", help="gather ab_<set>_<build>_<round>.json runs into one A/B file")
    c.add_argument("out")
    c.add_argument("--what", required=True, help="what was compared, how, where")
    c.add_argument("files", nargs="+")
    s = sub.add_parser("summary", help="per point, each build's mean over its rounds")
    s.add_argument("--builds", help="the builds to show, in order (the ratio is last over first)")
    s.add_argument("--json", action="store_true")
    s.add_argument("inputs", nargs="+")
    args = p.parse_args()
    combine(args) if args.cmd == "combine" else summary(args)


if __name__ == "__main__":
    main()
