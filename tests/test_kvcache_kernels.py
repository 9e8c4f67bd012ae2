"""Lazy attention with a KV cache (SPEC section 5): every backend's forward against the definition.

Row j of batch row b must equal row p = n_b - Lq + j of golden lazy attention (SPEC section 1) run over that row's
first n_b tokens, in float64 (``definition``). The backends' forward modules are called directly with the
signature the front end uses: forward(q, k_cache, v_cache, bias, tau, seqlens_k, scale), k/v already appended.
Every cache slot at or past n_b holds NaN, so a kernel that reads (or multiplies by) a key outside the row fails.
Triton runs through its interpreter on the CPU (three paths: the launcher's own split count, one split with the
direct store, and scores recomputed from K instead of kept); TileLang runs on a CUDA device only.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

import pytest
import torch

from kernel_dispatch.golden import lazy_attention as golden_attention

from .tolerances import rel_err, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# numpy, running the Triton interpreter, warns where the kernels compute -inf - -inf or log2(0) in masked lanes
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
MODULES = {"golden": "kernel_dispatch.golden.lazy_attention_with_kvcache",
           "triton": "kernel_dispatch.backends.triton.lazy_attention_with_kvcache",
           "tilelang": "kernel_dispatch.backends.tilelang.lazy_attention_with_kvcache"}


@dataclass(frozen=True)
class KVCase:
    name: str
    seqlens: tuple[int, ...]  # n_b per batch row, the Lq new keys included
    Lq: int = 1
    extra: int = 3  # capacity S = max(seqlens) + extra
    H: int = 4
    Hkv: int = 2
    D: int = 32
    W: int = 8
    tau: tuple[float, ...] | None = None  # per head; None: a mix of signs away from -1
    noncontig: bool = False
    slow: bool = False


CASES = [
    KVCase("decode_one_key", seqlens=(1,)),
    KVCase("decode_ragged", seqlens=(37, 1, 64)),  # unequal lengths; 37: no tile's multiple
    KVCase("decode_mha", seqlens=(29, 50), H=3, Hkv=3),
    KVCase("decode_gqa4_d64", seqlens=(70,), H=8, Hkv=2, D=64, W=16),
    KVCase("decode_d128", seqlens=(45, 90), H=4, Hkv=1, D=128, W=32),
    KVCase("prefill_lq7", seqlens=(7, 45), Lq=7, H=4, Hkv=1),
    KVCase("prefill_lq64", seqlens=(64, 100), Lq=64, H=2, Hkv=1, W=16),
    KVCase("w_beyond_cache", seqlens=(50, 9), W=200),
    KVCase("tau_positive", seqlens=(33, 18), Lq=3, tau=(0.3, 0.05, 1.0, 0.6)),
    KVCase("tau_minus1_and_below", seqlens=(5, 40), Lq=5, tau=(-1.0, -1.5, -3.0, -1.2)),
    KVCase("noncontig", seqlens=(30, 41), Lq=2, noncontig=True),
    KVCase("long_1000", seqlens=(1000, 333), H=2, Hkv=1, D=16, W=64),
    KVCase("long_8192", seqlens=(8192, 4097), H=2, Hkv=1, D=16, W=512, extra=0, slow=True),
    KVCase("prefill_lq64_long", seqlens=(2000, 64), Lq=64, H=4, Hkv=2, D=16, W=100, slow=True),
]
CASE = {c.name: c for c in CASES}


@dataclass(frozen=True)
class Path:
    """A way through the Triton launcher: ``splits``/``keep``/``fuse`` as its forward takes them (None: its own
    choice)."""
    name: str
    splits: int | None = None
    keep: bool | None = None
    fuse: bool | None = None

    def overrides(self) -> dict:
        return {k: v for k, v in (("splits", self.splits), ("keep", self.keep), ("fuse", self.fuse)) if v is not None}


TRITON_PATHS = [Path("auto"), Path("one_split", splits=1), Path("one_split_two_kernels", splits=1, fuse=False),
                Path("recompute", splits=3, keep=False), Path("keep", splits=2, keep=True),
                Path("one_split_recompute", splits=1, keep=False)]
# the cases every Triton path runs on in the quick suite (the rest: "auto" only, other paths marked slow)
QUICK_PATH_CASES = {"decode_one_key", "decode_ragged", "prefill_lq7", "tau_positive", "noncontig"}


def make_inputs(case: KVCase, dtype: torch.dtype, device: str = DEVICE, seed: int = 0):
    """(q, k_cache, v_cache, bias, tau, seqlens_k int32, scale); cache slots at or past n_b are NaN."""
    g = torch.Generator().manual_seed(seed)
    B, S = len(case.seqlens), max(case.seqlens) + case.extra

    def rnd(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=g)

    q = rnd(B, case.H, case.Lq, case.D)
    k, v = rnd(B, case.Hkv, S, case.D), rnd(B, case.Hkv, S, case.D)
    for b, n in enumerate(case.seqlens):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    if case.noncontig:  # heads inner (a [B, S, Hkv, D] cache) and a capacity slice of a longer buffer
        k = torch.cat([k, rnd(B, case.Hkv, 5, case.D)], 2).transpose(1, 2).contiguous().transpose(1, 2)[:, :, :S]
        v = torch.cat([v, rnd(B, case.Hkv, 5, case.D)], 2).transpose(1, 2).contiguous().transpose(1, 2)[:, :, :S]
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    bias = rnd(case.H, case.W, scale=0.5)
    if case.tau is not None:
        tau = torch.tensor(case.tau)
    else:
        tau = torch.rand(case.H, generator=g) * 1.6 - 1.3
        tau = torch.where((tau + 1).abs() < 0.05, tau + 0.1, tau)
    seqlens = torch.tensor(case.seqlens, dtype=torch.int32)
    q, k, v = (t.to(dtype).to(device) for t in (q, k, v))
    return q, k, v, bias.to(device), tau.to(device), seqlens.to(device), case.D ** -0.5


def definition(q, k_cache, v_cache, bias, tau, seqlens_k, scale) -> torch.Tensor:
    """SPEC section 5 by its definition, float64: each batch row's queries as the last Lq rows of golden lazy
    attention over its first n_b tokens (the earlier rows' queries are zeros; causal rows do not mix)."""
    B, H, Lq, D = q.shape
    out = torch.empty(B, H, Lq, D, dtype=torch.float64, device=q.device)
    for b, n in enumerate(seqlens_k.tolist()):
        q_full = torch.zeros(1, H, n, D, dtype=torch.float64, device=q.device)
        q_full[0, :, n - Lq:] = q[b].double()
        o, _ = golden_attention.forward(q_full, k_cache[b:b + 1, :, :n].double(), v_cache[b:b + 1, :, :n].double(),
                                        bias.double(), tau.double(), scale, None, True)
        out[b] = o[0, :, n - Lq:]
    return out


@functools.lru_cache(maxsize=4)
def _reference(case: KVCase, dtype: torch.dtype):
    inp = make_inputs(case, dtype)
    return inp, definition(*inp)


def _forward(backend: str, inp, path: Path | None = None) -> torch.Tensor:
    try:
        mod = importlib.import_module(MODULES[backend])
    except ImportError as e:
        pytest.skip(f"{backend}: cannot import ({e})")
    return mod.forward(*inp, **(path.overrides() if path is not None else {}))


def _skip_reason(backend: str, dtype: torch.dtype, case: KVCase) -> str | None:
    if backend == "golden":
        return None
    if dtype == torch.float64:
        return f"{backend}: no float64 kernels"
    if backend == "tilelang":
        if DEVICE != "cuda":
            return "tilelang: runs on a CUDA device only (its builds are checked in test_tilelang_build_kvcache.py)"
        if dtype == torch.float32:
            return "tilelang: fp16 and bf16 only"
        if case.D not in (64, 128):
            return f"tilelang: head dim {case.D} not in (64, 128)"
    return None


def _compare(got: torch.Tensor, ref: torch.Tensor, tol: float) -> list[str]:
    """Failures of the whole tensor, of each batch row and of each head (a kernel right for one only fails)."""
    failures = []
    assert got.shape == ref.shape, f"shape {tuple(got.shape)} != {tuple(ref.shape)}"
    for label, a, r in ([("all", got, ref)] + [(f"batch row {b}", got[b], ref[b]) for b in range(got.shape[0])]
                        + [(f"head {h}", got[:, h], ref[:, h]) for h in range(got.shape[1])]):
        err = rel_err(a, r)
        if err > tol:
            failures.append(f"{label}: rel err {err:.3e} > tol {tol:.3e}")
    return failures


def _params():
    for case in CASES:
        marks = (pytest.mark.slow,) if case.slow else ()
        for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
            name = str(dtype)[6:]
            yield pytest.param("golden", case, dtype, None, id=f"golden-{case.name}-{name}", marks=marks)
            if dtype != torch.float64:
                yield pytest.param("tilelang", case, dtype, None, id=f"tilelang-{case.name}-{name}", marks=marks)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for path in TRITON_PATHS:
                if path.name != "auto" and dtype != torch.float16:
                    continue
                slow = case.slow or (path.name != "auto" and case.name not in QUICK_PATH_CASES)
                yield pytest.param("triton", case, dtype, path, id=f"triton-{path.name}-{case.name}-{str(dtype)[6:]}",
                                   marks=(pytest.mark.slow,) if slow else ())


@pytest.mark.parametrize("backend,case,dtype,path", list(_params()))
def test_matches_definition_float64(backend, case, dtype, path):
    reason = _skip_reason(backend, dtype, case)
    if reason:
        pytest.skip(reason)
    inp, ref = _reference(case, dtype)
    got = _forward(backend, inp, path)
    assert got.dtype == dtype and got.is_contiguous(), f"o: {got.dtype}, contiguous {got.is_contiguous()}"
    tol = 1e-12 if dtype == torch.float64 else tolerance("lazy_attention", dtype, "o")
    failures = _compare(got, ref, tol)
    assert not failures, "; ".join(failures)


def _backends_for(dtype, case):
    return [pytest.param(b, marks=pytest.mark.skipif(bool(_skip_reason(b, dtype, case)),
                                                     reason=str(_skip_reason(b, dtype, case))))
            for b in MODULES]


@pytest.mark.parametrize("backend", _backends_for(torch.float16, CASE["tau_minus1_and_below"]))
def test_one_key_rows_at_tau_minus1_are_exactly_zero(backend):
    """tau = -1 exactly: the query at position 0 (n_b = Lq) sees one key, P = 1 and relu(1 - 1) = 0, so its row
    is exactly zero; an ulp of rounding in P must not leak through the relu. With tau <= -1 too for every head."""
    case = KVCase("one_key_rows", seqlens=(3, 20), Lq=3, extra=2, tau=(-1.0, -1.0, -1.5, -1.0), D=64)
    inp = make_inputs(case, torch.float16)
    got = _forward(backend, inp, None if backend != "triton" else Path("split", splits=2))
    assert (got[0, :, 0] == 0).all(), "o: the query at position 0 (one visible key) is not exactly zero"
    decode = KVCase("one_key_decode", seqlens=(1, 6), tau=(-1.0, -1.0, -1.5, -1.0), D=64)
    got = _forward(backend, make_inputs(decode, torch.float16))
    assert (got[0] == 0).all(), "o: a decode step over a single cached key is not exactly zero at tau <= -1"


@pytest.mark.parametrize("backend", _backends_for(torch.float32, CASE["prefill_lq7"]))
def test_nan_score_poisons_its_rows(backend):
    """A NaN in a visible key makes the scores of every query that sees it NaN; the relu must not hide them (NaN
    rows where the definition has them, the other rows equal to it)."""
    case = CASE["prefill_lq7"]
    q, k, v, bias, tau, seqlens, scale = make_inputs(case, torch.float32)
    k = k.clone()
    k[1, 0, 41] = float("nan")  # batch row 1 (n_b = 45): queries at positions 41..44 see it, 38..40 do not
    inp = (q, k, v, bias, tau, seqlens, scale)
    ref = definition(*inp)
    got = _forward(backend, inp, None if backend != "triton" else Path("split", splits=2))
    expected = torch.isnan(ref).any(-1)
    assert expected[1, :, 3:].all() and not expected[1, :, :3].any() and not expected[0].any()
    assert torch.equal(torch.isnan(got).any(-1), expected), "o: NaN rows differ from the definition's"
    err = rel_err(got[~expected], ref[~expected])
    assert err <= tolerance("lazy_attention", torch.float32, "o"), f"o outside the NaN rows: rel err {err:.3e}"


FUSED_CASES = [(n, torch.float16) for n in ("decode_ragged", "prefill_lq7", "tau_positive", "noncontig")] + [
    (n, dt) for n in ("decode_ragged", "prefill_lq7") for dt in (torch.bfloat16, torch.float32)]


@pytest.mark.parametrize("name,dtype", FUSED_CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in FUSED_CASES])
@pytest.mark.parametrize("keep", [True, False])
def test_fused_one_split_equals_the_two_passes_bitwise(name, dtype, keep):
    """With one split the fused kernel runs pass 1 and pass 2 in one program: the same operations in the same
    order, so the same bits as the two kernels (on a GPU the fused kernel's own tiles, ``ONE_SPLIT_TILES``, differ
    from the split kernels': there it must match the definition instead)."""
    inp, ref = _reference(CASE[name], dtype)
    fused = _forward("triton", inp, Path("fused", splits=1, keep=keep, fuse=True))
    two = _forward("triton", inp, Path("two", splits=1, keep=keep, fuse=False))
    if DEVICE == "cuda":  # 128-key tiles against 64: another order of the fp32 sums
        failures = _compare(fused, ref, tolerance("lazy_attention", dtype, "o"))
        assert not failures, "; ".join(failures)
    else:
        assert torch.equal(fused, two), f"o: max |fused - two kernels| = {(fused.float() - two.float()).abs().max():.3e}"


def test_split_count_fills_the_gpu_from_shapes():
    """The split count: enough programs for the policy's CTAs per SM, at most one split per min_keys keys of the
    capacity, one split when the batch alone fills the GPU (H100: 132 SMs; the Triton launcher's policy)."""
    from kernel_dispatch.backends.kvcache_splits import SplitPolicy, keep_scores, num_splits

    POLICY = SplitPolicy(ctas_per_sm=4, min_keys=128)
    sms = 132
    assert num_splits(8, 128 * 1024, sms, POLICY) * 8 >= POLICY.ctas_per_sm * sms - 8
    assert num_splits(8, 1024, sms, POLICY) == 1024 // POLICY.min_keys
    assert num_splits(64 * 8, 4096, sms, POLICY) == 1
    assert num_splits(16 * 8, 32 * 1024, sms, POLICY) == POLICY.ctas_per_sm * sms // 128
    assert num_splits(1, 1 << 20, sms, POLICY) == POLICY.max_splits
    FILL = SplitPolicy(ctas_per_sm=2, min_keys=128, one_split_fill=0.9)  # one program per row fills 90% of the SMs
    assert num_splits(16 * 8, 4096, sms, FILL) == 1 and num_splits(14 * 8, 4096, sms, FILL) == 2
    assert keep_scores(4, 128, 2) and not keep_scores(256, 128, 2)  # decode keeps its scores, Lq = 64 re-reads K
