"""The fused FP8 rotate-and-quantize kernel (torch.ops.flash3.quantize_fp8_sm90, csrc/flash3/fp8/
quantize.cu) as a family of tools/smoke/smoke.py: ids quant:bf16 and quant:fp16 (x's dtype; the one TU
serves both and every head dim, and setup.py compiles it into every build). kernel_info() does not
list it: on a GPU the ids come from flash3._quantize.available() (gpu_info), in the simulator from
sim_op_quantize.cu's "quantize_fp8" entry of --info.

Features (QUANT_FEATURES), each one or more launches ("parts") on b=2, h=2, s=203 (blocks of 64 or
128 tokens: several blocks and a partial one) unless said otherwise:
  rows      layout rows, d 128, blocks of 64; an outlier and an all-zero (partial) block
  perhead   one block per (batch, head) (the wrapper's block_size None: the op gets s), s 300:
            more units than a CTA keeps in registers (the kernel recomputes the rest from x);
            then d 80, s 500: 10 units per token, not dividing the 512-thread CTA (the unit walk's
            chunk carry)
  vpacked   the rows case in layout v_packed (the FP8 attention's V operand, fp8.pack_v_fp8), s_pad 208
  hadamard  the rows case rotated (signs; m 1: the Walsh-Hadamard butterfly with warp shuffles)
  hartley3  the rotation at d 192 = 3 * 64 (3-point Hartley mix), blocks of 128
  hartley5  the rotation at d 160 = 5 * 32 (5-point Hartley mix, 256-thread CTAs), blocks of 128
            (both: more units than the CTA keeps in registers)
  mean      K as the FP8 path quantizes it (d 128, blocks of 128): rotated, minus the rotated mean
  chdesc    V as the FP8 path quantizes it (d 128, blocks of 128): over its per-channel descale,
            layout v_packed
  extreme   the ends of the ranges, b 1, d 64, s 48, blocks of 16: x's dtype's largest value and
            smallest subnormal and -0 in one block, every e4m3 rounding tie (sign both ways) under
            a power-of-two descale in the next, an all-zero block with -0 in the last
  tiny      d 64, s 100, blocks of 32 whose amax / 448 is below FLT_MIN (descale clamped to
            FLT_MIN, fp32 subnormal arithmetic): x over a channel_descale of ~1e38; rotated bf16 x of
            ~1e-38 (fp16 cannot hold it: its part rotates, then divides by the ~1e38 channel descale)
No feature saturates: the largest |y| / descale is 448 within one rounding, so the kernel's
satfinite (and the reference's clamp) never act; "extreme" covers the top and bottom of e4m3.

Each launch writes into poisoned outputs (out 0x7f bytes, NaN in e4m3; descale NaN) and is checked
against flash3's CPU definition of the same quantization (reference(): hadamard.hadamard_transform,
minus mean, over channel_descale, fp8.quantize_fp8's blocks, fp8.pack_v_fp8), the reference of
tests/test_quantize_kernel.py. csrc/flash3/fp8/quantize.h specifies the kernel as that computation,
every step rounded as torch rounds it, except that the Hartley mix (m > 1) may sum in another order:
bit for bit (out bytes, descale bits) without it; with it the test's rule (descale within 2e-7
relative, out at most one e4m3 step off in at most 1e-3 of the values).
"""
from __future__ import annotations

QUANT_FEATURES = ["rows", "perhead", "vpacked", "hadamard", "hartley3", "hartley5", "mean", "chdesc",
                  "extreme", "tiny"]
DTYPES = ("bf16", "fp16")
INFO_KEY = "quantize_fp8"  # kernel_info()-style entry: the x dtypes
LAYOUTS = {"rows": 0, "v_packed": 1}  # flash3/_quantize.py LAYOUTS
INEXACT_OUT_FRACTION = 1e-3  # tests/test_quantize_kernel.py assert_quant_close
INEXACT_DESCALE_RTOL = 2e-7
B, H, S = 2, 2, 203


def kernel_ids(info: dict) -> list[str]:
    """'quant:bf16' per x dtype of info["quantize_fp8"]."""
    return [f"quant:{dt}" for dt in info.get(INFO_KEY, [])]


def quant_dtype(kid: str) -> str:
    """'quant:bf16' -> 'bf16'."""
    dt = kid.removeprefix("quant:")
    if dt not in DTYPES:
        raise ValueError(f"not a quant kernel id: {kid!r}")
    return dt


def label(kid: str) -> str:
    return f"quant {quant_dtype(kid)}"


def gpu_info() -> dict:
    """The entry kernel_info() lacks: {"quantize_fp8": both dtypes} when flash3._C has the op."""
    from flash3 import _quantize
    return {INFO_KEY: list(DTYPES)} if _quantize.available() else {}


# ---------------------------------------------------------------------------------------------
# Cases


def _e4m3_grid():
    """The non-negative finite e4m3 values (0 .. 448) and the midpoints between neighbours (exact
    round-to-nearest-even ties for x / descale), fp64."""
    import torch
    vals = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    return vals, (vals[:-1] + vals[1:]) / 2


def make_case(feature: str, kid: str, device="cuda", seed=0) -> list[dict]:
    """The launches of one feature: x (b, s, h, d) in the kernel's dtype, signs (fp32, d) with
    their seed (None without rotation), mean / channel_descale fp32 (b, h, d) or None, the op's
    block_size and layout, ref_block (the reference's block_size: None = per head) and exact
    (whether the check is bit for bit)."""
    import torch
    from flash3 import fp8, hadamard
    if feature not in QUANT_FEATURES:
        raise ValueError(f"{feature} does not apply to {kid}")
    dtype_name = quant_dtype(kid)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    g = torch.Generator(device="cpu").manual_seed(seed + 1000 + 10 * QUANT_FEATURES.index(feature)
                                                  + DTYPES.index(dtype_name))
    randn = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731

    def part(x, *, block_size, rot_seed=None, mean=None, cd=None, layout="rows", ref_block=-1):
        d = x.shape[-1]
        m = hadamard.block_structure(d)[0]
        signs = None if rot_seed is None else hadamard.random_signs(d, rot_seed, dtype=torch.float32)
        to = lambda t: None if t is None else t.to(device)  # noqa: E731
        return dict(feature=feature, x=x.to(dtype).to(device), signs=to(signs), seed=rot_seed,
                    mean=to(mean), cd=to(cd), block_size=block_size, layout=LAYOUTS[layout],
                    ref_block=block_size if ref_block == -1 else ref_block,
                    exact=rot_seed is None or m == 1)

    if feature in ("rows", "vpacked", "hadamard"):
        x = randn(B, S, H, 128)
        x[0, 5, 1, 3] = 40.0  # an outlier
        x[1, 192:, 1] = 0  # the last (partial) block of one (batch, head): all zero, descale 1
        return [part(x, block_size=64, rot_seed=3 if feature == "hadamard" else None,
                     layout="v_packed" if feature == "vpacked" else "rows")]
    if feature == "perhead":
        s = 300
        return [part(randn(B, s, H, 128), block_size=s, ref_block=None),
                part(randn(B, 500, H, 80), block_size=500, ref_block=None)]
    if feature in ("hartley3", "hartley5"):
        d = 192 if feature == "hartley3" else 160
        return [part(randn(B, S, H, d), block_size=128, rot_seed=5)]
    if feature == "mean":  # flash3.fp8._attention_fp8_cuda: the mean of the rotated k
        k = (randn(B, S, H, 128) + randn(1, 1, H, 128) * 2).to(dtype)  # keys sharing a mean
        mean = hadamard.hadamard_transform(k.float().mean(dim=1, keepdim=True), seed=7)[:, 0].contiguous()
        return [part(k, block_size=128, rot_seed=7, mean=mean)]
    if feature == "chdesc":  # flash3.fp8._attention_fp8_cuda's v_channel_descale
        v = (randn(B, S, H, 128) * torch.linspace(0.1, 10, 128, dtype=torch.float64)).to(dtype)
        cd = fp8._descale_from_amax_nosync(v.float().abs().amax(dim=1))
        return [part(v, block_size=128, cd=cd, layout="v_packed")]
    if feature == "extreme":
        fi = torch.finfo(dtype)
        x = randn(1, 48, H, 64) * 100  # block 0 under fp16's descale 146: all of e4m3's range
        x[0, 3, :, 7] = -fi.max  # block 0: amax at the dtype's top (bf16: the rest underflows)
        x[0, 9, :, :4] = torch.tensor([fi.smallest_normal * fi.eps, 0.0, -0.0, -1e-3])  # smallest subnormal
        vals, ties = _e4m3_grid()
        blk = torch.cat([ties, -ties, vals, torch.zeros(16 * 64 - 2 * len(ties) - len(vals), dtype=torch.float64)])
        blk[-1] = 448.0  # amax 448 * 2^-4: descale 2^-4 exactly, so x / descale is each tie exactly
        x[0, 16:32] = (blk * 2.0 ** -4).reshape(16, 1, 64)
        x[0, 16:32, 1] = -x[0, 16:32, 1].flip(0)  # the other head: negated, in reverse token order
        x[0, 32:] = 0.0
        x[0, 40:, 0, ::2] = -0.0
        return [part(x, block_size=16)]
    # tiny
    cd = torch.rand(B, H, 64, generator=g, dtype=torch.float64).add(1.0).mul(1e38).float()
    parts = [part(randn(B, 100, H, 64), block_size=32, cd=cd)]
    if dtype_name == "bf16":
        parts.append(part(randn(B, 100, H, 64) * 1e-38, block_size=32, rot_seed=1))
    else:
        parts.append(part(randn(B, 100, H, 64), block_size=32, rot_seed=1, cd=cd))
    return parts


def poisoned_outputs(p: dict):
    """out (b, s, h, d), or (b, h, d, s_pad) for v_packed, of 0x7f bytes (NaN in e4m3); descale
    (b, h, ceil(s / block_size)) NaN."""
    import torch
    x = p["x"]
    b, s, h, d = x.shape
    shape = (b, s, h, d) if p["layout"] == LAYOUTS["rows"] else (b, h, d, -(-s // 16) * 16)
    out = torch.full(shape, 0x7F, dtype=torch.uint8, device=x.device).view(torch.float8_e4m3fn)
    return out, torch.full((b, h, -(-s // p["block_size"])), float("nan"), device=x.device)


def launch(p: dict) -> dict:
    """One synchronized quantize_fp8_sm90 launch into poisoned outputs: {"out", "descale"}."""
    import torch
    out, descale = poisoned_outputs(p)
    torch.ops.flash3.quantize_fp8_sm90(p["x"], p["signs"], p["mean"], p["cd"], p["block_size"], p["layout"],
                                       out, descale)
    torch.cuda.synchronize()
    return {"out": out, "descale": descale}


def op_call(p: dict, out, descale) -> tuple[str, dict, dict]:
    """(op, tensors, scalars) of sim_op_quantize.cu: launch()'s arguments by name."""
    tensors = dict(x=p["x"], signs=p["signs"], mean=p["mean"], channel_descale=p["cd"], out=out, descale=descale)
    return "quantize_fp8", tensors, dict(block_size=int(p["block_size"]), layout=int(p["layout"]))


# ---------------------------------------------------------------------------------------------
# Check


def reference(p: dict):
    """(out, descale (b, h, num_blocks)) of flash3's CPU definition of the op, on the CPU."""
    from flash3 import fp8, hadamard
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    x = p["x"].cpu()
    xf = x.float() if p["seed"] is None else hadamard.hadamard_transform(x, seed=p["seed"])
    if p["mean"] is not None:
        xf = xf - cpu(p["mean"])[:, None]
    if p["cd"] is not None:
        xf = xf / cpu(p["cd"])[:, None]
    x8, descale = fp8.quantize_fp8(xf, block_size=p["ref_block"])
    if p["layout"] == LAYOUTS["v_packed"]:
        x8 = fp8.pack_v_fp8(x8)
    return x8, descale.reshape(x.shape[0], x.shape[2], -1)


def _e4m3_ordinal(u):
    """e4m3 bytes -> signed steps from zero (both zeros 0), as the GPU test compares them."""
    import torch
    u = u.to(torch.int32)
    return torch.where(u >= 0x80, -(u & 0x7F), u & 0x7F)


def check(p: dict, got: dict) -> dict:
    """got["out"] / got["descale"] against reference(p): nan for NaN in either (unwritten: the
    reference is finite); bit for bit when p["exact"], else tests/test_quantize_kernel.py's rule
    (then err: the fraction of out bytes that differ, tol: the fraction the rule allows)."""
    import torch
    want8, wantd = reference(p)
    out, descale = got["out"].cpu(), got["descale"].cpu()
    ob, wb = out.view(torch.uint8), want8.view(torch.uint8)
    nan_out = int(((ob & 0x7F) == 0x7F).sum())
    if nan_out or torch.isnan(descale).any():
        return {"status": "nan", "detail": f"{nan_out} NaN bytes in out, {int(torch.isnan(descale).sum())} NaN "
                                           f"descales (unwritten?)"}
    exact = p["exact"]
    diff = ob != wb
    res = {"status": "ok"} if exact else {"status": "ok", "err": float(diff.float().mean()),
                                          "tol": INEXACT_OUT_FRACTION}
    if exact:
        bad_d = descale.view(torch.int32) != wantd.view(torch.int32)
    else:
        bad_d = (descale.double() - wantd.double()).abs() > INEXACT_DESCALE_RTOL * wantd.double().abs()
    if bad_d.any():
        i = tuple(bad_d.nonzero()[0].tolist())
        return dict(res, status="wrong", detail=f"descale{list(i)} = {descale[i].item()!r}, reference "
                                                f"{wantd[i].item()!r} ({int(bad_d.sum())} differ"
                                                + (")" if exact else f" by more than {INEXACT_DESCALE_RTOL:g})"))
    if not diff.any():
        return res
    steps = (_e4m3_ordinal(ob) - _e4m3_ordinal(wb)).abs()
    i = tuple(diff.nonzero()[0].tolist())
    where = (f"first at {list(i)}: 0x{int(ob[i]):02x}, reference 0x{int(wb[i]):02x}; "
             f"{int(diff.sum())} of {diff.numel()} bytes differ, at most {int(steps.max())} e4m3 steps")
    if exact:
        return dict(res, status="wrong", detail="out differs bitwise, " + where)
    if int(steps.max()) > 1 or res["err"] > res["tol"]:
        return dict(res, status="wrong", detail=f"out beyond one e4m3 step in {INEXACT_OUT_FRACTION:g} of the "
                                                f"values, " + where)
    return res
