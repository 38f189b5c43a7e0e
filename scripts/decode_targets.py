#!/usr/bin/env python3
"""decode_targets.py -- issue 22's decode-attention targets, checked on measured grids.

Reads a `bench_attention --json` grid (K16V16 and the 20/50/30 mix at least, the default
batches 1, 16, 64, 256 and lengths 1k, 4k, 16k, 32k; more files of the same call add their
points, such as batches 2 to 8 at 8k and longer) and, for the comparison with the best
dense fp16 kernel, a `scripts/sdpa_reference.py --json` grid measured in the same device call,
and prints each target with the figures it rests on and whether it is met:

  - the mix at 80% or more of the copy rate at 64 x 16k and above (batch 64 or more, 16k
    tokens or more);
  - the mix never slower than K16V16 at batch 1;
  - K16V16 at 80% or more of the copy rate at batch 1 to 16, 8K tokens and longer;
  - K16V16 no slower than SDPA at 256 x 1k, 64 x 4k, 16 x 16k and 256 x 32k.

With --no-scores (a `bench_attention --no-scores --json` grid of the same call: calls without
the score write-back, which SDPA does not do either), the SDPA target is judged on those
K16V16 calls, like for like, and the copy-rate target for K16V16 is also shown for them.

Files written since bench_attention measured its floors carry each point's bound (`bound_us`:
an empty kernel's event time plus the point's bytes at the DRAM's peak rate); a copy-rate
target's point then shows the most of the copy rate any call could reach there ("at most"), and
the target lists the points where that is below the target itself: out of reach on that device,
whatever the kernel.

With --sdpa it also prints, per batch of three or more lengths of 4k and longer (shorter ones
hold outliers, SDPA's 64 x 1k), a least-squares line through each kernel's times against the
bytes it reads (time = fixed + bytes / rate): the rate at
which it streams and the fixed cost of a call (launch, start, tail), ours beside SDPA's, so
that a gap can be told as one of stream or of fixed cost.

With --stream (a `bench_stream --json` run of the same call), each K16V16 point of a copy-rate
target also shows the most of the copy rate a kernel that only streams the call's pages reaches
(the best of its cp.async and bulk-copy variants, without added work, at any item size), and
the target lists the points where even that is below the target: a measured ceiling, tighter
than the bound above.

Both files should flush the L2 the same way (their `flush`; files without it flushed by
writing). Exit status 0 when every target is met, 1 when one is not, 2 on a bad file.
Standard library only; nothing in the build or the tests needs it.
"""
import argparse
import json
import sys

MIX = "mix20/50/30"
SDPA_SHAPES = [(256, 1024), (64, 4096), (16, 16384), (256, 32768)]


def load(path, schema):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"decode_targets: {path}: {e}", file=sys.stderr)
        sys.exit(2)
    if doc.get("schema") != schema:
        print(f"decode_targets: {path}: not a {schema} file", file=sys.stderr)
        sys.exit(2)
    return doc


def load_all(paths):
    """bench_attention files of one device call as one: the first file's header, every file's
    points (a later file's over an earlier one's at the same format, batch and length; each
    point keeps its own bound, and copy-rate fractions stay each file's)."""
    docs = [load(p, "mixkv-bench-attention") for p in paths]
    merged = dict(docs[0])
    points = {}
    for d in docs:
        for r in d["results"]:
            points[(r["format"], r["batch"], r["length"])] = r
    merged["results"] = list(points.values())
    return merged


def shape(b, n):
    return f"{b} x {n // 1024}k"


def most(r, doc):
    """The most of the copy rate a call of point r could read at (its bytes over its bound,
    bench_attention's bound_us), or None where the file has no bound."""
    b = r.get("bound_us", 0)
    rate = doc.get("copy_rate_gbs", 0)
    return r["bytes"] / (b * 1e-6) / (rate * 1e9) if b and rate else None


def stream_ceiling(stream):
    """(batch, length) -> the best fraction of the copy rate of bench_stream's variants that only
    stream (not its `work*` ones), over every item size."""
    best = {}
    for r in stream["results"]:
        if r["variant"].startswith("work"):
            continue
        k = (r["batch"], r["length"])
        best[k] = max(best.get(k, 0.0), r["fraction_of_copy"])
    return best


def check(grid, sdpa, nosc=None, ceiling=None):
    by = {(r["format"], r["batch"], r["length"]): r for r in grid["results"]}
    bn = {(r["format"], r["batch"], r["length"]): r for r in nosc["results"]} if nosc else None
    rows = []

    def target(name, points, met, unreachable=None, beyond_stream=None):
        row = {"target": name, "points": points, "met": met}
        if unreachable:
            row["unreachable"] = unreachable
        if beyond_stream:
            row["beyond_stream"] = beyond_stream
        rows.append(row)

    def copy_target(name, table, doc, fmt, keep):
        """A target of 80% of the copy rate over table's points of format fmt that keep(b, n)."""
        pts = sorted((b, n, table[(f, b, n)]) for (f, b, n) in table if f == fmt and keep(b, n))
        shown, out, beyond = [], [], []
        for b, n, r in pts:
            m = most(r, doc)
            c = ceiling.get((b, n)) if ceiling and fmt == "K16V16" else None
            notes = ([f"at most {100 * m:.1f}%"] if m is not None else []) + \
                    ([f"stream {100 * c:.1f}%"] if c is not None else [])
            shown.append(f"{shape(b, n)}: {100 * r['fraction_of_copy']:.1f}%" +
                         (f" ({', '.join(notes)})" if notes else ""))
            if m is not None and m < 0.80:
                out.append(shape(b, n))
            if c is not None and c < 0.80:
                beyond.append(shape(b, n))
        target(name, shown, bool(pts) and all(r["fraction_of_copy"] >= 0.80 for _, _, r in pts), out, beyond)

    copy_target("mix at 80% of the copy rate, 64 x 16k and above", by, grid, MIX,
                lambda b, n: b >= 64 and n >= 16384)

    pts = [(n, by[(MIX, 1, n)]["time_us"], by[("K16V16", 1, n)]["time_us"]) for (f, b, n) in by
           if f == MIX and b == 1 and ("K16V16", 1, n) in by]
    pts.sort()
    target("mix never slower than K16V16 at batch 1",
           [f"1 x {n // 1024}k: {k / m:.2f}x" for n, m, k in pts],
           bool(pts) and all(m <= k for _, m, k in pts))

    small = lambda b, n: 1 <= b <= 16 and n >= 8192
    copy_target("K16V16 at 80% of the copy rate, batch 1 to 16, 8K and longer", by, grid, "K16V16", small)
    if bn:
        copy_target("K16V16 without scores at 80% of the copy rate, batch 1 to 16, 8K and longer", bn, nosc,
                    "K16V16", small)

    if sdpa is not None:
        sd = {(r["batch"], r["length"]): r for r in sdpa["results"]}
        kb = bn if bn else by
        pts = [(b, n, kb[("K16V16", b, n)]["time_us"], sd[(b, n)]["time_us"]) for b, n in SDPA_SHAPES
               if ("K16V16", b, n) in kb and (b, n) in sd]
        target("K16V16%s no slower than SDPA" % (" without scores" if bn else ""),
               [f"{shape(b, n)}: {k / s:.2f}x SDPA's time" for b, n, k, s in pts],
               len(pts) == len(SDPA_SHAPES) and all(k <= s for _, _, k, s in pts))
    return rows


def line(points):
    """Least squares time_us = fixed + bytes / rate over (bytes, time_us): (rate in TB/s, fixed
    in us), or None for fewer than two distinct sizes."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx  # us per byte
    if slope <= 0:
        return None
    return 1e-6 / slope, my - slope * mx  # bytes/us = 1e6 B/s; /1e12 -> TB/s


def lines(grid, sdpa, nosc):
    """Per batch with three or more lengths in both: K16V16's line (without scores where given)
    and SDPA's."""
    kb = nosc if nosc else grid
    ours = {}
    for r in kb["results"]:
        if r["format"] == "K16V16" and r["length"] >= 4096:
            ours.setdefault(r["batch"], []).append((r["bytes"], r["time_us"]))
    theirs = {}
    for r in sdpa["results"]:
        if r["length"] >= 4096:
            theirs.setdefault(r["batch"], []).append((r["bytes"], r["time_us"]))
    out = []
    for b in sorted(set(ours) & set(theirs)):
        if len(ours[b]) < 3 or len(theirs[b]) < 3:
            continue
        lo, ls = line(ours[b]), line(theirs[b])
        if lo and ls:
            out.append((b, lo, ls))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid", nargs="+", help="bench_attention --json output (several files of one call: their "
                    "points together, a later file's over an earlier one's)")
    ap.add_argument("--sdpa", help="sdpa_reference.py --json output of the same device call")
    ap.add_argument("--no-scores", nargs="+", help="bench_attention --no-scores --json output of the same call "
                    "(one file or more, as the grid)")
    ap.add_argument("--stream", help="bench_stream --json output of the same call (the streaming ceiling)")
    ap.add_argument("--json", help="write the table as JSON here")
    args = ap.parse_args()
    grid = load_all(args.grid)
    sdpa = load(args.sdpa, "mixkv-sdpa-reference") if args.sdpa else None
    if sdpa is not None and grid.get("flush", "write") != sdpa.get("flush", "write"):
        print("decode_targets: warning: the two files flushed the L2 differently", file=sys.stderr)
    nosc = load_all(args.no_scores) if args.no_scores else None
    ceiling = stream_ceiling(load(args.stream, "mixkv-bench-stream")) if args.stream else None
    rows = check(grid, sdpa, nosc, ceiling)
    print(f"{grid['device']}, copy rate {grid['copy_rate_gbs']:.0f} GB/s, flush {grid.get('flush', 'write')}")
    for r in rows:
        print(f"{'met    ' if r['met'] else 'NOT MET'}  {r['target']}")
        print("         " + "; ".join(r["points"]))
        if r.get("unreachable"):
            print("         out of reach on this device (an empty kernel plus the bytes at peak DRAM): " +
                  ", ".join(r["unreachable"]))
        if r.get("beyond_stream"):
            print("         beyond a kernel that only streams the pages (bench_stream): " +
                  ", ".join(r["beyond_stream"]))
    fits = lines(grid, sdpa, nosc) if sdpa is not None else []
    if fits:
        print("stream rate and fixed cost (time = fixed + bytes / rate, least squares over lengths of 4k and up):")
        for b, (ro, fo), (rs, fs) in fits:
            print(f"         batch {b}: K16V16{' without scores' if nosc else ''} {ro:.3f} TB/s + {fo:.1f} us, "
                  f"SDPA {rs:.3f} TB/s + {fs:.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "mixkv-decode-targets", "schema_version": 1, "device": grid["device"],
                       "targets": rows,
                       "lines": [{"batch": b, "k16v16_tbs": ro, "k16v16_fixed_us": fo, "sdpa_tbs": rs,
                                  "sdpa_fixed_us": fs} for b, (ro, fo), (rs, fs) in fits]}, f, indent=1)
    return 0 if all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
