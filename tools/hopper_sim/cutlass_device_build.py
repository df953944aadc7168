#!/usr/bin/env python3
"""CUTLASS's Hopper GEMM examples that validate the timing model (48 tf32, 49 fp16, 54 fp8; the
rows of perf_model.gemm_rows) built from the same wheel sources and flags as the simulator's build
(cutlass_examples.py), but for a real GPU: sm_90a machine code only and the CUDA runtime linked in
statically (the device image's libcudart may differ from this machine's). 54's driver calls link
against cutlass_examples' libcuda stub (soname libcuda.so.1): the GPU machine's driver library
resolves them at run time. tools/device/cutlass_gemms.py times them there.

  python tools/hopper_sim/cutlass_device_build.py [--out .carry/cutlass]

Writes OUT/48, OUT/49, OUT/54 (~2-5 min each on two cores).
"""
import argparse
import os
import subprocess
import sys
import time

import cutlass_examples as ce

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICE_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a", "-cudart", "static"]
GEMMS = ("48_hopper_warp_specialized_gemm", "49_hopper_gemm_with_collective_builder",
         "54_hopper_fp8_warp_specialized_gemm")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, ".carry", "cutlass"))
    a = ap.parse_args(argv)
    src_root, curand = ce.cutlass_source(), ce.curand_include()
    os.makedirs(a.out, exist_ok=True)
    for name in GEMMS:
        nvcc, flags, src = ce.nvcc_cmd(name, src_root, curand)
        assert flags[:len(ce.SIM_FLAGS)] == ce.SIM_FLAGS, "cutlass_examples.nvcc_cmd starts with the sim flags"
        flags = DEVICE_FLAGS + flags[len(ce.SIM_FLAGS):]
        out = os.path.join(a.out, name.split("_")[0])
        t0 = time.time()
        p = subprocess.run([nvcc] + flags + [src, "-o", out + ".tmp"], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"cutlass_device_build: {name}: build failed\n{(p.stdout + p.stderr)[-3000:]}")
            return 1
        os.replace(out + ".tmp", out)
        print(f"cutlass_device_build: {out} ({os.path.getsize(out) / 2**20:.1f} MiB, {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
