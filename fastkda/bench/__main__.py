"""Command line: ``python -m fastkda.bench [options]``.

    python -m fastkda.bench                              # the six standard tasks on the GPU
    python -m fastkda.bench --suite extended             # long/short/many-sequence shapes
    python -m fastkda.bench --tasks H96_fixed_8192,H64_varlen_mixed --repeats 600
    python -m fastkda.bench --impl mypkg.kda:fwd         # add an implementation with FlashKDA's fwd signature
    python -m fastkda.bench --timing graph               # GPU time only: each call replayed from a CUDA graph
    python -m fastkda.bench --device cpu                 # CPU reference path (small shapes), not a GPU benchmark
    python -m fastkda.bench --list                       # the tasks of every suite

Exit status: 0 when fastkda passed validation on every task, 1 when it failed (or errored) on any, 2 on a
usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

import torch

from . import default_device, resolve_quick_check, run_benchmark
from .impls import resolve_impls
from .report import MAIN, default_paths, format_table, write_json, write_png
from .tasks import SUITES, bytes_moved, select_tasks, suite
from .timing import TIMINGS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fastkda.bench",
                                description="Validate, then time, KDA forward implementations.")
    p.add_argument("--suite", choices=SUITES, default=None,
                   help="task suite (default: 'default' on a GPU, 'cpu' on a CPU)")
    p.add_argument("--tasks", default=None, help="comma-separated task names (from any suite); overrides --suite")
    p.add_argument("--impl", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="add an implementation with FlashKDA's fwd signature (repeatable)")
    p.add_argument("--no-peers", action="store_true", help="do not try flash_kda and fla")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per task (default 300 on CUDA, 5 on CPU)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 20 on CUDA, 1 on CPU)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--timing", choices=TIMINGS, default="events",
                   help="events: each call eager between CUDA events, as a caller sees it (default); graph: each "
                        "call replayed from a CUDA graph, the GPU's time alone (CUDA only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the timing inputs (task i uses seed + i)")
    p.add_argument("--out-dir", default="benchmarks/results",
                   help="directory of bench-<device>-<date>.json/.png (default: benchmarks/results)")
    p.add_argument("--json", default=None, metavar="PATH", help="JSON path (the PNG goes next to it)")
    p.add_argument("--no-png", action="store_true", help="do not draw the PNG chart")
    p.add_argument("--list", action="store_true", help="list the tasks of every suite and exit")
    return p


def _list_tasks() -> str:
    lines = []
    for s in SUITES:
        lines.append(f"{s}:")
        for t in suite(s):
            lines.append(f"  {t.name:<26} H={t.H:<3} T={t.T:<6} N={t.N:<4} {t.layout:<6} "
                         f"{bytes_moved(t) / 1e9:.3f} GB  {t.note}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        print(_list_tasks())
        return 0
    device = args.device or default_device()
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        print(f"error: --device {device!r}: {e}", file=sys.stderr)
        return 2
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    if args.timing == "graph" and dev.type != "cuda":
        print(f"error: --timing graph needs a CUDA device, got --device {device}", file=sys.stderr)
        return 2
    try:
        if args.tasks:
            tasks = select_tasks(args.tasks.split(","))
            suite_name = "custom"
        else:
            suite_name = args.suite or ("default" if dev.type == "cuda" else "cpu")
            tasks = suite(suite_name)
        impls = resolve_impls(args.impl, peers=not args.no_peers)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if dev.type == "cpu" and any(t.T > 4096 for t in tasks):
        print("warning: large tasks on the CPU reference path will take a long time", file=sys.stderr)
    if (args.repeats is not None and args.repeats < 1) or (args.warmup is not None and args.warmup < 0):
        print("error: --repeats must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    try:
        quick_check = resolve_quick_check()
    except RuntimeError as e:  # nothing is timed without validating it first
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = run_benchmark(tasks, impls, device=dev, warmup=args.warmup, repeats=args.repeats, seed=args.seed,
                           suite_name=suite_name, quick_check=quick_check, timing=args.timing)

    print(format_table(result))
    json_path, png_path = default_paths(args.out_dir, result.environment)
    if args.json:
        json_path = Path(args.json)
        png_path = json_path.with_suffix(".png")
    print(f"\nwrote {write_json(result, json_path)}")
    if not args.no_png:
        _, msg = write_png(result, png_path)
        print(msg)
    bad = [tr.task.name for tr in result.tasks if tr.results[MAIN].status != "ok"]
    if bad:
        print(f"fastkda failed on: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
