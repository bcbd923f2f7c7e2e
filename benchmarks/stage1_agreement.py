"""How far each stage-1 kernel's a1 (the −W and Qg rows) sits from a float64 model of its arithmetic, and from
the other kernel's.

    python benchmarks/stage1_agreement.py [--json PATH]

tests/test_gpu.py compares the Gluon stage 1 with the Triton one (a1 within 2e-3 relative L2). Session 37's
variant, the gate's 2^11·a (base 2) rounded once to fp16 instead of split into two fp16 pieces, measured 2.7–3.4e-3
there on the gated cases, while a float64 model of that one rounding moves a1 by ~2e-4 (docs/perf-notes.md, session
37). This prints, on the test's own inputs (random gates through the KDA gate with lower_bound −5: steep decays),
the relative L2 of

    gluon − triton            the test's check
    triton − model(a)         the Triton kernel against the exact math
    gluon − model(a)          the Gluon kernel against the exact math
    gluon − model(ã)          ... against the math with ã = the gate rounded once to fp16
    bf16(model(ã)) − bf16(model(a))    what that rounding alone does to the stored bf16 values

so that the test's check can be derived for whichever arithmetic the kernel has. A diagnosis, not a record.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

# (D, sequence lengths, H, HV, (l2-normalised keys, the gate, the β sigmoid)): tests/test_gpu.py's cases
CASES = (
    (128, (5, 70, 0, 33, 1, 96), 2, 2, (True, True, True)),
    (64, (40, 0, 77), 2, 4, (True, True, True)),
    (128, (64, 31), 1, 1, (True, False, False)),
    (128, (50, 13), 1, 2, (False, True, True)),
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


def stage1_model(x: Dict, chunk_size: int = 32, gate_fp16: bool = False) -> torch.Tensor:
    """a1 in float64, [HV, chunks, 2·chunk_size, K] as kernels.prepare_chunks lays it out (the chunks of the packed
    sequences in order, −W rows then Qg rows, padding rows zero), from prepare_chunks' keyword arguments x. With
    gate_fp16, the gate's per-step log-decay a is first rounded as 2^11·a/ln 2 to fp16 (the one-piece variant)."""
    from fastkda.reference import _activate
    BT = chunk_size
    q, k, _, a, b = _activate(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], x["lower_bound"],
                              x["use_qk_l2norm"], x["use_gate"], x["use_beta_sigmoid"], torch.float64)
    q, k, a, b = (t[0].cpu() for t in (q, k, a, b))           # [T, HV, K], [T, HV]
    if gate_fp16 and x["use_gate"]:
        unit = math.log(2) / 2048.0
        a = (a / unit).to(torch.float16).to(torch.float64) * unit
    bounds = x["cu_seqlens"].tolist()
    HV, K = a.shape[1], a.shape[2]
    chunks = []
    for bos, eos in zip(bounds[:-1], bounds[1:]):
        for t0 in range(bos, eos, BT):
            n = min(BT, eos - t0)
            tile = torch.zeros(HV, 2 * BT, K, dtype=torch.float64)
            for h in range(HV):
                G = a[t0:t0 + n, h].cumsum(0)
                kk, qq, bb = k[t0:t0 + n, h], q[t0:t0 + n, h], b[t0:t0 + n, h]
                k_pos, k_neg = kk * G.exp(), kk * (-G).exp()
                L = torch.tril(bb[:, None] * (k_pos @ k_neg.T), -1)
                W = torch.linalg.solve(torch.eye(n, dtype=torch.float64) + L, bb[:, None] * k_pos)
                tile[h, :n] = -W
                tile[h, BT:BT + n] = x["scale"] * qq * G.exp()
            chunks.append(tile)
    if not chunks:
        return torch.zeros(HV, 0, 2 * BT, K, dtype=torch.float64)
    return torch.stack(chunks, 1)


def run_stage1(x: Dict, gluon: bool):
    """kernels.prepare_chunks on case_inputs' x, through the Gluon stage 1 or the Triton one."""
    from fastkda import kernels
    saved, kernels.STAGE1_GLUON = kernels.STAGE1_GLUON, gluon
    try:
        return kernels.prepare_chunks(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                      **{k: v for k, v in x.items() if k not in ("q", "k", "v", "g", "beta")})
    finally:
        kernels.STAGE1_GLUON = saved


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


def agreement(cases=CASES, seed: Optional[int] = None, device: Optional[str] = None, log=print) -> List[Dict]:
    """Per case the relative L2 distances of the module's docstring (the Gluon kernel's only on Hopper), on the
    test's inputs (seed None) or on those of seeds seed, seed + 1, ..."""
    from fastkda import kernels
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    hopper = device == "cuda" and torch.cuda.get_device_capability()[0] == 9
    rows = []
    for i, (D, lens, H, HV, flags) in enumerate(cases):
        x = case_inputs(D, lens, H, HV, flags, D + len(lens) if seed is None else seed + i, device=device)
        exact, rounded = stage1_model(x), stage1_model(x, gate_fp16=True)
        a1 = {}
        for name, use_gluon in (("triton", False), ("gluon", True)):
            if use_gluon and not (hopper and kernels.gluon_stage1_applies(x["q"], x["k"], x["g"])):
                continue
            a1[name] = run_stage1(x, use_gluon).a1[:, :exact.shape[1]].float()      # (slots past the last chunk: never written)
        row = dict(case=dict(D=D, lens=list(lens), H=H, HV=HV, flags=list(flags)),
                   triton_vs_model=_rel(a1["triton"], exact),
                   one_piece_in_bf16=_rel(rounded.to(torch.bfloat16), exact.to(torch.bfloat16).double()))
        if "gluon" in a1:
            row.update(gluon_vs_triton=_rel(a1["gluon"], a1["triton"].double()),
                       gluon_vs_model=_rel(a1["gluon"], exact), gluon_vs_one_piece_model=_rel(a1["gluon"], rounded))
        log(f"D={D} lens={list(lens)} flags={list(flags)}: " + ", ".join(
            f"{k} {v:.2e}" for k, v in row.items() if k != "case"))
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
