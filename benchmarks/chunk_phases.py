"""Where a chunk's time goes inside the fused kernel: clock stamps at a producer's phases and at the chain's wait.

    python benchmarks/chunk_phases.py --tasks H96_fixed_8192[,...] [--first 32] [--count 32] [--json PATH]

The fused kernel's time at H96 fixed moved the wrong way under a change that cut the producers' instructions by 6%
(docs/perf-notes.md, session 35): what the chain waits for there is the producers' chunk latency, which instruction
counts do not give. This tool measures it. Like item_timeline.py (whose source rewriting and launch it uses), it
rewrites the library's kernel source with `%clock64` stamps (the SM's cycle counter: every partition of a program
runs on one SM), imports the copy from a temporary folder, launches it through the library's route in place of
the library's kernel, checks its outputs against the library's to the bit and times both (the stamps' own cost
shows). The kernel's source is the imported fastkda's, so `PYTHONPATH=.ab/<tree>` measures a prepared variant.

Stamps, for each chunk c of a window (first <= c < first + count) of every program, in row program, columns
(c - first) * 10 + event:
    producer c mod 2:  0 loop top  1 inputs in shared memory  2 block 0's decays done (before the wait for `free`)
                       3 `free` passed  4 both blocks' tiles stored (before [L; Aqk])  5 the masked tiles stored
                       (before the doubling)  6 tb stored, before `ready` is signalled
    chain:             7 before the wait for `ready`  8 `ready` passed  9 `free` signalled (the chunk done)
and in the row's last column (count * 10) the id of the SM the program ran on.
`summarize` gives the median of each phase (cycles and µs at the clock given; means and 90th percentiles in µs too),
the producer's chunk latency (0 → 6), the chain's wait for `ready` (7 → 8), its work per chunk (8 → 9), the chain's
period (8 → next chunk's 8) and how long a finished chunk waits for the chain (6 → 8). A kernel's time is the sum of
its periods, and ~10% of it lies outside the median chunk (docs/perf-notes.md, session 36): `by_position` gives the
means along the window (do chunks slow down along the sequence?) and `slow_periods` what the slowest periods wait
for (the chain's work, or which producer phase of the next chunk). A fixed-length kernel ends with its slowest
program: `by_program` gives each program's SM (the row's last column) and mean period. `--timer global` stamps the
GPU's nanosecond timer instead of the SM's cycles (whether the clock held during the run).

A diagnosis, not a record: records come from `python -m fastkda.bench`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

import item_timeline                                 # benchmarks/ is the script's own folder, hence on sys.path

EVENTS_PER_CHUNK = 10
PRODUCER_PHASES = ("inputs", "decays_block0", "wait_free", "operands", "l_aqk_masks", "doubling_tb")

_TIMERS = {"clock": "%clock64", "global": "%globaltimer"}   # SM cycles, or the GPU's nanosecond timer

_HELPER = '''

@gluon.jit
def _tick(stamps, c, event: gl.constexpr, FIRST: gl.constexpr, COUNT: gl.constexpr, ROW: gl.constexpr):
    """This program's TIMER at `event` of chunk c, if c is in the window."""
    if (c >= FIRST) & (c < FIRST + COUNT):
        k = gl.inline_asm_elementwise("mov.u64 $0, TIMER;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
        gl.store(stamps + gl.program_id(0) * ROW + (c - FIRST) * EVENTS + event, k)


@gluon.jit
def _stamp_smid(stamps, ROW: gl.constexpr):
    """The SM this program runs on, in the last column of its row."""
    k = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    gl.store(stamps + gl.program_id(0) * ROW + ROW - 1, k.to(gl.int64))
'''


def row_length(count: int) -> int:
    """A program's row of stamps: count chunks of EVENTS_PER_CHUNK events, then its SM's id."""
    return count * EVENTS_PER_CHUNK + 1


def edits(first: int, count: int, timer: str = "clock"):
    """item_timeline's edit list for these stamps (anchors in fastkda/kernels/fused_gluon.py); timer "clock" stamps
    the SM's cycle counter, "global" the GPU's nanosecond timer (the same on every SM, whatever the clock does)."""
    if timer not in _TIMERS:
        raise ValueError(f"chunk_phases: timer must be one of {sorted(_TIMERS)}, got {timer!r}")
    row = row_length(count)
    window = f"{first}, {count}, {row}"
    helper = _HELPER.replace("TIMER", _TIMERS[timer]).replace("EVENTS", str(EVENTS_PER_CHUNK))

    def tick(indent: int, c: str, event: int) -> str:
        return " " * indent + f"_tick(stamps, {c}, {event}, {window})\n"

    inputs = "        _cta_barrier()                               # the inputs and A'ᵀ are in shared memory\n"
    wait_free = ("        mbarrier.wait(free.index(P), (it & 1) ^ 1)"
                 "   # the chain is done with this producer's previous chunk\n")

    return (
        ("relative imports", "from .", "from fastkda.kernels.", 2),
        ("stamp helpers", "\n\n@gluon.jit\ndef _issue_inputs", helper + "\n\n@gluon.jit\ndef _issue_inputs", 1),
        ("producer signature", "              LOG2_BT: gl.constexpr):",
         "              LOG2_BT: gl.constexpr, stamps):", 1),
        ("loop top (0)", "        t0 = bos + c * BT\n", "        t0 = bos + c * BT\n" + tick(8, "c", 0), 1),
        ("inputs (1)", inputs, inputs + tick(8, "c", 1), 1),
        ("decays, wait for free (2, 3)", wait_free, tick(8, "c", 2) + wait_free + tick(8, "c", 3), 1),
        ("operands stored (4)", "        b_la = warpgroup_mma(pq_s.index(B0),",
         tick(8, "c", 4) + "        b_la = warpgroup_mma(pq_s.index(B0),", 1),
        ("masked tiles stored (5)", "        b_t = _doubling_fp16(tl_s,",
         tick(8, "c", 5) + "        b_t = _doubling_fp16(tl_s,", 1),
        ("ready (6)", "        mbarrier.arrive(ready.index(P), count=1)\n",
         tick(8, "c", 6) + "        mbarrier.arrive(ready.index(P), count=1)\n", 1),
        ("chain signature", "HAS_H0: gl.constexpr, STORE_HT: gl.constexpr):",
         "HAS_H0: gl.constexpr, STORE_HT: gl.constexpr, stamps):", 1),
        ("the chain's SM", "    for c in range(0, n_chunks):\n        p = c % 2\n",
         f"    _stamp_smid(stamps, {row})\n    for c in range(0, n_chunks):\n        p = c % 2\n", 1),
        ("chain's wait for ready (7, 8)", "        mbarrier.wait(ready.index(p), (c // 2) & 1)\n",
         tick(8, "c", 7) + "        mbarrier.wait(ready.index(p), (c // 2) & 1)\n" + tick(8, "c", 8), 1),
        ("chunk done (9)", "        mbarrier.arrive(free.index(p), count=1)\n",
         "        mbarrier.arrive(free.index(p), count=1)\n" + tick(8, "c", 9), 1),
        ("kernel signature", "PRODUCER_REGS: gl.constexpr):", "PRODUCER_REGS: gl.constexpr, stamps):", 1),
        ("chain call", "                  STORE_HT)),", "                  STORE_HT, stamps)),", 1),
        ("producer calls", "BT, LOG2_BT)),", "BT, LOG2_BT, stamps)),", 2),
    )


def kernel_source() -> Path:
    """The imported fastkda's fused kernel (PYTHONPATH picks the tree)."""
    import fastkda.kernels
    return Path(fastkda.kernels.__file__).resolve().parent / "fused_gluon.py"


SPANS = PRODUCER_PHASES + ("producer_chunk", "chunk_waits_for_chain", "chain_wait_ready", "chain_work", "chain_period")


def _chunks(stamps: torch.Tensor, n_chunks: Sequence[int], first: int, count: int):
    """(program, window position j, {span: cycles}) for every stamped chunk; chain_period (from this chunk's `ready`
    passed to the next one's) only where the next chunk is in the window."""
    s = stamps.to(torch.int64)[:, :count * EVENTS_PER_CHUNK].reshape(stamps.shape[0], count, EVENTS_PER_CHUNK)
    for p in range(s.shape[0]):
        last = min(int(n_chunks[p]), first + count) - first
        for j in range(max(last, 0)):
            e = [int(v) for v in s[p, j]]
            if 0 in e:                                  # a stamp not written (should not happen in the window)
                continue
            spans = {name: e[i + 1] - e[i] for i, name in enumerate(PRODUCER_PHASES)}
            spans.update(producer_chunk=e[6] - e[0], chunk_waits_for_chain=e[8] - e[6], chain_wait_ready=e[8] - e[7],
                         chain_work=e[9] - e[8])
            if j + 1 < last and int(s[p, j + 1, 8]):
                spans["chain_period"] = int(s[p, j + 1, 8]) - e[8]
            yield p, j, spans


def by_position(stamps: torch.Tensor, n_chunks: Sequence[int], first: int, count: int, clock_ghz: float,
                bucket: int) -> List[Dict]:
    """The mean of each span (µs) over every program's chunks at window positions [b·bucket, (b + 1)·bucket), per
    bucket b: whether chunks get slower along the sequence (the programs walk it in step at a fixed length)."""
    rows: Dict[int, Dict[str, List[float]]] = {}
    for _, j, chunk in _chunks(stamps, n_chunks, first, count):
        row = rows.setdefault(j // bucket, {k: [] for k in SPANS})
        for k, v in chunk.items():
            row[k].append(v)
    return [dict(chunks=f"{first + b * bucket}..{first + min((b + 1) * bucket, count) - 1}",
                 mean_us={k: statistics.mean(v) / clock_ghz / 1e3 if v else float("nan") for k, v in row.items()})
            for b, row in sorted(rows.items())]


def slow_periods(stamps: torch.Tensor, n_chunks: Sequence[int], first: int, count: int, clock_ghz: float,
                 q: float = 0.9) -> Dict:
    """What makes the chain's slowest periods slow. A period runs from chunk j's `ready` passed to chunk j + 1's:
    the chain's work on j, then its wait for j + 1, which is as late as j + 1's producer phases make it. For the
    periods above the q-quantile: their count, and the mean excess (µs) over the median of the chain's work on j,
    its wait for j + 1 and each of j + 1's producer phases."""
    chunks = {(p, j): c for p, j, c in _chunks(stamps, n_chunks, first, count)}
    periods = [(c["chain_period"], p, j) for (p, j), c in chunks.items() if "chain_period" in c]
    nan = float("nan")
    if not periods:
        return dict(periods=0, threshold_us=nan, mean_slow_period_us=nan, median_period_us=nan, excess_us={})
    threshold = _quantile([t for t, _, _ in periods], q)
    slow = [(p, j) for t, p, j in periods if t > threshold and (p, j + 1) in chunks]
    median = {k: item_timeline._median([c[k] for c in chunks.values() if k in c]) for k in SPANS}
    # (name, span, the chunk it is taken from: j or j + 1)
    parts = [("chain_work (j)", "chain_work", 0), ("chain_wait_ready (j + 1)", "chain_wait_ready", 1)] + [
        (f"{k} (j + 1)", k, 1) for k in PRODUCER_PHASES]
    us = 1.0 / clock_ghz / 1e3
    return dict(periods=len(slow), threshold_us=threshold * us,
                mean_slow_period_us=statistics.mean(chunks[k]["chain_period"] for k in slow) * us if slow else nan,
                median_period_us=median["chain_period"] * us,
                excess_us={name: (statistics.mean(chunks[(p, j + d)][span] for p, j in slow) - median[span]) * us
                           if slow else 0.0 for name, span, d in parts})


def by_program(stamps: torch.Tensor, n_chunks: Sequence[int], first: int, count: int, clock_ghz: float) -> Dict:
    """Each program's SM (the row's last column: stamps of row_length(count) columns) and its mean chain period
    (µs) over the window, and what that spread costs: a fixed-length kernel ends with its slowest program. With
    all programs on the GPU at once, also their mean periods split by whether the other SM of their TPC (SM ids
    2t, 2t + 1) ran a program too."""
    smids = stamps[:, -1].tolist() if stamps.shape[1] == row_length(count) else [None] * stamps.shape[0]
    periods: Dict[int, List[int]] = {}
    for p, _, chunk in _chunks(stamps, n_chunks, first, count):
        if "chain_period" in chunk:
            periods.setdefault(p, []).append(chunk["chain_period"])
    us = 1.0 / clock_ghz / 1e3
    rows = [dict(program=p, smid=smids[p], mean_period_us=statistics.mean(v) * us, periods=len(v))
            for p, v in sorted(periods.items())]
    out = dict(programs=rows)
    if rows:
        means = [r["mean_period_us"] for r in rows]
        out.update(median_of_means_us=item_timeline._median(means), max_mean_us=max(means),
                   slowest_program=max(rows, key=lambda r: r["mean_period_us"])["program"])
    busy = {r["smid"] for r in rows if r["smid"] is not None}
    if busy:
        split = {"tpc_shared": [], "tpc_alone": []}
        for r in rows:
            split["tpc_shared" if (r["smid"] ^ 1) in busy else "tpc_alone"].append(r["mean_period_us"])
        out.update({f"{k}_programs": len(v) for k, v in split.items()})
        out.update({f"{k}_mean_us": statistics.mean(v) if v else float("nan") for k, v in split.items()})
    return out


def _spread(prog: Dict) -> Dict:
    """by_program's summary without its rows, and the SMs of its slowest program and of the ones within 1% of it."""
    out = {k: v for k, v in prog.items() if k != "programs"}
    if prog["programs"]:
        top = prog["max_mean_us"]
        out["slowest_smids"] = sorted(r["smid"] for r in prog["programs"] if r["mean_period_us"] >= 0.99 * top)
    return out


def summarize(stamps: torch.Tensor, n_chunks: Sequence[int], first: int, count: int, clock_ghz: float) -> Dict:
    """Median phases (timer ticks, and µs at clock_ghz ticks per ns), with means and 90th percentiles in µs, over
    every program's chunks in the window from their stamps ([programs, row_length(count)] int64)."""
    spans: Dict[str, List[float]] = {k: [] for k in SPANS}
    for _, _, chunk in _chunks(stamps, n_chunks, first, count):
        for k, v in chunk.items():
            spans[k].append(v)
    cycles = {k: item_timeline._median(v) for k, v in spans.items()}
    # the means and the 90th percentiles as well: a kernel's time is the sum of its chunks' periods, and where a
    # few chunks are slow the median hides them
    means = {k: statistics.mean(v) if v else float("nan") for k, v in spans.items()}
    p90 = {k: _quantile(v, 0.9) for k, v in spans.items()}
    return dict(chunks=len(spans["producer_chunk"]), clock_ghz=clock_ghz, median_cycles=cycles,
                median_us={k: v / clock_ghz / 1e3 for k, v in cycles.items()},
                mean_us={k: v / clock_ghz / 1e3 for k, v in means.items()},
                p90_us={k: v / clock_ghz / 1e3 for k, v in p90.items()})


def _quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of values (the nearest rank), nan if there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))])


def _clock_ghz() -> float:
    """The SM clock now (GHz) from nvidia-smi (fused_sweep's reading), else the device's maximum from torch."""
    from fused_sweep import read_clock_and_power     # (imports fastkda: when used, from the tree on PYTHONPATH)
    reading = read_clock_and_power()
    return reading[0] / 1e3 if reading else torch.cuda.get_device_properties(0).clock_rate / 1e6


def phases(task_name: str, first: int = 32, count: int = 32, seed: int = 1234, rounds: int = 3,
           repeats: int = 100, save_stamps: Optional[str] = None, bucket: int = 16, timer: str = "clock",
           captures: int = 1, burst: int = 1) -> Dict:
    """The stamped kernel against the library's on one bench task: bitwise check, times, the phases, their means
    by window position (buckets of `bucket` chunks), what the slowest chain periods wait for and each program's
    SM and mean period (and the raw stamps, [programs, row_length(count)], saved with torch.save to save_stamps if
    given). timer "global" stamps nanoseconds: the spans are then read at 1 GHz whatever the SM clock did. With
    captures > 1, `by_capture` gives each of that many calls' spread of programs (the SMs differ from call to
    call); the other summaries are the last call's. Each stamped call is the last of `burst` back to back (1: an
    isolated call, which starts on an idle GPU)."""
    from fastkda.bench.tasks import make_inputs, select_tasks

    task = select_tasks([task_name])[0]
    stamps = torch.zeros(task.N * task.H, row_length(count), dtype=torch.int64, device="cuda")
    source = kernel_source()
    kernel = item_timeline.load_stamped_kernel(source, edits(first, count, timer))
    run = item_timeline.run_stamped(make_inputs(task, "cuda", seed), kernel, stamps, rounds, repeats, captures,
                                    burst)
    captured = run.pop("captured", [])
    cpu, n_chunks = stamps.cpu(), item_timeline.program_chunks(task)
    ghz = _clock_ghz() if timer == "clock" else 1.0
    out = summarize(cpu, n_chunks, first, count, ghz)
    out.update(by_position=by_position(cpu, n_chunks, first, count, ghz, bucket),
               slow_periods=slow_periods(cpu, n_chunks, first, count, ghz),
               by_program=by_program(cpu, n_chunks, first, count, ghz))
    if captured:
        out["by_capture"] = [_spread(by_program(c, n_chunks, first, count, ghz)) for c in captured]
    if save_stamps:
        torch.save(cpu, save_stamps)
    out.update(task=task_name, first=first, count=count, timer=timer, burst=burst, kernel_source=str(source), **run)
    return out


def _print(r: Dict) -> None:
    print(f"== {r['task']}: bitwise equal {r['bitwise_equal']}, library {r['library_ms']:.4f} ms, stamped "
          f"{r['stamped_ms']:.4f} ms; chunks {r['first']}..{r['first'] + r['count'] - 1} of each program, "
          f"{r['chunks']} stamped, {r['clock_ghz']:.3f} GHz, timer {r['timer']}, burst {r['burst']} "
          f"({r['kernel_source']})")
    for stat in ("median", "mean", "p90"):
        print(f"   {stat} µs: " + ", ".join(f"{k} {v:.3f}" for k, v in r[f"{stat}_us"].items()))
    print("   by position, mean µs (producer's chunk / chain's wait / work / period):")
    for row in r["by_position"]:
        m = row["mean_us"]
        print(f"     chunks {row['chunks']:>9}: {m['producer_chunk']:.3f} / {m['chain_wait_ready']:.3f} / "
              f"{m['chain_work']:.3f} / {m['chain_period']:.3f}")
    slow = r["slow_periods"]
    if slow["periods"]:
        print(f"   {slow['periods']} periods above {slow['threshold_us']:.3f} µs (mean {slow['mean_slow_period_us']:.3f}, "
              f"median period {slow['median_period_us']:.3f}); excess over the medians, µs: "
              + ", ".join(f"{k} {v:+.3f}" for k, v in slow["excess_us"].items()))
    prog = r["by_program"]
    if prog["programs"]:
        line = (f"   programs' mean periods: median {prog['median_of_means_us']:.3f} µs, slowest "
                f"{prog['max_mean_us']:.3f} (program {prog['slowest_program']})")
        if "tpc_shared_programs" in prog:
            line += (f"; TPC shared with another program: {prog['tpc_shared_programs']} at "
                     f"{prog['tpc_shared_mean_us']:.3f}, alone: {prog['tpc_alone_programs']} at "
                     f"{prog['tpc_alone_mean_us']:.3f}")
        print(line)
    for i, cap in enumerate(c for c in r.get("by_capture", []) if "max_mean_us" in c):
        print(f"   call {i}: programs' mean periods median {cap['median_of_means_us']:.3f} µs, slowest "
              f"{cap['max_mean_us']:.3f} (+{100 * (cap['max_mean_us'] / cap['median_of_means_us'] - 1):.1f}%) on SMs "
              f"{cap.get('slowest_smids')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", required=True, help="comma-separated bench task names (python -m fastkda.bench --list)")
    ap.add_argument("--first", type=int, default=32, help="the window's first chunk (default 32)")
    ap.add_argument("--count", type=int, default=32, help="chunks stamped per program (default 32)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", default=None)
    ap.add_argument("--bucket", type=int, default=16, help="chunks per row of the by-position means (default 16)")
    ap.add_argument("--timer", choices=sorted(_TIMERS), default="clock",
                    help="clock: the SM's cycles (default); global: the GPU's nanosecond timer")
    ap.add_argument("--captures", type=int, default=1,
                    help="stamp this many separate calls and report each one's spread of programs (default 1)")
    ap.add_argument("--burst", type=int, default=1,
                    help="stamp the last of this many calls back to back (default 1: an isolated call)")
    ap.add_argument("--save-stamps", default=None,
                    help="a file name prefix: each task's raw stamps go to PREFIX<task>.pt (torch.save)")
    args = ap.parse_args(argv)
    if args.first < 0 or min(args.count, args.bucket, args.captures, args.burst) < 1:
        raise SystemExit(f"chunk_phases: --first must be >= 0, --count, --bucket, --captures and --burst >= 1, got "
                         f"{args.first}, {args.count}, {args.bucket}, {args.captures} and {args.burst}")
    if not torch.cuda.is_available():
        raise SystemExit("chunk_phases: needs a CUDA device (the fused kernel is Hopper-only)")
    results = []
    for name in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        results.append(phases(name, args.first, args.count, args.seed,
                              save_stamps=f"{args.save_stamps}{name}.pt" if args.save_stamps else None,
                              bucket=args.bucket, timer=args.timer, captures=args.captures,
                              burst=args.burst))
        _print(results[-1])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["bitwise_equal"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
