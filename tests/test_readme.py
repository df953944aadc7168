"""The README's examples run as written."""
import importlib.util
import re
from pathlib import Path

import pytest


def test_readme_example_runs():
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README has no python example"
    skipped = []
    for code in blocks:
        # The transformers example needs the optional extra (`make test` installs it).
        if "transformers" in code and importlib.util.find_spec("transformers") is None:
            skipped.append(code.splitlines()[0])
            continue
        exec(compile(code, "README.md", "exec"), {})
    if skipped:
        pytest.skip(f"transformers not installed; skipped {len(skipped)} example(s)")
