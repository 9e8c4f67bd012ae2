"""One training step's forward and backward captured in a CUDA graph (``train.cuda_graph``).

Small models are host-bound: Python launches the kernels slower than the GPU runs them (README, "Small shapes").
The step's loss and backward are captured once and replayed on static input buffers; the clip, the optimizer
step and evaluation stay eager.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..cuda_graphs import capture


class GraphedStep:
    """Replays ``loss_fn(model, x, y)`` and its backward on static copies of x, y [batch, seq_len] (int64).

    Build it from a warm model (one eager step has run: kernels compiled, autotuned and loaded) with the
    parameters' gradients set to None and no autograd graph of an earlier step alive (a kept loss holds the
    parameters' grad accumulators on the stream that made them, and capture then fails). It warms up once more on a
    side stream, then captures (:func:`kernel_dispatch.cuda_graphs.capture`); the backward then writes fresh
    gradient tensors that the graph owns and every replay overwrites. So after a call the gradients
    are in ``p.grad`` and must not be set to None (zeroing is unneeded: the replay writes, it does not add).
    ``loss_fn`` must be capturable: no host synchronisation, autocast without its weight cache.
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                 loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]):
        params = [p for p in model.parameters() if p.requires_grad]
        if any(p.grad is not None for p in params):
            raise RuntimeError("GraphedStep: set the gradients to None before capturing (optimizer.zero_grad())")
        self.x, self.y = x.clone(), y.clone()

        def step():
            loss = loss_fn(model, self.x, self.y)
            loss.backward()
            return loss

        def drop_grads():  # the captured backward must write fresh gradient tensors, not add to the warm-up's
            for p in params:
                p.grad = None

        self.graph, self.loss = capture(step, warmup=1, before_capture=drop_grads)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Copy the batch in, replay; returns the step's loss (a tensor the next call overwrites)."""
        self.x.copy_(x, non_blocking=True)
        self.y.copy_(y, non_blocking=True)
        self.graph.replay()
        return self.loss
