"""mHC stream recompute (kernel_dispatch.mhc_recompute): same gradients bit for bit, less memory kept.

The streams x_l of all but the first wrapper of each block are dropped after the forward and rebuilt in
the backward; the gradients must be bitwise those without recompute (golden, and Triton through its
interpreter), and the memory the forward leaves allocated must shrink by exactly those tensors (measured
with the profiler's allocation records: memory really freed, not just a hook that counts).
"""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import kernel_dispatch as kd
from kernel_dispatch.mhc_recompute import StreamRecompute, optimal_block
from kernel_dispatch import registry
from kernel_dispatch.nn import MHC, LazyAttention, PackedDocuments, PreNorm, RMSNorm, SwiGLU, expand_streams
from kernel_dispatch.training import config as tcfg
from kernel_dispatch.training import loop

N = 4


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def _stack(wrappers, D, sinkhorn_iters=20, seed=0):
    """Alternating attention and MLP sublayers, each in an mHC wrapper, as in the training model."""
    torch.manual_seed(seed)
    layers = []
    for i in range(wrappers):
        sub = (LazyAttention(D, n_heads=2, max_bias_length=4) if i % 2 == 0 else SwiGLU(D, 2 * D))
        layers.append(MHC(PreNorm(RMSNorm(D), sub), dim=D, n_streams=N, sinkhorn_iters=sinkhorn_iters,
                          alpha_init=0.5))
    return torch.nn.ModuleList(layers)


def _run(layers, x, block, **kwargs):
    recompute = StreamRecompute(block) if block else None
    for i, layer in enumerate(layers):
        x = layer(x, recompute=recompute, **(kwargs if i % 2 == 0 else {}))  # kwargs: for attention only
    return x


def _grads(layers, x, block, do, retain=False, **kwargs):
    out = _run(layers, x, block, **kwargs)
    return torch.autograd.grad(out, [x, *layers.parameters()], do, retain_graph=retain), out


def _inputs(shape, D, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = expand_streams(torch.randn(*shape, D, generator=g), N) + 0.1 * torch.randn(*shape, N, D, generator=g)
    return x.requires_grad_(), torch.randn(*shape, N, D, generator=g)


def _assert_bitwise(got, ref, layers):
    names = ["x"] + [n for n, _ in layers.named_parameters()]
    for name, g, r in zip(names, got, ref):
        assert torch.equal(g, r), name


@pytest.mark.parametrize("block", [1, 2, 3, 5, 7])
def test_golden_gradients_are_bitwise_equal(block):
    layers = _stack(5, D=16)
    x, do = _inputs((2, 6), 16)
    with kd.use_backend("golden"):
        ref, out_ref = _grads(layers, x, 0, do)
        got, out = _grads(layers, x, block, do)
    assert torch.equal(out, out_ref)
    _assert_bitwise(got, ref, layers)


def test_packed_documents_reach_the_sublayers_under_recompute():
    layers = _stack(4, D=16)
    x, do = _inputs((11,), 16)
    docs = PackedDocuments.from_cu_seqlens(torch.tensor([0, 4, 4, 11], dtype=torch.int32), 11)
    with kd.use_backend("golden"):
        ref, _ = _grads(layers, x, 0, do, documents=docs)
        got, _ = _grads(layers, x, 4, do, documents=docs)
    _assert_bitwise(got, ref, layers)


def test_triton_interpreter_gradients_are_bitwise_equal():
    """mHC through Triton (interpreter); the forward runs in a backend scope the backward has left."""
    layers = _stack(3, D=16, sinkhorn_iters=3)
    x, do = _inputs((1, 4), 16)
    results = []
    for block in (0, 3):
        with kd.use_backend(lazy_attention="golden", mhc="triton"):
            m = layers[0]
            assert kd.which_backend("mhc_pre", x, m.phi, m.alpha, m.bias, m.gamma).forward == "triton"
            out = _run(layers, x, block)
        results.append(torch.autograd.grad(out, [x, *layers.parameters()], do))
    _assert_bitwise(results[1], results[0], layers)


def test_a_second_backward_rebuilds_again():
    layers = _stack(4, D=16)
    x, do = _inputs((2, 5), 16)
    with kd.use_backend("golden"):
        ref, _ = _grads(layers, x, 0, do)
        out = _run(layers, x, 4)
    first = torch.autograd.grad(out, [x, *layers.parameters()], do, retain_graph=True)
    second = torch.autograd.grad(out, [x, *layers.parameters()], do)
    _assert_bitwise(first, ref, layers)
    _assert_bitwise(second, ref, layers)


def _bytes_left_by_forward(layers, x, block):
    """Bytes the forward leaves allocated (its output plus what autograd keeps), from the allocation records."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = _run(layers, x, block)
    total = sum(e.self_cpu_memory_usage for e in prof.events())
    del out
    return total


def test_forward_keeps_fewer_stream_tensors():
    """6 wrappers: a block keeps its first stream, so 6 - ceil(6 / block) stream tensors are freed."""
    layers = _stack(6, D=32)
    x, _ = _inputs((2, 32), 32)
    with kd.use_backend("golden"):
        _run(layers, x, 2)  # the first calls resolve and cache the backends
        without = _bytes_left_by_forward(layers, x, 0)
        for block, dropped in ((2, 3), (3, 4), (6, 5)):
            with_recompute = _bytes_left_by_forward(layers, x, block)
            assert without - with_recompute == dropped * x.nbytes, (block, without, with_recompute, x.nbytes)


def test_no_grad_ignores_it():
    layers = _stack(3, D=16)
    x, _ = _inputs((2, 3), 16)
    with kd.use_backend("golden"), torch.no_grad():
        assert torch.equal(_run(layers, x, 2), _run(layers, x, 0))


def test_misuse_is_an_error():
    with pytest.raises(ValueError, match="block: expected an int >= 1"):
        StreamRecompute(0)
    layers = _stack(2, D=16)
    x, _ = _inputs((1, 3), 16)
    recompute = StreamRecompute(2)
    with kd.use_backend("golden"):
        y = layers[0](x, recompute=recompute)
        with pytest.raises(ValueError, match="x: with mHC recompute, each wrapper must take the previous"):
            layers[1](y + 1, recompute=recompute)


def test_optimal_block():
    assert optimal_block(4, 24) == 4 and optimal_block(4, 4) == 2 and optimal_block(4, 1) == 1


@pytest.mark.parametrize("pack", [False, True])
def test_training_with_recompute_is_bitwise_the_same(pack, tmp_path):
    """train.mhc_recompute: the same losses and weights after a few steps, to the bit (2 layers: 4 wrappers)."""
    registry.set_yaml_backend("golden", "test")
    base = {"model": {"dim": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "max_bias_length": 16},
            "data": {"seq_len": 16, "pack": pack},
            "train": {"batch_size": 2, "max_steps": 3, "eval_interval": 100, "eval_batches": 1, "device": "cpu",
                      "progress": False, "plot": False}}
    runs = []
    for recompute in (False, True):
        cfg = tcfg.from_mapping(tcfg.apply_overrides(base, [("train.mhc_recompute", recompute),
                                                            ("train.out_dir", str(tmp_path / str(recompute)))]),
                                "test config")
        runs.append(loop.train(cfg))
    assert runs[1].summary["mhc_recompute"] == 2 and runs[0].summary["mhc_recompute"] == 0
    assert runs[1].history == runs[0].history
    for (name, a), b in zip(runs[0].model.state_dict().items(), runs[1].model.state_dict().values()):
        assert torch.equal(a, b), name


def test_memory_script_on_the_cpu(capsys):
    """The GPU measurement script at a tiny size on the CPU: the forward keeps exactly the dropped streams fewer."""
    from kernel_dispatch.training import memory

    args = ["--layers", "2", "--steps", "1", "--backend=golden", "--train.batch_size=2", "--data.seq_len=16",
            "--model.dim=32", "--model.n_heads=2", "--model.n_kv_heads=1", "--model.sinkhorn_iters=2"]
    assert memory.main(args) == 0
    out = capsys.readouterr().out
    assert "2 layers (4 mHC wrappers)" in out and "gradients bitwise equal: yes" in out
    assert "2 of 4 stream tensors dropped" in out  # block 2 (the default for n = 4, W = 4)
    stream_bytes = 2 * 16 * 4 * 32 * 4  # tokens * n * dim * fp32
    assert f"difference {2 * stream_bytes}, predicted {2 * stream_bytes}" in out
