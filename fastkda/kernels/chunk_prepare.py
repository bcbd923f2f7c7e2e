"""Stage 1, chunk-parallel: everything of a chunk of BT tokens that does not depend on the carried state
or on the values.

One program per (chunk of BT tokens, value head). With q̂, k̂ the l2-normalised q, k, a the per-channel
log-decay (the fused gate) and β the beta sigmoid, G = the within-chunk cumulative sum of a, it forms

    L    = strict_tril(diag(β) · [k̂_i·(k̂_j ⊙ e^{G_i − G_j})]_ij)        (the WY / UT system)
    T    = (I + L)⁻¹
    W    = T · diag(β) · (k̂ ⊙ e^G)
    Aqk  = tril(scale · [q̂_i·(k̂_j ⊙ e^{G_i − G_j})]_ij),   Qg = scale · q̂ ⊙ e^G

and stores, per chunk (padding rows of a sequence's last chunk included):

    a1   = −W (rows 0 .. BT − 1), then Qg (rows BT .. 2·BT − 1)     [HV, chunks, 2·BT, K]
    tb   = (T·diag(β))ᵀ, high half (rows 0 .. BT − 1), then low half [HV, chunks, 2·BT, BT]
    aqk  = Aqk                                                       [HV, chunks, BT, BT]
    kt   = k̂ ⊙ e^{G_last − G}                                        [HV, chunks, BT, K]
    gl   = e^{G_last}                                                [chunks, HV, K]

With the chunk's state S and values V, the recurrence (chunk_recurrence.py) forms U0 = T·diag(β)·V (off
its dependent chain), U = U0 − W·S and Qg·S together, as a1·S, one product of the state; then
O = Qg·S + Aqk·U and S = diag(gl)·S + Ktᵀ·U, two products of U.
Padding rows are zero (k̂ = q̂ = β = 0 there), so the recurrence reads whole chunks without masks.

Numerics. G is accumulated in base 2 (log2(e)·a), so each exponential is one ex2 instruction (fastmath.py).
e^{G_i − G_j} is formed as a product e^{G_i − r}·e^{r − G_j}, which needs both factors inside the fp32 (and
bf16) exponent range, |G − r| < 126 in base 2. With every per-step log-decay ≥ −5, G runs from 0 down to
G_last ≥ −5·BT, so the reference r = G_last / 2 (per channel) keeps both factors within 2^{±116} (e^{±80})
for BT ≤ 32: one matrix product gives all pairs. (BT = 64 would need a reference per half plus a product for
the pairs across halves.) Only two exponentials per element are taken, e^{G − r} and e^{r − G}; e^G and
e^{G_last − G} are those times per-channel factors.
Pairs j > i may overflow to inf/NaN; they are discarded by selection (tl.where), never used.
T is built by block doubling: if T_b inverts I + L restricted to diagonal blocks of size b, the blocks of
size 2b are inverted by T_2b = T_b − T_b·C_b·T_b, C_b the part of L linking the two halves of each 2b block.
That is exact algebra (no series), in tf32 products; T_1 = I. W is two bf16 products, T·diag(β) split into
high and low bf16 halves (see the kernel); tb keeps both halves for U0 (with fp32 stage tensors the low
half is zero: T·diag(β) is stored whole).
"""

import triton
import triton.language as tl

from .fastmath import _exp2, _rcp, _sigmoid
from .matmul import _mm

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _chunk_tables_kernel(cu_seqlens, chunk_offsets, seq_order, chunk_rows, N, n_slots, search_steps,
                         BT: tl.constexpr, BLOCK: tl.constexpr, ORDER: tl.constexpr, NBLOCK: tl.constexpr,
                         JBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    """The chunk bookkeeping of packed sequences, in one program (every launch costs host time on each call:
    ~50 µs on the H200's host, docs/perf-notes.md, session 10):

    chunk_offsets[0] = 0, chunk_offsets[n + 1] = number of BT-chunks in sequences 0..n.

    With ORDER (N <= NBLOCK) also seq_order, the sequences by decreasing length with ties in packed order
    (stage 2's program order; kernels.longest_first sorts for larger N): sequence n goes to position
    #{m: len_m > len_n} + #{m < n: len_m = len_n}, counted JBLOCK sequences m at a time. Here rather than
    in a sort of its own: a sort is extra launches on every packed call (measured on the H200: ~15 µs).

    chunk_rows[2 c], chunk_rows[2 c + 1] = first token and end of the sequence of chunk slot c (slots past the
    last chunk get an empty range): one lookup table, so that each stage-1 program finds its rows with one
    load instead of a binary search of dependent loads."""
    tl.store(chunk_offsets, 0)
    carry = 0
    for start in range(0, N, BLOCK):
        o = start + tl.arange(0, BLOCK)
        m = o < N
        lo = tl.load(cu_seqlens + o, mask=m, other=0).to(tl.int32)
        hi = tl.load(cu_seqlens + o + 1, mask=m, other=0).to(tl.int32)
        count = (hi - lo + BT - 1) // BT
        tl.store(chunk_offsets + o + 1, tl.cumsum(count, 0) + carry, mask=m)
        carry += tl.sum(count, 0)
    if ORDER:
        o = tl.arange(0, NBLOCK)
        m = o < N
        len_n = tl.load(cu_seqlens + o + 1, mask=m, other=0).to(tl.int32) - tl.load(cu_seqlens + o, mask=m,
                                                                                      other=0).to(tl.int32)
        rank = tl.zeros([NBLOCK], dtype=tl.int32)
        for j0 in range(0, N, JBLOCK):
            oj = j0 + tl.arange(0, JBLOCK)
            mj = oj < N
            len_j = tl.load(cu_seqlens + oj + 1, mask=mj, other=0).to(tl.int32) - tl.load(
                cu_seqlens + oj, mask=mj, other=0).to(tl.int32)
            len_j = tl.where(mj, len_j, -1)                        # past the last sequence: never ahead
            ahead = (len_j[None, :] > len_n[:, None]) | ((len_j[None, :] == len_n[:, None])
                                                         & (oj[None, :] < o[:, None]))
            rank += tl.sum(ahead.to(tl.int32), 1)
        tl.store(seq_order + rank, o, mask=m)
    tl.debug_barrier()                               # chunk_offsets, written above by every thread, read below
    n_used = tl.load(chunk_offsets + N)
    for s0 in range(0, n_slots, RBLOCK):
        slot = s0 + tl.arange(0, RBLOCK)
        first = tl.zeros([RBLOCK], dtype=tl.int32)
        last = tl.zeros([RBLOCK], dtype=tl.int32) + (N - 1)
        for _ in range(search_steps):  # largest n with chunk_offsets[n] <= slot
            mid = (first + last + 1) // 2
            ok = tl.load(chunk_offsets + mid) <= slot
            first = tl.where(ok, mid, first)
            last = tl.where(ok, last, mid - 1)
        used = slot < n_used
        t0 = tl.load(cu_seqlens + first).to(tl.int32) + (slot - tl.load(chunk_offsets + first)) * BT
        eos = tl.load(cu_seqlens + first + 1).to(tl.int32)
        in_table = slot < n_slots
        tl.store(chunk_rows + 2 * slot, tl.where(used, t0, 0), mask=in_table)
        tl.store(chunk_rows + 2 * slot + 1, tl.where(used, eos, 0), mask=in_table)


@triton.jit
def _chunk_span(i_c, chunk_rows, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(first token, end of its sequence) of chunk slot i_c: from the chunk-row table of packed sequences, or
    by arithmetic for sequences of one length T (slot = sequence · ceil(T / BT) + chunk)."""
    if IS_VARLEN:
        t0 = tl.load(chunk_rows + 2 * i_c)
        eos = tl.load(chunk_rows + 2 * i_c + 1)
    else:
        NT = tl.cdiv(T, BT)
        eos = (i_c // NT + 1) * T
        t0 = eos - T + (i_c % NT) * BT
    return t0, eos


@triton.jit
def _load_rows(ptr, rows, row_stride, cols, mask):
    return tl.load(ptr + rows[:, None] * row_stride + cols[None, :], mask=mask[:, None], other=0.0).to(tl.float32)


@triton.jit
def _split_columns4(x, BT: tl.constexpr, K: tl.constexpr):
    """A [BT, K] tile as four [BT, K / 8, 2] tiles; tile 2·i1 + i0 holds column 8c + 4·i2 + 2·i1 + i0 at
    [:, c, i2].

    Why: the tiles' threads hold 8 consecutive columns, and Triton's cross-warp reduction scratch keeps them
    side by side: a row sum of such a tile takes 16-way bank conflicts (ncu on the H200: two such sums were a
    third of stage 1's shared-memory wavefronts). Four operands with 2 columns per thread, reduced together,
    take 4-way conflicts (docs/perf-notes.md, v12)."""
    x0, x1 = tl.split(tl.reshape(x, (BT, K // 8, 2, 2, 2)))      # i0
    x00, x01 = tl.split(x0)                                         # i1
    x10, x11 = tl.split(x1)
    return x00, x10, x01, x11


@triton.jit
def _join_columns4(y00, y01, y10, y11, K: tl.constexpr):
    """Inverse of _split_columns4 for the row sums: four [K / 8, 2] vectors (y<i1 i0>[c, i2]) to one [K]."""
    v = tl.join(tl.join(y00, y01), tl.join(y10, y11))              # [c, i2, i0, i1]
    return tl.reshape(tl.permute(v, (0, 1, 3, 2)), (K,))


@triton.jit
def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _log2_decay(g_rows, A_log, dt_bias, i_hv, o_k, lower_bound,
                USE_GATE: tl.constexpr, HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr, K: tl.constexpr,
                INTERPRET: tl.constexpr):
    """Per-step log-decay in base 2: log2(e) · a, with a the fused gate
    lower_bound · sigmoid(e^{A_log} · (g + dt_bias)) or g itself."""
    if USE_GATE:
        # sigmoid(x) = 1 / (1 + 2^u), u = −log2(e)·e^{A_log}·(g + dt_bias) = g·c + dt_bias·c: one FMA per
        # element, the constants folded per head and channel.
        c = -LOG2E
        if HAS_A_LOG:
            c = c * tl.exp(tl.load(A_log + i_hv))
        if HAS_DT_BIAS:
            u = g_rows * c + (tl.load(dt_bias + i_hv * K + o_k) * c)[None, :]
        else:
            u = g_rows * c
        a2 = (lower_bound * LOG2E) * _rcp(1.0 + _exp2(u, INTERPRET), INTERPRET)
    else:
        a2 = g_rows * LOG2E
    return a2


@triton.jit
def _chunk_prepare_kernel(
    q, k, g, beta, A_log, dt_bias,
    a1, tb, aqk, kt, gl,
    chunk_rows,
    T, NC, scale, lower_bound,
    H, HV, K: tl.constexpr,
    BT: tl.constexpr, LOG2_BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_L2NORM: tl.constexpr, USE_GATE: tl.constexpr, USE_BETA_SIGMOID: tl.constexpr,
    HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr, MM_DTYPE: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)

    # Locate the chunk: its first token t0; rows at or past eos are padding.
    t0, eos = _chunk_span(i_c, chunk_rows, T, BT, IS_VARLEN)

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    rows = t0 + o_t
    m_t = rows < eos

    # Whole-chunk tiles: k̂, q̂ and the cumulative log-decay G (padding rows: k̂ = q̂ = 0, a = 0).
    b_k = _load_rows(k, rows * H + i_h, K, o_k, m_t)
    b_q = _load_rows(q, rows * H + i_h, K, o_k, m_t)
    # β is loaded with q and k: loaded after the gate's work, its latency showed in the stall samples.
    b_beta = tl.load(beta + rows * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
    if USE_L2NORM:
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 1) + 1e-6)[:, None]
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 1) + 1e-6)[:, None]
    # Cumulative decay in base 2 (every exponential below is then one ex2 instruction).
    b_a = _log2_decay(_load_rows(g, rows * HV + i_hv, K, o_k, m_t), A_log, dt_bias, i_hv, o_k, lower_bound,
                      USE_GATE, HAS_A_LOG, HAS_DT_BIAS, K, INTERPRET)
    b_G = tl.cumsum(tl.where(m_t[:, None], b_a, 0.0), 0)
    if USE_BETA_SIGMOID:
        b_beta = _sigmoid(b_beta, INTERPRET)
    b_beta = tl.where(m_t, b_beta, 0.0)

    # G at the chunk's last row (padding rows add 0), and one reference point r = G_last / 2:
    # |G − r| <= log2(e) · 5 · BT / 2. Two exponentials per element; every other decay factor is one of them
    # times a per-channel factor.
    g0, g1, g2, g3 = _split_columns4(tl.where((o_t == BT - 1)[:, None], b_G, 0.0), BT, K)
    g0, g1, g2, g3 = tl.reduce((g0, g1, g2, g3), 0, _add4)
    g_last = _join_columns4(g0, g1, g2, g3, K)
    r_ref = g_last * 0.5
    e_r = _exp2(r_ref, INTERPRET)
    # Stage-1 blocks of this chunk: int64 bases (they outgrow 2^31 elements before the inputs do).
    blk = (i_hv * NC + i_c).to(tl.int64)
    k_neg = b_k * _exp2(r_ref[None, :] - b_G, INTERPRET)                         # k̂_j e^{r − G_j}
    tl.store(kt + blk * (BT * K) + o_t[:, None] * K + o_k[None, :],
             (k_neg * _exp2(g_last - r_ref, INTERPRET)[None, :]).to(kt.dtype.element_ty))  # k̂ e^{G_last − G}
    tl.store(gl + (i_c * HV + i_hv) * K + o_k, _exp2(g_last, INTERPRET))
    k_neg = k_neg.to(MM_DTYPE)
    e_pos = _exp2(b_G - r_ref[None, :], INTERPRET)                                # e^{G − r}

    # Aqk = tril(scale · q̂_i·(k̂_j ⊙ e^{G_i − G_j})) and Qg = scale · q̂ ⊙ e^{G − r} · e^{r}, both stored now;
    # Qg goes to the second half of a1.
    p_a1 = a1 + blk * (2 * BT * K) + o_t[:, None] * K + o_k[None, :]
    q_pos = b_q * e_pos
    b_aqk = _mm(q_pos.to(MM_DTYPE), tl.trans(k_neg), INTERPRET)
    b_aqk = tl.where(o_t[None, :] <= o_t[:, None], b_aqk * scale, 0.0)
    tl.store(aqk + blk * (BT * BT) + o_t[:, None] * BT + o_t[None, :], b_aqk.to(aqk.dtype.element_ty))
    tl.store(p_a1 + BT * K, (q_pos * (e_r * scale)[None, :]).to(a1.dtype.element_ty))

    # L = strict_tril(diag(β) · k̂_i·(k̂_j ⊙ e^{G_i − G_j})); k̂ ⊙ e^{G − r} is kept for W.
    k_pos = (b_k * e_pos).to(MM_DTYPE)
    b_L = _mm(k_pos, tl.trans(k_neg), INTERPRET)
    b_L = tl.where(o_t[None, :] < o_t[:, None], b_L * b_beta[:, None], 0.0)

    # T = (I + L)^-1 by block doubling: T_1 = I, T_2b = T_b − T_b·C_b·T_b.
    b_T = (o_t[:, None] == o_t[None, :]).to(tl.float32)
    b_T -= tl.where((o_t[:, None] // 2 == o_t[None, :] // 2), b_L, 0.0)              # b = 1 needs no product
    for lvl in tl.static_range(1, LOG2_BT):                                          # b = 2, 4, ..., BT / 2
        # C_b: pairs in one block of 2b, in different halves of it (rows i, j differ first at bit lvl). T_b is
        # block diagonal, so T_b·C_b = T_b·L restricted to those pairs: the mask goes on the product and L is
        # the same right operand at every level (one layout conversion, not four); the subtraction rides on
        # the second product's accumulator (docs/perf-notes.md, session 6).
        b_TC = tl.where(((o_t[:, None] ^ o_t[None, :]) >> lvl) == 1,
                        tl.dot(b_T, b_L, input_precision=DOT_PRECISION), 0.0)
        b_T = tl.dot(-b_TC, b_T, b_T, input_precision=DOT_PRECISION)

    # −W to the first half of a1: W = (T·diag(β))·(k̂ ⊙ e^{G−r})·diag(e^r). With bf16 stage tensors, T·diag(β) is
    # split into bf16 high and low halves (~16 bits; tf32 keeps 11) against the bf16 right operand k̂ ⊙ e^{G−r}
    # as rounded for L: two bf16 products are as many MMA instructions as one tf32 product, and no fp32 right
    # operand goes through shared memory (those took 8-way bank conflicts: docs/perf-notes.md v13).
    b_tb = b_T * b_beta[None, :]
    if MM_DTYPE == tl.bfloat16:
        t_hi = b_tb.to(tl.bfloat16)
        t_lo = (b_tb - t_hi.to(tl.float32)).to(tl.bfloat16)
        b_w = _mm(t_hi, k_pos, INTERPRET) + _mm(t_lo, k_pos, INTERPRET)
    else:
        t_hi = b_tb
        t_lo = tl.zeros([BT, BT], dtype=tl.float32)
        b_w = tl.dot(b_tb, k_pos, input_precision=DOT_PRECISION)
    tl.store(p_a1, (-(b_w * e_r[None, :])).to(a1.dtype.element_ty))
    # (T·diag(β))ᵀ, high half above the low half: stage 2 forms U0ᵀ = Vᵀ·(T·diag(β))ᵀ from the values it
    # reads anyway (v14: V is not read here, U0 not stored).
    p_tb = tb + blk * (2 * BT * BT) + o_t[None, :] * BT + o_t[:, None]                    # [i, j] -> tb[j, i]
    tl.store(p_tb, t_hi.to(tb.dtype.element_ty))
    tl.store(p_tb + BT * BT, t_lo.to(tb.dtype.element_ty))
