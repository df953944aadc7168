#!/usr/bin/env python3
"""Build FlashAttention-3's sm90 bf16 forward (or its e4m3 forward, --fp8) or backward (our
benchmark peer) from a flash-attention checkout for the Hopper simulator: FA3's own instantiation
file for one head dim (+ the forward's scheduler-prepare TU) + our driver (fa3_fwd_driver.cu /
fa3_bwd_driver.cu), with the simulator's flags, against the nvidia-cutlass wheel. FA3's sources are
read from the checkout, never copied into this tree.

  FA3_SRC=/path/to/flash-attention python tools/fa3_peer/build.py --hdim 128 [--bwd | --fp8] [--out DIR]

Prints the binary's path. Forward: ~3-5 min and ~5 GB per head dim (FA3's FLASHATTENTION_DISABLE_*
defines keep one TU to the batched, non-paged, no-split, no-softcap bf16 kernels; clusters stay
enabled, as FA3 uses ClusterM 2 for large non-causal forwards). Backward (--bwd): FA3's
flash_bwd_hdim<D>_bf16_sm90.cu still instantiates causal x GQA x deterministic main kernels (no
define turns those off), so it is compiled once into an object of its own (cached; ~2 min at d 128
on two shared cores) and linked with the driver. Cached by a hash of the inputs.
"""
import argparse
import hashlib
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The simulator interposes on the shared CUDA runtime; `--cudart static` makes a binary for a real
# GPU whose image may keep libcudart elsewhere (tools/device/device_session.sh times it).
SIM_FLAGS = ["-gencode=arch=compute_90a,code=[sm_90a,compute_90a]", "-no-compress"]
# FA3's own nvcc flags (hopper/setup.py; --expt-relaxed-constexpr comes from torch's extension
# defaults there), minus -lineinfo/--resource-usage (no effect on code).
FA3_FLAGS = ["-O3", "-std=c++17", "--use_fast_math", "--expt-relaxed-constexpr", "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED",
             "-DCUTLASS_ENABLE_GDC_FOR_SM90", "-DCUTLASS_DEBUG_TRACE_LEVEL=0", "-DNDEBUG"]
# BACKWARD: only for the forward build (only flash_api.cpp, not built here, reads it).
DISABLED = ["BACKWARD", "SPLIT", "PAGEDKV", "APPENDKV", "LOCAL", "SOFTCAP", "PACKGQA", "FP16", "FP8",
            "VARLEN", "SM8x", "HDIMDIFF64", "HDIMDIFF192"]


def cutlass_include():
    import cutlass_library
    return os.path.join(os.path.dirname(os.path.abspath(cutlass_library.__file__)), "source", "include")


def fa3_commit(src):
    """The checkout's commit (FA3_COMMIT overrides it for an exported tree without .git)."""
    if os.environ.get("FA3_COMMIT"):
        return os.environ["FA3_COMMIT"]
    try:
        return subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def hopper_headers_hash(hopper, h):
    for name in sorted(os.listdir(hopper)):
        if name.endswith((".h", ".hpp")):
            with open(os.path.join(hopper, name), "rb") as f:
                h.update(name.encode() + f.read())


def nvcc(args, what):
    cmd = [os.environ.get("NVCC", "nvcc")] + args
    r = subprocess.run(cmd, capture_output=True, text=True)   # CuTe's constexpr warnings: noise
    if r.returncode != 0:
        sys.exit(f"fa3_peer: nvcc failed ({what}):\n{(r.stdout + r.stderr)[-6000:]}")


def build_bwd(a, hopper, flags):
    """FA3's backward instantiation as a cached object (the long compile), then the driver + link."""
    inst = os.path.join(hopper, "instantiations", f"flash_bwd_hdim{a.hdim}_bf16_sm90.cu")
    driver = os.path.join(HERE, "fa3_bwd_driver.cu")
    h = hashlib.sha1()
    with open(inst, "rb") as f:
        h.update(f.read())
    hopper_headers_hash(hopper, h)
    h.update("\0".join(flags).encode())
    os.makedirs(a.out, exist_ok=True)
    obj = os.path.join(a.out, f"fa3_bwd_hdim{a.hdim}-{h.hexdigest()[:12]}.o")
    if not os.path.isfile(obj):
        print("fa3_peer: building", os.path.basename(obj), "(FA3 commit", fa3_commit(a.fa3_src) or "unknown", ")",
              file=sys.stderr, flush=True)
        nvcc(flags + ["-c", inst, "-o", obj + ".tmp"], os.path.basename(inst))
        os.replace(obj + ".tmp", obj)
    with open(driver, "rb") as f:
        h.update(f.read())
    binary = os.path.join(a.out, f"fa3_bwd_hdim{a.hdim}-{h.hexdigest()[:12]}")
    if not os.path.isfile(binary):
        nvcc(flags + [driver, obj, "-o", binary + ".tmp"], "fa3_bwd_driver.cu")
        os.replace(binary + ".tmp", binary)
    return binary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hdim", type=int, required=True, choices=[64, 96, 128, 192, 256])
    ap.add_argument("--fa3-src", default=os.environ.get("FA3_SRC"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "fa3_peer"))
    ap.add_argument("--cudart", choices=["shared", "static"], default="shared")
    ap.add_argument("--bwd", action="store_true", help="FA3's backward (preprocess, main kernel, dQ conversion) "
                    "with fa3_bwd_driver.cu instead of the forward")
    ap.add_argument("--fp8", action="store_true", help="FA3's e4m3 forward (flash_fwd_hdim<D>_e4m3_sm90.cu: q/k/v "
                    "FP8, out bf16, V transposed in the kernel) instead of the bf16 one")
    a = ap.parse_args()
    if a.bwd and a.fp8:
        sys.exit("fa3_peer: --fp8 is a forward; FA3 has no FP8 backward")
    if not a.fa3_src or not os.path.isfile(os.path.join(a.fa3_src, "hopper", "flash.h")):
        sys.exit("fa3_peer: give the flash-attention checkout (FA3_SRC=... or --fa3-src): hopper/flash.h not found")
    hopper = os.path.join(a.fa3_src, "hopper")
    disabled = [d for d in DISABLED if not (a.bwd and d == "BACKWARD") and not (a.fp8 and d == "FP8")] + [f"HDIM{x}" for x in (64, 96, 128, 192, 256) if x != a.hdim]
    flags = SIM_FLAGS + ["-cudart", a.cudart] + FA3_FLAGS + [f"-DFLASHATTENTION_DISABLE_{d}" for d in disabled] + [
        f"-DFA3_HDIM={a.hdim}", "-I" + hopper, "-I" + cutlass_include()] + (["-DFA3_FP8"] if a.fp8 else [])
    if a.bwd:
        print(build_bwd(a, hopper, flags))
        return
    dtype = "e4m3" if a.fp8 else "bf16"
    inst = os.path.join(hopper, "instantiations", f"flash_fwd_hdim{a.hdim}_{dtype}_sm90.cu")
    srcs = [inst, os.path.join(hopper, "flash_prepare_scheduler.cu"), os.path.join(HERE, "fa3_fwd_driver.cu")]
    h = hashlib.sha1()
    for s in srcs:
        with open(s, "rb") as f:
            h.update(f.read())
    hopper_headers_hash(hopper, h)
    h.update("\0".join(flags).encode())
    os.makedirs(a.out, exist_ok=True)
    binary = os.path.join(a.out, f"fa3_fwd{'_e4m3' if a.fp8 else ''}_hdim{a.hdim}-{h.hexdigest()[:12]}")
    if not os.path.isfile(binary):
        print("fa3_peer: building", os.path.basename(binary), "(FA3 commit", fa3_commit(a.fa3_src) or "unknown", ")",
              file=sys.stderr, flush=True)
        nvcc(flags + srcs + ["-o", binary + ".tmp"], "forward")
        os.replace(binary + ".tmp", binary)
    print(binary)


if __name__ == "__main__":
    main()
