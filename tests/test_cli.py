"""`python -m flash3` explains a missing extension plainly (this machine has no flash3._C)."""

import torch

import flash3
from flash3 import __main__ as cli


def test_environment_says_why_no_extension(capsys):
    if flash3.has_extension():
        import pytest
        pytest.skip("the extension is built here")
    cli.environment(torch.device("cpu"))
    out = capsys.readouterr().out
    assert "partially initialized" not in out and "Traceback" not in out
    assert "flash3._C     not built" in out
    assert "why:" in out and "pip install --no-build-isolation ." in out
    if torch.version.cuda is None:
        assert "CPU-only build" in out


def test_pure_python_install_imports_cleanly():
    # No _C file: flash3 records no import error (only a broken build does).
    if flash3.has_extension():
        import pytest
        pytest.skip("the extension is built here")
    assert flash3._C is None and not hasattr(flash3, "_C_IMPORT_ERROR")
