"""Where a fused-kernel program's time goes between its chunks: a per-program timeline from stamps in the kernel.

    python benchmarks/item_timeline.py --tasks H64_varlen_1024x8,H96_fixed_8192 [--ablation] [--json PATH]

The fused kernel (fastkda/kernels/fused_gluon.py) spends ~11 µs of a 93-µs program on the packed tasks outside
its chunks' steady pace (docs/perf-notes.md, session 24). To see where, `stamped_source` rewrites the library's
kernel source with stamps -- the global timer (ns, comparable across SMs) and the SM's cycle counter (exact
within a program) -- at fixed events, the copy is imported from a temporary folder and launched in place of the
library's kernel through the library's own route (kernels._gluon). Its outputs must equal the library's to
the bit, and both are timed side by side (CUDA-graph replays, interleaved rounds), so the stamps' own cost
shows (0.3–1.3% in session 31).

Events, per program (row of the stamp tensor; globaltimer in columns 0..127, clock64 in 128..255):
    0 the SM's id          1 the chain starts           2 the chain's loop ends      3 the final state is stored
    4 producer 0 starts    5 its first inputs landed    6, 7 producers 0, 1 mark their first chunk ready
    8 + c the chain has chunk c's tiles (c < MAX_CHUNKS)    127 the chain has the last chunk's tiles
From them `summarize` gives, per program and as medians (over all programs and per wave, a wave being the
programs that ran n-th on their SM): the first inputs' latency, the first chunk's readiness, the steady
period between chunks, the last chunk's chain time, the final state's stores, and the gap between a program's
end and the next one's start on the same SM. --ablation also times the library's kernel without the initial
state, without the final state and without both (wrong semantics by design: what the state's I/O costs).

A diagnosis, not a record: records come from `python -m fastkda.bench`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
KERNEL_SOURCE = ROOT / "fastkda" / "kernels" / "fused_gluon.py"
MAX_CHUNKS = 119                # chunks stamped per program from the first (events 8 .. 126) ...
LAST_CHUNK = 127                # ... and the last one's event, however long the program
EVENTS = 128

_HELPERS = f'''

@gluon.jit
def _stamp(stamps, idx):
    """The global timer and the SM's cycle counter of this program at event idx."""
    base = stamps + gl.program_id(0) * {2 * EVENTS}
    t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    k = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    gl.store(base + idx, t)
    gl.store(base + {EVENTS} + idx, k)


@gluon.jit
def _stamp_smid(stamps):
    sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    gl.store(stamps + gl.program_id(0) * {2 * EVENTS}, sm.to(gl.int64))
'''

# (what, anchor, replacement, occurrences): each anchor must occur exactly that often in the kernel source.
_EDITS = (
    ("relative imports", "from .", "from fastkda.kernels.", 2),
    ("stamp helpers", "\n\n@gluon.jit\ndef _issue_inputs", _HELPERS + "\n\n@gluon.jit\ndef _issue_inputs", 1),
    ("producer signature", "              LOG2_BT: gl.constexpr):", "              LOG2_BT: gl.constexpr, stamps):", 1),
    ("producer start (4)", "    c_g = -LOG2E * gl.exp(gl.load(A_log + i_hv))\n",
     "    if P == 0:\n        _stamp(stamps, 4)\n    c_g = -LOG2E * gl.exp(gl.load(A_log + i_hv))\n", 1),
    ("first inputs landed (5)", "        async_copy.wait_group(0)\n    mbarrier.arrive(inputs.index(0), count=1)",
     "        async_copy.wait_group(0)\n        if P == 0:\n            _stamp(stamps, 5)\n"
     "    mbarrier.arrive(inputs.index(0), count=1)", 1),
    ("first chunk ready (6, 7)", "        mbarrier.arrive(ready.index(P), count=1)\n",
     "        mbarrier.arrive(ready.index(P), count=1)\n        if c == P:\n            _stamp(stamps, 6 + P)\n", 1),
    ("chain signature", "HAS_H0: gl.constexpr, STORE_HT: gl.constexpr):",
     "HAS_H0: gl.constexpr, STORE_HT: gl.constexpr, stamps):", 1),
    ("chain start (0, 1)", "    BV: gl.constexpr = 64\n    acc_k",
     "    _stamp_smid(stamps)\n    _stamp(stamps, 1)\n    BV: gl.constexpr = 64\n    acc_k", 1),
    ("chunk c's tiles (8 + c, the last at 127)", "        mbarrier.wait(ready.index(p), (c // 2) & 1)\n",
     f"        mbarrier.wait(ready.index(p), (c // 2) & 1)\n        if (c < {MAX_CHUNKS}) | (c == n_chunks - 1):\n"
     f"            _stamp(stamps, gl.where(c == n_chunks - 1, {LAST_CHUNK}, 8 + c))\n", 1),
    ("loop end (2)", "        mbarrier.arrive(free.index(p), count=1)\n    if STORE_HT:",
     "        mbarrier.arrive(free.index(p), count=1)\n    _stamp(stamps, 2)\n    if STORE_HT:", 1),
    ("final state stored (3)", "        gl.store(ht + o_st, b_s1.to(ht.dtype.element_ty))\n",
     "        gl.store(ht + o_st, b_s1.to(ht.dtype.element_ty))\n    _stamp(stamps, 3)\n", 1),
    ("kernel signature", "PRODUCER_REGS: gl.constexpr):", "PRODUCER_REGS: gl.constexpr, stamps):", 1),
    ("chain call", "                  STORE_HT)),", "                  STORE_HT, stamps)),", 1),
    ("producer calls", "BT, LOG2_BT)),", "BT, LOG2_BT, stamps)),", 2),
)


def stamped_source(source: str, edits=_EDITS) -> str:
    """The fused kernel's source with the stamps of this module's docstring (or other `edits`, in _EDITS' form);
    ValueError naming the edit whose anchor is not found as often as expected (the kernel changed: update them)."""
    for what, anchor, replacement, count in edits:
        found = source.count(anchor)
        if found != count:
            raise ValueError(f"fused_gluon.py: the anchor of edit '{what}' occurs {found} times, expected {count}: "
                             f"{anchor!r}")
        source = source.replace(anchor, replacement)
    return source


def load_stamped_kernel(source_path: Path = KERNEL_SOURCE, edits=_EDITS):
    """The stamped kernel (a module written to a temporary folder: Gluon reads a kernel's source from its file)."""
    folder = Path(tempfile.mkdtemp(prefix="fastkda-timeline-"))
    path = folder / "fused_stamped.py"
    path.write_text(stamped_source(Path(source_path).read_text(), edits))
    spec = importlib.util.spec_from_file_location("fused_stamped", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._fused_kernel


def _median(values) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def summarize(stamps: torch.Tensor, n_chunks: Sequence[int]) -> Dict:
    """Phases (µs) of each program from its stamps ([programs, 256] int64) and chunk count, their medians over all
    programs and per wave, and the gaps between consecutive programs on an SM."""
    s = stamps.to(torch.float64)
    gt, ck = s[:, :EVENTS], s[:, EVENTS:]
    programs = s.shape[0]
    # the SM clock in cycles per ns, from each program's whole life
    ghz = _median([float((ck[p, 3] - ck[p, 1]) / (gt[p, 3] - gt[p, 1])) for p in range(programs)
                   if gt[p, 3] > gt[p, 1]])

    def span(p, a, b):
        return float(ck[p, b] - ck[p, a]) / ghz / 1e3

    nan = float("nan")
    rows = []
    for p in range(programs):
        n = int(n_chunks[p])
        row = {"sm": int(s[p, 0]), "chunks": n, "start_us": float(gt[p, 1]) / 1e3, "end_us": float(gt[p, 3]) / 1e3,
               "first_inputs": span(p, 4, 5), "final_state": span(p, 2, 3), "program": span(p, 1, 3),
               "first_ready": span(p, 1, 8 if n > 1 else LAST_CHUNK) if n else nan,
               "last_chunk": span(p, LAST_CHUNK, 2) if n else nan}
        if n >= 3:
            row["period"] = span(p, 9, LAST_CHUNK) / (n - 2)    # from chunk 1 on: chunk 0's wait is first_ready
        rows.append(row)
    by_sm: Dict[int, List[dict]] = {}
    for row in rows:
        by_sm.setdefault(row["sm"], []).append(row)
    gaps = []
    for runs in by_sm.values():
        runs.sort(key=lambda r: r["start_us"])
        for i, row in enumerate(runs):
            row["wave"] = i
            if i:
                gaps.append(row["start_us"] - runs[i - 1]["end_us"])
    phases = ("first_inputs", "first_ready", "period", "last_chunk", "final_state", "program")
    t0 = min(r["start_us"] for r in rows)
    waves = []
    for w in sorted({r["wave"] for r in rows}):
        in_wave = [r for r in rows if r["wave"] == w]
        waves.append(dict(programs=len(in_wave), start_us=_median([r["start_us"] - t0 for r in in_wave]),
                          end_us=_median([r["end_us"] - t0 for r in in_wave]),
                          **{k: _median([r.get(k, float("nan")) for r in in_wave]) for k in phases}))
    return dict(sm_clock_ghz=ghz, sms=len(by_sm), span_us=max(r["end_us"] for r in rows) - t0,
                gap_us=_median(gaps), gap_max_us=max(gaps) if gaps else None,
                median={k: _median([r.get(k, float("nan")) for r in rows]) for k in phases}, waves=waves, rows=rows)


def program_chunks(task) -> List[int]:
    """Chunks of each fused-kernel program (program = sequence in longest-first order × value head)."""
    from fastkda.kernels import CHUNK_SIZE as BT
    if task.fixed:
        lengths = list(task.seq_lens)
    else:
        lengths = sorted(task.seq_lens, reverse=True)     # kernels.run_fused: stage 0's longest-first order
    return [-(-lengths[p // task.H] // BT) for p in range(len(lengths) * task.H)]


def run_stamped(x, stamped, stamps: torch.Tensor, rounds: int = 3, repeats: int = 100,
                captures: int = 1, burst: int = 1) -> Dict:
    """The stamped fused kernel (stamps: its extra argument, zeroed first) against the library's on inputs x, both
    through the library's route with the fused kernel forced: whether they agree to the bit, their times (ms, mean
    of the rounds' CUDA-graph medians), and `stamps` holding one last call's stamps. With captures > 1, the stamps
    of that many separate calls as well (`captured`, CPU tensors; the last of them is the one left in `stamps`):
    which SMs a program lands on changes from call to call. Each captured call is the last of `burst` calls back
    to back: an isolated call (burst 1) starts on an idle GPU and runs at another clock than calls under
    sustained load."""
    from fastkda import kernels
    from fastkda.bench.impls import fastkda_impl
    from fastkda.bench.timing import time_cuda_graph
    from fastkda.kernels import direct_launch

    library_gluon = kernels._gluon

    class _Launch:
        def __getitem__(self, grid):
            return lambda *args, **kw: stamped[grid](*args, stamps=stamps, **kw)

    def with_stamps(name):
        return _Launch() if name == "_fused_kernel" else library_gluon(name)

    # both through Triton's launch path (the direct one would give up on the stand-in for good), fused forced
    saved = kernels.FUSED, direct_launch._direct
    kernels.FUSED, direct_launch._direct = True, False
    try:
        library = fastkda_impl().timed_call(x)
        kernels._gluon = with_stamps
        probe = fastkda_impl().timed_call(x)
        kernels._gluon = library_gluon
        library()
        kernels._gluon = with_stamps
        probe()
        torch.cuda.synchronize()
        equal = bool(torch.equal(library.out, probe.out) and torch.equal(library.final_state, probe.final_state))
        times = {"library": [], "stamped": []}
        for _ in range(rounds):
            for name, fn in (("library", library), ("stamped", probe)):
                kernels._gluon = library_gluon if name == "library" else with_stamps
                times[name].append(time_cuda_graph(fn, warmup=10, repeats=repeats).median_ms)
        kernels._gluon = with_stamps
        captured = []
        for _ in range(max(captures, 1)):
            stamps.zero_()
            for _ in range(max(burst, 1)):               # each call writes every stamp of its window
                probe()
            torch.cuda.synchronize()
            captured.append(stamps.cpu())
    finally:
        kernels._gluon = library_gluon
        kernels.FUSED, direct_launch._direct = saved
    out = dict(bitwise_equal=equal, library_ms=statistics.mean(times["library"]),
               stamped_ms=statistics.mean(times["stamped"]))
    if captures > 1:
        out["captured"] = captured
    return out


def timeline(task_name: str, seed: int = 1234, rounds: int = 3, repeats: int = 100) -> Dict:
    """The stamped kernel against the library's on one bench task: bitwise check, times, the summary."""
    from fastkda.bench.tasks import make_inputs, select_tasks

    task = select_tasks([task_name])[0]
    stamps = torch.zeros(task.N * task.H, 2 * EVENTS, dtype=torch.int64, device="cuda")
    run = run_stamped(make_inputs(task, "cuda", seed), load_stamped_kernel(), stamps, rounds, repeats)
    out = summarize(stamps.cpu(), program_chunks(task))
    out.update(task=task_name, **run)
    return out


def ablation(task_name: str, seed: int = 1234, rounds: int = 3, repeats: int = 100) -> Dict[str, float]:
    """The library's time (ms) with and without the initial and the final state (wrong results by design)."""
    import fastkda
    from fastkda.bench.tasks import make_inputs, select_tasks
    from fastkda.bench.timing import time_cuda_graph

    task = select_tasks([task_name])[0]
    x = make_inputs(task, "cuda", seed)
    out, final = torch.empty_like(x.v), torch.empty_like(x.initial_state)
    variants = {"both": (x.initial_state, final), "no initial state": (None, final),
                "no final state": (x.initial_state, None), "neither": (None, None)}
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (h0, ht) in variants.items():
            def call(h0=h0, ht=ht):
                fastkda.fwd(x.q, x.k, x.v, x.g, x.beta, x.scale, out, x.A_log, x.dt_bias, x.lower_bound, h0, ht,
                            x.cu_seqlens)
            times[name].append(time_cuda_graph(call, warmup=10, repeats=repeats).median_ms)
    return {name: statistics.mean(t) for name, t in times.items()}


def _print(result: Dict) -> None:
    print(f"== {result['task']}: bitwise equal {result['bitwise_equal']}, library {result['library_ms']:.4f} ms, "
          f"stamped {result['stamped_ms']:.4f} ms; {result['sms']} SMs, clock {result['sm_clock_ghz']:.3f} GHz, "
          f"gap between programs {result['gap_us']:.2f} µs")
    print("   median µs: " + ", ".join(f"{k} {v:.2f}" for k, v in result["median"].items()))
    for i, w in enumerate(result["waves"]):
        print(f"   wave {i}: {w['programs']} programs, {w['start_us']:.1f}..{w['end_us']:.1f} µs, first inputs "
              f"{w['first_inputs']:.2f}, first ready {w['first_ready']:.2f}, period {w['period']:.3f}, last chunk "
              f"{w['last_chunk']:.2f}, final state {w['final_state']:.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", required=True, help="comma-separated bench task names (python -m fastkda.bench --list)")
    ap.add_argument("--ablation", action="store_true", help="also time the library without the states' I/O")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", default=None, help="the summaries (per-program rows included)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("item_timeline: needs a CUDA device (the fused kernel is Hopper-only)")
    results = {"timelines": [], "ablation": {}}
    for name in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        result = timeline(name, args.seed)
        _print(result)
        results["timelines"].append(result)
        if args.ablation:
            results["ablation"][name] = ablation(name, args.seed)
            print("   ablation ms: " + ", ".join(f"{k} {v:.4f}" for k, v in results["ablation"][name].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["bitwise_equal"] for r in results["timelines"]) else 1


if __name__ == "__main__":
    sys.exit(main())
