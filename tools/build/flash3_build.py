"""Build-environment detection shared by setup.py, tools/build/flash3_build_backend.py (the PEP 517
backend) and tools/build/compile_check.py: where torch, the CUDA toolkit, nvcc and CUTLASS are, and
whether the CUDA extension flash3._C will be built. Standard library only; importing it is cheap
(torch is imported only by plan()).

Knobs (environment):
  FLASH3_SKIP_CUDA=1    install the pure-Python package only
  FLASH3_FORCE_CUDA=1   fail instead of falling back to pure Python when the CUDA build can't happen
  FLASH3_HDIMS, FLASH3_DTYPES   restrict the kernel set (see csrc/generate_kernels.py)
  CUDA_HOME / CUDA_PATH the CUDA toolkit root (else found from nvcc on PATH, then /usr/local/cuda*)
  CUTLASS_DIR           a CUTLASS checkout (or its include/ dir); else third_party/cutlass, else the
                        nvidia-cutlass wheel (cutlass_library/source/include)
  FLASH3_NVCC_FLAGS     extra nvcc flags for the kernel TUs (e.g. -lineinfo)
  FLASH3_DEBUG_HANG=1   the hang-diagnosis build: adds -DFLASH3_DEBUG_HANG=1 (bounded waits that
                        print the barrier they wait on, then trap; csrc/flash3/common/debug_hang.cuh)
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIN_NVCC = (12, 3)
CUTLASS_REQUIREMENT = "nvidia-cutlass==4.2.0.0"
NVCC_ARCH_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a"]
# Flags for the kernel TUs (setup.py and compile_check.py compile them identically).
NVCC_KERNEL_FLAGS = NVCC_ARCH_FLAGS + [
    "-O3", "-DNDEBUG", "--use_fast_math", "-std=c++17", "--expt-relaxed-constexpr",
]


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on", "y")


DEBUG_HANG_DEFINE = "-DFLASH3_DEBUG_HANG=1"


def extra_nvcc_flags() -> list[str]:
    """Kernel nvcc flags from the environment: FLASH3_NVCC_FLAGS, plus the hang-diagnosis define
    when FLASH3_DEBUG_HANG=1."""
    flags = os.environ.get("FLASH3_NVCC_FLAGS", "").split()
    if _truthy("FLASH3_DEBUG_HANG") and not is_debug_hang(flags):
        flags.append(DEBUG_HANG_DEFINE)
    return flags


def is_debug_hang(flags: list[str]) -> bool:
    """Do these nvcc flags make the hang-diagnosis build?"""
    on = False
    for f in flags:
        m = re.fullmatch(r"-DFLASH3_DEBUG_HANG(?:=(.*))?", f)
        if m:  # the last one wins; -DNAME alone means 1
            on = m.group(1) is None or m.group(1) not in ("0", "")
    return on


def log(msg: str) -> None:
    print(f"flash3: {msg}", file=sys.stderr, flush=True)


def generate_kernels():
    """csrc/generate_kernels.py as a module (the kernel list and the FLASH3_HDIMS/DTYPES knobs)."""
    name = "flash3_generate_kernels"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "csrc" / "generate_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------
# Python environment


def target_site_dirs() -> list[str]:
    """site-packages of the interpreter running us. Under pip's build isolation this interpreter
    is the user's (venv) python, but its own site-packages were taken off sys.path."""
    dirs = []
    paths = sysconfig.get_paths()
    for key in ("purelib", "platlib"):
        if paths.get(key):
            dirs.append(paths[key])
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # old virtualenv's site.py
        pass
    try:
        user = site.getusersitepackages()
        if user:
            dirs.append(user)
    except AttributeError:
        pass
    out = []
    for d in dirs:
        if d and os.path.isdir(d) and d not in out:
            out.append(d)
    return out


def import_torch():
    """(torch module or None, note). Falls back to the target interpreter's site-packages, which
    pip's isolated build environment hides, so a plain `pip install .` sees the user's torch."""
    try:
        import torch  # noqa: F401
        return torch, ""
    except ImportError:
        pass
    added = [d for d in target_site_dirs() if d not in sys.path]
    if not added:
        return None, "torch is not installed in this Python environment"
    sys.path.extend(added)  # appended: the build environment's own packages keep priority
    importlib.invalidate_caches()
    try:
        import torch  # noqa: F401
        return torch, f"torch found in {os.path.dirname(os.path.dirname(torch.__file__))}"
    except ImportError as e:
        for d in added:
            sys.path.remove(d)
        return None, f"torch is not importable in this Python environment ({e})"


def project_venv_site_dirs() -> list[str]:
    """site-packages of $VIRTUAL_ENV, the project's .venv and build/ext-venv: where CI may have
    pip-installed nvidia-cutlass / nvidia-cuda-cuobjdump when compile_check runs under another
    python3."""
    roots = [os.environ.get("VIRTUAL_ENV", ""), str(ROOT / ".venv"), str(ROOT / "build" / "ext-venv")]
    out = []
    for r in roots:
        if r:
            out += [d for d in sorted(glob.glob(os.path.join(r, "lib", "python3*", "site-packages")))
                    if d not in out]
    return out


# ---------------------------------------------------------------------------------------------
# CUDA toolkit


def _nvcc_in(root: str | None) -> str | None:
    if not root:
        return None
    p = os.path.join(root, "bin", "nvcc")
    return p if os.path.isfile(p) and os.access(p, os.X_OK) else None


def _root_from_nvcc(nvcc: str) -> str | None:
    """The toolkit root behind an nvcc on PATH, also when it is a wrapper script or a symlink:
    nvcc's dry run prints the directory the real driver lives in (_HERE_)."""
    try:
        out = subprocess.run([nvcc, "-dryrun", "-E", "-x", "cu", os.devnull], capture_output=True,
                             text=True, timeout=60).stderr
        m = re.search(r"^#\$ _HERE_=(.+)$", out, re.M)
        if m:
            root = os.path.dirname(os.path.realpath(m.group(1).strip()))
            if _nvcc_in(root):
                return root
    except (OSError, subprocess.SubprocessError):
        pass
    real = os.path.realpath(nvcc)
    try:  # a small wrapper script: look for the absolute path of the real nvcc in it
        if os.path.getsize(real) < 65536:
            with open(real, "rb") as f:
                text = f.read().decode("utf-8", "replace")
            if text.startswith("#!"):
                for m in re.finditer(r"(/[^\s\"']+)/bin/nvcc\b", text):
                    if _nvcc_in(m.group(1)):
                        return m.group(1)
    except OSError:
        pass
    root = os.path.dirname(os.path.dirname(real))
    return root if _nvcc_in(root) else None


def find_cuda_home() -> tuple[str | None, str]:
    """(toolkit root or None, how it was found / why not)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        v = os.environ.get(var)
        if v:
            if _nvcc_in(v):
                return os.path.realpath(v), f"${var}"
            log(f"warning: ${var}={v} has no bin/nvcc; ignoring it")
    nvcc = shutil.which("nvcc")
    if nvcc:
        root = _root_from_nvcc(nvcc)
        if root:
            return root, f"nvcc on PATH ({nvcc})"
    cands = ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for c in cands:
        if _nvcc_in(c):
            return os.path.realpath(c), c
    return None, "no nvcc: not on PATH, CUDA_HOME/CUDA_PATH unset, no /usr/local/cuda*"


def nvcc_version(cuda_home: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


# ---------------------------------------------------------------------------------------------
# CUTLASS


def _cutlass_include(d: str | os.PathLike | None) -> str | None:
    if not d:
        return None
    d = Path(d)
    for inc in (d / "include", d):
        if (inc / "cute" / "tensor.hpp").is_file() and (inc / "cutlass" / "cutlass.h").is_file():
            return str(inc.resolve())
    return None


def find_cutlass(search_target_env: bool = True, search_project_venvs: bool = False
                 ) -> tuple[str | None, str]:
    """(CUTLASS include dir or None, how it was found / where we looked)."""
    env = os.environ.get("CUTLASS_DIR")
    if env:
        inc = _cutlass_include(env)
        if inc:
            return inc, "$CUTLASS_DIR"
        raise RuntimeError(f"CUTLASS_DIR={env} has no include/cute/tensor.hpp")
    inc = _cutlass_include(ROOT / "third_party" / "cutlass")
    if inc:
        return inc, "third_party/cutlass"
    # The nvidia-cutlass wheel ships the headers under cutlass_library/source/include. find_spec
    # does not run cutlass_library/__init__ (which imports cuda-python).
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        spec = None
    locs = list(spec.submodule_search_locations or []) if spec else []
    if search_target_env:
        locs += [os.path.join(d, "cutlass_library") for d in target_site_dirs()]
    if search_project_venvs:
        locs += [os.path.join(d, "cutlass_library") for d in project_venv_site_dirs()]
    for loc in locs:
        inc = _cutlass_include(os.path.join(loc, "source"))
        if inc:
            return inc, f"nvidia-cutlass wheel ({loc})"
    return None, ("not found: set CUTLASS_DIR, put a checkout in third_party/cutlass, or "
                  f"`pip install {CUTLASS_REQUIREMENT}`")


def cutlass_include_dirs(include_dir: str) -> list[str]:
    """-I dirs for a CUTLASS include dir: it, plus tools/util/include (cutlass/util/*) if present."""
    dirs = [include_dir]
    util = Path(include_dir).parent / "tools" / "util" / "include"
    if (util / "cutlass" / "util").is_dir():
        dirs.append(str(util))
    return dirs


def extra_include_dirs() -> list[str]:
    """FLASH3_EXTRA_INCLUDE_DIRS (os.pathsep-separated), searched before csrc/. A test hook: lets a
    stand-in flash3/fwd/launch.cuh replace the real one."""
    return [d for d in os.environ.get("FLASH3_EXTRA_INCLUDE_DIRS", "").split(os.pathsep) if d]


def cutlass_version(include_dir: str) -> str:
    try:
        text = Path(include_dir, "cutlass", "version.h").read_text(errors="replace")
        parts = [re.search(rf"#define CUTLASS_{k}\s+(\d+)", text).group(1)
                 for k in ("MAJOR", "MINOR", "PATCH")]
        return ".".join(parts)
    except (OSError, AttributeError):
        return "unknown"


def default_max_jobs(gb_per_job: float = 5.0) -> int:
    """Parallel nvcc jobs when MAX_JOBS is unset: one per core, but at most one per ~5 GB of
    available memory (one kernel TU peaks at ~4 GB in cicc)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    try:
        with open("/proc/meminfo") as f:
            kb = int(re.search(r"MemAvailable:\s+(\d+)", f.read()).group(1))
        by_mem = int(kb / (gb_per_job * 1024 * 1024))
    except (OSError, AttributeError, ValueError):
        by_mem = cpus
    return max(1, min(cpus, by_mem))


# ---------------------------------------------------------------------------------------------
# The decision


@dataclass
class Plan:
    build_cuda: bool
    reason: str  # why not (or a one-line summary of what is built)
    torch_version: str | None = None
    torch_cuda: str | None = None
    cuda_home: str | None = None
    nvcc: tuple[int, int] | None = None
    cutlass_include: str | None = None
    cutlass_how: str = ""
    kernels: list = field(default_factory=list)  # generate_kernels.Kernel (fwd_*.cu and bwd_*.cu TUs)


def plan(need_cutlass: bool = True) -> Plan:
    """Will the CUDA extension be built here? need_cutlass=False: decide without CUTLASS (the
    build backend asks, to add nvidia-cutlass to the build requirements if it is missing)."""
    force = _truthy("FLASH3_FORCE_CUDA")

    def no(reason: str, **kw) -> Plan:
        if force:
            raise RuntimeError(f"FLASH3_FORCE_CUDA=1 but the CUDA extension can't be built: {reason}")
        return Plan(False, reason, **kw)

    if _truthy("FLASH3_SKIP_CUDA"):
        return no("FLASH3_SKIP_CUDA is set")
    kernels = generate_kernels().selected_kernels()  # ValueError on a bad knob: a user error
    torch, note = import_torch()
    if torch is None:
        return no(note)
    tv = str(torch.__version__)
    if getattr(torch.version, "hip", None):
        return no(f"torch {tv} is a ROCm build", torch_version=tv)
    if not torch.version.cuda:
        return no(f"torch {tv} is a CPU-only build (no CUDA)", torch_version=tv)
    tc = str(torch.version.cuda)
    cuda_home, how = find_cuda_home()
    if cuda_home is None:
        return no(f"no CUDA toolkit found ({how})", torch_version=tv, torch_cuda=tc)
    ver = nvcc_version(cuda_home)
    if ver is None:
        return no(f"cannot run {cuda_home}/bin/nvcc --version", torch_version=tv, torch_cuda=tc)
    if ver < MIN_NVCC:
        return no(f"nvcc {ver[0]}.{ver[1]} at {cuda_home} is older than "
                  f"{MIN_NVCC[0]}.{MIN_NVCC[1]} (needed for sm_90a)", torch_version=tv, torch_cuda=tc)
    if int(tc.split(".")[0]) != ver[0]:
        return no(f"nvcc {ver[0]}.{ver[1]} ({cuda_home}) and torch's CUDA {tc} differ in the major "
                  "version; point CUDA_HOME at a matching toolkit", torch_version=tv, torch_cuda=tc)
    p = Plan(True, "", torch_version=tv, torch_cuda=tc, cuda_home=cuda_home, nvcc=ver,
             kernels=kernels)
    p.cutlass_include, p.cutlass_how = find_cutlass()
    if p.cutlass_include is None and need_cutlass:
        raise RuntimeError(f"flash3: torch {tv} has CUDA and nvcc {ver[0]}.{ver[1]} is at {cuda_home}, "
                           f"but CUTLASS was {p.cutlass_how}. Or set FLASH3_SKIP_CUDA=1 for a "
                           "pure-Python install.")
    names = ", ".join(k.name for k in kernels)
    p.reason = (f"building flash3._C with torch {tv} (CUDA {tc}), nvcc {ver[0]}.{ver[1]} at "
                f"{cuda_home}, CUTLASS {cutlass_version(p.cutlass_include) if p.cutlass_include else '?'} "
                f"({p.cutlass_how}); {len(kernels)} kernels: {names}")
    return p



def find_cuobjdump(cuda_home: str | None) -> str | None:
    """cuobjdump of the toolkit, on PATH, or from a CUDA wheel of this or the project's venv."""
    cands = []
    if cuda_home:
        cands.append(os.path.join(cuda_home, "bin", "cuobjdump"))
    w = shutil.which("cuobjdump")
    if w:
        cands.append(w)
    for d in [os.path.dirname(sys.executable)] + target_site_dirs() + project_venv_site_dirs():
        cands.append(os.path.join(d, "cuobjdump"))
        cands += sorted(glob.glob(os.path.join(d, "nvidia", "*", "bin", "cuobjdump")), reverse=True)
        cands += glob.glob(os.path.join(d, "nvidia", "cuda_cuobjdump", "bin", "cuobjdump"))
        cands += glob.glob(os.path.join(d, "triton", "backends", "nvidia", "bin", "cuobjdump"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None

if __name__ == "__main__":  # diagnostics: python3 tools/build/flash3_build.py [--cuda-home|--cutlass]
    if "--cuda-home" in sys.argv:
        h, _ = find_cuda_home()
        print(h or "")
        sys.exit(0 if h else 1)
    if "--cutlass" in sys.argv:
        inc, _ = find_cutlass()
        print(inc or "")
        sys.exit(0 if inc else 1)
    print(plan(need_cutlass=False))
