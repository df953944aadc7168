#!/usr/bin/env python3
"""The tensor cores' FP8 accumulation as measured on an H200 (tools/fp8_accum_probe.py), put into
flash3's FP8 emulation and compared with what the H200 measured for flash3's FP8 kernel (CPU only).

The model: a k32 chunk's products and the running accumulator are aligned to the largest exponent
among them, every term truncated toward zero to 2^(e_max - 13), then summed (exactly). The script
runs the smoke matrix's FP8 cases (the same inputs the H200 ran: smoke.make_case, generated on the
CPU) through flash3.reference.fp8's emulation twice, with fp32 matmuls (the emulation) and with the
model, and prints per case: rms(model - emulation) beside the H200's rms(kernel - emulation), and
the lse difference beside the H200's (benchmarks/results/h200_2026-11-28/smoke_fp8_cases.json).

    python tools/fp8_trunc_model.py [--bits 13] [--hdims 64,128,256]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT)]
import smoke  # noqa: E402
import flash3.reference.fp8 as emulation  # noqa: E402

H200 = ROOT / "benchmarks" / "results" / "h200_2026-11-28" / "smoke_fp8_cases.json"


def truncating_matmul(bits: int, chunk: int = 32):
    """matmul(a, b) of exact e4m3 values (and P rounded to e4m3) with the measured accumulation."""
    def mm(a, b):
        a, b = a.double(), b.double()
        shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        acc = torch.zeros(shape, dtype=torch.float64)
        for k0 in range(0, a.shape[-1], chunk):
            terms = torch.cat([acc[..., :, None, :], a[..., :, k0:k0 + chunk, None] * b[..., None, k0:k0 + chunk, :]],
                              dim=-2)
            mx = terms.abs().amax(dim=-2, keepdim=True)
            ulp = torch.exp2(torch.floor(torch.log2(torch.where(mx > 0, mx, torch.ones_like(mx)))) - bits)
            acc = (torch.trunc(terms / ulp) * ulp).sum(-2)
        return acc.float()
    return mm


class _Torch:
    """torch, with matmul replaced (flash3.reference.fp8 calls torch.matmul for both GEMMs)."""
    def __init__(self, mm):
        self.matmul = mm

    def __getattr__(self, name):
        return getattr(torch, name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bits", type=int, default=13)
    ap.add_argument("--hdims", default="64,128,256")
    a = ap.parse_args()
    h200 = {(c["kernel"], c["feature"]): c for c in json.loads(H200.read_text())}
    rms = lambda x: x.double().pow(2).mean().sqrt().item()  # noqa: E731
    print(f"{'case':24} {'model rms':>10} {'H200 rms':>10} {'sharp':>9} {'model lse':>10} {'H200 lse':>10}")
    for d in map(int, a.hdims.split(",")):
        kid = f"e4m3:{d}:{d}"
        for feat in smoke.kernel_features(kid):
            if not smoke.applies(kid, feat):
                continue
            c = smoke.make_case(feat, "e4m3", d, d, device="cpu", seed=0)
            emulation.torch = torch
            ref, lse = smoke.fp8_reference(c)
            emulation.torch = _Torch(truncating_matmul(a.bits))
            try:
                got, got_lse = smoke.fp8_reference(c)
            finally:
                emulation.torch = torch
            fin = torch.isfinite(lse)
            dl = (got_lse[fin] - lse[fin]).abs().max().item() if fin.any() else 0.0
            hw = h200.get((kid, feat), {})
            print(f"{kid + ' ' + feat:24} {rms(got - ref):10.2e} {hw.get('err', float('nan')):10.2e} "
                  f"{2 ** -8 * rms(ref) + 1e-6:9.2e} {dl:10.2e} {hw.get('lse_err', float('nan')):10.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
