"""Where fastkda's time goes: cold first call, then each stage timed on its own, for the six standard tasks.

    python benchmarks/profile_stages.py [--json PATH] [--tasks a,b]

Run it in a fresh process on a fresh machine for honest cold-call numbers (Triton compiles on first use and
caches on disk). Each stage's bytes are counted from the tensors it must read and write; achieved
bandwidth = bytes / time, to set against the device copy bandwidth (about 4.25 TB/s on an H200).
Speed numbers for the record come from ``python -m fastkda.bench`` (validation first); this is a diagnosis.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import fastkda
from fastkda.bench.tasks import default_tasks, make_inputs, select_tasks
from fastkda.bench.timing import copy_bandwidth
from fastkda import kernels
from fastkda.kernels import CHUNK_SIZE, prepare_chunks, run_recurrence
from byte_floor import design_bytes   # benchmarks/ is the script's own folder, hence on sys.path


def median_ms(fn, warmup=10, repeats=100):
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[len(times) // 2]


def stage_slots(task) -> int:
    """Chunk slots of the stage-1 tensors (kernels.chunk_tables: packed calls get one per sequence more)."""
    return (task.T + CHUNK_SIZE - 1) // CHUNK_SIZE + (0 if task.fixed else task.N)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--tasks", default=None)
    ap.add_argument("--stage1-warps", type=int, default=None, help="override the launch rule (diagnosis)")
    ap.add_argument("--stage1-maxnreg", type=int, default=None, help="override the launch rule (diagnosis)")
    ap.add_argument("--stage2-warps", type=int, default=None, help="override the launch rule (diagnosis)")
    args = ap.parse_args()
    if args.stage1_warps:
        kernels.STAGE1_WARPS = args.stage1_warps
    if args.stage1_maxnreg:
        kernels.STAGE1_MAXNREG = args.stage1_maxnreg
    if args.stage2_warps:
        kernels.STAGE2_WARPS = args.stage2_warps
    tasks = select_tasks(args.tasks.split(",")) if args.tasks else default_tasks()
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev).TBps
    rows = []
    for i, task in enumerate(tasks):
        x = make_inputs(task, dev, seed=i)
        kw = dict(scale=task.scale, A_log=x.A_log, dt_bias=x.dt_bias, lower_bound=task.lower_bound,
                  cu_seqlens=x.cu_seqlens, use_qk_l2norm=True, use_gate=True, use_beta_sigmoid=True)
        out = torch.empty_like(x.v)
        fs = torch.empty_like(x.initial_state)

        def full():
            fastkda.fwd(x.q, x.k, x.v, x.g, x.beta, task.scale, out, x.A_log, x.dt_bias, task.lower_bound,
                        x.initial_state, fs, x.cu_seqlens)

        torch.cuda.synchronize()
        t0 = time.perf_counter()
        full()
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - t0) * 1e3
        st = prepare_chunks(x.q, x.k, x.v, x.g, x.beta, **kw)
        t1 = median_ms(lambda: prepare_chunks(x.q, x.k, x.v, x.g, x.beta, **kw))
        t2 = median_ms(lambda: run_recurrence(st, x.v, out=out, initial_state=x.initial_state, final_state=fs,
                                              cu_seqlens=x.cu_seqlens, state_v_first=True))
        tt = median_ms(full)
        nb = design_bytes(task.T, task.H, task.H, task.D, task.N, stage_slots(task))
        rows.append(dict(task=task.name, first_call_ms=first_ms, stage1_ms=t1, stage2_ms=t2, total_ms=tt,
                         stage1_TBps=nb["stage1"] / t1 / 1e9, stage2_TBps=nb["stage2"] / t2 / 1e9,
                         stage1_bytes=nb["stage1"], stage2_bytes=nb["stage2"]))
    print(f"device copy bandwidth {bw:.3f} TB/s")
    print(f"{'task':<20} {'first call':>11} {'stage1':>8} {'TB/s':>6} {'stage2':>8} {'TB/s':>6} {'total':>8}")
    for r in rows:
        print(f"{r['task']:<20} {r['first_call_ms']:>9.0f}ms {r['stage1_ms']:>8.3f} {r['stage1_TBps']:>6.2f} "
              f"{r['stage2_ms']:>8.3f} {r['stage2_TBps']:>6.2f} {r['total_ms']:>8.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_TBps": bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
