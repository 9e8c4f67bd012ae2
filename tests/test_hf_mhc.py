"""Kernel mHC inside transformers' DeepSeek-V4: a tiny random model gives transformers' eager logits and
parameter gradients, golden in float32 and Triton through its interpreter.

Each parameter's gradient error is relative to its own norm, or to 1e-3 of the whole gradient's norm where
that is larger: a few gradients (the scale of the final hyper head: 1.4e-5, the whole gradient 3.8) are sums
that cancel, and their relative error measures the cancellation, not the kernel. The bound is 2^10 machine
epsilons of float32 (1.2e-4): eager and kernel mHC sum in another order (RMS norm folded after the GEMM,
closed-form Sinkhorn backward), nothing is approximated.
"""
from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers", minversion="5.23")

import torch  # noqa: E402
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM  # noqa: E402

import kernel_dispatch as kd  # noqa: E402
from kernel_dispatch.integrations import transformers as kd_hf  # noqa: E402
from kernel_dispatch.integrations.transformers_mhc import KernelMHCDecoderLayer, KernelMHCHyperHead  # noqa: E402
from kernel_dispatch.testing.matrix import rel_err  # noqa: E402

RTOL32 = 2.0 ** -23 * 2 ** 10
FLOOR = 1e-3


def tiny_deepseek_v4(seed: int = 0, layers: int = 2, dtype=torch.float32) -> DeepseekV4ForCausalLM:
    """hidden 64, 4 heads, 4 streams (hc_mult); 3 Sinkhorn iterations (short of convergence), rms_norm_eps 1e-5
    and hc_eps 1e-3, all distinct from the defaults so that a misrouted hyper-parameter shows; sliding-window
    attention and hash-routed experts, so no top-k choice can flip between two roundings. Hyper-connection
    scales and biases are random so that no mixing is uniform."""
    config = DeepseekV4Config(
        vocab_size=128, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, q_lora_rank=32, o_lora_rank=32, o_groups=2, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, index_n_heads=2, index_head_dim=16, index_topk=4,
        sliding_window=8, hc_mult=4, hc_sinkhorn_iters=3, hc_eps=1e-3, rms_norm_eps=1e-5, num_nextn_predict_layers=0,
        max_position_embeddings=256, layer_types=["sliding_attention"] * layers, mlp_layer_types=["hash_moe"] * layers)
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("_hc.base", "_hc.scale", "hc_head.hc_base", "hc_head.hc_scale")):
                p.normal_(0.0, 0.5)
        for name, buf in model.named_buffers():
            if name.endswith("gate.tid2eid"):  # distinct experts per token (the zeros of a fresh model pick one)
                buf.copy_(torch.rand(buf.shape[0], config.n_routed_experts).argsort(1)[:, :buf.shape[1]])
    return model.to(dtype)


def _ids(B: int, S: int, seed: int = 1):
    return torch.randint(0, 128, (B, S), generator=torch.Generator().manual_seed(seed))


def _run(model, ids):
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def assert_model_close(got, want, rtol: float, what: str) -> None:
    (logits, g), (logits_ref, g_ref) = got, want
    assert rel_err(logits, logits_ref) <= rtol, f"{what}: logits {rel_err(logits, logits_ref):.2e}"
    assert g.keys() == g_ref.keys()
    total = torch.cat([t.double().flatten() for t in g_ref.values()]).norm().item()
    for name, ref in g_ref.items():
        err = (g[name].double() - ref.double()).norm().item() / max(ref.double().norm().item(), FLOOR * total)
        assert err <= rtol, f"{what}: {name} gradient error {err:.2e} > {rtol:.1e}"


@pytest.mark.parametrize("backend,shape", [("golden", (2, 16)), ("triton", (1, 8))], ids=["golden", "triton"])
def test_kernel_mhc_equals_eager(backend, shape):
    eager = tiny_deepseek_v4()
    kernel = kd_hf.use_kernel_mhc(copy.deepcopy(eager), backend=backend)
    ids = _ids(*shape)
    assert_model_close(_run(kernel, ids), _run(eager, ids), RTOL32, backend)


def test_every_hyper_connection_runs_on_kernel_dispatch(monkeypatch):
    calls = {"mhc_pre": 0, "mhc_post": 0}
    for name in calls:
        real = getattr(kd.ops, name)

        def spy(*a, _name=name, _real=real, **k):
            calls[_name] += 1
            assert k["backend"] == "golden"
            return _real(*a, **k)

        monkeypatch.setattr(kd.ops, name, spy)
    model = kd_hf.use_kernel_mhc(tiny_deepseek_v4(), backend="golden")
    model(input_ids=_ids(1, 4))
    assert calls == {"mhc_pre": 2 * 2 + 1, "mhc_post": 2 * 2}  # two per layer, plus the head


def test_state_dict_and_classes():
    eager = tiny_deepseek_v4()
    kernel = kd_hf.use_kernel_mhc(copy.deepcopy(eager), head=False)
    assert list(kernel.state_dict()) == list(eager.state_dict())
    assert all(type(m) is KernelMHCDecoderLayer for m in kernel.model.layers)
    assert type(kernel.model.hc_head) is not KernelMHCHyperHead
    kd_hf.use_kernel_mhc(kernel, backend="golden")
    assert type(kernel.model.hc_head) is KernelMHCHyperHead and kernel.model.layers[0].kd_backend == "golden"
    eager.load_state_dict(kernel.state_dict())  # checkpoints stay transformers' own


def test_backend_selection_reaches_the_model(monkeypatch):
    model = kd_hf.use_kernel_mhc(tiny_deepseek_v4())
    ids = _ids(1, 4)
    with kd.use_backend(mhc="tilelang"):
        with pytest.raises(kd.BackendUnavailableError, match="tilelang"):
            model(input_ids=ids)
    monkeypatch.setenv("MHC_BACKEND", "tilelang")
    with pytest.raises(kd.BackendUnavailableError, match="tilelang"):
        model(input_ids=ids)
    kd_hf.use_kernel_mhc(model, backend="golden")
    model(input_ids=ids)


def test_bad_arguments():
    with pytest.raises(ValueError, match="DeepseekV4DecoderLayer"):
        kd_hf.use_kernel_mhc(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="backend"):
        kd_hf.use_kernel_mhc(tiny_deepseek_v4(layers=1), backend=3)
