"""How far each stage-1 kernel's tensors (a1's −W and Qg rows, Aqk, Kt, T·diag(β), e^{G_last}) sit from a float64
model of the arithmetic, and from the other kernel's.

    python benchmarks/stage1_agreement.py [--seed N] [--json PATH]

Both stage-1 kernels round their tensor-core operands k̂⊙e^{±(G−r)} and q̂⊙e^{G−r} to bf16 (the factors of L, W and
Aqk) and store a1, Aqk and Kt in bf16. A G that moves by ~1e-4 relative (session 37's gate, 2^11·a rounded once to
fp16 instead of split into two fp16 pieces) redraws which of those operand roundings go up and which down, and L's
solve carries them into −W: the two kernels then differ by 2.7–3.8e-3 on a1 and Aqk, the size of the rounding
itself, while each sits as far from the exact math as before (session 38). tests/test_gpu.py therefore holds each
kernel to `stage1_model(..., rounded=True)` with its own gate arithmetic. This prints, per tensor, on the test's own
inputs (random gates through the KDA gate with lower_bound −5: steep decays), the relative L2 of

    triton − model(a)           the Triton kernel against the exact math
    triton − model_bf16(a)      ... against the math with the kernels' bf16 rounding points (operands and outputs)
    gluon − triton              (on Hopper) the kernels against each other
    gluon − model(a), gluon − model_bf16(a), gluon − model_bf16(ã)
                                the Gluon kernel against the exact math, and against the rounded math with the gate
                                exact and with ã = the gate rounded once to fp16
    model_bf16(ã) − model_bf16(a)    what that one rounding does through the bf16 rounding points

A diagnosis, not a record. (Triton 3.9's CPU interpreter truncates fp32 → bf16 conversions instead of rounding
them to nearest: there the Triton kernel sits ~6e-3 from model_bf16, against ~3e-5 on a GPU.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

# (D, sequence lengths, H, HV, (l2-normalised keys, the gate, the β sigmoid)): tests/test_gpu.py's cases
CASES = (
    (128, (5, 70, 0, 33, 1, 96), 2, 2, (True, True, True)),  # packed, an empty sequence, partial chunks
    (64, (40, 0, 77), 2, 4, (True, True, True)),             # K = 64, GVA
    (128, (64, 31), 1, 1, (True, False, False)),             # g as the log-decay itself, β as given
    (128, (50, 13), 1, 2, (False, True, True)),              # keys as given: T in bf16 halves, not fp16
)


def case_inputs(D: int, lens: Sequence[int], H: int, HV: int, flags, seed: int, dtype=torch.bfloat16,
                device="cpu") -> Dict:
    """tests/test_gpu.py's inputs for a stage-1 case (its seed is D + len(lens)): q, k, v, g, β from a normal
    distribution in `dtype` (then q, k scaled by D^-1/2 where the keys are used as given, g made a non-positive
    log-decay without the gate, β put through a sigmoid without its own), A_log and dt_bias uniform in [0, 1),
    lower_bound −5; as kernels.prepare_chunks' keyword arguments."""
    l2norm, gate, sigmoid = flags
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q, k = (torch.randn(1, T, H, D, generator=gen).to(dtype) for _ in range(2))
    v, g = (torch.randn(1, T, HV, D, generator=gen).to(dtype) for _ in range(2))
    beta = torch.randn(1, T, HV, generator=gen).to(dtype)
    if not l2norm:
        q, k = (x.float().mul(D ** -0.5).to(dtype) for x in (q, k))
    if not gate:
        g = g.float().abs().mul(-2).to(dtype)
    if not sigmoid:
        beta = beta.float().sigmoid().to(dtype)
    A_log, dt_bias = torch.rand(HV, generator=gen), torch.rand(HV, D, generator=gen)
    cu = torch.tensor([0] + torch.tensor(list(lens)).cumsum(0).tolist(), dtype=torch.int32)
    out = {name: t.to(device) for name, t in dict(q=q, k=k, v=v, g=g, beta=beta).items()}
    out.update(scale=D ** -0.5, A_log=A_log.to(device) if gate else None, dt_bias=dt_bias.to(device) if gate else None,
               lower_bound=-5.0 if gate else None, cu_seqlens=cu.to(device), use_qk_l2norm=l2norm, use_gate=gate,
               use_beta_sigmoid=sigmoid)
    return out


TENSORS = ("a1", "aqk", "kt", "tb", "gl")


def stage1_model(x: Dict, chunk_size: int = 32, gate_fp16: bool = False, rounded: bool = False) -> Dict:
    """Stage 1's tensors in float64 from prepare_chunks' keyword arguments x, in kernels.prepare_chunks' layouts
    over the chunks of the packed sequences in order (padding rows zero): a1 [HV, chunks, 2·BT, K] (−W rows, then
    Qg rows), aqk [HV, chunks, BT, BT], kt [HV, chunks, BT, K], tb [HV, chunks, BT, BT] (= (T·diag(β))ᵀ, which the
    kernels store as bf16 high and low halves) and gl [chunks, HV, K].

    With gate_fp16, the gate's per-step log-decay a is first rounded as 2^11·a/ln 2 to fp16 (the one-piece
    variant). With rounded, the kernels' bf16 rounding points, to nearest: the tensor-core operands k̂⊙e^{G−r},
    k̂⊙e^{r−G} and q̂⊙e^{G−r} (r = G_last / 2) and the stored a1, aqk and kt; T, its halves and gl stay exact."""
    from fastkda.reference import _activate
    from error_budget import STAGE1_POINTS, chunk_tensors, round_gate_fp16    # benchmarks/: the script's folder
    BT = chunk_size
    q, k, _, a, b = _activate(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], x["lower_bound"],
                              x["use_qk_l2norm"], x["use_gate"], x["use_beta_sigmoid"], torch.float64)
    q, k, a, b = (t[0].cpu() for t in (q, k, a, b))           # [T, HV, K], [T, HV]
    if gate_fp16 and x["use_gate"]:
        a = round_gate_fp16(a)
    bounds = x["cu_seqlens"].tolist()
    HV, K = a.shape[1], a.shape[2]
    shapes = dict(a1=(HV, 2 * BT, K), aqk=(HV, BT, BT), kt=(HV, BT, K), tb=(HV, BT, BT), gl=(HV, K))
    chunks = {name: [] for name in TENSORS}
    for bos, eos in zip(bounds[:-1], bounds[1:]):
        for t0 in range(bos, eos, BT):
            n = min(BT, eos - t0)
            c = chunk_tensors(*(t[t0:t0 + n].transpose(0, 1) for t in (k, q, a, b)), x["scale"],
                              STAGE1_POINTS if rounded else ())
            tile = {name: torch.zeros(shape, dtype=torch.float64) for name, shape in shapes.items()}
            tile["a1"][:, :n] = c["negw"]
            tile["a1"][:, BT:BT + n] = c["qg"]
            tile["aqk"][:, :n, :n] = c["aqk"]
            tile["kt"][:, :n] = c["kt"]
            tile["tb"][:, :n, :n] = c["tb"].transpose(1, 2)
            tile["gl"] = c["gl"]
            for name in TENSORS:
                chunks[name].append(tile[name])
    return {name: torch.stack(c, 0 if name == "gl" else 1) if c else
            torch.zeros((0, *shapes[name]) if name == "gl" else (HV, 0, *shapes[name][1:]), dtype=torch.float64)
            for name, c in chunks.items()}


def kernel_tensors(st, n_chunks: int) -> Dict:
    """A Stage1's tensors over its first n_chunks slots (the rest are never written) in stage1_model's form, in
    float64: tb as its high plus low half."""
    out = {name: getattr(st, name)[:, :n_chunks].double().cpu() for name in ("a1", "aqk", "kt")}
    tb = st.tb[:, :n_chunks].double().cpu()
    out.update(tb=tb[:, :, :tb.shape[2] // 2] + tb[:, :, tb.shape[2] // 2:], gl=st.gl[:n_chunks].double().cpu())
    return out


def run_stage1(x: Dict, gluon: bool):
    """kernels.prepare_chunks on case_inputs' x, through the Gluon stage 1 or the Triton one."""
    from fastkda import kernels
    saved, kernels.STAGE1_GLUON = kernels.STAGE1_GLUON, gluon
    try:
        return kernels.prepare_chunks(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                      **{k: v for k, v in x.items() if k not in ("q", "k", "v", "g", "beta")})
    finally:
        kernels.STAGE1_GLUON = saved


def relative_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖ / ‖ref‖ in float64."""
    return float((x.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


def agreement(cases=CASES, seed: Optional[int] = None, device: Optional[str] = None, log=print) -> List[Dict]:
    """Per case and stage-1 tensor the relative L2 distances of the module's docstring (the Gluon kernel's only
    on Hopper), on the test's inputs (seed None) or on those of seeds seed, seed + 1, ..."""
    from fastkda import kernels
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    hopper = device == "cuda" and torch.cuda.get_device_capability()[0] == 9
    rows = []
    for i, (D, lens, H, HV, flags) in enumerate(cases):
        x = case_inputs(D, lens, H, HV, flags, D + len(lens) if seed is None else seed + i, device=device)
        exact, rounded = stage1_model(x), stage1_model(x, rounded=True)
        rounded_1p = stage1_model(x, gate_fp16=True, rounded=True)
        used = exact["a1"].shape[1]
        got = {}
        for name, use_gluon in (("triton", False), ("gluon", True)):
            if use_gluon and not (hopper and kernels.gluon_stage1_applies(x["q"], x["k"], x["g"])):
                continue
            got[name] = kernel_tensors(run_stage1(x, use_gluon), used)
        row = dict(case=dict(D=D, lens=list(lens), H=H, HV=HV, flags=list(flags)))
        for t in TENSORS:
            d = dict(triton_vs_model=relative_l2(got["triton"][t], exact[t]),
                     triton_vs_model_bf16=relative_l2(got["triton"][t], rounded[t]),
                     one_piece_shift_bf16=relative_l2(rounded_1p[t], rounded[t]))
            if "gluon" in got:
                d.update(gluon_vs_triton=relative_l2(got["gluon"][t], got["triton"][t]),
                         gluon_vs_model=relative_l2(got["gluon"][t], exact[t]),
                         gluon_vs_model_bf16=relative_l2(got["gluon"][t], rounded[t]),
                         gluon_vs_one_piece_model_bf16=relative_l2(got["gluon"][t], rounded_1p[t]))
            row[t] = d
            log(f"D={D} lens={list(lens)} flags={[int(f) for f in flags]} {t}: " +
                ", ".join(f"{k} {v:.2e}" for k, v in d.items()))
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=None,
                    help="the first case's seed, each next case's one more (default: the test's seeds)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = agreement(seed=args.seed)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
