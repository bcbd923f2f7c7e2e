"""Stage 2 in Gluon (Hopper, bf16 stage tensors and values): the recurrence of chunk_recurrence.py, same math,
same products, same rounding, with the waits placed by hand.

Per chunk, with Sᵀ [BV × K] fp32 in registers (see chunk_recurrence.py for the algebra):

    U0ᵀ halves = Vᵀ·tb,   (−W·S | Qg·S)ᵀ = Sᵀ·a1ᵀ            two asynchronous products, one wait
    Uᵀ = −(W·S)ᵀ + U0ᵀ (high + low), rounded to bf16
    Sᵀ = Sᵀ·diag(gl) + Uᵀ·Kt,   Oᵀ = (Qg·S)ᵀ + Uᵀ·Aqkᵀ      two asynchronous products; only the state waits

Plain Triton waits for every wgmma product right after issuing it unless its accumulator is loop-carried
(docs/perf-notes.md, session 4), so its stage 2 runs the four products of a chunk one after another. Here
the output product stays in flight while the next chunk starts, and its store follows the next wait. The
stage-1 tiles and the values reach shared memory through a ring of asynchronous copies (cp.async) issued
STAGES − 1 chunks ahead, right after the wait that frees the slot they overwrite.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy, fence_async_shared, warpgroup_mma, warpgroup_mma_wait,
)

# cp.async of a pointer tile into shared memory: `async_copy_global_to_shared` up to Triton 3.6 (the device's),
# renamed `async_load` later (CI's 3.9 raises on the old name).
_cp_async = async_copy.async_load if hasattr(async_copy, "async_load") else async_copy.async_copy_global_to_shared
# The CTA-wide barrier: `thread_barrier` in 3.6, `barrier` later.
_cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier


@gluon.jit
def _issue_chunk_loads(c, n_chunks, a1, tb, aqk, kt, v, blk0, bos, eos, i_hv,
                       a1_s, tb_s, aqk_s, kt_s, v_s,
                       HV, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, BT: gl.constexpr, i_v,
                       L_A1: gl.constexpr, L_KT: gl.constexpr, L_SQ: gl.constexpr, L_TB: gl.constexpr,
                       L_V: gl.constexpr):
    """Asynchronous copies of chunk c's tiles into one ring slot's buffers (nothing past the last chunk)."""
    live = c < n_chunks
    blk = blk0 + c
    r2 = gl.arange(0, 2 * BT, layout=gl.SliceLayout(1, L_A1))
    ck = gl.arange(0, K, layout=gl.SliceLayout(0, L_A1))
    _cp_async(
        a1_s, a1 + blk * (2 * BT * K) + r2[:, None] * K + ck[None, :],
        mask=(live & (r2 < 2 * BT))[:, None] & (ck < K)[None, :])
    rt = gl.arange(0, BT, layout=gl.SliceLayout(1, L_KT))
    ckt = gl.arange(0, K, layout=gl.SliceLayout(0, L_KT))
    _cp_async(
        kt_s, kt + blk * (BT * K) + rt[:, None] * K + ckt[None, :],
        mask=(live & (rt < BT))[:, None] & (ckt < K)[None, :])
    rq = gl.arange(0, BT, layout=gl.SliceLayout(1, L_SQ))
    cq = gl.arange(0, BT, layout=gl.SliceLayout(0, L_SQ))
    _cp_async(
        aqk_s, aqk + blk * (BT * BT) + rq[:, None] * BT + cq[None, :],
        mask=(live & (rq < BT))[:, None] & (cq < BT)[None, :])
    rb = gl.arange(0, BT, layout=gl.SliceLayout(1, L_TB))
    cb = gl.arange(0, 2 * BT, layout=gl.SliceLayout(0, L_TB))
    _cp_async(
        tb_s, tb + blk * (2 * BT * BT) + rb[:, None] * (2 * BT) + cb[None, :],
        mask=(live & (rb < BT))[:, None] & (cb < 2 * BT)[None, :])
    rv = bos + c * BT + gl.arange(0, BT, layout=gl.SliceLayout(1, L_V))
    cv = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, L_V))
    _cp_async(                                                  # values of rows past eos: zero-filled
        v_s, v + (rv * HV + i_hv)[:, None] * V + cv[None, :],
        mask=(live & (rv < eos))[:, None] & (cv < V)[None, :])
    async_copy.commit_group()


@gluon.jit
def _chunk_recurrence_gluon_kernel(
    a1, tb, aqk, kt, gl_ptr, v,
    h0, ht, o,
    cu_seqlens, chunk_offsets,
    T, NC,
    s_state_k, s_state_v,
    HV, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr,
    IS_VARLEN: gl.constexpr, HAS_H0: gl.constexpr, STORE_HT: gl.constexpr,
    L_A1: gl.constexpr, L_KT: gl.constexpr, L_SQ: gl.constexpr, L_TB: gl.constexpr, L_V: gl.constexpr,
    L_OUT: gl.constexpr,
):
    gl.static_assert(STAGES == 3, "the ring below has three slots")
    i_v = gl.program_id(0)
    i_nh = gl.program_id(1)
    n = i_nh // HV
    i_hv = i_nh % HV
    if IS_VARLEN:
        bos = gl.load(cu_seqlens + n).to(gl.int32)
        eos = gl.load(cu_seqlens + n + 1).to(gl.int32)
        c_first = gl.load(chunk_offsets + n)
    else:
        bos = n * T
        eos = bos + T
        c_first = n * gl.cdiv(T, BT)
    n_chunks = gl.cdiv(eos - bos, BT)

    # wgmma accumulator layouts (one warpgroup): N = 2·BT (U0, Sᵀ·a1ᵀ), K (the state), BT (the output).
    acc_2t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 2 * BT, 16])
    acc_k: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    acc_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    a_2t: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_2t, k_width=2)
    a_k: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_k, k_width=2)
    a_t: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_t, k_width=2)

    # The ring of STAGES slots as separate buffers (shared-memory shapes must be powers of two), picked by a
    # compile-time index: the chunk loop is unrolled STAGES times.
    sw128: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    sw64: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    a1_r = (gl.allocate_shared_memory(gl.bfloat16, [2 * BT, K], sw128),
            gl.allocate_shared_memory(gl.bfloat16, [2 * BT, K], sw128),
            gl.allocate_shared_memory(gl.bfloat16, [2 * BT, K], sw128))
    kt_r = (gl.allocate_shared_memory(gl.bfloat16, [BT, K], sw128),
            gl.allocate_shared_memory(gl.bfloat16, [BT, K], sw128),
            gl.allocate_shared_memory(gl.bfloat16, [BT, K], sw128))
    aqk_r = (gl.allocate_shared_memory(gl.bfloat16, [BT, BT], sw64),
             gl.allocate_shared_memory(gl.bfloat16, [BT, BT], sw64),
             gl.allocate_shared_memory(gl.bfloat16, [BT, BT], sw64))
    tb_r = (gl.allocate_shared_memory(gl.bfloat16, [BT, 2 * BT], sw128),
            gl.allocate_shared_memory(gl.bfloat16, [BT, 2 * BT], sw128),
            gl.allocate_shared_memory(gl.bfloat16, [BT, 2 * BT], sw128))
    v_r = (gl.allocate_shared_memory(gl.bfloat16, [BT, BV], sw128),
           gl.allocate_shared_memory(gl.bfloat16, [BT, BV], sw128),
           gl.allocate_shared_memory(gl.bfloat16, [BT, BV], sw128))

    # Sᵀ[vv, kk] = S[kk, vv] of this (sequence, head) sits at kk * s_state_k + vv * s_state_v.
    if HAS_H0:
        o_vs = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, acc_k))
        o_ks = gl.arange(0, K, layout=gl.SliceLayout(0, acc_k))
        b_st = gl.load(h0 + (n * HV + i_hv) * K * V + o_vs[:, None] * s_state_v + o_ks[None, :] * s_state_k)
        b_st = b_st.to(gl.float32)
    else:
        b_st = gl.zeros([BV, K], gl.float32, layout=acc_k)

    blk0 = (i_hv * NC + c_first).to(gl.int64)
    for j in gl.static_range(STAGES - 1):
        _issue_chunk_loads(j, n_chunks, a1, tb, aqk, kt, v, blk0, bos, eos, i_hv,
                           a1_r[j], tb_r[j], aqk_r[j], kt_r[j], v_r[j], HV, K, V, BV, BT, i_v,
                           L_A1, L_KT, L_SQ, L_TB, L_V)
    # gl is prefetched one chunk ahead in a compact layout (one value per thread; the state's column layout
    # would hold K values per thread) and spread over the state's columns when used.
    l_gl: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    p_gl = gl_ptr + (c_first * HV + i_hv) * K + gl.arange(0, K, layout=l_gl)
    b_gl_next = gl.load(p_gl)          # slot c_first exists even for an empty sequence (kernels/__init__.py)

    o_vo = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, L_OUT))
    o_to = gl.arange(0, BT, layout=gl.SliceLayout(0, L_OUT))
    for c0 in range(0, n_chunks, STAGES):
        for j in gl.static_range(STAGES):
            c = c0 + j
            if c < n_chunks:
                async_copy.wait_group(STAGES - 2)               # chunk c's copies have landed (this thread's)
                _cta_barrier()                                   # ... and every thread's
                fence_async_shared()
                b_gl = b_gl_next
                c_next = gl.minimum(c + 1, n_chunks - 1)
                b_gl_next = gl.load(p_gl + c_next * (HV * K))

                # The state product first: its left operand (Sᵀ in bf16, registers) is formed before any product
                # is in flight, else ptxas inserts a wait to protect registers it cannot prove free.
                b_y = warpgroup_mma(gl.convert_layout(b_st.to(gl.bfloat16), a_2t), a1_r[j].permute((1, 0)),
                                    gl.zeros([BV, 2 * BT], gl.float32, layout=acc_2t), is_async=True)
                b_u0 = warpgroup_mma(v_r[j].permute((1, 0)), tb_r[j],
                                     gl.zeros([BV, 2 * BT], gl.float32, layout=acc_2t), is_async=True)
                b_y, b_u0 = warpgroup_mma_wait(0, deps=[b_y, b_u0])
                # Every reader of the previous chunk's slot is done: refill it with chunk c + STAGES − 1.
                jn: gl.constexpr = (j + STAGES - 1) % STAGES
                _issue_chunk_loads(c + STAGES - 1, n_chunks, a1, tb, aqk, kt, v, blk0, bos, eos, i_hv,
                                   a1_r[jn], tb_r[jn], aqk_r[jn], kt_r[jn], v_r[jn], HV, K, V, BV, BT, i_v,
                                   L_A1, L_KT, L_SQ, L_TB, L_V)

                b_u0_hi, b_u0_lo = gl.split(gl.reshape(b_u0, [BV, BT, 2]))
                b_ws, b_qs = gl.split(gl.reshape(b_y, [BV, BT, 2]))
                b_u = (b_ws + b_u0_hi + b_u0_lo).to(gl.bfloat16)                          # Uᵀ
                b_st = warpgroup_mma(gl.convert_layout(b_u, a_k), kt_r[j],
                                     b_st * gl.expand_dims(gl.convert_layout(b_gl, gl.SliceLayout(0, acc_k)), 0),
                                     is_async=True)
                b_ot = warpgroup_mma(gl.convert_layout(b_u, a_t), aqk_r[j].permute((1, 0)),
                                     gl.convert_layout(b_qs, acc_t), is_async=True)
                b_st, b_ot = warpgroup_mma_wait(0, deps=[b_st, b_ot])
                rows = bos + c * BT + o_to
                gl.store(o + (rows * HV + i_hv)[None, :] * V + o_vo[:, None],
                         gl.convert_layout(b_ot, L_OUT).to(o.dtype.element_ty), mask=(rows < eos)[None, :])

    async_copy.wait_group(0)
    if STORE_HT:               # addresses formed again: kept from the start, they would hold 128 registers
        o_vs = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, acc_k))
        o_ks = gl.arange(0, K, layout=gl.SliceLayout(0, acc_k))
        gl.store(ht + (n * HV + i_hv) * K * V + o_vs[:, None] * s_state_v + o_ks[None, :] * s_state_k,
                 b_st.to(ht.dtype.element_ty))
