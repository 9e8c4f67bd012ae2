"""GPU check and benchmark of the KV-cache decode kernels (SPEC section 5), against the memory speed of light.

On a GPU machine:  python3 scripts/gpu_bench_kvcache_decode.py [--backends triton,tilelang] [--shapes 1x4096,...]
For each (B, cache length) of the issue's list (bf16, H=32, Hkv=8, D=128, W=512, Lq=1, every row's cache full):
  1. checks every backend's output against golden (fp32 on the same device) with the lazy_attention "o" tolerance;
  2. times each backend eagerly and replayed from a CUDA graph (L2 flushed before every run), and SDPA (cuDNN, then
     flash) on the same q, K and V with enable_gqa: plain softmax attention, the baseline;
  3. reports the speed of light: K and V bytes read once over the copy bandwidth of this card
     (``copy_bandwidth_gbps``: bytes read plus bytes written by a 1 GiB device-to-device copy over its time), and
     each time as a fraction of it;
  4. writes everything to $OUT/kvcache_decode.json (when OUT is set) and prints one table.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kernel_dispatch.benchmarks.timing import Timer, copy_bandwidth_gbps  # noqa: E402
from kernel_dispatch.golden import lazy_attention_with_kvcache as golden  # noqa: E402

SHAPES = [(1, 4096), (1, 32768), (1, 131072), (16, 4096), (16, 32768), (64, 4096), (64, 16384)]
H, HKV, D, W = 32, 8, 128, 512
MODULES = {"triton": "kernel_dispatch.backends.triton.lazy_attention_with_kvcache",
           "tilelang": "kernel_dispatch.backends.tilelang.lazy_attention_with_kvcache"}
TOL = 4 * 2.0 ** -8 + 256 * 2.0 ** -24  # tests/tolerances.py: lazy_attention "o", bf16


def graphed(fn):
    """``fn`` captured in a CUDA graph (warmed up on a side stream), returned as a replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def sdpa_ms(timer, q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
                fn()
                return name, timer.measure(fn)["median_ms"]
        except Exception:  # this backend does not take these inputs
            continue
    return None, None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default="triton,tilelang")
    p.add_argument("--shapes", default=",".join(f"{b}x{n}" for b, n in SHAPES))
    args = p.parse_args()
    dev = torch.device("cuda")
    timer = Timer(dev)
    bw = copy_bandwidth_gbps(timer) * 1e9
    rows, report = [], {"device": torch.cuda.get_device_name(dev), "copy_bandwidth_GBs": bw / 1e9, "shapes": []}
    for shape in args.shapes.split(","):
        B, n = map(int, shape.split("x"))
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(B, H, 1, D, device=dev, generator=g).bfloat16()
        k = torch.randn(B, HKV, n, D, device=dev, generator=g).bfloat16()
        v = torch.randn(B, HKV, n, D, device=dev, generator=g).bfloat16()
        bias = 0.5 * torch.randn(H, W, device=dev, generator=g)
        tau = torch.full((H,), -1.0, device=dev)
        seqlens = torch.full((B,), n, dtype=torch.int32, device=dev)
        scale = D ** -0.5
        ref = golden.forward(q.float(), k, v, bias, tau, seqlens, scale)
        sol_ms = 2 * k.numel() * k.element_size() / bw * 1e3
        entry = {"B": B, "cache": n, "sol_ms": sol_ms}
        for name in args.backends.split(","):
            mod = importlib.import_module(MODULES[name])
            fn = lambda: mod.forward(q, k, v, bias, tau, seqlens, scale)  # noqa: E731
            out = fn()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            eager = timer.measure(fn)["median_ms"]
            replay = timer.measure(graphed(fn))["median_ms"]
            entry[name] = {"rel_err": err, "ok": err <= TOL, "eager_ms": eager, "graph_ms": replay,
                           "sol_fraction": sol_ms / replay}
        sdpa_name, sdpa = sdpa_ms(timer, q, k, v)
        entry["sdpa"] = {"backend": sdpa_name, "ms": sdpa, "sol_fraction": sol_ms / sdpa if sdpa else None}
        report["shapes"].append(entry)
        rows.append(entry)
        del k, v
        timer.release()
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "kvcache_decode.json"), "w") as f:
            json.dump(report, f, indent=1)
    print(f"{report['device']}: copy bandwidth {bw / 1e9:.0f} GB/s; times in ms (CUDA-graph replay), "
          f"fraction of the speed of light in brackets")
    names = args.backends.split(",")
    print("| B | cache | SoL | " + " | ".join(names) + " | SDPA |")
    for e in rows:
        cells = [f"{e[n]['graph_ms']:.4f} ({e[n]['sol_fraction']:.0%}){'' if e[n]['ok'] else ' WRONG'}"
                 for n in names]
        s = e["sdpa"]
        sd = f"{s['ms']:.4f} ({s['sol_fraction']:.0%}, {s['backend']})" if s["ms"] else "n/a"
        print(f"| {e['B']} | {e['cache']} | {e['sol_ms']:.4f} | " + " | ".join(cells) + f" | {sd} |")


if __name__ == "__main__":
    main()
