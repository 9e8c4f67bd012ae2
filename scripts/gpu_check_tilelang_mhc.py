"""GPU check of the TileLang mHC backend: correctness, determinism and speed, one compact report.

On the GPU machine (H100/H200), after putting tilelang on PYTHONPATH:
    python3 scripts/gpu_check_tilelang_mhc.py
  1. loads every kernel the checks use (from the cache .devcache/tilelang-mhc-cache.tar.xz built here
     by --prebuild when its keys match, else compiles them in parallel processes);
  2. runs every n = 4 case of tests/cases.py MHC_CASES (and D = 1280, 2560, 7168) for bf16 and fp16
     through the public API with backend="tilelang" against golden float64 (err / tol per tensor),
     and mhc_pre bf16 again with the other dx-kernel configuration (mhc_pre.DX_CTAS_PER_SM = 1);
  3. runs the backward twice on the realistic case and checks every output is bitwise equal;
  4. times the block pre -> identity -> post (T = 16384, n = 4, D = 4096 and 7168, bf16), forward and
     forward + backward, for tilelang (both dx configurations), triton and torch.compile of golden
     (D = 4096), as triton's do_bench does (events per call, host running ahead, L2 flushed), against
     the speed of light: forward 28D and backward 54D bytes per token over the device-to-device copy
     rate measured in the same run;
  5. prints the host time per call, the tilelang kernels' device times (profiler), a summary table,
     and writes everything to $OUT/mhc_results.json.
MHC_TIME_BUDGET (seconds since start, default 250) skips the timings that would start later.
On a CPU machine:  python3 scripts/gpu_check_tilelang_mhc.py --prebuild  builds the same kernels for
sm_90a (MHC_PREBUILD_CACHE: reuse a cache folder) and packs the cache into the .devcache tarball.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
CACHE_TAR = os.path.join(ROOT, ".devcache", "tilelang-mhc-cache.tar.xz")
HP = (20, 2.0, 1e-6, 1e-6, 1e-6)
SMS = 132
BENCH_T, BENCH_D = 16384, (4096, 7168)
EXTRA_D = ((1280, 96), (2560, 64), (7168, 40))
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def variant_specs():
    """The kernels of the other dx configuration (one CTA per SM, 4 stages), bf16."""
    import torch

    from kernel_dispatch.backends.tilelang import mhc_pre
    out = []
    saved = mhc_pre.DX_CTAS_PER_SM
    mhc_pre.DX_CTAS_PER_SM = 3 - saved
    try:
        for D in sorted({c_D for c_D in _case_ds()}):
            for stage in ("dx", "param"):
                out.append(mhc_pre.kernel_specs(D, torch.bfloat16, HP, SMS)[stage])
    finally:
        mhc_pre.DX_CTAS_PER_SM = saved
    return out


def _case_ds():
    from tests.cases import MHC_CASES
    return sorted({c.D for c in MHC_CASES if c.n == 4} | {d for d, _ in EXTRA_D} | set(BENCH_D))


def all_specs(dtypes, sms=SMS):
    """Every (factory, args) the checks need, deduplicated."""
    from kernel_dispatch.backends.tilelang import mhc_post, mhc_pre
    ds = _case_ds()
    seen, out = set(), []
    for D in ds:
        for dt in dtypes:
            for f, a in list(mhc_pre.kernel_specs(D, dt, HP, sms).values()) + mhc_post.kernel_specs(D, dt):
                key = (f.__wrapped__.__module__, a)
                if key not in seen:
                    seen.add(key)
                    out.append((f, a))
    for f, a in variant_specs():
        if (f.__wrapped__.__module__, a) not in seen:
            seen.add((f.__wrapped__.__module__, a))
            out.append((f, a))
    return out


def _compile_one(item):
    mod, args, target = item
    import importlib
    t = time.time()
    try:
        from kernel_dispatch.backends.tilelang._build import compile_kernel
        compile_kernel(importlib.import_module(mod).build(*args), target)
        return mod, args, time.time() - t, None
    except Exception as e:  # report, keep going
        return mod, args, time.time() - t, f"{type(e).__name__}: {e}"[-400:]


def build_all(specs, target, workers):
    items = [(f.__wrapped__.__module__, a, target) for f, a in specs]
    bad = []
    if workers <= 1:
        results = map(_compile_one, items)
    else:
        import multiprocessing as mp
        ex = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
        results = ex.map(_compile_one, items)
    for mod, args, dt, err in results:
        if err:
            bad.append((mod, args, err))
            log("BUILD FAILED", mod.split(".")[-1], args, err)
    return bad


def prebuild():
    cache = os.environ.get("MHC_PREBUILD_CACHE") or tempfile.mkdtemp(prefix="mhc_tlcache_")
    os.environ["TILELANG_CACHE_DIR"] = cache
    import torch
    from kernel_dispatch.backends.tilelang._build import SM90A
    specs = all_specs((torch.bfloat16, torch.float16))
    log(f"prebuild: {len(specs)} kernels into {cache}")
    bad = build_all(specs, dict(SM90A), int(os.environ.get("PREBUILD_WORKERS", "2")))
    with tarfile.open(CACHE_TAR, "w:xz") as tar:
        tar.add(cache, arcname="cache")
    log(f"wrote {CACHE_TAR} ({os.path.getsize(CACHE_TAR) / 1e6:.1f} MB), {len(bad)} failures")


# ----------------------------------------------------------------------------------------- GPU


def poison():
    import torch
    big = torch.full((1 << 28,), float("nan"), device="cuda")  # 1 GiB of NaN for torch.empty to reuse
    del big


def check_case(op, case, dtype, rows, label=""):
    import torch

    from tests.cases import make_inputs, run, upcast
    from tests.tolerances import rel_err, tolerance
    inp = make_inputs(op, case, dtype, "cuda")
    ref = run(op, upcast(inp), "golden")
    poison()
    got = run(op, inp, "tilelang")
    torch.cuda.synchronize()
    worst, detail = 0.0, []
    for name in ref:
        r = rel_err(got[name], ref[name]) / tolerance(op, dtype, name)
        detail.append(f"{name}={r:.3f}")
        worst = max(worst, r)
    rows.append({"op": op + label, "case": case.name, "dtype": str(dtype)[6:], "worst": worst,
                 "detail": " ".join(detail)})
    log(f"{'ok  ' if worst <= 1 else 'FAIL'} {op + label:12s} {case.name:20s} {str(dtype)[6:]:8s} worst err/tol "
        f"{worst:.3f}  " + " ".join(detail))


def correctness(rows, ops=("mhc_pre", "mhc_post"), dtypes=None, label=""):
    import torch

    from tests.cases import MHC_CASES, MHCCase
    cases = [c for c in MHC_CASES if c.n == 4] + [MHCCase(f"d{d}", lead=(t,), D=d) for d, t in EXTRA_D]
    cases.append(MHCCase("d7168_noncontig_nogamma", lead=(33,), D=7168, gamma=False, noncontig=True))
    for case in cases:
        for dtype in dtypes or (torch.bfloat16, torch.float16):
            for op in ops:
                try:
                    check_case(op, case, dtype, rows, label)
                except Exception:
                    rows.append({"op": op, "case": case.name, "dtype": str(dtype)[6:], "worst": float("inf"),
                                 "detail": traceback.format_exc()[-600:]})
                    log(f"ERROR {op} {case.name} {dtype}\n{traceback.format_exc()[-1500:]}")


def determinism(res):
    import torch

    from tests.cases import MHC_CASES, make_inputs, run
    case = [c for c in MHC_CASES if c.big][0]
    for op in ("mhc_pre", "mhc_post"):
        inp = make_inputs(op, case, torch.bfloat16, "cuda")
        a, b = run(op, inp, "tilelang"), run(op, inp, "tilelang")
        same = {k: bool(torch.equal(a[k], b[k])) for k in a}
        res[op] = same
        log(f"determinism {op}: " + " ".join(f"{k}={'bitwise' if v else 'DIFFERS'}" for k, v in same.items()))


def bench_ms(fn, iters=20, warmup=5):
    """Median device time of ``fn`` in ms, as triton's do_bench measures it: an event pair around each
    call, no synchronisation between calls (the host runs ahead), L2 flushed before each call."""
    import torch
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for s, e in ev:
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


def copy_bandwidth():
    import torch
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = bench_ms(lambda: b.copy_(a), iters=20)
    return 2 * a.numel() / (ms * 1e-3)


def make_block(D, backend, T=BENCH_T):
    import torch

    import kernel_dispatch as kd
    g = torch.Generator(device="cpu").manual_seed(0)
    n, M = 4, 24
    x = torch.randn(T, n, D, generator=g).to(torch.bfloat16).cuda()
    phi = (0.05 * torch.randn(M, n * D, generator=g)).cuda()
    alpha = torch.tensor([0.8, 1.2, 0.9]).cuda()
    bias = (0.3 * torch.randn(M, generator=g)).cuda()
    gamma = (1 + 0.1 * torch.randn(n * D, generator=g)).cuda()
    gout = torch.randn(T, n, D, generator=g).to(torch.bfloat16).cuda()
    leaves = [x, phi, alpha, bias, gamma]
    if backend == "golden_compiled":
        from kernel_dispatch.golden import mhc_post as gpost
        from kernel_dispatch.golden import mhc_pre as gpre

        def block(x, phi, alpha, bias, gamma):
            h_in, hp, hr, _, _ = gpre.forward(x, phi, alpha, bias, gamma, *HP)
            return gpost.forward(h_in, x, hp, hr)
        block = torch.compile(block)
    else:
        def block(x, phi, alpha, bias, gamma):  # wired as kernel_dispatch.nn.MHC: x through pre's residual
            h_in, hp, hr, x_res = kd.mhc_pre(x, phi, alpha, bias, gamma, backend=backend, return_residual=True)
            return kd.mhc_post(h_in, x_res, hp, hr, backend=backend)

    def fwd():
        with torch.no_grad():
            block(*leaves)

    train_leaves = [t.clone().requires_grad_(True) for t in leaves]

    def fwd_bwd():
        for t in train_leaves:
            t.grad = None
        block(*train_leaves).backward(gout)
    return fwd, fwd_bwd


def timing(bw, res, budget_s, backends):
    for D in BENCH_D:
        sol_f = BENCH_T * 28 * D / bw * 1e3
        sol_fb = BENCH_T * 82 * D / bw * 1e3
        for backend in backends:
            if time.time() - T0 > budget_s:
                log(f"skip timing {backend} D={D}: time budget")
                continue
            try:
                from kernel_dispatch.backends.tilelang import mhc_pre
                mhc_pre.DX_CTAS_PER_SM = 1 if backend == "tilelang_dx1" else 2
                fwd, fwd_bwd = make_block(D, "tilelang" if backend.startswith("tilelang") else backend)
                f_ms, fb_ms = bench_ms(fwd), bench_ms(fwd_bwd)
                mhc_pre.DX_CTAS_PER_SM = 2
                res.append({"D": D, "backend": backend, "fwd_ms": f_ms, "fwd_bwd_ms": fb_ms, "sol_fwd_ms": sol_f,
                            "sol_fwd_bwd_ms": sol_fb})
                log(f"time D={D} {backend:16s} fwd {f_ms:.3f} ms ({100 * sol_f / f_ms:.0f}% SOL)  "
                    f"fwd+bwd {fb_ms:.3f} ms ({100 * sol_fb / fb_ms:.0f}% SOL)")
            except Exception:
                log(f"timing {backend} D={D} failed:\n{traceback.format_exc()[-1200:]}")


def _host_us(fn, n=50):
    """Host microseconds per call of ``fn`` (issue only), after a warm-up and a synchronisation."""
    import torch
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t) / n * 1e6


def cpu_overhead(res):
    """Host time per call (issue only, no synchronisation) of one kernel, of each launcher, of the block."""
    import torch

    import kernel_dispatch as kd
    from kernel_dispatch.backends.tilelang import mhc_post, mhc_pre
    dev = torch.device("cuda")
    T, D = 64, 4096
    x = torch.randn(T, 4, D, device=dev).to(torch.bfloat16)
    phi, alpha = 0.05 * torch.randn(24, 4 * D, device=dev), torch.tensor([0.8, 1.2, 0.9], device=dev)
    bias, gamma = 0.3 * torch.randn(24, device=dev), 1 + 0.1 * torch.randn(4 * D, device=dev)
    hp_ = torch.rand(T, 4, device=dev)
    h_in = torch.empty(T, D, device=dev, dtype=torch.bfloat16)
    k_apply = mhc_pre._kernels(x, HP)["apply"][0]
    items = [("one tilelang kernel call (apply)", lambda: k_apply(x, hp_, h_in)),
             ("mhc_pre.forward launcher", lambda: mhc_pre.forward(x, phi, alpha, bias, gamma, *HP)),
             ("kd.mhc_pre (front end + launcher)", lambda: kd.mhc_pre(x, phi, alpha, bias, gamma, backend="tilelang"))]
    outs = mhc_pre.forward(x, phi, alpha, bias, gamma, *HP)
    items.append(("mhc_post.forward launcher", lambda: mhc_post.forward(outs[0], x, outs[1], outs[2])))
    g = (torch.randn(T, D, device=dev).to(torch.bfloat16), torch.randn(T, 4, device=dev),
         torch.randn(T, 4, 4, device=dev))
    items.append(("mhc_pre.backward launcher",
                  lambda: mhc_pre.backward(*g, x, phi, alpha, bias, gamma, outs[3], outs[4], *HP)))
    for D2 in BENCH_D:
        fwd, fwd_bwd = make_block(D2, "tilelang")
        items += [(f"block fwd D={D2} T={BENCH_T}", fwd), (f"block fwd+bwd D={D2} T={BENCH_T}", fwd_bwd)]
    for name, fn in items:
        host, wall = _host_us(fn, 10 if "block" in name else 50)
        res.append({"what": name, "host_us": host, "wall_us": wall})
        log(f"host {host:8.1f} us issued, {wall:8.1f} us done: {name}")


def profile_kernels(res):
    import torch
    from gpu_profile_kernels import kernel_rows  # scripts/, this script's directory
    for D in BENCH_D:
        _, fwd_bwd = make_block(D, "tilelang")
        fwd_bwd()
        torch.cuda.synchronize()
        rows = kernel_rows(fwd_bwd)
        res[str(D)] = [(k, c, t) for t, c, k in rows]
        log(f"kernels of one tilelang fwd+bwd, D={D} (us total, count):")
        for t, c, k in rows[:16]:
            print(f"    {t:9.1f} {c:3d}  {k[:90]}", flush=True)


def gpu_main():
    import torch
    out_dir = os.environ.get("OUT", tempfile.mkdtemp())
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if os.path.exists(CACHE_TAR) and "TILELANG_CACHE_DIR" not in os.environ:
        cache = tempfile.mkdtemp(prefix="mhc_tlcache_")
        with tarfile.open(CACHE_TAR) as tar:
            tar.extractall(cache)
        os.environ["TILELANG_CACHE_DIR"] = os.path.join(cache, "cache")
    import tilelang
    results["tilelang"] = tilelang.__version__
    log(f"device {results['device']}, torch {torch.__version__}, tilelang {tilelang.__version__}, "
        f"cache {os.environ.get('TILELANG_CACHE_DIR', 'default')}")
    from kernel_dispatch.backends.tilelang._build import device_target, kernel
    from kernel_dispatch.backends.tilelang._mhc_common import sm_count
    sms = sm_count(torch.cuda.current_device())
    specs = all_specs((torch.bfloat16, torch.float16), sms)
    t = time.time()
    kernel(specs[0][0], specs[0][1], torch.device("cuda"))  # a cache probe
    probe = time.time() - t
    log(f"{len(specs)} kernels; first load took {probe:.1f}s")
    if probe > 3:  # cache miss: compile the rest in parallel processes first
        build_all(specs, device_target(torch.device("cuda")), 14)
    t = time.time()
    for f, a in specs:
        try:
            kernel(f, a, torch.device("cuda"))
        except Exception as e:
            log("LOAD FAILED", f.__wrapped__.__module__, a, f"{type(e).__name__}: {e}"[-300:])
    log(f"kernels ready ({time.time() - t:.1f}s)")

    rows = []
    correctness(rows)
    from kernel_dispatch.backends.tilelang import mhc_pre
    mhc_pre.DX_CTAS_PER_SM = 1  # the other dx configuration (bf16 only: fp16 always uses it)
    correctness(rows, ("mhc_pre",), (torch.bfloat16,), "[dx1]")
    mhc_pre.DX_CTAS_PER_SM = 2
    results["correctness"] = rows
    det = {}
    try:
        determinism(det)
    except Exception:
        log("determinism failed\n" + traceback.format_exc()[-1500:])
    results["determinism"] = det
    bw = copy_bandwidth()
    results["copy_bw"] = bw
    log(f"device-to-device copy: {bw / 1e12:.2f} TB/s (read + write)")
    tim = []
    budget = float(os.environ.get("MHC_TIME_BUDGET", "250"))
    timing(bw, tim, budget, ("tilelang", "tilelang_dx1", "triton"))
    results["timing"] = tim
    cpu = []
    try:
        cpu_overhead(cpu)
    except Exception:
        log("cpu overhead failed\n" + traceback.format_exc()[-1500:])
    results["host"] = cpu
    prof = {}
    try:
        profile_kernels(prof)
    except Exception:
        log("profile failed\n" + traceback.format_exc()[-1500:])
    results["profile"] = prof
    BENCH_D_SAVED = BENCH_D
    globals()["BENCH_D"] = (4096,)
    timing(bw, tim, budget, ("golden_compiled",))
    globals()["BENCH_D"] = BENCH_D_SAVED
    with open(os.path.join(out_dir, "mhc_results.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)

    print("\n==== summary ====", flush=True)
    print(f"device {results['device']}  copy {bw / 1e12:.2f} TB/s", flush=True)
    fails = [r for r in rows if not r["worst"] <= 1]
    print(f"correctness: {len(rows) - len(fails)}/{len(rows)} within tolerance; worst "
          f"{max((r['worst'] for r in rows), default=0):.3f}", flush=True)
    for r in fails:
        print(f"  FAIL {r['op']} {r['case']} {r['dtype']}: {r['detail'][:300]}", flush=True)
    print("determinism: " + ", ".join(f"{op}: {'all bitwise' if all(v.values()) else v}" for op, v in det.items()))
    print(f"{'D':>5s} {'backend':16s} {'fwd ms':>8s} {'%SOL':>5s} {'f+b ms':>8s} {'%SOL':>5s}")
    for r in tim:
        print(f"{r['D']:5d} {r['backend']:16s} {r['fwd_ms']:8.3f} {100 * r['sol_fwd_ms'] / r['fwd_ms']:5.0f} "
              f"{r['fwd_bwd_ms']:8.3f} {100 * r['sol_fwd_bwd_ms'] / r['fwd_bwd_ms']:5.0f}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--prebuild", action="store_true", help="build the kernels for sm_90a here and pack the cache")
    if ap.parse_args().prebuild:
        prebuild()
    else:
        gpu_main()
