"""Triton launcher for the KDA forward: two kernels, or one fused kernel, no host-device synchronisation.

    stage 0 (varlen only)  _chunk_tables_kernel       chunk offsets of the packed sequences, their
                                                      longest-first order and the token range of every
                                                      chunk slot (1 program)
    stage 1                _chunk_prepare_gluon_kernel (Hopper, bf16 inputs; chunk_prepare_gluon.py)
                           or _chunk_prepare_kernel (elsewhere; chunk_prepare.py)
                                                      per (chunk, value head): a1, tb, aqk, kt, gl
    stage 2                _chunk_recurrence_gluon_kernel (Hopper, bf16 values; chunk_recurrence_gluon.py)
                           or _chunk_recurrence_kernel (elsewhere; chunk_recurrence.py)
                                                      per (value block, sequence, value head), longest
                                                      sequences first: reads v and the stage-1 tensors
                                                      (the Gluon one in a loader warpgroup of its own,
                                                      stage2_ring); writes out, state

Fused (fused_gluon.py; Hopper, bf16, K = V = 128, the gate, the l2 norm and the β sigmoid; by fused_by_rule:
many packed sequences (or fewer, where the host knows the longest), or fixed-length ones whose (sequence, head)
programs fill the SMs' waves, sequences not short; or short fixed-length ones in one wave, where the two stages'
host time sets a call's time): stage 0 for the sequence order (packed), then one program per (sequence, value
head) does both stages' work, the chunk tensors staying in shared memory.

Wide stage 2 (stage2_wide; many heads, sequences not short: stage 2 bound by memory traffic): both value
blocks of a head in one program of two warpgroups, which copies the head's stage-1 tiles once, not twice.

Windows (stage2_windows; few heads, long fixed-length sequences, where stage 2's chain of chunks bounds the
forward and leaves most SMs idle): the chunk slots are cut into up to MAX_WINDOWS windows, and stage 1 of
window w + 1 runs beside stage 2 of window w (programmatic dependent launch), which hands each state to
window w + 1 through a buffer and a flag per program (chunk_recurrence_gluon.py).

Every launch goes through direct_launch.launch (Triton's compiled kernel, without its per-call binding).

Launch settings are fixed by rule (no autotuning): chunks of BT = 32 tokens, value blocks of BV = 64
columns in stage 2, 4 warps (both blocks of V = 128 in one program of 8 warps where stage2_wide says so),
the Triton stage 1 capped at 168 registers (three programs per SM), the Gluon stage 1 at 96 (five
programs per SM, with its 43 KB of shared memory), three pipeline stages for stage 2's loads (one for
fp32 stage tensors, whose tiles would not fit shared memory three deep; the Gluon stage 2's loader
warpgroup fills a ring of 3 or 6 slots: stage2_ring). Why these values: docs/perf-notes.md (measured on an
H200).
Arguments are assumed checked (fastkda.checks); this module only allocates the stage-1 tensors and launches.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import torch
import triton.language as tl

from ..checks import check_index_range
from .chunk_prepare import _chunk_prepare_kernel, _chunk_tables_kernel
from .chunk_recurrence import _chunk_recurrence_kernel
from .direct_launch import INTERPRETING, direct_launch_enabled, launch

CHUNK_SIZE = 32      # BT: tokens per chunk (a power of two, 16 or 32: chunk_prepare.py gives the bound)
VALUE_BLOCK = 64     # BV: state columns per stage-2 program
STAGE1_WARPS = 4
STAGE1_MAXNREG = 168   # registers per thread in stage 1: three programs per SM (docs/perf-notes.md)
STAGE2_WARPS = 4
STAGE2_WIDE = None    # both value blocks of a head in one stage-2 program (stage2_wide): None by rule; a bool forces it
WIDE_MIN_HEAD_SHARE = 1.45   # ... only with at least this many (two-program) programs per SM per sequence
WIDE_MIN_TOKENS = 512   # ... and sequences this long on average (shorter ones: two programs overlap better)
STAGE2_STAGES = 3     # pipeline depth of stage 2's loads (bf16 stage tensors, Triton kernel)
STAGE2_GLUON = True   # stage 2 in Gluon where it applies (Hopper, bf16 values): chunk_recurrence_gluon.py
STAGE2_RING = None    # slots of the Gluon stage 2's ring (stage2_ring): None by rule; an int forces it
STAGE2_LOADER_REGS = 64   # registers per thread of the Gluon stage 2's loader warpgroup
STAGE1_GLUON = True   # stage 1 in Gluon where it applies (Hopper, bf16 stage tensors): chunk_prepare_gluon.py
STAGE1_GLUON_MAXNREG = 96    # five Gluon stage-1 programs per SM (43 KB of shared memory each)
WINDOWS = None        # windows of chunk slots (stage2_windows): None by rule; an int sets the count (experiments)
MAX_WINDOWS = 4
WINDOW_CHUNKS = 256   # chunk slots per window, at least (each window costs two launches: ~75 us of host time)
WINDOW_SM_SHARE = 4   # windows only while stage 2 has at most one program per WINDOW_SM_SHARE SMs
ORDER_IN_KERNEL = 256    # up to this many packed sequences their longest-first order is ranked in stage 0
                         # (N² comparisons in one program; a power of two); beyond, sorted by torch
FUSED = None          # the fused kernel: None by rule (fused_by_rule); a bool forces it where fused_applies
FUSED_MIN_TOKENS = 256            # ... by rule: sequences this long on average (packed, the longest known:
FUSED_MIN_TOKENS_KNOWN = 64       # ... this long), and, packed,
FUSED_MIN_PROGRAMS_PER_SM = 2.5   # ... at least this many (sequence, head) programs per SM; fixed-length,
FUSED_MIN_WAVE_FILL = 0.65        # ... waves of programs at least this full on average (sustained load)
FUSED_MAX_LONGEST_SHARE = 1.5     # packed, where the longest sequence is known: at most this many SM shares
FUSED_SHORT_TOKENS = 1024         # fixed-length sequences this short in one wave: fused (host time, fused_by_rule)
FUSED_PRODUCER_REGS = 136   # registers per thread of each of the fused kernel's two producer warpgroups (128 spills)
FUSED_MAXNREG = 168         # ... at launch: the chain warpgroup gets the rest (232)


def _cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host integers (triton.cdiv is a JIT function: ~2 µs per host call)."""
    return -(-a // b)


def stage_dtype(input_dtype: torch.dtype) -> torch.dtype:
    """dtype of the stage-1 tensors (and of the stage-2 matrix operands): bf16, fp32 for fp32 inputs."""
    return torch.float32 if input_dtype == torch.float32 else torch.bfloat16


class Stage1(NamedTuple):
    """Stage-1 tensors of one call (chunk blocks: [HV, chunk slots, rows, ...], chunk_prepare.py) and the
    chunk bookkeeping."""

    a1: torch.Tensor
    tb: torch.Tensor
    aqk: torch.Tensor
    kt: torch.Tensor
    gl: torch.Tensor
    chunk_offsets: Optional[torch.Tensor]
    seq_order: Optional[torch.Tensor]   # packed sequences, longest first (stage 2's program order)
    n_chunks: int   # chunk slots = stage-1 programs along the chunk axis (an upper bound with cu_seqlens)
    N: int          # sequences


def chunk_tables(cu_seqlens: torch.Tensor, T_total: int):
    """Chunk bookkeeping of packed sequences, built on the device (no synchronisation).

    Returns (slots, chunk_offsets, chunk_rows, seq_order): ``slots`` = ceil(T_total / BT) + N bounds the
    number of chunks (each sequence adds at most one partial chunk) and is strictly larger than it, so the
    slot where an empty sequence would start exists (stage 2 prefetches from it); ``chunk_offsets[n]`` = first
    chunk slot of sequence n (N + 1 entries); ``chunk_rows[2c], chunk_rows[2c + 1]`` = first token and end of
    the sequence of slot c, an empty range for slots past the last chunk; ``seq_order`` = the sequences
    longest first (longest_first), ranked in the tables kernel for up to ORDER_IN_KERNEL sequences. One
    allocation and one launch: each costs host time on every packed call (docs/perf-notes.md, session 10).
    """
    N = cu_seqlens.numel() - 1
    BT = CHUNK_SIZE
    slots = _cdiv(T_total, BT) + N
    tables = torch.empty(2 * N + 1 + 2 * slots, dtype=torch.int32, device=cu_seqlens.device)
    chunk_offsets, seq_order, chunk_rows = tables[:N + 1], tables[N + 1:2 * N + 1], tables[2 * N + 1:]
    in_kernel = N <= ORDER_IN_KERNEL
    launch(_chunk_tables_kernel, (1,), cu_seqlens, chunk_offsets, seq_order, chunk_rows, N, slots,
           max(1, N.bit_length()), BT=BT, BLOCK=1024, ORDER=in_kernel, NBLOCK=max(ORDER_IN_KERNEL, 16), JBLOCK=16,
           RBLOCK=1024)   # one compiled variant for any N
    if not in_kernel:
        seq_order = longest_first(cu_seqlens)
    return slots, chunk_offsets, chunk_rows, seq_order


def longest_first(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Indices of the packed sequences by decreasing length (ties in order), int32, on the device (a sort;
    chunk_tables ranks them in its first kernel instead, up to ORDER_IN_KERNEL sequences).

    Stage 2 runs one program per (value block, sequence, head), each as long as its sequence, and the GPU
    starts programs in grid order: with the longest sequences' programs first, the short ones fill the gaps
    at the end (longest-processing-time-first list scheduling) instead of a long sequence starting last and
    running alone (docs/perf-notes.md, session 6)."""
    return torch.argsort(cu_seqlens[1:] - cu_seqlens[:-1], descending=True, stable=True).to(torch.int32)


def prepare_chunks(q, k, v, g, beta, *, scale, A_log, dt_bias, lower_bound, cu_seqlens, use_qk_l2norm,
                   use_gate, use_beta_sigmoid) -> Stage1:
    """Stage 0 and stage 1: allocate and fill the per-chunk tensors."""
    st, stage1 = _plan_chunks(q, k, v, g, beta, scale=scale, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                              cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm, use_gate=use_gate,
                              use_beta_sigmoid=use_beta_sigmoid)
    stage1()
    return st


def _plan_chunks(q, k, v, g, beta, *, scale, A_log, dt_bias, lower_bound, cu_seqlens, use_qk_l2norm, use_gate,
                 use_beta_sigmoid, stage1_gluon=None):
    """Stage 0 and the allocation of the stage-1 tensors; returns them and ``stage1(window=None, pdl=False)``,
    which launches stage 1 for every chunk, or (the Gluon stage 1) for the chunk slots ``window = (lo, hi)``,
    optionally by programmatic dependent launch (kda_forward). ``stage1_gluon``: gluon_stage1_applies, where the
    caller has it."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    T_total = B * T
    BT = CHUNK_SIZE
    device = q.device
    varlen = cu_seqlens is not None
    check_index_range(T_total, H, HV, K, V, cu_seqlens.numel() - 1 if varlen else B, BT)
    if varlen:
        N = cu_seqlens.numel() - 1
        n_chunks, chunk_offsets, chunk_rows, seq_order = chunk_tables(cu_seqlens, T_total)
    else:
        N = B
        n_chunks = B * _cdiv(T, BT)
        chunk_offsets = chunk_rows = seq_order = None
    sdt = stage_dtype(q.dtype)
    slots = max(n_chunks, 1)
    a1, tb, aqk, kt, gl = _carve(device, (sdt, (HV, slots, 2 * BT, K)), (sdt, (HV, slots, 2 * BT, BT)),
                                 (sdt, (HV, slots, BT, BT)), (sdt, (HV, slots, BT, K)), (torch.float32, (slots, HV, K)))
    st = Stage1(a1=a1, tb=tb, aqk=aqk, kt=kt, gl=gl, chunk_offsets=chunk_offsets, seq_order=seq_order,
                n_chunks=n_chunks, N=N)
    # Both stage-1 kernels take these arguments (the Gluon one a1, kt and aqk as TMA descriptors, below); each
    # adds its own compile-time settings.
    tail = (chunk_rows, T, slots, scale, 0.0 if lower_bound is None else lower_bound, H, HV)
    common = dict(K=K, BT=BT, LOG2_BT=BT.bit_length() - 1, IS_VARLEN=varlen, USE_L2NORM=use_qk_l2norm,
                  USE_GATE=use_gate, USE_BETA_SIGMOID=use_beta_sigmoid, HAS_A_LOG=A_log is not None,
                  HAS_DT_BIAS=dt_bias is not None)
    gluon = gluon_stage1_applies(q, k, g) if stage1_gluon is None else stage1_gluon
    descriptors = _stage1_descriptors(st, K, BT) if gluon and n_chunks > 0 else None

    def stage1(window=None, pdl=False):
        if n_chunks == 0 or N == 0:
            return
        if gluon:
            extra = {}
            grid = (n_chunks, HV)
            if window is not None:
                lo, hi = window
                grid = (hi - lo, HV)
                extra = dict(slot_lo=lo, WINDOWED=True, launch_pdl=pdl)
            launch(_gluon("_chunk_prepare_gluon_kernel"), grid, q, k, g, beta, A_log, dt_bias, st.tb, st.gl, *tail,
                   **common, HV_PER_H=HV // H, **descriptors, num_warps=4,  # one warpgroup
                   **({} if STAGE1_GLUON_MAXNREG is None else {"maxnreg": STAGE1_GLUON_MAXNREG}), **extra)
        else:
            assert window is None, "windows need the Gluon stage 1"
            # tf32 products on the GPU; the CPU interpreter emulates tf32 coarsely, so there: full fp32.
            launch(_chunk_prepare_kernel, (n_chunks, HV),
                   q, k, g, beta, A_log, dt_bias, st.a1, st.tb, st.aqk, st.kt, st.gl, *tail, **common,
                   DOT_PRECISION="ieee" if INTERPRETING else "tf32",
                   MM_DTYPE=tl.float32 if sdt == torch.float32 else tl.bfloat16, INTERPRET=INTERPRETING,
                   num_warps=STAGE1_WARPS, num_stages=1,
                   **({} if STAGE1_MAXNREG is None else {"maxnreg": STAGE1_MAXNREG}))
    return st, stage1


def _carve(device, *specs):
    """Contiguous tensors of the given (dtype, shape)s, views of one allocation (one allocator call instead of
    one per tensor: host time on every call). Each starts at a multiple of 16 bytes (TMA, cp.async). One
    strided view per tensor, from one view of the buffer per dtype (fewer tensor operations: host time,
    docs/perf-notes.md, session 13)."""
    sizes = [(math.prod(shape) * dt.itemsize + 15) // 16 * 16 for dt, shape in specs]
    buf = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    as_dtype, out, at = {}, [], 0
    for (dt, shape), size in zip(specs, sizes):
        base = as_dtype.get(dt)
        if base is None:
            base = as_dtype[dt] = buf.view(dt)         # every size is a multiple of 16 bytes
        out.append(base.as_strided(shape, _contiguous_strides(shape), at // dt.itemsize))
        at += size
    return out


@functools.lru_cache(maxsize=256)
def _contiguous_strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _stage1_descriptors(st: Stage1, K: int, BT: int) -> dict:
    """TMA descriptors of the Gluon stage 1's outputs a1, kt, aqk as 2-D row views (blocks of BT rows; the
    swizzles of the kernel's shared tiles). Allocated here, the tensors meet TMA's 16-byte alignment."""
    def desc(t, cols, block_cols, swizzle):
        return _tma_descriptor(t, [t.numel() // cols, cols], [cols, 1], [BT, block_cols], _nvmma_layout(swizzle))
    return dict(a1_desc=desc(st.a1, K, 64, 128), kt_desc=desc(st.kt, K, 64, 128), aqk_desc=desc(st.aqk, BT, BT, 64))


def _tma_descriptor(base: torch.Tensor, shape: list, strides: list, block_shape: list, layout):
    """Gluon's TensorDescriptor(base, shape, strides, block_shape, layout). With the Triton whose launch internals
    direct_launch uses, it is built without the dataclass's checks (16-byte aligned base and row strides, the
    block shape), which the stage-1 tensors meet by construction (_carve) and which cost ~3 µs of host time per
    descriptor on every call; tests compare it with the checked one."""
    TensorDescriptor = _gluon("TensorDescriptor")
    if not direct_launch_enabled():
        return TensorDescriptor(base, shape, strides, block_shape, layout)
    d = object.__new__(TensorDescriptor)
    d.__dict__.update(base=base, shape=shape, strides=strides, block_shape=block_shape, layout=layout, padding="zero")
    return d


@functools.lru_cache(maxsize=None)
def _gluon(name: str):
    """A Gluon kernel (or Gluon's TensorDescriptor) by name, imported on first use: the Gluon modules load only
    where they run, and an import statement costs host time on every call."""
    if name == "TensorDescriptor":
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        return TensorDescriptor
    from . import chunk_prepare_gluon, chunk_recurrence_gluon, fused_gluon
    for module in (chunk_prepare_gluon, chunk_recurrence_gluon, fused_gluon):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(name)


@functools.lru_cache(maxsize=None)
def _nvmma_layout(swizzle: int):
    """The shared layout of a bf16 tile with rows swizzled over `swizzle` bytes (cached: built per call otherwise)."""
    from triton.experimental.gluon import language as gl
    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=2)


@functools.lru_cache(maxsize=None)
def _is_hopper(device: torch.device) -> bool:
    """sm_90 (H100, H200): what the Gluon kernels are written for. Cached: torch's query costs microseconds
    on every call, and calls are host-bound below ~0.4 ms (docs/perf-notes.md, session 7)."""
    return torch.cuda.get_device_capability(device)[0] == 9


def _aligned16(*tensors) -> bool:
    """cp.async copies 16-byte pieces: the Gluon kernels need 16-byte aligned input rows (a view with an odd
    storage offset is not)."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def gluon_stage1_applies(q, k, g) -> bool:
    """The Gluon stage 1 covers bf16 inputs (q, k, g share q's dtype) on Hopper (sm_90) with K = 64 or 128 and
    BT = 32 (one warpgroup: K and 2·BT are the wgmma row counts); elsewhere, and under the CPU interpreter,
    the Triton stage 1 runs."""
    return (STAGE1_GLUON and not INTERPRETING and q.is_cuda and q.dtype == torch.bfloat16
            and q.shape[-1] in (64, 128) and CHUNK_SIZE == 32 and _aligned16(q, k, g)
            and _is_hopper(q.device))


def gluon_stage2_applies(st: Stage1, v) -> bool:
    """The Gluon stage 2 covers bf16 stage tensors and values on Hopper (sm_90); elsewhere, and under the CPU
    interpreter (which cannot run Gluon), the Triton stage 2 runs."""
    return (STAGE2_GLUON and not INTERPRETING and v.is_cuda and st.a1.dtype == torch.bfloat16
            and v.dtype == torch.bfloat16 and _aligned16(v) and _is_hopper(v.device))


def run_recurrence(st: Stage1, v, *, out, initial_state, final_state, cu_seqlens, state_v_first,
                   window=None) -> None:
    """Stage 2: carry the state through each sequence (values ``v``), write ``out`` and ``final_state``.
    ``window = (lo, hi, index, state_buf, flags)``: only the chunks in slots lo .. hi − 1, window number
    ``index`` (the Gluon stage 2; kda_forward)."""
    B, T, HV, V = out.shape
    K = st.a1.shape[-1]
    if st.N == 0:
        return
    gluon = gluon_stage2_applies(st, v)
    BV, warps, wide = min(VALUE_BLOCK, V), STAGE2_WARPS, False
    if gluon and window is None and stage2_wide(st.N, HV, K, V, B * T, v.device):
        BV, warps, wide = V, 2 * STAGE2_WARPS, True
    s_state_k, s_state_v = (1, K) if state_v_first else (V, 1)
    # Both stage-2 kernels take the same arguments; each adds its own compile-time settings.
    grid = (V // BV, st.N * HV)
    args = (st.a1, st.tb, st.aqk, st.kt, st.gl, v, initial_state, final_state, out, cu_seqlens, st.chunk_offsets,
            st.seq_order, T, st.a1.shape[1], s_state_k, s_state_v, HV)
    common = dict(K=K, V=V, BV=BV, BT=CHUNK_SIZE, IS_VARLEN=cu_seqlens is not None,
                  HAS_H0=initial_state is not None, STORE_HT=final_state is not None, num_warps=warps)
    if gluon:
        extra = {}
        if window is not None:
            lo, hi, index, state_buf, flags = window
            extra = dict(state_buf=state_buf, flags=flags, slot_lo=lo, slot_hi=hi, window_idx=index,
                         WINDOWED=True)
        ring = stage2_ring(grid[0] * grid[1], wide, v.device)
        launch(_gluon("_chunk_recurrence_gluon_kernel"), grid, *args, **common, RING=ring,
               LOADER_REGS=STAGE2_LOADER_REGS, maxnreg=_stage2_maxnreg(ring, wide), **extra)
    else:
        assert window is None, "windows need the Gluon stage 2"
        launch(_chunk_recurrence_kernel, grid, *args, **common, INTERPRET=INTERPRETING,
               num_stages=STAGE2_STAGES if st.a1.dtype == torch.bfloat16 else 1)


def stage2_ring(programs: int, wide: bool, device: torch.device) -> int:
    """Slots of the Gluon stage 2's ring (chunk_recurrence_gluon.py: its loader warpgroup keeps up to RING − 1
    chunks in flight). 6 where no two narrow programs need to share an SM (a grid of at most one program per SM:
    214 KB of shared memory, one program per SM), else 3 (111 KB and 128 registers per thread: two narrow
    programs per SM; a wide program, one per SM either way, was fastest with 3). Measured on the H200
    (docs/perf-notes.md, session 15): H64 fixed −10..16% with 6 slots against the single-partition kernel, and
    3 slots within ±1% of it where programs share SMs (6 would keep them to one per SM: +4..12%); wide, H96
    fixed −8%, the packed tasks ±0%. STAGE2_RING forces a depth."""
    if STAGE2_RING is not None:
        return STAGE2_RING
    return 6 if not wide and programs <= _sm_count(device) else 3


def _stage2_maxnreg(ring: int, wide: bool) -> int:
    """Registers per thread at launch of the Gluon stage 2: the loader warpgroup takes STAGE2_LOADER_REGS of
    them, the chain's warpgroups what is left (up to 256). Wide: 12 warps, one program per SM; narrow with 3
    slots: 8 warps in 32 K registers, two programs per SM; else one per SM."""
    if wide:
        return 168
    return 128 if ring <= 3 else 200


def _stage2_programs(N: int, HV: int, V: int) -> int:
    """Stage-2 programs of a call: one per (value block, sequence, value head)."""
    return N * HV * (V // min(VALUE_BLOCK, V))


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def stage2_wide(N: int, HV: int, K: int, V: int, T_total: int, device: torch.device) -> bool:
    """Whether the Gluon stage 2 runs both value blocks of a head (V = 2 · VALUE_BLOCK) in one program of two
    warpgroups (run_recurrence): it copies the head's stage-1 tiles once instead of twice, but its two chains
    step together (a CTA barrier per chunk: 1.23 µs per step against 1.09 for two programs sharing an SM).
    It pays where stage 2 is bound by memory traffic rather than by its chains: K = 128 (the larger tiles),
    one sequence's own programs at least WIDE_MIN_HEAD_SHARE per SM (so that even the last, longest
    sequence's chains keep the memory system busy: measured −2% at 1.45, 0..+1.6% at 1.03–1.33, +19% at
    0.97; a long sequence among short ones with 0.48 per SM: +10%), and sequences of WIDE_MIN_TOKENS or more
    on average (short ones are bound by their state loads and stores, which two independent programs overlap
    better: +6% at 64 tokens). docs/perf-notes.md, session 12. STAGE2_WIDE forces it."""
    if V != 2 * VALUE_BLOCK:
        return False
    if STAGE2_WIDE is not None:
        return STAGE2_WIDE
    return (K == 128 and _stage2_programs(1, HV, V) >= WIDE_MIN_HEAD_SHARE * _sm_count(device)
            and T_total >= WIDE_MIN_TOKENS * N)


def stage2_windows(q, k, g, v, cu_seqlens, stage1_gluon=None) -> int:
    """How many windows of chunk slots the forward runs in (kda_forward): 1 (no windows) unless both Gluon
    stages apply, the sequences have one length (no cu_seqlens), and stage 2 has at most one program per
    WINDOW_SM_SHARE SMs: its chain of chunks, not its throughput, then bounds it, and the other SMs are
    free for stage 1 of the next window. Then one window per WINDOW_CHUNKS chunk slots, at most MAX_WINDOWS.
    Measured on the H200 (docs/perf-notes.md, session 11): 16 heads × 32,768 tokens −8%, 8 heads × 65,536
    −5%; nothing to gain where stage 2 fills the GPU (64 heads × 8,192: both stages then share its memory
    bandwidth) and, below a few hundred chunks, host time lost. ``stage1_gluon``: gluon_stage1_applies, where the
    caller has it."""
    if cu_seqlens is not None:
        return 1
    if stage1_gluon is None:
        stage1_gluon = gluon_stage1_applies(q, k, g)
    if not (stage1_gluon and STAGE2_GLUON and v.dtype == torch.bfloat16 and _aligned16(v)):
        return 1
    if WINDOWS is not None:
        return WINDOWS
    B, T, HV, V = v.shape
    if _stage2_programs(B, HV, V) * WINDOW_SM_SHARE > _sm_count(v.device):
        return 1
    return max(1, min(MAX_WINDOWS, B * _cdiv(T, CHUNK_SIZE) // WINDOW_CHUNKS))


def kda_forward(
    q, k, v, g, beta, *,
    scale: float,
    out: torch.Tensor,
    final_state: Optional[torch.Tensor],
    A_log: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    lower_bound: Optional[float],
    initial_state: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    state_v_first: bool,
    use_qk_l2norm: bool,
    use_gate: bool,
    use_beta_sigmoid: bool,
    max_seqlen: Optional[int] = None,
) -> None:
    """Run the forward (fused, or in two stages); writes ``out`` and ``final_state`` (if given). ``max_seqlen``:
    the longest sequence where the caller knows it (it only steers the route, see fused_by_rule)."""
    stage1_gluon = gluon_stage1_applies(q, k, g)     # once per call (host time)
    if fused_applies(q, k, g, v, A_log, dt_bias, use_qk_l2norm, use_gate, use_beta_sigmoid, stage1_gluon):
        N = cu_seqlens.numel() - 1 if cu_seqlens is not None else q.shape[0]
        if FUSED or (FUSED is None and fused_by_rule(N, v.shape[2], q.shape[0] * q.shape[1], _sm_count(q.device),
                                                     packed=cu_seqlens is not None, max_seqlen=max_seqlen)):
            run_fused(q, k, v, g, beta, scale=scale, out=out, final_state=final_state, A_log=A_log, dt_bias=dt_bias,
                      lower_bound=lower_bound, initial_state=initial_state, cu_seqlens=cu_seqlens,
                      state_v_first=state_v_first)
            return
    st, stage1 = _plan_chunks(q, k, v, g, beta, scale=scale, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                              cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm, use_gate=use_gate,
                              use_beta_sigmoid=use_beta_sigmoid, stage1_gluon=stage1_gluon)
    recurrence = dict(out=out, initial_state=initial_state, final_state=final_state, cu_seqlens=cu_seqlens,
                      state_v_first=state_v_first)
    n_windows = min(stage2_windows(q, k, g, v, cu_seqlens, stage1_gluon), st.n_chunks)
    if n_windows <= 1:
        stage1()
        run_recurrence(st, v, **recurrence)
        return
    # Windows of chunk slots (sequence by sequence, chunk by chunk), each window's stage 1 launched while the
    # previous window's stage 2 runs (programmatic dependent launch: stage 2 lets it start once all its programs
    # run, and stage 1 reads nothing stage 2 writes); stage 2 hands each state from window to window through
    # state_buf, one flag per program.
    B, T, HV, V = v.shape
    K = q.shape[-1]
    state_buf = torch.empty((B, HV, V, K) if state_v_first else (B, HV, K, V), dtype=torch.float32, device=q.device)
    flags = torch.zeros(_stage2_programs(B, HV, V), dtype=torch.int32, device=q.device)
    bounds = [st.n_chunks * i // n_windows for i in range(n_windows + 1)]
    for w in range(n_windows):
        stage1(window=(bounds[w], bounds[w + 1]), pdl=w > 0)
        run_recurrence(st, v, **recurrence, window=(bounds[w], bounds[w + 1], w, state_buf, flags))


def fused_applies(q, k, g, v, A_log, dt_bias, use_qk_l2norm: bool, use_gate: bool, use_beta_sigmoid: bool,
                  stage1_gluon=None) -> bool:
    """The fused kernel covers the production path: bf16 inputs on Hopper (the Gluon stages apply), K = V = 128,
    the gate with A_log and dt_bias, the key/query l2 norm and the β sigmoid. FUSED = False turns it off.
    ``stage1_gluon``: gluon_stage1_applies, where the caller has it."""
    return (FUSED is not False and use_gate and use_qk_l2norm and use_beta_sigmoid and A_log is not None
            and dt_bias is not None and q.shape[-1] == 128 and v.shape[-1] == 128 and v.dtype == torch.bfloat16
            and _aligned16(v) and (gluon_stage1_applies(q, k, g) if stage1_gluon is None else stage1_gluon))


def fused_by_rule(N: int, HV: int, T_total: int, sm_count: int, packed: bool,
                  max_seqlen: Optional[int] = None) -> bool:
    """Whether the fused kernel runs (where it applies). It runs one program per (sequence, head), each alone on
    its SM (200 KB of shared memory) and as long as its sequence: its time is its waves of programs times one
    sequence's chunks (~2.6 µs each on the H200), however full the waves are. The two stages spread the same
    work over every SM, at ~1.3 µs per chunk on a sequence's chain. So, with sequences of FUSED_MIN_TOKENS or
    more on average:
      - fixed-length (every sequence as long): the waves at least FUSED_MIN_WAVE_FILL full on average,
        counted as programs / (waves · SMs);
      - packed: FUSED_MIN_PROGRAMS_PER_SM programs per SM, and, where the host knows the longest sequence
        (``max_seqlen``, from ``cu_seqlens_cpu``), that sequence at most FUSED_MAX_LONGEST_SHARE times one
        SM's share of the tokens (HV · T_total / SMs). A longer one runs on alone after the others have
        finished, at the fused kernel's pace per chunk: measured (one long sequence among 60–100 short ones,
        4–16 heads), −13..−3% against the two stages at 0.5–1.5 shares, +15% at 1.8–2.0, +58% at 2.9, 2.4–3.1x
        slower at 7–15. Without ``max_seqlen`` the rule sees only the average; many programs per SM make such
        a mix less likely, not impossible.
      - packed, fewer programs, ``max_seqlen`` known: as fixed-length sequences all as long as the longest
        (HV · T_total / max_seqlen programs, the waves' bounds above). That overstates the fused kernel's time
        where lengths differ, so it errs toward the two stages.
    With ``max_seqlen`` known (packed), the bound on the longest sequence does what the bound on the average
    length does without it, so the average need only be FUSED_MIN_TOKENS_KNOWN: 4,096–8,192 programs of 64–192
    tokens −5..−14% against the two stages, of 32 tokens +4..+7% (GPU time), of 16 +20%.
    Measured on the H200 (docs/perf-notes.md, sessions 19, 20, 29 and 30; benchmarks/results/fused-sweep-h200-*.json).
    Fixed-length, under sustained load (each route back to back for 1.5 s before it is timed, as a serving GPU
    runs; session 30): the fused kernel holds the top clock (1,980 MHz at 470–650 W: its idle SMs draw little)
    and takes ~80 ns per token and wave however full the wave, while the two stages, which keep every SM busy and
    move ~1,950 more bytes per token and head, reach the 700 W limit from ~0.65 full on and slow to 1,700–1,850
    MHz. So the fused kernel is faster from ~0.65 full in any number of waves: one wave 0.61 full +5%, 0.64
    +2..+5%, 0.65 +0.5%, 0.67–0.76 −5..−15% (8,192 tokens; 16,384: −13..−15%); two waves 0.61 full +2%, 0.64 −1%,
    0.65–0.73 −3..−10%; three waves 0.68 full −8%; packed 1,024-token sequences, the longest known, 0.61 full
    +2..+5%, 0.67 −1..−3%. In short bursts from a cool board (sessions 29 and 30: graph replays and eager calls,
    100 at a time) the two stages keep their top clock and lead up to ~0.75 full (0.73 full: +3..+7%). Packed,
    336–2,048 programs of 256–1,024 tokens −11..−18% (GPU time, graph replays); 128–320 programs of 1,024 tokens
    −13..−23%, left to the two stages unless the host knows the longest sequence (one long sequence among short
    ones). FUSED forces either route.

    Fixed-length sequences of at most FUSED_SHORT_TOKENS in one wave of programs take the fused kernel whatever the
    wave's fill: there a call is host-bound on the two stages (two launches, their stage-1 tensors and
    descriptors: 210–430 µs of host time per call on the H200's host against 95–155 µs for the fused kernel's one
    launch), and the fused kernel's GPU time stays under that (86 µs at 8 heads × 1,024 tokens against 32 on the
    two stages; equal from 96 programs on). Measured eagerly, as a caller sees it: 2.2–3x faster on 8–96 heads ×
    128–1,024 tokens (docs/perf-notes.md, session 24; benchmarks/results/short-fixed-h200-2026-12-01.json)."""
    programs = N * HV
    if not packed and T_total <= FUSED_SHORT_TOKENS * N and programs <= sm_count:
        return True
    known = packed and max_seqlen is not None
    if T_total < (FUSED_MIN_TOKENS_KNOWN if known else FUSED_MIN_TOKENS) * N:
        return False
    if packed and programs >= FUSED_MIN_PROGRAMS_PER_SM * sm_count:
        return not known or max_seqlen * sm_count <= FUSED_MAX_LONGEST_SHARE * HV * T_total
    if packed and not known:
        return False
    # Waves of programs as long as the longest sequence (fixed-length: every one): HV · T_total / longest of them.
    work, longest = HV * T_total, (max_seqlen if packed else T_total // N)
    waves = -(-work // (sm_count * longest))
    return work >= FUSED_MIN_WAVE_FILL * waves * sm_count * longest


def run_fused(q, k, v, g, beta, *, scale, out, final_state, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
              state_v_first) -> None:
    """The fused forward (fused_gluon.py): the sequences' longest-first order (stage 0, packed only), then one
    program per (sequence, value head)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = CHUNK_SIZE
    varlen = cu_seqlens is not None
    N = cu_seqlens.numel() - 1 if varlen else B
    check_index_range(B * T, H, HV, K, V, N, BT)
    if N == 0:
        return
    seq_order = chunk_tables(cu_seqlens, B * T)[3] if varlen else None
    s_state_k, s_state_v = (1, K) if state_v_first else (V, 1)
    launch(_gluon("_fused_kernel"), (N * HV,), q, k, v, g, beta, A_log, dt_bias, initial_state, final_state, out,
           cu_seqlens, seq_order, T, scale, lower_bound, H, HV, S_STATE_K=s_state_k, S_STATE_V=s_state_v,
           HV_PER_H=HV // H, K=K, V=V, BT=BT, LOG2_BT=BT.bit_length() - 1, IS_VARLEN=varlen,
           HAS_H0=initial_state is not None, STORE_HT=final_state is not None, PRODUCER_REGS=FUSED_PRODUCER_REGS,
           num_warps=4, maxnreg=FUSED_MAXNREG)
