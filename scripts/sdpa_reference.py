#!/usr/bin/env python3
"""sdpa_reference.py -- an outside reference for bench_attention: PyTorch's
scaled_dot_product_attention on dense fp16 K/V of the same shapes (Llama-3-8B heads: 32 query,
8 KV, d 128; one query token per sequence), timed the same way (CUDA events, median of --reps
after two warm-ups, L2 flushed before each), with the bytes of K and V read as a fraction of the
device-to-device copy rate measured in the same run. Writes JSON (--json) and a table.

Dense, contiguous K/V is the easy case for a kernel (no page table, no quantization, no score
write-back); it bounds what a paged fp16 kernel can reach on this GPU. Runs on the GPU machine,
which has PyTorch; nothing in the build or the tests needs it.
"""
import argparse
import json
import statistics
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("sdpa_reference: PyTorch is not installed (it is on the GPU machine)")


flush_by_write = False


def timed(fn, reps, flush):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(reps + 2):
        if flush_by_write:
            flush.fill_(r)
        else:
            flush.max()  # reads 256 MiB: the L2 left holding clean lines
        start.record()
        fn()
        end.record()
        end.synchronize()
        if r >= 2:
            times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--lengths", default="1024,4096,16384,32768")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json")
    ap.add_argument("--flush", choices=["read", "write"], default="read",
                    help="empty the L2 before each call by reading 256 MiB (default) or by "
                         "writing it (dirty lines the call then writes back)")
    args = ap.parse_args()
    global flush_by_write
    flush_by_write = args.flush == "write"
    if not torch.cuda.is_available():
        sys.exit("sdpa_reference: no CUDA device")
    dev = torch.device("cuda")
    H, G, d = 8, 4, 128
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    a = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    copy_rate = 2 * a.numel() / timed(lambda: b.copy_(a), 10, flush)
    del a, b
    name = torch.cuda.get_device_name()
    print(f"{name}: device copy rate {copy_rate / 1e9:.0f} GB/s (read + write); torch {torch.__version__}")
    print(f"{'batch':>6} {'length':>7} {'time_us':>10} {'GB/s':>8} {'of_copy':>8}")
    rows = []
    for batch in map(int, args.batches.split(",")):
        for length in map(int, args.lengths.split(",")):
            kv_bytes = 2 * batch * H * length * d * 2
            if kv_bytes > 0.7 * torch.cuda.mem_get_info()[0]:
                print(f"{batch:6d} {length:7d}   skipped: {kv_bytes / 2**30:.1f} GiB")
                continue
            k = torch.randn(batch, H, length, d, dtype=torch.float16, device=dev)
            v = torch.randn_like(k)
            q = torch.randn(batch, H * G, 1, d, dtype=torch.float16, device=dev)
            sec = timed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                        args.reps, flush)
            rate = kv_bytes / sec
            print(f"{batch:6d} {length:7d} {sec * 1e6:10.1f} {rate / 1e9:8.0f} {100 * rate / copy_rate:7.1f}%")
            rows.append({"batch": batch, "length": length, "time_us": round(sec * 1e6, 2),
                         "bytes": kv_bytes, "gbs": round(rate / 1e9, 1),
                         "fraction_of_copy": round(rate / copy_rate, 4)})
            del k, v, q
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "mixkv-sdpa-reference", "schema_version": 1, "device": name,
                       "torch": torch.__version__, "copy_rate_gbs": round(copy_rate / 1e9, 1),
                       "heads": H, "group_size": G, "head_dim": d, "flush": args.flush, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
