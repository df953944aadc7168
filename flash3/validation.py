"""Validation mode: whether value checks that read device index tensors run.

Static checks (types, shapes, dtypes, devices) always run.  *Value* checks read
the contents of ``cu_seqlens``, ``cache_seqlens`` and ``page_table`` on the host;
on a CUDA tensor that is a device synchronization, which breaks CUDA graph
capture and stalls the launch queue.  They therefore run only when validation is
enabled:

* always when any of the checked tensors is on the CPU (reading them is free);
* when asked for: ``flash3.set_validation(True)``, the context manager
  ``flash3.validation_mode(True)`` (``validation`` in this module), or the
  environment variable ``FLASH3_VALIDATE=1`` (read at call time, so it can be
  set after import);
* never while a CUDA graph is being captured on the current stream, and never
  while torch.compile traces (``torch.compiler.is_compiling()``), even when
  enabled: a capture cannot contain a host read.

``set_validation(False)`` turns the opt-in off (it overrides the environment
variable) but does not silence the checks on CPU tensors, which cost nothing.

Note on torch.compile: the value checks live in the operators' real
implementations, which torch.compile does not trace (it traces their fake
kernels), so a compiled graph runs them at run time under the rules above, like
eager code.  Inside a CUDA graph (``mode="reduce-overhead"`` or a manual
``torch.cuda.graph``) they are skipped.

With validation off, out-of-range values are the caller's responsibility; see
the contract in :func:`flash3.attention_with_kvcache`.
"""

from __future__ import annotations

import contextlib
import os

import torch

_ENV = "FLASH3_VALIDATE"
_enabled: bool | None = None  # set_validation(); None = default (env var / CPU tensors)
# Test hook: when not None, validation_enabled() returns this, whatever the tensors, the
# environment or set_validation say (tests use it to run the device code path on CPU tensors).
_FORCE: bool | None = None


def set_validation(enabled: bool | None) -> None:
    """Turn the value checks on (True), off for device tensors (False), or back to the
    default (None: on for CPU tensors and when ``FLASH3_VALIDATE=1``)."""
    global _enabled
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool or None, got {type(enabled).__name__}")
    _enabled = enabled


def get_validation() -> bool | None:
    """The value given to :func:`set_validation` (None: default)."""
    return _enabled


@contextlib.contextmanager
def validation(enabled: bool | None = True):
    """Context manager: ``with flash3.validation(True): ...`` then restore the previous setting."""
    previous = _enabled
    set_validation(enabled)
    try:
        yield
    finally:
        set_validation(previous)


# Exported at the top level under this name: ``flash3.validation`` is this module.
validation_mode = validation


def _env_enabled() -> bool:
    return os.environ.get(_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _capturing() -> bool:
    """True inside CUDA graph capture or while torch.compile traces (False on CPU-only torch)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and getattr(compiler, "is_compiling", None) is not None:
        if compiler.is_compiling():
            return True
    try:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return True
    except (RuntimeError, AssertionError):  # CPU-only builds / no driver
        pass
    return False


def validation_enabled(*tensors) -> bool:
    """Whether value checks should run for a call on ``tensors`` (None entries are ignored)."""
    if _FORCE is not None:
        return _FORCE
    if _capturing():
        return False
    if _enabled:
        return True
    if any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tensors):
        return True
    if _enabled is False:
        return False
    return _env_enabled()
