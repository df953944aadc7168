"""In-tree PEP 517 backend: setuptools.build_meta, plus build requirements that depend on the
machine. pip's isolated build environment gets nvidia-cutlass (headers) and ninja only when the
CUDA extension will actually be built (torch with CUDA and nvcc >= 12.3 found, FLASH3_SKIP_CUDA
unset) and they are not already available; a CPU-only install pulls nothing extra. torch itself is
never a build requirement: setup.py uses the torch installed in the target environment (see
flash3_build.import_torch), so pip does not download a second, CUDA, torch to build against.
"""

from __future__ import annotations

import shutil

from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F401,F403  (build_wheel, build_sdist, ...)

import flash3_build


def _extra_requires() -> list[str]:
    try:
        p = flash3_build.plan(need_cutlass=False)
    except Exception as e:  # a bad knob etc.: setup.py will report it properly
        flash3_build.log(f"build requirements: {e}")
        return []
    if not p.build_cuda:
        flash3_build.log(f"not building the CUDA extension: {p.reason}")
        return []
    extra = []
    if p.cutlass_include is None:
        extra.append(flash3_build.CUTLASS_REQUIREMENT)
    if shutil.which("ninja") is None:
        extra.append("ninja")
    if extra:
        flash3_build.log(f"extra build requirements for the CUDA extension: {', '.join(extra)}")
    return extra


def get_requires_for_build_wheel(config_settings=None):
    return _orig.get_requires_for_build_wheel(config_settings) + _extra_requires()


def get_requires_for_build_editable(config_settings=None):
    return _orig.get_requires_for_build_editable(config_settings) + _extra_requires()


def get_requires_for_build_sdist(config_settings=None):
    return _orig.get_requires_for_build_sdist(config_settings)
