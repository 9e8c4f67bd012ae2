"""Operator front ends: signature, input validation, autograd, custom ops."""
from .lazy_attention import lazy_attention
from .mhc_post import mhc_post
from .mhc_pre import mhc_pre

__all__ = ["lazy_attention", "mhc_pre", "mhc_post"]
