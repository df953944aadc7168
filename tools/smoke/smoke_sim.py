"""The Hopper-simulator backend of tools/smoke/smoke.py (`smoke.py --backend sim`): the same cases
(make_case; make_dec_case for decode, make_case(..., bwd=True) for backward) launched through
tools/hopper_sim/flash3/sim_driver.cu under tools/hopper_sim/simrun instead of torch.ops.flash3.*,
read back into CPU tensors and checked by the cases' own checks (smoke_cases.py). The kernel
objects' flags and cache are tools/build/kernel_objects.py's.

Pieces:
  build_driver()   compiles the forward, decode and backward kernel TUs the knobs select
                   (FLASH3_HDIMS, FLASH3_DTYPES, as csrc/generate_kernels.py selects them for the
                   real build) with the real kernel flags (tools/build/flash3_build.py NVCC_KERNEL_FLAGS
                   and setup.py's additions) plus the simulator's -gencode/-no-compress and
                   -fPIC (tools/build/prebuilt.py links these objects into the extension), each TU
                   once, cached under tools/hopper_sim/build/flash3/ keyed by a hash of its
                   sources and flags (tools/build/compile_check.py leaves its objects there), and the
                   decode path's append/combine kernels (DECODE_SOURCES) and the FP8 quantize
                   kernel (QUANTIZE_SOURCES); then links sim_driver.cu, sim_op_*.cu,
                   fwd/, decode/ and bwd/registry.cpp (-cudart shared). At most 2 nvcc at once.
  op_call(c, out, lse)  the case -> the op's arguments (what smoke_cases._launch_fwd/_launch_fp8 pass).
  write_case / read_case  the case directory format (sim_driver.cu documents it).
  sim_launch(c, driver, seed)  one launch under simrun; (out, lse) or SimFailure(status, detail).
  dec_op_call / dec_launch      the same for a decode launch (smoke_cases.make_dec_case's parts): the fused
                   append when the part has new keys, then fwd_kvcache_sm90 (and its combine).
  quant_launch     the same for a quantize case (smoke_quant.make_case's parts).
  bwd_op_call / bwd_launch      the same for a backward case (smoke_cases.make_case(..., bwd=True)): the
                   forward, then bwd_sm90 into NaN-poisoned dq/dk/dv (deterministic: twice).

The kernel sources come from csrc/, or from FLASH3_SIM_CSRC (a copy of csrc: e.g. a deliberately
broken kernel; the hash keeps its objects apart from the real ones).
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "build"))
# The kernel objects' flags and cache (shared with compile_check.py and prebuilt.py).
from kernel_objects import (BUILD_DIR, SIM_GENCODE, _compile, _nvcc, _source_hash, cached_object,  # noqa: E402
                            kernel_flags)
SIM_DIR = ROOT / "tools" / "hopper_sim"
DRIVER_DIR = SIM_DIR / "flash3"  # sim_driver.cu (main, forward ops), sim_op_*.cu, sim_case.h
SIMRUN = SIM_DIR / "simrun"
FORMAT = "flash3-sim-case 1"
EXIT_CHECK, EXIT_UNSUPPORTED, EXIT_REFUSED = 86, 87, 3

# torch dtype name <-> file dtype
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "e4m3", "float32": "f32", "int32": "i32"}


def _log(msg: str) -> None:
    print(f"smoke-sim: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Case files


def _torch_dtype(name: str):
    import torch
    return {v: getattr(torch, k) for k, v in _DTYPES.items()}[name]


def write_tensor(path: Path | None, t) -> tuple[str, list[int], list[int]]:
    """t's elements (contiguous, row-major) to path (None: nothing written); (dtype, sizes, strides)
    for the header."""
    import torch
    name = _DTYPES.get(str(t.dtype).removeprefix("torch."))
    if name is None:
        raise ValueError(f"no case-file dtype for {t.dtype}")
    t = t.detach().cpu().contiguous()
    if path is not None:
        raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        raw.numpy().tofile(path)
    return name, list(t.shape), list(t.stride())


def read_tensor(path: Path, dtype: str, sizes: list[int]):
    """A contiguous tensor of `sizes` from path (the driver's NAME.out.bin, or a written NAME.bin)."""
    import numpy as np
    import torch
    raw = torch.from_numpy(np.fromfile(path, dtype=np.uint8).copy())
    if raw.numel() == 0:
        return torch.empty(sizes, dtype=_torch_dtype(dtype))
    return raw.view(_torch_dtype(dtype)).reshape(sizes)


def case_lines(op: str, tensors: dict, scalars: dict, d: Path | None = None) -> list[str]:
    """case.txt's lines of a call (tensors None: left out; as written: contiguous, row-major), and
    with d each tensor's data in d/NAME.bin. Without d no data is written (tests/test_smoke_cases.py
    hands the lines to the host layer's checks on the CPU)."""
    lines = [FORMAT, f"op {op}"]
    for name, t in tensors.items():
        if t is None:
            continue
        dt, sizes, strides = write_tensor(None if d is None else d / f"{name}.bin", t)
        lines.append(" ".join(["tensor", name, dt, str(len(sizes))] + [str(x) for x in sizes + strides]))
    for k, v in scalars.items():
        if isinstance(v, bool):
            v = int(v)
        lines.append(f"{k} {float(v).hex() if isinstance(v, float) else int(v)}")
    return lines


def write_case(d: Path, op: str, tensors: dict, scalars: dict) -> None:
    """d/case.txt plus d/NAME.bin per tensor (None: left out)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "case.txt").write_text("\n".join(case_lines(op, tensors, scalars, d)) + "\n")


def read_case(d: Path) -> tuple[str, dict, dict]:
    """(op, tensors, scalars) of a case directory: write_case's inverse (tests, debugging)."""
    op, tensors, scalars = None, {}, {}
    text = (d / "case.txt").read_text().splitlines()
    if not text or text[0].strip() != FORMAT:
        raise ValueError(f"{d}/case.txt does not start with {FORMAT!r}")
    for line in text[1:]:
        parts = line.split("#")[0].split()
        if not parts:
            continue
        if parts[0] == "op":
            op = parts[1]
        elif parts[0] == "tensor":
            name, dt, nd = parts[1], parts[2], int(parts[3])
            sizes = [int(x) for x in parts[4:4 + nd]]
            tensors[name] = read_tensor(d / f"{name}.bin", dt, sizes)
        else:
            v = parts[1]
            scalars[parts[0]] = float.fromhex(v) if ("p" in v or "." in v or "x" in v) else int(v)
    return op, tensors, scalars


def op_call(c: dict, out, lse) -> tuple[str, dict, dict]:
    """(op, tensors, scalars) of one smoke case: the arguments smoke_cases._launch_fwd / _launch_fp8 give
    torch.ops.flash3.fwd_sm90 / fwd_fp8_sm90 (v is the packed vt for fwd_fp8)."""
    import smoke_cases
    left, right = smoke_cases.op_window(c)
    scalars = dict(softmax_scale=float(c["q"].shape[-1] ** -0.5), window_left=left, window_right=right,
                   softcap=float(c["softcap"]), max_seqlen_q=int(c["max_q"]), max_seqlen_k=int(c["max_k"]))
    tensors = dict(q=c["q"], k=c["k"], v=c["v"], out=out, lse=lse, cu_seqlens_q=c["cu_q"],
                   cu_seqlens_k=c["cu_k"])
    if c["dtype"] != "e4m3":
        tensors["seqused_k"] = c["seqused_k"]
        tensors["sinks"] = c.get("sinks")
        tensors["alibi_slopes"] = c.get("alibi")
        tensors["seqused_q"] = c.get("seqused_q")
        if c.get("chunk"):
            scalars["attention_chunk"] = int(c["chunk"])
        return "fwd", tensors, scalars
    from flash3 import fp8
    tensors["seqused_q"], tensors["seqused_k"] = c.get("seqused_q"), c.get("seqused_k")
    if c.get("chunk"):
        scalars["attention_chunk"] = int(c["chunk"])
    if c["cu_q"] is not None:
        tensors["v"] = fp8.pack_v_fp8_varlen(c["v"], c["cu_k"], c.get("seqused_k"))
    else:  # the op takes max_seqlen_* only with cu_seqlens (0 otherwise)
        tensors["v"] = fp8.pack_v_fp8(c["v"])
        scalars.update(max_seqlen_q=0, max_seqlen_k=0)
    qd, kd, vd, vcd = smoke_cases.fp8_op_descales(c)
    tensors.update(q_descale=qd, k_descale=kd, v_descale=vd, v_channel_descale=vcd)
    scalars.update(q_block=c["fp8_block"][0], kv_block=c["fp8_block"][1])
    if c.get("fast_accum"):
        scalars["fast_accum"] = 1
    return "fwd_fp8", tensors, scalars


def poisoned_outputs(c: dict):
    """NaN out/lse shaped as smoke_cases.launch makes them."""
    import torch
    q, v = c["q"], c["v"]
    out_dtype = torch.bfloat16 if c["dtype"] == "e4m3" else q.dtype
    out = torch.full((*q.shape[:-1], v.shape[-1]), float("nan"), dtype=out_dtype)
    lse_shape = (q.shape[1], q.shape[0]) if c["cu_q"] is not None else (q.shape[0], q.shape[2], q.shape[1])
    return out, torch.full(lse_shape, float("nan"))


# ---------------------------------------------------------------------------------------------
# Running


class SimFailure(Exception):
    """A launch that produced no outputs: status (smoke's vocabulary) and detail."""

    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def classify(rc: int, log: str) -> tuple[str, str]:
    """simrun's exit status and output -> (status, detail) for a failed run."""
    lines = [l.strip() for l in log.splitlines() if l.strip()]
    sim = [l for l in lines if l.startswith("hopper_sim:")]
    if rc == EXIT_CHECK:
        first = sim[0] if sim else "strict check (no message)"
        kind = re.match(r"hopper_sim: ([\w-]+)", first)
        status = "hang" if kind and kind.group(1) in ("deadlock", "livelock") else "crash"
        return status, first[:400]
    if rc == EXIT_UNSUPPORTED:
        return "error", ("simulator: unsupported: " + (sim[0] if sim else lines[-1] if lines else ""))[:400]
    if rc == EXIT_REFUSED:
        err = [l for l in lines if l.startswith("sim_driver: error:")]
        return "error", (err[-1] if err else lines[-1] if lines else "refused")[:400]
    if rc in (124, -9, 137):
        return "hang", "simulator run timed out"
    return "crash", f"exit {rc}: " + (lines[-1] if lines else "")[:300]


def run_case(op: str, tensors: dict, scalars: dict, outputs: dict, driver: Path, seed: int = 1,
             sms: int | None = None, timeout: float = 1800, keep: Path | None = None) -> dict:
    """One driver run of (op, tensors, scalars) under simrun (strict checks, --uninit) -> {name:
    CPU tensor} read back for each of outputs ({name: the tensor passed, for dtype and shape}).
    Raises SimFailure when the run did not finish cleanly. keep: leave the case directory there."""
    tmp = tempfile.mkdtemp(prefix="flash3-sim-") if keep is None else None
    d = Path(tmp) if tmp else keep
    try:
        write_case(d, op, tensors, scalars)
        cmd = [str(SIMRUN), "--seed", str(seed), "--uninit"] + (["--sms", str(sms)] if sms else [])
        cmd += [str(driver), str(d)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SimFailure("hang", f"simulator run exceeded {timeout:.0f} s") from None
        log = r.stdout + r.stderr
        (d / "run.log").write_text(log)
        if r.returncode != 0:
            raise SimFailure(*classify(r.returncode, log))
        return {n: read_tensor(d / f"{n}.out.bin", _DTYPES[str(t.dtype).removeprefix("torch.")], list(t.shape))
                for n, t in outputs.items()}
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def sim_launch(c: dict, driver: Path, seed: int = 1, sms: int | None = None, timeout: float = 1800,
               keep: Path | None = None):
    """One launch of forward case c under simrun -> (out, lse) CPU tensors (run_case)."""
    out, lse = poisoned_outputs(c)
    op, tensors, scalars = op_call(c, out, lse)
    res = run_case(op, tensors, scalars, {"out": out, "lse": lse}, driver, seed, sms, timeout, keep)
    return res["out"], res["lse"]


def dec_op_call(part: dict, out, lse, q_out=None) -> tuple[str, dict, dict]:
    """(op, tensors, scalars) of one decode launch (smoke_cases.make_dec_case's part): what
    smoke_cases.launch_dec gives torch.ops.flash3.append_kv_sm90 (when the part appends) and
    fwd_kvcache_sm90. q_out: the NaN-poisoned rotated-q buffer (rotary only)."""
    kd, vd = part["descales"] or (None, None)
    tensors = dict(q=part["q"], k_cache=part["kc"], v_cache=part["vc"], out=out, lse=lse,
                   seqused_k=part["seqused"], page_table=part["pt"], k_descale=kd, v_descale=vd,
                   sinks=part.get("sinks"), alibi_slopes=part.get("alibi"), qv=part.get("qv"))
    import smoke_cases
    left, right = smoke_cases.op_window(part)
    scalars = dict(softmax_scale=smoke_cases.dec_scale(part), window_left=left, window_right=right,
                   softcap=float(part["softcap"]), num_splits=int(part["num_splits"]))
    if part.get("cu_q") is not None:  # packed (varlen) queries: q/out (total_q, h, .), lse (h, total_q)
        tensors["cu_seqlens_q"] = part["cu_q"]
        scalars["max_seqlen_q"] = int(part["max_q"])
    a = part["append"]
    if a is not None:
        tensors.update(k=a["k"], v=a["v"], cache_seqlens=a["cache_seqlens"], rotary_cos=a["cos"],
                       rotary_sin=a["sin"], q_out=q_out if a["cos"] is not None else None,
                       rotary_seqlens=a.get("rotary_seqlens"), cu_seqlens_k_new=a.get("cu_k"))
        scalars.update(rotary_interleaved=bool(a["interleaved"]), q_per_token=bool(a["per_token"]))
    tensors["cache_leftpad"] = part.get("leftpad")
    if part.get("fa3") is not None:  # FA3's descales: per batch entry (the driver's optional scalar)
        scalars["descale_per_batch"] = 1
    if part.get("chunk"):
        scalars["attention_chunk"] = int(part["chunk"])
    return "kvcache", tensors, scalars


def dec_launch(part: dict, driver: Path, seed: int = 1, sms: int | None = None, timeout: float = 1800,
               keep: Path | None = None) -> dict:
    """One decode launch under simrun -> {"out", "lse", "kc", "vc", "q_out"} as smoke_cases.launch_dec
    returns them (the caches after the append; q_out None without rotary)."""
    import smoke_cases
    out, lse, q_out = smoke_cases.dec_poisoned_outputs(part)
    op, tensors, scalars = dec_op_call(part, out, lse, q_out)
    outputs = {"out": out, "lse": lse, "k_cache": part["kc"], "v_cache": part["vc"]}
    if tensors.get("q_out") is not None:
        outputs["q_out"] = q_out
    res = run_case(op, tensors, scalars, outputs, driver, seed, sms, timeout, keep)
    return {"out": res["out"], "lse": res["lse"], "kc": res["k_cache"], "vc": res["v_cache"],
            "q_out": res.get("q_out")}


def bwd_op_call(c: dict, out, lse, dq, dk, dv, dsinks=None) -> tuple[str, dict, dict]:
    """(op, tensors, scalars) of one backward launch of case c (smoke_cases.make_case(..., bwd=True)):
    what smoke_cases.launch_bwd gives torch.ops.flash3.bwd_sm90 (out/lse: the forward's, with the sinks;
    sinks and dsinks when the case has sinks)."""
    tensors = dict(dout=c["dout"], q=c["q"], k=c["k"], v=c["v"], out=out, lse=lse, dlse=c["dlse"], dq=dq, dk=dk,
                   dv=dv, cu_seqlens_q=c["cu_q"], cu_seqlens_k=c["cu_k"], sinks=c.get("sinks"), dsinks=dsinks,
                   alibi_slopes=c.get("alibi"))
    import smoke_cases
    left, right = smoke_cases.op_window(c)
    scalars = dict(max_seqlen_q=int(c["max_q"]), max_seqlen_k=int(c["max_k"]),
                   softmax_scale=float(c["q"].shape[-1] ** -0.5), window_left=left, window_right=right,
                   softcap=float(c["softcap"]),
                   deterministic=bool(c["deterministic"]))
    tensors["seqused_q"] = c.get("seqused_q")
    if c.get("chunk"):
        scalars["attention_chunk"] = int(c["chunk"])
    return "bwd", tensors, scalars


def bwd_launch(c: dict, driver: Path, seed: int = 1, sms: int | None = None, timeout: float = 1800,
               keep: Path | None = None):
    """smoke_cases.launch_bwd under simrun -> (out, lse, grads, second grads or None): the forward
    (sim_launch, with the case's sinks; smoke_cases.fwd_by_reference: reference_fwd on the CPU, no
    launch), then one backward launch into
    NaN-poisoned dq/dk/dv (and dsinks: grads [dq, dk, dv, dsinks]); deterministic: a second one
    with schedule seed + 1 (another schedule is the simulator's run-to-run variation). keep: each
    launch's case directory under it (fwd, bwd, bwd_again)."""
    import torch
    sub = lambda name: None if keep is None else keep / name  # noqa: E731
    import smoke_cases
    if smoke_cases.fwd_by_reference(c):  # ALiBi above the forward kernels' head dims: the API's reference
        out, lse = smoke_cases.reference_fwd(c)
    else:
        out, lse = sim_launch(c, driver, seed, sms, timeout, sub("fwd"))
    if torch.isnan(out[smoke_cases.used_rows(c, "out")]).any() or torch.isnan(lse[:, smoke_cases.used_rows(c, "q")]).any():
        raise RuntimeError("the forward kernel left NaN in out/lse (see its row)")

    def once(s, name):
        grads = {f"d{n}": torch.full_like(c[n], float("nan")) for n in "qkv"}
        if c.get("sinks") is not None:
            grads["dsinks"] = torch.full_like(c["sinks"], float("nan"))
        op, tensors, scalars = bwd_op_call(c, out, lse, *grads.values())
        res = run_case(op, tensors, scalars, grads, driver, s, sms, timeout, sub(name))
        return [res[n] for n in grads]
    grads = once(seed, "bwd")
    return out, lse, grads, once(seed + 1, "bwd_again") if c["deterministic"] else None


def quant_launch(p: dict, driver, seed: int = 1, sms: int | None = None, timeout: float = 1800, keep=None) -> dict:
    """smoke_quant.launch() under the simulator: {"out", "descale"} CPU tensors."""
    import smoke_quant
    out, descale = smoke_quant.poisoned_outputs(p)
    op, tensors, scalars = smoke_quant.op_call(p, out, descale)
    return run_case(op, tensors, scalars, {"out": out, "descale": descale}, driver, seed, sms,
                              timeout, keep)


# ---------------------------------------------------------------------------------------------
# Build


def _fb():
    import flash3_build
    return flash3_build


def csrc_root() -> Path:
    return Path(os.environ.get("FLASH3_SIM_CSRC") or ROOT / "csrc").resolve()


def selected_tus(csrc: Path | None = None, kinds=("fwd",)) -> list[Path]:
    """The kernel TUs of `kinds` ("fwd": 16-bit and FP8 forward; "decode": the KV-cache kernels,
    both cache kinds; "bwd": the backward) FLASH3_HDIMS / FLASH3_DTYPES select, in csrc."""
    csrc = csrc or csrc_root()
    return [csrc / "generated" / f"{k.name}.cu" for k in _fb().generate_kernels().selected_kernels()
            if k.kind in kinds]


# The decode path's own kernels (not generated; setup.py compiles them into every build): the fused
# append and the split-KV combine. Linked into the driver always (it calls both).
DECODE_SOURCES = ("flash3/decode/append_kv.cu", "flash3/decode/combine.cu")
# The fused FP8 rotate-and-quantize (setup.py compiles it into every build, both input dtypes):
# linked always, for sim_op_quantize.cu.
QUANTIZE_SOURCES = ("flash3/fp8/quantize.cu",)


def host_layer_sources(csrc: Path | None = None) -> list[Path]:
    """The torch-free host layer (csrc/flash3/host/*.cpp): every op's checks, kernel pick, parameters
    and launch, linked into the driver as into flash3._C (setup.py)."""
    return sorted((csrc or csrc_root()).joinpath("flash3", "host").glob("*.cpp"))


ALL_KINDS = ("fwd", "decode", "bwd")


def kinds_for(kernel_ids) -> tuple:
    """The TU kinds smoke kernel ids need (a backward case runs its forward first)."""
    import smoke_cases
    need = set()
    for k in kernel_ids:
        fam = smoke_cases.family(k)
        need |= {"dec": {"decode"}, "bwd": {"fwd", "bwd"}, "quant": set()}.get(fam, {"fwd"})
    return tuple(k for k in ALL_KINDS if k in need)


def build_driver(jobs: int | None = None, kinds=ALL_KINDS) -> Path:
    """The sim_driver binary for the selected kernels of `kinds` (the quantize, append and combine
    kernels always), building what is missing (jobs nvcc at once: FLASH3_COMPILE_JOBS, default 2).
    Returns its path."""
    jobs = jobs or int(os.environ.get("FLASH3_COMPILE_JOBS", "2"))
    fb = _fb()
    csrc = csrc_root()
    nvcc = _nvcc()
    cutlass, how = fb.find_cutlass(search_project_venvs=True)
    if cutlass is None:  # the venv lacks the wheel: ask the system python3 (as `make sim-check` does)
        r = subprocess.run(["python3", str(ROOT / "tools" / "build" / "flash3_build.py"), "--cutlass"],
                           capture_output=True, text=True)
        cutlass = r.stdout.strip() or None
    if cutlass is None:
        raise RuntimeError(f"CUTLASS {how}")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    if not (SIM_DIR / "build" / "lib" / "libcudart.so.13").exists():
        subprocess.run(["make", "-s", "-C", str(SIM_DIR), "lib"], check=True)
    tus = selected_tus(csrc, kinds)
    if not tus and kinds:
        raise RuntimeError(f"FLASH3_HDIMS/FLASH3_DTYPES select no kernel of kinds {kinds}")
    tus += [csrc / x for x in DECODE_SOURCES + QUANTIZE_SOURCES]
    kflags = kernel_flags(cutlass, csrc)
    objs, todo = [], []
    for tu in tus:
        if not tu.exists():
            raise RuntimeError(f"missing {tu} (python3 csrc/generate_kernels.py)")
        obj = cached_object(csrc, tu, kflags, nvcc)
        objs.append(obj)
        if not obj.exists():
            todo.append((tu, obj))
    # The host side: the driver's files and the registries, with the same include dirs, keyed as the
    # kernel TUs are (what each includes, by content; csrc's path taken out), so a copy of csrc
    # (mutant_check.sh's mutants) rebuilds only the host objects its change reaches.
    hflags = [SIM_GENCODE, "-no-compress", "-std=c++17", "-O2"] + [f for f in kflags if f.startswith("-I")]
    host_srcs = [DRIVER_DIR / "sim_driver.cu"] + sorted(DRIVER_DIR.glob("sim_op_*.cu"))
    host_srcs += host_layer_sources(csrc)
    host_srcs += [csrc / "flash3" / d / "registry.cpp" for d in ("fwd", "decode", "bwd")]
    host, host_todo = [], []
    for src in host_srcs:
        obj = BUILD_DIR / f"{src.parent.name}-{src.stem}-{_source_hash(csrc, src, hflags, nvcc)}.o"
        host.append(obj)
        if not obj.exists():
            host_todo.append((src, obj))
    if todo:
        _log(f"compiling {len(todo)} kernel TU(s), {jobs} at a time (about a minute each)")
    # One pool for both (the kernel TUs first: they are the long ones), `jobs` nvcc at once.
    cmds = [([nvcc] + kflags + ["-c", str(tu)], obj, tu.name) for tu, obj in todo]
    cmds += [([nvcc] + hflags + ["-x", "cu", "-c", str(src)], obj, src.name) for src, obj in host_todo]
    if cmds:
        with concurrent.futures.ThreadPoolExecutor(max(1, min(jobs, 2))) as ex:
            for f in [ex.submit(_compile, *c) for c in cmds]:
                f.result()
    link = host + objs
    exe = BUILD_DIR / ("sim_driver-" + hashlib.sha256("\0".join(map(str, link)).encode()).hexdigest()[:16])
    if not exe.exists():
        _compile([nvcc, SIM_GENCODE, "-cudart", "shared", "-no-compress"] + [str(o) for o in link], exe, "link")
    return exe


def driver_info(driver: Path) -> dict:
    """kernel_info()'s JSON of the driver's kernels (no simulation: --info launches nothing)."""
    r = subprocess.run([str(SIMRUN), str(driver), "--info"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])
