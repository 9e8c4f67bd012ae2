"""The tolerance formula and comparison (kernel_dispatch.testing.matrix); each operator declares its table."""
from kernel_dispatch import declaration
from kernel_dispatch.testing.matrix import UNIT_ROUNDOFF, U_FP32, U_TF32, rel_err, tolerance  # noqa: F401

TABLE = {op: dict(declaration.operator(op).tolerances) for op in declaration.operators()}
