"""Shared pytest setup: deterministic seeds and the ``requires_sm90`` marker."""

import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # so tests can `import helpers`


def _has_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


requires_sm90 = pytest.mark.skipif(not _has_sm90(), reason="needs a CUDA sm_90 (Hopper) device")


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_sm90: test needs a CUDA sm_90 (Hopper) device")


def pytest_collection_modifyitems(config, items):
    # `@pytest.mark.requires_sm90` works as well as importing `requires_sm90`.
    for item in items:
        if "requires_sm90" in item.keywords and not _has_sm90():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA sm_90 (Hopper) device"))


@pytest.fixture
def sm90():
    """Fixture form: skips unless a Hopper GPU is present; yields its device."""
    if not _has_sm90():
        pytest.skip("needs a CUDA sm_90 (Hopper) device")
    return torch.device("cuda")


@pytest.fixture
def small_tiles(monkeypatch):
    """The reference's blocks made small (16 x 32), so short sequences span several of them
    (modules opt in with pytestmark = pytest.mark.usefixtures("small_tiles"))."""
    from flash3 import reference
    monkeypatch.setattr(reference, "BLOCK_M", 16)
    monkeypatch.setattr(reference, "BLOCK_N", 32)


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    torch.manual_seed(0)
    yield
