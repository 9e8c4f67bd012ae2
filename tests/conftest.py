"""Test session set-up: on a machine without CUDA, Triton runs through its interpreter and tests marked
``gpu`` are skipped.

TRITON_INTERPRET must be set before triton is first imported, so it is set here.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernel_dispatch import declaration, registry  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_backend_state(monkeypatch):
    """Each test starts with no backend environment variables and no YAML choice."""
    for var, _ in declaration.env_vars():
        monkeypatch.delenv(var, raising=False)
    registry.set_yaml_backend(None)
    yield
    registry.set_yaml_backend(None)


@pytest.fixture
def one_thread():
    """One torch thread for small ops: 2 threads per xdist worker on 2 cores spin-wait badly."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_configure(config):
    """Under pytest-xdist each worker gets one intra-op thread: 2 workers x 2 threads on 2 cores spin-wait."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Without a CUDA device every test marked ``gpu`` is skipped, with the reason."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="marked gpu: needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
