"""Operator front ends: signature, input validation, autograd, custom ops, and each operator's declaration."""
from .lazy_attention import lazy_attention
from .lazy_attention_varlen import lazy_attention_varlen
from .mhc_post import mhc_post
from .mhc_pre import mhc_pre

__all__ = ["lazy_attention", "lazy_attention_varlen", "mhc_pre", "mhc_post"]
