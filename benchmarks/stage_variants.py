"""Time variants of the two kernels side by side, in one device call: A/B tests and ablations.

    python benchmarks/stage_variants.py VARIANTS.py [--tasks a,b] [--json PATH]
    ncu ... python benchmarks/stage_variants.py VARIANTS.py --tasks H64_fixed_8192 --once    # for a profiler

VARIANTS.py is a small Python file naming each variant by text substitutions in a kernel's source:

    STAGE1 = {"base": [], "no_doubling": [("for lvl in tl.static_range(1, LOG2_BT):",
                                           "for lvl in tl.static_range(1, 1):")]}
    STAGE2 = {"base": [], "bv32": []}
    LAUNCH = {"bv32": {"VALUE_BLOCK": 32}}          # launcher settings (fastkda.kernels constants) per variant

Each variant is the library's chunk_prepare.py / chunk_recurrence.py with its substitutions applied (every
`old` must occur, else the run stops before timing anything), compiled as its own module and launched by
the library's launcher -- with the Gluon kernels of that stage switched off, since the variants are of the
Triton sources (LAUNCH = {"name": {"STAGE2_GLUON": True}} times the Gluon stage 2 under a variant's name).
Stage 1 is timed on its own, stage 2 on the library's stage-1 tensors, both with CUDA events (median of 50
after 5 warm-up calls). Each stage-1 variant's tensors are compared with the first variant's: an ablation
that changes results says so (max |difference|), an optimisation must not.
Diagnosis, not a record: numbers for the record come from `python -m fastkda.bench` (validation first).
`--once` launches instead of timing: each stage-1 variant twice (result check, then once more), each stage-2
variant once, in the order of the file -- what a profiler run (ncu, with benchmarks/ncu_lines.py) needs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile

import torch

from fastkda import kernels
from fastkda.bench.tasks import default_tasks, make_inputs, select_tasks
from fastkda.kernels import chunk_prepare, chunk_recurrence

STAGE1_FIELDS = ("a1", "tb", "aqk", "kt", "gl")


def variant_module(kernel_module, name: str, substitutions, workdir: str):
    """The kernel module's source with ``substitutions`` [(old, new), ...] applied, loaded as a new module."""
    with open(kernel_module.__file__) as f:
        src = f.read()
    for old, new in substitutions:
        if old not in src:
            raise ValueError(f"variant {name!r}: text not found in {os.path.basename(kernel_module.__file__)}: "
                             f"{old[:80]!r}")
        src = src.replace(old, new)
    src = src.replace("from .", "from fastkda.kernels.")          # relative imports of the package
    mod_name = f"variant_{os.path.basename(kernel_module.__file__)[:-3]}_{name}"
    path = os.path.join(workdir, mod_name + ".py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_variants(path: str):
    spec = importlib.util.spec_from_file_location("stage_variants_spec", path)
    spec_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(spec_mod)
    return getattr(spec_mod, "STAGE1", {}), getattr(spec_mod, "STAGE2", {}), getattr(spec_mod, "LAUNCH", {})


def _median_ms(fn, warmup=5, repeats=50):
    for _ in range(warmup):
        fn()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in pairs)[repeats // 2]


def _launch_once(fn):
    fn()
    torch.cuda.synchronize()
    return float("nan")


class _Launch:
    """Set fastkda.kernels constants and kernel objects for one variant, restore them after."""

    def __init__(self, **values):
        self.values, self.saved = values, {}

    def __enter__(self):
        for key, value in self.values.items():
            self.saved[key] = getattr(kernels, key)
            setattr(kernels, key, value)

    def __exit__(self, *exc):
        for key, value in self.saved.items():
            setattr(kernels, key, value)


def run(stage1: dict, stage2: dict, launch: dict, tasks, device, timer=_median_ms, log=print) -> dict:
    """Time every variant on every task; returns {task: {"stage1 NAME": {...}, "stage2 NAME": {...}}}."""
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        s1 = {n: variant_module(chunk_prepare, n, subs, workdir)._chunk_prepare_kernel for n, subs in stage1.items()}
        s2 = {n: variant_module(chunk_recurrence, n, subs, workdir)._chunk_recurrence_kernel
              for n, subs in stage2.items()}
        for i, task in enumerate(tasks):
            x = make_inputs(task, device, seed=i)
            kw = dict(scale=task.scale, A_log=x.A_log, dt_bias=x.dt_bias, lower_bound=task.lower_bound,
                      cu_seqlens=x.cu_seqlens, use_qk_l2norm=True, use_gate=True, use_beta_sigmoid=True)
            row = results.setdefault(task.name, {})
            first = None
            for name, kernel in s1.items():
                with _Launch(_chunk_prepare_kernel=kernel, **{"STAGE1_GLUON": False, **launch.get(name, {})}):
                    st = kernels.prepare_chunks(x.q, x.k, x.v, x.g, x.beta, **kw)
                    if first is None:
                        first = st
                    diff = max(float((getattr(st, f).float() - getattr(first, f).float()).abs().nan_to_num(0).max())
                               for f in STAGE1_FIELDS)
                    ms = timer(lambda: kernels.prepare_chunks(x.q, x.k, x.v, x.g, x.beta, **kw))
                row[f"stage1 {name}"] = {"ms": ms, "max_diff_vs_first": diff}
                log(f"{task.name:<20} stage 1 {name:<16} {ms:8.3f} ms   max |diff| vs first {diff:.2e}")
            st = kernels.prepare_chunks(x.q, x.k, x.v, x.g, x.beta, **kw)
            out = torch.empty_like(x.v)
            fs = torch.empty_like(x.initial_state)
            for name, kernel in s2.items():
                with _Launch(_chunk_recurrence_kernel=kernel, **{"STAGE2_GLUON": False, **launch.get(name, {})}):
                    ms = timer(lambda: kernels.run_recurrence(
                        st, x.v, out=out, initial_state=x.initial_state, final_state=fs, cu_seqlens=x.cu_seqlens,
                        state_v_first=True))
                row[f"stage2 {name}"] = {"ms": ms}
                log(f"{task.name:<20} stage 2 {name:<16} {ms:8.3f} ms")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", help="a Python file defining STAGE1, STAGE2 (and LAUNCH)")
    ap.add_argument("--tasks", default=None, help="comma-separated task names (default: the six standard)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--once", action="store_true", help="launch each variant instead of timing it (profilers)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("stage_variants: needs a CUDA device")
    stage1, stage2, launch = load_variants(args.variants)
    tasks = select_tasks(args.tasks.split(",")) if args.tasks else default_tasks()
    timer = _launch_once if args.once else _median_ms
    results = run(stage1, stage2, launch, tasks, torch.device("cuda"), timer=timer,
                  log=lambda line: print(line, flush=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "variants_file": args.variants, "results": results},
                      f, indent=1)


if __name__ == "__main__":
    main()
