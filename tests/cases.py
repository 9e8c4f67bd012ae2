"""The test suite's names for the declared cases and the matrix's runner (kernel_dispatch.testing.matrix).

Every case makes fresh random inputs from its seed; the runner calls the public op with ``backend=`` and
returns the named forward outputs and input gradients, so every backend (and golden float64, the
reference) goes through identical code. Cases, input makers and tolerances live in each operator's
declaration (kernel_dispatch/ops/).
"""
from kernel_dispatch.ops.lazy_attention_cases import (KINK_MARGIN, AttnCase, away_from_kink,  # noqa: F401
                                                      rows_near_kink)
from kernel_dispatch.ops.mhc_cases import MHCCase  # noqa: F401
from kernel_dispatch.testing.matrix import Inputs, make_inputs, poison_cuda_cache, run, upcast  # noqa: F401
from kernel_dispatch import declaration

CASES = {op: declaration.operator(op).cases for op in declaration.operators()}
ATTN_CASES = CASES["lazy_attention"]
MHC_CASES = CASES["mhc_pre"]
