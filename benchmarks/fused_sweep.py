"""The fused kernel against the two stages over packed shapes: the data behind kernels.fused_by_rule.

    python benchmarks/fused_sweep.py [--shapes H32x8x1024,H4x1x8192+32x300,H64xB2x4096,...] [--graph]
                                     [--sustain SECONDS] [--fixed-as-packed] [--repeats 40] [--rounds 3]
                                     [--json PATH]

A shape is H heads × N packed sequences × L tokens each (H32x8x1024), or several such groups packed in turn
(H4x1x8192+32x300: one sequence of 8,192 tokens, then 32 of 300; without cu_seqlens_cpu the rule sees only
the average length, so such mixes show where it cannot tell), or a fixed-length batch of B sequences of T
tokens, no cu_seqlens (H64xB2x4096). For each one, both routes run through fastkda.fwd: the fused kernel
(kernels.FUSED = True) and the two stages (FUSED = False). Their outputs and final states are compared
bitwise first (the fused kernel is written to equal the two stages exactly), then both are timed in
interleaved rounds (CUDA events, the mean of the rounds' medians; with --graph each call is replayed from a
CUDA graph, so that the GPU's time is measured, not a slow host's). Each row says what fused_by_rule picks
(from a device cu_seqlens alone, and knowing the lengths as from cu_seqlens_cpu) and which route was faster,
so that a rule picking the slower route shows at once. With --sustain each route runs back to back for that
many seconds before its timed calls in every round, and the SM clock and board power are read (nvidia-smi)
while it does: the H200 holds its top clock only in short bursts, and a route that draws more power slows
more under sustained load (docs/perf-notes.md, sessions 25 and 30). With --fixed-as-packed a fixed-length
shape also runs the fused kernel on the same tokens passed as packed sequences: the kernel's other
specialisation (IS_VARLEN), which ptxas schedules otherwise; at H96 fixed the fused kernel's time moves by
several percent with its code's schedule (docs/perf-notes.md, session 36). A diagnosis, not a record: records
come from `python -m fastkda.bench`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import subprocess
import time
from typing import List, Optional, Sequence, Tuple

import torch

import fastkda
from fastkda import kernels
from fastkda.bench.tasks import Task, make_inputs
from fastkda.bench.timing import capture_graph, time_cuda, time_cuda_graph

# Around the rule's bounds (kernels.fused_by_rule, 132 SMs): fixed-length, waves 0.42–0.97 full (the bound: 0.65,
# fitted with --sustain); packed, 2.5 programs per SM, 256 tokens on average, and one long sequence among short
# ones (which the rule cannot see). Sessions 17, 19, 29 and 30 in docs/perf-notes.md; use --graph where the host
# is slow (session 19).
DEFAULT_SHAPES = (
    "H128xB1x8192", "H112xB1x8192", "H104xB1x8192", "H100xB1x8192", "H96xB1x8192", "H64xB1x8192", "H104xB1x4096",
    "H96xB1x4096", "H64xB1x4096", "H56xB1x4096", "H96xB1x1024", "H32xB2x4096", "H70xB2x2048", "H88xB2x4096",
    "H96xB2x4096", "H100xB2x2048", "H64xB4x2048", "H90xB3x2048", "H90xB3x1024",
    "H16xB8x1024",
    "H16x8x1024", "H32x8x1024", "H40x8x1024", "H42x8x1024", "H64x8x1024", "H96x8x1024", "H32x64x256",
    "H32x256x64", "H64x16x128", "H4x1x8192+32x300", "H4x1x8192+100x300", "H32x1x8192+64x64",
)

_GROUP = re.compile(r"(\d+)x(\d+)")
_FIXED = re.compile(r"B(\d+)x(\d+)")


def parse_shape(text: str) -> Tuple[int, Tuple[int, ...], bool]:
    """'H32x8x1024' -> (32, (1024,) * 8, False); 'H4x1x8192+2x300' -> (4, (8192, 300, 300), False);
    'H64xB2x4096' -> (64, (4096, 4096), True): heads, the sequences' lengths (all positive), fixed-length."""
    t = text.strip()
    head, _, rest = t.partition("x")
    fixed = _FIXED.fullmatch(rest)
    groups = [fixed] if fixed else [_GROUP.fullmatch(g) for g in rest.split("+")]
    if not (head[:1] == "H" and head[1:].isdigit() and int(head[1:]) > 0 and all(groups)
            and all(int(x) > 0 for g in groups for x in g.groups())):
        raise ValueError(f"shape: expected H<heads>x<sequences>x<tokens>[+<sequences>x<tokens>...] or "
                         f"H<heads>xB<batch>x<tokens> with positive numbers, got {text!r}")
    return int(head[1:]), tuple(int(g.group(2)) for g in groups for _ in range(int(g.group(1)))), bool(fixed)


def verdict(H: int, lens: Sequence[int], fixed: bool, fused_ms: float, two_stage_ms: float, sm_count: int) -> dict:
    """What the rule picks for the shape, which route was faster, and whether they agree: as called with a
    device cu_seqlens only, and (packed) with its CPU copy too, which tells the rule the longest sequence."""
    N = len(lens)
    rule = kernels.fused_by_rule(N, H, sum(lens), sm_count, packed=not fixed)
    rule_known = kernels.fused_by_rule(N, H, sum(lens), sm_count, packed=not fixed, max_seqlen=max(lens))
    faster = "fused" if fused_ms < two_stage_ms else "two stages"
    return {"programs": N * H, "programs_per_sm": N * H / sm_count, "rule_picks": "fused" if rule else "two stages",
            "faster": faster, "rule_right": (faster == "fused") == rule,
            "rule_picks_knowing_lengths": "fused" if rule_known else "two stages",
            "rule_right_knowing_lengths": (faster == "fused") == rule_known,
            "fused_vs_two_stages": fused_ms / two_stage_ms - 1}


@contextlib.contextmanager
def _route(fused: bool):
    before = kernels.FUSED
    kernels.FUSED = fused
    try:
        yield
    finally:
        kernels.FUSED = before


def read_clock_and_power() -> Optional[Tuple[float, float]]:
    """(SM clock in MHz, board power in W) of GPU 0 from nvidia-smi, or None where it cannot be read."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--id=0", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        clock, power = (float(x) for x in out.strip().splitlines()[0].split(","))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None
    return clock, power


def sustain(fn, seconds: float, *, batch: int = 50, read=read_clock_and_power, sync=torch.cuda.synchronize,
            clock=time.perf_counter) -> List[Tuple[float, float]]:
    """Runs ``fn()`` back to back for ``seconds`` of wall time (``clock``), ``batch`` calls queued at a time
    (``sync()`` after each batch); each batch after the first is sampled with ``read()`` while the GPU works
    through it (the first starts from idle). Returns the readings."""
    if seconds <= 0:
        return []
    readings, t_end, first = [], clock() + seconds, True
    while clock() < t_end:
        for _ in range(batch):
            fn()
        if not first:
            reading = read()
            if reading is not None:
                readings.append(reading)
        first = False
        sync()
    return readings


def measure(name: str, *, repeats: int, rounds: int, seed: int, graph: bool = False,
            sustain_s: float = 0.0, fixed_as_packed: bool = False) -> dict:
    """One shape: bitwise comparison of the two routes, then interleaved timings (CUDA); with ``sustain_s``
    each timing follows that many seconds of the route back to back (readings of clock and power kept). With
    ``fixed_as_packed``, a fixed-length shape also runs the fused kernel as packed sequences (the same tokens
    with cu_seqlens: the kernel's packed specialisation, the tables launch included), compared bitwise with
    the fixed-length call and timed in the same rounds (``fused_packed_*``)."""
    H, lens, fixed = parse_shape(name)
    task = Task(name.strip(), H, lens)
    x = make_inputs(task, "cuda", seed=seed)
    q, k, v, g, beta, cu = x.q, x.k, x.v, x.g, x.beta, x.cu_seqlens
    if fixed:                                        # the same tokens as a batch of equal sequences
        B, T = len(lens), lens[0]
        q, k, v, g, beta = (t.view(B, T, *t.shape[2:]) for t in (q, k, v, g, beta))
        cu = None
    routes = ("fused", "two_stages") + (("fused_packed",) if fixed and fixed_as_packed else ())
    outs = {r: (torch.empty_like(x.v), torch.empty_like(x.initial_state)) for r in routes}

    def call(route: str):
        out, final = outs[route]
        with _route(route != "two_stages"):
            if route == "fused_packed":
                fastkda.fwd(x.q, x.k, x.v, x.g, x.beta, task.scale, out, x.A_log, x.dt_bias, task.lower_bound,
                            x.initial_state, final, x.cu_seqlens)
            else:
                fastkda.fwd(q, k, v, g, beta, task.scale, out.view(v.shape), x.A_log, x.dt_bias, task.lower_bound,
                            x.initial_state, final, cu)

    if not kernels.fused_applies(q, k, g, v, x.A_log, x.dt_bias, True, True, True):
        raise SystemExit("fused_sweep: the fused kernel does not apply on this GPU (it needs Hopper and Gluon)")
    for route in routes:
        call(route)
    torch.cuda.synchronize()
    equal = all(torch.equal(a, b) for a, b in zip(outs["fused"], outs["two_stages"]))
    times = {r: [] for r in routes}
    readings = {r: [] for r in routes}
    timer = time_cuda_graph if graph else time_cuda
    # the load as the timing sees it: with --graph, replays (eager calls of a small shape leave the GPU idle
    # while the host works)
    load_fn = {r: (capture_graph(lambda r=r: call(r)).replay if graph and sustain_s > 0 else lambda r=r: call(r))
               for r in routes}
    for _ in range(rounds):
        for route in routes:
            readings[route] += sustain(load_fn[route], sustain_s)
            times[route].append(timer(lambda: call(route), warmup=5, repeats=repeats, rounds=1).median_ms)
    fused_ms, two_ms = statistics.mean(times["fused"]), statistics.mean(times["two_stages"])
    load = {}
    for key in routes:
        if readings[key]:
            load[f"{key}_clock_mhz"] = statistics.median(r[0] for r in readings[key])
            load[f"{key}_power_w"] = statistics.median(r[1] for r in readings[key])
    packed = {}
    if "fused_packed" in routes:
        packed_ms = statistics.mean(times["fused_packed"])
        packed = dict(fused_packed_ms=packed_ms, fused_packed_rounds=times["fused_packed"],
                      fused_packed_vs_fused=packed_ms / fused_ms - 1,
                      fused_packed_bitwise_equal=all(torch.equal(a, b)
                                                     for a, b in zip(outs["fused"], outs["fused_packed"])))
    sm_count = torch.cuda.get_device_properties(v.device).multi_processor_count
    return dict(shape=task.name, H=H, N=len(lens), tokens=sum(lens), longest=max(lens), fixed_length=fixed,
                timing="graph" if graph else "eager", sustain_s=sustain_s, bitwise_equal=equal, fused_ms=fused_ms,
                two_stages_ms=two_ms, fused_rounds=times["fused"], two_stages_rounds=times["two_stages"], **packed,
                **load, **verdict(H, lens, fixed, fused_ms, two_ms, sm_count))


def run(shapes: Sequence[str], *, repeats: int = 40, rounds: int = 3, graph: bool = False, sustain_s: float = 0.0,
        fixed_as_packed: bool = False, log=print) -> List[dict]:
    if not torch.cuda.is_available():
        raise SystemExit("fused_sweep: needs a CUDA GPU (the fused kernel is Hopper-only)")
    for name in shapes:
        parse_shape(name)                            # every shape is well-formed before the first run
    rows = []
    for i, name in enumerate(shapes):
        r = measure(name, repeats=repeats, rounds=rounds, seed=100 + i, graph=graph, sustain_s=sustain_s,
                    fixed_as_packed=fixed_as_packed)
        rows.append(r)
        load = "".join(f"  {key}: {r[key + '_clock_mhz']:.0f} MHz {r[key + '_power_w']:.0f} W"
                       for key in ("fused", "two_stages", "fused_packed") if key + "_clock_mhz" in r)
        if "fused_packed_ms" in r:
            load += (f"  fused as packed {r['fused_packed_ms']:.3f} ms ({r['fused_packed_vs_fused']:+.1%}"
                     f"{'' if r['fused_packed_bitwise_equal'] else ', NOT BITWISE EQUAL'})")
        log(f"{r['shape']:<18} {r['programs']:5d} programs  fused {r['fused_ms']:.3f}  two stages "
            f"{r['two_stages_ms']:.3f} ms ({r['fused_vs_two_stages']:+.1%}){load}  rule: {r['rule_picks']:<10}"
            f"{'' if r['rule_right'] else '  <- the slower route'}"
            f"{'' if r['rule_right_knowing_lengths'] else '  (knowing the lengths: the slower route)'}"
            f"{'' if r['bitwise_equal'] else '  NOT BITWISE EQUAL'}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=None, help="comma-separated H<heads>x<sequences>x<tokens> (groups joined "
                                                   "by +) or H<heads>xB<batch>x<tokens> (fixed-length; default: a "
                                                   "sweep around the rule's bounds)")
    ap.add_argument("--graph", action="store_true", help="time CUDA graph replays (the GPU's time alone)")
    ap.add_argument("--sustain", type=float, default=0.0, metavar="SECONDS",
                    help="run each route back to back this long before its timed calls, every round (load: clock "
                         "and power read while it runs)")
    ap.add_argument("--fixed-as-packed", action="store_true",
                    help="fixed-length shapes: also time the fused kernel called with the same tokens as packed "
                         "sequences (its packed specialisation)")
    ap.add_argument("--repeats", type=int, default=40, help="timed calls per round and route")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    shapes = args.shapes.split(",") if args.shapes else list(DEFAULT_SHAPES)
    if args.sustain < 0:
        raise SystemExit(f"fused_sweep: --sustain must be >= 0 seconds, got {args.sustain}")
    rows = run(shapes, repeats=args.repeats, rounds=args.rounds, graph=args.graph, sustain_s=args.sustain,
               fixed_as_packed=args.fixed_as_packed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"what": "fused kernel against the two stages (benchmarks/fused_sweep.py)",
                       "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    for key, how in (("rule_right", ""), ("rule_right_knowing_lengths", " knowing the lengths")):
        wrong = [r["shape"] for r in rows if not r[key]]
        print(f"the rule{how} picks the slower route on {len(wrong)} of {len(rows)} shapes"
              + (f": {', '.join(wrong)}" if wrong else ""))
    if not all(r["bitwise_equal"] and r.get("fused_packed_bitwise_equal", True) for r in rows):
        raise SystemExit("fused_sweep: the routes differ on some shape (see the rows)")


if __name__ == "__main__":
    main()
