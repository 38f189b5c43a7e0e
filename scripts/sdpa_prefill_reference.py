#!/usr/bin/env python3
"""sdpa_prefill_reference.py -- an outside reference for bench_prefill: PyTorch's
scaled_dot_product_attention(q, k, v, is_causal=True) restricted to the flash backend
(FlashAttention-2 in PyTorch's build), fp16, Llama-3-8B heads (32 query, 8 KV, d 128, enable_gqa),
on the same shapes as bench_prefill (one sequence of 1K .. 32K tokens, and 8 x 4K), timed the
same way (CUDA events, median of --reps after two warm-ups, a 256 MiB memset to flush L2 before
each). TFLOP/s count 4 * n^2 / 2 * d * Hq per sequence. Writes JSON (--json) and a table.

SDPA computes the output only; bench_prefill also writes the log-sum-exp and the significance
sums. Runs on the GPU machine, which has PyTorch; nothing in the build or the tests needs it.
"""
import argparse
import json
import statistics
import sys

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:
    sys.exit("sdpa_prefill_reference: PyTorch (with torch.nn.attention) is not installed")


def timed(fn, reps, flush):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(reps + 2):
        flush.fill_(r & 0xFF)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if r >= 2:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", default="1x1024,1x2048,1x4096,1x8192,1x16384,1x32768,8x4096",
                    help="comma-separated BATCHxLENGTH")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("sdpa_prefill_reference: no CUDA device")
    dev = torch.device("cuda")
    H, G, d = 8, 4, 128
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    name = torch.cuda.get_device_name()
    print(f"{name}: SDPA flash backend, causal, fp16, {H * G} query heads, {H} KV heads, d {d}; "
          f"torch {torch.__version__}")
    print(f"{'batch':>6} {'length':>7} {'time_ms':>10} {'TFLOP/s':>9}")
    rows = []
    for pt in args.points.split(","):
        batch, length = map(int, pt.split("x"))
        q = torch.rand(batch, H * G, length, d, dtype=torch.float16, device=dev) * 2 - 1
        k = torch.rand(batch, H, length, d, dtype=torch.float16, device=dev) * 2 - 1
        v = torch.rand_like(k) * 2 - 1

        def run():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        try:
            ms = timed(run, args.reps, flush)
            gqa = "enable_gqa"
        except RuntimeError:
            # Older flash backends take no GQA: repeat K/V to every query head (not timed).
            kr, vr = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)

            def run():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(q, kr, vr, is_causal=True)

            ms = timed(run, args.reps, flush)
            gqa = "repeat_kv"
        flops = 4.0 * 0.5 * length * length * d * H * G * batch
        tflops = flops / (ms * 1e-3) / 1e12
        print(f"{batch:6d} {length:7d} {ms:10.3f} {tflops:9.1f}  ({gqa})")
        rows.append({"batch": batch, "length": length, "time_ms": round(ms, 4), "tflops": round(tflops, 2),
                     "gqa": gqa})
        del q, k, v
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "mixkv-sdpa-prefill-reference", "schema_version": 1, "device": name,
                       "torch": torch.__version__, "backend": "FLASH_ATTENTION", "heads": H, "group_size": G,
                       "head_dim": d, "reps": args.reps, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
