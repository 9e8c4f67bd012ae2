"""Generation with the KV cache: greedy with the cache equals recomputing the whole forward, a batch of unequal
prompts equals each prompt alone, sampling is seeded, and the command line works from a train.py checkpoint."""
import pytest
import torch

from kernel_dispatch import generate as gen
from kernel_dispatch import registry
from kernel_dispatch.training import config as tcfg
from kernel_dispatch.training.model import LazyLM

PROMPTS = [b"It is a truth", b"Emma", b"The family of Dashwood had long been settled in Sussex"]


def _model(seed=0) -> LazyLM:
    torch.manual_seed(seed)
    cfg = tcfg.ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_bias_length=16)
    model = LazyLM(cfg).eval()
    with torch.no_grad():  # sharper than at init, so greedy choices are not near-ties
        model.head.weight.mul_(20)
        for m in model.modules():
            if hasattr(m, "tau"):
                m.tau.fill_(-0.6)
    return model


def _runnable(backend):
    facts = {"device": "cpu", "dtype": torch.float32, "head_dim": 8, "gqa": True, "bias_length": 16, "q_len": 1}
    return registry.why_not("lazy_attention_with_kvcache", backend, facts)


@pytest.mark.parametrize("backend", registry.BACKEND_NAMES)
def test_greedy_with_cache_equals_recomputing_the_forward(backend):
    if _runnable(backend):
        pytest.skip(f"{backend}: " + "; ".join(_runnable(backend)))
    model = _model()
    with registry.use_backend(lazy_attention_with_kvcache=backend):
        cached = torch.stack(list(gen.generate(model, PROMPTS[:1], 24)))[:, 0].tolist()
    assert cached == gen.greedy_without_cache(model, PROMPTS[0], 24)


def test_a_batch_of_unequal_prompts_equals_each_prompt_alone():
    model = _model()
    batch = torch.stack(list(gen.generate(model, PROMPTS, 16)), dim=1)
    for b, prompt in enumerate(PROMPTS):
        alone = torch.stack(list(gen.generate(model, [prompt], 16)), dim=1)[0]
        assert torch.equal(batch[b], alone), b


def test_sampling_is_seeded_and_top_k_keeps_the_k_most_likely():
    model = _model()
    sampling = gen.Sampling(temperature=1.0, top_k=3)
    a = torch.stack(list(gen.generate(model, PROMPTS[:2], 12, sampling, seed=5)))
    b = torch.stack(list(gen.generate(model, PROMPTS[:2], 12, sampling, seed=5)))
    assert torch.equal(a, b)
    logits = torch.tensor([[0.0, 5.0, 4.0, 3.0, -1.0]])
    draws = {int(sampling(logits, torch.Generator().manual_seed(s))) for s in range(200)}
    assert draws <= {1, 2, 3} and len(draws) == 3
    with pytest.raises(ValueError, match="temperature"):
        gen.Sampling(temperature=-1.0)


def test_command_line_generates_from_a_train_checkpoint(tmp_path, capsys):
    from kernel_dispatch.training import loop

    data = tcfg.apply_overrides({"model": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
                                           "max_bias_length": 16},
                                 "data": {"seq_len": 32},
                                 "train": {"batch_size": 2, "max_steps": 2, "eval_interval": 100, "eval_batches": 1,
                                           "warmup_steps": 1, "device": "cpu", "progress": False, "plot": False,
                                           "out_dir": str(tmp_path)}}, [])
    loop.train(tcfg.from_mapping(data, "test"))
    capsys.readouterr()
    ckpt = str(tmp_path / "ckpt.pt")
    assert gen.main(["--ckpt", ckpt, "--prompt", "It is", "--max-new-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("It is") and "tokens/s" in err
    assert gen.main(["--ckpt", ckpt, "--prompt", "a", "--prompt", "bc", "--max-new-tokens", "4", "--top-k", "5",
                     "--temperature", "0.8", "--seed", "1"]) == 0
    assert "--- prompt 1" in capsys.readouterr().out
    assert gen.main(["--ckpt", str(tmp_path / "missing.pt"), "--prompt", "x"]) == 2
    assert "generate.py: error: --ckpt" in capsys.readouterr().err
