"""Argument checks for the public entry points.

Every check runs before anything is written, and every failure raises a ``ValueError`` or ``TypeError``
that names the argument and says what was expected. The checks read shapes, dtypes, devices, strides and
storage addresses only -- never tensor values on a GPU, which would synchronise the host with the device.
The values of ``cu_seqlens`` are checked when they are on the CPU (or given as ``cu_seqlens_cpu``), or on
any device when strict checks are on (``FASTKDA_STRICT_CHECKS=1`` or :func:`set_strict_checks`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch

SUPPORTED_HEAD_DIMS = (64, 128)
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
STATE_DTYPES = (torch.bfloat16, torch.float32)
LOWER_BOUND_RANGE = (-5.0, 0.0)  # [-5, 0): per-step decay >= exp(-5) keeps every chunk factor representable

_strict = os.environ.get("FASTKDA_STRICT_CHECKS", "0") not in ("", "0")


def set_strict_checks(enabled: bool) -> None:
    """Turn on (or off) value checks of device-resident ``cu_seqlens``; they cost a host-device sync."""
    global _strict
    _strict = bool(enabled)


def strict_checks() -> bool:
    return _strict


@dataclass(frozen=True)
class Problem:
    """The shape of one validated call."""

    B: int            # batch (1 with cu_seqlens)
    T: int            # tokens per batch row
    H: int            # q/k heads
    HV: int           # v/g/beta/state heads (a multiple of H)
    K: int            # key dim
    V: int            # value dim
    N: int            # sequences (B, or len(cu_seqlens) - 1)
    varlen: bool
    max_seqlen: Optional[int] = None   # the longest sequence, where its length is known without a sync


def _tensor(name: str, x, *, ndim: Optional[int] = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(x.shape)}")
    return x


def _device(name: str, x: torch.Tensor, device: torch.device) -> None:
    if x.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (the device of q), got {x.device}")


def _contiguous(name: str, x: torch.Tensor) -> None:
    if not x.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous()), got strides {x.stride()}")


def _shape(name: str, x: torch.Tensor, expected: tuple, meaning: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)} {meaning}, got {tuple(x.shape)}")


def _span(x: torch.Tensor):
    """Byte range [start, end) the tensor can touch in its storage."""
    if x.numel() == 0:
        return None
    start = x.data_ptr()
    if x.is_contiguous():     # the common case, without the per-dimension sum (runs ~10 times per call)
        return start, start + x.numel() * x.element_size()
    extent = sum((s - 1) * st for s, st in zip(x.shape, x.stride())) + 1
    return start, start + extent * x.element_size()


def _spans_overlap(a: torch.Tensor, sa, b: torch.Tensor, sb) -> bool:
    """Whether tensors a and b, with byte spans sa and sb (_span), can touch the same memory (the byte ranges are
    compared before the devices: the cheaper test first)."""
    if sa is None or sb is None:
        return False
    return sa[0] < sb[1] and sb[0] < sa[1] and a.device == b.device


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    return _spans_overlap(a, _span(a), b, _span(b))


def check_scale(scale) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite real number, got {scale!r}")
    return float(scale)


def check_lower_bound(lower_bound) -> float:
    lo, hi = LOWER_BOUND_RANGE
    if isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float)) or math.isnan(lower_bound):
        raise ValueError(f"lower_bound: expected a real number in [{lo}, {hi}), got {lower_bound!r}")
    if not lo <= lower_bound < hi:
        raise ValueError(f"lower_bound: expected a value in the supported range [{lo}, {hi}), got {lower_bound}")
    return float(lower_bound)


def check_inputs(q, k, v, g, beta) -> Problem:
    """q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K]; beta [B, T, HV]; one device, one dtype."""
    q = _tensor("q", q, ndim=4)
    k = _tensor("k", k, ndim=4)
    v = _tensor("v", v, ndim=4)
    g = _tensor("g", g, ndim=4)
    beta = _tensor("beta", beta, ndim=3)
    device = q.device
    if q.dtype not in INPUT_DTYPES:
        raise ValueError(f"q: expected dtype in {INPUT_DTYPES}, got {q.dtype}")
    for name, x in (("k", k), ("v", v), ("g", g)):
        _device(name, x, device)
        if x.dtype != q.dtype:
            raise ValueError(f"{name}: expected dtype {q.dtype} (the dtype of q), got {x.dtype}")
    _device("beta", beta, device)
    if beta.dtype not in (q.dtype, torch.float32):
        raise ValueError(f"beta: expected dtype {q.dtype} (the dtype of q) or torch.float32, got {beta.dtype}")
    B, T, H, K = q.shape
    if K not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"q: unsupported head dim K={K}; supported: {SUPPORTED_HEAD_DIMS}")
    _shape("k", k, (B, T, H, K), "(the shape of q)")
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected shape ({B}, {T}, HV, V) with B, T of q, got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if V not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"v: unsupported head dim V={V}; supported: {SUPPORTED_HEAD_DIMS}")
    if H < 1:
        raise ValueError(f"q: expected at least one head, got shape {tuple(q.shape)}")
    if HV < H or HV % H:
        raise ValueError(f"v: its head count HV={HV} must be a positive multiple of the q/k head count H={H}")
    _shape("g", g, (B, T, HV, K), "[B, T, HV, K]")
    _shape("beta", beta, (B, T, HV), "[B, T, HV]")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _contiguous(name, x)
    return Problem(B=B, T=T, H=H, HV=HV, K=K, V=V, N=B, varlen=False, max_seqlen=T)


def check_cu_seqlens(cu_seqlens, p: Problem, device: torch.device, cu_seqlens_cpu=None) -> Problem:
    """cu_seqlens [N+1]: integer, 1-D, from 0, non-decreasing, ending at the token count; B must be 1."""
    if cu_seqlens is None:
        return p
    cu = _tensor("cu_seqlens", cu_seqlens)
    if cu.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens: expected dtype torch.int32 or torch.int64, got {cu.dtype}")
    if cu.dim() != 1:
        raise ValueError(f"cu_seqlens: expected a 1-D tensor [N+1], got shape {tuple(cu.shape)}")
    if cu.numel() < 2:
        raise ValueError(f"cu_seqlens: expected at least 2 entries [0, ..., total tokens], got {cu.numel()}")
    _device("cu_seqlens", cu, device)
    _contiguous("cu_seqlens", cu)
    if p.B != 1:
        raise ValueError(f"q: with cu_seqlens the batch size must be 1 (sequences packed along T), got B={p.B}")
    values = max_seqlen = None
    if cu_seqlens_cpu is not None:
        values = _tensor("cu_seqlens_cpu", cu_seqlens_cpu)
        if values.shape != cu.shape:
            raise ValueError(f"cu_seqlens_cpu: expected shape {tuple(cu.shape)} (that of cu_seqlens), "
                             f"got {tuple(values.shape)}")
    elif cu.device.type == "cpu" or _strict:
        values = cu
    if values is not None:
        max_seqlen = _cu_seqlens_values(values, p.T)
    return Problem(B=p.B, T=p.T, H=p.H, HV=p.HV, K=p.K, V=p.V, N=cu.numel() - 1, varlen=True,
                   max_seqlen=max_seqlen)


# Up to this many sequences the values are walked in Python (a few µs); beyond, tensor operations cost less
# (10,000 sequences: ~3 ms walked, ~30 µs as tensor operations on the host).
_CU_SEQLENS_WALK_MAX = 256


def _cu_seqlens_values(values: torch.Tensor, T: int) -> int:
    """Checks the offsets' values (from 0, non-decreasing, ending at T); returns the longest sequence."""
    if values.numel() <= _CU_SEQLENS_WALK_MAX + 1:
        vals = values.tolist()
        lengths = [b - a for a, b in zip(vals, vals[1:])]
        first_bad = next((i for i, n in enumerate(lengths, 1) if n < 0), None)
        longest = max(lengths)
    else:
        vals = values.to("cpu", torch.int64)
        lengths = vals[1:] - vals[:-1]
        bad = (lengths < 0).nonzero()
        first_bad = int(bad[0]) + 1 if bad.numel() else None
        longest = int(lengths.max())
    if vals[0] != 0:
        raise ValueError(f"cu_seqlens: expected to start at 0, got {int(vals[0])}")
    if first_bad is not None:
        raise ValueError(f"cu_seqlens: expected non-decreasing values, got {int(vals[first_bad - 1])} then "
                         f"{int(vals[first_bad])} at index {first_bad}")
    if vals[-1] != T:
        raise ValueError(f"cu_seqlens: expected to end at the token count T={T}, got {int(vals[-1])}")
    return longest


def check_gate_params(A_log, dt_bias, p: Problem, device: torch.device, *, A_log_required: bool) -> None:
    """A_log fp32 [HV]; dt_bias fp32 [HV, K] or flat [HV*K]."""
    if A_log is None:
        if A_log_required:
            raise ValueError(f"A_log: expected a float32 tensor of shape ({p.HV},), got None")
    else:
        A_log = _tensor("A_log", A_log)
        _device("A_log", A_log, device)
        if A_log.dtype != torch.float32:
            raise ValueError(f"A_log: expected dtype torch.float32, got {A_log.dtype}")
        _shape("A_log", A_log, (p.HV,), "[HV]")
        _contiguous("A_log", A_log)
    if dt_bias is not None:
        dt_bias = _tensor("dt_bias", dt_bias)
        _device("dt_bias", dt_bias, device)
        if dt_bias.dtype != torch.float32:
            raise ValueError(f"dt_bias: expected dtype torch.float32, got {dt_bias.dtype}")
        if tuple(dt_bias.shape) not in ((p.HV, p.K), (p.HV * p.K,)):
            raise ValueError(f"dt_bias: expected shape ({p.HV}, {p.K}) or ({p.HV * p.K},), got {tuple(dt_bias.shape)}")
        _contiguous("dt_bias", dt_bias)


INDEX_LIMIT = 2 ** 31  # the Triton kernels compute element offsets in 32-bit integers


def check_index_range(T_total: int, H: int, HV: int, K: int, V: int, N: int, chunk_size: int) -> None:
    """Reject problems whose tensors have more elements than 32-bit offsets can address."""
    per_token = max(H, HV) * max(K, V, chunk_size)
    if T_total * per_token >= INDEX_LIMIT:
        raise ValueError(f"q: {T_total} tokens x {per_token} values per token exceed the 2^31 elements the "
                         f"kernels can index; split the batch into calls of fewer than "
                         f"{(INDEX_LIMIT - 1) // per_token} tokens")
    if N * HV * K * V >= INDEX_LIMIT:
        raise ValueError(f"initial_state/final_state: {N} sequences x {HV} heads x {K}x{V} exceed the 2^31 "
                         f"elements the kernels can index; split the batch")


def state_shape(p: Problem, state_v_first: bool) -> tuple:
    return (p.N, p.HV, p.V, p.K) if state_v_first else (p.N, p.HV, p.K, p.V)


def check_state(name: str, state, p: Problem, device: torch.device, state_v_first: bool) -> None:
    if state is None:
        return
    state = _tensor(name, state, ndim=4)
    _device(name, state, device)
    if state.dtype not in STATE_DTYPES:
        raise ValueError(f"{name}: expected dtype in {STATE_DTYPES}, got {state.dtype}")
    layout = "[N, HV, V, K] (state_v_first)" if state_v_first else "[N, HV, K, V]"
    _shape(name, state, state_shape(p, state_v_first), layout)
    _contiguous(name, state)


def check_out(out, v: torch.Tensor) -> None:
    out = _tensor("out", out, ndim=4)
    _device("out", out, v.device)
    if out.dtype != v.dtype:
        raise ValueError(f"out: expected dtype {v.dtype} (the dtype of v), got {out.dtype}")
    _shape("out", out, tuple(v.shape), "(the shape of v)")
    _contiguous("out", out)


def check_no_alias(writes: dict, reads: dict, allowed: tuple = ()) -> None:
    """No written tensor may overlap an input or another written tensor.

    ``allowed`` lists (write name, read name) pairs that may be the very same tensor (an in-place state
    update: final_state is initial_state).
    """
    # Each tensor's span once: this runs on every call, and the pairs are many (host time, not device time).
    w_items = [(n, t, _span(t)) for n, t in writes.items() if t is not None]
    r_items = [(n, t, _span(t)) for n, t in reads.items() if t is not None]
    for i, (wn, w, sw) in enumerate(w_items):
        for rn, r, sr in r_items:
            if not _spans_overlap(w, sw, r, sr):
                continue
            same = (sw[0] == sr[0] and w.shape == r.shape and w.stride() == r.stride() and w.dtype == r.dtype)
            if (wn, rn) in allowed and same:
                continue
            raise ValueError(f"{wn}: must not share memory with the input {rn}")
        for wn2, w2, sw2 in w_items[i + 1:]:
            if _spans_overlap(w, sw, w2, sw2):
                raise ValueError(f"{wn}: must not share memory with {wn2}")
