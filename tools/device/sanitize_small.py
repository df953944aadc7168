"""Small kernel launches for compute-sanitizer (memcheck, racecheck, synccheck).

    python tools/device/sanitize_small.py                          # every feature path once (19 cases)
    python tools/device/sanitize_small.py bf16:128:128/causal ...  # just these smoke cases
    python tools/device/sanitize_small.py bwd:bf16:128:128/causal  # one backward launch (bwd_sm90)
    python tools/device/sanitize_small.py decode:bf16:128:128/page16-fp8  # one decode launch (below)
    python tools/device/sanitize_small.py dec:kve4m3:bf16:128:128/fa3rot quant:bf16/rows  # any smoke case

The cases are tools/smoke/smoke.py's (lengths that leave partial tiles): any kernel/feature of its
matrix (smoke.kernel_ids' kernels: forward, e4m3, bwd:, dec:, dec:kve4m3:, quant:, each with the
features smoke.applies gives it), every launch (part) of the case as smoke.py's worker runs it; a
bwd: case is its backward case (out/lse from the forward kernel, or the reference's where
smoke.fwd_by_reference, then flash3::bwd_sm90), skipped when the build has no backward kernel;
a dec: case the fused append (when it appends) then the decode kernel (smoke.launch_dec); a quant:
case the FP8 quantize kernel (smoke_quant.launch). The decode: prefix names this script's own
decode cases (run_decode). Checks only that outputs are finite and fully written; correctness
lives in tools/smoke/smoke.py, tests/test_kernel_gpu.py and tests/test_bwd_gpu.py. Run with
PYTORCH_NO_CUDA_MEMORY_CACHING=1 so memcheck sees each tensor's real bounds.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "smoke"))
import smoke  # noqa: E402
import smoke_quant  # noqa: E402

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


def smoke_case(case):
    """(kernel, feature) of a tools/smoke/smoke.py case id; ValueError naming the kernel's features
    when the feature is none of them (smoke.applies)."""
    kernel, feature = case.split("/")
    if not smoke.applies(kernel, feature):
        raise ValueError(f"{case}: {feature!r} is not a smoke feature of {kernel} (its features: "
                         f"{', '.join(smoke.kernel_features(kernel))})")
    return kernel, feature


def run_bwd(case):
    """One backward case of tools/smoke/smoke.py (any feature, every part): out/lse from the forward
    kernel (smoke.fwd_by_reference: the reference's), then bwd_sm90 into NaN-poisoned dq/dk/dv;
    False when skipped."""
    kernel, feature = smoke_case(case)
    dt, d, dv = smoke.parse_kernel(kernel)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
    reason = (None if _backend.has_bwd_kernel() else "no flash3::bwd_sm90 in this build") or \
        _backend.call_bwd_reason(dtype, d, dv, 1.0) or _backend.call_fwd_reason(dtype, d, dv, 1.0)
    if reason:
        print(f"sanitize_small: {case}: {reason}, skipped")
        return False
    for c in smoke.make_cases(feature, dt, d, dv, bwd=True):
        _, _, grads, _ = smoke.launch_bwd(c)
        for name, x in zip(("dq", "dk", "dv", "dsinks"), grads):
            assert torch.isfinite(x).all(), f"{case}: non-finite or unwritten {name}"
    return True


def _assert_written_e4m3(case, name, x):
    """No e4m3 NaN byte (0x7F / 0xFF: the poison) in x."""
    assert not ((x.view(torch.uint8) & 0x7F) == 0x7F).any(), f"{case}: NaN bytes (unwritten?) in {name}"


def run_smoke(case):
    """Any other case of tools/smoke/smoke.py's matrix (forward, e4m3, dec:, dec:kve4m3:, quant:
    kernels), every part as its worker launches them, into its poisoned outputs: out finite (the
    rows of some sequence), lse not NaN, the rotated q (q_out) and the quantize kernel's outputs
    written. False when the kernel is not built."""
    kernel, feature = smoke_case(case)
    if kernel not in set(smoke.built_kernel_ids()):
        print(f"sanitize_small: {case}: kernel not built, skipped")
        return False
    fam = smoke.family(kernel)
    if fam == "dec":
        for p in smoke.make_dec_case(feature, kernel):
            r = smoke.launch_dec(p)
            assert torch.isfinite(r["out"]).all(), f"{case}: non-finite or unwritten output"
            assert not torch.isnan(r["lse"]).any(), f"{case}: unwritten lse"
            q_out = r.get("q_out")
            if q_out is not None and q_out.dtype == torch.float8_e4m3fn:
                _assert_written_e4m3(case, "q_out", q_out)
            elif q_out is not None:
                assert not torch.isnan(q_out).any(), f"{case}: unwritten q_out"
    elif fam == "quant":
        for p in smoke_quant.make_case(feature, kernel):
            r = smoke_quant.launch(p)
            _assert_written_e4m3(case, "out", r["out"])
            assert not torch.isnan(r["descale"]).any(), f"{case}: unwritten descale"
    else:
        for c in smoke.make_cases(feature, *smoke.parse_kernel(kernel)):
            out, lse = smoke.launch(c)
            # nantail: the packed rows past cu_seqlens[-1] keep their NaN poison (nothing may write them)
            out, lse = out[smoke.used_rows(c, "out")], lse[:, smoke.used_rows(c, "q")]
            assert torch.isfinite(out).all(), f"{case}: non-finite or unwritten output"
            assert not torch.isnan(lse).any(), f"{case}: unwritten lse"
    return True


def main(cases):
    ran = 0
    for case in cases:
        if case.startswith("decode:"):  # this script's own decode cases
            ran += run_decode(case)
        elif case.startswith("bwd:"):
            ran += run_bwd(case)
        else:
            ran += run_smoke(case)
    print(f"sanitize_small: {ran} launch(es) done")
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or DEFAULT))
