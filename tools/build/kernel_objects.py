"""The kernel TUs' objects as every tool compiles them: setup.py's nvcc flags plus the simulator's
-gencode (sm_90a SASS and compute_90a PTX, uncompressed) and -fPIC, and one cache for them,
tools/hopper_sim/build/flash3/, keyed by a hash of each TU's sources and flags. compile_check.py
leaves its objects there, the simulator's smoke (tools/smoke/smoke_sim.py) links them, and
prebuilt.py packs them for a GPU: so one compile serves all three.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = ROOT / "tools" / "hopper_sim" / "build" / "flash3"
SIM_GENCODE = "-gencode=arch=compute_90a,code=[sm_90a,compute_90a]"


def _log(msg: str) -> None:
    print(f"kernel-objects: {msg}", file=sys.stderr, flush=True)


def kernel_flags(cutlass_inc: str, csrc: Path) -> list[str]:
    """setup.py's nvcc flags for the kernel TUs with the simulator's -gencode (PTX kept,
    uncompressed) and -fPIC, and its include dirs and defines."""
    import flash3_build as fb
    ver = fb.cutlass_version(cutlass_inc).split(".")
    ver = ver if len(ver) == 3 else ["0", "0", "0"]
    flags = [f for f in fb.NVCC_KERNEL_FLAGS if f not in fb.NVCC_ARCH_FLAGS]
    # -fPIC: the same objects link into the torch extension (tools/build/prebuilt.py, setup.py's
    # FLASH3_PREBUILT), not only into the simulator's driver.
    flags = [SIM_GENCODE, "-no-compress", "-Xcompiler=-fPIC"] + flags + [
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_OPERATORS__",
        "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    ] + fb.extra_nvcc_flags()
    flags += [f"-DFLASH3_CUTLASS_{k}={v}" for k, v in zip(("MAJOR", "MINOR", "PATCH"), ver)]
    incs = fb.extra_include_dirs() + [str(csrc)] + fb.cutlass_include_dirs(cutlass_inc)
    return flags + [f"-I{d}" for d in incs]


_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def _included_sources(csrc: Path, tu: Path) -> list[Path]:
    """The TU and every project header it includes, transitively (every `#include "..."` line counts,
    whatever #if it sits under: a superset is safe), resolved as nvcc does a quoted include: the
    including file's folder first, then csrc/; headers found in neither (CUDA's, CUTLASS's) are left
    to the flags."""
    seen, todo = {}, [tu]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen[p] = None
        for inc in _INCLUDE.findall(p.read_bytes()):
            name = inc.decode()
            for q in (p.parent / name, csrc / name):
                if q.is_file():
                    todo.append(q.resolve())
                    break
    return sorted(seen)


def _source_hash(csrc: Path, tu: Path, flags: list[str], nvcc: str) -> str:
    """Of the TU and the project headers it includes (by content and path relative to csrc), the
    flags with csrc's own path taken out, and the nvcc path; CUTLASS enters through its include dir in
    the flags (a pinned wheel version). So an edit recompiles only the TUs that include what changed,
    and a copy of csrc elsewhere (mutant_check.sh's mutants, FLASH3_SIM_CSRC) shares the objects of
    every TU its change does not reach."""
    csrc = csrc.resolve()
    h = hashlib.sha256()
    norm = [f.replace(str(csrc), "<csrc>") for f in flags]
    h.update(("\0".join(norm) + "\0" + nvcc).encode())
    for p in _included_sources(csrc, tu.resolve()):
        rel = p.relative_to(csrc) if p.is_relative_to(csrc) else p
        h.update(str(rel).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cached_object(csrc: Path, tu: Path, flags: list[str], nvcc: str) -> Path:
    """Where the object of kernel TU tu compiled with flags by nvcc is cached (tools/build/compile_check.py
    leaves its release objects there too)."""
    return BUILD_DIR / f"{tu.stem}-{_source_hash(csrc, tu, flags, nvcc)}.o"


def _nvcc() -> str:
    import flash3_build as fb
    home, how = fb.find_cuda_home()
    if home is None:
        raise RuntimeError(f"no CUDA toolkit: {how}")
    return os.path.join(home, "bin", "nvcc")


def _compile(cmd: list[str], target: Path, what: str) -> None:
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    t0 = time.monotonic()
    r = subprocess.run(cmd + ["-o", str(tmp)], capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"nvcc failed for {what}:\n{(r.stdout + r.stderr)[-4000:]}")
    os.replace(tmp, target)
    _log(f"built {target.name} ({time.monotonic() - t0:.0f} s)")
