"""Bandwidth of the fused FP8 rotate-and-quantize kernel (flash3::quantize_fp8_sm90).

For each case it times the kernel (CUDA events, median of --iters after warm-up) and a
device-to-device copy of the same number of bytes (bytes read + written by the kernel: x in
bf16, e4m3 out, fp32 descales) in the same run, and prints a markdown table with GB/s and the
kernel's fraction of the copy's bandwidth (target: >= 80%).

    python benchmarks/bench_quantize.py [--b 4 --s 8192 --h 16] [--iters 50]

GPU only (an sm_90 device and a flash3._C built with the quantize kernel); exits with a message
otherwise.
"""
import argparse
import sys

import torch


def time_ms(fn, iters, warmup=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        e.record()
        e.synchronize()
        times.append(a.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--s", type=int, default=8192)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_quantize: needs a CUDA GPU (none visible); nothing measured")
        return 0
    from flash3 import _quantize
    if not _quantize.available():
        print("bench_quantize: flash3._C without quantize_fp8_sm90 "
              "(pip install --no-build-isolation .); nothing measured")
        return 0
    if torch.cuda.get_device_capability()[0] != 9:
        print(f"bench_quantize: needs an sm_90 device, got {torch.cuda.get_device_name()}")
        return 0
    print(f"device: {torch.cuda.get_device_name()}; b={args.b} s={args.s} h={args.h} "
          f"block_size={args.block_size}, bf16 input\n")
    print("| d | hadamard | layout | kernel ms | kernel GB/s | copy GB/s | kernel / copy |")
    print("|---|---|---|---|---|---|---|")
    for d in (int(v) for v in args.dims.split(",")):
        x = torch.randn(args.b, args.s, args.h, d, device="cuda", dtype=torch.bfloat16)
        nb = -(-args.s // args.block_size)
        nbytes = x.numel() * 2 + x.numel() + args.b * args.h * nb * 4
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy_ms = time_ms(lambda: dst.copy_(src), args.iters)
        copy_gbs = nbytes / copy_ms / 1e6  # copy moves nbytes // 2 read + written
        for had in (False, True):
            for layout in ("rows", "v_packed"):
                # The op itself on preallocated outputs (the wrapper's allocations and checks
                # are host work; what is measured is the kernel's device time).
                out, desc = _quantize.quantize_fp8_cuda(x, block_size=args.block_size,
                                                        hadamard=had, layout=layout)
                signs = _quantize.device_signs(d, 0, x.device) if had else None
                lay = _quantize.LAYOUTS[layout]
                op = torch.ops.flash3.quantize_fp8_sm90
                ms = time_ms(lambda: op(x, signs, None, None, args.block_size, lay, out, desc),
                             args.iters)
                gbs = nbytes / ms / 1e6
                print(f"| {d} | {had} | {layout} | {ms:.4f} | {gbs:.0f} | {copy_gbs:.0f} | "
                      f"{gbs / copy_gbs:.0%} |")
        del x, src, dst
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
