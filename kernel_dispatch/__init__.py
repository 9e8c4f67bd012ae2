"""kernel-dispatch: lazy attention and mHC with golden, Triton and TileLang backends behind one API."""
from .config import ConfigError
from .declaration import Capabilities
from .ops import lazy_attention, lazy_attention_varlen, lazy_attention_with_kvcache, mhc_post, mhc_pre
from .registry import (BACKEND_NAMES, BackendUnavailableError, DoubleBackwardError, Resolution, load_config,
                       set_yaml_backend, support_table, use_backend)
from .explain import which_backend
from .declaration import operators as _operators

OPERATORS = _operators()  # the operators declared by kernel_dispatch itself

__all__ = [
    "lazy_attention", "lazy_attention_varlen", "lazy_attention_with_kvcache", "mhc_pre", "mhc_post", "use_backend", "which_backend", "load_config", "set_yaml_backend",
    "support_table", "BackendUnavailableError", "DoubleBackwardError", "ConfigError", "Capabilities", "Resolution", "BACKEND_NAMES",
    "OPERATORS",
]
__version__ = "0.1.0"
