"""The broadcast_q backward with the query block resident: one program per (kv sequence, head) holds
the one query sequence (Lq <= 128 rows: PMA's learned queries), its dO rows, LSE and delta on chip,
streams the sequence's K/V tiles through a pipelined loop, stores each tile's dK/dV and accumulates
dQ over the whole sequence, then adds that sum to dQ once.

Why: under broadcast_q every kv sequence attends with the same few query rows, so a kv-tile program
(``_bwd.dkdv_kernel``, or the Gluon backward on repeated queries) pays the query tile's loads, its
LSE/delta reads and a dQ reduction of Lq x D fp32 per 128 keys; at Lq = 32 the step's GEMMs are small
and the kernel is bound by those per-tile costs, not by the K/V traffic that is its floor. Here the
per-tile work is K/V in, dK/dV out and five GEMMs, and dQ costs one fp32 atomic add per element per
(sequence, head) program (B additions per element in all, in no fixed order: not bitwise repeatable,
so ``deterministic=True`` keeps the dQ pass of ``_bwd``). Programs take the sequences longest first
(``ORDER``), so the last wave holds short ones instead of a long tail.

MHA only (one query head per kv head: dK/dV of a program are complete, no reduction over a group).
P = exp2(s2 - LSE·log2e) as in ``_bwd``; rows past the computed rows or with no mass carry LSE +inf,
so their P and dS are 0; keys past k_len are neither read nor stored.
"""

import triton
import triton.language as tl

from ._common import seq_extent


@triton.jit
def bq_resident_bwd_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, DK, DV, CU_Q, CU_K, USED_K, ORDER,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dqt, stride_dqh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    TQ, TK, TO, K_CAP, ROWS_CAP, sm_scale, qk_scale2,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_USED_K: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    """Program (b, h): the query block is rows [q0, q1) of q (cu_q[0], cu_q[1], clamped), of which
    the first ``rows`` (ROWS_CAP) are computed; its output rows for sequence b start at b·(q1 - q0)
    (``_common.seq_extent``'s rule); keys [k0, k0 + k_len) of sequence b. Writes the dK, dV rows of
    those keys and adds this sequence's share to dQ (fp32)."""
    b = tl.load(ORDER + tl.program_id(0))  # longest sequences first (the launcher's order)
    h = tl.program_id(1)
    q0, _slot, _q_len, rows, o0, k0, k_len = seq_extent(
        b, CU_Q, CU_K, USED_K, USED_K, TQ, TK, K_CAP, ROWS_CAP, False, HAS_USED_K, True, False
    )
    if (k_len <= 0) | (rows <= 0):
        return
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < rows
    d_ok = offs_d < D
    q_rows = q0 + offs_m.to(tl.int64)
    o_rows = o0 + offs_m
    q = tl.load(Q + q_rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
    do = tl.load(DO + o_rows[:, None] * stride_dot + h * stride_doh + offs_d[None, :],
                 mask=m_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
    lse = tl.load(LSE + h * TO + o_rows, mask=m_ok, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    delta = tl.load(DELTA + h * TO + o_rows, mask=m_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in tl.range(0, k_len, BLOCK_N, num_stages=NUM_STAGES):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < k_len
        k_rows = k0 + offs_n.to(tl.int64)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k_ptrs = K + k_rows[:, None] * stride_kt + h * stride_kh + offs_d[None, :]
        v_ptrs = V + k_rows[:, None] * stride_vt + h * stride_vh + offs_d[None, :]
        kt = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        vt = tl.load(v_ptrs, mask=kv_mask, other=0.0)
        # keys x queries: Pᵀ and dSᵀ are the left operands of dV and dK straight from registers
        # keys past k_len load as zero rows: their Pᵀ/dSᵀ rows are never stored and meet zero K
        # rows in dQ, so they need no mask
        st = tl.dot(kt, tl.trans(q)) * qk_scale2
        pt = tl.exp2(st - lse2[None, :])
        dpt = tl.dot(vt, tl.trans(do))
        dst = (pt * (dpt - delta[None, :])).to(q.dtype)
        dv_t = tl.dot(pt.to(do.dtype), do)
        dk_t = tl.dot(dst, q)
        dq += tl.dot(tl.trans(dst), kt)
        tl.store(DK + k_rows[:, None] * stride_dkt + h * stride_dkh + offs_d[None, :],
                 (dk_t * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)  # fmt: skip
        tl.store(DV + k_rows[:, None] * stride_dvt + h * stride_dvh + offs_d[None, :],
                 dv_t.to(DV.dtype.element_ty), mask=kv_mask)  # fmt: skip
    tl.atomic_add(DQ + q_rows[:, None] * stride_dqt + h * stride_dqh + offs_d[None, :],
                  dq * sm_scale, mask=m_ok[:, None] & d_ok[None, :])  # fmt: skip
