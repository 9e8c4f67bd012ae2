"""Fine-tune a tiny random transformers model with lazy attention for a few steps, generate, save and reload.

    python examples/hf_finetune_generate.py                       # Llama, 30 steps on the CPU (under a minute)
    python examples/hf_finetune_generate.py --family qwen3 --device cuda --backend triton --steps 200

Byte-level: tokens are the bytes of data/austen.txt (vocabulary 256), so nothing is downloaded. The model is
built from a config (random weights), given lazy attention (a learnable bias over 64 distances per head,
tau = -1), trained with AdamW on random fixed-length windows of the text, then asked to continue a prompt with
generate() (dynamic cache: kd.lazy_attention_with_kvcache), saved with save_pretrained and reloaded with
kernel_dispatch.integrations.transformers.from_pretrained, which must generate the same text.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen3Config

from kernel_dispatch.integrations import transformers as kd_hf

TEXT = Path(__file__).resolve().parents[1] / "data" / "austen.txt"
CONFIGS = {"llama": LlamaConfig, "qwen3": Qwen3Config, "mistral": MistralConfig}


def tiny_config(family: str):
    extra = {"head_dim": 16} if family == "qwen3" else {"sliding_window": None} if family == "mistral" else {}
    return CONFIGS[family](vocab_size=256, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           bos_token_id=None, eos_token_id=None, pad_token_id=0, **extra)


def batches(data: torch.Tensor, batch: int, seq: int, device: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=g)
        yield torch.stack([data[s:s + seq] for s in starts.tolist()]).to(device)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=tuple(CONFIGS), default="llama")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--window", type=int, default=64, help="lazy attention bias length W")
    p.add_argument("--backend", default=None, help="kernel-dispatch backend (default: the usual selection)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompt", default="It is a truth universally acknowledged")
    p.add_argument("--new-tokens", type=int, default=48)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(args.family)).to(args.device)
    kd_hf.add_lazy_attention(model, window=args.window, tau_init=-1.0, backend=args.backend)
    data = torch.frombuffer(bytearray(TEXT.read_bytes()[:1_000_000]), dtype=torch.uint8).long()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    for step, ids in zip(range(args.steps), batches(data, args.batch, args.seq, args.device, seed=1)):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.3f}")

    model.eval()
    prompt = torch.tensor([list(args.prompt.encode())], device=args.device)
    greedy = dict(max_new_tokens=args.new_tokens, do_sample=False)
    out = model.generate(prompt, **greedy)
    text = bytes(out[0, prompt.shape[1]:].tolist()).decode("utf-8", errors="replace")
    print(f"prompt: {args.prompt!r}\ncontinuation: {text!r}")

    with tempfile.TemporaryDirectory() as path:
        model.save_pretrained(path)
        reloaded = kd_hf.from_pretrained(path, backend=args.backend).to(args.device)
        same = torch.equal(reloaded.generate(prompt, **greedy), out)
    print(f"reloaded from save_pretrained: {'same' if same else 'DIFFERENT'} continuation")
    if not same:
        raise SystemExit("the reloaded model generates differently")
    return {"losses": losses, "continuation": text}


if __name__ == "__main__":
    main()
