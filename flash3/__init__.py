"""flash3: FlashAttention-3 for Hopper as a PyTorch extension.

The CUDA kernels live in the optional extension ``flash3._C``; without it (or
off Hopper) every call runs the exact, memory-efficient reference backend.

Layers, top to bottom (tests/test_import_layers.py reads this table).  A module imports only
from its own layer or a lower one, never from the other group of its layer ("|"), and no
import cycle exists, so a change to a layer can only reach the layers above it:

    entry points:  __main__, integrations, integrations.transformers
    package:       flash3 (this file: the public names)
    public API:    api, fp8, torch_sdpa, distributed, flash_attn_interface (FA3's functions)
    operators:     ops, ops_serve (torch.library: fake kernels, autograd, kernel-or-reference choice)
    backends:      _backend, _quantize (kernel dispatch) | reference, reference.fp8, reference.fa3 (the spec)
    primitives:    masking, rotary, hadamard, fp8_quant, decode_plan, _torch_cpu, _used_keys
    foundation:    _checks (argument checks), validation, _build_info, _C (the extension)
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
    if name in ("distributed", "integrations", "flash_attn_interface"):  # imported on first use
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'flash3' has no attribute {name!r}")
