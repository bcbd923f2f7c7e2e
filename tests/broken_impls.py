"""Deliberately broken KDA implementations, for proving that the validation suite fails them.

Each has FlashKDA's ``fwd`` signature and wraps the correct float32 chunked reference
(:func:`fastkda.reference.kda_chunked`), breaking exactly one thing -- the kind of shortcut a fast but wrong
kernel takes. The tests in ``test_validation.py`` run the suite on each and assert that it fails, on the
case and criterion that should catch it. Usable from the command line too::

    python -m fastkda.validation --impl tests.broken_impls:ignores_initial_state --tier extreme
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch

from fastkda.reference import kda_chunked, kda_gate

PARTIAL_CHUNK = 64


def _reference(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens, **kwargs):
    return kda_chunked(q, k, v, g, beta, scale=scale, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                       initial_state=initial_state, cu_seqlens=cu_seqlens, state_v_first=True,
                       dtype=torch.float32, **kwargs)


def _segments(q: torch.Tensor, cu_seqlens: Optional[torch.Tensor]) -> List[Tuple[int, int, int]]:
    """(batch row, first token, end token) of every sequence."""
    B, T = q.shape[0], q.shape[1]
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    cu = cu_seqlens.tolist()
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def _write(out, final_state, o, s) -> None:
    out.copy_(o)
    if final_state is not None:
        final_state.copy_(s)


# ---- (1) keeps only a recent window of context -------------------------------------------------------------


def windowed(window: int):
    """An implementation that sees only a recent window: each block of ``window`` tokens is computed from the
    previous block and itself (``window`` to ``2 * window - 1`` tokens of context), starting from a zero
    state (the initial state only for a sequence's first block). The final state is the last window's.
    Exact whenever the gates forget within ``window`` tokens -- as they do on benchmark-like inputs."""

    def fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
            final_state=None, cu_seqlens=None) -> None:
        segs = _segments(q, cu_seqlens)
        HV, V, K = v.shape[2], v.shape[3], q.shape[3]
        windows = []  # (row, window start, window end, first output token, sequence index)
        for n, (b, t0, t1) in enumerate(segs):
            for c0 in range(t0, t1, window):
                windows.append((b, max(t0, c0 - window), min(t1, c0 + window), c0, n))
        s = None
        if windows:
            lens = torch.tensor([w[2] - w[1] for w in windows])
            rows = torch.repeat_interleave(torch.tensor([w[0] for w in windows]), lens).to(q.device)
            idx = torch.cat([torch.arange(w[1], w[2]) for w in windows]).to(q.device)
            pick = lambda x: x[rows, idx].unsqueeze(0)  # noqa: E731
            cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(q.device)
            s0 = torch.zeros(len(windows), HV, V, K, dtype=torch.float32, device=q.device)
            if initial_state is not None:
                for i, w in enumerate(windows):
                    if w[1] == segs[w[4]][1]:
                        s0[i] = initial_state[w[4]].float()
            o, s = _reference(pick(q), pick(k), pick(v), pick(g), pick(beta), scale, A_log, dt_bias,
                              lower_bound, s0, cu)
            pos = 0
            for b, ws, we, c0, n in windows:
                out[b, c0:we] = o[0, pos + (c0 - ws):pos + (we - ws)].to(out.dtype)
                pos += we - ws
        last = {w[4]: i for i, w in enumerate(windows)}
        if final_state is not None:
            for n in range(len(segs)):
                if n in last:
                    final_state[n] = s[last[n]].to(final_state.dtype)
                elif initial_state is not None:
                    final_state[n] = initial_state[n].to(final_state.dtype)
                else:
                    final_state[n] = 0

    fwd.__name__ = fwd.__qualname__ = f"window_{window}"
    return fwd


window_32 = windowed(32)
window_1024 = windowed(1024)


# ---- (2) gate in the wrong log base -----------------------------------------------------------------------


def exp2_gate(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
              final_state=None, cu_seqlens=None) -> None:
    """Decays by 2**a instead of e**a (a kernel that uses exp2 without rescaling by log2(e))."""
    a = kda_gate(g.float(), A_log, dt_bias, lower_bound)
    natural = a * math.log(2.0)  # 2**a == e**(a ln 2)
    o, s = kda_chunked(q, k, v, natural, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                       state_v_first=True, use_gate=False, dtype=torch.float32)
    _write(out, final_state, o, s)


# ---- (3) leaves the last partial chunk unwritten ----------------------------------------------------------


def skips_partial_chunk(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                        final_state=None, cu_seqlens=None) -> None:
    """Writes only the tokens up to the last multiple of 64 in each sequence; the rest of ``out`` is left
    as it was. The final state is right."""
    o, s = _reference(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens)
    for b, t0, t1 in _segments(q, cu_seqlens):
        full = t0 + (t1 - t0) // PARTIAL_CHUNK * PARTIAL_CHUNK
        out[b, t0:full] = o[b, t0:full].to(out.dtype)
    if final_state is not None:
        final_state.copy_(s)


# ---- (4) ignores initial_state ----------------------------------------------------------------------------


def ignores_initial_state(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                          final_state=None, cu_seqlens=None) -> None:
    """Always starts from a zero state."""
    o, s = _reference(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, None, cu_seqlens)
    _write(out, final_state, o, s)


# ---- (5) replays stored outputs -----------------------------------------------------------------------------


class ReplayingImpl:
    """Computes correctly the first time it sees a problem shape, records the outputs, and from then on
    returns the recorded outputs for that shape whatever the inputs: it passes any suite that reuses the
    inputs it was recorded on (a fixed seed), and nothing else."""

    def __init__(self):
        self.recorded: Dict[tuple, Tuple[torch.Tensor, Optional[torch.Tensor]]] = {}

    @staticmethod
    def _key(q, v, final_state, cu_seqlens) -> tuple:
        cu = None if cu_seqlens is None else tuple(cu_seqlens.tolist())
        fs = None if final_state is None else (tuple(final_state.shape), final_state.dtype)
        return tuple(q.shape), tuple(v.shape), fs, cu

    def __call__(self, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                 final_state=None, cu_seqlens=None) -> None:
        key = self._key(q, v, final_state, cu_seqlens)
        if key not in self.recorded:
            o, s = _reference(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens)
            self.recorded[key] = (o.to(out.dtype), None if final_state is None else s.to(final_state.dtype))
        o, s = self.recorded[key]
        _write(out, final_state, o, s)


replays_outputs = ReplayingImpl()


# ---- further single faults ----------------------------------------------------------------------------------


def one_token_off(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                  final_state=None, cu_seqlens=None) -> None:
    """Correct except one token of the first sequence (its middle one), moved by 10% of the RMS token norm.

    On a thousand tokens its relative L2 error stays under 5e-3 (0.1 / sqrt(T)); only the per-token
    criterion sees it."""
    o, s = _reference(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens)
    b, t0, t1 = _segments(q, cu_seqlens)[0]
    t = (t0 + t1) // 2
    rows = o.reshape(o.shape[0] * o.shape[1], -1)
    typical = rows.norm(dim=1).square().mean().sqrt()
    direction = torch.ones_like(o[b, t])
    o[b, t] += 0.1 * typical * direction / direction.norm()
    _write(out, final_state, o, s)


def one_nan(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
            final_state=None, cu_seqlens=None) -> None:
    """Correct except a single NaN in ``out``."""
    o, s = _reference(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens)
    o[0, -1, 0, 0] = float("nan")
    _write(out, final_state, o, s)


def skips_empty_sequences(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                          final_state=None, cu_seqlens=None) -> None:
    """Leaves the final state of empty sequences unwritten (they should carry the initial state)."""
    o, s = _reference(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens)
    out.copy_(o)
    if final_state is not None:
        for n, (b, t0, t1) in enumerate(_segments(q, cu_seqlens)):
            if t1 > t0:
                final_state[n] = s[n].to(final_state.dtype)


def raises(*args, **kwargs) -> None:
    """Crashes."""
    raise RuntimeError("deliberate failure")


def scribbles_on_inputs(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                        final_state=None, cu_seqlens=None) -> None:
    """Correct outputs, but uses ``q`` as scratch space afterwards (inputs must be left intact)."""
    o, s = _reference(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens)
    _write(out, final_state, o, s)
    q.zero_()


def writes_one_row_past_out(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                            final_state=None, cu_seqlens=None) -> None:
    """Correct outputs, and zeros in the token row after out's last (an off-by-one in a store's mask)."""
    o, s = _reference(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens)
    _write(out, final_state, o, s)
    row = out.shape[-2] * out.shape[-1]
    torch.as_strided(out, (out.numel() + row,), (1,), out.storage_offset())[out.numel():].zero_()


def writes_before_final_state(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                              final_state=None, cu_seqlens=None) -> None:
    """Correct outputs, and a zero in the element before final_state's first (a state slot indexed from −1)."""
    o, s = _reference(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens)
    _write(out, final_state, o, s)
    torch.as_strided(final_state, (1,), (1,), final_state.storage_offset() - 1).zero_()


def differs_on_repeat(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                      final_state=None, cu_seqlens=None) -> None:
    """Correct outputs on its first call; on every later one the last output element one step of its format off (a race
    that one call in several loses: every output is accurate, only a repeat tells)."""
    o, s = _reference(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens)
    _write(out, final_state, o, s)
    differs_on_repeat.calls += 1
    if differs_on_repeat.calls > 1:
        out.view(-1)[-1:].view({2: torch.int16, 4: torch.int32}[out.element_size()]).add_(1)   # one step up


differs_on_repeat.calls = 0


def l2norm_eps_outside_sqrt(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                            final_state=None, cu_seqlens=None) -> None:
    """Normalizes q and k as x / (|x| + 1e-6) instead of x / sqrt(|x|^2 + 1e-6): the same for ordinary rows,
    wrong for rows whose norm is near 1e-3."""
    def norm(x):
        x = x.float()
        return x / (x.norm(dim=-1, keepdim=True) + 1e-6)

    o, s = kda_chunked(norm(q), norm(k), v, g, beta, scale=scale, A_log=A_log, dt_bias=dt_bias,
                       lower_bound=lower_bound, initial_state=initial_state, cu_seqlens=cu_seqlens,
                       state_v_first=True, use_qk_l2norm=False, dtype=torch.float32)
    _write(out, final_state, o, s)


def zero_final_state(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                     final_state=None, cu_seqlens=None) -> None:
    """Correct outputs, final state all zeros."""
    o, s = _reference(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens)
    _write(out, final_state, o, torch.zeros_like(s))
