"""kernel-dispatch inside Hugging Face transformers (>= 5.23): lazy attention and kernel mHC.

    from kernel_dispatch.integrations import transformers as kd_hf

    model = kd_hf.add_lazy_attention(model, window=512, tau_init=-1.0)   # any AttentionInterface decoder
    model.save_pretrained(path); model = kd_hf.from_pretrained(path)     # bias, tau and the choice kept
    model = kd_hf.use_kernel_mhc(deepseek_v4_model)                      # mHC through kd.mhc_pre / mhc_post

Importing this module registers the attention implementation ``"kernel_dispatch_lazy"`` (and its mask
function) with transformers.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

import torch
from torch import nn

try:
    import transformers
    from packaging.version import Version
except ImportError as e:  # pragma: no cover - the optional extra is missing
    raise ImportError("kernel_dispatch.integrations.transformers needs transformers >= 5.23: "
                      "pip install 'kernel-dispatch[hf]'") from e

MIN_TRANSFORMERS = "5.23"
if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
    raise ImportError(f"kernel_dispatch.integrations.transformers needs transformers >= {MIN_TRANSFORMERS}, found "
                      f"{transformers.__version__}: pip install 'kernel-dispatch[hf]'")

from transformers import PreTrainedModel  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

from .transformers_attention import (ATTN_IMPLEMENTATION, OPERATORS, PARAMS, LazyAttentionParameters,  # noqa: E402
                                     lazy_attention_forward)
from .transformers_mask import LazyAttentionUnsupportedError, lazy_attention_mask  # noqa: E402

CONFIG_KEY = "lazy_attention"  # model.config.lazy_attention = {"window": W, "tau_init": tau}

__all__ = ["add_lazy_attention", "from_pretrained", "use_kernel_mhc", "attention_modules", "register",
           "LazyAttentionParameters", "LazyAttentionUnsupportedError", "ATTN_IMPLEMENTATION"]


def register() -> None:
    """Register :data:`ATTN_IMPLEMENTATION` and its mask function with transformers (idempotent)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, lazy_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, lazy_attention_mask)


register()


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention modules of ``model`` that call transformers' attention interface (Llama-style)."""
    return [m for m in model.modules()
            if type(m).__name__.endswith("Attention") and all(hasattr(m, a) for a in ("layer_idx", "head_dim",
                                                                                        "scaling", "config"))]


def _check_backend(backend: Any) -> None:
    if backend is None or isinstance(backend, (str, tuple, list)):
        return
    if isinstance(backend, Mapping):
        unknown = sorted(set(backend) - set(OPERATORS))
        if unknown:
            raise ValueError(f"backend: unknown operator(s) {unknown}; expected keys among {list(OPERATORS)}")
        return
    raise TypeError(f"backend: expected None, a backend name, a (forward, backward) pair or a mapping from "
                    f"operator to either, got {type(backend).__name__}")


def _check_model(model: Any) -> None:
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model: expected a transformers PreTrainedModel, got {type(model).__name__}")
    if not model._can_set_attn_implementation():
        raise LazyAttentionUnsupportedError(
            f"model: {type(model).__name__} does not use transformers' AttentionInterface, so its attention "
            "cannot be replaced")
    config = model.config.get_text_config()
    if getattr(config, "is_causal", True) is False:
        raise LazyAttentionUnsupportedError("model: config.is_causal is False; lazy attention here is causal")
    if getattr(config, "attention_chunk_size", None) is not None:
        raise LazyAttentionUnsupportedError(
            f"model: chunked attention (config.attention_chunk_size = {config.attention_chunk_size}) is not lazy "
            "attention's causal pattern")


def add_lazy_attention(model: PreTrainedModel, window: int = 512, tau_init: float = -1.0, *,
                       backend: Any = None) -> PreTrainedModel:
    """Give every attention module learnable lazy-attention parameters and switch the model to them.

    Each attention module gets a child ``lazy_attention`` with ``bias`` [H, window] fp32 (zeros) and
    ``tau`` [H] fp32 (``tau_init``), on the module's device; the model's attention implementation becomes
    ``"kernel_dispatch_lazy"`` and ``model.config.lazy_attention`` records window and tau_init, so that
    ``save_pretrained`` keeps both and :func:`from_pretrained` rebuilds the model. Applying it again keeps
    the parameters (their window must match) and sets the backend.

    Args:
        model: a transformers decoder whose attention modules call the attention interface (Llama, Qwen3,
            Mistral, ...). A sliding window is accepted while no row is longer than it; beyond, calls raise.
        window: W, the number of causal distances with a learned bias (>= 1).
        tau_init: the initial Elastic-Softmax offset of every head (-1.0 in the paper; 0.0 with the zero
            bias makes the model compute plain softmax attention).
        backend: None (the usual selection: ``kd.use_backend``, environment, YAML, auto), a backend name or
            (forward, backward) pair for every operator, or a mapping from operator name
            (``lazy_attention``, ``lazy_attention_varlen``, ``lazy_attention_with_kvcache``) to a choice.

    Returns:
        the same model, modified in place.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window: expected an int >= 1, got {window!r}")
    if isinstance(tau_init, bool) or not isinstance(tau_init, (int, float)) or not math.isfinite(tau_init):
        raise ValueError(f"tau_init: expected a finite float, got {tau_init!r}")
    _check_backend(backend)
    _check_model(model)
    modules = attention_modules(model)
    if not modules:
        raise LazyAttentionUnsupportedError(f"model: {type(model).__name__} has no attention module that calls "
                                            "transformers' attention interface")
    register()
    for m in modules:
        heads = m.config.num_attention_heads
        existing = getattr(m, PARAMS, None)
        if existing is not None:
            if tuple(existing.bias.shape) != (heads, window):
                raise ValueError(f"window: the model already has lazy attention with bias shape "
                                 f"{list(existing.bias.shape)}, asked for [{heads}, {window}]")
            existing.backend = backend
            continue
        device = next(m.parameters()).device
        m.add_module(PARAMS, LazyAttentionParameters(heads, window, tau_init, device=device, backend=backend))
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    setattr(model.config, CONFIG_KEY, {"window": window, "tau_init": float(tau_init)})
    return model


def use_kernel_mhc(model: nn.Module, *, backend: Any = None, head: bool = True) -> nn.Module:
    """Run every DeepSeek-V4 hyper-connection of ``model`` through ``kd.mhc_pre`` / ``kd.mhc_post``.

    See :func:`kernel_dispatch.integrations.transformers_mhc.use_kernel_mhc` (imported here on first use, so
    that lazy attention works with a transformers that has no DeepSeek-V4).
    """
    try:
        from .transformers_mhc import use_kernel_mhc as swap
    except ImportError as e:
        raise ImportError(f"use_kernel_mhc needs transformers' DeepSeek-V4 (transformers {transformers.__version__} "
                          f"has none): {e}") from e
    return swap(model, backend=backend, head=head)


def _checkpoint_files(path: str, hub_kwargs: dict) -> dict[str, str]:
    """Tensor name -> safetensors file of a checkpoint directory or hub repository."""
    from transformers.utils import cached_file

    def find(name: str) -> str | None:
        if os.path.isdir(path):
            full = os.path.join(path, name)
            return full if os.path.isfile(full) else None
        return cached_file(path, name, _raise_exceptions_for_missing_entries=False, **hub_kwargs)

    index = find("model.safetensors.index.json")
    if index is not None:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {k: find(v) for k, v in weight_map.items()}
    single = find("model.safetensors")
    if single is None:
        raise FileNotFoundError(f"path: no model.safetensors(.index.json) in {path}")
    from safetensors import safe_open

    with safe_open(single, "pt") as f:
        return {k: single for k in f.keys()}


def _concrete_class(model_class: Any, config: Any) -> type:
    """The model class an Auto class picks for ``config``; any other class as it is."""
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is None:
        return model_class
    found = mapping[type(config)]
    if isinstance(found, (list, tuple)):
        names = set(getattr(config, "architectures", None) or [])
        found = next((c for c in found if c.__name__ in names), found[0])
    return found


_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")


def from_pretrained(path: str, *, model_class: Any = None, backend: Any = None, **kwargs: Any) -> PreTrainedModel:
    """Reload a model saved with ``save_pretrained`` after :func:`add_lazy_attention`: weights, bias, tau.

    ``model_class`` (default ``AutoModelForCausalLM``) loads the base weights with ``kwargs`` (dtype,
    device_map, ...); the lazy parameters are then added with the saved window and read from the same
    safetensors files in fp32.
    """
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    hub_kwargs = {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}
    config = kwargs.pop("config", None) or AutoConfig.from_pretrained(path, **hub_kwargs)
    spec = getattr(config, CONFIG_KEY, None)
    if not isinstance(spec, Mapping) or "window" not in spec:
        raise ValueError(f"path: {path} was not saved with lazy attention (config.{CONFIG_KEY} is missing); "
                         "load it with from_pretrained of transformers and call add_lazy_attention")
    model_class = _concrete_class(model_class or AutoModelForCausalLM, config)
    # A subclass that expects the lazy tensors to be left over (read below), so the load report is clean.
    ignore = [*(model_class._keys_to_ignore_on_load_unexpected or []), rf"\.{PARAMS}\.(bias|tau)$"]
    loader = type(model_class.__name__, (model_class,), {"_keys_to_ignore_on_load_unexpected": ignore})
    model = loader.from_pretrained(path, config=config, **kwargs)
    model.__class__ = model_class
    add_lazy_attention(model, window=int(spec["window"]), tau_init=float(spec.get("tau_init", -1.0)),
                       backend=backend)
    wanted = {name: p for name, p in model.named_parameters() if f".{PARAMS}." in name}
    files = _checkpoint_files(path, hub_kwargs)
    missing = sorted(set(wanted) - set(files))
    if missing:
        raise ValueError(f"path: the checkpoint in {path} lacks lazy attention tensors {missing[:4]}"
                         f"{' ...' if len(missing) > 4 else ''}")
    with torch.no_grad():
        for name, p in wanted.items():
            with safe_open(files[name], "pt") as f:
                p.copy_(f.get_tensor(name))
    return model
