"""Every TileLang lazy attention kernel factory lowers to CUDA for sm_90a and builds to a cubin, on a CPU.

Builds go into a fresh TileLang cache (so they really compile) with the CUDA compiler of the pip
packages nvidia-cuda-nvcc / nvidia-cuda-cccl; without a compiler the test fails and says what to
install. Each factory is built once, bf16 at head dim 64 (causal, and non-causal for the kernels
whose mask differs), with the launcher's tile configuration, and its generated source must not hand a
shared buffer back to the TMA producer while an async wgmma still reads it, and must send its output tiles
through shared memory by TMA stores that follow a barrier and an async-proxy fence (tests/async_release.py), and
must convert the stored LSE to log2 units by one rounded product.
Numerics run on a GPU only (the equivalence matrix and tests/test_determinism_gpu.py, marked gpu).
"""
import glob
import importlib.util
import os

import pytest

from kernel_dispatch.backends.tilelang import _build

from .async_release import reads_before_arrival, release_violations, top_level_barriers, unfenced_stores

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tilelang") is None,
                                reason="tilelang is not installed (it is Linux-only)")

# (kernel, causal): the row-major forward kernels share one mask path, so their non-causal build is
# covered by lse; the backward kernels each get both.
# Output tiles leave through shared memory and TMA stores.
TMA_STORES = {"lse": set(), "fwd": {"O_desc"}, "row_dot": set(), "dq_delta": {"dQ_desc"},
              "dkdv": {"dK_desc", "dV_desc"}}
MEMORY_KERNELS = {"row_dot"}  # no GEMM, plain vector loads
# CTA barriers every iteration of the consumer's key (or query) sweep runs, outside any branch, and the sweep's
# loop variable in the generated CUDA: free tiles must not wait for each other (dK/dV keeps the one TileLang
# hoists out of its masked branch; with its dbias work after the GEMMs it would run 3, 1.58 against 1.50 ms on an
# H100).
SWEEP_BARRIERS = {"lse": ("k_1", 0), "fwd": ("k_1", 0), "dq_delta": ("k_1", 0), "dkdv": ("it_1", 1)}
# Kernels that write (lse) or read back the natural-log LSE: the conversion to log2 units is one rounded product
# (__fmul_rn); nvcc would fuse a plain product into the exponent's FFMA, whose exact product differs from the
# rounded one (P = inf with scores near 1e30; the Triton backward did that on an H100).
LSE_ROUND_TRIP = {"lse", "fwd", "dq_delta", "dkdv"}
BUILDS = [("lse", True, False), ("lse", False, False), ("fwd", True, False), ("row_dot", True, False),
          ("dq_delta", True, False), ("dq_delta", False, False), ("dkdv", True, False), ("dkdv", False, False),
          ("lse", True, True), ("fwd", True, True), ("fwd", False, True), ("row_dot", True, True),
          ("dq_delta", True, True), ("dq_delta", False, True), ("dkdv", True, True), ("dkdv", False, True)]
# packed documents (varlen): the output rows of a tile may belong to the next document, so O, dQ, dK and dV leave
# by stores predicated on the row (no TMA store)
VARLEN_TMA_STORES = {name: set() for name in TMA_STORES}
# varlen fwd and dQ: TileLang hoists the barrier of the one key tile whose next-document rows are zeroed out of its
# branch; on an H100 the forward's costs nothing measurable (uniform 4 x 4096 and a random draw of 8 documents, bf16,
# D=128: within 1% and of either sign), and the packed fwd+bwd at the uniform case, where no tile is zeroed, runs at
# 0.98x the fixed-length kernels (docs/lazy-attention-speed.md), so they stay
VARLEN_SWEEP_BARRIERS = {"lse": ("k_1", 0), "fwd": ("k_1", 1), "dq_delta": ("k_1", 1), "dkdv": ("it_1", 1)}


@pytest.fixture(scope="module")
def toolkit():
    try:
        return _build.cuda_home(required=True)
    except RuntimeError as e:
        pytest.fail(f"cannot build TileLang kernels here: {e}")


@pytest.mark.parametrize("name,causal,varlen", BUILDS,
                         ids=[f"{n}-{'causal' if c else 'full'}{'-varlen' if v else ''}" for n, c, v in BUILDS])
def test_factory_builds_cubin_for_sm90a(name, causal, varlen, toolkit, tmp_path, monkeypatch):
    from kernel_dispatch.backends.tilelang import lazy_attention as la

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    prim = la.FACTORIES[name](64, "bfloat16", causal, la.CONFIGS[64][name], *((True,) if varlen else ()))
    kernel = _build.compile_kernel(prim, _build.SM90A)
    src = kernel.get_kernel_source()
    assert "__global__" in src
    if name not in MEMORY_KERNELS:
        assert "wgmma" in src, f"{name}: no wgmma in the sm_90a source (the Hopper GEMM path was not taken)"
        assert "tma_load" in src, f"{name}: no TMA load in the sm_90a source"
    assert not release_violations(src), f"{name}: " + "; ".join(release_violations(src))
    assert not reads_before_arrival(src), f"{name}: " + "; ".join(reads_before_arrival(src))
    stores = {d for d in set().union(*TMA_STORES.values()) if f"tma_store({d}," in src}
    expected = (VARLEN_TMA_STORES if varlen else TMA_STORES)[name]
    assert stores == expected, f"{name}: TMA stores of {sorted(stores)}, expected {sorted(expected)}"
    assert not unfenced_stores(src), f"{name}: " + "; ".join(unfenced_stores(src))
    if name in LSE_ROUND_TRIP:
        assert "__fmul_rn(" in src, f"{name}: the LSE's log2 e conversion is not one rounded product (__fmul_rn)"
    if name in SWEEP_BARRIERS:
        var, most = (VARLEN_SWEEP_BARRIERS if varlen else SWEEP_BARRIERS)[name]
        n = top_level_barriers(src, f"int {var} = 0")
        assert n <= most, f"{name}: {n} barriers in every iteration of the sweep, at most {most} expected"
    cubins = glob.glob(os.path.join(str(tmp_path), "**", "*.cubin"), recursive=True)
    assert cubins, f"{name}: no cubin written under {tmp_path}"
    with open(cubins[0], "rb") as f:
        assert f.read(4) == b"\x7fELF", f"{name}: {cubins[0]} is not an ELF cubin"


# The consumer side of a kernel that issues an async wgmma on Ka_s and releases Ka_s before waiting for it
# (the order TileLang's pipeliner gives T.wgmma_gemm unless the kernel reads the buffer again after
# T.wait_wgmma); trimmed from real sm_90a output.
_EARLY_RELEASE = """
    tl::warpgroup_reg_dealloc<24>();
    for (int k = 0; k < n; ++k) {
      mbarrier[((k & 1) + 4)].wait((((k & 3) >> 1) ^ 1));
      tl::tma_load(K_desc, mbarrier[(k & 1)], (&(((bfloat16_t*)Ka_s)[((k & 1) * 8192)])), 0, (k * 128), 0, 0);
    }
  } else {
    tl::warpgroup_reg_alloc<240>();
    for (int k_1 = 0; k_1 < n; ++k_1) {
      mbarrier[(k_1 & 1)].wait(((k_1 & 3) >> 1));
      tl::initialize_wgmma_descriptor<1, 1, 64>(desc_a, (&(((bfloat16_t*)Q_s)[0])));
      tl::initialize_wgmma_descriptor<1, 1, 64>(desc_b, (&(((bfloat16_t*)Ka_s)[0])));
      tl::warpgroup_arrive();
      tl::warpgroup_commit_batch();
      mbarrier[((k_1 & 1) + 4)].arrive();
      tl::wait_wgmma<0>();
"""


@pytest.mark.parametrize("D", (64, 128))
def test_packed_vector_stages_are_tma_aligned(D):
    """The packed dK/dV kernel TMA-loads LSE, Delta and 1/i from the 16-byte aligned token before a query block into
    buffers of block_m + vec_pad entries per pipeline stage: the start needs at most ROW_ALIGN - 1 extra entries, and
    each stage must begin 128 bytes after the last (an H100 faults on either, docs/lazy-attention-speed.md)."""
    from kernel_dispatch.backends.tilelang import lazy_attention as la
    from kernel_dispatch.backends.tilelang._lazy_attention_layout import ROW_ALIGN, Layout

    lay = Layout(True, D, None, None)
    entries = la.CONFIGS[D]["dkdv"].block_m + lay.vec_pad()
    assert lay.vec_pad() >= ROW_ALIGN - 1
    assert entries * 4 % 128 == 0, f"a stage of {entries} fp32 is not a multiple of 128 bytes"
    assert Layout(False, D, None, None).vec_pad() == 0  # fixed length: blocks start at multiples of the tile


def test_release_check_catches_a_release_before_the_wait():
    bad = release_violations(_EARLY_RELEASE)
    assert len(bad) == 1 and "releases Ka_s" in bad[0]
    fixed = _EARLY_RELEASE.replace("      mbarrier[((k_1 & 1) + 4)].arrive();\n      tl::wait_wgmma<0>();\n",
                                   "      tl::wait_wgmma<0>();\n      mbarrier[((k_1 & 1) + 4)].arrive();\n")
    assert fixed != _EARLY_RELEASE and release_violations(fixed) == []


# A prologue TileLang produced for a row dot product over a TMA-loaded tile (trimmed sm_90a output): the
# elementwise read of dO_s comes before any wait on dO_s's barrier, mbarrier[9].
_EARLY_READ = """
  if (tl::tl_shuffle_elect<384>()) {
    mbarrier[9].arrive_and_expect_tx(32768);
    tl::tma_load(dO_desc, mbarrier[9], (&(((bfloat16_t*)dO_s)[(i_2 * 8192)])), (i_2 * 64), 0, 0, 0);
  }
  __syncthreads();
  if (128 <= ((int)threadIdx.x)) {
      *(uint1*)(dO_s_local_cast + 0) = *(uint1*)(((bfloat16_t*)dO_s) + (((int)threadIdx.x) * 2));
  }
  if (((int)threadIdx.x) < 128) {
    tl::warpgroup_reg_dealloc<24>();
  } else {
    tl::warpgroup_reg_alloc<240>();
    for (int k_1 = 0; k_1 < n; ++k_1) {
      if (k_1 == 0) {
        mbarrier[9].wait(0);
      }
      tl::initialize_wgmma_descriptor<1, 1, 64>(desc_a, (&(((bfloat16_t*)dO_s)[0])));
"""


def test_arrival_check_catches_a_read_before_the_wait():
    bad = reads_before_arrival(_EARLY_READ)
    assert len(bad) == 1 and "touches dO_s" in bad[0]
    lines = _EARLY_READ.splitlines()
    fixed = "\n".join(ln for ln in lines if "dO_s_local_cast" not in ln)
    assert fixed != _EARLY_READ and reads_before_arrival(fixed) == []


@pytest.mark.parametrize("R,C", [(128, 128), (64, 128), (128, 64), (192, 64), (192, 128), (256, 128), (96, 128)])
def test_distance_table_covers_every_causal_tile(R, C):
    """The whole-sweep distance table reaches the most negative distance of every tile a causal row-major
    sweep visits (query blocks at multiples of R, key blocks at multiples of C starting before the block's
    last query), so a band tile never reads before the table."""
    from kernel_dispatch.backends.tilelang._lazy_attention_tiles import table_offset

    L = 8 * R * C
    lowest = min(m0 - n0 - (C - 1) for m0 in range(0, L, R) for n0 in range(0, m0 + R, C))
    start = -table_offset(R, C)
    assert start <= lowest, f"[{R}, {C}] tiles reach distance {lowest}, the table starts at {start}"


# The epilogue TileLang produces for a fragment staged through shared memory (trimmed sm_90a output).
_STAGED_STORE = """
    tl::__sync_thread_partial(3, 256);
    for (int i_13 = 0; i_13 < 8; ++i_13) {
      tl::ptx_stmatrix_m8n8_x4((&(((bfloat16_t*)Q_s)[(i_13 * 8)])), r0, r1, r2, r3);
    }
    tl::__sync_thread_partial(3, 256);
    if (tl::tl_shuffle_elect<256>()) {
      tl::fence_proxy_async();
      tl::tma_store(O_desc, (&(((bfloat16_t*)Q_s)[0])), 0, 0, 0, 0);
      tl::tma_store_arrive();
"""


def test_store_check_catches_a_missing_barrier_or_fence():
    assert unfenced_stores(_STAGED_STORE) == []
    lines = _STAGED_STORE.splitlines()
    no_bar = "\n".join(ln for i, ln in enumerate(lines) if i != 5)  # the barrier after the stmatrix writes
    no_fence = "\n".join(ln for ln in lines if "fence_proxy_async" not in ln)
    for bad in (no_bar, no_fence):
        found = unfenced_stores(bad)
        assert len(found) == 1 and "O_desc stores Q_s" in found[0], found


_SWEEP = """
    for (int it_1 = 0; it_1 < n; ++it_1) {
      mbarrier[(it_1 & 1)].wait(((it_1 & 3) >> 1));
      tl::__sync_thread_partial(3, 256);
      if (band) {
        tl::__sync_thread_partial(3, 256);
      }
    }
    tl::__sync_thread_partial(3, 256);
"""


def test_sweep_barrier_count_skips_branches_and_the_epilogue():
    assert top_level_barriers(_SWEEP, "int it_1 = 0") == 1
    assert top_level_barriers(_SWEEP.replace("      tl::__sync_thread_partial(3, 256);\n      if", "      if"),
                              "int it_1 = 0") == 0
