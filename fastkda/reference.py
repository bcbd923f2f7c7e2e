"""Reference implementations of the KDA forward pass (torch, any device).

Two references, both independent of the Triton kernels:

* :func:`kda_recurrence` -- the ground truth. The token-by-token recurrence of KDA.md §1, in float64 by
  default::

      q̂ = q / sqrt(|q|² + 1e-6),  k̂ = k / sqrt(|k|² + 1e-6)
      a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias))     (per channel, in [lower_bound, 0))
      β = sigmoid(beta)
      S ← Diag(exp(a)) S;  S ← S + β k̂ (v − k̂ᵀS)ᵀ;  o = scale q̂ᵀS

* :func:`kda_chunked` -- the same function evaluated chunk by chunk (KDA.md §2), fast enough to serve as the
  reference for 64K-token problems. Decay ratios exp(G_i − G_j) are formed pairwise (never as a product of
  exp(G) and exp(−G)), so it is exact for any gate values, bounded or not.

Both take the raw inputs in the library's layouts ([B, T, H, D]; packed sequences with ``cu_seqlens``) and
return ``(out, final_state)`` with the final state in the requested layout. They accept the same activation
switches as ``fastkda.chunk_kda`` (fused l2 norm, gate and beta sigmoid on or off).
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

L2_NORM_EPS = 1e-6


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x²) + 1e-6) along the last dimension (the eps sits inside the square root)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_NORM_EPS)


def kda_gate(
    g: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    lower_bound: Optional[float],
) -> torch.Tensor:
    """Per-channel log-decay from the raw gate input g [..., HV, K].

    With ``lower_bound``: ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (``A_log`` None drops the
    exp(A_log) factor). Without it: fla's unbounded gate ``-exp(A_log) * softplus(g + dt_bias)``.
    """
    HV, K = g.shape[-2], g.shape[-1]
    x = g
    if dt_bias is not None:
        x = x + dt_bias.reshape(HV, K).to(g.dtype)
    if lower_bound is not None:
        if A_log is not None:
            x = torch.exp(A_log.to(g.dtype)).reshape(HV, 1) * x
        return lower_bound * torch.sigmoid(x)
    if A_log is None:
        raise ValueError("A_log is required for the unbounded gate (lower_bound=None)")
    return -torch.exp(A_log.to(g.dtype)).reshape(HV, 1) * F.softplus(x)


def _activate(q, k, v, g, beta, A_log, dt_bias, lower_bound, use_qk_l2norm, use_gate, use_beta_sigmoid, dtype):
    """Inputs upcast to ``dtype`` and activated: (q̂, k̂ repeated to HV heads, v, a, β)."""
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    H, HV = q.shape[2], v.shape[2]
    if HV != H:
        q = q.repeat_interleave(HV // H, dim=2)
        k = k.repeat_interleave(HV // H, dim=2)
    a = kda_gate(g, A_log, dt_bias, lower_bound) if use_gate else g
    b = torch.sigmoid(beta) if use_beta_sigmoid else beta
    return q, k, v, a, b


def _segments(B: int, T: int, cu_seqlens: Optional[torch.Tensor]) -> List[Tuple[int, int, int]]:
    """(batch index, first token, end token) per sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    cu = [int(x) for x in cu_seqlens.tolist()]
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def _state_in(initial_state, n, HV, K, V, state_v_first, dtype, device):
    """Initial state of sequence n as [HV, K, V] in ``dtype`` (zeros when absent)."""
    if initial_state is None:
        return torch.zeros(HV, K, V, dtype=dtype, device=device)
    s = initial_state[n].to(dtype)
    return s.transpose(-1, -2).clone() if state_v_first else s.clone()


def _state_out(S: torch.Tensor, state_v_first: bool) -> torch.Tensor:
    return S.transpose(-1, -2) if state_v_first else S


def kda_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    A_log: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    lower_bound: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    state_v_first: bool = True,
    use_qk_l2norm: bool = True,
    use_gate: bool = True,
    use_beta_sigmoid: bool = True,
    dtype: torch.dtype = torch.float64,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token KDA recurrence: the ground truth.

    Shapes: q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K]; beta [B, T, HV]; A_log [HV];
    dt_bias [HV, K] or [HV*K]; initial_state [N, HV, V, K] (``state_v_first``) or [N, HV, K, V].
    With ``cu_seqlens`` ([N+1]) B must be 1 and sequences are packed along T; an empty sequence's final
    state is its initial state.

    Returns ``(out [B, T, HV, V], final_state)`` in ``dtype`` (float64 by default).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    qh, kh, vv, a, b = _activate(q, k, v, g, beta, A_log, dt_bias, lower_bound,
                                 use_qk_l2norm, use_gate, use_beta_sigmoid, dtype)
    decay = torch.exp(a)
    segs = _segments(B, T, cu_seqlens)
    out = torch.zeros(B, T, HV, V, dtype=dtype, device=q.device)
    finals = []
    for n, (bi, t0, t1) in enumerate(segs):
        S = _state_in(initial_state, n, HV, K, V, state_v_first, dtype, q.device)  # [HV, K, V]
        for t in range(t0, t1):
            S = decay[bi, t].unsqueeze(-1) * S
            kt = kh[bi, t]                                                    # [HV, K]
            pred = torch.einsum("hk,hkv->hv", kt, S)
            S = S + torch.einsum("hk,hv->hkv", b[bi, t].unsqueeze(-1) * kt, vv[bi, t] - pred)
            out[bi, t] = scale * torch.einsum("hk,hkv->hv", qh[bi, t], S)
        finals.append(_state_out(S, state_v_first))
    return out, torch.stack(finals) if finals else out.new_zeros(0, HV, *((V, K) if state_v_first else (K, V)))


def _chunk_sequence(qh, kh, vv, a, b, S, scale, chunk_size, chunk_batch):
    """Chunked forward of one sequence. Inputs [L, HV, D] (activated); S [HV, K, V]. Returns (o [L, HV, V], S)."""
    L, HV, K = kh.shape
    V = vv.shape[-1]
    C = chunk_size
    nc = (L + C - 1) // C
    pad = nc * C - L

    def chunks(x):  # [L, HV, D] -> [HV, nc, C, D]; padded tokens have zero q, k, v, β and zero log-decay
        if pad:
            x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])], 0)
        return x.reshape(nc, C, HV, -1).permute(2, 0, 1, 3)

    q_c, k_c, v_c, a_c = chunks(qh), chunks(kh), chunks(vv), chunks(a)
    b_c = chunks(b.unsqueeze(-1)).squeeze(-1)                      # [HV, nc, C]
    G = a_c.cumsum(2)                                              # within-chunk cumulative log-decay
    idx = torch.arange(C, device=kh.device)
    strict = idx[:, None] > idx[None, :]
    causal = idx[:, None] >= idx[None, :]
    eye = torch.eye(C, dtype=kh.dtype, device=kh.device)

    W = torch.empty(HV, nc, C, K, dtype=kh.dtype, device=kh.device)
    U0 = torch.empty(HV, nc, C, V, dtype=kh.dtype, device=kh.device)
    Aqk = torch.empty(HV, nc, C, C, dtype=kh.dtype, device=kh.device)
    for c0 in range(0, nc, chunk_batch):  # bounded memory: the pairwise decay tensor is C x C x K per chunk
        sl = slice(c0, min(nc, c0 + chunk_batch))
        Gs, ks, qs = G[:, sl], k_c[:, sl], q_c[:, sl]
        diff = Gs.unsqueeze(3) - Gs.unsqueeze(2)                   # [HV, n, C(i), C(j), K]: G_i - G_j
        diff = torch.where(causal[:, :, None], diff, torch.full_like(diff, -math.inf))
        dec = torch.exp(diff)
        Akk = torch.einsum("hnid,hnjd,hnijd->hnij", ks, ks, dec) * strict
        Aqk[:, sl] = torch.einsum("hnid,hnjd,hnijd->hnij", qs, ks, dec) * causal
        Lm = b_c[:, sl].unsqueeze(-1) * Akk                        # strictly lower part of (I + L)
        rhs = b_c[:, sl].unsqueeze(-1) * torch.cat([ks * torch.exp(Gs), v_c[:, sl]], -1)
        X = torch.linalg.solve_triangular(eye + Lm, rhs, upper=False, unitriangular=True)
        W[:, sl], U0[:, sl] = X[..., :K], X[..., K:]
    Qg = q_c * torch.exp(G)
    G_last = G[:, :, -1:, :]
    Ktail = k_c * torch.exp(G_last - G)
    gl = torch.exp(G_last.squeeze(2))                              # [HV, nc, K]

    o = torch.empty(HV, nc, C, V, dtype=kh.dtype, device=kh.device)
    for c in range(nc):
        U = U0[:, c] - W[:, c] @ S
        o[:, c] = scale * (Qg[:, c] @ S + Aqk[:, c] @ U)
        S = gl[:, c].unsqueeze(-1) * S + Ktail[:, c].transpose(-1, -2) @ U
    o = o.permute(1, 2, 0, 3).reshape(nc * C, HV, V)[:L]
    return o, S


def kda_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    A_log: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    lower_bound: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    state_v_first: bool = True,
    use_qk_l2norm: bool = True,
    use_gate: bool = True,
    use_beta_sigmoid: bool = True,
    dtype: torch.dtype = torch.float32,
    chunk_size: int = 32,
    chunk_batch: int = 64,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Chunked KDA forward (same arguments and results as :func:`kda_recurrence`).

    ``chunk_size`` sets the chunk length; ``chunk_batch`` how many chunks' pairwise decays are held at once
    (memory ~ chunk_batch * HV * chunk_size² * K elements). ``dtype`` is float32 or float64.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    qh, kh, vv, a, b = _activate(q, k, v, g, beta, A_log, dt_bias, lower_bound,
                                 use_qk_l2norm, use_gate, use_beta_sigmoid, dtype)
    out = torch.zeros(B, T, HV, V, dtype=dtype, device=q.device)
    finals = []
    for n, (bi, t0, t1) in enumerate(_segments(B, T, cu_seqlens)):
        S = _state_in(initial_state, n, HV, K, V, state_v_first, dtype, q.device)
        if t1 > t0:
            o, S = _chunk_sequence(qh[bi, t0:t1], kh[bi, t0:t1], vv[bi, t0:t1], a[bi, t0:t1], b[bi, t0:t1],
                                   S, scale, chunk_size, chunk_batch)
            out[bi, t0:t1] = o
        finals.append(_state_out(S, state_v_first))
    return out, torch.stack(finals) if finals else out.new_zeros(0, HV, *((V, K) if state_v_first else (K, V)))
