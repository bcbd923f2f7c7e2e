"""Benchmark of the KDA forward pass: ``python -m fastkda.bench``.

    tasks.py    the six standard tasks (KDA.md §4), the extended and CPU suites, inputs, bytes and floors
    timing.py   CUDA-event timing, host timing on a CPU, copy bandwidth
    impls.py    fastkda, flash_kda, fla and module:function implementations behind FlashKDA's fwd signature
    report.py   table, geomeans, JSON, PNG chart
    __main__.py the command line

:func:`run_benchmark` is the whole run: for each task, fresh inputs; for each implementation, first
``fastkda.validation.quick_check`` on that task's shape (two calls, the second compared with the first bit for
bit), and only if it passes, timing. An implementation that fails validation is reported INVALID with its
errors and is never timed on that task.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence, TextIO

import torch

from .impls import Impl, resolve_impls
from .report import BenchResult, ImplResult, TaskResult, environment, label_for, pct
from .tasks import Task, bytes_moved, floor_ms, make_inputs, suite
from .timing import DEFAULT_REPEATS, DEFAULT_ROUNDS, DEFAULT_WARMUP, Bandwidth, copy_bandwidth, timer_for

__all__ = ["run_benchmark", "default_device", "resolve_quick_check", "Task", "Impl", "BenchResult", "suite",
           "resolve_impls"]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_quick_check() -> Callable:
    """``fastkda.validation.quick_check``; the benchmark refuses to time anything without it."""
    try:
        from fastkda.validation import quick_check
    except ImportError as e:
        raise RuntimeError("fastkda.validation.quick_check is not available; the benchmark validates every "
                           f"implementation before timing it, so it cannot run without it ({e})") from e
    return quick_check


def _case_dict(case) -> dict:
    if hasattr(case, "as_dict"):
        return case.as_dict()
    return {k: getattr(case, k, None) for k in ("tier", "name", "shape", "seed", "out_err", "state_err",
                                                 "token_err", "passed", "message")}


def _failure_text(case) -> str:
    message = getattr(case, "message", "")
    parts = [message] if message else []
    if not message:  # the errors themselves, when the message does not already give them
        for k in ("out_err", "state_err", "token_err"):
            v = getattr(case, k, None)
            if isinstance(v, (int, float)):
                parts.append(f"{k}={v:.3g}")
    parts = parts or ["validation failed"]
    if getattr(case, "seed", None) is not None:
        parts.append(f"seed={case.seed}")
    return "; ".join(parts)


_STDERR = object()   # default progress stream: sys.stderr as it is when the run starts


class _Progress:
    def __init__(self, stream: Optional[TextIO]):
        self.stream = stream

    def __call__(self, text: str, end: str = "\n") -> None:
        if self.stream is not None:
            self.stream.write(text + end)
            self.stream.flush()


def run_task(task: Task, impls: Sequence[Impl], *, device, index: int, total: int, seed: int, bandwidth: Bandwidth,
             quick_check: Callable, timer: Callable, warmup: int, repeats: int, rounds: int,
             say: Callable) -> TaskResult:
    """Validate, then time, each implementation on one task (inputs generated from ``seed``)."""
    nbytes = bytes_moved(task)
    tr = TaskResult(task=task, seed=seed, bytes=nbytes, floor_ms=floor_ms(nbytes, bandwidth.bytes_per_s))
    inputs = make_inputs(task, device, seed)
    for impl in impls:
        if not impl.available:
            tr.results[impl.name] = ImplResult(impl.name, "unavailable", error=impl.reason)
            continue
        say(f"[{index}/{total}] {task.name} {impl.name}: validating...", end="")
        try:
            case = quick_check(impl.fwd, seq_lens=list(task.seq_lens), H=task.H, D=task.D, device=str(device),
                               seed=None)
        except Exception as e:  # a crash in validation is a failed validation
            msg = f"validation raised {type(e).__name__}: {e}"
            tr.results[impl.name] = ImplResult(impl.name, "invalid", validation=None, error=msg)
            say(f" INVALID ({msg})")
            continue
        vdict = _case_dict(case)
        if not bool(getattr(case, "passed", False)):
            msg = _failure_text(case)
            tr.results[impl.name] = ImplResult(impl.name, "invalid", validation=vdict, error=msg)
            say(f" INVALID ({msg})")
            continue
        say(" timing...", end="")
        try:
            call = impl.timed_call(inputs)
            with impl.context():
                stats = timer(call, warmup=warmup, repeats=repeats, rounds=rounds)
            del call
        except Exception as e:
            msg = f"{type(e).__name__}: {e}"
            tr.results[impl.name] = ImplResult(impl.name, "error", validation=vdict, error=msg)
            say(f" ERROR ({msg})")
            continue
        tr.results[impl.name] = ImplResult(impl.name, "ok", timing=stats, validation=vdict)
        say(f" {stats.median_ms:.3f} ms ({pct(tr.floor_ms / stats.median_ms)} of floor)")
    del inputs
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return tr


def run_benchmark(
    tasks: Sequence[Task],
    impls: Optional[Sequence[Impl]] = None,
    *,
    device=None,
    warmup: Optional[int] = None,
    repeats: Optional[int] = None,
    rounds: int = DEFAULT_ROUNDS,
    seed: int = 0,
    suite_name: str = "custom",
    quick_check: Optional[Callable] = None,
    timer: Optional[Callable] = None,
    bandwidth: Optional[Bandwidth] = None,
    progress: Optional[TextIO] = _STDERR,
    timing: str = "events",
) -> BenchResult:
    """Run ``tasks`` for ``impls`` (default: fastkda, flash_kda, fla) on ``device``.

    Task ``i`` (from 0) gets inputs from seed ``seed + i``; validation draws fresh inputs of its own (its
    seeds are recorded). ``warmup``/``repeats`` default to 20/300 on CUDA and 1/5 on a CPU. ``quick_check``,
    ``timer`` and ``bandwidth`` default to :func:`resolve_quick_check`, :func:`fastkda.bench.timing.timer_for`
    (``timing``: "events", each call eager, or "graph", each call replayed from a CUDA graph: GPU time only)
    and a fresh :func:`fastkda.bench.timing.copy_bandwidth` measurement. Progress lines go to ``progress``
    (``sys.stderr`` by default, None for silence).
    """
    device = torch.device(device or default_device())
    kind = "cuda" if device.type == "cuda" else "cpu"
    warmup = DEFAULT_WARMUP[kind] if warmup is None else int(warmup)
    repeats = DEFAULT_REPEATS[kind] if repeats is None else int(repeats)
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    impls = list(impls) if impls is not None else resolve_impls()
    quick_check = quick_check or resolve_quick_check()
    timer = timer or timer_for(device, timing)
    say = _Progress(sys.stderr if progress is _STDERR else progress)
    if kind == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    if kind == "cpu":
        rounds = 1
    label = label_for(device)
    if kind == "cpu":
        say(f"note: {label}")
    for impl in impls:
        if not impl.available:
            say(f"{impl.name}: {impl.reason}")
    env = environment(device)
    if bandwidth is None:
        say("measuring copy bandwidth...", end="")
        bandwidth = copy_bandwidth(device)
        say(f" {bandwidth.TBps:.3f} TB/s")
    results = []
    for i, task in enumerate(tasks):
        results.append(run_task(task, impls, device=device, index=i + 1, total=len(tasks), seed=seed + i,
                                bandwidth=bandwidth, quick_check=quick_check, timer=timer, warmup=warmup,
                                repeats=repeats, rounds=rounds, say=say))
    method = ("cuda_graph_replay" if timing == "graph" else "cuda_events") if kind == "cuda" else "host_clock"
    settings = {"warmup": warmup, "repeats": repeats, "rounds": rounds, "seed": seed, "timing_method": method,
                "validation": "fastkda.validation.quick_check on each task's shape before timing, fresh seed"}
    return BenchResult(suite=suite_name, label=label, environment=env, settings=settings, bandwidth=bandwidth,
                       impls=[i.info() for i in impls], tasks=results)
