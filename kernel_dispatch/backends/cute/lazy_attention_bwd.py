"""CuTe DSL lazy attention backward launcher (SPEC section 1); imports no DSL.

Two Hopper kernels: ``dq_sm90`` (``_lazy_attention_dq_sm90_kernel``, query-major, one sweep: the row constants
D0 = rowsum(dO * O) in its prologue, then Delta, the dtau row terms Rdiv = (1/i) sum_n Mk dA and dQ) then ``dkdv_sm90``
(``_lazy_attention_dkdv_sm90_kernel``, key-major: dK, dV summed over the GQA heads in a fixed order, and per-64-key
block dbias partials), a programmatic dependent launch of ``dq_sm90`` (its CTAs start as ``dq_sm90``'s last ones
run). ``dq_sm90`` zeroes the dbias partials and writes each 64-row block's sum of Rdiv beside them (Partial's last
column); dbias and dtau are one fixed-order fp32 sum of Partial here, so every output is bitwise reproducible (no
atomics).

The kernels read rows in whole 64-row tiles: when L is not a multiple of 64, or lengths are given, q, k, v, dO are
copied into zero-filled buffers of LP = ceil(L / 64) * 64 rows with positions >= lengths[b] zeroed (padding,
NaN included, never reaches a product); so is O, which only ``dq_sm90`` reads. Outputs are sliced back to L rows.
"""
import torch

from ._kept import full_lengths

TILE = 64


def _rows(t: torch.Tensor, dtype, L: int, LP: int, pad_mask) -> torch.Tensor:
    """``t`` [B, X, L, D] as a contiguous [B, X, LP, D] of ``dtype``, rows >= L and masked positions zero."""
    t = t.to(dtype)
    if LP == L and pad_mask is None:
        t = t.contiguous()
        return t if t.data_ptr() % 16 == 0 else t.clone()  # TMA needs a 16-byte aligned base
    out = torch.zeros(t.shape[0], t.shape[1], LP, t.shape[3], dtype=dtype, device=t.device)
    out[:, :, :L] = t
    if pad_mask is not None:
        out.masked_fill_(pad_mask[:, None, :, None], 0)
    return out


def backward(kernel, do, q, k, v, bias, tau, o, lse, scale: float, lengths, causal: bool):
    """(dq, dk, dv, dbias, dtau): dq/dk/dv in q/k/v's dtypes [B, H|Hkv, L, D] contiguous, dbias [H, W] and dtau [H]
    in bias/tau's dtypes. ``kernel(name)`` gives the loaded kernel ("dq", "dkdv") for this head dim, dtype, mask.
    o [B, H, L, D] (the forward output, taken in q's dtype) gives the row constants D0 = rowsum(dO * O) that
    ``dq_sm90`` computes for its one-sweep dQ; lse [B, H, L] fp32 natural log."""
    B, H, L, D = q.shape
    Hkv = k.shape[1]
    W = bias.shape[1]
    dev, dt = q.device, q.dtype
    LP = -(-L // TILE) * TILE
    if lengths is None:
        lens = full_lengths(dev, B, L)
        pad_mask = None
    else:
        lens = lengths.to(device=dev, dtype=torch.int32).contiguous()
        pad_mask = torch.arange(LP, device=dev)[None, :] >= lens[:, None]
    qp, kp, vp, dop, op = (_rows(t, dt, L, LP, pad_mask) for t in (q, k, v, do, o))
    if LP == L and lse.dtype == torch.float32 and lse.is_contiguous() and lse.data_ptr() % 16 == 0:  # TMA loads it
        lse_p = lse
    else:
        lse_p = torch.zeros(B, H, LP, dtype=torch.float32, device=dev)
        lse_p[..., :L] = lse
    bias32 = bias.to(torch.float32).contiguous()
    tau32 = tau.to(torch.float32).contiguous()
    delta = torch.empty(B, H, LP, dtype=torch.float32, device=dev)
    dq = torch.empty(B, H, LP, D, dtype=dt, device=dev)
    dk = torch.empty(B, Hkv, LP, D, dtype=dt, device=dev)
    dv = torch.empty(B, Hkv, LP, D, dtype=dt, device=dev)
    WP = min(W, L)
    # per 64-row block (b, h, block): the dbias entry P0 + m - n per distance m - n (causal only 0 .. WP - 1, P0 = 0;
    # else -(WP - 1) .. WP - 1, P0 = WP - 1), then the block's sum of Rdiv; the kernels zero and write all of it
    n_dist = WP if causal else 2 * WP - 1
    partial = torch.empty(B, H, LP // TILE, n_dist + 1, dtype=torch.float32, device=dev)
    s = float(scale)
    kernel("dq_sm90")(qp, kp, vp, dop, lse_p, op, bias32, tau32, lens, dq, delta, partial, s)
    kernel("dkdv_sm90")(qp, kp, vp, dop, lse_p, delta, bias32, tau32, lens, dk, dv, partial, int(L), s)
    # one fp32 reduction for both: a float64 sum would first copy Partial to float64 (a 2x larger copy kernel, 25 us
    # of a 3 ms step at B=4, H=16, L=4096); per (b, h), then over the batch in float64, they take 50 us in 8 kernels
    full = partial.sum((0, 2))  # [H, n_dist + 1]
    dbias, dtau = full[:, :n_dist], full[:, n_dist]
    if not causal:
        dbias = full[:, WP - 1:n_dist].clone()
        if WP > 1:
            dbias[:, 1:] += full[:, :WP - 1].flip(-1)
    if WP < W:  # distances >= L: no pair of positions is that far apart
        dbias = torch.nn.functional.pad(dbias, (0, W - WP))
    if LP != L:
        dq, dk, dv = (t[:, :, :L].contiguous() for t in (dq, dk, dv))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbias.to(bias.dtype), dtau.to(tau.dtype)
