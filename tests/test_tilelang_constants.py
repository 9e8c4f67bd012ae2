"""The TileLang launchers' reused device constants: made once per key, never cached while a CUDA graph captures
(their fill kernels are then only recorded, so the tensor holds garbage until a replay)."""
import torch

from kernel_dispatch.backends.tilelang import _constants


def test_made_once_per_key(monkeypatch):
    monkeypatch.setattr(_constants, "_cache", {})
    made = []

    def make():
        made.append(1)
        return torch.ones(3)

    a, b = _constants.constant(("k", 3), make), _constants.constant(("k", 3), make)
    assert a is b and len(made) == 1
    c = _constants.constant(("k", 4), make)
    assert c is not a and len(made) == 2


class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it lives on CUDA (this test runs without a GPU)."""

    @property
    def is_cuda(self):
        return True


def test_not_cached_while_capturing(monkeypatch):
    monkeypatch.setattr(_constants, "_cache", {})
    make = lambda: torch.zeros(2).as_subclass(_FakeCuda)  # noqa: E731
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    a, b = _constants.constant("k", make), _constants.constant("k", make)
    assert a is not b and not _constants._cache
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    c = _constants.constant("k", make)
    assert _constants.constant("k", make) is c


def test_bounded(monkeypatch):
    monkeypatch.setattr(_constants, "_cache", {})
    for i in range(_constants.MAX_ENTRIES + 5):
        _constants.constant(i, lambda: torch.zeros(1))
    assert len(_constants._cache) <= _constants.MAX_ENTRIES
