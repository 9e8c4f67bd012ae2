"""What names one compiled CuTe DSL kernel: the static parameters a build fixes (sizes B, H, Hkv, L, W stay runtime
values). Shared by the build command, the prebuilt loader and the kernel modules; imports no DSL."""
from dataclasses import dataclass

ARCH = "sm_90a"
DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128)


@dataclass(frozen=True)
class KernelKey:
    """kernel: the kernel's short name in its module (``"lse"``, ``"fwd"``, ...); head_dim: D; dtype: ``"float16"``
    or ``"bfloat16"`` (q, k, v, o, do); causal: the mask compiled in."""

    kernel: str
    head_dim: int
    dtype: str
    causal: bool

    @property
    def name(self) -> str:
        """The exported function name (the shared object's symbol is ``__tvm_ffi_<name>``)."""
        return f"kd_lazy_attention_{self.kernel}_d{self.head_dim}_{self.dtype}_{'causal' if self.causal else 'full'}"
