"""The kernel launchers' shared input check names the argument, the backend and what it supports."""
import pytest
import torch

from kernel_dispatch.backends._checks import check_query
from kernel_dispatch.backends.cute import lazy_attention as cute_attn
from kernel_dispatch.backends.tilelang import lazy_attention as tilelang_attn

DTYPES, HEAD_DIMS = (torch.float16, torch.bfloat16), (64, 128)


def test_cpu_query_is_refused_by_name():
    with pytest.raises(ValueError, match=r"q: the cute backend needs a CUDA tensor, got device cpu"):
        check_query(torch.zeros(1, 1, 2, 64, dtype=torch.float16), "cute", DTYPES, HEAD_DIMS)


@pytest.mark.parametrize("launcher", [cute_attn, tilelang_attn])
def test_launchers_refuse_what_their_kernels_lack(launcher):
    q = torch.zeros(1, 1, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="needs a CUDA tensor"):
        launcher.forward(q, q, q, torch.zeros(1, 4), torch.zeros(1), 0.125, None, True)


def test_dtype_and_head_dim_are_named():
    with pytest.raises(TypeError, match=r"supports float16 and bfloat16, got torch.float32"):
        check_query(torch.zeros(1, 64), "TileLang", DTYPES, HEAD_DIMS)
    with pytest.raises(ValueError, match=r"head dims \(64, 128\), got D = 96"):
        check_query(torch.zeros(1, 96, dtype=torch.float16), "TileLang", DTYPES, HEAD_DIMS)
