"""Command line: ``python -m fastkda.validation [--impl NAME|module:function] [--tier LIST|all] ...``.

Prints the run seed, a table of every case (tier, case, shape, seed, errors, limits, PASS/FAIL) and the
reasons for each failure; writes the structured results with ``--json``. Exit status 1 when any case fails
(or the implementation cannot be loaded), 0 when every case passes.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

from .cases import SIZES, TIERS
from .suite import IMPLEMENTATIONS, default_device, default_size, fresh_seed, run_suite


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fastkda.validation",
                                description="Validate a KDA forward implementation against float64 ground truth.")
    p.add_argument("--impl", default="fastkda",
                   help=f"one of {', '.join(IMPLEMENTATIONS)} or module:function with FlashKDA's fwd signature "
                        "(default: fastkda)")
    p.add_argument("--tier", default="all", help=f"comma-separated tiers from {', '.join(TIERS)}, or all (default)")
    p.add_argument("--case", default=None, help="comma-separated case names to keep (default: every case)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available, else cpu)")
    p.add_argument("--size", default=None, choices=SIZES, help="problem sizes (default: full on cuda, small on cpu)")
    p.add_argument("--seed", type=int, default=None, help="run seed to replay (default: a fresh one, printed)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--calls", type=int, default=1,
                   help="calls per case; from 2, each call's outputs must equal the first's bit for bit (default 1)")
    p.add_argument("--quiet", action="store_true", help="print only the table, not each case as it finishes")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    device = args.device or default_device()
    size = args.size or default_size(device)
    seed = fresh_seed() if args.seed is None else args.seed
    print(f"fastkda.validation: impl={args.impl} tiers={args.tier} device={device} size={size} calls={args.calls} "
          f"run seed={seed} (replay with --seed {seed})", flush=True)

    start = time.perf_counter()

    def progress(r):
        if not args.quiet:
            verdict = "PASS" if r.passed else "FAIL"
            secs = "" if r.impl_seconds is None else f" (impl {r.impl_seconds:.2f} s)"
            print(f"  {verdict} {r.tier}/{r.name} seed={r.seed}{secs}  [{time.perf_counter() - start:.1f} s]",
                  flush=True)

    try:
        report = run_suite(args.impl, tiers=args.tier, device=device, size=size, seed=seed,
                           cases=None if args.case is None else [c.strip() for c in args.case.split(",")],
                           progress=progress, calls=args.calls)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print()
    print(report.table())
    n_fail = len(report.failures)
    print(f"\n{len(report.results) - n_fail}/{len(report.results)} cases passed in {report.seconds:.1f} s "
          f"(run seed {seed}): {'PASS' if report.passed else 'FAIL'}")
    if args.json:
        with open(args.json, "w") as f:
            f.write(report.to_json())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
