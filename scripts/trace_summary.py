#!/usr/bin/env python3
"""Summarise bench_attention --trace output (timeline stamps of the tensor-core decode kernels,
attention/tc_trace.cuh): per traced call, when blocks start, when warps' first subtiles land,
when items end, when regions merge and blocks exit, relative to the first block's start (us);
the merging blocks' phases in SM cycles; the items' streaming time by multiprocessor; and how
many warps stream (between their first subtile and their item's end) over time.

usage: trace_summary.py TRACE_FILE [--buckets US]"""
import argparse
import statistics
import sys

TAGS = {1: "START", 2: "CMD", 3: "FIRST", 4: "ITEM", 5: "ARRIVE", 6: "MERGED", 7: "EXIT",
        8: "FIN_START", 9: "FIN_END", 10: "FIN_WAITED", 11: "FIN_MS", 12: "WAITED", 13: "MS", 14: "LANDED"}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))]


def transitions(recs, t0):
    """The fused kernel's block transitions (blocks with CMD stamps), per decode command of a
    block: its id to its first landed subtile, its last item's end to its arrival, the arrival
    to the region's merge (last blocks), the arrival or merge to the next command, and the
    last item's end to the next command's first landed subtile (us; median, p90)."""
    by = {}
    for r in sorted(recs, key=lambda r: r[0]):
        by.setdefault(r[5], []).append((r[2], 1e-3 * (r[0] - t0)))
    gaps = {}

    def add(k, v):
        gaps.setdefault(k, []).append(v)

    for ev in by.values():
        cmd = last_item = arrive = merged = None
        first_seen = True
        for tag, t in ev:
            if tag == 2:  # CMD
                if arrive is not None:
                    add("arrival or merge to next command", t - (merged if merged is not None else arrive))
                cmd, arrive, merged, first_seen = t, None, None, False
            elif tag == 3 and not first_seen and cmd is not None:  # FIRST
                add("command to first subtile", t - cmd)
                if last_item is not None:
                    add("last item to next first subtile", t - last_item)
                first_seen = True
            elif tag == 4:  # ITEM
                last_item = t
            elif tag == 5 and last_item is not None:  # ARRIVE
                arrive = t
                add("last item to arrival", t - last_item)
            elif tag == 6 and arrive is not None:  # MERGED
                merged = t
                add("arrival to region merged", t - arrive)
    if not gaps:
        return
    print("   block transitions (fused kernel), us:")
    for k in ("last item to arrival", "arrival to region merged", "arrival or merge to next command",
              "command to first subtile", "last item to next first subtile"):
        if k in gaps:
            xs = gaps[k]
            print(f"     {k:<34} {len(xs):>6}  median {statistics.median(xs):7.2f}  p90 {pct(xs, .9):7.2f}")


def tail(recs, t0):
    """The fused kernel's tail: from the last command taken (the queue is then empty) to the
    last stamp, against what the items in flight had left (each item's progress taken as linear
    from its first landed subtile to its end) at the steady rate of items done per us (between
    the 20% and 80% points of the items' ends)."""
    cmds = [1e-3 * (r[0] - t0) for r in recs if r[2] == 2]
    if not cmds:
        return
    te, end = max(cmds), max(1e-3 * (r[0] - t0) for r in recs)
    seq = {}
    for r in sorted(recs, key=lambda r: r[0]):
        if r[2] in (3, 4):
            seq.setdefault((r[5], r[4]), []).append((r[2], 1e-3 * (r[0] - t0)))
    left, ends = 0.0, []
    for ev in seq.values():
        o = None
        for tag, t in ev:
            if tag == 3:
                o = t
            elif o is not None:
                ends.append(t)
                if t > te and t > o:
                    left += (t - max(te, o)) / (t - o)
                o = None
    if len(ends) < 10:
        return
    ends.sort()
    a, b = ends[int(0.2 * len(ends))], ends[int(0.8 * len(ends))]
    if b <= a:
        return
    rate = (int(0.8 * len(ends)) - int(0.2 * len(ends))) / (b - a)
    print(f"   tail: queue empty at {te:.2f} us, {end - te:.2f} us to the last stamp; {left:.0f} items' worth "
          f"left, {left / rate:.2f} us at the steady {rate:.1f} items/us")


def merge_phases(recs):
    """The fused kernel's merging blocks (MS stamps), phase by phase in SM cycles (clock64 of one
    block, one SM): its last item to its arrival, the arrival (or, for a block that waited for
    the region's last arrival, that wait's end) to the region's maxima and sums, to the first
    parts landed, to the merge done, to the block's exit; median and max over the blocks. Each
    span holds one stamp's own cost."""
    by = {}
    for r in sorted(recs, key=lambda r: r[0]):
        by.setdefault(r[5], []).append(r)
    names = ("last item to arrival", "arrival or wait to maxima", "maxima to parts landed",
             "parts landed to merged", "merged to exit", "arrival to wait's end")
    spans = {k: [] for k in names}
    for ev in by.values():
        ms = [i for i, r in enumerate(ev) if r[2] == 13]
        if not ms:
            continue
        i = ms[-1]
        arr = [r for r in ev[:i] if r[2] == 5]
        items = [r for r in ev[:i] if r[2] == 4]
        waited = [r for r in ev[:i] if r[2] == 12]
        after = ev[i + 1:]
        landed = next((r for r in after if r[2] == 14), None)
        merged = next((r for r in after if r[2] == 6), None)
        ex = next((r for r in after if r[2] == 7), None)
        if arr and items:
            spans["last item to arrival"].append(arr[-1][1] - items[-1][1])
        start = waited[-1] if waited else (arr[-1] if arr else None)
        if start:
            spans["arrival or wait to maxima"].append(ev[i][1] - start[1])
        if waited and arr:
            spans["arrival to wait's end"].append(waited[-1][1] - arr[-1][1])
        if landed:
            spans["maxima to parts landed"].append(landed[1] - ev[i][1])
        if landed and merged:
            spans["parts landed to merged"].append(merged[1] - landed[1])
        if merged and ex:
            spans["merged to exit"].append(ex[1] - merged[1])
    if not any(spans.values()):
        return
    print("   merging blocks (fused kernel), SM cycles:")
    for k in names:
        if spans[k]:
            xs = spans[k]
            print(f"     {k:<34} {len(xs):>6}  median {statistics.median(xs):7.0f}  max {max(xs):7.0f}")


def items_by_sm(recs, t0):
    """The items' streaming time (first landed subtile to end) by multiprocessor: the spread of
    the multiprocessors' means against the spread within one."""
    first, per = {}, {}
    for r in sorted(recs, key=lambda r: r[0]):
        if r[2] == 3:
            first[(r[5], r[4])] = r[0]
        elif r[2] == 4 and (r[5], r[4]) in first:
            per.setdefault(r[3], []).append(1e-3 * (r[0] - first.pop((r[5], r[4]))))
    if len(per) < 2:
        return
    means = sorted(statistics.mean(v) for v in per.values())
    within = statistics.mean(statistics.pstdev(v) for v in per.values())
    print(f"   items by multiprocessor ({len(per)}): mean streaming time {means[0]:.2f} .. {means[-1]:.2f} us, "
          f"sd of the means {statistics.pstdev(means):.2f}, mean sd within one {within:.2f}")


def finalize_blocks(recs, t0):
    """The separate pass's finalize blocks by their index along the region (FIN_* stamps carry
    it: score blocks first, the merge blocks last): per index, how many, and the median and
    latest of their wait's return, their heads' maxima and sums, and their end (us)."""
    by = {}
    for r in recs:
        if r[2] in (8, 9, 10, 11):
            by.setdefault(r[5], {})[r[2]] = (1e-3 * (r[0] - t0), r[6])
    idx = {}
    for v in by.values():
        if 8 in v:
            idx.setdefault(v[8][1], []).append(v)
    if not idx:
        return
    print("   finalize blocks by index along the region (median / latest, us):")
    for bx in sorted(idx):
        bl = idx[bx]

        def col(tag):
            xs = [v[tag][0] for v in bl if tag in v]
            return f"{statistics.median(xs):7.2f} / {max(xs):7.2f}" if xs else "      -"
        print(f"     {bx:>3}: {len(bl):>5} blocks  waited {col(10)}  maxima {col(11)}  end {col(9)}")


def summarise(name, hdr, recs, bucket):
    if not recs:
        print(f"{name}: no records")
        return
    t0 = min(r[0] for r in recs)
    print(f"== {name}  event {hdr.get('event_us', '?')} us, median of the timed calls {hdr.get('median_us', '?')} us, "
          f"{len(recs)} records")
    gts = sorted({r[0] for r in recs})
    steps = [b - a for a, b in zip(gts, gts[1:]) if b > a]
    if steps:
        print(f"   globaltimer's smallest step {min(steps)} ns")
    last = max(r[0] for r in recs)
    print(f"   stamped span {1e-3 * (last - t0):.2f} us")
    by = {}
    for r in recs:
        by.setdefault(r[2], []).append(1e-3 * (r[0] - t0))
    print(f"   {'stamp':<10} {'count':>6} {'min':>8} {'p10':>8} {'p50':>8} {'p90':>8} {'max':>8}")
    for tag in sorted(by):
        xs = by[tag]
        print(f"   {TAGS.get(tag, tag):<10} {len(xs):>6} {min(xs):8.2f} {pct(xs, .1):8.2f} {pct(xs, .5):8.2f} "
              f"{pct(xs, .9):8.2f} {max(xs):8.2f}")
    lasts = [1e-3 * (r[0] - t0) for r in recs if r[2] == 5 and r[6] == 1]
    if lasts:
        print(f"   last arrivals: {len(lasts)}, {min(lasts):.2f} .. {max(lasts):.2f} us")
    transitions(recs, t0)
    merge_phases(recs)
    tail(recs, t0)
    finalize_blocks(recs, t0)
    items_by_sm(recs, t0)
    # A warp streams from its first landed subtile to its item's end.
    seq = {}
    for r in sorted(recs, key=lambda r: r[0]):
        if r[2] in (3, 4):
            seq.setdefault((r[5], r[4]), []).append(r)
    spans = []
    for rs in seq.values():
        open_t = None
        for r in rs:
            if r[2] == 3:
                open_t = r[0]
            elif open_t is not None:
                spans.append((1e-3 * (open_t - t0), 1e-3 * (r[0] - t0)))
                open_t = None
    if spans:
        d = [b - a for a, b in spans]
        print(f"   items streamed: {len(spans)}, first subtile to end median {statistics.median(d):.2f} us "
              f"(min {min(d):.2f}, max {max(d):.2f})")
        end = max(b for _, b in spans)
        n = int(end / bucket) + 1
        act = [0.0] * n
        for a, b in spans:
            for k in range(int(a / bucket), int(b / bucket) + 1):
                lo, hi = max(a, k * bucket), min(b, (k + 1) * bucket)
                if hi > lo:
                    act[k] += (hi - lo) / bucket
        print(f"   warps streaming, mean per {bucket:g} us:")
        line = []
        for k in range(n):
            line.append(f"{k * bucket:5.0f}:{act[k]:6.0f}")
            if len(line) == 8:
                print("     " + " ".join(line))
                line = []
        if line:
            print("     " + " ".join(line))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--buckets", type=float, default=2.0, help="us per bucket of the streaming warps' count")
    args = ap.parse_args()
    calls = []
    with open(args.trace) as f:
        for line in f:
            if line.startswith("# floors"):
                print(line[2:].strip())
            elif line.startswith("# call"):
                w = line.split()
                hdr = {w[i]: w[i + 1] for i in range(5, len(w) - 1, 2)}
                calls.append((f"{w[2]} {w[3]} x {w[4]}", hdr, []))
            elif line.strip() and calls:
                calls[-1][2].append(tuple(int(x) for x in line.split()))
    if not calls:
        print("no traced calls", file=sys.stderr)
        return 1
    for name, hdr, recs in calls:
        summarise(name, hdr, recs, args.buckets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
