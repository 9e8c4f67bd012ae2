"""Helpers for the baselines of the bench modules: what a user would pick instead of a kernel_dispatch
backend (torch.compile of the golden code, a torch operator), run on the same inputs. The baselines
themselves live beside their operator (its bench module's ``BASELINES``)."""
from __future__ import annotations

import functools
from typing import Callable

import torch

NEEDS_CUDA = "needs a CUDA device"


@functools.cache
def compiled(fn: Callable) -> Callable:
    """torch.compile(fn), one compiled object per function for the whole run, so later shapes reuse its graphs."""
    return torch.compile(fn)


def dynamic(t: torch.Tensor, *dims: int) -> torch.Tensor:
    """``t`` with ``dims`` marked as maybe dynamic for torch.compile.

    Sizes that change along a sweep are symbolic, so one graph serves every point (a static compile per
    shape would cost minutes of the run); sizes that select kernels (a head dim, a stream count) stay static.
    """
    for d in dims:
        torch._dynamo.maybe_mark_dynamic(t, d)
    return t
