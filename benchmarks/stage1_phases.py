"""Where one chunk's time goes inside the Gluon stage 1: clock stamps between its phases, on the device.

    python benchmarks/stage1_phases.py [--tasks a,b] [--json PATH]

The library's chunk_prepare_gluon.py, with a `%clock64` stamp after each phase written by the programs of
value head 0 (one row of eight stamps per chunk slot), compiled as its own module and launched by the library's
launcher at its usual occupancy (five programs per SM). Phases, in program order:

    inputs     from the program's start until its input rows (cp.async) and A'ᵀ are in shared memory
    gate       the element-wise blocks: the gate, its cumulative sum, the decays, Qg, Kt and the operands
    L, Aqk     the [L; Aqk] product (and the bulk stores of Qg and Kt issued)
    masks      masks and factors, T_2, the wait for those stores, Aqk issued
    doubling   T = (I + L)^-1 by block doubling
    W, out     T·diag(β) out, the −W products, their bulk stores issued
    drain      until every bulk store has read its shared tile

A stamp is a volatile instruction, so the compiler keeps it between the phases' waits and barriers; the
instrumented kernel runs a few percent slower than the library's. Medians over the rows, in SM cycles
(clock64 counts SM clocks; ~1.98 GHz on the H200 under load). A diagnosis, not a record.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

import torch

from fastkda import kernels
from fastkda.bench.tasks import default_tasks, make_inputs, select_tasks
from fastkda.kernels import chunk_prepare_gluon
from stage_variants import variant_module   # benchmarks/ is the script's own folder, hence on sys.path

PHASES = ("inputs", "gate", "L, Aqk", "masks", "doubling", "W, out", "drain")
STAMPS = len(PHASES) + 1

_STAMP_FN = '''@gluon.jit
def _stamp(row, p: gl.constexpr, on):
    """%clock64 into row[p] where `on` (stage1_phases.py)."""
    c = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    if on:
        gl.store(row + p, c)


'''

# (anchor, text put after it) in chunk_prepare_gluon.py; every anchor must occur exactly once.
_AFTER = (
    ("    i_h = i_hv // HV_PER_H                           # a compile-time divisor: a shift, not a division\n",
     "    _stamp(prof + i_c * {S}, 0, i_hv == 0)\n"),
    ("    _cta_barrier()                                   # the inputs and A'ᵀ are in shared memory\n",
     "    _stamp(prof + i_c * {S}, 1, i_hv == 0)\n"),
    ("                              i_hv, HV, scale, lower_bound, K, KB, BT, USE_L2NORM, USE_GATE, HAS_DT_BIAS, acc, a_op)\n"
     "    fence_async_shared()\n    _cta_barrier()\n",
     "    _stamp(prof + i_c * {S}, 2, i_hv == 0)\n"),
    ("    b_la = warpgroup_mma_wait(0, deps=[b_la])\n", "    _stamp(prof + i_c * {S}, 3, i_hv == 0)\n"),
    ("    _tma_store(aqk_desc, [row1, 0], aq_s.slice(BT, BT))\n", "    _stamp(prof + i_c * {S}, 4, i_hv == 0)\n"),
    ("        b_t = _doubling_fp16(tl_s, th_s, LOG2_BT, BT)\n", "        _stamp(prof + i_c * {S}, 5, i_hv == 0)\n"),
    ("        _tma_store(a1_desc, [2 * row1, h * KB], in_kq.index(2 * h + 1))\n",
     "    _stamp(prof + i_c * {S}, 6, i_hv == 0)\n"),
    ("    tma.store_wait(0)                                # shared memory stays until the copies have read it\n",
     "    _cta_barrier()\n    _stamp(prof + i_c * {S}, 7, i_hv == 0)\n"),
)


def substitutions() -> list:
    """The text substitutions that instrument the library's Gluon stage 1 (stage_variants.variant_module)."""
    subs = [("@gluon.jit\ndef _view(", _STAMP_FN + "@gluon.jit\ndef _view("),
            ("    slot_lo=0, WINDOWED: gl.constexpr = False,\n):",
             "    slot_lo=0, WINDOWED: gl.constexpr = False, prof=None,\n):")]
    subs += [(anchor, anchor + text.format(S=STAMPS)) for anchor, text in _AFTER]
    return subs


def instrumented_kernel(workdir: str):
    """The instrumented stage-1 kernel (it takes one more argument, prof: int64 [chunk slots × STAMPS])."""
    with open(chunk_prepare_gluon.__file__) as f:
        src = f.read()
    for anchor, _ in substitutions():
        if src.count(anchor) != 1:
            raise ValueError(f"stage1_phases: anchor found {src.count(anchor)} times in chunk_prepare_gluon.py "
                             f"(needs exactly one): {anchor.strip()[:80]!r}")
    return variant_module(chunk_prepare_gluon, "phases", substitutions(), workdir)._chunk_prepare_gluon_kernel


def phase_medians(stamps: torch.Tensor) -> dict:
    """Median cycles of each phase and of the whole program, over the rows of ``stamps`` [rows, STAMPS]
    that were written (rows of unused slots stay zero)."""
    rows = stamps[(stamps != 0).all(dim=1)].double()
    if rows.shape[0] == 0:
        raise ValueError("stage1_phases: no program wrote its stamps")
    out = {name: float((rows[:, i + 1] - rows[:, i]).median()) for i, name in enumerate(PHASES)}
    out["program"] = float((rows[:, -1] - rows[:, 0]).median())
    out["rows"] = int(rows.shape[0])
    return out


def run(tasks, device, log=print) -> dict:
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        kernel = instrumented_kernel(workdir)
        launch = kernels.launch
        for i, task in enumerate(tasks):
            x = make_inputs(task, device, seed=i)
            kw = dict(scale=task.scale, A_log=x.A_log, dt_bias=x.dt_bias, lower_bound=task.lower_bound,
                      cu_seqlens=x.cu_seqlens, use_qk_l2norm=True, use_gate=True, use_beta_sigmoid=True)
            prof = None

            def stamped(k, grid, *args, **kwargs):
                nonlocal prof
                if k is kernel:
                    prof = torch.zeros(grid[0] * STAMPS, dtype=torch.int64, device=device)
                    kwargs = dict(kwargs, prof=prof)
                return launch(k, grid, *args, **kwargs)

            saved = chunk_prepare_gluon._chunk_prepare_gluon_kernel
            chunk_prepare_gluon._chunk_prepare_gluon_kernel, kernels.launch = kernel, stamped
            try:
                if not kernels.gluon_stage1_applies(x.q, x.k, x.g):
                    raise SystemExit("stage1_phases: the Gluon stage 1 does not apply here (needs a Hopper GPU)")
                for _ in range(3):                      # the last call's stamps count (compiled, caches warm)
                    kernels.prepare_chunks(x.q, x.k, x.v, x.g, x.beta, **kw)
                torch.cuda.synchronize()
            finally:
                chunk_prepare_gluon._chunk_prepare_gluon_kernel, kernels.launch = saved, launch
            results[task.name] = phase_medians(prof.view(-1, STAMPS).cpu())
            r = results[task.name]
            log(f"{task.name:<20} {r['program']:7.0f} cycles per program: "
                + ", ".join(f"{p} {r[p]:.0f}" for p in PHASES))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=None, help="comma-separated task names (default: the six standard)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("stage1_phases: needs a CUDA device")
    tasks = select_tasks(args.tasks.split(",")) if args.tasks else default_tasks()
    results = run(tasks, torch.device("cuda"), log=lambda line: print(line, flush=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "unit": "SM cycles (median over chunk slots of "
                       "value head 0)", "phases": PHASES, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
