"""Tile sweep of the TileLang mHC pre backward dx/dphi kernel (the slowest kernel of the mHC block).

On the GPU machine (tilelang on PYTHONPATH):  python3 scripts/gpu_sweep_tilelang_mhc_dx.py
  times every variant of ``_mhc_pre_bwd_dx_kernel.build`` in VARIANTS on T = 16384 tokens, n = 4,
  bf16, D = 4096 and 7168 (the benchmark shapes), checks each against the first variant (dx and the
  split-summed dphi partials), and prints ms and the fraction of the copy bandwidth its bytes reach
  (x and dh_in read, dx written: 18 D bytes per token; 26 D with the dx_acc read).
On a CPU machine:  python3 scripts/gpu_sweep_tilelang_mhc_dx.py --prebuild  compiles the variants for
sm_90a and packs them into .devcache/tilelang-dx-sweep-cache.tar.xz (carried to the GPU machine).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
CACHE_TAR = os.path.join(ROOT, ".devcache", "tilelang-dx-sweep-cache.tar.xz")
T_TOKENS, DS, SMS = 16384, (4096, 7168), 132
# (DC features per CTA, BT tokens per block, stages, threads, CTAs per SM, acc: add dx_acc)
VARIANTS = [
    (32, 64, 2, 128, 2, False),    # the shipped bf16 configuration without dx_acc
    (32, 64, 3, 128, 1, False),
    (64, 32, 3, 256, 1, False),
    (32, 64, 3, 128, 1, True),     # the shipped bf16 configuration with dx_acc
    (32, 64, 2, 128, 1, True),
    (64, 32, 3, 256, 1, True),
]


def splits(D, DC, ctas):
    nch = -(-D // DC)
    slots = SMS * ctas
    return max(range(1, 9), key=lambda s: (nch * s / (math.ceil(nch * s / slots) * slots), -s))


def specs():
    out = []
    for D in DS:
        for dc, bt, st, th, ctas, acc in VARIANTS:
            out.append((D, "bfloat16", splits(D, dc, ctas), 1, dc, bt, st, th, acc))
    return out


def _factory_args(args):
    """(D, dtype, S, P, DC, BT, stages, threads, acc) as the dx factory's arguments."""
    from kernel_dispatch.backends.tilelang._mhc_pre_bwd_dx_kernel import DxTiles
    D, dt, S, P, dc, bt, st, th, acc = args
    return D, dt, S, P, DxTiles(chunk=dc, tokens=bt, stages=st, threads=th), acc


def _compile(args):
    from kernel_dispatch.backends.tilelang import _mhc_pre_bwd_dx_kernel as k
    from kernel_dispatch.backends.tilelang._build import compile_kernel
    t = time.time()
    try:
        compile_kernel(k.build(*_factory_args(args)))
        return args, time.time() - t, None
    except Exception as e:  # reported; the sweep goes on without it
        return args, time.time() - t, f"{type(e).__name__}: {str(e).splitlines()[-1][:300]}"


def prebuild(workers):
    cache = os.environ.get("DX_SWEEP_CACHE") or tempfile.mkdtemp(prefix="dx_sweep_")
    os.environ["TILELANG_CACHE_DIR"] = cache
    import multiprocessing as mp
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        for args, dt, err in ex.map(_compile, specs()):
            print(f"{args} {dt:.0f}s {err or 'ok'}", flush=True)
    with tarfile.open(CACHE_TAR, "w:xz") as tar:
        tar.add(cache, arcname="cache")
    print(f"wrote {CACHE_TAR} ({os.path.getsize(CACHE_TAR) / 1e6:.1f} MB)")


def gpu_main():
    import torch
    from triton.testing import do_bench

    cache = tempfile.mkdtemp(prefix="dx_sweep_")
    with tarfile.open(CACHE_TAR) as tar:
        tar.extractall(cache)
    os.environ["TILELANG_CACHE_DIR"] = os.path.join(cache, "cache")
    from kernel_dispatch.backends.tilelang import _mhc_pre_bwd_dx_kernel as k
    from kernel_dispatch.backends.tilelang._build import kernel
    dev = torch.device("cuda")
    x_ = torch.empty(1 << 28, dtype=torch.bfloat16, device=dev)
    t0 = time.time()
    y_ = torch.empty_like(x_)
    ms = do_bench(lambda: y_.copy_(x_))
    bw = 2 * x_.numel() * 2 / (ms * 1e-3)
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s")
    del x_, y_
    T, n = T_TOKENS, 4
    for D in DS:
        g = torch.Generator(device="cuda").manual_seed(0)
        xp = torch.randn(T, 1, n, D, device=dev, generator=g).to(torch.bfloat16)
        gin = torch.randn(T, D, device=dev, generator=g).to(torch.bfloat16)
        gp = (0.1 * torch.randn(T, 64, device=dev, generator=g)).to(torch.bfloat16)
        aux = torch.randn(T, 8, device=dev, generator=g)
        w = (0.05 * torch.randn(96, n, D, device=dev, generator=g)).to(torch.bfloat16)
        xa = torch.randn(T, n, D, device=dev, generator=g).to(torch.bfloat16)
        dummy = torch.zeros(1, n, D, device=dev, dtype=torch.bfloat16)
        refs = {}
        for (dc, bt, st, th, ctas, acc), args in zip(VARIANTS, [s for s in specs() if s[0] == D]):
            S = args[2]
            try:
                kern = kernel(k.build, _factory_args(args), dev)
            except Exception as e:
                print(f"D={D} {args}: build/load failed {type(e).__name__}: {str(e)[-200:]}")
                continue
            dx = torch.empty(T, n, D, dtype=torch.bfloat16, device=dev)
            part = torch.empty(S, 64, -(-D // dc), n * dc, device=dev)
            a_in = xa if acc else dummy
            kern(xp, gin, gp, aux, w, a_in, dx, part)
            torch.cuda.synchronize()
            # dphi partial as [64, n, D]: column i*DC + e of chunk c is feature c*DC + e of stream i
            dp = part.sum(0).view(64, -1, n, dc).permute(0, 2, 1, 3).reshape(64, n, -1)[..., :D]
            note = ""
            ref = refs.get(acc)
            if ref is None:
                refs[acc] = (dx.clone(), dp.clone())
            else:
                ex = ((dx.float() - ref[0].float()).abs().max() / ref[0].float().abs().max()).item()
                ep = ((dp - ref[1]).abs().max() / ref[1].abs().max()).item()
                note = f"max rel diff to first: dx {ex:.1e} dphi {ep:.1e}"
            t = do_bench(lambda: kern(xp, gin, gp, aux, w, a_in, dx, part), warmup=5, rep=60)
            frac = (26 if acc else 18) * D * T / (t * 1e-3) / bw
            print(f"D={D} acc={acc:d} DC={dc:3d} BT={bt:3d} stages={st} threads={th} ctas/SM={ctas} S={S}: "
                  f"{t * 1e3:7.1f} us  {frac * 100:4.0f}% of copy BW  {note}", flush=True)
    print(f"sweep done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prebuild", action="store_true")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    prebuild(a.workers) if a.prebuild else gpu_main()
