"""Operator front ends: signature, input validation, autograd, custom ops, and each operator's declaration."""
from .lazy_attention import lazy_attention
from .lazy_attention_varlen import lazy_attention_varlen
from .lazy_attention_with_kvcache import lazy_attention_with_kvcache
from .mhc_post import mhc_post
from .mhc_pre import mhc_pre

__all__ = ["lazy_attention", "lazy_attention_varlen", "lazy_attention_with_kvcache", "mhc_pre", "mhc_post"]
