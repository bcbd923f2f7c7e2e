"""Public API: FlashKDA's ``fwd`` and fla's ``chunk_kda``, with argument checks and dispatch.

    fastkda.fwd / fastkda.chunk_kda  ->  checks.py  ->  forward()  ->  kernels (CUDA) | reference (CPU)

On CUDA tensors the Triton kernels in :mod:`fastkda.kernels` run; on CPU tensors the chunked torch
reference (:func:`fastkda.reference.kda_chunked`, float32) runs, so the API works everywhere.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import checks
from .reference import kda_chunked

BACKENDS = ("triton", "reference")


def _default_backend(device: torch.device) -> str:
    return "triton" if device.type == "cuda" else "reference"


def forward(
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
    backend: Optional[str] = None,
) -> None:
    """Dispatch an already-checked call: writes ``out`` and, if given, ``final_state``. ``max_seqlen``, the
    longest sequence where the host knows it, only steers the kernels' route."""
    backend = backend or _default_backend(q.device)
    if backend == "triton":
        from .kernels import kda_forward
        kda_forward(q, k, v, g, beta, scale=scale, out=out, final_state=final_state, A_log=A_log,
                    dt_bias=dt_bias, lower_bound=lower_bound, initial_state=initial_state,
                    cu_seqlens=cu_seqlens, state_v_first=state_v_first, use_qk_l2norm=use_qk_l2norm,
                    use_gate=use_gate, use_beta_sigmoid=use_beta_sigmoid, max_seqlen=max_seqlen)
    elif backend == "reference":
        o, s = kda_chunked(q, k, v, g, beta, scale=scale, A_log=A_log, dt_bias=dt_bias,
                           lower_bound=lower_bound, initial_state=initial_state, cu_seqlens=cu_seqlens,
                           state_v_first=state_v_first, use_qk_l2norm=use_qk_l2norm, use_gate=use_gate,
                           use_beta_sigmoid=use_beta_sigmoid, dtype=torch.float32)
        out.copy_(o)
        if final_state is not None:
            final_state.copy_(s)
    else:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")


def _check_no_grad(*tensors) -> None:
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise NotImplementedError(
            "fastkda implements the KDA forward pass only (no autograd): call it under torch.no_grad() or "
            "torch.inference_mode(), or use fla's chunk_kda for training")


def fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    lower_bound: float,
    initial_state: Optional[torch.Tensor] = None,
    final_state: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
) -> None:
    """KDA forward with FlashKDA's signature and semantics; writes ``out`` and ``final_state`` in place.

    Fuses the l2 norm of q and k (eps 1e-6 inside the square root), the gate
    ``a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` and the beta sigmoid.

    Args:
        q, k: ``[B, T, H, K]`` queries and keys (bf16, fp16 or fp32).
        v: ``[B, T, HV, V]`` values, same dtype; ``HV`` a multiple of ``H`` (grouped value heads).
        g: ``[B, T, HV, K]`` raw gate input, same dtype.
        beta: ``[B, T, HV]`` beta logits (dtype of q, or fp32).
        scale: output scale, usually ``K ** -0.5``.
        out: ``[B, T, HV, V]`` output buffer, dtype of v; must not overlap any input.
        A_log: ``[HV]`` fp32.  dt_bias: ``[HV, K]`` or ``[HV * K]`` fp32.
        lower_bound: the gate's lower bound, in ``[-5, 0)``.
        initial_state: optional ``[N, HV, V, K]`` (v-first), bf16 or fp32; zeros when ``None``.
        final_state: optional ``[N, HV, V, K]`` buffer, bf16 or fp32; may be ``initial_state`` itself.
        cu_seqlens: optional ``[N+1]`` int32/int64 offsets of packed sequences (then ``B == 1``); empty
            sequences are allowed and their final state is their initial state.
        cu_seqlens_cpu: optional CPU copy of ``cu_seqlens`` (fastkda's addition, fla's name): its values are
            checked without a sync, and the longest sequence steers the route (one long sequence packed among
            short ones runs on the two-stage kernels, which spread it over the SMs).

    K and V may each be 64 or 128. Raises ``ValueError``/``TypeError`` naming the bad argument before
    anything is written.
    """
    p = checks.check_inputs(q, k, v, g, beta)
    p = checks.check_cu_seqlens(cu_seqlens, p, q.device, cu_seqlens_cpu)
    scale = checks.check_scale(scale)
    lower_bound = checks.check_lower_bound(lower_bound)
    if dt_bias is None:
        raise ValueError(f"dt_bias: expected a float32 tensor of shape ({p.HV}, {p.K}), got None")
    checks.check_gate_params(A_log, dt_bias, p, q.device, A_log_required=True)
    checks.check_out(out, v)
    checks.check_state("initial_state", initial_state, p, q.device, state_v_first=True)
    checks.check_state("final_state", final_state, p, q.device, state_v_first=True)
    reads = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state,
                 cu_seqlens=cu_seqlens)
    checks.check_no_alias(dict(out=out, final_state=final_state), reads,
                          allowed=(("final_state", "initial_state"),))
    _check_no_grad(q, k, v, g, beta, A_log, dt_bias, initial_state)
    with torch.no_grad():
        forward(q, k, v, g, beta, scale=scale, out=out, final_state=final_state, A_log=A_log, dt_bias=dt_bias,
                lower_bound=lower_bound, initial_state=initial_state, cu_seqlens=cu_seqlens, state_v_first=True,
                use_qk_l2norm=True, use_gate=True, use_beta_sigmoid=True, max_seqlen=p.max_seqlen)


_UNSUPPORTED_KWARGS = {
    # name: (value that is fine, reason when another value is given)
    "allow_neg_eigval": (False, "negative eigenvalues (beta in [0, 2)) are not implemented"),
    "return_intermediate_states": (False, "intermediate states are not returned"),
    "cp_context": (None, "context parallelism is not supported"),
    "use_graph": (False, "fastkda needs no graph-mode option: it never syncs with the host, so it can be "
                         "captured in a CUDA graph as it is"),
}
_IGNORED_KWARGS = ("disable_recompute", "max_num_seqs", "chunk_size")


def check_chunk_kda(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
    use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, safe_gate=False, lower_bound=None,
    state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, A_log=None, dt_bias=None, **kwargs,
) -> dict:
    """Check a :func:`chunk_kda` call; return the keyword arguments of :func:`forward` (less out/final_state)
    and the problem shape. Raises exactly what :func:`chunk_kda` would raise, and touches no tensor data."""
    for name, value in kwargs.items():
        if name in _UNSUPPORTED_KWARGS:
            ok, reason = _UNSUPPORTED_KWARGS[name]
            if value is not ok and value != ok:
                raise NotImplementedError(f"{name}={value!r}: {reason}")
        elif name not in _IGNORED_KWARGS:
            raise TypeError(f"chunk_kda() got an unexpected keyword argument {name!r}")
    p = checks.check_inputs(q, k, v, g, beta)
    p = checks.check_cu_seqlens(cu_seqlens, p, q.device, cu_seqlens_cpu)
    scale = p.K ** -0.5 if scale is None else checks.check_scale(scale)
    if use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError("lower_bound: required with use_gate_in_kernel=True (fastkda implements the "
                             "bounded gate lower_bound * sigmoid(exp(A_log) * (g + dt_bias)), in [-5, 0))")
        lower_bound = checks.check_lower_bound(lower_bound)
        checks.check_gate_params(A_log, dt_bias, p, q.device, A_log_required=False)
    else:
        if not safe_gate:
            raise ValueError("safe_gate: with use_gate_in_kernel=False, g is a precomputed log-decay that "
                             "fastkda requires to lie in [-5, 0]; pass safe_gate=True to assert it")
        A_log = dt_bias = None
        lower_bound = None
    checks.check_state("initial_state", initial_state, p, q.device, state_v_first)
    _check_no_grad(q, k, v, g, beta, A_log, dt_bias, initial_state)
    return dict(problem=p, scale=scale, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                initial_state=initial_state, cu_seqlens=cu_seqlens, state_v_first=state_v_first,
                use_qk_l2norm=use_qk_l2norm_in_kernel, use_gate=use_gate_in_kernel,
                use_beta_sigmoid=use_beta_sigmoid_in_kernel, max_seqlen=p.max_seqlen)


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    safe_gate: bool = False,
    lower_bound: Optional[float] = None,
    state_v_first: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
    A_log: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    **kwargs,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """KDA forward with fla's ``chunk_kda`` keyword names; returns ``(o, final_state)``.

    Args:
        q, k: ``[B, T, H, K]``.  v: ``[B, T, HV, V]``.  g: ``[B, T, HV, K]``.  beta: ``[B, T, HV]``.
        scale: defaults to ``K ** -0.5``.
        initial_state: optional ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``), bf16 or fp32.
        output_final_state: return the final state (fp32, same layout) as the second result.
        use_qk_l2norm_in_kernel: l2-normalise q and k (eps 1e-6 inside the square root).
        use_gate_in_kernel: ``g`` is the raw gate input; the log-decay is
            ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (without ``A_log``:
            ``lower_bound * sigmoid(g + dt_bias)``). ``lower_bound`` is then required, in ``[-5, 0)``.
            When False, ``g`` is already the per-channel log-decay and must lie in ``[-5, 0]``, which the
            caller asserts with ``safe_gate=True`` (fla's contract for bounded gates).
        use_beta_sigmoid_in_kernel: ``beta`` holds logits; otherwise it is already in ``[0, 1]``.
        safe_gate: the gates are bounded below by -5 (required when ``use_gate_in_kernel=False``).
        lower_bound: see ``use_gate_in_kernel``.
        state_v_first: states in ``[N, HV, V, K]`` layout (FlashKDA's) instead of ``[N, HV, K, V]``.
        cu_seqlens: ``[N+1]`` int32/int64 offsets of packed sequences (then ``B == 1``).
        cu_seqlens_cpu: optional CPU copy of ``cu_seqlens``: its values are checked without a sync, and the
            longest sequence steers the route (as in :func:`fwd`).
        A_log: ``[HV]`` fp32.  dt_bias: ``[HV, K]`` or ``[HV * K]`` fp32, optional.

    fla-only options that change nothing here (``disable_recompute``, ``max_num_seqs``, ``chunk_size``)
    are accepted and ignored; options fastkda does not implement raise ``NotImplementedError``. Forward
    only: inputs that require grad raise unless grad mode is off.
    """
    call = check_chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                           use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                           safe_gate=safe_gate, lower_bound=lower_bound, state_v_first=state_v_first,
                           cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, A_log=A_log, dt_bias=dt_bias, **kwargs)
    p = call.pop("problem")
    out = torch.empty_like(v)
    final_state = None
    if output_final_state:
        final_state = torch.empty(checks.state_shape(p, state_v_first), dtype=torch.float32, device=q.device)
    with torch.no_grad():
        forward(q, k, v, g, beta, out=out, final_state=final_state, **call)
    return out, final_state
