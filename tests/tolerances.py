"""The one tolerance table: per operator, dtype and tensor, derived from rounding.

A case passes when ||out - ref|| / ||ref|| <= tol, ref being the golden backend in float64 on
the same (already rounded) inputs. For inputs of dtype ``dt`` with unit roundoff u(dt):

    tol = c_round * u(dt) + c_acc * u(fp32) + c_tf32 * u(tf32)   (the last only for TF32 GEMMs)

- c_round counts the roundings to dt a correct kernel may make on the way (the stored output,
  the probabilities rounded to dt before the P @ V and dS @ K products of a flash kernel,
  dS rounded to dt), with a factor 2 of margin.
- c_acc bounds fp32 accumulation and exp/log error, amplified by softmax's sensitivity to
  scores of size ~10 and reductions over up to a few thousand terms (sqrt growth).
- c_tf32 applies where a backend declares its fp32 GEMM in TF32 (mhc_pre's h_mix).
"""
import torch

UNIT_ROUNDOFF = {
    torch.float64: 2.0 ** -53,
    torch.float32: 2.0 ** -24,
    torch.float16: 2.0 ** -11,
    torch.bfloat16: 2.0 ** -8,
}
U_FP32 = 2.0 ** -24
U_TF32 = 2.0 ** -11

# (c_round, c_acc, c_tf32) per operator and tensor.
TABLE = {
    "lazy_attention": {
        "o": (4, 256, 0), "dq": (8, 1024, 0), "dk": (8, 1024, 0), "dv": (8, 1024, 0),
        "dbias": (8, 1024, 0), "dtau": (8, 1024, 0),
    },
    "mhc_pre": {
        "h_in": (2, 64, 1), "h_post": (1, 64, 1), "h_res": (1, 256, 2),
        "dx": (4, 256, 2), "dphi": (2, 256, 2), "dalpha": (2, 256, 2), "dbias": (2, 256, 2), "dgamma": (2, 256, 2),
    },
    "mhc_post": {
        "out": (2, 16, 0), "df": (2, 64, 0), "dx": (2, 64, 0), "dh_post": (2, 64, 0), "dh_res": (2, 64, 0),
    },
}


def tolerance(op: str, dtype: torch.dtype, tensor: str, tf32: bool = False) -> float:
    """The relative-error bound for ``tensor`` of ``op`` computed from ``dtype`` inputs."""
    c_round, c_acc, c_tf32 = TABLE[op][tensor]
    return c_round * UNIT_ROUNDOFF[dtype] + c_acc * U_FP32 + (c_tf32 * U_TF32 if tf32 else 0.0)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (ref == 0 everywhere: the absolute error)."""
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(out64).all():
        return float("inf")
    den = ref64.norm().item()
    num = (out64 - ref64).norm().item()
    return num / den if den > 0 else num
