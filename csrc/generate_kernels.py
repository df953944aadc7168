#!/usr/bin/env python3
"""Writes csrc/generated/{fwd,bwd,decode}_*.cu: one kernel instantiation per translation unit.

fwd_*.cu: the forward kernels (bf16/fp16 per HEAD_DIMS, plus a wide-tile variant per
WIDE_HEAD_DIMS, and the FP8 e4m3 kernels per FP8_HEAD_DIMS). bwd_*.cu: the backward kernels,
bf16/fp16 per HEAD_DIMS (no wide variant, no e4m3). decode_*.cu: the KV-cache forward kernels,
bf16/fp16 q per HEAD_DIMS, each for a cache of q's dtype and for an FP8 (e4m3) cache (kve4m3).

This module is also the single source of the kernel list and of the build knobs that restrict
it (setup.py and tools/compile_check.py import it); the knobs select forward and backward TUs alike:

  FLASH3_HDIMS   comma-separated head dims, e.g. "128,256". "192" selects both (192,192) and
                 (192,128); "192x128" selects only that pair. Unset/empty/"all": every kernel.
  FLASH3_DTYPES  comma-separated subset of "bf16,fp16,e4m3" (e4m3 alias fp8: the FP8 forward
                 kernel; there is no FP8 backward). A decode kernel goes with its q dtype, FP8
                 caches included. Unset/empty/"all": every dtype.

Usage:
  python3 csrc/generate_kernels.py           # (re)write csrc/generated/
  python3 csrc/generate_kernels.py --check   # exit 1 if the checked-in files differ
  python3 csrc/generate_kernels.py --list    # print the TUs the current knobs select
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATED_DIR = HERE / "generated"

DTYPES = ("bf16", "fp16", "e4m3")  # e4m3: the FP8 kernel (bf16 output)
# (head_dim, head_dim_v) pairs that get a kernel.
HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256))


# (head_dim, head_dim_v) pairs that also get a wide-tile kernel for calls without a causal/local
# mask (csrc/flash3/common/attn_logic.h: fwd_has_wide_tile says which; test_host_logic checks
# that the two lists agree).
WIDE_HEAD_DIMS = ((128, 128),)

# (head_dim, head_dim_v) pairs of the FP8 (e4m3) kernel.
FP8_HEAD_DIMS = ((64, 64), (128, 128), (256, 256))

# The backward kernel (csrc/flash3/bwd/): the 16-bit dtypes, the forward's head dims.
BWD_DTYPES = ("bf16", "fp16")
BWD_HEAD_DIMS = HEAD_DIMS

# The decode (KV-cache) kernels (FwdTraits::kDecode: paged cache, packed GQA, split-KV): the
# 16-bit dtypes, the forward's head dims, caches of q's dtype ("") or FP8 ("e4m3").
DECODE_DTYPES = ("bf16", "fp16")
DECODE_HEAD_DIMS = HEAD_DIMS
DECODE_CACHES = ("", "e4m3")

# The kernels whose WGMMA n-extents leave CuTe's basic list {8, 16, 32, 64, 96, 128, 192, 256}
# (csrc/flash3/common/wgmma_shapes.h): their TUs enable CuTe's extended shapes, which cost ~32 s of
# compile per TU, so no other TU does. The traits assert this list both ways at compile time.
#   forward 16-bit: block_n 176 (d 128 wide), 112 (d 192), 80 (d 256); the FP8 tiles are basic.
#   decode: the plain tiles' block_n, and an FP8 cache's smaller ones: 112 (d 128), 80 (192x128),
#     48 (d 256).
#   backward: dQ's d/2 columns, 48 at d 96.
EXTENDED_WGMMA = {
    "fwd": {(128, 128, True), (192, 192, False), (256, 256, False)},
    "decode": {(192, 192, ""), (256, 256, ""), (128, 128, "e4m3"), (192, 128, "e4m3"), (256, 256, "e4m3")},
    "bwd": {(96, 96)},
}

# The generated files' name prefixes (kind): check()/write() own every csrc/generated/<kind>_*.cu.
KINDS = ("fwd", "bwd", "decode")


@dataclass(frozen=True)
class Kernel:
    dtype: str  # "bf16", "fp16" or "e4m3" (forward only)
    head_dim: int
    head_dim_v: int
    wide: bool = False
    kind: str = "fwd"  # "fwd", "bwd" or "decode"
    cache: str = ""  # decode: "" (the cache has q's dtype) or "e4m3" (an FP8 cache)

    @property
    def is_bwd(self) -> bool:
        return self.kind == "bwd"

    @property
    def is_bf16(self) -> bool:
        return self.dtype == "bf16"

    @property
    def hdim_tag(self) -> str:
        if self.head_dim == self.head_dim_v:
            return f"{self.head_dim}"
        return f"{self.head_dim}x{self.head_dim_v}"

    @property
    def is_fp8(self) -> bool:
        return self.dtype == "e4m3"

    @property
    def name(self) -> str:
        dt = "fp8_e4m3" if self.is_fp8 else self.dtype  # SASS checks look for "fp8" in the name
        cache = f"_kv{self.cache}" if self.cache else ""
        return f"{self.kind}_{dt}{cache}_hdim{self.hdim_tag}{'_wide' if self.wide else ''}_sm90"

    @property
    def filename(self) -> str:
        return self.name + ".cu"

    @property
    def path(self) -> Path:
        return GENERATED_DIR / self.filename

    @property
    def extended_wgmma(self) -> bool:
        """Whether the TU needs CuTe's extended WGMMA shapes (EXTENDED_WGMMA)."""
        if self.is_fp8:
            return False
        key = {"fwd": (self.head_dim, self.head_dim_v, self.wide),
               "decode": (self.head_dim, self.head_dim_v, self.cache),
               "bwd": (self.head_dim, self.head_dim_v)}[self.kind]
        return key in EXTENDED_WGMMA[self.kind]

    def source(self) -> str:
        text = self._body()
        if self.extended_wgmma:  # before any CuTe header (wgmma_shapes.h)
            head, rest = text.split("\n", 1)
            text = head + "\n#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED\n" + rest
        return text

    def _body(self) -> str:
        if self.is_bwd:
            args = f"{'true' if self.is_bf16 else 'false'}, {self.head_dim}, {self.head_dim_v}"
            return (
                "// Generated by csrc/generate_kernels.py — do not edit.\n"
                '#include "flash3/bwd/api.h"\n'
                '#include "flash3/bwd/launch.cuh"\n'
                f"template void flash3::run_bwd<{args}>(const flash3::BwdParams&, void*);\n"
                f"static flash3::BwdKernelRegistration reg({args}, &flash3::run_bwd<{args}>);\n"
            )
        if self.kind == "decode":
            args = (f"{'true' if self.is_bf16 else 'false'}, {self.head_dim}, {self.head_dim_v}, "
                    f"{'true' if self.cache else 'false'}")
            return (
                "// Generated by csrc/generate_kernels.py — do not edit.\n"
                '#include "flash3/fwd/api.h"\n'
                '#include "flash3/fwd/launch.cuh"\n'
                f"template void flash3::run_fwd_decode<{args}>(const flash3::FwdParams&, void*);\n"
                f"static flash3::DecodeKernelRegistration reg({args}, &flash3::run_fwd_decode<{args}>);\n"
            )
        if self.is_fp8:
            args = f"{self.head_dim}, {self.head_dim_v}"
            return (
                "// Generated by csrc/generate_kernels.py — do not edit.\n"
                '#include "flash3/fwd/api.h"\n'
                '#include "flash3/fwd/launch.cuh"\n'
                f"template void flash3::run_fwd_fp8<{args}>(const flash3::FwdParams&, void*);\n"
                f"static flash3::Fp8KernelRegistration reg({args}, &flash3::run_fwd_fp8<{args}>);\n"
            )
        b = "true" if self.is_bf16 else "false"
        args = f"{b}, {self.head_dim}, {self.head_dim_v}, {'true' if self.wide else 'false'}"
        return (
            "// Generated by csrc/generate_kernels.py — do not edit.\n"
            '#include "flash3/fwd/api.h"\n'
            '#include "flash3/fwd/launch.cuh"\n'
            f"template void flash3::run_fwd<{args}>(const flash3::FwdParams&, void*);\n"
            f"static flash3::FwdKernelRegistration reg({args}, &flash3::run_fwd<{args}>);\n"
        )


def all_kernels() -> list[Kernel]:
    return [Kernel(dt, d, dv, wide) for dt in DTYPES if dt != "e4m3" for (d, dv) in HEAD_DIMS
            for wide in ((False, True) if (d, dv) in WIDE_HEAD_DIMS else (False,))] + [
        Kernel("e4m3", d, dv) for (d, dv) in FP8_HEAD_DIMS] + [
        Kernel(dt, d, dv, kind="bwd") for dt in BWD_DTYPES for (d, dv) in BWD_HEAD_DIMS] + [
        Kernel(dt, d, dv, kind="decode", cache=c) for c in DECODE_CACHES for dt in DECODE_DTYPES
        for (d, dv) in DECODE_HEAD_DIMS]


def _split(value: str | None) -> list[str]:
    if value is None:
        return []
    items = [x.strip().lower() for x in value.replace(";", ",").replace(" ", ",").split(",")]
    items = [x for x in items if x]
    return [] if items == ["all"] else items


def parse_hdims(value: str | None) -> set[tuple[int, int]] | None:
    """FLASH3_HDIMS -> set of (d, d_v) pairs, or None for "all". Raises ValueError on junk."""
    items = _split(value)
    if not items:
        return None
    known = set(HEAD_DIMS)
    out: set[tuple[int, int]] = set()
    for item in items:
        try:
            if "x" in item:
                d, dv = (int(p) for p in item.split("x", 1))
                pairs = {(d, dv)} & known
            else:
                d = int(item)
                pairs = {p for p in known if p[0] == d}
        except ValueError:
            raise ValueError(f"FLASH3_HDIMS: cannot parse {item!r} (use e.g. 128,192 or 192x128)")
        if not pairs:
            valid = ", ".join(Kernel("bf16", *p).hdim_tag for p in HEAD_DIMS)
            raise ValueError(f"FLASH3_HDIMS: no kernel for head dim {item!r} (known: {valid})")
        out |= pairs
    return out


def parse_dtypes(value: str | None) -> set[str] | None:
    items = _split(value)
    if not items:
        return None
    aliases = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "f16": "fp16", "fp8": "e4m3",
               "float8_e4m3fn": "e4m3"}
    out = {aliases.get(x, x) for x in items}
    bad = out - set(DTYPES)
    if bad:
        raise ValueError(f"FLASH3_DTYPES: unknown {sorted(bad)} (known: {', '.join(DTYPES)})")
    return out


def selected_kernels(hdims: str | None = None, dtypes: str | None = None,
                     env: dict | None = None) -> list[Kernel]:
    """Kernels selected by the knobs (explicit arguments win over the environment)."""
    env = os.environ if env is None else env
    if hdims is None:
        hdims = env.get("FLASH3_HDIMS")
    if dtypes is None:
        dtypes = env.get("FLASH3_DTYPES")
    hd = parse_hdims(hdims)
    dt = parse_dtypes(dtypes)
    return [k for k in all_kernels()
            if (hd is None or (k.head_dim, k.head_dim_v) in hd) and (dt is None or k.dtype in dt)]


def expected_files() -> dict[str, str]:
    return {k.filename: k.source() for k in all_kernels()}


def _generated_files() -> list[Path]:
    """The csrc/generated/<kind>_*.cu files present (generated or stale)."""
    return sorted(p for kind in KINDS for p in GENERATED_DIR.glob(f"{kind}_*.cu"))


def check() -> list[str]:
    """Differences between csrc/generated/ and what this script writes (empty = in sync)."""
    problems = []
    expected = expected_files()
    for name, text in expected.items():
        p = GENERATED_DIR / name
        if not p.exists():
            problems.append(f"missing: {p}")
        elif p.read_text(encoding="utf-8") != text:
            problems.append(f"differs: {p}")
    if GENERATED_DIR.is_dir():
        for p in _generated_files():
            if p.name not in expected:
                problems.append(f"stale (not generated): {p}")
    return problems


def write() -> list[Path]:
    GENERATED_DIR.mkdir(parents=True, exist_ok=True)
    written = []
    expected = expected_files()
    for name, text in expected.items():
        p = GENERATED_DIR / name
        if not p.exists() or p.read_text(encoding="utf-8") != text:
            p.write_text(text, encoding="utf-8", newline="\n")
            written.append(p)
    for p in _generated_files():
        if p.name not in expected:
            p.unlink()
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="fail if csrc/generated/ is out of date")
    g.add_argument("--list", action="store_true", help="print the TUs selected by FLASH3_HDIMS/FLASH3_DTYPES")
    args = ap.parse_args(argv)
    if args.check:
        problems = check()
        for p in problems:
            print(f"generate_kernels --check: {p}", file=sys.stderr)
        if problems:
            print("csrc/generated/ is out of date: run `python3 csrc/generate_kernels.py`", file=sys.stderr)
            return 1
        print(f"csrc/generated/ is up to date ({len(expected_files())} kernel TUs)")
        return 0
    if args.list:
        try:
            for k in selected_kernels():
                print(k.path.relative_to(HERE.parent))
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        return 0
    written = write()
    print(f"csrc/generated/: {len(expected_files())} kernel TUs, {len(written)} (re)written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
