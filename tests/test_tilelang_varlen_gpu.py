"""TileLang lazy_attention_varlen against its own fixed-length kernels, document by document (CUDA only).

The packed kernels run the fixed-length kernels' tiles in the same order on each document; only base addresses, the
grid and the stores differ. So a document's rows of O, LSE, dQ, dK and dV must equal, bit for bit, the fixed-length
launchers' on that document alone (B = 1, L = its length), and dbias, dtau their sums over the documents. A failure
names the output, the document, the head and the rows that differ, which tells the kernel at fault: LSE (the LSE
kernel), O with LSE right (the output kernel), dQ (row dot or dQ/Delta), dK and dV with dQ right (dK/dV).
The launchers are called directly, past the registry's refusals, so this runs whatever the registry says.
"""
from __future__ import annotations

import pytest
import torch

from kernel_dispatch.ops.lazy_attention_varlen_cases import CASES, VarlenCase, make_inputs

pytestmark = pytest.mark.gpu

BY_NAME = {c.name: c for c in CASES}
GPU_CASES = [
    BY_NAME["realistic_d128"],
    BY_NAME["realistic_gqa_noncausal"],
    BY_NAME["head_dim64"],
    VarlenCase("boundaries_d128", docs=(0, 1, 127, 129, 300, 0, 64, 513, 2), H=4, Hkv=2, D=128, W=200),
    VarlenCase("boundaries_d64_noncausal", docs=(1, 255, 257, 40, 0, 700), H=4, Hkv=4, D=64, W=96, causal=False),
]


def _first_difference(whole: torch.Tensor, alone: torch.Tensor) -> str:
    """'head h, rows [r0, r1] of the document, max |diff| x' for [rows, H, ...] tensors that differ."""
    diff = (whole.float() - alone.float()).abs()
    bad = diff.flatten(2).amax(-1) if diff.dim() > 2 else diff  # [rows, H]
    rows, heads = torch.nonzero(bad != 0, as_tuple=True)
    h = int(heads[0])
    rs = rows[heads == h]
    return f"head {h}, rows {int(rs.min())}..{int(rs.max())} of the document, max |diff| {float(diff.max()):.3e}"


@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_each_document_equals_the_fixed_length_kernels(case):
    from kernel_dispatch.backends.tilelang import lazy_attention as dense
    from kernel_dispatch.backends.tilelang import lazy_attention_varlen as packed

    inp = make_inputs(case, torch.bfloat16, "cuda", seed=7)
    t, kw = inp.tensors, inp.kwargs
    q, k, v, bias, tau, cu = t["q"], t["k"], t["v"], t["bias"], t["tau"], t["cu_seqlens"]
    scale, causal, do = q.shape[-1] ** -0.5, kw["causal"], inp.grads[0]
    o, lse = packed.forward(q, k, v, bias, tau, cu, kw["max_seqlen"], scale, causal)
    dq, dk, dv, dbias, dtau = packed.backward(do, q, k, v, bias, tau, o, lse, cu, kw["max_seqlen"], scale, causal)
    sum_dbias, sum_dtau = torch.zeros_like(dbias), torch.zeros_like(dtau)
    wrong = []
    bounds = cu.tolist()
    for d, (a, b) in enumerate(zip(bounds, bounds[1:])):
        if b == a:
            continue
        alone = [x[a:b].transpose(0, 1)[None] for x in (q, k, v, do)]
        o_d, lse_d = dense.forward(*alone[:3], bias, tau, scale, None, causal)
        dq_d, dk_d, dv_d, db_d, dt_d = dense.backward(alone[3], *alone[:3], bias, tau, o_d, lse_d, scale, None,
                                                      causal)
        sum_dbias += db_d
        sum_dtau += dt_d
        pairs = (("lse", lse[:, a:b].T, lse_d[0].T), ("o", o[a:b], o_d[0].transpose(0, 1)),
                 ("dq", dq[a:b], dq_d[0].transpose(0, 1)), ("dk", dk[a:b], dk_d[0].transpose(0, 1)),
                 ("dv", dv[a:b], dv_d[0].transpose(0, 1)))
        for name, whole, single in pairs:
            if not torch.equal(whole, single):
                wrong.append(f"{name}: document {d} (tokens [{a}, {b})): {_first_difference(whole, single)}")
    assert not wrong, "packed differs from each document alone:\n" + "\n".join(wrong)
    torch.testing.assert_close(dbias, sum_dbias, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dtau, sum_dtau, rtol=1e-5, atol=1e-6)
