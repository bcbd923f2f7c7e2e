"""Triton launcher for the KDA forward: two kernels, no host-device synchronisation.

    stage 0 (varlen only)  _chunk_offsets_kernel      chunk offsets of the packed sequences (1 program)
    stage 1                _chunk_prepare_kernel      per (chunk, value head): w, u, qg, kt, aqk, gl
    stage 2                _chunk_recurrence_kernel   per (value block, sequence, value head): out, state

Launch settings are fixed by rule from the shape (no autotuning): chunks of BT = 64 tokens, row blocks of
BC = 16 inside stage 1, value blocks of BV = 64 columns in stage 2, 4 warps. Arguments are assumed checked
(fastkda.checks); this module only allocates the stage-1 tensors and launches.
"""

from __future__ import annotations

from typing import Optional

import os

import torch
import triton

from .chunk_prepare import _chunk_offsets_kernel, _chunk_prepare_kernel
from .chunk_recurrence import _chunk_recurrence_kernel

CHUNK_SIZE = 64      # BT: tokens per chunk
ROW_BLOCK = 16       # BC: rows per block with a shared decay reference (16 * 5 = 80 < log(fp32 max))
VALUE_BLOCK = 64     # BV: state columns per stage-2 program
NUM_WARPS = 4


def stage_dtype(input_dtype: torch.dtype) -> torch.dtype:
    """dtype of the stage-1 tensors (and of the stage-2 matrix operands): bf16, fp32 for fp32 inputs."""
    return torch.float32 if input_dtype == torch.float32 else torch.bfloat16


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
) -> None:
    """Run the two-stage Triton forward; writes ``out`` and ``final_state`` (if given)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    T_total = B * T
    BT, BC = CHUNK_SIZE, ROW_BLOCK
    BV = min(VALUE_BLOCK, V)
    device = q.device
    varlen = cu_seqlens is not None
    if varlen:
        N = cu_seqlens.numel() - 1
        n_chunks = triton.cdiv(T_total, BT) + N      # upper bound: each sequence adds <= 1 partial chunk
        chunk_offsets = torch.empty(N + 1, dtype=torch.int32, device=device)
        _chunk_offsets_kernel[(1,)](cu_seqlens, chunk_offsets, N, BT=BT, BLOCK=1024)
    else:
        N = B
        n_chunks = B * triton.cdiv(T, BT)
        chunk_offsets = None
    if N == 0:
        return
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    # Stage-1 products run in tf32 on the GPU; the CPU interpreter's tf32 emulation is far coarser than
    # the hardware's, so there they run in full fp32.
    dot_precision = "ieee" if interpret else "tf32"
    sdt = stage_dtype(q.dtype)
    w = torch.empty(HV, T_total, K, dtype=sdt, device=device)
    qg = torch.empty(HV, T_total, K, dtype=sdt, device=device)
    kt = torch.empty(HV, T_total, K, dtype=sdt, device=device)
    u = torch.empty(HV, T_total, V, dtype=sdt, device=device)
    aqk = torch.empty(HV, T_total, BT, dtype=sdt, device=device)
    gl = torch.empty(max(n_chunks, 1), HV, K, dtype=torch.float32, device=device)

    if n_chunks > 0:
        _chunk_prepare_kernel[(n_chunks, HV)](
            q, k, v, g, beta, A_log, dt_bias,
            w, u, qg, kt, aqk, gl,
            cu_seqlens, chunk_offsets,
            T, T_total, N, scale, 0.0 if lower_bound is None else lower_bound,
            H=H, HV=HV, K=K, V=V, BT=BT, BC=BC, SEARCH_STEPS=max(1, N.bit_length()),
            IS_VARLEN=varlen, USE_L2NORM=use_qk_l2norm, USE_GATE=use_gate, USE_BETA_SIGMOID=use_beta_sigmoid,
            HAS_A_LOG=A_log is not None, HAS_DT_BIAS=dt_bias is not None, DOT_PRECISION=dot_precision,
            num_warps=NUM_WARPS, num_stages=1,
        )
    s_state_k, s_state_v = (1, K) if state_v_first else (V, 1)
    _chunk_recurrence_kernel[(V // BV, N * HV)](
        w, u, qg, kt, aqk, gl,
        initial_state, final_state, out,
        cu_seqlens, chunk_offsets,
        T, T_total,
        s_state_k, s_state_v,
        HV=HV, K=K, V=V, BV=BV, BT=BT,
        IS_VARLEN=varlen, HAS_H0=initial_state is not None, STORE_HT=final_state is not None,
        INTERPRET=interpret,
        num_warps=NUM_WARPS, num_stages=2,
    )
