#!/usr/bin/env python3
"""What the tensor cores keep of an FP8 product sum, on a GPU (cuBLAS FP8 GEMM, torch._scaled_mm):
the facts the simulator's QGMMA and flash3's FP8 emulation must model. Row 0 of A times column 0
of B = 1 + x, x = k * 2^-m built from two e4m3 factors; prints the fp32 result's bits beyond 1.0
in units of 2^-24 beside the exact value. On an H200 (2026-11-28, benchmarks/results/
h200_2026-11-28/fp8_accum_probe.txt): terms below 2^-13 of the largest are truncated, per k-chunk,
the accumulator included in the alignment.

    python tools/device/fp8_accum_probe.py
"""
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("fp8_accum_probe: needs a CUDA GPU with FP8 tensor cores (sm_89+)")
dev = "cuda"
f8 = torch.float8_e4m3fn
def run(avals, bvals, K=32, fast=True):
    a = torch.zeros(16, K, device=dev); b = torch.zeros(K, 16, device=dev)
    for i, (x, y) in enumerate(zip(avals, bvals)):
        a[0, i] = x; b[i, 0] = y
    a8 = a.to(f8); b8 = b.to(f8).t().contiguous().t()  # B column-major
    one = torch.ones((), device=dev)
    c = torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
    return c[0, 0].item()
print("K=32, A=[1, 2^-p], B=[1, k*2^-q]: result - 1 in units of 2^-24 (exact = k*2^(24-p-q))")
for fast in (True, False):
    rows = []
    for m in range(10, 19):
        for k in (1, 3, 5, 7):
            p = min(9, m - 3); q = m - p  # 2^-p * (k * 2^-q) = k * 2^-m; k*2^-q in e4m3
            got = run([1.0, 2.0 ** -p], [1.0, k * 2.0 ** -q], fast=fast)
            rows.append(f"m={m} k={k}: {round((got - 1.0) * 2**24)} (exact {k * 2**(24 - m)})")
    print(f"use_fast_accum={fast}:"); print("  " + "\n  ".join(rows))
# Order: the small term first, then 1.
got = run([2.0 ** -7, 1.0], [2.0 ** -7, 1.0])
print("small first (2^-14 + 1):", round((got - 1) * 2**24), "exact", 2**10)
# Many small terms after a large one: 1 + 31 * 2^-14 within one k=32 instruction.
got = run([1.0] + [2.0 ** -7] * 31, [1.0] + [2.0 ** -7] * 31)
print("1 + 31*2^-14 in one K=32:", round((got - 1) * 2**24), "exact", 31 * 2**10)
got = run([1.0] + [2.0 ** -7] * 127, [1.0] + [2.0 ** -7] * 127, K=128)
print("1 + 127*2^-14 over K=128:", round((got - 1) * 2**24), "exact", 127 * 2**10)
got = run([2.0 ** -7] * 127 + [1.0], [2.0 ** -7] * 127 + [1.0], K=128)
print("127*2^-14 then 1 over K=128:", round((got - 1) * 2**24), "exact", 127 * 2**10)
