"""Energy and time per call of the benchmark's candidates, in alternating windows of back-to-back calls.

    python scripts/gpu_energy_per_call.py --backends cute,sdpa_cudnn --shape 4x4096x128 --windows 6 --seconds 1.5

Under a power cap (an H200 at 700 W) a kernel's time follows its energy, so a ratio of times at the cap is about a
ratio of energies. Each window runs one candidate's forward (or forward+backward) back to back for ``--seconds``,
the L2 flushed before every call as the benchmark does, and reads the card's energy counter (NVML
nvmlDeviceGetTotalEnergyConsumption, mJ) and the wall time around it; the flush alone is measured the same way and
its energy per call subtracted. Windows alternate between the candidates (every other round reversed). Prints per
candidate and direction the median over windows of mJ per call (flush subtracted), ms per call and watts, and the
ratios to the last candidate named.
"""
from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np
import torch

from kernel_dispatch.benchmarks.timing import Timer
from kernel_dispatch.ops import lazy_attention_bench as bench


class Nvml:
    """The card's total energy counter (mJ since the driver loaded) through libnvidia-ml."""

    def __init__(self, index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)) != 0:
            raise RuntimeError(f"no NVML device {index}")

    def energy_mj(self) -> int:
        out = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(out)) != 0:
            raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed (needs Volta or newer)")
        return out.value


def window(fn, timer: Timer, nvml: Nvml, seconds: float) -> tuple[float, float]:
    """(mJ per call, ms per call) of ``fn`` run back to back for about ``seconds``, each call after an L2 flush."""
    timer.sync()
    e0, t0, n = nvml.energy_mj(), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            timer.flush_l2()
            fn()
        n += 10
        timer.sync()
    t1, e1 = time.perf_counter(), nvml.energy_mj()
    return (e1 - e0) / n, (t1 - t0) * 1e3 / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="cute,sdpa_cudnn", help="lazy attention backends or baselines; the last "
                   "is the reference of the ratios")
    p.add_argument("--shape", default="4x4096x128", help="B x L x D (H = 16, W = 512, bf16, causal)")
    p.add_argument("--windows", type=int, default=6, help="windows per candidate and direction")
    p.add_argument("--seconds", type=float, default=1.5, help="length of one window")
    args = p.parse_args()
    try:
        B, L, D = (int(x) for x in args.shape.split("x"))
    except ValueError:
        p.error(f"--shape: expected B x L x D such as 4x4096x128, got {args.shape!r}")
    if min(B, L, D) < 1 or args.windows < 1 or args.seconds <= 0:
        p.error("--shape sizes and --windows must be positive, --seconds above zero")
    if not torch.cuda.is_available():
        p.error("needs a CUDA device (it reads the card's NVML energy counter)")
    dev = torch.device("cuda")
    s = bench.Shape(B, 16, L, D, 512)
    t = bench.make_inputs(s, torch.bfloat16, dev)
    ref = bench.Reference(t, s)
    names = args.backends.split(",")
    cands = {n: bench.candidate(n, s, t, ref) for n in names}
    for n, c in cands.items():
        if c.reason:
            raise SystemExit(f"{n} cannot run: {c.reason}")
    timer, nvml = Timer(dev), Nvml(torch.cuda.current_device())
    flush_mj, flush_ms = window(lambda: None, timer, nvml, args.seconds)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, shape B={B} H=16 L={L} D={D} bf16 causal "
          f"W=512; the flush alone: {flush_mj:.2f} mJ, {flush_ms:.4f} ms per call")
    with torch.enable_grad():
        for kind in ("forward", "fwd_bwd"):
            fns = {n: getattr(c, kind) for n, c in cands.items()}
            for fn in fns.values():
                for _ in range(3):
                    fn()
            got: dict[str, list[tuple[float, float]]] = {n: [] for n in fns}
            for w in range(args.windows):
                for n in names if w % 2 == 0 else names[::-1]:
                    got[n].append(window(fns[n], timer, nvml, args.seconds))
            base = names[-1]
            med = {n: (float(np.median([e for e, _ in v])) - flush_mj, float(np.median([m for _, m in v])) - flush_ms)
                   for n, v in got.items()}
            for n in names:
                e, ms = med[n]
                print(f"{kind:8s} {n:12s} {e:8.2f} mJ  {ms:7.4f} ms  {e / ms:6.1f} W   energy {e / med[base][0]:.3f}x"
                      f"  time {ms / med[base][1]:.3f}x of {base}")


if __name__ == "__main__":
    main()
