"""GPU check of the Triton mHC kernels: realistic-size equivalence, determinism and speed.

    python scripts/gpu_check_triton_mhc.py              # everything (< 4 minutes on an H100)
    python scripts/gpu_check_triton_mhc.py --no-check   # timings only
    python scripts/gpu_check_triton_mhc.py --no-bench   # correctness only
    python scripts/gpu_check_triton_mhc.py --no-compile # timings without the torch.compile baseline

(a) Equivalence at T=16384, n=4, D=4096 (bf16): mhc_pre and mhc_post forward and backward through
    the public ops (autograd), against the golden backend in float64, with the tolerance table of
    tests/tolerances.py; then the Triton backward runs again and must be bitwise equal.
(b) Speed: the device-to-device copy bandwidth (a large tensor.copy_, bytes read + written over
    time), then a block pre -> identity sublayer -> post on T=16384 tokens, n=4, bf16, D in
    {4096, 7168}: forward (no grad) and forward+backward (autograd adds the two dx contributions),
    for Triton (autotuned, winners cached on disk) and for torch.compile of the golden modules
    (forward, and forward + closed-form backward). The speed of light moves the minimum bytes,
    per token forward 10D (pre) + 18D (post) and backward 26D (pre) + 28D (post), at the copy
    bandwidth. triton.testing.do_bench(return_mode="median").
Exit status 1 if any check fails.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernel_dispatch as kd  # noqa: E402
from kernel_dispatch.backends.triton import _mhc_pre_bwd, _mhc_pre_bwd_grad, _mhc_pre_fwd, _mhc_pre_fwd_apply, mhc_post  # noqa: E402
from kernel_dispatch.golden import mhc_post as gpost  # noqa: E402
from kernel_dispatch.golden import mhc_pre as gpre  # noqa: E402
from tests.cases import MHCCase, make_inputs, run, upcast  # noqa: E402
from tests.tolerances import rel_err, tolerance  # noqa: E402

DEVICE = "cuda"
T, N = 16384, 4
HP = (20, 2.0, 1e-6, 1e-6, 1e-6)  # sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps
FWD_BYTES, BWD_BYTES = 10 + 18, 26 + 28  # minimum bytes per token per unit of D (bf16), see the brief
KERNELS = {"pre fwd gemm": _mhc_pre_fwd.mhc_pre_fwd_gemm_kernel,
           "pre fwd apply": _mhc_pre_fwd_apply.mhc_pre_fwd_apply_kernel,
           "pre bwd token": _mhc_pre_bwd.mhc_pre_bwd_token_kernel,
           "pre bwd grad": _mhc_pre_bwd_grad.mhc_pre_bwd_grad_kernel, "post fwd": mhc_post.mhc_post_fwd_kernel,
           "post bwd": mhc_post.mhc_post_bwd_kernel}


def check(dtype=torch.bfloat16) -> int:
    """Realistic-size equivalence and determinism; returns the number of failures."""
    failures = 0
    case = MHCCase("realistic", lead=(T,), n=N, D=4096)
    print(f"== equivalence vs golden float64 (T={T}, n={N}, D=4096, {str(dtype)[6:]}) ==")
    for op in ("mhc_pre", "mhc_post"):
        t0 = time.time()
        inp = make_inputs(op, case, dtype, DEVICE, seed=0)
        got = run(op, inp, "triton")
        torch.cuda.synchronize()
        t_first = time.time() - t0
        ref = run(op, upcast(inp), "golden")
        worst, bad = 0.0, []
        for name, value in got.items():
            tol = tolerance(op, dtype, name)
            err = rel_err(value, ref[name])
            worst = max(worst, err / tol)
            print(f"    {op} {name:8s} rel err {err:.3e}  tol {tol:.3e}  ({err / tol:.3f} of tol)")
            if not err <= tol:
                bad.append(f"{name} {err:.2e} > {tol:.2e}")
        del ref
        again = run(op, inp, "triton")
        nondet = [n for n in got if not torch.equal(got[n], again[n])]
        status = "ok" if not bad and not nondet else "FAIL"
        failures += status != "ok"
        print(f"  {op:9s} {status:4s} worst err/tol {worst:.3f}  (first run incl. compile+autotune {t_first:.1f}s)"
              + (f"  errors: {'; '.join(bad)}" if bad else "")
              + (f"  NOT bitwise deterministic: {', '.join(nondet)}" if nondet else ""), flush=True)
        del inp, got, again
        torch.cuda.empty_cache()
    return failures


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in GB/s: bytes read + written per second by tensor.copy_."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE).random_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() / ms / 1e6


def _block(x, phi, alpha, bias, gamma, backend):
    h_in, h_post, h_res = kd.mhc_pre(x, phi, alpha, bias, gamma, backend=backend)
    return kd.mhc_post(h_in, x, h_post, h_res, backend=backend)


def _golden_fwd(x, phi, alpha, bias, gamma):
    h_in, h_post, h_res, _, _ = gpre.forward(x, phi, alpha, bias, gamma, *HP)
    return gpost.forward(h_in, x, h_post, h_res)


def _golden_fwd_bwd(x, phi, alpha, bias, gamma, g):
    h_in, h_post, h_res, z, inv_rms = gpre.forward(x, phi, alpha, bias, gamma, *HP)
    out = gpost.forward(h_in, x, h_post, h_res)
    df, dx_post, dh_post, dh_res = gpost.backward(g, h_in, x, h_post, h_res)
    dx, dphi, dalpha, dbias, dgamma = gpre.backward(df, dh_post, dh_res, x, phi, alpha, bias, gamma, z, inv_rms, *HP)
    return out, dx + dx_post, dphi, dalpha, dbias, dgamma


def bench(with_compile: bool) -> None:
    bw = copy_bandwidth()
    print(f"== speed (T={T}, n={N}, bf16; ms = median of triton.testing.do_bench) ==")
    print(f"device-to-device copy bandwidth: {bw:.0f} GB/s (read + write)")
    print(f"{'D':>5s} {'impl':16s} {'pass':8s} {'ms':>8s} {'GB/s':>8s} {'of SOL':>7s} {'SOL ms':>7s}")
    golden_fwd = torch.compile(_golden_fwd) if with_compile else None
    golden_fwd_bwd = torch.compile(_golden_fwd_bwd) if with_compile else None
    for D in (4096, 7168):
        case = MHCCase("bench", lead=(T,), n=N, D=D)
        inp = make_inputs("mhc_pre", case, torch.bfloat16, DEVICE, seed=1)
        params = [inp.tensors[k] for k in ("x", "phi", "alpha", "bias", "gamma")]
        g = torch.randn(params[0].shape, device=DEVICE).to(torch.bfloat16)
        leaves = [p.detach().clone().requires_grad_(True) for p in params]

        def triton_fwd():
            with torch.no_grad():
                _block(*params, "triton")

        def triton_fwd_bwd():
            out = _block(*leaves, "triton")
            torch.autograd.grad(out, leaves, g)

        impls = [("triton", triton_fwd, triton_fwd_bwd)]
        if with_compile:
            t0 = time.time()
            golden_fwd(*params)
            golden_fwd_bwd(*params, g)
            torch.cuda.synchronize()
            print(f"  (torch.compile of golden at D={D}: {time.time() - t0:.0f}s)", flush=True)
            impls.append(("compile(golden)", lambda: golden_fwd(*params), lambda: golden_fwd_bwd(*params, g)))
        for name, fwd, fwd_bwd in impls:
            for label, fn, per_token in (("fwd", fwd, FWD_BYTES), ("fwd+bwd", fwd_bwd, FWD_BYTES + BWD_BYTES)):
                ms = triton.testing.do_bench(fn, return_mode="median")
                nbytes = per_token * D * T
                sol_ms = nbytes / bw / 1e6
                print(f"{D:5d} {name:16s} {label:8s} {ms:8.3f} {nbytes / ms / 1e6:8.0f} {sol_ms / ms:7.1%} "
                      f"{sol_ms:7.3f}", flush=True)
    print("autotuned configs (last key):")
    for name, k in KERNELS.items():
        best = getattr(k, "best_config", None)
        print(f"  {name:14s} {best}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-check", action="store_true", help="skip the equivalence and determinism checks")
    p.add_argument("--no-bench", action="store_true", help="skip the timings")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    t0 = time.time()
    failures = 0 if args.no_check else check()
    if not args.no_bench:
        bench(not args.no_compile)
    print(f"done in {time.time() - t0:.0f}s; {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
