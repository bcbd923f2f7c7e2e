"""Stage 2, sequential over chunks: carry the state S through a sequence and produce the outputs.

One program per (value-column block of BV, sequence, value head): the recurrence is separable along V, so
each program owns S[:, block] (K x BV, fp32, in registers) and, for each chunk of BT tokens, computes from
the stage-1 tensors (see chunk_prepare.py)

    U = U0 − W · S                  (corrected values of the chunk, BT x BV)
    O = Qg · S + Aqk · U            (outputs, written in the dtype of v)
    S = diag(gl) · S + Ktᵀ · U      (state at the end of the chunk)

The matrix products take S and U rounded to the stage-1 tensor dtype (bf16) with fp32 accumulation; S
itself stays fp32 from the initial state to the final state.
"""

import triton
import triton.language as tl

from .matmul import _mm


@triton.jit
def _chunk_recurrence_kernel(
    w, u, qg, kt, aqk, gl,
    h0, ht, o,
    cu_seqlens, chunk_offsets,
    T, T_total,
    s_state_k, s_state_v,
    HV, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, INTERPRET: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    n = i_nh // HV
    i_hv = i_nh % HV
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + n).to(tl.int32)
        eos = tl.load(cu_seqlens + n + 1).to(tl.int32)
        c_first = tl.load(chunk_offsets + n)
    else:
        bos = n * T
        eos = bos + T
        c_first = n * tl.cdiv(T, BT)
    n_chunks = tl.cdiv(eos - bos, BT)

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    # State element (kk, vv) of this (sequence, head) sits at kk * s_state_k + vv * s_state_v.
    p_state = (n * HV + i_hv) * K * V + o_k[:, None] * s_state_k + o_v[None, :] * s_state_v
    if HAS_H0:
        b_s = tl.load(h0 + p_state).to(tl.float32)
    else:
        b_s = tl.zeros([K, BV], dtype=tl.float32)

    mm_dtype = w.dtype.element_ty
    for c in range(n_chunks):
        rows = bos + c * BT + o_t
        m_t = rows < eos
        head_rows = i_hv * T_total + rows
        b_w = tl.load(w + head_rows[:, None] * K + o_k[None, :], mask=m_t[:, None], other=0.0)
        b_qg = tl.load(qg + head_rows[:, None] * K + o_k[None, :], mask=m_t[:, None], other=0.0)
        b_kt = tl.load(kt + head_rows[:, None] * K + o_k[None, :], mask=m_t[:, None], other=0.0)
        b_u0 = tl.load(u + head_rows[:, None] * V + o_v[None, :], mask=m_t[:, None], other=0.0)
        b_aqk = tl.load(aqk + head_rows[:, None] * BT + o_t[None, :], mask=m_t[:, None], other=0.0)
        b_gl = tl.load(gl + ((c_first + c) * HV + i_hv) * K + o_k)

        b_smm = b_s.to(mm_dtype)
        b_u = b_u0.to(tl.float32) - _mm(b_w, b_smm, INTERPRET)
        b_umm = b_u.to(mm_dtype)
        b_o = _mm(b_qg, b_smm, INTERPRET) + _mm(b_aqk, b_umm, INTERPRET)
        tl.store(o + (rows * HV + i_hv)[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty),
                 mask=m_t[:, None])
        b_s = b_s * b_gl[:, None] + _mm(tl.trans(b_kt), b_umm, INTERPRET)

    if STORE_HT:
        tl.store(ht + p_state, b_s.to(ht.dtype.element_ty))
