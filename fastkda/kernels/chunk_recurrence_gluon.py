"""Stage 2 in Gluon (Hopper, bf16 stage tensors and values): the recurrence of chunk_recurrence.py, same
math, with the products' waits placed by hand, and its copies in warps of their own.

One program per (value-column block of BV, sequence, value head), one warpgroup per 64 columns (BV = 64, or
128 in two warpgroups whose chains step together: kernels.stage2_wide); Sᵀ [BV × K] fp32 stays in
registers. Per chunk of BT tokens, with the stage-1 tensors of chunk_prepare.py (a1 = [−W; Qg], tb = the high
and low bf16 halves of (T·diag(β))ᵀ, aqk, kt, gl) and the values V:

    Uᵀ  = Sᵀ·(−W)ᵀ + Vᵀ·tb_high + Vᵀ·tb_low      three asynchronous products, one accumulator
    Pᵀ  = Sᵀ·Qgᵀ                                   beside them; one wait, for Uᵀ only
    Sᵀ ← Sᵀ·diag(gl) + Uᵀ·Kt                       the state product
    Oᵀ  = Pᵀ + Uᵀ·Aqkᵀ                              chained onto Pᵀ's accumulator; one wait for both

Every accumulator has the wgmma register layout of its own width, and Uᵀ, an accumulator with N = BT
columns, is already in the register layout of a left operand with BT columns: no data moves between
products (plain Triton waits after each product whose accumulator is not loop-carried, and the Gluon
version of session 4 split interleaved accumulators, which cost layout conversions: docs/perf-notes.md).

Two partitions (warp specialization). A loader warpgroup copies each chunk's stage-1 tiles, values and gl
into a ring of RING slots (cp.async) as soon as the chain has freed the slot, and marks the slot ready
(an mbarrier per slot) once its copies have landed, LAG chunks later. The chain (the program's own warps)
waits for a slot, runs the chunk and frees the slot. The chain issues no copies, and the loader keeps up
to RING − 1 chunks in flight. That is −10..16% where one program has an SM to itself, and as good as one
warpgroup doing both where two programs share an SM (docs/perf-notes.md, session 15; kernels.stage2_ring
picks RING).

Windowed (WINDOWED; kernels/__init__.py, windowed forward): one launch per window of chunk slots
[slot_lo, slot_hi), so that stage 1 of the next window runs beside this one. A program starts once its
namesake in the previous window has raised their flag to window_idx, works on its sequence's chunks in the
window, if any (from the initial state where the sequence starts, else from the state the previous window
left in state_buf), leaves the state in state_buf (in ht where the sequence ends) and raises the flag.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy, fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
)

from .chunk_recurrence import _sequence_span

# cp.async of a pointer tile into shared memory: `async_copy_global_to_shared` up to Triton 3.6 (the device's),
# renamed `async_load` later (CI's 3.9 raises on the old name).
_cp_async = async_copy.async_load if hasattr(async_copy, "async_load") else async_copy.async_copy_global_to_shared
# The barrier of the running warps (the CTA's, or a partition's inside warp_specialize): `thread_barrier` in
# 3.6, `barrier` later.
_cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier


@gluon.jit
def _copy_tile(dst, base, R: gl.constexpr, C: gl.constexpr, row_stride, L: gl.constexpr):
    """cp.async of the [R, C] tile at base (rows row_stride apart, columns contiguous) into dst."""
    r = gl.arange(0, R, layout=gl.SliceLayout(1, L))
    c = gl.arange(0, C, layout=gl.SliceLayout(0, L))
    _cp_async(dst, base + r[:, None] * row_stride + c[None, :])


@gluon.jit
def _ptx(asm: gl.constexpr):
    """One PTX instruction without operands or result (griddepcontrol, nanosleep, fence)."""
    gl.inline_asm_elementwise(asm + " // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _state_offsets(i_state, i_v, s_state_k, s_state_v, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
                   acc: gl.constexpr):
    """Offsets of Sᵀ[vv, kk] = S[kk, vv] of state i_state (sequence · HV + head), value block i_v."""
    o_vs = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, acc))
    o_ks = gl.arange(0, K, layout=gl.SliceLayout(0, acc))
    return i_state * K * V + o_vs[:, None] * s_state_v + o_ks[None, :] * s_state_k


@gluon.jit
def _opaque(x):
    """x, through an instruction the compiler does not look into."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _slot_copies(c, a1, tb, aqk, kt, gl_ptr, v, blk0, c_first, bos, eos, i_hv, i_v, s,
                 w_r, q_r, kt_r, aqk_r, th_r, tl_r, v_r, g_r,
                 HV, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, BT: gl.constexpr, LW: gl.constexpr):
    """cp.async of chunk c's tiles into ring slot s, by the LW loader warps (16-byte pieces along rows)."""
    L_K: gl.constexpr = gl.BlockedLayout([1, 8], [32 // min(32, K // 8), min(32, K // 8)], [LW, 1], [1, 0])
    L_T: gl.constexpr = gl.BlockedLayout([1, 8], [32 // min(32, BT // 8), min(32, BT // 8)], [LW, 1], [1, 0])
    L_V: gl.constexpr = gl.BlockedLayout([1, 8], [32 // min(32, BV // 8), min(32, BV // 8)], [LW, 1], [1, 0])
    L_G: gl.constexpr = gl.BlockedLayout([max(1, K // (32 * LW))], [32], [LW], [0])
    blk = blk0 + c
    _copy_tile(w_r.index(s), a1 + blk * (2 * BT * K), BT, K, K, L_K)
    _copy_tile(q_r.index(s), a1 + blk * (2 * BT * K) + BT * K, BT, K, K, L_K)
    _copy_tile(kt_r.index(s), kt + blk * (BT * K), BT, K, K, L_K)
    _copy_tile(aqk_r.index(s), aqk + blk * (BT * BT), BT, BT, BT, L_T)
    _copy_tile(th_r.index(s), tb + blk * (2 * BT * BT), BT, BT, BT, L_T)
    _copy_tile(tl_r.index(s), tb + blk * (2 * BT * BT) + BT * BT, BT, BT, BT, L_T)
    _cp_async(g_r.index(s), gl_ptr + ((c_first + c) * HV + i_hv) * K + gl.arange(0, K, layout=L_G))
    rv = bos + c * BT + gl.arange(0, BT, layout=gl.SliceLayout(1, L_V))
    cv = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, L_V))
    _cp_async(v_r.index(s), v + (rv * HV + i_hv)[:, None] * V + cv[None, :],           # rows past eos: zero-filled
              mask=(rv < eos)[:, None] & (cv < V)[None, :])


@gluon.jit
def _loader(RING: gl.constexpr, LAG: gl.constexpr, c_begin, c_end, a1, tb, aqk, kt, gl_ptr, v, blk0, c_first,
            bos, eos, i_hv, i_v, HV, w_r, q_r, kt_r, aqk_r, th_r, tl_r, v_r, g_r, ready, free,
            K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, BT: gl.constexpr):
    """The loader partition: the copies of the j-th chunk (c_begin + j) into slot j % RING once the chain has
    freed it; ready[slot] once they have landed, LAG chunks later (a copy group per chunk)."""
    for c in range(c_begin, c_end + LAG):
        j = c - c_begin
        if c < c_end:
            mbarrier.wait(free.index(j % RING), ((j // RING) & 1) ^ 1)     # (a fresh barrier passes phase 1)
            _slot_copies(c, a1, tb, aqk, kt, gl_ptr, v, blk0, c_first, bos, eos, i_hv, i_v, j % RING,
                         w_r, q_r, kt_r, aqk_r, th_r, tl_r, v_r, g_r, HV, K, V, BV, BT, gl.num_warps())
        async_copy.commit_group()                    # (empty past the last chunk: the wait below counts groups)
        if j >= LAG:
            async_copy.wait_group(LAG)               # chunk j − LAG's copies have landed (this thread's) ...
            fence_async_shared()                     # ... are visible to the chain's products ...
            _cta_barrier()                           # ... and so are every loader thread's
            mbarrier.arrive(ready.index((j - LAG) % RING), count=1)
    async_copy.wait_group(0)


@gluon.jit
def _chunk_products(b_st, w_t, q_t, kt_t, aq_t, th_t, tl_t, v_t, g_s, BV: gl.constexpr, BT: gl.constexpr,
                    acc_k: gl.constexpr, acc_t: gl.constexpr, a_k: gl.constexpr, a_t: gl.constexpr):
    """One chunk of the recurrence for one warpgroup's BV value columns, from shared tiles: (−W)ᵀ and Qgᵀ
    ([K, BT] views), Kt, Aqkᵀ, the halves of tb, Vᵀ and gl. Returns the next Sᵀ and Oᵀ (fp32)."""
    # Sᵀ in bf16 as a register operand (the accumulator layout is already the operand layout); formed
    # before any product is in flight, so ptxas needs no wait to protect its registers.
    b_sa = gl.convert_layout(b_st.to(gl.bfloat16), a_k)
    b_u = warpgroup_mma(b_sa, w_t, gl.zeros([BV, BT], gl.float32, layout=acc_t), is_async=True)
    b_u = warpgroup_mma(v_t, th_t, b_u, is_async=True)
    b_u = warpgroup_mma(v_t, tl_t, b_u, is_async=True)
    b_p = warpgroup_mma(b_sa, q_t, gl.zeros([BV, BT], gl.float32, layout=acc_t), is_async=True)
    b_u, b_sa = warpgroup_mma_wait(1, deps=[b_u, b_sa])  # Uᵀ done; Pᵀ may still be in flight
    b_ub = b_u.to(gl.bfloat16)
    b_gl = g_s.load(gl.SliceLayout(0, acc_k))
    b_st = warpgroup_mma(gl.convert_layout(b_ub, a_k), kt_t, b_st * gl.expand_dims(b_gl, 0), is_async=True)
    b_o = warpgroup_mma(gl.convert_layout(b_ub, a_t), aq_t, b_p, is_async=True)
    b_st, b_o = warpgroup_mma_wait(0, deps=[b_st, b_o])
    return b_st, b_o


@gluon.jit
def _chain(RING: gl.constexpr, c_begin, c_end, n_chunks, n, i_nh, i_hv, i_v, bos, eos, HV, h0, ht, o,
           s_state_k, s_state_v, w_r, q_r, kt_r, aqk_r, th_r, tl_r, v_r, g_r, o_s, ready, free,
           state_buf, flags, window_idx,
           K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, BT: gl.constexpr,
           HAS_H0: gl.constexpr, STORE_HT: gl.constexpr, WINDOWED: gl.constexpr):
    """The chain partition (the program's own warps): the state through chunks c_begin .. c_end − 1, ring slot
    by ring slot; the outputs; the state at the end (and the window's flag)."""
    NW: gl.constexpr = gl.num_warps()
    # wgmma accumulators (M = BV rows, 64 per warpgroup): N = K for the state, N = BT for Uᵀ, Pᵀ and Oᵀ; left
    # operands from registers with K (Sᵀ) or BT (Uᵀ) columns.
    acc_k: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, K, 16])
    acc_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BT, 16])
    a_k: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_k, k_width=2)
    a_t: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_t, k_width=2)
    L_O: gl.constexpr = gl.BlockedLayout([1, 8], [32 // min(32, BV // 8), min(32, BV // 8)], [NW, 1], [1, 0])

    # Sᵀ[vv, kk] = S[kk, vv] of this (sequence, head) sits at kk * s_state_k + vv * s_state_v (state_buf: the
    # same layout, fp32).
    o_state = _state_offsets(n * HV + i_hv, i_v, s_state_k, s_state_v, K, V, BV, acc_k)
    if WINDOWED:
        # Every program waits for its namesake of the previous window to finish (flag raised to window_idx),
        # so that the last window's grid finishes after every program of every window: what comes after the
        # forward in the stream must see all of it (a grid started early need not finish after the grid
        # before it).
        flag = flags + i_nh * gl.num_programs(0) + i_v
        if window_idx > 0:
            while gl.load(flag, volatile=True) != window_idx:
                _ptx("nanosleep.u32 1000;")   # (not an issue slot taken from a chain on this SM)
            _ptx("fence.acq_rel.gpu;")
        if (c_begin > 0) & (c_begin < c_end):           # the sequence started in an earlier window
            b_st = gl.load(state_buf + o_state)
        elif HAS_H0:
            b_st = gl.load(h0 + o_state).to(gl.float32)
        else:
            b_st = gl.zeros([BV, K], gl.float32, layout=acc_k)
    elif HAS_H0:
        b_st = gl.load(h0 + o_state).to(gl.float32)
    else:
        b_st = gl.zeros([BV, K], gl.float32, layout=acc_k)

    o_vo = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, L_O))
    o_to = gl.arange(0, BT, layout=gl.SliceLayout(1, L_O))
    for c in range(c_begin, c_end):
        j = c - c_begin
        s = j % RING
        mbarrier.wait(ready.index(s), (j // RING) & 1)
        b_st, b_o = _chunk_products(b_st, w_r.index(s).permute((1, 0)), q_r.index(s).permute((1, 0)), kt_r.index(s),
                                    aqk_r.index(s).permute((1, 0)), th_r.index(s), tl_r.index(s),
                                    v_r.index(s).permute((1, 0)), g_r.index(s), BV, BT, acc_k, acc_t, a_k, a_t)
        # The output tile goes out through shared memory: written from the accumulator, read back as rows of BV
        # consecutive values (16-byte stores) instead of one 2-byte store per element.
        o_s.store(gl.permute(b_o.to(o.dtype.element_ty), (1, 0)))
        _cta_barrier()                               # every chain warp is done with slot s; o_s is written
        mbarrier.arrive(free.index(s), count=1)
        rows = bos + c * BT + o_to
        gl.store(o + (rows * HV + i_hv)[:, None] * V + o_vo[None, :], o_s.load(L_O), mask=(rows < eos)[:, None])
        _cta_barrier()                               # o_s is read everywhere before the next chunk writes it

    if WINDOWED:
        # The offsets again, from an index the compiler cannot prove equal to the first one: otherwise it keeps
        # the first [BV, K] offsets live through the loop (spilled registers).
        o_state = _state_offsets(_opaque(n * HV + i_hv), i_v, s_state_k, s_state_v, K, V, BV, acc_k)
        if c_begin < c_end:                              # (else nothing of this sequence in the window)
            if c_end < n_chunks:
                gl.store(state_buf + o_state, b_st)
            elif STORE_HT:
                gl.store(ht + o_state, b_st.to(ht.dtype.element_ty))
        _ptx("fence.acq_rel.gpu;")                       # this thread's stores (state, outputs), GPU-wide
        _cta_barrier()                                   # ... and every chain thread's
        gl.store(flag, window_idx + 1)                   # (every thread stores the same value)
    elif STORE_HT:
        o_state = _state_offsets(_opaque(n * HV + i_hv), i_v, s_state_k, s_state_v, K, V, BV, acc_k)
        gl.store(ht + o_state, b_st.to(ht.dtype.element_ty))


@gluon.jit
def _chunk_recurrence_gluon_kernel(
    a1, tb, aqk, kt, gl_ptr, v,
    h0, ht, o,
    cu_seqlens, chunk_offsets, seq_order,
    T, NC,
    s_state_k, s_state_v,
    HV, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, BT: gl.constexpr,
    IS_VARLEN: gl.constexpr, HAS_H0: gl.constexpr, STORE_HT: gl.constexpr,
    RING: gl.constexpr, LOADER_REGS: gl.constexpr,
    state_buf=None, flags=None, slot_lo=0, slot_hi=0, window_idx=0, WINDOWED: gl.constexpr = False,
):
    if WINDOWED:
        # The next window's stage 1 may start as soon as every program of this grid runs (it reads nothing
        # this grid writes): programmatic dependent launch.
        _ptx("griddepcontrol.launch_dependents;")
    i_v = gl.program_id(0)
    i_nh = gl.program_id(1)
    i_hv = i_nh % HV
    n, bos, eos, c_first = _sequence_span(i_nh, HV, seq_order, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    n_chunks = gl.cdiv(eos - bos, BT)
    c_begin = 0
    c_end = n_chunks
    if WINDOWED:
        # this sequence's chunks in the window of chunk slots [slot_lo, slot_hi): none, some or all
        c_begin = gl.maximum(slot_lo - c_first, 0)
        c_end = gl.minimum(slot_hi - c_first, n_chunks)

    # The ring: one buffer of RING slots per tile, and a ready and a free barrier per slot.
    sw_k: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    sw_t: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    sw_v: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    w_r = gl.allocate_shared_memory(gl.bfloat16, [RING, BT, K], sw_k)
    q_r = gl.allocate_shared_memory(gl.bfloat16, [RING, BT, K], sw_k)
    kt_r = gl.allocate_shared_memory(gl.bfloat16, [RING, BT, K], sw_k)
    aqk_r = gl.allocate_shared_memory(gl.bfloat16, [RING, BT, BT], sw_t)
    th_r = gl.allocate_shared_memory(gl.bfloat16, [RING, BT, BT], sw_t)
    tl_r = gl.allocate_shared_memory(gl.bfloat16, [RING, BT, BT], sw_t)
    v_r = gl.allocate_shared_memory(gl.bfloat16, [RING, BT, BV], sw_v)
    g_r = gl.allocate_shared_memory(gl.float32, [RING, K], flat)
    o_s = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], sw_v)
    ready = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(RING):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=1)
    fence_async_shared()
    blk0 = (i_hv * NC + c_first).to(gl.int64)
    # (the partitions' arguments as tuples in the call itself: a tuple built beforehand turns constexprs into
    # tensors)
    gl.warp_specialize([
        (_chain, (RING, c_begin, c_end, n_chunks, n, i_nh, i_hv, i_v, bos, eos, HV, h0, ht, o, s_state_k, s_state_v,
                  w_r, q_r, kt_r, aqk_r, th_r, tl_r, v_r, g_r, o_s, ready, free, state_buf, flags, window_idx,
                  K, V, BV, BT, HAS_H0, STORE_HT, WINDOWED)),
        (_loader, (RING, RING // 2, c_begin, c_end, a1, tb, aqk, kt, gl_ptr, v, blk0, c_first, bos, eos, i_hv, i_v,
                   HV, w_r, q_r, kt_r, aqk_r, th_r, tl_r, v_r, g_r, ready, free, K, V, BV, BT)),
    ], [4], [LOADER_REGS])
