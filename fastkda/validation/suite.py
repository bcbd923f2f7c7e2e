"""The validation runner: calls an implementation on every case of the chosen tiers and judges it.

An implementation is any callable with FlashKDA's ``fwd`` signature::

    fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
        initial_state=None, final_state=None, cu_seqlens=None)

that writes ``out`` and ``final_state`` in place. For each case the runner

1. draws the inputs from the case's seed (on the CPU; the same seed gives the same inputs everywhere),
2. fills ``out`` and ``final_state`` with NaN (an element left unwritten fails the finiteness check), each a
   view into a buffer whose guard elements either side must be left as they were (GUARD_ELEMENTS),
3. calls the implementation on copies of the inputs on ``device`` (and checks it left its inputs intact),
4. computes the float64 truth from the *same* bf16 inputs, upcast:
   :func:`fastkda.reference.kda_recurrence` (the token recurrence) for short problems, on the CPU;
   :func:`fastkda.reference.kda_chunked` in float64 for long ones (tens of thousands of tokens), on the
   implementation's device when that is CUDA. The chunked float64 reference agrees with the recurrence to
   ~1e-15 relative (it forms every decay ratio exp(G_i - G_j) pairwise, so no factor overflows): measured
   at most 1.3e-15 on every small case of every tier and 3e-15 on the 4,096-token long case; the tests
   check it on slow-decay, pinned-gate, packed and long inputs,
5. judges out and final state with :mod:`fastkda.validation.metrics` against the case's thresholds, and
   for the long tier also checks that the case itself can tell a windowed implementation apart
   (:func:`window_sensitivity`).

Seeds: every run draws a fresh run seed unless one is given, for every tier; each case's seed is derived
from it and the case's tier and name (:func:`case_seed`), so a run -- or one case of it, with ``--case`` --
is replayed exactly by passing the run seed (``--seed``). Fresh seeds are what catches an implementation
that replays outputs it recorded for known inputs (or was tuned to them).

Public entry points: :func:`quick_check` (one benchmark-like case on a given shape, for the benchmark),
:func:`run_suite`, :func:`run_case`, and the implementations registry :func:`resolve_impl`.
"""

from __future__ import annotations

import bisect
import importlib
import json
import math
import os
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from .. import reference
from . import metrics
from .cases import TIERS, Case, KDAInputs, quick_case, tier_cases, window_inputs, window_output_index

Impl = Callable[..., None]

RECURRENCE_MAX_WORK = 65536 * 128 * 128
"""Largest problem (tokens x HV x K x V) whose truth the ``auto`` setting computes with the token recurrence
(on the CPU, a few seconds); larger problems use the float64 chunked reference on the implementation's device."""

CRITERIA = ("raised", "modified_input", "wrote_outside", "nondeterministic", "nonfinite", "out", "state", "token",
            "invalid_case")
"""Names of the failure criteria in :attr:`CaseResult.failed`: the call raised; it modified an input; it wrote
memory just before or after out or final_state; a repeated call (``calls`` > 1) gave other bits; NaN/Inf in out or
final_state (unwritten elements included); out / final-state relative L2 over threshold; per-token error over
threshold; the case could not tell a windowed implementation apart (the suite's own check)."""

GUARD_ELEMENTS = 4096
"""out and final_state are views into buffers with this many guard elements on either side, each holding a known
finite value; a guard element that changes is a write outside the output (a row past a sequence's end, a state
slot past the last). 4,096 elements keep the views' data pointers 16-byte aligned, as TMA requires."""

WINDOW_MARGIN = 10.0
"""The long tier's cases must put a windowed implementation this many times above the rel L2 threshold
(final state) ..."""

WINDOW_TOKEN_MARGIN = 2.0
"""... and this many times above the per-token threshold (last token of every sequence)."""


# --------------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    """The verdict on one case. Errors are ``None`` when not measured (the call raised).

    ``failed`` names the criteria that failed, from :data:`CRITERIA`; ``message`` says why in words.
    """

    tier: str
    name: str
    shape: str
    seed: int
    out_err: Optional[float]
    state_err: Optional[float]
    token_err: Optional[float]
    passed: bool
    message: str = ""
    failed: List[str] = field(default_factory=list)
    thresholds: Dict[str, float] = field(default_factory=dict)
    truth: str = ""
    about: str = ""
    impl_seconds: Optional[float] = None
    notes: str = ""

    def as_dict(self) -> dict:
        d = asdict(self)
        for key in ("out_err", "state_err", "token_err"):  # JSON has no inf
            if d[key] is not None and not math.isfinite(d[key]):
                d[key] = str(d[key])
        return d


@dataclass
class SuiteReport:
    """All results of one run, with what is needed to replay it."""

    impl: str
    device: str
    size: str
    run_seed: int
    tiers: List[str]
    results: List[CaseResult]
    seconds: float = 0.0
    calls: int = 1

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def failures(self) -> List[CaseResult]:
        return [r for r in self.results if not r.passed]

    def as_dict(self) -> dict:
        return {"impl": self.impl, "device": self.device, "size": self.size, "run_seed": self.run_seed,
                "tiers": self.tiers, "calls": self.calls, "passed": self.passed, "seconds": round(self.seconds, 2),
                "results": [r.as_dict() for r in self.results]}

    def to_json(self, indent: int = 1) -> str:
        return json.dumps(self.as_dict(), indent=indent)

    def table(self) -> str:
        return format_table(self.results)


def _fmt(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.2e}"


def format_table(results: Sequence[CaseResult]) -> str:
    """A fixed-width table: tier, case, shape, seed, the three errors, their limits, PASS/FAIL; then why
    each failed case failed."""
    head = ("tier", "case", "shape", "seed", "out err", "state err", "token err", "limits", "result")
    rows = []
    for r in results:
        t = r.thresholds
        limits = f"{t.get('out', 0):.0e}/{t.get('state', 0):.0e}/{t.get('token', 0):.0e}" if t else "-"
        rows.append((r.tier, r.name, r.shape, str(r.seed), _fmt(r.out_err), _fmt(r.state_err),
                     _fmt(r.token_err), limits, "PASS" if r.passed else "FAIL"))
    widths = [max(len(head[i]), *(len(row[i]) for row in rows)) if rows else len(head[i]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(head), line(["-" * w for w in widths])] + [line(row) for row in rows]
    notes = [f"  {r.tier}/{r.name}: {r.notes}" for r in results if r.notes]
    if notes:
        out += ["", "notes:"] + notes
    fails = [f"  {r.tier}/{r.name} (seed {r.seed}): {r.message}" for r in results if not r.passed]
    if fails:
        out += ["", "failures:"] + fails
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------------
# Ground truth
# --------------------------------------------------------------------------------------------------------


def _work(x: KDAInputs) -> int:
    return x.q.shape[0] * x.q.shape[1] * x.v.shape[2] * x.q.shape[3] * x.v.shape[3]


def truth_method(x: KDAInputs, method: str = "auto") -> str:
    """``recurrence`` or ``chunked``: what :func:`compute_truth` uses for ``method`` on these inputs."""
    if method == "auto":
        return "recurrence" if _work(x) <= RECURRENCE_MAX_WORK else "chunked"
    if method not in ("recurrence", "chunked"):
        raise ValueError(f"truth method: expected auto, recurrence or chunked, got {method!r}")
    return method


def _chunk_batch(x: KDAInputs, chunk_size: int) -> int:
    """Chunks per pass of the chunked reference so its pairwise-decay tensor stays near 2**27 elements."""
    per_chunk = x.v.shape[2] * chunk_size * chunk_size * x.q.shape[3]
    return max(1, min(64, (1 << 27) // per_chunk))


def compute_truth(x: KDAInputs, method: str = "auto", device: Union[str, torch.device] = "cpu"
                  ) -> Tuple[torch.Tensor, torch.Tensor, str]:
    """Float64 ``(out, final_state [N, HV, V, K], method used)`` for the inputs ``x`` (any device).

    The recurrence always runs on the CPU (it is sequential; small CPU operations beat GPU launches);
    the chunked float64 reference runs on ``device`` when it is CUDA, else on the CPU. Results are on the CPU.
    """
    method = truth_method(x, method)
    device = torch.device(device)
    where = device if (method == "chunked" and device.type == "cuda") else torch.device("cpu")
    xd = x.to(where)
    kwargs = dict(scale=xd.scale, A_log=xd.A_log, dt_bias=xd.dt_bias, lower_bound=xd.lower_bound,
                  initial_state=xd.initial_state, cu_seqlens=xd.cu_seqlens, state_v_first=True,
                  dtype=torch.float64)
    with torch.no_grad():
        if method == "recurrence":
            o, s = reference.kda_recurrence(xd.q, xd.k, xd.v, xd.g, xd.beta, **kwargs)
        else:
            o, s = reference.kda_chunked(xd.q, xd.k, xd.v, xd.g, xd.beta, chunk_size=32,
                                         chunk_batch=_chunk_batch(x, 32), **kwargs)
    return o.cpu(), s.cpu(), method


def window_sensitivity(x: KDAInputs, ref_out: torch.Tensor, ref_state: torch.Tensor, window: int,
                       device: Union[str, torch.device] = "cpu") -> Tuple[float, float]:
    """How badly an implementation that keeps only the last ``window`` tokens of context would score.

    Recomputes the truth from only the last ``window`` tokens of every sequence (same initial states) and
    returns ``(final-state rel L2, per-token error of the last token of every sequence)`` against the full
    truth. Both are exactly what such an implementation gets on those elements: its last token and its
    final state see nothing older than the window.
    """
    xw = window_inputs(x, window)
    w_out, w_state, _ = compute_truth(xw, "chunked", device)
    idx = window_output_index(x, window)
    state_err = metrics.relative_l2(w_state, ref_state)
    lens = x.seq_lens
    starts = [0] * len(lens) if x.cu_seqlens is None else x.cu_seqlens.tolist()[:-1]
    last_full = [s + n - 1 for s, n in zip(starts, lens) if n > 0]
    pos_in_window = {int(t): i for i, t in enumerate(idx.tolist())}
    if ref_out.shape[0] == 1:  # packed sequences (or one row): the last token of every non-empty sequence
        got = w_out[0, [pos_in_window[t] for t in last_full]]
        want = ref_out[0, last_full]
    else:  # fixed batch: the last token of every row
        got, want = w_out[:, -1], ref_out[:, -1]
    rows = ref_out.shape[0] * ref_out.shape[1]
    typical = float(ref_out.double().reshape(rows, -1).norm(dim=1).square().mean().sqrt())
    token_err = float((got.double() - want.double()).reshape(len(got), -1).norm(dim=1).max()) / typical
    return state_err, token_err


# --------------------------------------------------------------------------------------------------------
# Running one case
# --------------------------------------------------------------------------------------------------------


def fresh_seed() -> int:
    """A new 31-bit seed from the operating system's entropy."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def case_seed(run_seed: int, tier: str, name: str) -> int:
    """The 31-bit seed of one case, derived from the run seed and the case's tier and name."""
    return zlib.crc32(f"{int(run_seed)}/{tier}/{name}".encode()) & 0x7FFFFFFF


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _nonfinite_message(name: str, t: torch.Tensor) -> str:
    bad = ~torch.isfinite(t)
    count = int(bad.sum())
    first = tuple(int(i) for i in bad.nonzero()[0].tolist())
    return f"{name} has {count} non-finite element(s) of {t.numel()} (first at index {first})"


def _guard_pattern(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """What each guard holds: the integers -64..63 in turn, exact in every float dtype, so that a write of zeros,
    of NaN or of any result shows."""
    return (torch.arange(GUARD_ELEMENTS, device=device) % 128 - 64).to(dtype)


def _guarded_nan(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): a contiguous NaN-filled tensor of ``shape`` inside a buffer of GUARD_ELEMENTS guard
    elements either side (:func:`_guard_pattern`)."""
    n = math.prod(shape)
    buf = torch.empty(n + 2 * GUARD_ELEMENTS, dtype=dtype, device=device)
    pattern = _guard_pattern(dtype, device)
    buf[:GUARD_ELEMENTS] = pattern
    buf[GUARD_ELEMENTS + n:] = pattern
    view = buf[GUARD_ELEMENTS:GUARD_ELEMENTS + n].view(tuple(shape))
    view.fill_(math.nan)
    return buf, view


def _guard_message(name: str, buf: torch.Tensor, n: int) -> Optional[str]:
    """Why the guards around a guarded view of n elements (from :func:`_guarded_nan`) show a write, or None."""
    pattern = _guard_pattern(buf.dtype, buf.device)
    before = buf[:GUARD_ELEMENTS].ne(pattern)                   # (a NaN written there differs too)
    after = buf[GUARD_ELEMENTS + n:].ne(pattern)
    n_before, n_after = int(before.sum()), int(after.sum())
    parts = []
    if n_before:
        parts.append(f"{n_before} of the {GUARD_ELEMENTS} elements before it "
                     f"(nearest {GUARD_ELEMENTS - int(before.nonzero().max())} element(s) before its start)")
    if n_after:
        parts.append(f"{n_after} of the {GUARD_ELEMENTS} elements after it "
                     f"(farthest {int(after.nonzero().max()) + 1} element(s) past its end)")
    return f"wrote outside {name}: " + " and ".join(parts) if parts else None


def _token_location(x: KDAInputs, flat: int) -> str:
    """'token t of sequence n' for a flat token index (b * T + t)."""
    T = x.q.shape[1]
    b, t = divmod(flat, T) if T else (0, 0)
    if x.cu_seqlens is None:
        return f"token {t} of batch row {b}"
    cu = x.cu_seqlens.tolist()
    n = bisect.bisect_right(cu, t) - 1  # the sequence [cu[n], cu[n+1]) holding t (empty ones skipped)
    return f"token {t - cu[n]} of sequence {n} (packed index {t})"


def _bits(t: torch.Tensor) -> torch.Tensor:
    """t's bits as integers of its width (NaN payloads compare too)."""
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _repeat_message(name: str, first: torch.Tensor, again: torch.Tensor, call: int) -> Optional[str]:
    """Why call ``call``'s ``again`` differs from the first call's ``first`` bit for bit, or None."""
    differ = _bits(first).ne(_bits(again))
    if not bool(differ.any()):
        return None
    gap = (first.double() - again.double()).abs().nan_to_num(math.inf).max()
    return (f"{name} of call {call} differs from call 1's in {int(differ.sum())} of {first.numel()} element(s) "
            f"(largest difference {float(gap):.3g})")


def run_case(impl: Impl, case: Case, *, device: Union[str, torch.device] = "cpu", seed: int,
             calls: int = 1) -> CaseResult:
    """Run ``impl`` on ``case`` drawn with ``seed`` and judge it against float64 truth. With ``calls`` > 1 the
    implementation runs that many times on the same inputs, each into fresh poisoned and guarded outputs, and every
    call's out and final state must equal the first's bit for bit (a race between a kernel's partitions, or a read
    of memory it never wrote, shows as other bits)."""
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls: expected an integer >= 1, got {calls!r}")
    device = torch.device(device)
    thr = case.thresholds
    gen = torch.Generator().manual_seed(int(seed))
    x = case.build(gen)
    shape = x.describe()
    notes = case.notes(x)

    def result(problems, out_err=None, state_err=None, token_err=None, method="", secs=None, extra_notes=""):
        return CaseResult(tier=case.tier, name=case.name, shape=shape, seed=int(seed), out_err=out_err,
                          state_err=state_err, token_err=token_err, passed=not problems,
                          message="; ".join(text for _, text in problems),
                          failed=list(dict.fromkeys(name for name, _ in problems)),
                          thresholds={"out": thr.out, "state": thr.state, "token": thr.token}, truth=method,
                          about=case.about,
                          impl_seconds=secs, notes="; ".join(n for n in (notes, extra_notes) if n))

    xd = x.to(device, copy=True)  # the implementation gets its own copies: x stays intact for the truth
    inputs = lambda: {"q": xd.q, "k": xd.k, "v": xd.v, "g": xd.g, "beta": xd.beta, "A_log": xd.A_log,  # noqa
                      "dt_bias": xd.dt_bias, "initial_state": xd.initial_state, "cu_seqlens": xd.cu_seqlens}
    pristine = {name: t.clone() for name, t in inputs().items() if t is not None}
    problems = []
    first = None                                # the first call's (out, final_state), which is judged
    for call in range(1, calls + 1):
        out_buf, out = _guarded_nan(xd.v.shape, xd.v.dtype, device)
        state_buf, final_state = _guarded_nan(x.state_shape, x.state_dtype, device)
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                impl(xd.q, xd.k, xd.v, xd.g, xd.beta, xd.scale, out, xd.A_log, xd.dt_bias, xd.lower_bound,
                     initial_state=xd.initial_state, final_state=final_state, cu_seqlens=xd.cu_seqlens)
            _sync(device)
        except Exception as exc:  # the verdict on a crashing implementation is FAIL, with the reason
            where = "" if call == 1 else f" (call {call})"
            return result([("raised", f"implementation raised {type(exc).__name__}{where}: {exc}")])
        if call == 1:
            secs = time.perf_counter() - t0
        current = inputs()
        for name, before in pristine.items():
            if not torch.equal(before, current[name]):
                problems.append(("modified_input", f"modified its input {name}"))
        for name, buf, view in (("out", out_buf, out), ("final_state", state_buf, final_state)):
            why = _guard_message(name, buf, view.numel())
            if why:
                problems.append(("wrote_outside", why))
        if first is None:
            first = (out, final_state)
        else:
            for name, before, again in zip(("out", "final_state"), first, (out, final_state)):
                why = _repeat_message(name, before, again, call)
                if why:
                    problems.append(("nondeterministic", why))
        if problems:
            break
    out, final_state = first
    out_c, state_c = out.cpu(), final_state.cpu()
    for name, t in (("out", out_c), ("final_state", state_c)):
        if not metrics.is_finite(t):
            problems.append(("nonfinite", _nonfinite_message(name, t)))

    ref_out, ref_state, method = compute_truth(x, case.truth, device)
    scale_in = x.input_scale()
    out_floor = metrics.magnitude_floor(scale_in * x.scale, ref_out.numel())
    state_floor = metrics.magnitude_floor(scale_in, ref_state.numel())
    token_floor = metrics.magnitude_floor(scale_in * x.scale, ref_out[0, 0].numel() if ref_out.numel() else 0)
    out_err = metrics.relative_l2(out_c, ref_out, out_floor)
    state_err = metrics.relative_l2(state_c, ref_state, state_floor)
    token_err = metrics.token_error(out_c, ref_out, token_floor, own_norm=thr.token_own_norm)
    if out_err > thr.out:
        why = ""
        if math.isfinite(out_err) and ref_out.dim() == 4 and ref_out.shape[2] > 1:
            head, share, head_err = metrics.dominant_head(out_c, ref_out)
            why = f" (value head {head} holds {100 * share:.0f}% of the output norm; its own rel L2 {_fmt(head_err)})"
        problems.append(("out", f"out rel L2 {_fmt(out_err)} > {thr.out:.0e}{why}"))
    if state_err > thr.state:
        problems.append(("state", f"final_state rel L2 {_fmt(state_err)} > {thr.state:.0e}"))
    if token_err > thr.token:
        where = ""
        if math.isfinite(token_err):
            where = f" (worst at {_token_location(x, metrics.worst_token(out_c, ref_out))})"
        problems.append(("token", f"per-token error {_fmt(token_err)} > {thr.token:.0e}{where}"))

    extra = []
    for window in case.window_check:
        if window >= max(x.seq_lens):
            continue
        w_state, w_token = window_sensitivity(x, ref_out, ref_state, window, device)
        extra.append(f"last-{window}-token window would score state {w_state:.2g}, last token {w_token:.2g}")
        if w_state < WINDOW_MARGIN * thr.state or w_token < WINDOW_TOKEN_MARGIN * thr.token:
            problems.append(("invalid_case", f"case cannot tell a {window}-token window from full context "
                                             f"(state {w_state:.2g}, last token {w_token:.2g}): the case is invalid"))
    return result(problems, out_err, state_err, token_err, method=method, secs=secs, extra_notes="; ".join(extra))


# --------------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------------


def quick_check(
    impl: Impl,
    *,
    seq_lens: Sequence[int],
    H: int,
    D: int = 128,
    HV: Optional[int] = None,
    device: Union[str, torch.device] = "cpu",
    seed: Optional[int] = None,
    state_dtype: torch.dtype = torch.float32,
    calls: int = 2,
) -> CaseResult:
    """One benchmark-like case on the given shape, judged like every other case (rel L2 5e-3, per-token 5e-2).

    ``seq_lens``: one entry gives a fixed ``[1, T, H, D]`` batch with ``cu_seqlens=None``; several entries
    give packed sequences with ``cu_seqlens``. Inputs as the benchmark draws them: q, k, v, g ~ N(0,1) bf16,
    beta logits ~ N(0,1), A_log ~ U(0,1), dt_bias ~ U(0,1), lower_bound -5, scale D**-0.5, initial state
    0.1 N(0,1) in ``state_dtype``. ``seed`` None draws a fresh one (reported in the result). ``calls``: two by
    default, the second compared with the first bit for bit (:func:`run_case`): this is the benchmark's gate, the
    last check on exactly the shape it times.
    """
    case = quick_case(seq_lens, H=H, D=D, HV=HV, state_dtype=state_dtype)
    return run_case(impl, case, device=device, seed=fresh_seed() if seed is None else int(seed), calls=calls)


def parse_tiers(tiers: Union[str, Iterable[str], None]) -> List[str]:
    """``"all"``, ``"quick,random"`` or a list of names -> validated list of tier names."""
    if tiers is None or tiers == "all":
        return list(TIERS)
    if isinstance(tiers, str):
        tiers = [t.strip() for t in tiers.split(",") if t.strip()]
    tiers = list(tiers)
    if "all" in tiers:
        return list(TIERS)
    for t in tiers:
        if t not in TIERS:
            raise ValueError(f"unknown tier {t!r}; expected one of {TIERS} or 'all'")
    return tiers


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_size(device: Union[str, torch.device]) -> str:
    return "full" if torch.device(device).type == "cuda" else "small"


def run_suite(
    impl: Union[Impl, str],
    tiers: Union[str, Iterable[str], None] = "all",
    device: Union[str, torch.device, None] = None,
    size: Optional[str] = None,
    seed: Optional[int] = None,
    cases: Optional[Sequence[str]] = None,
    progress: Optional[Callable[[CaseResult], None]] = None,
    calls: int = 1,
) -> SuiteReport:
    """Run ``impl`` (a callable or a registry name, see :func:`resolve_impl`) on the chosen tiers.

    ``device`` defaults to CUDA when available; ``size`` to ``"full"`` on CUDA and ``"small"`` otherwise;
    ``seed`` (the run seed) to a fresh one. ``cases`` optionally keeps only cases with these names.
    ``progress`` is called with each result as it comes. ``calls``: calls per case, each compared with the
    first bit for bit (:func:`run_case`).
    """
    impl_name = impl if isinstance(impl, str) else getattr(impl, "__qualname__", repr(impl))
    fn = resolve_impl(impl) if isinstance(impl, str) else impl
    device = str(device or default_device())
    size = size or default_size(device)
    run_seed = fresh_seed() if seed is None else int(seed)
    names = parse_tiers(tiers)
    selected = [case for tier in names for case in tier_cases(tier, size)]
    if cases is not None:
        known = {case.name for case in selected}
        unknown = [name for name in cases if name not in known]
        if unknown:
            raise ValueError(f"unknown case(s) {unknown} in tiers {names}; known: {sorted(known)}")
        selected = [case for case in selected if case.name in cases]
    t0 = time.perf_counter()
    results = []
    for case in selected:
        r = run_case(fn, case, device=device, seed=case_seed(run_seed, case.tier, case.name), calls=calls)
        results.append(r)
        if progress is not None:
            progress(r)
    return SuiteReport(impl=impl_name, device=device, size=size, run_seed=run_seed, tiers=names,
                       results=results, seconds=time.perf_counter() - t0, calls=calls)


# --------------------------------------------------------------------------------------------------------
# Implementations registry
# --------------------------------------------------------------------------------------------------------


def reference_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                  final_state=None, cu_seqlens=None) -> None:
    """FlashKDA-signature wrapper around the float32 chunked torch reference (:func:`reference.kda_chunked`)."""
    o, s = reference.kda_chunked(q, k, v, g, beta, scale=scale, A_log=A_log, dt_bias=dt_bias,
                                 lower_bound=lower_bound, initial_state=initial_state, cu_seqlens=cu_seqlens,
                                 state_v_first=True, dtype=torch.float32)
    out.copy_(o)
    if final_state is not None:
        final_state.copy_(s)


def fastkda_fwd(*args, **kwargs) -> None:
    """``fastkda.fwd`` (Triton kernels on CUDA, the float32 reference on the CPU)."""
    from .. import fwd
    fwd(*args, **kwargs)


def fla_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
            final_state=None, cu_seqlens=None) -> None:
    """fla's ``chunk_kda`` behind FlashKDA's signature, configured as the peers measured it.

    ``FLA_FLASH_KDA=0`` (set before fla is imported) keeps fla's own Triton kernels instead of dispatching to
    FlashKDA; all activations fused in the kernel (l2 norm, gate, beta sigmoid), ``safe_gate=True``,
    v-first states, int64 ``cu_seqlens``, run under ``torch.inference_mode()``.
    """
    if "fla" not in sys.modules:
        os.environ["FLA_FLASH_KDA"] = "0"
    elif os.environ.get("FLA_FLASH_KDA") != "0":
        raise RuntimeError("fla was imported before FLA_FLASH_KDA=0 was set: its FlashKDA backend may be "
                           "active; set FLA_FLASH_KDA=0 before importing fla")
    try:
        from fla.ops.kda import chunk_kda
    except ImportError as exc:
        raise RuntimeError("--impl fla needs flash-linear-attention (pip install fla-core>=0.6.0); "
                           f"importing fla.ops.kda failed: {exc}") from exc
    init = None if initial_state is None else initial_state.float()
    cu = None if cu_seqlens is None else cu_seqlens.to(torch.int64)
    with torch.inference_mode():
        o, s = chunk_kda(q, k, v, g, beta, scale=scale, initial_state=init, output_final_state=True,
                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                         safe_gate=True, lower_bound=lower_bound, state_v_first=True, cu_seqlens=cu,
                         A_log=A_log, dt_bias=dt_bias)
    out.copy_(o)
    if final_state is not None:
        final_state.copy_(s)


IMPLEMENTATIONS: Dict[str, Impl] = {
    "fastkda": fastkda_fwd,
    "reference": reference_fwd,
    "fla": fla_fwd,
}


def resolve_impl(spec: str) -> Impl:
    """A registry name (``fastkda``, ``reference``, ``fla``) or ``module:function`` -> the callable."""
    if spec in IMPLEMENTATIONS:
        return IMPLEMENTATIONS[spec]
    if ":" not in spec:
        raise ValueError(f"unknown implementation {spec!r}: expected one of {sorted(IMPLEMENTATIONS)} "
                         "or 'module:function'")
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"implementation {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ValueError(f"implementation {spec!r}: {module_name} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ValueError(f"implementation {spec!r} is not callable")
    return fn
