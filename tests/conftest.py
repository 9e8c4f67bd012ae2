"""Test session set-up: on a machine without CUDA, Triton runs through its interpreter.

TRITON_INTERPRET must be set before triton is first imported, so it is set here.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernel_dispatch import registry  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_backend_state(monkeypatch):
    """Each test starts with no backend environment variables and no YAML choice."""
    for var in ("LAZYATTN_BACKEND", "MHC_BACKEND", "KERNEL_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    registry.set_yaml_backend(None)
    yield
    registry.set_yaml_backend(None)
