#!/usr/bin/env python3
"""How much the tensor cores' FP8 accumulation moves flash3's FP8 results, beside what the H200
measured (CPU only): the evidence that flash3.reference.fp8.fp8_mma's rule is the hardware's.

The rule (tools/device/fp8_accum_probe.py measured it): a k32 chunk's products and the running
accumulator are aligned to the largest exponent among them, every term truncated toward zero to
2^(e_max - bits), then summed exactly; bits = 13 on the H200. The H200's smoke errors
(benchmarks/results/h200_2026-11-28/smoke_fp8_cases.json) were measured against the emulation as
it was then, with fp32 products. The script runs the smoke matrix's FP8 cases (the same inputs the
H200 ran: smoke.make_case, generated on the CPU) through flash3.reference.fp8's emulation twice,
with fp32 products (FP8_MMA_KEPT_BITS = None) and with the rule at --bits, and prints per case:
rms(rule - fp32) beside the H200's rms(kernel - fp32 emulation), and the lse difference beside the
H200's.

    python tools/smoke/fp8_trunc_model.py [--bits 13] [--hdims 64,128,256]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools" / "smoke"), str(ROOT)]
import smoke  # noqa: E402
import flash3.reference.fp8 as emulation  # noqa: E402

H200 = ROOT / "benchmarks" / "results" / "h200_2026-11-28" / "smoke_fp8_cases.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bits", type=int, default=13)
    ap.add_argument("--hdims", default="64,128,256")
    a = ap.parse_args()
    kept = emulation.FP8_MMA_KEPT_BITS
    h200 = {(c["kernel"], c["feature"]): c for c in json.loads(H200.read_text())}
    rms = lambda x: x.double().pow(2).mean().sqrt().item()  # noqa: E731
    print(f"{'case':24} {'model rms':>10} {'H200 rms':>10} {'sharp':>9} {'model lse':>10} {'H200 lse':>10}")
    for d in map(int, a.hdims.split(",")):
        kid = f"e4m3:{d}:{d}"
        for feat in smoke.kernel_features(kid):
            if not smoke.applies(kid, feat):
                continue
            c = smoke.make_case(feat, "e4m3", d, d, device="cpu", seed=0)
            emulation.FP8_MMA_KEPT_BITS = None
            try:
                ref, lse = smoke.fp8_reference(c)
                emulation.FP8_MMA_KEPT_BITS = a.bits
                got, got_lse = smoke.fp8_reference(c)
            finally:
                emulation.FP8_MMA_KEPT_BITS = kept
            fin = torch.isfinite(lse)
            dl = (got_lse[fin] - lse[fin]).abs().max().item() if fin.any() else 0.0
            hw = h200.get((kid, feat), {})
            print(f"{kid + ' ' + feat:24} {rms(got - ref):10.2e} {hw.get('err', float('nan')):10.2e} "
                  f"{2 ** -8 * rms(ref) + 1e-6:9.2e} {dl:10.2e} {hw.get('lse_err', float('nan')):10.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
