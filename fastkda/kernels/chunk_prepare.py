"""Stage 1, chunk-parallel: everything of a 64-token chunk that does not depend on the carried state.

One program per (chunk of BT = 64 tokens, value head). With q̂, k̂ the l2-normalised q, k, a the per-channel
log-decay (the fused gate) and β the beta sigmoid, G = the within-chunk cumulative sum of a, it computes

    L    = strict_tril(diag(β) · [k̂_i·(k̂_j ⊙ e^{G_i − G_j})]_ij)        (the WY / UT system)
    T    = (I + L)⁻¹
    W    = T · diag(β) · (k̂ ⊙ e^G)           -> w   [HV, T, K]
    U0   = T · diag(β) · V                   -> u   [HV, T, V]
    Qg   = scale · q̂ ⊙ e^G                   -> qg  [HV, T, K]
    Aqk  = tril(scale · [q̂_i·(k̂_j ⊙ e^{G_i − G_j})]_ij)                  -> aqk [HV, T, BT]
    Kt   = k̂ ⊙ e^{G_last − G}                -> kt  [HV, T, K]
    gl   = e^{G_last}                        -> gl  [chunks, HV, K]

so that the recurrence stage only has to do, per chunk, U = U0 − W·S, O = Qg·S + Aqk·U and
S = diag(gl)·S + Ktᵀ·U.

Numerics. e^{G_i − G_j} is never formed as e^{G_i}·e^{−G_j} over the whole chunk (e^{−G} reaches e^{320} at
the lower bound −5). Rows are taken in blocks of BC = 16 tokens, each with its own reference point r (the
cumulative decay just before the block): rows use e^{G_i − G_r} ≤ 1 and columns e^{G_r − G_j}, which is ≤ 1
for earlier blocks and ≤ e^{16·5} = e^{80} inside the block — inside fp32 (and tf32) range as long as every
per-step log-decay is ≥ −5. T is built block row by block row: the 16 x 16 diagonal blocks are inverted
exactly by forward substitution, the off-diagonal blocks follow from T_I = T_II·(E_I − L_{I,<I}·T_{<I}).
"""

import triton
import triton.language as tl


@triton.jit
def _chunk_offsets_kernel(cu_seqlens, chunk_offsets, N, BT: tl.constexpr, BLOCK: tl.constexpr):
    """chunk_offsets[0] = 0, chunk_offsets[n + 1] = number of BT-chunks in sequences 0..n (one program)."""
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


@triton.jit
def _load_rows(ptr, rows, row_stride, cols, mask):
    return tl.load(ptr + rows[:, None] * row_stride + cols[None, :], mask=mask[:, None], other=0.0).to(tl.float32)


@triton.jit
def _log_decay(g_rows, A_log, dt_bias, i_hv, o_k, lower_bound,
               USE_GATE: tl.constexpr, HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr, K: tl.constexpr):
    if USE_GATE:
        x = g_rows
        if HAS_DT_BIAS:
            x = x + tl.load(dt_bias + i_hv * K + o_k)[None, :]
        if HAS_A_LOG:
            x = x * tl.exp(tl.load(A_log + i_hv))
        a = lower_bound * tl.sigmoid(x)
    else:
        a = g_rows
    return a


@triton.jit
def _chunk_prepare_kernel(
    q, k, v, g, beta, A_log, dt_bias,
    w, u, qg, kt, aqk, gl,
    cu_seqlens, chunk_offsets,
    T, T_total, N, scale, lower_bound,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, SEARCH_STEPS: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_L2NORM: tl.constexpr, USE_GATE: tl.constexpr, USE_BETA_SIGMOID: tl.constexpr,
    HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)

    # Locate the chunk: sequence n and its first token t0; rows at or past eos are padding.
    if IS_VARLEN:
        lo = 0
        hi = N - 1
        for _ in range(SEARCH_STEPS):  # largest n with chunk_offsets[n] <= i_c
            mid = (lo + hi + 1) // 2
            ok = tl.load(chunk_offsets + mid) <= i_c
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid - 1)
        n = lo
        bos = tl.load(cu_seqlens + n).to(tl.int32)
        eos = tl.load(cu_seqlens + n + 1).to(tl.int32)
        t0 = bos + (i_c - tl.load(chunk_offsets + n)) * BT
    else:
        NT = tl.cdiv(T, BT)
        n = i_c // NT
        bos = n * T
        eos = bos + T
        t0 = bos + (i_c % NT) * BT

    o_t = tl.arange(0, BT)
    o_c = tl.arange(0, BC)
    o_k = tl.arange(0, K)
    o_v = tl.arange(0, V)
    rows = t0 + o_t
    m_t = rows < eos

    # Whole-chunk tiles: k̂ and the cumulative log-decay G (padding rows: k̂ = 0, a = 0).
    b_k = _load_rows(k, rows * H + i_h, K, o_k, m_t)
    if USE_L2NORM:
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 1) + 1e-6)[:, None]
    b_a = _log_decay(_load_rows(g, rows * HV + i_hv, K, o_k, m_t), A_log, dt_bias, i_hv, o_k, lower_bound,
                     USE_GATE, HAS_A_LOG, HAS_DT_BIAS, K)
    b_a = tl.where(m_t[:, None], b_a, 0.0)
    b_G = tl.cumsum(b_a, 0)

    # Row blocks of BC tokens: Aqk rows are stored directly, T is assembled block row by block row.
    b_T = tl.zeros([BT, BT], dtype=tl.float32)
    blk_of_row = o_t // BC
    for i_b in tl.static_range(BT // BC):
        r_rows = t0 + i_b * BC + o_c
        m_r = r_rows < eos
        # G just before the block: the block's reference point.
        g_ref = tl.sum(tl.where((o_t < i_b * BC)[:, None], b_a, 0.0), 0)
        r_k = _load_rows(k, r_rows * H + i_h, K, o_k, m_r)
        r_q = _load_rows(q, r_rows * H + i_h, K, o_k, m_r)
        if USE_L2NORM:
            r_k = r_k * tl.rsqrt(tl.sum(r_k * r_k, 1) + 1e-6)[:, None]
            r_q = r_q * tl.rsqrt(tl.sum(r_q * r_q, 1) + 1e-6)[:, None]
        r_a = _log_decay(_load_rows(g, r_rows * HV + i_hv, K, o_k, m_r), A_log, dt_bias, i_hv, o_k, lower_bound,
                         USE_GATE, HAS_A_LOG, HAS_DT_BIAS, K)
        r_a = tl.where(m_r[:, None], r_a, 0.0)
        r_Grel = tl.cumsum(r_a, 0)                        # G_i - G_ref for the block's rows, <= 0
        r_beta = tl.load(beta + r_rows * HV + i_hv, mask=m_r, other=0.0).to(tl.float32)
        if USE_BETA_SIGMOID:
            r_beta = tl.sigmoid(r_beta)
        r_beta = tl.where(m_r, r_beta, 0.0)

        # Columns j up to the end of this block, relative to the same reference: e^{G_ref - G_j}.
        col_ok = o_t < (i_b + 1) * BC
        c_exp = tl.where(col_ok[:, None], g_ref[None, :] - b_G, 0.0)
        c_kneg = tl.where(col_ok[:, None], b_k * tl.exp(c_exp), 0.0)              # [BT, K]
        r_kpos = r_k * tl.exp(r_Grel)                                            # [BC, K]
        r_qpos = r_q * tl.exp(r_Grel)
        i_glob = i_b * BC + o_c
        b_akk = tl.dot(r_kpos, tl.trans(c_kneg), input_precision=DOT_PRECISION)                                 # [BC, BT]
        b_akk = tl.where(o_t[None, :] < i_glob[:, None], b_akk * r_beta[:, None], 0.0)
        b_aqk = tl.dot(r_qpos, tl.trans(c_kneg), input_precision=DOT_PRECISION)
        b_aqk = tl.where(o_t[None, :] <= i_glob[:, None], b_aqk * scale, 0.0)
        tl.store(aqk + (i_hv * T_total + r_rows)[:, None] * BT + o_t[None, :],
                 b_aqk.to(aqk.dtype.element_ty), mask=m_r[:, None])

        # Diagonal block L_II (strictly lower) -> its inverse by forward substitution, exact in fp32.
        d_kneg = r_k * tl.exp(-r_Grel)
        b_lii = tl.dot(r_kpos, tl.trans(d_kneg), input_precision="ieee")
        b_lii = tl.where(o_c[None, :] < o_c[:, None], b_lii * r_beta[:, None], 0.0)
        b_tii = (o_c[:, None] == o_c[None, :]).to(tl.float32)
        for i in tl.static_range(1, BC):
            l_row = tl.sum(tl.where(o_c[:, None] == i, b_lii, 0.0), 0)
            t_row = (o_c == i).to(tl.float32) - tl.sum(l_row[:, None] * b_tii, 0)
            b_tii = tl.where(o_c[:, None] == i, t_row[None, :], b_tii)

        # T_I = T_II · (E_I − L_{I,<I} · T_{<I}); earlier block rows of b_T are complete.
        b_rhs = (o_t[None, :] == i_glob[:, None]).to(tl.float32)
        if i_b > 0:
            b_loff = tl.where(o_t[None, :] < i_b * BC, b_akk, 0.0)
            b_rhs = b_rhs - tl.dot(b_loff, b_T, input_precision=DOT_PRECISION)
        b_ti = tl.dot(b_tii, b_rhs, input_precision="ieee")                    # [BC, BT]
        b_ti_rows = tl.reshape(tl.broadcast_to(b_ti[None, :, :], [BT // BC, BC, BT]), [BT, BT])
        b_T = tl.where((blk_of_row == i_b)[:, None], b_ti_rows, b_T)

    # Per-token outputs of the chunk.
    b_beta = tl.load(beta + rows * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
    if USE_BETA_SIGMOID:
        b_beta = tl.sigmoid(b_beta)
    b_beta = tl.where(m_t, b_beta, 0.0)
    b_eg = tl.exp(b_G)
    b_w = tl.dot(b_T, b_k * b_eg * b_beta[:, None], input_precision=DOT_PRECISION)
    b_v = _load_rows(v, rows * HV + i_hv, V, o_v, m_t)
    b_u = tl.dot(b_T, b_v * b_beta[:, None], input_precision=DOT_PRECISION)
    b_q = _load_rows(q, rows * H + i_h, K, o_k, m_t)
    if USE_L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 1) + 1e-6)[:, None]
    g_last = tl.sum(b_a, 0)                                                    # G at the chunk's last row
    b_kt = b_k * tl.exp(g_last[None, :] - b_G)

    row_k = (i_hv * T_total + rows)[:, None] * K + o_k[None, :]
    tl.store(w + row_k, b_w.to(w.dtype.element_ty), mask=m_t[:, None])
    tl.store(qg + row_k, (b_q * b_eg * scale).to(qg.dtype.element_ty), mask=m_t[:, None])
    tl.store(kt + row_k, b_kt.to(kt.dtype.element_ty), mask=m_t[:, None])
    tl.store(u + (i_hv * T_total + rows)[:, None] * V + o_v[None, :], b_u.to(u.dtype.element_ty),
             mask=m_t[:, None])
    tl.store(gl + (i_c * HV + i_hv) * K + o_k, tl.exp(g_last))
