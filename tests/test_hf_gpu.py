"""transformers models on a GPU in bf16 with the Triton and TileLang kernels.

The reference is the same model in float32 (the bf16 weights upcast, so both hold identical values); the
candidate is kernel-dispatch in bf16, and its error is bounded by the error of transformers' own bf16 path
against the same reference: at most twice it, plus two bf16 unit roundoffs (2 * 2^-8). Each parameter's
gradient error is relative to its own norm, or to 1e-3 of the whole gradient's norm where that is larger
(sums that cancel, see tests/test_hf_mhc.py).
- DeepSeek-V4 (tiny, tests/test_hf_mhc.py): kernel mHC against eager mHC, logits and every gradient.
- Llama (head dim 64, the kernels' shapes), tau = 0 and a zero bias: lazy attention against SDPA.
"""
from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers", minversion="5.23")

import torch  # noqa: E402

from kernel_dispatch.integrations import transformers as kd_hf  # noqa: E402
from kernel_dispatch.testing.matrix import rel_err  # noqa: E402

from .hf_tiny import tiny_model  # noqa: E402
from .test_hf_mhc import FLOOR, tiny_deepseek_v4  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

U_BF16 = 2.0 ** -8
BACKENDS = ("triton", "tilelang")


def _run(model, ids, labels=None):
    out = model(input_ids=ids, labels=ids if labels is None else labels)
    out.loss.backward()
    return out.logits.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()
                                         if p.grad is not None and ".lazy_attention." not in n}


def _errors(got, ref) -> dict[str, float]:
    (logits, g), (logits_ref, g_ref) = got, ref
    total = torch.cat([t.double().flatten() for t in g_ref.values()]).norm().item()
    errs = {"logits": rel_err(logits, logits_ref)}
    for name, r in g_ref.items():
        errs[name] = (g[name].double() - r.double()).norm().item() / max(r.double().norm().item(), FLOOR * total)
    return errs


def _assert_no_worse(candidate: dict, baseline: dict, what: str) -> None:
    for name, err in candidate.items():
        bound = 2 * baseline[name] + 2 * U_BF16
        assert err <= bound, f"{what}: {name} error {err:.2e} > {bound:.2e} (transformers' bf16: {baseline[name]:.2e})"


def _bf16_like_checkpoint(model):
    """bf16, with the modules transformers keeps in fp32 when it loads a checkpoint."""
    model = copy.deepcopy(model).cuda().to(torch.bfloat16)
    for name, module in model.named_modules():
        if any(name.endswith(k) for k in getattr(model, "_keep_in_fp32_modules_strict", None) or []):
            module.float()
    return model


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_mhc_bf16_no_worse_than_eager(backend):
    eager = _bf16_like_checkpoint(tiny_deepseek_v4())
    reference = copy.deepcopy(eager).float()
    ids = torch.randint(0, 128, (2, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    ref = _run(reference, ids)
    baseline = _errors(_run(eager, ids), ref)
    kernel = kd_hf.use_kernel_mhc(copy.deepcopy(eager), backend=backend)
    _assert_no_worse(_errors(_run(kernel, ids), ref), baseline, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lazy_attention_bf16_tau0_no_worse_than_sdpa(backend):
    sdpa = tiny_model("llama", torch.float32, hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=512).cuda().to(torch.bfloat16)
    reference = copy.deepcopy(sdpa).float()
    g = torch.Generator("cuda").manual_seed(2)
    ids = torch.randint(1, 128, (2, 96), device="cuda", generator=g)
    ref = _run(reference, ids)
    baseline = _errors(_run(sdpa, ids), ref)
    lazy = kd_hf.add_lazy_attention(copy.deepcopy(sdpa), window=16, tau_init=0.0, backend=backend)
    _assert_no_worse(_errors(_run(lazy, ids), ref), baseline, backend)


def test_static_cache_generate_on_gpu_equals_no_cache():
    """On a GPU generate() compiles the forward for a static cache (mode reduce-overhead): lazy attention runs
    eagerly between the compiled pieces and must give the tokens of the uncached path (golden both ways)."""
    from .hf_tiny import lazy_copy

    model = lazy_copy(tiny_model("llama", torch.float32), randomize_seed=5, backend="golden").cuda()
    ids = torch.randint(1, 128, (2, 6), device="cuda", generator=torch.Generator("cuda").manual_seed(4))
    greedy = dict(max_new_tokens=8, do_sample=False)
    want = model.generate(ids, use_cache=False, **greedy)
    assert torch.equal(model.generate(ids, cache_implementation="static", **greedy), want)
