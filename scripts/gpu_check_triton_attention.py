"""GPU check of the Triton lazy attention kernels: realistic-size equivalence, determinism and speed.

    python scripts/gpu_check_triton_attention.py            # everything (< 4 minutes on an H100)
    python scripts/gpu_check_triton_attention.py --no-check # timings only
    python scripts/gpu_check_triton_attention.py --no-bench # correctness only

(a) Equivalence at B=2, H=16, L=4096, D=128 (bf16) and the matrix's own big cases: the Triton
    forward and backward against the golden module in float64 (run one batch element at a time),
    with the tolerance table of tests/tolerances.py, every per-head tensor checked head by head.
    Runs with autotuning off (the first shipped config); then the backward is run again and must
    be bitwise equal.
(b) Speed: forward and forward+backward of lazy attention (causal, W=512, tau=-1, through the
    public op with autograd) against torch SDPA on plain causal attention with the cuDNN backend
    (and the flash backend for reference), triton.testing.do_bench(return_mode="median"),
    autotuning on. Prints a table and the autotuned configs.
Compilation dominates the run time, so every kernel variant both parts need is first compiled in
parallel worker processes (--jobs) into triton's on-disk cache, using small problems of the same
specialization (L = 1024; every other size and stride keeps its divisibility by 16).
Exit status 1 if any check fails.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernel_dispatch as kd  # noqa: E402
from kernel_dispatch.backends.triton import lazy_attention as tk  # noqa: E402
from kernel_dispatch.golden import lazy_attention as gk  # noqa: E402
from tests.cases import ATTN_CASES, AttnCase, make_inputs  # noqa: E402
from tests.tolerances import rel_err, tolerance  # noqa: E402

DEVICE = "cuda"
H16 = 16
CHECK_CASES = [
    AttnCase("causal_mixed_tau", B=2, H=H16, Hkv=H16, L=4096, D=128, W=512),
    AttnCase("gqa_lengths", B=2, H=H16, Hkv=4, L=4096, D=128, W=512, lengths=(4096, 2777)),
    AttnCase("noncausal_lengths", B=2, H=H16, Hkv=H16, L=4096, D=128, W=512, causal=False, lengths=(4096, 3001)),
    AttnCase("noncontig", B=2, H=H16, Hkv=H16, L=4096, D=128, W=512, noncontig=True),
    AttnCase("tau_positive", B=2, H=H16, Hkv=H16, L=4096, D=128, W=512, tau=tuple([0.3, 0.05, 1.0, 0.5] * 4)),
    AttnCase("tau_below_minus1", B=2, H=H16, Hkv=H16, L=4096, D=128, W=512, tau=tuple([-1.5, -3.0, -1.2, -1.0] * 4)),
    AttnCase("w_gt_l", B=2, H=H16, Hkv=H16, L=1024, D=128, W=1536),
] + [c for c in ATTN_CASES if c.big and c.name != "realistic_d128"]  # that one is causal_mixed_tau


def _args(inp):
    t = inp.tensors
    return (t["q"], t["k"], t["v"], t["bias"], t["tau"], t["q"].shape[-1] ** -0.5, inp.kwargs.get("lengths"),
            inp.kwargs["causal"])


def _golden_float64(inp) -> dict:
    """Golden forward + backward in float64, one batch element at a time (dbias, dtau summed)."""
    q, k, v, bias, tau, scale, lengths, causal = _args(inp)
    do = inp.grads[0]
    parts = []
    for b in range(q.shape[0]):
        sl = slice(b, b + 1)
        lb = None if lengths is None else lengths[sl]
        args = [x[sl].double() for x in (q, k, v)] + [bias.double(), tau.double()]
        o, lse = gk.forward(*args, scale, lb, causal)
        grads = gk.backward(do[sl].double(), *args, o, lse, scale, lb, causal)
        parts.append((o, *grads))
        del o, lse, grads
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    out = {n: torch.cat([p[i] for p in parts]) for i, n in enumerate(("o", "dq", "dk", "dv"))}
    out["dbias"] = sum(p[4] for p in parts)
    out["dtau"] = sum(p[5] for p in parts)
    return out


def _triton(inp) -> dict:
    q, k, v, bias, tau, scale, lengths, causal = _args(inp)
    o, lse = tk.forward(q, k, v, bias, tau, scale, lengths, causal)
    dq, dk, dv, dbias, dtau = tk.backward(inp.grads[0], q, k, v, bias, tau, o, lse, scale, lengths, causal)
    return {"o": o, "dq": dq, "dk": dk, "dv": dv, "dbias": dbias, "dtau": dtau}


def check(dtype=torch.bfloat16) -> int:
    """Run the realistic-size equivalence and determinism checks; return the number of failures."""
    os.environ[tk.CONFIG_ENV] = "0"
    failures = 0
    print(f"== equivalence vs golden float64 ({str(dtype)[6:]}, autotuning off) ==")
    for case in CHECK_CASES:
        t0 = time.time()
        inp = make_inputs("lazy_attention", case, dtype, DEVICE, seed=0)
        got = _triton(inp)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        t_kernel = time.time() - t0
        ref = _golden_float64(inp)
        worst, bad = 0.0, []
        for name, value in got.items():
            tol = tolerance("lazy_attention", dtype, name)
            errs = [rel_err(value, ref[name])]
            if name in ("o", "dq", "dk", "dv"):
                errs += [rel_err(value[:, h], ref[name][:, h]) for h in range(value.shape[1])]
            e = max(errs)
            worst = max(worst, e / tol)
            if not e <= tol:
                bad.append(f"{name} {e:.2e} > {tol:.2e}")
        again = _triton(inp)
        nondet = [n for n in ("dq", "dk", "dv", "dbias", "dtau") if not torch.equal(got[n], again[n])]
        status = "ok" if not bad and not nondet else "FAIL"
        failures += status != "ok"
        print(f"  {case.name:24s} {status:4s} worst err/tol {worst:.3f}  (first run incl. compile {t_kernel:.1f}s)"
              + (f"  errors: {'; '.join(bad)}" if bad else "")
              + (f"  NOT bitwise deterministic: {', '.join(nondet)}" if nondet else ""), flush=True)
        del inp, got, ref, again
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return failures


BENCH_SHAPES = ((4, 4096, 128), (2, 16384, 128), (4, 4096, 64))  # (B, L, D), H = 16


def _bench_case(B, L, D) -> AttnCase:
    return AttnCase("bench", B=B, H=H16, Hkv=H16, L=L, D=D, W=512, tau=(-1.0,) * H16)


def _warm_job(case: AttnCase, config: int) -> str:
    """Compile (into triton's disk cache) the kernels ``case`` needs with config ``config``, on L = 1024."""
    os.environ[tk.CONFIG_ENV] = str(config)
    small = AttnCase(case.name, B=1, H=case.H, Hkv=case.Hkv, L=1024, D=case.D, W=case.W, causal=case.causal,
                     lengths=None if case.lengths is None else (1000,), noncontig=case.noncontig, tau=case.tau)
    inp = make_inputs("lazy_attention", small, torch.bfloat16, "cuda", seed=0)
    _triton(inp)
    torch.cuda.synchronize()
    return f"{case.name}/{config}"


def warm(jobs: int, check_cases, bench_cases) -> None:
    """Compile every kernel variant in ``jobs`` parallel processes (config 0 for checks, all for benches)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    n_cfg = max(len(tk.shipped_configs(k, d, torch.bfloat16)) for k in ("fwd", "dq", "dkdv") for d in (64, 128))
    work, seen = [], set()
    for c, i in [(c, 0) for c in check_cases] + [(c, i) for c in bench_cases for i in range(n_cfg)]:
        key = (c.D, c.causal, c.lengths is None, c.noncontig, c.H // c.Hkv, c.W, i)  # one compile each
        if key not in seen:
            seen.add(key)
            work.append((c, i))
    t0 = time.time()
    with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        for f in cf.as_completed([pool.submit(_warm_job, c, i) for c, i in work]):
            f.result()
    print(f"compiled {len(work)} kernel sets in {jobs} processes: {time.time() - t0:.0f}s", flush=True)


def _bench(fn) -> float:
    import triton
    return triton.testing.do_bench(fn, return_mode="median")


def bench() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    os.environ.pop(tk.CONFIG_ENV, None)
    print("== speed (bf16, causal; lazy: W=512, tau=-1; ms, median of triton.testing.do_bench) ==")
    rows = []
    for B, L, D in BENCH_SHAPES:
        H = H16
        inp = make_inputs("lazy_attention", _bench_case(B, L, D), torch.bfloat16, "cuda", seed=0)
        q, k, v, bias, tau = (inp.tensors[n] for n in ("q", "k", "v", "bias", "tau"))
        do = inp.grads[0]
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v, bias, tau)]

        def lazy_fwd():
            with torch.no_grad():
                kd.lazy_attention(q, k, v, bias, tau, backend="triton")

        def lazy_fwd_bwd():
            o = kd.lazy_attention(*leaves, backend="triton")
            torch.autograd.grad(o, leaves, do)

        res = {"lazy": (_bench(lazy_fwd), _bench(lazy_fwd_bwd))}
        qkv = [t.clone().requires_grad_(True) for t in (q, k, v)]
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    def f():
                        with torch.no_grad():
                            sdpa(q, k, v, is_causal=True)

                    def fb():
                        o = sdpa(*qkv, is_causal=True)
                        torch.autograd.grad(o, qkv, do)
                    res[name] = (_bench(f), _bench(fb))
            except Exception as e:  # a backend missing on this build is reported, not fatal
                print(f"  sdpa {name} unavailable at B={B} L={L} D={D}: {type(e).__name__}: {e}")
        flops = 4 * B * H * L * L * D / 2  # causal forward, 2 GEMMs (flash convention)
        rows.append((B, L, D, res, flops))
    hdr = f"{'B':>2} {'L':>6} {'D':>4} | {'lazy fwd':>9} {'cudnn fwd':>9} {'ratio':>6} | " \
          f"{'lazy f+b':>9} {'cudnn f+b':>9} {'ratio':>6} | {'flash fwd':>9} {'flash f+b':>9} | lazy fwd TF/s*"
    print(hdr)
    for B, L, D, res, flops in rows:
        lz, cd, fl = res["lazy"], res.get("cudnn", (float("nan"),) * 2), res.get("flash", (float("nan"),) * 2)
        print(f"{B:>2} {L:>6} {D:>4} | {lz[0]:9.3f} {cd[0]:9.3f} {lz[0] / cd[0]:6.2f} | {lz[1]:9.3f} {cd[1]:9.3f} "
              f"{lz[1] / cd[1]:6.2f} | {fl[0]:9.3f} {fl[1]:9.3f} | {flops / lz[0] / 1e9:8.1f}")
    print("  * flash-convention TFLOP/s (4*B*H*L^2*D/2 per forward); lazy does 3 GEMMs in the forward, 9 in the backward")
    print("autotuned configs:")
    for name, winners in tk.best_configs().items():
        for key, cfg in winners.items():
            print(f"  {name:5s} {key}: {cfg}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-check", action="store_true", help="skip the equivalence and determinism checks")
    ap.add_argument("--no-bench", action="store_true", help="skip the timings")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1),
                    help="processes compiling the kernels up front (0: compile lazily)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}")
    t0 = time.time()
    if a.jobs > 0:
        warm(a.jobs, [] if a.no_check else CHECK_CASES,
             [] if a.no_bench else [_bench_case(*shape) for shape in BENCH_SHAPES])
    failures = 0 if a.no_check else check()
    if not a.no_bench:
        bench()
    print(f"total {time.time() - t0:.0f}s; {'all checks passed' if not failures else f'{failures} case(s) FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
