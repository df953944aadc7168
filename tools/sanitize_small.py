"""Small forward-kernel launches for compute-sanitizer (memcheck, racecheck, synccheck).

    python tools/sanitize_small.py                          # every feature path once (14 launches)
    python tools/sanitize_small.py bf16:128:128/causal ...  # just these smoke cases

The cases are tools/smoke.py's (lengths that leave partial tiles). Checks only that outputs are
finite and fully written; correctness lives in tools/smoke.py and tests/test_kernel_gpu.py. Run
with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so memcheck sees each tensor's real bounds.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smoke  # noqa: E402

import flash3  # noqa: E402,F401  (loads flash3._C)

DEFAULT = ([f"bf16:{d}:{dv}/{f}" for d, dv in [(64, 64), (128, 128), (192, 128), (256, 256)]
            for f in ("full", "causal")]
           + ["fp16:128:128/window", "fp16:128:128/softcap", "bf16:128:128/gqa",
              "bf16:128:128/varlen", "bf16:128:128/kvcache", "e4m3:128:128/causal"])


def main(cases):
    built = set(smoke.kernel_ids(json.loads(torch.ops.flash3.kernel_info())))
    ran = 0
    for case in cases:
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
