"""mHC test cases (shared by pre and post) and their random inputs, for the equivalence matrix."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..testing.matrix import Inputs
from .lazy_attention_cases import noncontig


@dataclass(frozen=True)
class MHCCase:
    name: str
    lead: tuple[int, ...] = (7,)
    n: int = 4
    D: int = 16
    gamma: bool = True
    noncontig: bool = False
    gpu_only: bool = False  # runs on a CUDA device only


CASES = (
    MHCCase("basic"),
    MHCCase("one_token", lead=(1,), D=8, gamma=False),
    MHCCase("lead_dims_no_gamma", lead=(2, 3), D=24, gamma=False),
    MHCCase("nD_above_block", lead=(33,), D=264),
    MHCCase("wide", lead=(5,), D=520),
    MHCCase("two_streams", lead=(9,), n=2, D=40),
    MHCCase("noncontig", lead=(6,), D=32, noncontig=True),
    # the feature sizes SPEC names for the kernels (n = 4, D in {1280, 2560, 4096, 7168})
    MHCCase("d1280", lead=(96,), D=1280, gpu_only=True),
    MHCCase("d2560", lead=(64,), D=2560, gpu_only=True),
    MHCCase("d7168", lead=(40,), D=7168, gpu_only=True),
    MHCCase("d7168_noncontig_no_gamma", lead=(33,), D=7168, gamma=False, noncontig=True, gpu_only=True),
    MHCCase("realistic", lead=(16384,), D=4096, gpu_only=True),
)


def _draw(case: MHCCase, dtype: torch.dtype, device: str, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape, scale=1.0, dt=dtype):
        return (scale * torch.randn(*shape, generator=g)).to(dt).to(device)

    x = rnd(*case.lead, case.n, case.D)
    return g, rnd, (noncontig(x) if case.noncontig else x)


def make_pre_inputs(case: MHCCase, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> Inputs:
    """x [..., n, D] in ``dtype``; phi, alpha, bias (and gamma) fp32; upstream gradients of h_in, h_post, h_res."""
    _, rnd, x = _draw(case, dtype, device, seed)
    n, D, lead = case.n, case.D, case.lead
    M = n * n + 2 * n
    t = {"x": x, "phi": rnd(M, n * D, scale=0.05, dt=torch.float32),
         "alpha": torch.tensor([0.8, 1.2, 0.9], device=device) + 0.1 * rnd(3, dt=torch.float32),
         "bias": rnd(M, scale=0.3, dt=torch.float32)}
    if case.gamma:
        t["gamma"] = 1 + 0.1 * rnd(n * D, dt=torch.float32)
    grads = (rnd(*lead, D), rnd(*lead, n, dt=torch.float32), rnd(*lead, n, n, dt=torch.float32))
    return Inputs(t, {}, grads)


def make_post_inputs(case: MHCCase, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> Inputs:
    """f [..., D] and x [..., n, D] in ``dtype``; h_post, h_res fp32; upstream gradient of out."""
    g, rnd, x = _draw(case, dtype, device, seed)
    n, D, lead = case.n, case.D, case.lead
    f = rnd(*lead, D)
    h_post = 2 * torch.rand(*lead, n, generator=g).to(device)
    h_res = torch.softmax(rnd(*lead, n, n, dt=torch.float32), -1)
    gout = rnd(*lead, n, D)
    if case.noncontig:
        gout = noncontig(gout)
    return Inputs({"f": f, "x": x, "h_post": h_post, "h_res": h_res}, {}, (gout,))
