#!/usr/bin/env python3
"""The GPU's measured peaks, for the ratios in bench/gpu-results.md: torch's bf16 matmul and
fp8 _scaled_mm (e4m3, per-tensor scales) in TFLOP/s at the given square sizes, and the device
copy bandwidth (a 4 GiB clone, read + write) in GB/s. Best of 10 after 3 warm-up runs.

usage: python3 bench/peak_torch.py [N,N,...]   (default 8192,16384)
"""
import sys

import torch


def best_ms(fn, reps=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b))
    return best


def main():
    sizes = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "8192,16384").split(",")]
    dev = torch.device("cuda")
    print(f"peaks on {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print("| what | size | ms | rate |")
    print("|---|---:|---:|---:|")
    for n in sizes:
        x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        ms = best_ms(lambda: torch.matmul(x, y))
        print(f"| bf16 matmul | {n}^3 | {ms:.3f} | {2 * n ** 3 / ms / 1e9:.0f} TFLOP/s |")
        xf = x.to(torch.float8_e4m3fn)
        yf = y.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major, as _scaled_mm wants
        one = torch.ones((), device=dev)
        ms = best_ms(lambda: torch._scaled_mm(xf, yf, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        print(f"| fp8 e4m3 _scaled_mm | {n}^3 | {ms:.3f} | {2 * n ** 3 / ms / 1e9:.0f} TFLOP/s |")
        del x, y, xf, yf
    buf = torch.empty(4 << 30, dtype=torch.uint8, device=dev)
    ms = best_ms(lambda: buf.clone())
    print(f"| device copy (clone) | 4 GiB | {ms:.3f} | {2 * (4 << 30) / ms / 1e6:.0f} GB/s |")


if __name__ == "__main__":
    main()
