"""Error metrics of the validation suite and the thresholds they are judged against.

Every comparison is against float64 ground truth computed from the *same* bf16 inputs, upcast (see
:mod:`fastkda.validation.suite`). Three criteria per case, all evaluated in float64:

* **relative L2 error** of ``out`` and of ``final_state``::

      ||x - ref||_2 / max(||ref||_2, floor)

  over the whole tensor. ``floor`` (see :func:`magnitude_floor`) only matters when the reference is
  legitimately near zero; otherwise it is ``||ref||``.

* **per-token error** of ``out``: every token's output vector (all heads of token t, ``HV * V`` values) must
  be close, not just the average::

      max_t ||o_t - ref_t||_2  /  max(RMS_t ||ref_t||_2, floor)      <=  5e-2

  A relative L2 error over many tokens hides a few bad tokens (one corrupted token in 2,500 moves the L2
  error by 1/sqrt(2500) of its own error); this criterion does not.

* **finiteness**: no NaN or Inf anywhere in ``out`` or ``final_state``. The suite fills both buffers with NaN
  before each call, so an element an implementation forgot to write fails here.

Thresholds (:class:`Thresholds`, one per case) and why
------------------------------------------------------

``DEFAULT`` -- rel L2 5e-3 for out and final state, per-token 5e-2: the project's bar. On the H200 the
peers measured (KDA.md §4/§6, ``peers-h200.json``): fla 4.1e-3 / 2.9e-3 (out / state) on the standard
accuracy case and at most 4.3e-3 on every stress case except slow decay; FlashKDA 5.7e-3 / 4.6e-3. An
implementation that keeps bf16 intermediates no worse than fla's passes with margin; one worse than
FlashKDA's does not. Used by the quick, random, varlen and model tiers and by every extreme case except
the slow-decay ones below.

``SLOW_DECAY`` -- rel L2 1e-2 for out and final state: only for cases whose log-decay is everywhere
close to 0 (memory longer than the sequence: the gate pinned near zero by g = -50, or lower_bound -0.01),
i.e. the extreme tier's slow-decay cases and the long tier. Measured reason: on exactly this case
(g = -50, one sequence of 2,000 tokens) fla's error is 5.2e-3 / 4.5e-3 and FlashKDA's 7.8e-3 / 7.4e-3 --
already above 5e-3 for the better peer, because rounding errors stop decaying away when nothing decays,
and they grow with the memory length. 1e-2 is about 2x fla's measured error on the case, and the cap the
project allows (never above 1e-2). It is still 10x to 100x below what the window-keeping cheats score on
the long tier (the long tier checks this margin every run).

The per-token threshold is 5e-2 everywhere. Its yardstick is the RMS token norm, except for
``OUTLIER_TOKENS``: extreme cases whose first outputs are dominated by the initial state and dwarf the
rest (beta logits -30: nothing is written; v x 1e-3; initial state x 1e3). There the first token's norm is
22x the RMS token norm, and rounding the *exact* float64 output to bf16 already gives a per-token error of
3.6e-2 to 4.0e-2 of the RMS (measured on the CPU, 2026-11-30; 3.7e-3 on an ordinary case): the criterion
would measure the output dtype's quantisation of one token, not correctness. For these cases a token is
judged against the larger of the RMS token norm and its own norm: ``||o_t - ref_t|| <= 5e-2 * max(RMS,
||ref_t||)``. A token that is itself wrong by more than 5% still fails; relative L2 stays at 5e-3.
``HEAVY_TAILS`` (the random tier's Student-t case) uses the same yardstick for the same reason, found in
session 8: Student-t(3) draws now and then hold one value ~200x the RMS, and the token that carries it is
~12x the RMS token norm. Implementations whose products take bf16 operands err in proportion to a token's
own norm, so that one token decides the RMS-judged error: on run seed 844207220 fla 6.1e-2, fastkda 6.7e-2
(every build since v20 alike; ~0.5% of the token's own norm), the exact output rounded to bf16 1.4e-2;
other seeds give 1.5e-2 to 4.3e-2.

Near-zero references: the floor
-------------------------------

A final state decayed to ~1e-13 (gate pinned at the lower bound with beta logits -30: every write is
scaled by sigmoid(-30) ~ 1e-13) is legitimately near zero, and relative error on it measures nothing
useful. For such quantities error is judged as ``err <= thr * max(||ref||, floor)`` with::

    floor = FLOOR_FRACTION * input_scale * sqrt(numel)          (state; out additionally times `scale`)
    input_scale = max(RMS(v), RMS(initial_state))

``input_scale * sqrt(numel)`` is the L2 norm the quantity would have if every element were as large as a
typical input (the delta rule stores values: a state column holds a combination of v's, and the initial
state enters it directly; an output is ``scale * q̂ᵀS``). ``FLOOR_FRACTION = 1e-6``: a state whose RMS
element is a millionth of the input scale changes any later output by about a millionth of the output
scale, thousands of times below the resolution of a bf16 output (2^-8 ~ 3.9e-3 relative). So a reference
below the floor is physically negligible, while any reference a model would notice is judged fully
relative. The allowed error at the floor is thr * floor, i.e. an RMS error of 5e-9 of the input scale per
element: the floor never excuses an error on a quantity of ordinary size. The floor scales
with the inputs: v scaled by 1e-3 lowers it by 1e-3 too, so small-but-meaningful outputs stay fully judged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

import torch

# --------------------------------------------------------------------------------------------------------
# Thresholds
# --------------------------------------------------------------------------------------------------------

REL_L2_THRESHOLD = 5e-3
"""Relative L2 error bound for out and final state (fla measures 4.1e-3 / 2.9e-3 on the standard case)."""

SLOW_DECAY_REL_L2_THRESHOLD = 1e-2
"""Relative L2 bound for slow-decay cases: fla measures 5.2e-3 / 4.5e-3 on g = -50 over 2,000 tokens
(FlashKDA 7.8e-3 / 7.4e-3); ~2x fla, and the project's cap."""

TOKEN_THRESHOLD = 5e-2
"""Per-token bound: max_t ||o_t - ref_t|| <= 5e-2 * RMS_t ||ref_t||."""

MAX_THRESHOLD = 1e-2
"""No relative L2 threshold may exceed this, whatever the tier."""

FLOOR_FRACTION = 1e-6
"""Absolute floor as a fraction of the inputs' scale times sqrt(element count); see the module docstring."""


@dataclass(frozen=True)
class Thresholds:
    """Bounds one case is judged against, with the reason they are what they are.

    ``token_own_norm``: judge each token against max(RMS token norm, its own norm) (see module docstring).
    """

    out: float = REL_L2_THRESHOLD
    state: float = REL_L2_THRESHOLD
    token: float = TOKEN_THRESHOLD
    token_own_norm: bool = False
    reason: str = "project bar: rel L2 5e-3 (fla measures <= 4.3e-3 on every standard and stress case but slow decay)"

    def __post_init__(self):
        for name in ("out", "state"):
            value = getattr(self, name)
            if not 0 < value <= MAX_THRESHOLD:
                raise ValueError(f"threshold {name}={value}: must lie in (0, {MAX_THRESHOLD}]")

    def as_dict(self) -> dict:
        return asdict(self)


DEFAULT = Thresholds()
SLOW_DECAY = Thresholds(
    out=SLOW_DECAY_REL_L2_THRESHOLD,
    state=SLOW_DECAY_REL_L2_THRESHOLD,
    reason="slow decay (memory longer than the sequence): fla measures 5.2e-3 / 4.5e-3 and FlashKDA "
           "7.8e-3 / 7.4e-3 on g=-50 over 2000 tokens; bound ~2x fla, capped at 1e-2",
)

OUTLIER_TOKENS = Thresholds(
    token_own_norm=True,
    reason="first outputs dominated by the initial state, 22x the RMS token norm: bf16 rounding of the exact "
           "output alone gives 3.6e-2..4.0e-2 per-token error; tokens judged against max(RMS, own norm)",
)

HEAVY_TAILS = Thresholds(
    token_own_norm=True,
    reason="Student-t(3) inputs: a draw can hold one value ~200x the RMS (v = 342 at RMS 1.75, run seed "
           "844207220) and a token 12x the RMS token norm; bf16 operands err in proportion to a token's own "
           "norm: on that draw fla 6.1e-2 and fastkda 6.7e-2 against the RMS (~0.5% of the token's own norm), "
           "the exact output rounded to bf16 1.4e-2; tokens judged against max(RMS, own norm)",
)

# --------------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------------


def _f64(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to(torch.float64)


def rms(x: Optional[torch.Tensor]) -> float:
    """Root mean square of all elements (0 for None or an empty tensor)."""
    if x is None or x.numel() == 0:
        return 0.0
    return float(_f64(x).square().mean().sqrt())


def is_finite(x: Optional[torch.Tensor]) -> bool:
    """True when every element is finite (no NaN, no Inf); None and empty tensors are finite."""
    return x is None or x.numel() == 0 or bool(torch.isfinite(x).all())


def magnitude_floor(input_scale: float, numel: int, fraction: float = FLOOR_FRACTION) -> float:
    """Absolute floor for the norm of a reference of ``numel`` elements: ``fraction * input_scale * sqrt(numel)``.

    ``input_scale`` is the typical magnitude of one element of the inputs feeding the quantity (see the
    module docstring for the choice); below the floor, a reference is treated as physically zero.
    """
    return fraction * input_scale * math.sqrt(max(numel, 0))


def relative_l2(x: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> float:
    """``||x - ref||_2 / max(||ref||_2, floor)`` in float64.

    Non-finite ``x`` gives ``inf``. Both norms zero (an empty tensor, or an exactly zero reference matched
    exactly) gives 0; a nonzero error against a zero reference with no floor gives ``inf``.
    """
    if x.shape != ref.shape:
        raise ValueError(f"relative_l2: shapes differ, {tuple(x.shape)} vs {tuple(ref.shape)}")
    if not is_finite(x):
        return math.inf
    err = float(torch.linalg.vector_norm(_f64(x) - _f64(ref)))
    denom = max(float(torch.linalg.vector_norm(_f64(ref))), floor)
    if err == 0.0:
        return 0.0
    return err / denom if denom > 0 else math.inf


def token_error(out: torch.Tensor, ref: torch.Tensor, floor: float = 0.0, own_norm: bool = False) -> float:
    """Per-token error of an output ``[B, T, HV, V]``: ``max_t ||o_t - ref_t|| / max(RMS_t ||ref_t||, floor)``
    (with ``own_norm``, the denominator of token t is ``max(RMS, ||ref_t||, floor)``).

    A token's vector is all its heads (``HV * V`` values); tokens of every batch row and packed sequence
    count alike. ``floor`` is the absolute floor for one token's norm. Non-finite ``out`` gives ``inf``; no
    tokens gives 0.
    """
    if out.shape != ref.shape:
        raise ValueError(f"token_error: shapes differ, {tuple(out.shape)} vs {tuple(ref.shape)}")
    if not is_finite(out):
        return math.inf
    rows = out.shape[0] * out.shape[1]
    if rows == 0 or out.numel() == 0:
        return 0.0
    diff = (_f64(out) - _f64(ref)).reshape(rows, -1)
    ref_norms = torch.linalg.vector_norm(_f64(ref).reshape(rows, -1), dim=1)
    errors = torch.linalg.vector_norm(diff, dim=1)
    typical = max(float(ref_norms.square().mean().sqrt()), floor)
    if float(errors.max()) == 0.0:
        return 0.0
    if typical <= 0:
        return math.inf
    scale = ref_norms.clamp_min(typical) if own_norm else torch.full_like(ref_norms, typical)
    return float((errors / scale).max())


def worst_token(out: torch.Tensor, ref: torch.Tensor) -> int:
    """Flat index (b * T + t) of the token with the largest error norm (for failure messages)."""
    rows = out.shape[0] * out.shape[1]
    diff = (_f64(out) - _f64(ref)).reshape(rows, -1)
    diff = torch.nan_to_num(diff, nan=math.inf)
    return int(torch.linalg.vector_norm(diff, dim=1).argmax())


def dominant_head(out: torch.Tensor, ref: torch.Tensor) -> Tuple[int, float, float]:
    """(head, its share of ||ref||², its own relative L2 error) for the value head with the largest reference
    norm, out and ref ``[B, T, HV, V]`` (for failure messages: when one head holds most of the output, the
    case's relative L2 is that head's error -- a long-memory head, say)."""
    ref64 = _f64(ref)
    per_head = ref64.square().sum(dim=(0, 1, 3))
    total = float(per_head.sum())
    h = int(per_head.argmax())
    if total == 0.0:
        return h, 0.0, math.inf
    err = float((_f64(out[:, :, h]) - ref64[:, :, h]).square().sum().sqrt())
    return h, float(per_head[h]) / total, err / max(float(per_head[h].sqrt()), 1e-300)
