"""Small kernel launches for compute-sanitizer (memcheck, racecheck, synccheck).

    python tools/device/sanitize_small.py                          # every feature path once (19 cases)
    python tools/device/sanitize_small.py bf16:128:128/causal ...  # just these smoke cases
    python tools/device/sanitize_small.py bwd:bf16:128:128/causal  # one backward launch (bwd_sm90)
    python tools/device/sanitize_small.py decode:bf16:128:128/page16-fp8  # one decode launch (below)

The cases are tools/smoke/smoke.py's (lengths that leave partial tiles); a bwd: case is its backward
case (out/lse from the forward kernel, then flash3::bwd_sm90), skipped when the build has no
backward kernel. Checks only that outputs are finite
and fully written; correctness lives in tools/smoke/smoke.py, tests/test_kernel_gpu.py and
tests/test_bwd_gpu.py. Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so memcheck sees each tensor's
real bounds.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "smoke"))
import smoke  # noqa: E402

import flash3  # noqa: E402,F401  (loads flash3._C)
from flash3 import _backend  # noqa: E402

DEFAULT = ([f"bf16:{d}:{dv}/{f}" for d, dv in [(64, 64), (128, 128), (192, 128), (256, 256)]
            for f in ("full", "causal")]
           + ["fp16:128:128/window", "fp16:128:128/softcap", "bf16:128:128/gqa",
              "bf16:128:128/varlen", "bf16:128:128/kvcache", "e4m3:128:128/causal",
              "bwd:bf16:128:128/causal", "decode:bf16:128:128/contig", "decode:bf16:128:128/page16",
              "decode:bf16:128:128/page16-fp8", "decode:bf16:128:128/page256-fp8"])


def run_decode(case):
    """decode:<dtype>:<d>:<d_v>/<contig|pageN>[-fp8]: one flash3::fwd_kvcache_sm90 launch (3
    splits, packed GQA 4, a bad page id and a length past the cache) into NaN-poisoned out/lse;
    False when that kernel is not built."""
    kernel, feature = case.split("/")
    _, dt, d, dv = kernel.split(":")
    d, dv = int(d), int(dv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
    fp8 = feature.endswith("-fp8")
    page = None if feature.startswith("contig") else int(feature.split("-")[0][4:])
    if (dtype, d, dv) not in _backend.kernel_decode_configs(fp8):
        print(f"sanitize_small: {case}: kernel not built, skipped")
        return False
    b, h, h_k, cap = 3, 8, 2, 600
    if page is None:
        shape, pt = (b, cap, h_k), None
    else:
        pages = b * (-(-cap // page)) + 2
        shape = (pages, page, h_k)
        pt = torch.randperm(pages, device="cuda")[:pages - 2].view(b, -1).to(torch.int32)
        pt[1, 1] = pages + 5  # a bad page id: reads zeros, never outside the cache
    kc, vc = torch.randn(*shape, d, device="cuda"), torch.randn(*shape, dv, device="cuda")
    descales = (None, None)
    if fp8:
        descales = tuple(torch.full(shape[:1] + (h_k,), 0.05, device="cuda") for _ in range(2))
        kc, vc = kc.div(0.05).to(torch.float8_e4m3fn), vc.div(0.05).to(torch.float8_e4m3fn)
    else:
        kc, vc = kc.to(dtype), vc.to(dtype)
    q = torch.randn(b, 2, h, d, device="cuda", dtype=dtype)
    lens = torch.tensor([1, 333, 10**6], device="cuda", dtype=torch.int32)
    out = torch.full((b, 2, h, dv), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((b, h, 2), float("nan"), device="cuda")
    torch.ops.flash3.fwd_kvcache_sm90(q, kc, vc, out, lse, lens, pt, d ** -0.5, -1, 0, 0.0, 3,
                                      *descales)
    assert torch.isfinite(out).all(), f"{case}: non-finite or unwritten output"
    assert not torch.isnan(lse).any(), f"{case}: unwritten lse"
    return True


def run_bwd(case):
    """One backward case of tools/smoke/smoke.py (any feature): out/lse from the forward kernel, then
    bwd_sm90 into NaN-poisoned dq/dk/dv; False when skipped."""
    kernel, feature = case.split("/")
    dt, d, dv = smoke.parse_kernel(kernel)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
    reason = (None if _backend.has_bwd_kernel() else "no flash3::bwd_sm90 in this build") or \
        _backend.call_bwd_reason(dtype, d, dv, 1.0) or _backend.call_fwd_reason(dtype, d, dv, 1.0)
    if reason:
        print(f"sanitize_small: {case}: {reason}, skipped")
        return False
    _, _, grads, _ = smoke.launch_bwd(smoke.make_case(feature, dt, d, dv, bwd=True))
    for name, x in zip("qkv", grads):
        assert torch.isfinite(x).all(), f"{case}: non-finite or unwritten d{name}"
    return True


def main(cases):
    built = set(smoke.kernel_ids(json.loads(torch.ops.flash3.kernel_info())))
    ran = 0
    for case in cases:
        if case.startswith("bwd:"):
            ran += run_bwd(case)
            continue
        if case.startswith("decode:"):
            ran += run_decode(case)
            continue
        kernel, feature = case.split("/")
        if kernel not in built:
            print(f"sanitize_small: {case}: kernel not built, skipped")
            continue
        c = smoke.make_case(feature, *smoke.parse_kernel(kernel))
        out, lse = smoke.launch(c)
        assert torch.isfinite(out).all(), f"{case}: non-finite or unwritten output"
        assert not torch.isnan(lse).any(), f"{case}: unwritten lse"
        ran += 1
    print(f"sanitize_small: {ran} launch(es) done")
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or DEFAULT))
