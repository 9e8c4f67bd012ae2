"""kernel_dispatch.cuda_graphs.capture and the trainer's GraphedStep, their order of work on a CPU.

torch.cuda's streams and graphs are replaced by recorders (capture then runs eagerly), so the warm-up count, the
hook before capture, what runs inside the capture and the gradients GraphedStep leaves are checked without a GPU.
The GPU runs are tests/test_cuda_graph_gpu.py and tests/test_train_cuda_graph_gpu.py.
"""
import contextlib

import pytest
import torch

from kernel_dispatch import cuda_graphs
from kernel_dispatch.training.graphed import GraphedStep


@pytest.fixture
def events(monkeypatch):
    log = []

    class Stream:
        def wait_stream(self, other):
            log.append("wait")

    class Graph:
        def replay(self):
            log.append("replay")

    @contextlib.contextmanager
    def in_stream(s):
        log.append("side stream")
        yield

    @contextlib.contextmanager
    def in_graph(g):
        log.append("capture begins")
        yield
        log.append("capture ends")

    monkeypatch.setattr(torch.cuda, "Stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "stream", in_stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", in_graph)
    return log


def test_capture_warms_up_then_captures_one_call(events):
    calls = []
    graph, out = cuda_graphs.capture(lambda: calls.append(len(calls)) or len(calls), warmup=2,
                                     before_capture=lambda: events.append("hook"))
    assert out == 3 and calls == [0, 1, 2]
    assert events == ["wait", "side stream", "wait", "hook", "capture begins", "capture ends"]


def test_graphed_step_captures_with_fresh_gradients(events):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    seen = []

    def loss_fn(m, a, b):
        seen.append([p.grad is None for p in m.parameters()])
        return torch.nn.functional.cross_entropy(m(a), b)

    step = GraphedStep(model, x, y, loss_fn)
    assert seen == [[True, True], [True, True]], "warm-up and capture both start from gradients set to None"
    want = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), list(model.parameters()))
    for p, g in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, g)
    assert step(x, y) is step.loss and events[-1] == "replay"
    model.weight.grad = torch.zeros(3, 4)
    with pytest.raises(RuntimeError, match="set the gradients to None"):
        GraphedStep(model, x, y, loss_fn)
