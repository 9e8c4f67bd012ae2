"""The Triton backend's one autotune path, and the interpreter switch as a JIT constant.

A kernel declares its launch configs with :func:`autotune`: one list, or one list per class of launch (what the
best tiles depend on besides the key: the dtypes, the head dim, the stream count) with ``class_of``, which names
a launch's class from its arguments. The launchers run every autotuned kernel through :func:`launch`:

- on CUDA, triton times the class's configs once per key (which holds a size class, :func:`size_class`) and
  caches the winner on disk (``cache_results``, triton >= 3.4);
- with ``KERNEL_DISPATCH_TRITON_CONFIG=i`` set, nothing is timed: config i of the class runs (the last one when
  i is past the end), for fast starts and for checking one config;
- under the interpreter (TRITON_INTERPRET=1) the kernel's one small interpreter config runs untimed.

On CUDA only the configs whose kernel, compiled for the device, fits its shared memory per block
(``shared_memory_per_block_optin``) take part: every config fits sm_90, the smaller GPUs (sm_80, sm_86, sm_89, sm_120)
run a subset (tests/test_triton_compile_archs.py), and :class:`NoFittingConfig` names the kernel when none fits.
"""
from __future__ import annotations

import functools
import inspect
import os
from typing import Callable, Hashable

import triton
import triton.language as tl

from ._interpret import INTERPRET

INTERPRETED = tl.constexpr(INTERPRET)  # the interpreter switch, for @triton.jit code
CONFIG_ENV = "KERNEL_DISPATCH_TRITON_CONFIG"  # unset: autotune; "i": run config i of the class, untimed


def disk_cache() -> dict:
    """``triton.autotune`` keyword arguments that cache the winners on disk (triton >= 3.4; {} before)."""
    return {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}


def size_class(n: int) -> int:
    """The autotuning class of a size (the mHC token count T, the attention sequence length L): its bit
    length, so each power-of-two band is tuned once (the best tiles and splits change with the size)."""
    return max(int(n), 1).bit_length()


def _ident(c: triton.Config) -> tuple:
    return tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages


class NoFittingConfig(RuntimeError):
    """No launch config of a kernel fits the shared memory per block of the device."""


@functools.lru_cache(maxsize=None)
def shared_memory_limit(device_index: int) -> int:
    """The shared memory one block may use on CUDA device ``device_index`` (the opt-in maximum), in bytes."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block)


def fitting(kernel, configs: list, args: dict) -> list:
    """The configs of ``configs`` whose kernel, compiled for the current CUDA device for a launch with ``args`` (every
    argument but the config's, by name), fits the device's shared memory per block. Raises NoFittingConfig if none
    does. Compiling here costs nothing extra: triton keeps the kernels for the launch or the timing that follows."""
    import torch

    limit = shared_memory_limit(torch.cuda.current_device())
    names = set(kernel.fn.arg_names)  # the autotuner's prune hook also hands over launch options (grid, ...)
    need = []
    for c in configs:
        kernel_args = {k: v for k, v in args.items() if k in names and k not in c.kwargs}
        need.append(kernel.fn.warmup(**kernel_args, **c.all_kwargs(), grid=(1,)).metadata.shared)
    fit = [c for c, n in zip(configs, need) if n <= limit]
    if not fit:
        raise NoFittingConfig(f"{kernel.fn.__name__}: no launch config fits the {limit} bytes of shared memory per "
                              f"block of {torch.cuda.get_device_name()} (they need {sorted(need)})")
    return fit


def autotune(configs, interpret_config: triton.Config, key: list[str],
             class_of: Callable[[dict], Hashable] | None = None):
    """Decorator: the ``@triton.jit`` kernel below, autotuned over ``configs`` (see the module docstring).

    Args:
        configs: a list of ``triton.Config``, or ``{class: list}`` when the configs depend on the launch.
        interpret_config: the one config the interpreter runs.
        key: the arguments whose values key the tuning (the size class among them).
        class_of: with a dict of configs, ``class_of(args)`` gives the class of a launch from its arguments by name
            (tensors, scalars and constexprs alike).
    """
    table = configs if isinstance(configs, dict) else None
    if table is not None and class_of is None:
        raise ValueError("class_of: required when configs is a dict of classes")
    shipped = (lambda args: table[class_of(args)]) if table is not None else (lambda args: list(configs))

    def decorate(fn):
        if INTERPRET:
            tuner = triton.autotune([interpret_config], key=key)(fn)
            tuner.class_configs = shipped
            return tuner
        union, seen = [], set()
        for cfgs in (table.values() if table is not None else [configs]):
            for c in cfgs:
                if _ident(c) not in seen:
                    seen.add(_ident(c))
                    union.append(c)

        def prune(cfgs, named_args, **kwargs):
            args = {**named_args, **kwargs}
            allowed = {_ident(c) for c in shipped(args)}
            return fitting(tuner, [c for c in cfgs if _ident(c) in allowed], args)

        tuner = triton.autotune(union, key=key, prune_configs_by={"early_config_prune": prune}, **disk_cache())(fn)
        tuner.class_configs = shipped
        return tuner

    return decorate


def shipped_configs(kernel, args: dict) -> list[triton.Config]:
    """The CUDA configs ``kernel`` (made by :func:`autotune`) chooses among for a launch with ``args`` (by name)."""
    return kernel.class_configs(args)


def candidates(kernel, args: dict) -> list[triton.Config]:
    """The configs a launch with ``args`` can run: the interpreter's (or a test's) only config, else the
    shipped ones of its class."""
    return list(kernel.configs) if len(kernel.configs) == 1 else shipped_configs(kernel, args)


_forced: dict = {}  # (kernel, launch class, device, index) -> the config CONFIG_ENV names


def launch(kernel, grid, *args, **kwargs) -> None:
    """Run ``kernel`` (made by :func:`autotune`) on ``grid``: autotuned, or the config CONFIG_ENV names (config i of
    those of its class that fit the device)."""
    forced = os.environ.get(CONFIG_ENV, "")
    if forced == "" or len(kernel.configs) == 1:
        kernel[grid](*args, **kwargs)
        return
    import torch

    named = {**dict(zip(kernel.arg_names, args)), **kwargs}  # a key argument left at its default counts as None
    key = (id(kernel), int(forced), torch.cuda.current_device(),
           *(named.get(k) for k in kernel.keys), *(str(v.dtype) for v in named.values() if hasattr(v, "dtype")))
    if key not in _forced:
        configs = fitting(kernel, shipped_configs(kernel, named), named)
        _forced[key] = configs[min(int(forced), len(configs) - 1)]
    kernel.fn[grid](*args, **kwargs, **_forced[key].all_kwargs())
