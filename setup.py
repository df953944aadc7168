"""flash3: FlashAttention-3 forward and backward kernels for Hopper (sm_90a) as a PyTorch extension.

`pip install .` builds the CUDA extension flash3._C when torch has CUDA and nvcc >= 12.3 is found;
otherwise it installs the pure-Python package (reference backend) and says why (stderr, and
flash3/_build_info.py, for `python -m flash3` to report). The version gets a "+nocuda" local label
then, so pip's own "Successfully installed flash3-..." line shows it too.

Knobs (environment): FLASH3_SKIP_CUDA=1, FLASH3_FORCE_CUDA=1, FLASH3_HDIMS=128,192x128,
FLASH3_DTYPES=bf16, CUDA_HOME, CUTLASS_DIR, MAX_JOBS, FLASH3_NVCC_FLAGS (extra nvcc flags, e.g.
-lineinfo), FLASH3_DEBUG_HANG=1 (the hang-diagnosis build), FLASH3_PREBUILT=DIR (link the kernel
objects of `make device-prep` from DIR instead of compiling them; tools/build/prebuilt.py). See
tools/build/flash3_build.py and third_party/README.md.
"""

import os
import shlex
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools" / "build"))
import flash3_build as fb  # noqa: E402

VERSION = "0.1.0"

# Making an sdist must not depend on this machine's torch/CUDA.
_SDIST_ONLY = any(a in ("sdist", "egg_info", "--version", "--help") for a in sys.argv[1:]) and not any(
    a in ("bdist_wheel", "build_ext", "build", "install", "develop", "editable_wheel", "dist_info")
    for a in sys.argv[1:])

if _SDIST_ONLY:
    PLAN = fb.Plan(False, "sdist")
else:
    PLAN = fb.plan()

ext_modules = []
cmdclass = {}

if PLAN.build_cuda:
    # torch.utils.cpp_extension reads CUDA_HOME once, at import; without it torch guesses the
    # parent of the nvcc on PATH, which is wrong when that nvcc is a wrapper script.
    os.environ["CUDA_HOME"] = PLAN.cuda_home
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    cutlass_ver = fb.cutlass_version(PLAN.cutlass_include).split(".")
    if len(cutlass_ver) != 3:
        cutlass_ver = ["0", "0", "0"]
    defines = [("FLASH3_CUTLASS_MAJOR", cutlass_ver[0]), ("FLASH3_CUTLASS_MINOR", cutlass_ver[1]),
               ("FLASH3_CUTLASS_PATCH", cutlass_ver[2])]
    nvcc_flags = list(fb.NVCC_KERNEL_FLAGS) + [
        # torch adds -D__CUDA_NO_HALF_OPERATORS__ and friends to every nvcc call; undo them so
        # the kernels compile exactly as tools/build/compile_check.py compiles (and checks) them.
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT162_OPERATORS__",
        "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    ] + fb.extra_nvcc_flags()  # FLASH3_NVCC_FLAGS, FLASH3_DEBUG_HANG
    # The torch-facing sources, then the torch-free nvcc TUs (tools/build/prebuilt.py PLAIN_SOURCES and
    # the generated kernels).
    sources = ["csrc/fwd_binding.cpp", "csrc/flash3/fwd/registry.cpp", "csrc/append_kv_binding.cpp",
               "csrc/quantize_fp8_binding.cpp", "csrc/bwd_binding.cpp", "csrc/flash3/bwd/registry.cpp",
               "csrc/flash3/decode/registry.cpp",
               "csrc/fwd_kvcache_binding.cpp"]
    # The torch-free host layer the bindings adapt (each op's checks, kernel pick, parameters and
    # launch; the simulator's driver links the same files: tools/smoke/smoke_sim.py host_layer_sources).
    sources += sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "csrc/flash3/host").glob("*.cpp"))
    extra_objects = []
    if os.environ.get("FLASH3_PREBUILT"):
        # Kernel objects `make device-prep` compiled (tools/build/prebuilt.py), checked against the
        # current sources and flags: a stale or missing one stops the build (StaleError).
        import prebuilt  # noqa: E402
        extra_objects, PLAN.kernels = prebuilt.for_setup(os.environ["FLASH3_PREBUILT"], PLAN.kernels,
                                                         PLAN.cutlass_include, PLAN.torch_cuda)
        fb.log(f"linking {len(extra_objects)} prebuilt kernel objects from {os.environ['FLASH3_PREBUILT']}")
    else:
        sources += ["csrc/flash3/decode/append_kv.cu", "csrc/flash3/decode/combine.cu",
                    "csrc/flash3/fp8/quantize.cu"] + [k.path.relative_to(ROOT).as_posix() for k in PLAN.kernels]
    ext_modules.append(CUDAExtension(
        name="flash3._C",
        sources=sources,
        extra_objects=extra_objects,
        depends=extra_objects,  # relink when a prebuilt object changes
        include_dirs=fb.extra_include_dirs() + [str(ROOT / "csrc")]
        + fb.cutlass_include_dirs(PLAN.cutlass_include),
        define_macros=defines,
        extra_compile_args={"cxx": ["-O3"], "nvcc": nvcc_flags},
        # A toolchain that links libstdc++ statically (seen on a lent H200's image: its g++ put
        # libstdc++'s ostream code inside _C.so) must keep that copy private: exported, the
        # process's shared libstdc++ (loaded by torch) supplies the locale data while
        # -Bsymbolic-functions binds the calls to our copy, and the first `os << int` (kernel_info,
        # every TORCH_CHECK message) segfaulted. A no-op when nothing static is linked.
        # FLASH3_LDFLAGS adds link flags.
        extra_link_args=["-Wl,--exclude-libs,ALL"] + shlex.split(os.environ.get("FLASH3_LDFLAGS", "")),
    ))
    cmdclass["build_ext"] = BuildExtension
    if not os.environ.get("MAX_JOBS"):  # torch's ninja build reads MAX_JOBS
        os.environ["MAX_JOBS"] = str(fb.default_max_jobs())
        fb.log(f"MAX_JOBS unset: compiling {os.environ['MAX_JOBS']} files at a time "
               "(one per core, at most one per 5 GB of free memory)")
    fb.log(PLAN.reason)
elif not _SDIST_ONLY:
    msg = (f"NOT building the CUDA extension flash3._C: {PLAN.reason}. Installing the pure-Python "
           "package only (reference backend); flash3._build_info.REASON keeps this reason.")
    fb.log(msg)
    VERSION += "+nocuda"


class BuildPyWithInfo(build_py):
    """Writes flash3/_build_info.py into the built package (the source tree keeps its placeholder)."""

    def run(self):
        super().run()
        if _SDIST_ONLY or getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "flash3" / "_build_info.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.unlink()  # may be a hard link to the source file
        kernels = [k.name for k in PLAN.kernels] if PLAN.build_cuda else []
        target.write_text(
            "# Written by setup.py when this copy of flash3 was built.\n"
            f"CUDA_EXTENSION = {PLAN.build_cuda!r}\n"
            f"REASON = {PLAN.reason!r}\n"
            f"KERNELS = {kernels!r}\n"
            f"TORCH = {PLAN.torch_version!r}\n",
            encoding="utf-8")


cmdclass["build_py"] = BuildPyWithInfo

_readme = ROOT / "README.md"
setup(
    version=VERSION,
    long_description=_readme.read_text(encoding="utf-8") if _readme.exists() else "",
    long_description_content_type="text/markdown",
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
