"""CuTe DSL lazy attention forward launcher (SPEC section 1); imports no DSL.

Two kernels: ``lse_sm90`` (``_lazy_attention_lse_sm90_kernel``) writes each row's LSE, then ``fwd_sm90``
(``_lazy_attention_fwd_sm90_kernel``) reads it and writes O. ``kernel(short_name)`` gives the loaded TVM FFI function
for the current (head dim, dtype, causal); both run on torch's current stream (the TVM FFI environment stream), the
second a programmatic dependent launch of the first (its CTAs start on the SMs the first one's leave). Both are
persistent: one CTA per SM, each taking the next query block from a kept counter that the kernel's last claim sets
back to zero.
"""
import functools

import torch

from ._kept import full_lengths, tile_counters


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of CUDA ``device`` (the CTA count of a persistent kernel)."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _rows(t: torch.Tensor) -> torch.Tensor:
    """Contiguous with a 16-byte aligned base (TMA and the kernel's 128-bit stores need it)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def forward(kernel, q, k, v, bias, tau, scale: float, lengths, causal: bool):
    """O [B, H, L, D] (q's dtype, contiguous) and LSE [B, H, L] fp32 (natural log, golden's residual).

    q [B, H, L, D], k/v [B, Hkv, L, D] fp16/bf16 CUDA; bias [H, W], tau [H]; lengths [B] int or None.
    """
    B, H, L, D = q.shape
    if scale < 0:  # the kernels take the row max on unscaled q.k (need scale > 0); q.k * scale = (-q).k * -scale
        q, scale = -q, -scale
    elif scale == 0:  # (q * 0).k keeps a non-finite q's NaN, as q.k * 0 does
        q, scale = q * 0, 1.0
    qc, kc, vc = _rows(q), _rows(k.to(q.dtype)), _rows(v.to(q.dtype))
    bias32 = bias.to(device=q.device, dtype=torch.float32).contiguous()
    tau32 = tau.to(device=q.device, dtype=torch.float32).contiguous()
    if lengths is None:
        lens = full_lengths(q.device, B, L)
    else:
        lens = lengths.to(device=q.device, dtype=torch.int32).clamp(0, L).contiguous()
    lse = torch.empty(B, H, L, dtype=torch.float32, device=q.device)
    o = torch.empty(B, H, L, D, dtype=q.dtype, device=q.device)
    if B == 0 or H == 0 or L == 0:
        return o, lse
    counters = tile_counters(q.device)  # one per kernel: its CTAs' tile tickets
    ctas = sm_count(q.device)
    with torch.cuda.device(q.device):
        kernel("lse_sm90")(qc, kc, bias32, lens, lse, counters[0:1], ctas, float(scale))
        kernel("fwd_sm90")(qc, kc, vc, bias32, tau32, lens, lse, o, counters[1:2], ctas, float(scale))
    return o, lse
