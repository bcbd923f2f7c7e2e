"""Where a kernel's error comes from: the chunked forward in float64 with each of the kernels' rounding points on or
off, judged against the validation suite's float64 truth.

    python benchmarks/error_budget.py [--tier model] [--case NAME] [--seed RUN_SEED] [--size full|small]
                                      [--without P,Q,...] [--intra bf16|tf32|split] [--json PATH]

fastkda's kernels (all routes: the two stages and the fused kernel, bitwise equal) compute in fp32 and round to
bf16 at these points, per 32-token chunk (r = G_last / 2, S the state, U the chunk's new values):

    gate   2^11·a (the per-step log-decay in base 2) rounded once to fp16 (chunk_prepare_gluon._block_decays)
    opk    the tensor-core operands k̂⊙e^{G−r} and k̂⊙e^{r−G} of L, W and Aqk
    opq    the operand q̂⊙e^{G−r} of Aqk
    negw   −W = −T·diag(β)·(k̂⊙e^{G−r})·e^r, stored
    qg     Qg = scale·q̂⊙e^{G}, stored
    aqk    Aqk, stored
    kt     Kt = k̂⊙e^{G_last−G}, stored
    S      the state as the left operand of −W·S and Qg·S (it is carried in fp32)
    US     U as the operand of the state update Ktᵀ·U
    UO     U as the operand of the output's intra-chunk product Aqk·U
    out    the output itself

`--intra tf32` models a candidate instead (docs/perf-notes.md, session 40): that product in tf32, Aqk kept in fp32 and
both operands truncated to tf32 as the tensor core reads them (the points aqk and UO, then). `--intra split` models
another (session 41): O = (Qg − Aqk·W)·S + (Aqk·T·diag(β))·V, whose intra-chunk part takes the values V (exact in bf16)
instead of U, Qg − Aqk·W rounded once more where Qg is (aqk and UO round nothing, then).

(T·diag(β) is carried as bf16 high and low halves, ~16 bits: not modelled; fp32 sums are not either.) Errors from
independent roundings add in quadrature, so each point's error alone ("only") says what removing it would buy
("all" without it); `--without` also reports every point but a set of them (a candidate arithmetic that carries those
values exactly, or in bf16 high and low halves). The model with every point reproduces the kernels' measured error
to ~1% (run seed 1336656577, model tier, synthetic_model_fixed: model 5.19e-3; the fused kernel on an H200 5.16e-3,
the Triton path on the CPU 5.19e-3; docs/perf-notes.md, session 39). A diagnosis, not a record.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, Iterable, Optional, Tuple

import torch

POINTS = ("gate", "opk", "opq", "negw", "qg", "aqk", "kt", "S", "US", "UO", "out")


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float64)


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """t rounded to fp32, then truncated to tf32 (10 fraction bits), as the tensor core reads an fp32 operand."""
    return (t.to(torch.float32).view(torch.int32) & ~0x1FFF).view(torch.float32).to(torch.float64)


INTRA = {"bf16": _bf16, "tf32": _tf32, "split": None}
"""How the output's intra-chunk part is formed. bf16 (the kernels) and tf32 (the session-40 candidate): the product
Aqk·U with both operands (the points aqk and UO) in that format. split (session 41): no such product; the output is
(Qg − Aqk·W)·S + (Aqk·T·diag(β))·V, Aqk, W and Aqk·T·diag(β) exact and Qg − Aqk·W rounded once more where Qg is (from
the stored Qg, as a chain that corrects the producers' tile would)."""


STAGE1_POINTS = ("opk", "opq", "negw", "qg", "aqk", "kt")
"""The points inside one chunk's stage-1 tensors (chunk_tensors)."""


def round_gate_fp16(a: torch.Tensor) -> torch.Tensor:
    """The per-step log-decay a as the kernels take it: 2^11·a/ln 2 rounded once to fp16."""
    unit = math.log(2) / 2048.0
    return (a / unit).to(torch.float16).to(torch.float64) * unit


def chunk_tensors(k: torch.Tensor, q: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float,
                  rounded: Iterable[str] = ()) -> Dict[str, torch.Tensor]:
    """One chunk's stage-1 tensors in float64, heads first (k̂, q̂, a: [HV, n, K]; β: [HV, n]), the points of
    STAGE1_POINTS in ``rounded`` rounded to bf16: tb = T·diag(β) [HV, n, n] (exact: the kernels carry it in two
    halves), −W, Qg, Kt [HV, n, K], Aqk [HV, n, n] and gl = e^{G_last} [HV, K]."""
    R = {p: (_bf16 if p in rounded else (lambda t: t)) for p in STAGE1_POINTS}
    G = a.cumsum(1)
    r = G[:, -1:] / 2
    k_pos, k_neg = R["opk"](k * (G - r).exp()), R["opk"](k * (r - G).exp())
    q_pos = R["opq"](q * (G - r).exp())
    L = torch.tril(b[:, :, None] * (k_pos @ k_neg.transpose(1, 2)), -1)
    tb = torch.linalg.inv(torch.eye(k.shape[1], dtype=torch.float64) + L) * b[:, None, :]
    return dict(tb=tb, negw=R["negw"](-(tb @ k_pos) * r.exp()), qg=R["qg"](scale * q * G.exp()),
                aqk=R["aqk"](torch.tril(scale * (q_pos @ k_neg.transpose(1, 2)))),
                kt=R["kt"](k * (G[:, -1:] - G).exp()), gl=G[:, -1].exp())


def model_forward(x, rounded: Iterable[str] = (), chunk_size: int = 32,
                  intra: str = "bf16") -> Tuple[torch.Tensor, torch.Tensor]:
    """(out [B, T, HV, V], final state [N, HV, V, K]) in float64 for the validation inputs ``x`` (a KDAInputs: the
    gate, the key/query l2 norm and the β sigmoid applied, v-first states), the points in ``rounded`` rounded as
    the kernels round them (to nearest bf16; the output's intra-chunk part as ``intra`` says: INTRA)."""
    from fastkda.reference import _activate, _segments
    rounded = set(rounded)
    unknown = rounded - set(POINTS)
    if unknown:
        raise ValueError(f"rounded: unknown rounding points {sorted(unknown)}; expected some of {POINTS}")
    if intra not in INTRA:
        raise ValueError(f"intra: expected one of {sorted(INTRA)}, got {intra!r}")
    R = {p: (_bf16 if p in rounded else (lambda t: t)) for p in POINTS}
    for p in ("aqk", "UO"):
        R[p] = INTRA[intra] if p in rounded and INTRA[intra] is not None else R[p]
    q, k, v, a, b = _activate(x.q, x.k, x.v, x.g, x.beta, x.A_log, x.dt_bias, x.lower_bound, True, True, True,
                              torch.float64)
    if "gate" in rounded:
        a = round_gate_fp16(a)
    B, T, HV, V = v.shape
    K = k.shape[-1]
    out = torch.zeros_like(v)
    states = []
    for n, (bi, bos, eos) in enumerate(_segments(B, T, x.cu_seqlens)):
        S = torch.zeros(HV, K, V, dtype=torch.float64)
        if x.initial_state is not None:
            S = x.initial_state[n].double().transpose(-1, -2).clone()          # [HV, K, V]
        for t0 in range(bos, eos, chunk_size):
            t1 = min(eos, t0 + chunk_size)
            kk, qq, vv, aa, bb = (t[bi, t0:t1].transpose(0, 1) for t in (k, q, v, a, b))   # heads first
            c = chunk_tensors(kk, qq, aa, bb, x.scale, rounded - {"aqk"})     # (Aqk rounded where it is used)
            s_op = R["S"](S)
            U = c["tb"] @ vv + c["negw"] @ s_op
            if intra == "split":
                neg_w = c["negw"] if "negw" not in rounded else \
                    chunk_tensors(kk, qq, aa, bb, x.scale, rounded - {"aqk", "negw"})["negw"]   # before rounding
                o = R["qg"](c["qg"] + c["aqk"] @ neg_w) @ s_op + (c["aqk"] @ c["tb"]) @ vv
            else:
                o = c["qg"] @ s_op + R["aqk"](c["aqk"]) @ R["UO"](U)
            out[bi, t0:t1] = R["out"](o).transpose(0, 1)
            S = c["gl"][:, :, None] * S + c["kt"].transpose(1, 2) @ R["US"](U)
        states.append(S.transpose(-1, -2))
    return out, torch.stack(states) if states else torch.zeros(0, HV, V, K, dtype=torch.float64)


def budget(x, truth: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, chunk_size: int = 32,
           without: Iterable[str] = (), intra: str = "bf16") -> Dict[str, float]:
    """The output's relative L2 error (the validation suite's metric and floor) of the model with no rounding
    point ("none"), every one ("all"), each one alone ("only-P") and every one but P ("all-P"); with ``without``
    (a set of points) also every one but those ("all-P-Q..."); ``intra`` as in model_forward."""
    from fastkda.validation import metrics, suite
    unknown = set(without) - set(POINTS)
    if unknown:
        raise ValueError(f"without: unknown rounding points {sorted(unknown)}; expected some of {POINTS}")
    ref_out = truth[0] if truth is not None else suite.compute_truth(x, "auto", "cpu")[0]
    floor = metrics.magnitude_floor(x.input_scale() * x.scale, ref_out.numel())

    def err(points):
        return metrics.relative_l2(model_forward(x, points, chunk_size, intra)[0], ref_out, floor)

    res = {"none": err(()), "all": err(POINTS)}
    for p in POINTS:
        res["only-" + p] = err({p})
        res["all-" + p] = err(set(POINTS) - {p})
    without = sorted(set(without), key=POINTS.index)
    if without:
        res["all-" + "-".join(without)] = err(set(POINTS) - set(without))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", default="model")
    ap.add_argument("--case", default=None, help="a case of the tier (default: its first)")
    ap.add_argument("--seed", type=int, default=1336656577, help="the validation run seed")
    ap.add_argument("--size", default="full", choices=("small", "full"))
    ap.add_argument("--without", default="", help="comma-separated points: also the error with every other one")
    ap.add_argument("--intra", default="bf16", choices=sorted(INTRA),
                    help="the output's intra-chunk part: bf16 (the kernels), tf32 or split (candidates: INTRA)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    without = [p for p in args.without.split(",") if p]
    if set(without) - set(POINTS):
        ap.error(f"--without: unknown rounding points {sorted(set(without) - set(POINTS))}; expected some of {POINTS}")
    from fastkda.validation import suite
    from fastkda.validation.cases import tier_cases
    cases = tier_cases(args.tier, args.size)
    case = cases[0] if args.case is None else next((c for c in cases if c.name == args.case), None)
    if case is None:
        ap.error(f"--case: {args.case!r} is not a case of tier {args.tier} ({[c.name for c in cases]})")
    x = case.build(torch.Generator().manual_seed(suite.case_seed(args.seed, case.tier, case.name)))
    res = budget(x, suite.compute_truth(x, case.truth, "cpu")[:2], without=without, intra=args.intra)
    print(f"{case.tier}/{case.name} run seed {args.seed} ({x.describe()}), intra-chunk part: {args.intra}; "
          f"out rel L2 all {res['all']:.3e}, none {res['none']:.1e}")
    print(f"{'point':6} {'alone':>10} {'all but it':>11}")
    for p in sorted(POINTS, key=lambda p: -res["only-" + p]):
        print(f"{p:6} {res['only-' + p]:10.3e} {res['all-' + p]:11.3e}")
    if without:
        key = "all-" + "-".join(sorted(without, key=POINTS.index))
        print(f"every point but {', '.join(key[4:].split('-'))}: {res[key]:.3e}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(tier=case.tier, case=case.name, run_seed=args.seed,
                                                   size=args.size, intra=args.intra, errors=res), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
