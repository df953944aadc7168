#!/usr/bin/env python3
"""Prebuilt kernel objects: compile here, link on the lent GPU machine (issue 23).

Every nvcc TU of the extension that does not touch torch (the generated kernels csrc/generated/*.cu
the knobs select, and the decode append/combine and FP8 quantize kernels) is compiled ONCE with
kernel_objects.py's kernel_flags (setup.py's flags, plus sm_90a SASS *and* compute_90a PTX,
-no-compress, -fPIC): the object lands in the simulator's cache (kernel_objects.cached_object) and is
copied from there, so the simulator and the extension run the very same compile. Variants:
release, and hang (FLASH3_DEBUG_HANG=1, the hang-diagnosis build).

  build   compile (heaviest TU first, --jobs at once, nothing new started after --budget s) into
          DIR/<variant>/ with DIR/<variant>/manifest.json; --pack also writes
          .carry/kernels/<variant>.tar.xz (+ <variant>.json, the manifest) to carry to the device
  unpack  .carry/kernels/<variant>.tar.xz -> DIR/<variant>/
  size    what a device call carries (tree, .whl, .carry) against its 64 MiB
  check   DIR/<variant>: every object the knobs select is there and its hash matches the sources
          (exit 1 and a list otherwise); prints the manifest's knobs as shell assignments

The manifest's hash of an object covers its TU, every header under csrc/flash3 (any may be
included), and the flags that matter: kernel_flags without -I paths (other machines have other
paths; CUTLASS's version is a -D define in them). setup.py's FLASH3_PREBUILT=DIR/<variant> links
the objects after the same check (resolve()), never a stale one.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flash3_build as fb  # noqa: E402

ROOT = fb.ROOT
CSRC = ROOT / "csrc"
CARRY = ROOT / ".carry" / "kernels"
VARIANTS = ("release", "hang")
# The torch-free .cu sources setup.py compiles besides the generated kernels (relative to csrc).
PLAIN_SOURCES = ("flash3/decode/append_kv.cu", "flash3/decode/combine.cu", "flash3/fp8/quantize.cu")
# One device call carries at most 64 MiB: the tree (~3 MB), the CUTLASS wheel (~6.5 MB), this.
CARRY_LIMIT = 64 << 20


class StaleError(RuntimeError):
    """A prebuilt object is missing or was compiled from other sources or flags."""


def tus(csrc: Path = CSRC) -> list[Path]:
    """The TUs to prebuild, heaviest first (a time-capped build links whatever finished): the
    backward, then the forward and decode kernels by head dim, then the small plain kernels."""
    weight = {"bwd": 3, "fwd": 2, "decode": 1}
    ks = sorted(fb.generate_kernels().selected_kernels(),
                key=lambda k: -weight.get(k.kind, 1) * (k.head_dim + k.head_dim_v))
    return [csrc / "generated" / f"{k.name}.cu" for k in ks] + [csrc / p for p in PLAIN_SOURCES]


def flags(variant: str, cutlass_inc: str, csrc: Path = CSRC) -> list[str]:
    """The nvcc flags of a variant (kernel_objects.kernel_flags; the hang variant adds the define)."""
    import kernel_objects
    old = os.environ.get("FLASH3_DEBUG_HANG")
    if variant == "hang":  # as setup.py sees it under FLASH3_DEBUG_HANG=1 (same flag order)
        os.environ["FLASH3_DEBUG_HANG"] = "1"
    try:
        f = kernel_objects.kernel_flags(cutlass_inc, csrc)
    finally:
        os.environ.pop("FLASH3_DEBUG_HANG", None) if old is None else os.environ.__setitem__("FLASH3_DEBUG_HANG", old)
    if variant == "release" and fb.is_debug_hang(f):
        raise ValueError("the release variant with FLASH3_DEBUG_HANG set: unset it")
    return f


def portable(flag_list: list[str]) -> list[str]:
    """The flags that change the object: every one but the include paths."""
    return [f for f in flag_list if not f.startswith("-I")]


def source_hash(csrc: Path, tu: Path, flag_list: list[str]) -> str:
    if fb.extra_include_dirs():
        raise StaleError("FLASH3_EXTRA_INCLUDE_DIRS is set: its headers are not in the prebuilt hash")
    h = hashlib.sha256("\0".join(portable(flag_list)).encode() + b"\0")
    files = [tu] + sorted(p for p in (csrc / "flash3").rglob("*") if p.suffix in (".h", ".cuh", ".hpp")) + sorted(
        (csrc / "generated").glob("*.h"))  # the generated WGMMA atoms (generate_kernels.py WGMMA_HEADER)
    for p in files:
        h.update(p.relative_to(csrc).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def _cutlass() -> str:
    inc, how = fb.find_cutlass(search_project_venvs=True)
    if inc is None:
        raise RuntimeError(f"CUTLASS headers {how}")
    return inc


KNOBS = ("FLASH3_HDIMS", "FLASH3_DTYPES")


def knobs() -> dict:
    """The kernel-selection knobs set now (unset: every kernel)."""
    return {k: os.environ[k] for k in KNOBS if os.environ.get(k)}


def build(out: Path, variant: str, jobs: int = 1, budget: float = 1e9, nice: bool = False,
          cache: Path | None = None) -> dict:
    """Compile what the cache (default the simulator's, kernel_objects.BUILD_DIR) lacks, jobs at once,
    heaviest first, none started after budget s; copy every object into out/variant/ and write
    its manifest (after each object); returns the manifest."""
    import kernel_objects
    t0 = time.monotonic()
    csrc, nvcc, cutlass = CSRC, kernel_objects._nvcc(), _cutlass()
    fl = flags(variant, cutlass, csrc)
    dest = out / variant
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    cache = cache or kernel_objects.BUILD_DIR
    cache.mkdir(parents=True, exist_ok=True)
    ver = fb.nvcc_version(str(Path(nvcc).parent.parent))
    manifest = {"variant": variant, "nvcc": ".".join(map(str, ver or ())), "cutlass": fb.cutlass_version(cutlass),
                "knobs": knobs(), "flags": portable(fl), "planned": [t.relative_to(csrc).as_posix() for t in tus(csrc)],
                "objects": {}, "not_built": {}}
    prefix = ["nice", "-n", "10"] if nice and shutil.which("nice") else []

    def one(tu: Path):
        rel = tu.relative_to(csrc).as_posix()
        h = source_hash(csrc, tu, fl)  # of the sources as the compile reads them
        cached = cache / kernel_objects.cached_object(csrc, tu, fl, nvcc).name
        if not cached.exists():
            if time.monotonic() - t0 > budget:
                return rel, None, "not started (out of time)"
            try:
                kernel_objects._compile(prefix + [nvcc] + fl + ["-c", str(tu)], cached, tu.name)
            except RuntimeError as e:
                return rel, None, str(e)[-600:]
        obj = dest / (tu.stem + ".o")
        shutil.copyfile(cached, obj)
        return rel, {"object": obj.name, "hash": h, "bytes": obj.stat().st_size}, None

    def save():  # after every object: a build killed at its deadline still links what it made
        manifest["seconds"] = round(time.monotonic() - t0)
        (dest / "manifest.tmp").write_text(json.dumps(manifest, indent=1))
        os.replace(dest / "manifest.tmp", dest / "manifest.json")

    save()
    with ThreadPoolExecutor(max(1, jobs)) as ex:
        for fut in as_completed([ex.submit(one, tu) for tu in tus(csrc)]):
            rel, entry, why = fut.result()
            if entry:
                manifest["objects"][rel] = entry
            else:
                manifest["not_built"][rel] = why
            save()
    return manifest


def pack(src: Path, variant: str, carry: Path = CARRY) -> Path:
    """src/variant/ -> carry/variant.tar.xz, plus carry/variant.json (the manifest, readable)."""
    carry.mkdir(parents=True, exist_ok=True)
    target = carry / f"{variant}.tar.xz"
    tmp = target.with_suffix(".tmp")
    with tarfile.open(tmp, "w:xz", preset=6) as tar:
        tar.add(src / variant, arcname=variant)
    os.replace(tmp, target)
    shutil.copyfile(src / variant / "manifest.json", carry / f"{variant}.json")
    return target


def unpack(dest: Path, variant: str, carry: Path = CARRY) -> Path:
    if (dest / variant).exists():
        shutil.rmtree(dest / variant)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(carry / f"{variant}.tar.xz") as tar:
        tar.extractall(dest, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(dest)
    return dest / variant


def resolve(pdir: Path, wanted: list[Path], flag_list: list[str], csrc: Path = CSRC,
            allow_missing: bool = False, cuda: str | None = None) -> tuple[list[Path], list[str]]:
    """(objects to link for the TUs `wanted`, the TUs left out) after checking each against
    pdir/manifest.json and the current sources. A stale object is always a StaleError; a missing
    one too, unless allow_missing (a time-capped build: those kernels are not in the extension).
    cuda: torch's CUDA version; the objects' nvcc must have its major version (the runtime ABI)."""
    try:
        man = json.loads((pdir / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise StaleError(f"no readable manifest in {pdir}: {e}") from None
    if cuda and man.get("nvcc") and man["nvcc"].split(".")[0] != cuda.split(".")[0]:
        raise StaleError(f"the objects in {pdir} were compiled by nvcc {man['nvcc']}, torch has CUDA {cuda}")
    want = "hang" if fb.is_debug_hang(flag_list) else "release"
    if man.get("variant", want) != want:
        raise StaleError(f"{pdir} holds the {man.get('variant')} variant, this build wants {want} "
                         "(FLASH3_DEBUG_HANG=1 links the hang variant)")
    objs, missing, stale = [], [], []
    for tu in wanted:
        rel = tu.relative_to(csrc).as_posix()
        entry = man.get("objects", {}).get(rel)
        if entry is None or not (pdir / entry["object"]).is_file():
            missing.append(rel)
        elif entry["hash"] != source_hash(csrc, tu, flag_list):
            stale.append(rel)
        else:
            objs.append(pdir / entry["object"])
    if stale:
        raise StaleError(f"prebuilt objects in {pdir} are stale (sources or flags changed since "
                         f"`make device-prep`): {', '.join(stale)}")
    plain = [p for p in missing if not p.startswith("generated/")]
    if missing and not (allow_missing and not plain):
        raise StaleError(f"prebuilt objects missing from {pdir}: {', '.join(missing)}"
                         + ("" if allow_missing else " (rerun `make device-prep` with these knobs)"))
    return objs, missing


def for_setup(pdir: str, kernels: list, cutlass_inc: str, cuda: str | None = None) -> tuple[list[str], list]:
    """setup.py's FLASH3_PREBUILT: (objects to link, the kernels of `kernels` they hold). The
    flags come from this environment (FLASH3_DEBUG_HANG, FLASH3_NVCC_FLAGS) as setup.py's do.
    FLASH3_PREBUILT_ALLOW_MISSING=1: kernels a time-capped build did not make are left out."""
    variant = "hang" if fb.is_debug_hang(fb.extra_nvcc_flags()) else "release"
    wanted = [CSRC / "generated" / f"{k.name}.cu" for k in kernels] + [CSRC / p for p in PLAIN_SOURCES]
    objs, missing = resolve(Path(pdir).resolve(), wanted, flags(variant, cutlass_inc),
                            allow_missing=fb._truthy("FLASH3_PREBUILT_ALLOW_MISSING"), cuda=cuda)
    for rel in missing:
        fb.log(f"prebuilt: {rel} was not built in time: its kernel is left out of this build")
    kept = [k for k in kernels if f"generated/{k.name}.cu" not in missing]
    return [str(o) for o in objs], kept


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def carry_report(carry: Path = CARRY) -> tuple[str, int]:
    """What one device call carries: the tree that travels (tracked and untracked-not-ignored
    files), .whl/ and .carry/; (text, total bytes)."""
    r = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True)
    tree = sum((ROOT / f).stat().st_size for f in r.stdout.decode().split("\0")
               if f and (ROOT / f).is_file() and not (ROOT / f).is_symlink())
    parts = [("tree", tree), (".whl", sum(p.stat().st_size for p in (ROOT / ".whl").glob("*") if p.is_file()))]
    for v in VARIANTS:
        t, m = carry / f"{v}.tar.xz", carry / f"{v}.json"
        if t.exists():
            raw = sum(o["bytes"] for o in json.loads(m.read_text())["objects"].values()) if m.exists() else 0
            parts.append((f".carry {v} ({_mb(raw)} raw)", t.stat().st_size + (m.stat().st_size if m.exists() else 0)))
    # The peers' binaries beside the kernels (.carry/fa3: FA3's drivers; .carry/cutlass: CUTLASS's GEMMs).
    others = sorted(p for p in carry.parent.glob("*") if p.is_dir() and p != carry) if carry.name == "kernels" else []
    for d in others:
        parts.append((f".carry {d.name}", sum(f.stat().st_size for f in d.rglob("*") if f.is_file())))
    total = sum(n for _, n in parts)
    text = ", ".join(f"{name} {_mb(n)}" for name, n in parts)
    verdict = "fits" if total <= CARRY_LIMIT else "DOES NOT FIT"
    return f"carried: {text}; total {_mb(total)} of {_mb(CARRY_LIMIT)} ({verdict})", total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=("build", "unpack", "check", "size"))
    ap.add_argument("--variant", choices=VARIANTS, default="release")
    ap.add_argument("--dir", default=str(ROOT / "build" / "prebuilt"), help="where the objects are")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("FLASH3_COMPILE_JOBS", "1")))
    ap.add_argument("--budget", type=float, default=1e9, help="build: no compile starts after this (s)")
    ap.add_argument("--pack", action="store_true", help="build: also write .carry/kernels/<variant>.tar.xz")
    ap.add_argument("--carry", default=str(CARRY))
    ap.add_argument("--cache", help="build: the object cache (default the simulator's)")
    ap.add_argument("--nice", action="store_true", help="build: nvcc under nice -n 10 (a background build)")
    args = ap.parse_args(argv)
    pdir, carry = Path(args.dir), Path(args.carry)
    if args.cmd == "size":
        text, total = carry_report(carry)
        print("prebuilt: " + text)
        return 0 if total <= CARRY_LIMIT else 1
    if args.cmd == "unpack":
        print(f"prebuilt: unpacked {unpack(pdir, args.variant, carry)}")
        return 0
    if args.cmd == "check":
        d = pdir / args.variant
        try:
            man = json.loads((d / "manifest.json").read_text())
        except (OSError, ValueError) as e:
            print(f"prebuilt: no manifest in {d} ({e})", file=sys.stderr)
            return 1
        for k in KNOBS:  # check (and, printed, build) with the knobs it was built for
            v = man.get("knobs", {}).get(k, "")
            os.environ.pop(k, None) if not v else os.environ.__setitem__(k, v)
            print(f"export {k}={v}")
        try:
            objs, _ = resolve(d, tus(), flags(args.variant, _cutlass()))
        except (StaleError, RuntimeError, ValueError) as e:
            print(f"prebuilt: {e}", file=sys.stderr)
            return 1
        print(f"# prebuilt: {len(objs)} {args.variant} objects in {d} match the sources", file=sys.stderr)
        return 0
    man = build(pdir, args.variant, args.jobs, args.budget, args.nice, Path(args.cache) if args.cache else None)
    raw = sum(o["bytes"] for o in man["objects"].values())
    print(f"prebuilt: {args.variant}: {len(man['objects'])} objects, {_mb(raw)} raw, in {pdir / args.variant} "
          f"({man['seconds']} s)")
    for rel, why in man["not_built"].items():
        print(f"prebuilt: NOT BUILT {rel}: {why}", file=sys.stderr)
    if args.pack:
        t = pack(pdir, args.variant, carry)
        packed = t.stat().st_size
        print(f"prebuilt: {t.relative_to(ROOT) if t.is_relative_to(ROOT) else t}: {_mb(packed)} "
              f"(xz; {packed / max(raw, 1):.0%} of raw)")
    # Not started out of time is what a time cap means (reported, not an error); nvcc errors are.
    return 1 if any("out of time" not in why for why in man["not_built"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
