"""Stage 2, sequential over chunks: carry the state S through a sequence and produce the outputs.

One program per (value-column block of BV, sequence, value head): the recurrence is separable along V, so
each program owns the block S[:, block]. Per chunk of BT tokens, with the values V[:, block] and the stage-1
tensors of chunk_prepare.py (a1: −W and Qg; tb = (T·diag(β))ᵀ in bf16 halves; aqk; kt; gl):

    U0 = T·diag(β)·V                                 (independent of the state: off the chain)
    a1 · S = −W·S and Qg·S                         (one product of the state)
    U = U0 − W·S                                     (corrected values of the chunk)
    S = diag(gl) · S + Ktᵀ · U,   O = Qg·S + Aqk · U  (two products of U)

so the dependent chain from one chunk's state to the next is two matrix products. The program works on the transposes,

    U0ᵀ = Vᵀ·tb,   Sᵀ·a1ᵀ,   Sᵀ = Sᵀ · diag(gl) + Uᵀ · Kt,   Oᵀ = (Qg·S)ᵀ + Uᵀ · Aqkᵀ,

where every product has M = BV = 64 rows, the shape of Hopper's warpgroup matrix instruction, and its left
operand (Sᵀ or Uᵀ) is the result of the previous product: it stays in registers. The a1 tile is loaded
with the −W and Qg rows interleaved, which puts each thread's W·S and Qg·S values side by side in the
product's register layout, so separating them costs nothing; the tb tile is loaded with the high and low
bf16 halves of T·diag(β) in alternating columns, so U0ᵀ's two halves land in the same layout as −(W·S)ᵀ and
are added without moving data. V and tb reach the program as matrix operands, through Triton's pipelined
(asynchronous, several chunks ahead) loads. On Hopper with bf16 values, chunk_recurrence_gluon.py runs
instead (same math, products overlapped by hand); this kernel serves the other dtypes, other GPUs and the
CPU interpreter.
Products take Sᵀ and Uᵀ rounded to the stage-1 tensor dtype (bf16) with fp32 accumulation; the state itself
stays fp32 from the initial state to the final state.
"""

import triton
import triton.language as tl

from .matmul import _mm


@triton.jit
def _sequence_span(i_nh, HV, seq_order, cu_seqlens, chunk_offsets, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(sequence n, its first token, its end, its first chunk slot) of program row i_nh = (sequence rank) · HV +
    head: packed sequences longest first (seq_order, kernels/__init__.py), else in order."""
    if IS_VARLEN:
        n = tl.load(seq_order + i_nh // HV)
        bos = tl.load(cu_seqlens + n).to(tl.int32)
        eos = tl.load(cu_seqlens + n + 1).to(tl.int32)
        c_first = tl.load(chunk_offsets + n)
    else:
        n = i_nh // HV
        bos = n * T
        eos = bos + T
        c_first = n * tl.cdiv(T, BT)
    return n, bos, eos, c_first


@triton.jit
def _chunk_recurrence_kernel(
    a1, tb, aqk, kt, gl, v,
    h0, ht, o,
    cu_seqlens, chunk_offsets, seq_order,
    T, NC,
    s_state_k, s_state_v,
    HV, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, INTERPRET: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_hv = i_nh % HV
    n, bos, eos, c_first = _sequence_span(i_nh, HV, seq_order, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    n_chunks = tl.cdiv(eos - bos, BT)

    o_t = tl.arange(0, BT)
    o_2t = tl.arange(0, 2 * BT)
    o_half, o_pair = o_2t % 2, o_2t // 2     # tile index 2i + h <-> stored half h, index i
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    # Sᵀ[vv, kk] = S[kk, vv] of this (sequence, head) sits at kk * s_state_k + vv * s_state_v.
    p_state = (n * HV + i_hv) * K * V + o_v[:, None] * s_state_v + o_k[None, :] * s_state_k
    if HAS_H0:
        b_st = tl.load(h0 + p_state).to(tl.float32)
    else:
        b_st = tl.zeros([BV, K], dtype=tl.float32)

    mm_dtype = a1.dtype.element_ty
    blk0 = (i_hv * NC + c_first).to(tl.int64)
    # a1 tile rows 2i, 2i + 1 = −W row i, Qg row i; tb tile columns 2i, 2i + 1 = high, low half of column i
    # (the halves are joined after loading).
    p_a1 = a1 + blk0 * (2 * BT * K) + (o_half * BT + o_pair)[:, None] * K + o_k[None, :]
    p_tb = tb + blk0 * (2 * BT * BT) + o_t[:, None] * BT + o_t[None, :]
    p_aqk = aqk + blk0 * (BT * BT) + o_t[:, None] * BT + o_t[None, :]
    p_kt = kt + blk0 * (BT * K) + o_t[:, None] * K + o_k[None, :]
    # gl feeds element-wise work, which Triton's pipeliner does not prefetch: its load is issued one chunk ahead
    # by hand, else each chunk would wait a full memory latency on its decay (measured: 40% of stage 2's stall
    # samples sat on that load). U0 used to be such a load (30% of the samples in v13); now it is a product.
    p_gl = gl + (c_first * HV + i_hv) * K + o_k
    b_gl_next = tl.load(p_gl)          # slot c_first exists even for an empty sequence (kernels/__init__.py)
    for c in range(n_chunks):
        rows = bos + c * BT + o_t
        b_a1 = tl.load(p_a1 + c * (2 * BT * K))
        b_aqk = tl.load(p_aqk + c * (BT * BT))
        b_kt = tl.load(p_kt + c * (BT * K))
        b_tb = tl.load(p_tb + c * (2 * BT * BT))
        if mm_dtype != tl.float32:
            # high and low halves loaded whole (contiguous), then interleaved by column in registers (fp32
            # stage tensors have no low half; and Triton rejects this join as an fp32 product operand)
            b_tb = tl.reshape(tl.join(b_tb, tl.load(p_tb + c * (2 * BT * BT) + BT * BT)), (BT, 2 * BT))
        b_vt = tl.load(v + (rows * HV + i_hv)[None, :] * V + o_v[:, None], mask=(rows < eos)[None, :], other=0.0)
        b_gl = b_gl_next
        c_next = tl.minimum(c + 1, n_chunks - 1)                      # the last chunk reloads itself
        b_gl_next = tl.load(p_gl + c_next * (HV * K))

        # Vᵀ·tb: columns U0ᵀ's high and low halves alternate (exact bf16 operands for bf16 values; fp16 and
        # fp32 values in tf32, as exact for fp16).
        if v.dtype.element_ty == mm_dtype:
            b_u0 = _mm(b_vt, b_tb, INTERPRET)
        else:
            b_u0 = _mm(b_vt.to(tl.float32), b_tb.to(tl.float32), INTERPRET)
        if mm_dtype != tl.float32:
            b_u0_hi, b_u0_lo = tl.split(tl.reshape(b_u0, (BV, BT, 2)))
            b_u0 = b_u0_hi + b_u0_lo
        # Sᵀ·a1ᵀ: columns −(W·S)ᵀ and (Qg·S)ᵀ alternate; each thread holds pairs side by side.
        b_ws, b_qs = tl.split(tl.reshape(_mm(b_st.to(mm_dtype), tl.trans(b_a1), INTERPRET), (BV, BT, 2)))
        b_umm = (b_ws + b_u0).to(mm_dtype)                                                  # Uᵀ
        b_st = b_st * b_gl[None, :] + _mm(b_umm, b_kt, INTERPRET)
        b_ot = b_qs + _mm(b_umm, tl.trans(b_aqk), INTERPRET)
        tl.store(o + (rows * HV + i_hv)[None, :] * V + o_v[:, None], b_ot.to(o.dtype.element_ty),
                 mask=(rows < eos)[None, :])

    if STORE_HT:
        tl.store(ht + p_state, b_st.to(ht.dtype.element_ty))
