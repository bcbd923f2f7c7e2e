"""Stage 2, sequential over chunks: carry the state S through a sequence and produce the outputs.

One program per (value-column block of BV, sequence, value head): the recurrence is separable along V, so
each program owns the block S[:, block] and, for each chunk of BT tokens, computes from the stage-1 tensors
(see chunk_prepare.py)

    U = U0 − W · S                  (corrected values of the chunk, BT x BV)
    O = Qg · S + Aqk · U            (outputs, written in the dtype of v)
    S = diag(gl) · S + Ktᵀ · U      (state at the end of the chunk)

The program works on the transposes, with the value block as the rows of every product:

    Uᵀ = U0ᵀ − Sᵀ · Wᵀ,   Oᵀ = Sᵀ · Qgᵀ + Uᵀ · Aqkᵀ,   Sᵀ = Sᵀ · diag(gl) + Uᵀ · Kt.

Every product then has M = BV = 64 rows, the shape of Hopper's warpgroup matrix instruction, and its left
operand (Sᵀ or Uᵀ) is the result of a previous product: it stays in registers instead of taking a trip
through shared memory on the dependent chain. The right operands come from memory (pipelined loads).
The products take Sᵀ and Uᵀ rounded to the stage-1 tensor dtype (bf16) with fp32 accumulation; the state
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
    # Sᵀ[vv, kk] = S[kk, vv] of this (sequence, head) sits at kk * s_state_k + vv * s_state_v.
    p_state = (n * HV + i_hv) * K * V + o_v[:, None] * s_state_v + o_k[None, :] * s_state_k
    if HAS_H0:
        b_st = tl.load(h0 + p_state).to(tl.float32)
    else:
        b_st = tl.zeros([BV, K], dtype=tl.float32)

    mm_dtype = w.dtype.element_ty
    for c in range(n_chunks):
        rows = bos + c * BT + o_t
        m_t = rows < eos
        head_rows = i_hv * T_total + rows
        b_w = tl.load(w + head_rows[:, None] * K + o_k[None, :], mask=m_t[:, None], other=0.0)
        b_qg = tl.load(qg + head_rows[:, None] * K + o_k[None, :], mask=m_t[:, None], other=0.0)
        b_kt = tl.load(kt + head_rows[:, None] * K + o_k[None, :], mask=m_t[:, None], other=0.0)
        b_u0 = tl.load(u + head_rows[None, :] * V + o_v[:, None], mask=m_t[None, :], other=0.0)     # U0ᵀ
        b_aqk = tl.load(aqk + head_rows[:, None] * BT + o_t[None, :], mask=m_t[:, None], other=0.0)
        b_gl = tl.load(gl + ((c_first + c) * HV + i_hv) * K + o_k)

        b_smm = b_st.to(mm_dtype)
        b_ut = b_u0.to(tl.float32) - _mm(b_smm, tl.trans(b_w), INTERPRET)
        b_umm = b_ut.to(mm_dtype)
        b_ot = _mm(b_smm, tl.trans(b_qg), INTERPRET) + _mm(b_umm, tl.trans(b_aqk), INTERPRET)
        tl.store(o + (rows * HV + i_hv)[None, :] * V + o_v[:, None], b_ot.to(o.dtype.element_ty),
                 mask=m_t[None, :])
        b_st = b_st * b_gl[None, :] + _mm(b_umm, b_kt, INTERPRET)

    if STORE_HT:
        tl.store(ht + p_state, b_st.to(ht.dtype.element_ty))
