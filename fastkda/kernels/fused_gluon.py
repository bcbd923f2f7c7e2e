"""The fused forward in Gluon (Hopper, bf16, K = V = 128, the gate, the key/query l2 norm and the β sigmoid):
stage 1 and stage 2 in one program per (sequence, value head), the chunk tensors kept in shared memory.

Same math and rounding points as the two stages (chunk_prepare_gluon.py, chunk_recurrence_gluon.py), so the
outputs and final states are bitwise equal to theirs. Per chunk of BT tokens:

    producer (chunk-local):  (G − r)ᵀ, k̂⊙e^{±(G−r)}, Qg, Kt, [L; Aqk], the masks, T = (I + L)^-1 by block
                             doubling (mma.sync), tb = T·diag(β) in bf16 halves      (stage 1's code)
    chain (carried state):   −W = −(k̂⊙e^{G−r})ᵀ·tbᵀ·e^r                                (stage 1's last product)
                             Uᵀ = Sᵀ·(−W)ᵀ + Vᵀ·tb,  Oᵀ = Sᵀ·Qgᵀ + Uᵀ·Aqkᵀ,
                             Sᵀ ← Sᵀ·diag(gl) + Uᵀ·Kt                                  (stage 2's products)

Three warpgroups (warp specialization). Two producers take alternate chunks of the sequence: each copies
its chunk's g, k, q and v rows (cp.async, the next chunk's once [L; Aqk] has read the current ones),
does the chunk-local work and leaves its tiles in shared memory of its own. The chain (the program's own
warps) carries both 64-column halves of Sᵀ in registers, takes the chunks in order, forms −W and runs the
products. Per producer an mbarrier `ready` (its chunk's tiles are in shared memory) and `free` (the chain is
done with them); a producer waits for `free` only before its first write of a tile the chain reads, so its
input copies and the first half of its gate work overlap the chain. A third, `inputs`, holds the chain's load
of the initial state until both producers' first input copies have landed: at a wave's start every SM asks
for both at once, and the inputs, not the state, gate the first chunk (docs/perf-notes.md, session 31). The
−W products sit in the chain because the chain, not the producers, has time to spare: with them in the
producers the fused forward broke even with the two stages, in the chain it runs 2–7% faster on packed
sequences (docs/perf-notes.md, session 17). 200 KB of shared memory: one program per SM, so the kernel pays
where its waves of (sequence, head) programs fill the SMs and sequences are not short (kernels.fused_by_rule).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy, fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
)

from .chunk_prepare_gluon import (
    LOG2E, T_OUT, _block_decays, _block_operands, _doubling_fp16, _ex2, _inv_norms, _masked_l_aqk, _rcp,
    _split_bf16, _view, _w_block,
)
from .chunk_recurrence_gluon import _chunk_products, _cp_async, _cta_barrier, _opaque, _state_offsets


@gluon.jit
def _issue_inputs(c, buf, P: gl.constexpr, B0: gl.constexpr, bos, eos, i_hv, i_h, HV, H, q, k, g, v, in_g, in_kq,
                  v_s, z, K: gl.constexpr, V: gl.constexpr, KB: gl.constexpr, BT: gl.constexpr):
    """cp.async of chunk c's g rows (into producer P's input tiles B0, B0 + 1), k and q rows (its tiles
    2·B0 .. 2·B0 + 3 of in_kq: k and q of block B0, then of B0 + 1) and v rows (its value buffer buf), padding
    rows zero. One copy per allocation: the compiler puts a barrier before a second write into an allocation
    since the last barrier. z: an opaque zero (index vectors made from it are not kept live across the loop)."""
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 32 // (KB // 8), KB // 8], [1, 4, 1], [2, 1, 0])
    t = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))[:, None, None]
    hh = gl.arange(0, 2, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))[:, None, None]
    tok = bos + c * BT + gl.arange(0, BT, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))[None, :, None] + z
    ch = gl.arange(0, KB, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :]
    # the allocations seen as rank-3 tiles (the same bytes and swizzle: a slice of a multi-tile allocation
    # does not compile as a copy's destination)
    sw3: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
    kq3 = _view(in_kq, gl.bfloat16, [8, BT, KB], sw3)
    g3 = _view(in_g, gl.bfloat16, [4, BT, KB], sw3)
    v3 = _view(v_s, gl.bfloat16, [8, BT, KB], sw3)
    # padding rows zero; the always-true terms give each mask its tile's shape ([4 or 2, BT, KB])
    m4 = (tok < eos) & (t < 4) & (ch < KB)
    m2 = (tok < eos) & (hh < 2) & (ch < KB)
    kq_off = (tok * H + i_h) * K + (t // 2) * KB + ch               # tile t: k (even) or q (odd) of block t // 2
    _cp_async(kq3.slice(2 * B0, 4), gl.where(t % 2 == 0, k + kq_off, q + kq_off), mask=m4)
    _cp_async(g3.slice(B0, 2), g + (tok * HV + i_hv) * K + hh * KB + ch, mask=m2)
    v_ptr = v + (tok * HV + i_hv) * V + hh * KB + ch
    if buf == 0:                                     # (a slice's start must be a compile-time value)
        _cp_async(v3.slice(4 * P, 2), v_ptr, mask=m2)
    else:
        _cp_async(v3.slice(4 * P + 2, 2), v_ptr, mask=m2)
    async_copy.commit_group()


@gluon.jit
def _producer(P: gl.constexpr, n_chunks, bos, eos, i_hv, i_h, HV, H, q, k, g, beta, v, A_log, dt_bias, scale,
              lower_bound, in_g, in_kq, nrm_all, qg_all, kt_all, aq_all, pq_s, ap_all, lh_all, ll_all, t_all, gl_all,
              er_all, v_s, ready, free, inputs, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
              LOG2_BT: gl.constexpr):
    """Producer P: the chunk-local work of chunks P, P + 2, ... (chunk_prepare_gluon.py's, tiles left in shared
    memory: Qg, Kt, Aqk, tb's halves, the operand k̂⊙e^{G−r} of −W, e^{G_last}, e^r, the values)."""
    KB: gl.constexpr = 64
    acc: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2)
    per_row: gl.constexpr = gl.SliceLayout(1, acc)
    per_col: gl.constexpr = gl.SliceLayout(0, acc)
    L_BT: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BT // 8), BT // 8], [4, 1], [1, 0])
    L_TOK: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    B0: gl.constexpr = 2 * P                         # this producer's channel blocks: B0, B0 + 1
    ap_s = ap_all.index(P)
    aq_s = aq_all.index(P)
    lh_s = lh_all.index(P)                           # tb's high half
    ll_s = ll_all.index(P)                           # ... and low half (another allocation: no barrier between)
    tl_s = t_all.index(P)                            # −L, fp16: the doubling's input
    gl_s = gl_all.index(P)

    c_g = -LOG2E * gl.exp(gl.load(A_log + i_hv))
    o_kb = gl.arange(0, KB, layout=per_row)
    d_g0 = gl.load(dt_bias + i_hv * K + o_kb) * c_g
    d_g1 = gl.load(dt_bias + i_hv * K + KB + o_kb) * c_g
    # β of the first chunk (each next chunk's is loaded beside its input copies)
    o_row0 = gl.arange(0, 2 * BT, layout=per_row)
    o_tok0 = gl.arange(0, BT, layout=L_TOK)
    t0p = bos + P * BT
    rb_i = gl.load(beta + (t0p + o_row0) * HV + i_hv, mask=(o_row0 < BT) & ((t0p + o_row0) < eos),
                   other=0.0).to(gl.float32)
    rb_j = gl.load(beta + (t0p + o_tok0) * HV + i_hv, mask=(t0p + o_tok0) < eos, other=0.0).to(gl.float32)
    if P < n_chunks:
        _issue_inputs(P, 0, P, B0, bos, eos, i_hv, i_h, HV, H, q, k, g, v, in_g, in_kq, v_s, 0, K, V, KB, BT)
        async_copy.wait_group(0)
    mbarrier.arrive(inputs.index(0), count=1)        # the first inputs have landed: the initial state may come
    for c in range(P, n_chunks, 2):
        it = c // 2
        # index vectors from an opaque zero, inside the loop: hoisted out of it they stay live and spill
        z = _opaque(0)
        o_t = gl.arange(0, BT, layout=per_col) + z
        o_row = gl.arange(0, 2 * BT, layout=per_row) + z    # β's rows where L takes them: no conversion
        o_tok = gl.arange(0, BT, layout=L_TOK) + z
        jj = gl.arange(0, BT, layout=gl.SliceLayout(1, L_BT)) + z
        ii = gl.arange(0, BT, layout=gl.SliceLayout(0, L_BT)) + z
        t0 = bos + c * BT
        m_i = (o_row < BT) & ((t0 + o_row) < eos)
        m_tok = (t0 + o_tok) < eos
        beta_i = gl.where(m_i, _rcp(1.0 + _ex2(rb_i * -LOG2E)), 0.0)
        beta_j = gl.where(m_tok, _rcp(1.0 + _ex2(rb_j * -LOG2E)), 0.0)
        if (c == P) | (t0 + BT > eos):               # A' changes only for a partial chunk (a sequence's last)
            ap = gl.where(jj[:, None] <= ii[None, :], 0.5, -0.5)
            ap = gl.where((t0 + jj < eos)[:, None], ap, 0.0)
            ap_s.store((ap * (1.0 / 2048.0)).to(gl.float16))
        async_copy.wait_group(0)
        fence_async_shared()
        _cta_barrier()                               # the inputs and A'ᵀ are in shared memory

        inv_nk, inv_nq = _inv_norms(in_kq, 2 * B0, nrm_all, P, 2, BT, KB, per_col)
        b_d, r_ref = _block_decays(B0, in_g, ap_s, c_g, d_g0, lower_bound, KB, BT, True, True, acc, a_op)
        e_r0 = _ex2(r_ref)
        mbarrier.wait(free.index(P), (it & 1) ^ 1)   # the chain is done with this producer's previous chunk
        gl_s.slice(0, KB).store(_ex2(2.0 * r_ref))
        _block_operands(b_d, e_r0, in_kq.index(2 * B0 + 1), in_kq.index(2 * B0), pq_s.index(B0), qg_all.index(B0),
                        in_kq.index(2 * B0), kt_all.index(B0), inv_nk, inv_nq, scale, BT, True, acc, a_op)
        b_d, r_ref = _block_decays(B0 + 1, in_g, ap_s, c_g, d_g1, lower_bound, KB, BT, True, True, acc, a_op)
        e_r1 = _ex2(r_ref)
        gl_s.slice(KB, KB).store(_ex2(2.0 * r_ref))
        _block_operands(b_d, e_r1, in_kq.index(2 * B0 + 3), in_kq.index(2 * B0 + 2), pq_s.index(B0 + 1),
                        qg_all.index(B0 + 1), in_kq.index(2 * B0 + 2), kt_all.index(B0 + 1), inv_nk, inv_nq, scale, BT,
                        True, acc, a_op)
        fence_async_shared()
        _cta_barrier()
        b_la = warpgroup_mma(pq_s.index(B0), in_kq.index(2 * B0).permute((1, 0)),
                             gl.zeros([2 * BT, BT], gl.float32, layout=acc), is_async=True)
        b_la = warpgroup_mma(pq_s.index(B0 + 1), in_kq.index(2 * B0 + 2).permute((1, 0)), b_la, is_async=True)
        b_la = warpgroup_mma_wait(0, deps=[b_la])
        t0n = t0 + 2 * BT
        rb_i = gl.load(beta + (t0n + o_row) * HV + i_hv, mask=(o_row < BT) & ((t0n + o_row) < eos),
                       other=0.0).to(gl.float32)
        rb_j = gl.load(beta + (t0n + o_tok) * HV + i_hv, mask=(t0n + o_tok) < eos, other=0.0).to(gl.float32)
        o_r = gl.arange(0, 2 * BT, layout=per_row) + _opaque(0)   # made here: from the loop's top on it spilled
        b_x = _masked_l_aqk(b_la, beta_i, scale, o_r, o_t, o_r < BT, BT)
        # Aqk's tile is free since the wait for `free`, L's since the last chunk's doubling; the chain's wgmma
        # reads Aqk after the fence before `ready`, the doubling reads L with ordinary loads: a barrier, no fence
        aq_s.store(b_x.to(gl.bfloat16))
        tl_s.store(b_x.to(gl.float16))
        _cta_barrier()                               # ... and every warp's [L; Aqk] has read its inputs:
        if c + 2 < n_chunks:                         # the next chunk's may come (~8,000 cycles before they count)
            _issue_inputs(c + 2, 1 - it % 2, P, B0, bos, eos, i_hv, i_h, HV, H, q, k, g, v, in_g, in_kq, v_s, z, K, V,
                          KB, BT)
        # (its 2 KB hand-over in q̂⊙e^{G−r}'s rows, read by now and by no other warpgroup: no barrier before)
        b_t = _doubling_fp16(tl_s, pq_s.index(B0).slice(BT, BT), LOG2_BT, BT)
        tb_hi, tb_lo = _split_bf16(b_t * gl.expand_dims(gl.convert_layout(beta_j, gl.SliceLayout(0, T_OUT)), 0))
        lh_s.slice(0, BT).store(tb_hi)
        ll_s.slice(0, BT).store(tb_lo)
        er_all.index(P).store(gl.reshape(gl.permute(gl.join(e_r0, e_r1), (1, 0)), [K]))   # one store: no barrier
        fence_async_shared()
        _cta_barrier()
        mbarrier.arrive(ready.index(P), count=1)


@gluon.jit
def _store_output(o_s, b_o, o, rows, i_hv, HV, o_vo, V: gl.constexpr, L_O: gl.constexpr, eos):
    """Oᵀ of one 64-column half out through shared memory, as 16-byte rows."""
    o_s.store(gl.permute(b_o.to(o.dtype.element_ty), (1, 0)))
    _cta_barrier()
    gl.store(o + (rows * HV + i_hv)[:, None] * V + o_vo[None, :], o_s.load(L_O), mask=(rows < eos)[:, None])
    _cta_barrier()                                   # o_s is read everywhere before it is written again


@gluon.jit
def _chain(n_chunks, n, bos, eos, i_hv, HV, h0, ht, o, s_state_k: gl.constexpr, s_state_v: gl.constexpr, qg_all,
           kt_all, aq_all, pq_s, lh_all, ll_all, w_all, gl_all, er_all, v_s, o_s, ready, free, inputs,
           K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, HAS_H0: gl.constexpr, STORE_HT: gl.constexpr):
    """The chain (the program's own warpgroup): both 64-column halves of Sᵀ through the chunks in order, −W of
    each chunk first; the outputs; the final state (its layout's strides compile-time: vector loads and
    stores)."""
    BV: gl.constexpr = 64
    acc_k: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    acc_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    a_k: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_k, k_width=2)
    a_t: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_t, k_width=2)
    L_O: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BV // 8), BV // 8], [4, 1], [1, 0])
    sw_k: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    if HAS_H0:
        # after both producers' first inputs: at a wave's start every SM asks for both at once, and the chain
        # needs the state only once the first chunk's tiles are ready, a producer chunk (~3.5–5.5 µs) later.
        # Where K is contiguous (state_v_first), loaded in acc_k's rows with 32 contiguous bytes per thread
        # (16-byte loads: a warp reads four whole 512-byte rows, where acc_k's 8-byte pieces touch eight) and
        # moved to acc_k through a small shared scratch (−0.5..−0.6% geomean: docs/perf-notes.md, session 32)
        L_ROWS: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0], [0, 32], [0, 64]],
            lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]], warp_bases=[[16, 0], [32, 0]], block_bases=[],
            shape=[BV, K])
        L_LOAD: gl.constexpr = L_ROWS if s_state_k == 1 else acc_k
        mbarrier.wait(inputs.index(0), 0)
        b_s0 = gl.convert_layout(
            gl.load(h0 + _state_offsets(n * HV + i_hv, 0, s_state_k, s_state_v, K, V, BV, L_LOAD)), acc_k
        ).to(gl.float32)
        b_s1 = gl.convert_layout(
            gl.load(h0 + _state_offsets(n * HV + i_hv, 1, s_state_k, s_state_v, K, V, BV, L_LOAD)), acc_k
        ).to(gl.float32)
    else:
        b_s0 = gl.zeros([BV, K], gl.float32, layout=acc_k)
        b_s1 = gl.zeros([BV, K], gl.float32, layout=acc_k)
    # the producers' [BT, 64] tiles of one chunk, two channel blocks side by side, as [BT, K] tiles
    w_k = _view(w_all, gl.bfloat16, [2, BT, K], sw_k)
    q_k = _view(qg_all, gl.bfloat16, [2, BT, K], sw_k)
    kt_k = _view(kt_all, gl.bfloat16, [2, BT, K], sw_k)
    for c in range(0, n_chunks):
        p = c % 2
        # the token index from an opaque zero (hoisted out of the loop it stays live and spills); the column
        # index visible, so that the output stores stay 16 bytes wide
        o_to = gl.arange(0, BT, layout=gl.SliceLayout(1, L_O)) + _opaque(0)
        o_v0 = gl.arange(0, BV, layout=gl.SliceLayout(0, L_O))
        mbarrier.wait(ready.index(p), (c // 2) & 1)
        lh_s = lh_all.index(p)
        ll_s = ll_all.index(p)
        for h in gl.static_range(2):
            _w_block(pq_s.index(2 * p + h), er_all.index(p).slice(h * 64, 64).load(gl.SliceLayout(1, acc_t)), lh_s,
                     ll_s, w_all.index(2 * p + h), BT, 64, acc_t)
        fence_async_shared()
        _cta_barrier()                               # −W is in shared memory
        vb = 4 * p + 2 * ((c // 2) % 2)
        rows = bos + c * BT + o_to
        th_t = lh_s.slice(0, BT).permute((1, 0))
        tl_t = ll_s.slice(0, BT).permute((1, 0))
        aq_t = aq_all.index(p).slice(BT, BT).permute((1, 0))     # Aqk: rows BT.. of the masked tile
        b_s0, b_o = _chunk_products(b_s0, w_k.index(p).permute((1, 0)), q_k.index(p).permute((1, 0)), kt_k.index(p),
                                    aq_t, th_t, tl_t, v_s.index(vb).permute((1, 0)),
                                    gl_all.index(p), BV, BT, acc_k, acc_t, a_k, a_t)
        _store_output(o_s, b_o, o, rows, i_hv, HV, o_v0, V, L_O, eos)
        b_s1, b_o = _chunk_products(b_s1, w_k.index(p).permute((1, 0)), q_k.index(p).permute((1, 0)), kt_k.index(p),
                                    aq_t, th_t, tl_t, v_s.index(vb + 1).permute((1, 0)), gl_all.index(p), BV, BT, acc_k, acc_t, a_k, a_t)
        _store_output(o_s, b_o, o, rows, i_hv, HV, BV + o_v0, V, L_O, eos)
        mbarrier.arrive(free.index(p), count=1)
    if STORE_HT:
        # offsets from an index the compiler cannot prove equal to the first ones (else kept live: spills)
        o_st = _state_offsets(_opaque(n * HV + i_hv), 0, s_state_k, s_state_v, K, V, BV, acc_k)
        gl.store(ht + o_st, b_s0.to(ht.dtype.element_ty))
        o_st = _state_offsets(_opaque(n * HV + i_hv), 1, s_state_k, s_state_v, K, V, BV, acc_k)
        gl.store(ht + o_st, b_s1.to(ht.dtype.element_ty))


@gluon.jit
def _fused_kernel(q, k, v, g, beta, A_log, dt_bias, h0, ht, o, cu_seqlens, seq_order, T, scale, lower_bound,
                  H, HV, S_STATE_K: gl.constexpr, S_STATE_V: gl.constexpr, HV_PER_H: gl.constexpr, K: gl.constexpr,
                  V: gl.constexpr,
                  BT: gl.constexpr, LOG2_BT: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_H0: gl.constexpr,
                  STORE_HT: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    gl.static_assert((K == 128) & (V == 128) & (BT == 32), "the fused kernel is written for K = V = 128, BT = 32")
    i_nh = gl.program_id(0)
    i_hv = i_nh % HV
    i_h = i_hv // HV_PER_H                           # a compile-time divisor: a shift, not a division
    if IS_VARLEN:
        n = gl.load(seq_order + i_nh // HV)          # longest sequences first
        bos = gl.load(cu_seqlens + n).to(gl.int32)
        eos = gl.load(cu_seqlens + n + 1).to(gl.int32)
    else:
        n = i_nh // HV
        bos = n * T
        eos = bos + T
    n_chunks = gl.cdiv(eos - bos, BT)
    KB: gl.constexpr = 64
    sw_k: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    sw_t: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    # Per producer P: channel blocks 2P, 2P + 1 of the [BT, 64] tiles; [2·BT, BT] tiles P (or 2P, 2P + 1).
    in_g = gl.allocate_shared_memory(gl.bfloat16, [4, BT, KB], sw_k)
    in_kq = gl.allocate_shared_memory(gl.bfloat16, [8, BT, KB], sw_k)     # k (later k̂⊙e^{r−G}), q by turns
    nrm_all = gl.allocate_shared_memory(gl.float32, [2, 2 * BT], flat)            # the norms
    pq_s = gl.allocate_shared_memory(gl.bfloat16, [4, 2 * BT, KB], sw_k)  # [k̂⊙e^{G−r}; q̂⊙e^{G−r}]
    ap_all = gl.allocate_shared_memory(gl.float16, [2, BT, BT], sw_t)     # A'ᵀ
    aq_all = gl.allocate_shared_memory(gl.bfloat16, [2, 2 * BT, BT], sw_t)   # [−L; Aqk] (Aqk read)
    lh_all = gl.allocate_shared_memory(gl.bfloat16, [2, BT, BT], sw_t)    # tb's high halves
    ll_all = gl.allocate_shared_memory(gl.bfloat16, [2, BT, BT], sw_t)    # ... and low halves
    t_all = gl.allocate_shared_memory(gl.float16, [2, 2 * BT, BT], sw_t)     # −L
    w_all = gl.allocate_shared_memory(gl.bfloat16, [4, BT, KB], sw_k)     # −W (the chain's)
    qg_all = gl.allocate_shared_memory(gl.bfloat16, [4, BT, KB], sw_k)
    kt_all = gl.allocate_shared_memory(gl.bfloat16, [4, BT, KB], sw_k)
    gl_all = gl.allocate_shared_memory(gl.float32, [2, K], flat)          # e^{G_last}
    er_all = gl.allocate_shared_memory(gl.float32, [2, K], flat)          # e^r
    v_s = gl.allocate_shared_memory(gl.bfloat16, [8, BT, KB], sw_k)       # [producer, buffer, half]
    o_s = gl.allocate_shared_memory(gl.bfloat16, [BT, KB], sw_k)
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    inputs = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=1)
    mbarrier.init(inputs.index(0), count=2)
    fence_async_shared()
    # (the partitions' arguments as tuples in the call itself: a tuple built beforehand turns constexprs into
    # tensors)
    gl.warp_specialize([
        (_chain, (n_chunks, n, bos, eos, i_hv, HV, h0, ht, o, S_STATE_K, S_STATE_V, qg_all, kt_all, aq_all, pq_s,
                  lh_all, ll_all, w_all, gl_all, er_all, v_s, o_s, ready, free, inputs, K, V, BT, HAS_H0,
                  STORE_HT)),
        (_producer, (0, n_chunks, bos, eos, i_hv, i_h, HV, H, q, k, g, beta, v, A_log, dt_bias, scale, lower_bound,
                     in_g, in_kq, nrm_all, qg_all, kt_all, aq_all, pq_s, ap_all, lh_all, ll_all, t_all, gl_all, er_all,
                     v_s, ready, free, inputs, K, V, BT, LOG2_BT)),
        (_producer, (1, n_chunks, bos, eos, i_hv, i_h, HV, H, q, k, g, beta, v, A_log, dt_bias, scale, lower_bound,
                     in_g, in_kq, nrm_all, qg_all, kt_all, aq_all, pq_s, ap_all, lh_all, ll_all, t_all, gl_all, er_all,
                     v_s, ready, free, inputs, K, V, BT, LOG2_BT)),
    ], [4, 4], [PRODUCER_REGS, PRODUCER_REGS])
