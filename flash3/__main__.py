"""``python -m flash3``: environment report, self-check, and a speed table.

Exit code 1 when the self-check of the active backend fails.
"""

import platform
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import flash3
from flash3 import _backend
from flash3.fp8 import attention_fp64_reference


def environment(device):
    print("== environment")
    print(f"python        {platform.python_version()}")
    print(f"torch         {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        print(f"device        {torch.cuda.get_device_name(device)} (sm_{cap[0]}{cap[1]})")
    else:
        print("device        no CUDA device (CPU)")
    from flash3 import _build_info
    if _backend.has_extension():
        print("flash3._C     built (Hopper kernels available)")
    elif hasattr(flash3, "_C_IMPORT_ERROR"):  # the file is there but does not load
        print("flash3._C     built but does not load: " + flash3._C_IMPORT_ERROR)
        print("              usually a torch other than the one it was built against"
              f" ({_build_info.TORCH or 'unknown'}); reinstall flash3 with the torch you run")
    else:
        print("flash3._C     not built: every call runs the reference backend")
        print(f"              why: {_why_not_built(_build_info)}")
        print("              to get the Hopper kernels: on a machine with CUDA torch and nvcc >= 12.3,")
        print("              pip install --no-build-isolation .   (README, 'Building for Hopper')")
    if _build_info.CUDA_EXTENSION is not None and _backend.has_extension():
        print(f"install       with the CUDA extension: {_build_info.REASON}")
    if _backend.has_extension():
        print(f"kernel_info   {_backend.kernel_info()}")


def _why_not_built(build_info) -> str:
    """The install's own record when there is one, else what this environment lacks."""
    if build_info.CUDA_EXTENSION is False:
        return build_info.REASON
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build (no CUDA)"
    return build_info.REASON


def self_check(device) -> bool:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    backend = "kernel" if (device.type == "cuda" and _backend.has_extension()) else "reference"
    print(f"\n== self-check ({backend} backend, {dtype}, vs fp64)")
    shapes = [  # (b, s_q, s_k, h, h_k, d, causal, window, softcap)
        (2, 128, 128, 4, 4, 64, False, (-1, -1), 0.0),
        (1, 113, 300, 4, 1, 128, True, (-1, -1), 0.0),
        (2, 257, 129, 6, 2, 64, True, (32, -1), 0.0),
        (1, 200, 200, 2, 2, 128, False, (16, 16), 30.0),
    ]
    ok = True
    for b, s_q, s_k, h, h_k, d, causal, window, softcap in shapes:
        q = torch.randn(b, s_q, h, d, device=device, dtype=dtype)
        k = torch.randn(b, s_k, h_k, d, device=device, dtype=dtype)
        v = torch.randn(b, s_k, h_k, d, device=device, dtype=dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = flash3.attention(q, k, v, causal=causal, window_size=window, softcap=softcap)
        ref, _ = attention_fp64_reference(q, k, v, causal=causal, window_size=window,
                                          softcap=softcap)
        err = (out.double() - ref).abs().max().item()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        passed = err <= tol
        ok &= passed
        print(f"  {'PASS' if passed else 'FAIL'}  b={b} s_q={s_q} s_k={s_k} h={h} h_k={h_k} "
              f"d={d} causal={causal} window={window} softcap={softcap}  max err {err:.2e}")
    return ok


def timed(fn, device, reps):
    fn()
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def speed(device):
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    shapes = [(4, 4096, 16, 128), (2, 8192, 16, 128)] if cuda else [(1, 1024, 8, 64)]
    reps = 10 if cuda else 2
    print(f"\n== speed vs torch scaled_dot_product_attention ({device.type}, {dtype}, forward)")
    print(f"  {'b':>2} {'s':>5} {'h':>3} {'d':>4} {'causal':>6} {'flash3 ms':>10} {'TFLOP/s':>8} "
          f"{'sdpa ms':>8} {'TFLOP/s':>8} {'ratio':>6}")
    for b, s, h, d in shapes:
        q, k, v = (torch.randn(b, s, h, d, device=device, dtype=dtype) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        for causal in (False, True):
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t_f = timed(lambda: flash3.attention(q, k, v, causal=causal), device, reps)
                t_s = timed(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                            device, reps)
            print(f"  {b:>2} {s:>5} {h:>3} {d:>4} {str(causal):>6} {t_f * 1e3:>10.1f} "
                  f"{flops / t_f / 1e12:>8.3f} {t_s * 1e3:>8.1f} {flops / t_s / 1e12:>8.3f} "
                  f"{t_s / t_f:>6.2f}")
    print("  ratio = sdpa time / flash3 time (> 1: flash3 is faster)")


def main() -> int:
    torch.manual_seed(0)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    print(f"flash3 {flash3.__version__}")
    environment(device)
    ok = self_check(device)
    speed(device)
    print("\nself-check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
