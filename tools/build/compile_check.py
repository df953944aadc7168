#!/usr/bin/env python3
"""`make compile-check`: compile every kernel TU (csrc/generated/{fwd,bwd,decode}_*.cu, as
selected by FLASH3_HDIMS/FLASH3_DTYPES) for sm_90a, without a GPU, and check the machine code for
real Hopper instructions. Plain memory-bound TUs (PLAIN_TUS: the decode append, the FP8 quantize)
are checked for what applies to them (global loads/stores, no traps, no local memory, no stack
frame). --list prints the TUs it would compile and exits (no toolchain needed).

Each TU is compiled with setup.py's kernel flags and the simulator's -gencode (the same sm_90a SASS
plus compute_90a PTX, -no-compress, -fPIC), and its object is kept in tools/hopper_sim/build/flash3/
under the name kernel_objects.py gives it (cached_object), so `make sim-check` runs these very
objects in the simulator and `make device-prep` (tools/build/prebuilt.py) carries them to the GPU. For each TU it writes build/sass/<name>.sass (cuobjdump -sass) and
build/sass/<name>.ptxas.txt (nvcc's full output, with the ptxas -v resource report), and fails if
  - the compile fails;
  - the SASS lacks HGMMA (wgmma; QGMMA for the FP8 TUs, whose names contain "fp8"), UTMALDG (TMA loads), SYNCS (mbarriers) or USETMAXREG (setmaxnreg);
    a decode TU (decode_*) also LDGSTS (cp.async: the gathered K/V rows of small pages);
  - the SASS has BPT.TRAP (wgmma on plain sm_90, or a trap) or local-memory traffic (LDL/STL);
  - ptxas reported ANY C75xx advisory (C7510 asserts, C7508, C7512/C7513/C7519/C7520 serialized
    wgmma ...: each one means lost wgmma overlap) or a non-zero stack frame (an outlined call);
  - a backward TU (bwd_*) has no kernel with "bwd" in its name in the SASS;
  - the softmax does not overlap the P.V WGMMA (forward TUs only: the backward's mainloop has no
    softmax/P.V step; of the FP8 TUs only d_v <= 64, see kernel_checks): in every mainloop step
    (an RS HGMMA batch whose wait is preceded by the `DEPBAR.LE gsb0, 0x1` that releases S),
    fewer than EX2_FLOOR_FRACTION of the step's exponentials (MUFU.EX2) sit between the batch's
    last HGMMA and the `WARPGROUP.DEPBAR.LE gsb0, 0x0` that waits for it (see ex2_overlap below).
Then it prints a table: registers, static smem, spills, instruction counts, time, and for every
kernel TU the per-iteration instruction mix of its mainloop and producer loops (tools/build/sass_loops.py),
also written to build/sass_loops.md.

--debug-hang (or FLASH3_DEBUG_HANG=1, or -DFLASH3_DEBUG_HANG=1 in FLASH3_NVCC_FLAGS) checks the
hang-diagnosis build instead (csrc/flash3/common/debug_hang.cuh) of the selected fwd and bwd TUs (not
the plain ones), into build/sass-debug-hang/. Its
printf-and-trap slow path is a function call in every wait, so it relaxes exactly what such calls
break: BPT.TRAP must be present (the __trap) instead of absent; LDL/STL are allowed (printf's
argument buffer and the spills the call ABI forces, ~0.6 KB per thread at hdim 128, shown in the
table), and so are its stack frame, ptxas' C75xx advisories and the missing softmax/P.V overlap
(a wgmma may not stay in flight across a call, so ptxas serializes them). HGMMA, UTMALDG, SYNCS and
USETMAXREG are still required.

Knobs: FLASH3_HDIMS / FLASH3_DTYPES (a subset, see csrc/generate_kernels.py), CUDA_HOME, CUTLASS_DIR,
FLASH3_COMPILE_JOBS (default 2; each compile needs ~4 GB), FLASH3_EXTRA_INCLUDE_DIRS (searched before
csrc/; for testing with a stand-in flash3/fwd/launch.cuh), FLASH3_NVCC_FLAGS.
Needs nvcc (>= 12.3), the CUTLASS headers and cuobjdump; CI installs the last two with
  python3 -m pip install nvidia-cutlass==4.2.0.0 nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
(cuobjdump -sass runs nvdisasm, which it looks for beside itself, on PATH or in NVDISASM_PATH).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flash3_build as fb  # noqa: E402
import sass_loops  # noqa: E402

ROOT = fb.ROOT
OUT_DIR = ROOT / "build" / "sass"
REQUIRED = ("HGMMA", "UTMALDG", "SYNCS", "USETMAXREG")
# The FP8 kernels (names contain "fp8"): 8-bit WGMMA is QGMMA in SASS, not HGMMA.
REQUIRED_FP8 = ("QGMMA", "UTMALDG", "SYNCS", "USETMAXREG")
# The decode kernels (decode_*) also gather K/V rows of small pages with cp.async: LDGSTS.
REQUIRED_DECODE = REQUIRED + ("LDGSTS",)
# With an FP8 cache (decode_*_kve4m3_*) K/V are always gathered (no TMA loads at all: Q is stored
# by the producer) and converted from e4m3 in the producer: F2FP.E4M3 (F2FP.F16.E4M3.UNPACK_B).
REQUIRED_DECODE_FP8_CACHE = ("HGMMA", "SYNCS", "USETMAXREG", "LDGSTS", "F2FP.E4M3")
COUNTED = ("HGMMA", "QGMMA", "UTMALDG", "UTMASTG", "SYNCS", "USETMAXREG", "LDGSTS", "F2FP.E4M3", "LDL", "STL",
           "LDG", "STG")
_GMMA = ("HGMMA", "QGMMA")


def kernel_checks(k) -> tuple[tuple, bool]:
    """(required instructions, whether the softmax/P.V overlap check applies) for a TU.
    The FP8 kernels with d_v > 64 (d_v 128 on 128-key tiles, 256 on 64) run P.V in 64-column chunks
    (FwdFp8Steps::pv_chunks, FwdTraits::kOChunks) without the softmax overlap
    (csrc/flash3/fwd/fp8_steps.cuh FwdFp8Steps::step), so only the FP8 d_v <= 64 kernel is checked
    for it.
    The backward (bwd_*) has no softmax under a P.V product: the rest of the forward's checks."""
    if isinstance(k, PlainTU):
        return k.required, k.mainloop
    if getattr(k, "is_bwd", False):
        return REQUIRED, False
    if getattr(k, "kind", "") == "decode":
        return (REQUIRED_DECODE_FP8_CACHE if getattr(k, "cache", "") else REQUIRED_DECODE), True
    if "fp8" in k.name:
        return REQUIRED_FP8, k.head_dim_v <= 64
    return REQUIRED, True


@dataclass
class PlainTU:
    """A memory-bound kernel TU outside the generated set (no WGMMA, TMA or mainloop): it must
    compile for sm_90a with the `required` instructions, no traps, no local memory, no stack."""
    name: str
    path: Path
    required: tuple
    mainloop: bool = False


PLAIN_TUS = [PlainTU("decode_append_kv_sm90", ROOT / "csrc/flash3/decode/append_kv.cu",
                     ("LDG", "STG")),
             PlainTU("decode_combine_sm90", ROOT / "csrc/flash3/decode/combine.cu", ("LDG", "STG")),
             PlainTU("fp8_quantize_sm90", ROOT / "csrc/flash3/fp8/quantize.cu", ("LDG", "STG"))]
INSTALL_HINT = "python3 -m pip install nvidia-cutlass==4.2.0.0 nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"

# "/*01a0*/   @!P0 HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;"
_INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:\{\s*)?(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Za-z0-9_]+)*)\s*([^;]*)")
# A P.V step's exponentials: each thread owns block_n / 2 scores of a 64 x block_n S tile.
EX2_FLOOR_FRACTION = 0.25


# Where compile-check and sass_loops.py find cuobjdump (flash3_build.py: the toolkit, the venv's wheels).
find_cuobjdump = fb.find_cuobjdump


@dataclass
class Result:
    name: str
    ok: bool = False
    problems: list = field(default_factory=list)
    seconds: float = 0.0
    registers: int | None = None
    smem: int | None = None  # static smem; the kernels' dynamic smem is not in the ptxas report
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    counts: dict = field(default_factory=dict)
    overlap: list = field(default_factory=list)  # (EX2 under the P.V, EX2 of the step) per step
    loops: list = field(default_factory=list)  # sass_loops.LoopReport of the mainloop/producer loops


def parse_ptxas(text: str, r: Result) -> None:
    """Fills registers/smem/spills from `ptxas -v` output (max over entry functions)."""
    for m in re.finditer(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?", text):
        r.registers = max(r.registers or 0, int(m.group(1)))
        if m.group(2):
            r.smem = max(r.smem or 0, int(m.group(2)))
    for m in re.finditer(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text):
        r.stack = max(r.stack, int(m.group(1)))
        r.spill_stores += int(m.group(2))
        r.spill_loads += int(m.group(3))
    # Every C75xx advisory is a wgmma performance loss (C7510 device asserts, C7508, C7512 too few
    # registers, C7513 operand registers written in flight, C7519/C7520 a call inside the wgmma
    # window, ...): one of them anywhere serializes the kernel's wgmmas.
    seen = set()
    for line in text.splitlines():
        m = re.search(r"\((C75\d\d)\)", line)
        if m and m.group(1) not in seen:
            seen.add(m.group(1))
            r.problems.append(f"ptxas {m.group(1)}: {line.split(':', 1)[-1].strip()[:240]}")
    if r.stack:  # an outlined (non-inlined) device function: a CALL inside the mainloop
        r.problems.append(f"ptxas: {r.stack} bytes stack frame (an outlined call; make it __forceinline__)")


def ex2_overlap(sass: str) -> list[tuple[int, int]]:
    """(exponentials before the wait, exponentials of the step) for every mainloop step.

    A step's P.V is an HGMMA batch with its A operand in registers ("HGMMA... R88, R180, gdesc");
    the step waits for S with `WARPGROUP.DEPBAR.LE gsb0, 0x1`, runs the softmax, then waits for
    the P.V with `WARPGROUP.DEPBAR.LE gsb0, 0x0`. The MUFU.EX2 between the batch's last HGMMA and
    that second wait run while the P.V is in flight; the step's exponentials are those up to the
    next HGMMA. The P.V after the mainloop (no 0x1 wait before its 0x0 wait) is not a step.
    """
    ins = [(m.group(1) + m.group(2), m.group(3)) for m in map(_INSN.match, sass.splitlines()) if m]
    steps = []
    for i, (op, args) in enumerate(ins):
        if not (op.startswith(_GMMA) and re.match(r"R\d+, R\d+, ", args) and "gsb0" in args):
            continue
        before = total = 0
        waited_s = waited_pv = False
        for op2, args2 in ins[i + 1:]:
            if op2.startswith(_GMMA):
                break
            if op2 == "WARPGROUP.DEPBAR.LE" and not waited_pv:
                if args2.replace(" ", "").endswith(",0x0"):
                    waited_pv = True
                else:
                    waited_s = True
            if op2 == "MUFU.EX2":
                total += 1
                before += not waited_pv
        if waited_s and total:
            steps.append((before, total))
    return steps


def scan_sass(sass: str, r: Result, debug_hang: bool = False, required=REQUIRED,
              mainloop: bool = True, name_part: str = "") -> None:
    """Checks the SASS of a TU into r. name_part: a string some kernel (`Function : <mangled name>`)
    must contain ("bwd" for the backward TUs; "" = any function)."""
    counts = {k: 0 for k in COUNTED}
    trap = 0
    for line in sass.splitlines():
        m = _INSN.match(line)
        if not m:
            continue
        op, mods = m.group(1), m.group(2)
        if op in counts:
            counts[op] += 1
        if op == "F2FP" and ".E4M3" in mods:
            counts["F2FP.E4M3"] += 1
        if op == "BPT" and mods.startswith(".TRAP"):
            trap += 1
    r.counts = counts
    r.overlap = ex2_overlap(sass) if mainloop else []
    if not debug_hang and mainloop:
        low = [f"{b}/{t}" for b, t in r.overlap if b < EX2_FLOOR_FRACTION * t]
        if not r.overlap:
            r.problems.append("no mainloop step (RS HGMMA batch, DEPBAR 0x1, softmax, DEPBAR 0x0) found in the SASS")
        elif low:
            r.problems.append(f"softmax/P.V overlap below the floor ({EX2_FLOOR_FRACTION:.0%} of a step's "
                              f"MUFU.EX2 before the P.V wait) in {len(low)} of {len(r.overlap)} steps: "
                              + ", ".join(low))
    functions = [l.split(":", 1)[1].strip() for l in sass.splitlines() if l.lstrip().startswith("Function :")]
    if not functions:
        r.problems.append("no device function in the SASS dump (is run_fwd/run_bwd instantiating a kernel?)")
    elif name_part and not any(name_part in f for f in functions):
        r.problems.append(f"no kernel with {name_part!r} in its name in the SASS dump (functions: "
                          + ", ".join(functions)[:300] + ")")
    for k in required:
        if counts[k] == 0:
            r.problems.append(f"no {k} instruction")
    r.counts["BPT.TRAP"] = trap
    if debug_hang and not trap:
        r.problems.append("no BPT.TRAP: the bounded waits of debug_hang.cuh are not compiled in")
    if trap and not debug_hang:
        r.problems.append(f"{trap} BPT.TRAP instruction(s) (wgmma compiled for sm_90 instead of sm_90a?)")
    if (counts["LDL"] or counts["STL"]) and not debug_hang:
        r.problems.append(f"local-memory traffic: {counts['LDL']} LDL, {counts['STL']} STL")


def compile_one(k, cmd_base: list[str], cuobjdump: str, obj_dir: Path, debug_hang: bool = False,
                keep_as=None) -> Result:
    """keep_as(k) -> Path: where the object stays after the checks (the simulator's cache, for
    release builds); else it is deleted."""
    r = Result(k.name)
    obj = obj_dir / f"{k.name}.o"
    ptxas_txt = OUT_DIR / f"{k.name}.ptxas.txt"
    sass_txt = OUT_DIR / f"{k.name}.sass"
    for f in (obj, ptxas_txt, sass_txt):
        if f.exists():
            f.unlink()
    cmd = cmd_base + ["-c", str(k.path), "-o", str(obj)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired:
        out, rc = "timed out after 3600 s", -1
    r.seconds = time.monotonic() - t0
    ptxas_txt.write_text("$ " + " ".join(cmd) + "\n" + out)
    if rc != 0:
        tail = "\n".join(l for l in out.splitlines() if "error" in l.lower())[:1500] or out[-1500:]
        r.problems.append(f"nvcc failed (exit {rc}); see {ptxas_txt.relative_to(ROOT)}:\n{tail}")
        return r
    parse_ptxas(out, r)
    if debug_hang:  # its out-of-line printf/trap path: serialized wgmma and a stack frame by design
        r.problems = [p for p in r.problems
                      if not (p.startswith("ptxas C75") or (p.startswith("ptxas: ") and "stack frame" in p))]
    proc = subprocess.run([cuobjdump, "-sass", str(obj)], capture_output=True, text=True)
    if proc.returncode != 0:
        r.problems.append(f"cuobjdump -sass failed: {proc.stderr.strip()[:500]}")
        return r
    sass_txt.write_text(proc.stdout)
    scan_sass(proc.stdout, r, debug_hang, *kernel_checks(k), name_part="bwd" if getattr(k, "is_bwd", False) else "")
    if not isinstance(k, PlainTU):
        r.loops = sass_loops.analyze(proc.stdout)
    if keep_as is not None:
        target = keep_as(k)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(obj, target)
    else:
        obj.unlink()
    r.ok = not r.problems
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", "--jobs", type=int, default=int(os.environ.get("FLASH3_COMPILE_JOBS", "2")),
                    help="parallel nvcc compiles (default 2; ~4 GB each)")
    ap.add_argument("--debug-hang", action="store_true",
                    help="check the FLASH3_DEBUG_HANG=1 build (adds the define; allows its traps, "
                         "local memory and wgmma serialization)")
    ap.add_argument("--only", default="",
                    help="comma-separated TU names (e.g. fwd_bf16_hdim128_sm90): compile just those")
    ap.add_argument("--list", action="store_true",
                    help="print the TUs that would be compiled (with the knobs applied) and exit")
    args = ap.parse_args(argv)
    global OUT_DIR
    extra_flags = fb.extra_nvcc_flags()
    if args.debug_hang and not fb.is_debug_hang(extra_flags):
        extra_flags.append(fb.DEBUG_HANG_DEFINE)
    debug_hang = fb.is_debug_hang(extra_flags)
    if debug_hang:
        OUT_DIR = ROOT / "build" / "sass-debug-hang"

    def fail(msg: str) -> int:
        print(f"compile-check: FAILED: {msg}", file=sys.stderr)
        return 1

    gk = fb.generate_kernels()
    problems = gk.check()
    if problems:
        return fail("csrc/generated/ is out of date (run `python3 csrc/generate_kernels.py`):\n  "
                    + "\n  ".join(problems))
    try:
        kernels = gk.selected_kernels()
    except ValueError as e:
        return fail(str(e))
    if not kernels:
        return fail("FLASH3_HDIMS/FLASH3_DTYPES select no kernel")
    if not debug_hang:  # the hang build only changes the pipelined kernels' waits
        kernels = list(kernels) + PLAIN_TUS
    if args.only:
        wanted = set(args.only.split(","))
        kernels = [k for k in kernels if k.name in wanted]
        if not kernels:
            return fail(f"--only {args.only}: no such TU (see --list)")
    if args.list:
        for k in kernels:
            print(k.path.relative_to(ROOT).as_posix())
        return 0

    cuda_home, how = fb.find_cuda_home()
    if cuda_home is None:
        return fail(f"no CUDA toolkit: {how}")
    ver = fb.nvcc_version(cuda_home)
    if ver is None or ver < fb.MIN_NVCC:
        return fail(f"nvcc at {cuda_home} is {ver}; need >= {fb.MIN_NVCC[0]}.{fb.MIN_NVCC[1]}")
    try:
        cutlass, cutlass_how = fb.find_cutlass(search_project_venvs=True)
    except RuntimeError as e:
        return fail(str(e))
    if cutlass is None:
        return fail(f"CUTLASS headers {cutlass_how}\n  install them with: {INSTALL_HINT}")
    cuobjdump = find_cuobjdump(cuda_home)
    if cuobjdump is None:
        return fail(f"no cuobjdump (not in {cuda_home}/bin, on PATH or in this Python's site-packages)"
                    f"\n  install it with: {INSTALL_HINT}")
    # cuobjdump -sass runs nvdisasm; the pip wheels put both in one bin/ folder.
    nvdisasm_dirs = [os.environ.get("NVDISASM_PATH", ""), os.path.dirname(cuobjdump),
                     os.path.join(cuda_home, "bin")]
    nvdisasm_dir = next((d for d in nvdisasm_dirs if d and os.access(os.path.join(d, "nvdisasm"), os.X_OK)),
                        None)
    if nvdisasm_dir is None and shutil.which("nvdisasm") is None:
        return fail(f"no nvdisasm (needed by cuobjdump -sass)\n  install it with: {INSTALL_HINT}")
    if nvdisasm_dir is not None:
        os.environ["PATH"] = nvdisasm_dir + os.pathsep + os.environ.get("PATH", "")

    extra_inc = fb.extra_include_dirs()
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    if debug_hang:
        includes = extra_inc + [str(ROOT / "csrc")] + fb.cutlass_include_dirs(cutlass)
        kflags = fb.NVCC_KERNEL_FLAGS + ["-I" + d for d in includes] + extra_flags
        keep_as = None
    else:
        # setup.py's flags with the simulator's -gencode (the same sm_90a SASS plus the compute_90a
        # PTX the simulator runs): each object then lands in the simulator's cache under the name
        # kernel_objects.py gives it, so `make sim-check` compiles nothing twice.
        import kernel_objects
        kflags = kernel_objects.kernel_flags(cutlass, ROOT / "csrc")
        keep_as = lambda k: kernel_objects.cached_object(ROOT / "csrc", k.path, kflags, nvcc)  # noqa: E731
    cmd_base = [nvcc] + kflags + ["-Xptxas=-v"]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    obj_dir = ROOT / "build" / ("compile-check-debug-hang" if debug_hang else "compile-check")
    obj_dir.mkdir(parents=True, exist_ok=True)
    jobs = max(1, args.jobs)
    print(f"compile-check: {len(kernels)} TU(s), {jobs} at a time; nvcc {ver[0]}.{ver[1]} ({cuda_home}), "
          f"CUTLASS {fb.cutlass_version(cutlass)} ({cutlass_how}), cuobjdump {cuobjdump}", flush=True)
    if extra_inc:
        print(f"compile-check: extra include dirs first: {extra_inc}", flush=True)
    print("compile-check: " + " ".join(cmd_base) + " -c <tu> -o <obj>", flush=True)

    t0 = time.monotonic()
    results: list[Result] = []

    def job(k):
        r = compile_one(k, cmd_base, cuobjdump, obj_dir, debug_hang, keep_as)
        status = "ok" if r.ok else "FAIL"
        print(f"  [{status}] {r.name} ({r.seconds:.0f} s)", flush=True)
        return r

    with ThreadPoolExecutor(max_workers=jobs) as ex:
        results = list(ex.map(job, kernels))
    total = time.monotonic() - t0

    hdr = ["TU", "regs", "smem", "spill st/ld", "H/QGMMA", "UTMALDG", "UTMASTG", "SYNCS", "SETMAXREG",
           "EX2 under P.V", "time", "status"]
    rows = []
    for r in results:
        c = r.counts
        rows.append([r.name, str(r.registers if r.registers is not None else "-"),
                     str(r.smem if r.smem is not None else "-"), f"{r.spill_stores}/{r.spill_loads}",
                     str(c["HGMMA"] + c["QGMMA"]) if "HGMMA" in c else "-",
                     *(str(c.get(k, "-")) for k in ("UTMALDG", "UTMASTG", "SYNCS", "USETMAXREG")),
                     "{}/{}".format(*min(r.overlap, key=lambda bt: bt[0] / bt[1])) if r.overlap else "-",
                     f"{r.seconds:.0f}s", "ok" if r.ok else "FAIL"])
    widths = [max(len(x) for x in col) for col in zip(hdr, *rows)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print()
    print(line(hdr))
    print(line(["-" * w for w in widths]))
    for row in rows:
        print(line(row))
    print(f"\n(regs: ptxas' per-thread cap for the kernel; smem: static only; EX2 under P.V: the worst "
          f"mainloop step's exponentials issued before the wait on its P.V WGMMA, of the step's total. "
          f"SASS and ptxas reports "
          f"in {OUT_DIR.relative_to(ROOT)}/; wall time {total:.0f} s)")

    loop_md = ROOT / "build" / ("sass_loops-debug-hang.md" if debug_hang else "sass_loops.md")
    tables = [sass_loops.table(r.name, r.loops) for r in results if r.loops]
    if tables:
        loop_md.write_text(sass_loops.LEGEND + "\n" + "\n".join(tables))
        print("\nLoops per iteration (tools/build/sass_loops.py; full tables in "
              f"{loop_md.relative_to(ROOT)}):")
        for r in results:
            for lr in r.loops:
                per_key = f"{lr.per_key:.2f}/key" if lr.per_key else "-"
                ex2 = " EX2 under P.V %d/%d" % lr.ex2_under_pv if lr.ex2_under_pv else ""
                print(f"  {r.name:40s} {lr.kind:9s} {lr.blocks} block(s)/iteration, {lr.per_block:6.1f} "
                      f"non-GMMA instrs per block, {lr.keys or '-'} keys, {per_key}; "
                      f"UTMALDG/block {lr.ops['UTMALDG'] / lr.blocks:g}{ex2}")

    bad = [r for r in results if not r.ok]
    if bad:
        print(file=sys.stderr)
        for r in bad:
            for p in r.problems:
                print(f"compile-check: {r.name}: {p}", file=sys.stderr)
        return fail(f"{len(bad)} of {len(results)} kernel TU(s) failed")
    if debug_hang:
        print(f"compile-check: OK, {len(results)} hang-diagnosis TU(s) compiled for sm_90a with HGMMA, TMA, "
              f"mbarriers, setmaxnreg and the bounded waits' traps (local memory and serialized wgmma allowed)")
        return 0
    print(f"compile-check: OK, {len(results)} kernel TU(s) compiled for sm_90a with HGMMA, TMA, mbarriers "
          f"and setmaxnreg, no traps, no local memory, no stack frame, no C75xx advisory, softmax under P.V "
          f"(forward)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
