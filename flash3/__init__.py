"""flash3: FlashAttention-3 for Hopper as a PyTorch extension.

The CUDA kernels live in the optional extension ``flash3._C``; without it (or
off Hopper) every call runs the exact, memory-efficient reference backend.
"""

import torch  # noqa: F401  (loads libtorch, which the extension links against)

import importlib.util as _importlib_util  # noqa: E402

if _importlib_util.find_spec(__name__ + "._C") is None:  # a pure-Python install: nothing to load
    _C = None
else:
    try:  # must load before flash3.ops defines its operators (shared namespace)
        from . import _C  # noqa: F401
    except ImportError as e:  # built, but does not load (e.g. a torch other than the build's)
        _C = None
        _C_IMPORT_ERROR = str(e)  # reported by `python -m flash3`

from . import masking, reference  # noqa: E402
from ._backend import has_extension, kernel_configs, kernel_info  # noqa: E402
from .api import attention, attention_varlen, attention_with_kvcache  # noqa: E402
from .torch_sdpa import sdpa  # noqa: E402
from .validation import (get_validation, set_validation, validation_enabled,  # noqa: E402
                         validation_mode)

__all__ = [
    "attention",
    "attention_varlen",
    "attention_with_kvcache",
    "sdpa",
    "set_validation",
    "get_validation",
    "validation_enabled",
    "validation_mode",
    "quantize_fp8",
    "quantize_fp8_varlen",
    "attention_fp8",
    "attention_fp8_varlen",
    "has_extension",
    "kernel_configs",
    "kernel_info",
    "masking",
    "reference",
]

__version__ = "0.1.0"


def __getattr__(name):
    # The FP8 helpers live in flash3.fp8, imported on first use.
    if name in ("quantize_fp8", "quantize_fp8_varlen", "attention_fp8", "attention_fp8_varlen"):
        from . import fp8
        return getattr(fp8, name)
    if name in ("distributed", "integrations", "decode_plan", "rotary"):  # imported on first use
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'flash3' has no attribute {name!r}")
