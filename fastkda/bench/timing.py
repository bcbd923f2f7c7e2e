"""Timing: CUDA events on a GPU, the host clock on a CPU; and the device's copy bandwidth.

On CUDA each call is bracketed by its own pair of events, calls run back to back (no synchronisation
between them inside a round), the host synchronises at the end of each round, and the median over all
timed calls is reported -- the peers' protocol (20 warm-up calls, 300 timed calls as 3 x 100). The host's
time to issue the calls is measured beside them (``host_ms``): where it reaches the measured time, the calls
waited for the host, and the GPU time of one call is lower than reported.

With ``--timing graph`` (:func:`time_cuda_graph`) one call is captured in a CUDA graph after the warm-up and
the graph is replayed instead, each replay between its own pair of events: the host then issues one graph
launch per call, so the times are the GPU's alone (no argument checks, allocation or kernel launches in
Python). That tells GPU time from host time on a slow host; the default, eager timing is what a caller of
the function sees, and what the peers' recorded times are.

The copy bandwidth is that of a large device-to-device ``copy_``, counting the bytes read and the bytes
written, median of several copies. It is what the memory floor of a task is divided by.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, List, Optional

import torch

DEFAULT_WARMUP = {"cuda": 20, "cpu": 1}
DEFAULT_REPEATS = {"cuda": 300, "cpu": 5}
DEFAULT_ROUNDS = 3
COPY_BYTES = {"cuda": 2 << 30, "cpu": 64 << 20}   # size of the copied buffer (2 GiB on a GPU)
COPY_REPEATS = 10


@dataclass
class TimingStats:
    """Summary of per-call times, in milliseconds."""

    median_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    p10_ms: float
    p90_ms: float
    n: int
    warmup: int
    rounds: int
    method: str   # "cuda_events" or "host_clock"
    # CUDA: host time per call to issue it (a round's loop of calls and their events, over the calls; median
    # of the rounds). Near median_ms, the calls were host-bound.
    host_ms: Optional[float] = None

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(times_ms: List[float], *, warmup: int, rounds: int, method: str,
              host_ms: Optional[float] = None) -> TimingStats:
    """Median, mean, extremes and 10th/90th percentiles of per-call times."""
    if not times_ms:
        raise ValueError("no timed calls")
    xs = sorted(float(t) for t in times_ms)

    def pct(p):  # nearest-rank percentile
        i = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
        return xs[i]

    return TimingStats(median_ms=statistics.median(xs), mean_ms=statistics.fmean(xs), min_ms=xs[0],
                       max_ms=xs[-1], p10_ms=pct(10), p90_ms=pct(90), n=len(xs), warmup=warmup,
                       rounds=rounds, method=method, host_ms=host_ms)


def _round_sizes(repeats: int, rounds: int) -> List[int]:
    rounds = max(1, min(rounds, repeats))
    base, extra = divmod(repeats, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


def time_cuda(fn: Callable[[], object], *, warmup: int = DEFAULT_WARMUP["cuda"],
              repeats: int = DEFAULT_REPEATS["cuda"], rounds: int = DEFAULT_ROUNDS) -> TimingStats:
    """Median time of ``fn()`` on the current CUDA stream, from a pair of CUDA events around each call."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times: List[float] = []
    host: List[float] = []
    sizes = _round_sizes(repeats, rounds)
    for n in sizes:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        t0 = time.perf_counter()
        for i in range(n):
            starts[i].record()
            fn()
            ends[i].record()
        host.append((time.perf_counter() - t0) * 1e3 / n)
        torch.cuda.synchronize()
        times.extend(s.elapsed_time(e) for s, e in zip(starts, ends))
    return summarize(times, warmup=warmup, rounds=len(sizes), method="cuda_events",
                     host_ms=statistics.median(host))


def capture_graph(fn: Callable[[], object]) -> "torch.cuda.CUDAGraph":
    """One call of ``fn`` captured in a CUDA graph, after one call on a side stream, as PyTorch asks before a
    capture (lazy initialisations happen there, outside the graph)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_cuda_graph(fn: Callable[[], object], *, warmup: int = DEFAULT_WARMUP["cuda"],
                    repeats: int = DEFAULT_REPEATS["cuda"], rounds: int = DEFAULT_ROUNDS) -> TimingStats:
    """Median GPU time of ``fn()`` replayed from a CUDA graph (one call captured after ``warmup`` eager calls),
    each replay between its own pair of events, replays back to back within a round. ``fn`` must be capturable:
    no host synchronisation, device memory from PyTorch's allocator only. The graph replays the captured call's
    work on the captured tensors, host-side effects of ``fn`` happen once, at capture."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    graph = capture_graph(fn)
    graph.replay()
    torch.cuda.synchronize()
    stats = time_cuda(graph.replay, warmup=0, repeats=repeats, rounds=rounds)
    del graph
    stats.warmup, stats.method = warmup, "cuda_graph_replay"
    return stats


def time_host(fn: Callable[[], object], *, warmup: int = DEFAULT_WARMUP["cpu"],
              repeats: int = DEFAULT_REPEATS["cpu"], rounds: int = 1) -> TimingStats:
    """Median wall time of ``fn()`` from the host clock (for the CPU reference path)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return summarize(times, warmup=warmup, rounds=1, method="host_clock")


TIMINGS = ("events", "graph")     # the benchmark's --timing choices


def timer_for(device, timing: str = "events") -> Callable[..., TimingStats]:
    """:func:`time_cuda` (``timing="events"``) or :func:`time_cuda_graph` (``"graph"``) for a CUDA device,
    :func:`time_host` for a CPU (events only: a CPU has no graphs to replay)."""
    if timing not in TIMINGS:
        raise ValueError(f"timing: expected one of {TIMINGS}, got {timing!r}")
    if torch.device(device).type != "cuda":
        if timing != "events":
            raise ValueError(f"timing: {timing!r} needs a CUDA device, got {torch.device(device)}")
        return time_host
    return time_cuda_graph if timing == "graph" else time_cuda


@dataclass
class Bandwidth:
    """Measured copy bandwidth: ``bytes_per_s`` counts the bytes read plus the bytes written."""

    bytes_per_s: float
    buffer_bytes: int      # size of the copied buffer
    bytes_counted: int     # 2 * buffer_bytes per copy (read + write)
    median_ms: float
    repeats: int
    method: str

    @property
    def TBps(self) -> float:
        return self.bytes_per_s / 1e12

    def as_dict(self) -> dict:
        d = asdict(self)
        d["TBps"] = self.TBps
        return d


def _time_copy(n: int, device: torch.device, timer, warmup: int, repeats: int) -> TimingStats:
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return timer(lambda: dst.copy_(src), warmup=warmup, repeats=repeats, rounds=1)


def copy_bandwidth(device, nbytes: Optional[int] = None, repeats: int = COPY_REPEATS,
                   warmup: int = 2) -> Bandwidth:
    """Copy bandwidth of ``device``: ``dst.copy_(src)`` on a large buffer (2 GiB on a GPU), read + write
    bytes counted, median of ``repeats`` copies. On a GPU the buffer shrinks to a quarter of the free memory
    when 2 GiB do not fit twice."""
    device = torch.device(device)
    kind = "cuda" if device.type == "cuda" else "cpu"
    if nbytes is None:
        nbytes = COPY_BYTES[kind]
        if kind == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            nbytes = min(nbytes, free // 4)
    n = max(1, int(nbytes) // 4)
    stats = _time_copy(n, device, time_cuda if kind == "cuda" else time_host, warmup, repeats)
    buffer_bytes = n * 4
    counted = 2 * buffer_bytes
    if kind == "cuda":  # the buffers are gone: hand their memory back before the tasks allocate theirs
        torch.cuda.empty_cache()
    return Bandwidth(bytes_per_s=counted / (stats.median_ms * 1e-3), buffer_bytes=buffer_bytes,
                     bytes_counted=counted, median_ms=stats.median_ms, repeats=repeats,
                     method=f"{kind} copy_, median of {repeats}")
