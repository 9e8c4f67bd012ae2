"""What the lazy-attention front end costs on one GPU: the cute forward through ``lazy_attention`` against its
launcher and its two kernels, and cuDNN's forward, each as the benchmark times it (L2 flushed before every run, CUDA
events around one call) and again with the GPU kept busy for ``--lead-us`` after the flush, so that the host's work
before the first kernel launch hides (what is left is GPU time only).

    python scripts/gpu_time_frontend.py [--shape 4x4096x128] [--W 512] [--rounds 5] [--lead-us 400]

Also prints the host's time per call (no synchronisation, the GPU busy, so no launch waits). bf16, H = 16, causal,
tau = -1; the kernels come from the cute backend's store (``KERNEL_DISPATCH_CUTE_KERNELS`` / runtime as usual).
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernel_dispatch.backends.cute import lazy_attention as cute
from kernel_dispatch.backends.cute.lazy_attention_fwd import forward as launcher_forward
from kernel_dispatch.benchmarks.timing import Settings, Timer
from kernel_dispatch.ops.lazy_attention import lazy_attention

CLOCK_HZ = 1.98e9  # H100 / H200 boost clock, for torch.cuda._sleep's cycle count (a lead, not a measurement)


class LeadTimer(Timer):
    """The benchmark's timer with the GPU kept busy ``lead_us`` after every flush."""

    def __init__(self, device, lead_us: float):
        super().__init__(device, Settings(warmup=3, min_reps=20, max_reps=50, budget_s=0.3))
        self.cycles = int(lead_us * 1e-6 * CLOCK_HZ)

    def flush_l2(self) -> None:
        super().flush_l2()
        if self.cycles:
            torch.cuda._sleep(self.cycles)


def host_us(fn, calls: int = 50) -> float:
    """Mean host microseconds per call with the GPU busy (a long sleep queued first), no synchronisation."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(0.2 * CLOCK_HZ))
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return dt


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4x4096x128", help="BxLxD")
    p.add_argument("--W", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--lead-us", type=float, default=400.0)
    a = p.parse_args()
    B, L, D = (int(x) for x in a.shape.split("x"))
    H, dev, dt = 16, torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g, device=dev).to(dt).requires_grad_() for _ in range(3))
    bias = (0.5 * torch.randn(H, a.W, generator=g, device=dev)).requires_grad_()
    tau = torch.full((H,), -1.0, device=dev).requires_grad_()
    scale = D ** -0.5
    kern = cute._kernels(q, True)

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    cases = {
        "front end (lazy_attention, backend='cute')": lambda: lazy_attention(q, k, v, bias, tau, backend="cute"),
        "front end, no grad": lambda: _no_grad(lambda: lazy_attention(q, k, v, bias, tau, backend="cute")),
        "launcher (lazy_attention_fwd.forward)": lambda: launcher_forward(kern, q.detach(), k.detach(), v.detach(),
                                                                         bias.detach(), tau.detach(), scale, None,
                                                                         True),
        "cudnn": cudnn,
    }
    print(torch.cuda.get_device_name(), torch.__version__, f"B={B} H={H} L={L} D={D} W={a.W}", flush=True)
    for name, fn in cases.items():
        print(f"host {host_us(fn):8.1f} us per call  {name}", flush=True)
    results = {(name, lead): [] for name in cases for lead in (0.0, a.lead_us)}
    for r in range(a.rounds):
        for lead in (0.0, a.lead_us):
            timer = LeadTimer(dev, lead)
            for name, fn in cases.items():
                results[name, lead].append(timer.measure(fn)["median_ms"])
    for (name, lead), ms in results.items():
        print(f"{'lead %4.0f us' % lead if lead else 'as the bench'}  min {min(ms):.4f}  median "
              f"{statistics.median(ms):.4f} ms  {name}")


def _no_grad(fn):
    with torch.no_grad():
        return fn()


if __name__ == "__main__":
    main()
