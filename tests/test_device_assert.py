"""The one-kernel range check of CUDA tensors (kernel_dispatch/ops/_device_assert.py): it compiles for sm_90 with
its assert in the code (CPU), passes in-range values, and on a GPU an out-of-range value, also one written into a
captured decode step's cache_seqlens after capture, stops the process with the check's message."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kernel_dispatch.ops import _device_assert


_COMPILE = """
from kernel_dispatch.ops import _device_assert
from kernel_dispatch.testing.triton_compile import compile_sm90
k = compile_sm90(_device_assert._kernel(), {"X": "*i32", "n": "i32", "low": "i64", "high": "i64"},
                 {"HAS_LOW": True, "HAS_HIGH": True, "MESSAGE": "cache_seqlens: expected every value in [1, 8]",
                  "BLOCK": _device_assert.BLOCK}, 4, 1)
print("assert in ptx:", "__assertfail" in k.asm["ptx"])
"""


def test_compiles_for_sm90_with_the_assert_in_the_code():
    env = {**os.environ, "TRITON_INTERPRET": "0"}  # compile, not interpret (a fresh process: jit reads it once)
    proc = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "assert in ptx: True" in proc.stdout


def test_only_contiguous_cuda_integer_tensors_outside_compile():
    assert not _device_assert.available(torch.arange(4, dtype=torch.int32))  # CPU: the host reads them
    if torch.cuda.is_available():
        assert _device_assert.available(torch.arange(4, dtype=torch.int32, device="cuda"))
        assert not _device_assert.available(torch.ones(4, device="cuda"))


_BAD_CAPTURED_STEP = """
import torch, kernel_dispatch as kd
B, H, Hkv, S, D = 2, 4, 2, 64, 64
q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
kc, vc = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
bias, tau = torch.zeros(H, 16, device="cuda"), torch.full((H,), -1.0, device="cuda")
seqlens = torch.full((B,), 10, dtype=torch.int32, device="cuda")
step = lambda: kd.lazy_attention_with_kvcache(q, kc, vc, bias, tau, seqlens, backend="triton")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    step()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    out = step()
g.replay(); torch.cuda.synchronize()
print("in range: ok", flush=True)
seqlens.fill_({bad})
g.replay(); torch.cuda.synchronize()
print("out of range: not caught", flush=True)
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("bad", [65, -1, 0], ids=["overflow", "negative", "fewer_keys_than_queries"])
def test_captured_decode_step_stops_on_bad_cache_seqlens(bad):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_BAD_CAPTURED_STEP.format(bad=bad))],
                          capture_output=True, text=True, timeout=300)
    assert "in range: ok" in proc.stdout, proc.stderr[-2000:]
    assert "not caught" not in proc.stdout
    assert proc.returncode != 0
    assert "cache_seqlens: expected every value in [1, 64]" in proc.stderr, proc.stderr[-2000:]


_COMPILE_CU = """
from kernel_dispatch.ops import _device_assert
from kernel_dispatch.testing.triton_compile import compile_sm90
m = _device_assert.CU_MESSAGES
k = compile_sm90(_device_assert._cu_seqlens_kernel(), {"CU": "*i32", "n_docs": "i32", "total": "i32",
                 "max_seqlen": "i32"}, {"START": m["start"], "ORDER": m["order"], "END": m["end"],
                 "LONGEST": m["longest"], "BLOCK": _device_assert.BLOCK}, 4, 1)
print("asserts in ptx:", k.asm["ptx"].count("__assertfail"))
"""


def test_cu_seqlens_check_compiles_for_sm90_with_its_four_asserts():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-c", _COMPILE_CU], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    count = int(proc.stdout.split("asserts in ptx:")[1].split()[0])
    assert count >= 4, f"{count} __assertfail calls in the PTX, expected one per check (4)"


_BAD_CU = """
import torch, kernel_dispatch as kd
T, H, D = 53, 2, 64
q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
bias, tau = torch.zeros(H, 8, device="cuda"), torch.full((H,), -1.0, device="cuda")
good = torch.tensor([0, 10, 30, 53], dtype=torch.int32, device="cuda")
kd.lazy_attention_varlen(q, k, v, bias, tau, good, max_seqlen=23, backend="triton"); torch.cuda.synchronize()
print("valid: ok", flush=True)
kd.lazy_attention_varlen(q, k, v, bias, tau, torch.tensor({bad}, dtype=torch.int32, device="cuda"),
                         max_seqlen={max_seqlen}, backend="triton")
torch.cuda.synchronize()
print("invalid: not caught", flush=True)
"""

BAD_CU = [("[1, 10, 30, 53]", 23, "start"), ("[0, 30, 10, 53]", 43, "order"), ("[0, 10, 30, 50]", 23, "end"),
          ("[0, 10, 30, 53]", 20, "longest")]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("bad,max_seqlen,check", BAD_CU, ids=[c for *_, c in BAD_CU])
def test_bad_cu_seqlens_on_the_device_stops_with_the_named_message(bad, max_seqlen, check):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_BAD_CU.format(bad=bad, max_seqlen=max_seqlen))],
                          capture_output=True, text=True, timeout=300)
    assert "valid: ok" in proc.stdout, proc.stderr[-2000:]
    assert "not caught" not in proc.stdout
    assert proc.returncode != 0
    assert _device_assert.CU_MESSAGES[check] in proc.stderr, proc.stderr[-2000:]
