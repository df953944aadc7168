"""Small kernel launches for compute-sanitizer (memcheck, racecheck, synccheck).

    python tools/sanitize_small.py                          # every feature path once (15 cases)
    python tools/sanitize_small.py bf16:128:128/causal ...  # just these smoke cases
    python tools/sanitize_small.py bwd:bf16:128:128/causal  # one backward launch (bwd_sm90)

The cases are tools/smoke.py's (lengths that leave partial tiles); a bwd: case is its backward
case (out/lse from the forward kernel, then flash3::bwd_sm90), skipped when the build has no
backward kernel. Checks only that outputs are finite
and fully written; correctness lives in tools/smoke.py, tests/test_kernel_gpu.py and
tests/test_bwd_gpu.py. Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so memcheck sees each tensor's
real bounds.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smoke  # noqa: E402

import flash3  # noqa: E402,F401  (loads flash3._C)
from flash3 import _backend  # noqa: E402

DEFAULT = ([f"bf16:{d}:{dv}/{f}" for d, dv in [(64, 64), (128, 128), (192, 128), (256, 256)]
            for f in ("full", "causal")]
           + ["fp16:128:128/window", "fp16:128:128/softcap", "bf16:128:128/gqa",
              "bf16:128:128/varlen", "bf16:128:128/kvcache", "e4m3:128:128/causal",
              "bwd:bf16:128:128/causal"])


def run_bwd(case):
    """One backward case of tools/smoke.py (any feature): out/lse from the forward kernel, then
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
