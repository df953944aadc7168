"""Small forward-kernel launches for compute-sanitizer (memcheck, racecheck): every feature path
once, at lengths that leave partial tiles. Checks only that outputs are finite and fully written;
correctness lives in tests/test_kernel_gpu.py."""
import json

import torch

import flash3  # noqa: F401  (loads flash3._C)

built = {(dt, d, dv) for dt, d, dv in json.loads(torch.ops.flash3.kernel_info())["fwd"]}
dev = "cuda"


def launch(dtype, d, dv, sq, sk, h=2, hk=1, b=2, causal=False, window=(-1, -1), softcap=0.0, varlen=False):
    name = "bf16" if dtype == torch.bfloat16 else "fp16"
    if (name, d, dv) not in built:
        return
    if varlen:
        q = torch.randn(b * sq, h, d, device=dev, dtype=dtype)
        k = torch.randn(b * sk, hk, d, device=dev, dtype=dtype)
        v = torch.randn(b * sk, hk, dv, device=dev, dtype=dtype)
        cu_q = torch.arange(0, b * sq + 1, sq, device=dev, dtype=torch.int32)
        cu_k = torch.arange(0, b * sk + 1, sk, device=dev, dtype=torch.int32)
        out = torch.full((b * sq, h, dv), float("nan"), device=dev, dtype=dtype)
        lse = torch.full((h, b * sq), float("nan"), device=dev)
    else:
        q = torch.randn(b, sq, h, d, device=dev, dtype=dtype)
        k = torch.randn(b, sk, hk, d, device=dev, dtype=dtype)
        v = torch.randn(b, sk, hk, dv, device=dev, dtype=dtype)
        cu_q = cu_k = None
        out = torch.full((b, sq, h, dv), float("nan"), device=dev, dtype=dtype)
        lse = torch.full((b, h, sq), float("nan"), device=dev)
    torch.ops.flash3.fwd_sm90(q, k, v, out, lse, cu_q, cu_k, None, sq, sk, d ** -0.5, causal,
                              window[0], window[1], softcap)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), (dtype, d, dv, sq, sk, causal, window, varlen)
    assert not torch.isnan(lse).any()


for d, dv in [(64, 64), (128, 128), (192, 128), (256, 256)]:
    launch(torch.bfloat16, d, dv, 113, 203)
    launch(torch.bfloat16, d, dv, 203, 113, causal=True)
launch(torch.float16, 128, 128, 77, 77, window=(32, 8), softcap=30.0)
launch(torch.bfloat16, 128, 128, 65, 130, varlen=True, causal=True)
print("sanitize_small: all launches done")
