"""Benchmark tasks: shapes, inputs, and the bytes each task must move.

A task is one KDA forward problem: ``H`` heads of dimension ``D`` over sequences of the given lengths,
bf16 inputs, fp32 initial and final state (FlashKDA's v-first layout ``[N, H, V, K]``), ``lower_bound``
−5 and ``scale`` = D^-1/2. A ``fixed`` task is one sequence laid out as ``[1, T, H, D]`` with no
``cu_seqlens``; a ``varlen`` task packs its sequences along T and passes ``cu_seqlens``.

Inputs follow the peers' protocol (``peers_h200.json``, "protocol"): q, k, v, g ~ N(0, 1) in bf16; beta
logits ~ N(0, 1) in bf16; A_log ~ U(0, 1) and dt_bias ~ U(0, 1) in fp32; initial_state ~ 0.1·N(0, 1) in
fp32. ``cu_seqlens`` is int32 for implementations with FlashKDA's ``fwd`` signature and int64 for fla,
which is what each peer was given when the recorded times were taken.

The memory floor of a task is the bytes it must move -- read q, k, v, g and beta once, write out once,
read and write the fp32 state -- divided by the device's copy bandwidth (read + write bytes counted).
A_log, dt_bias and cu_seqlens (a few kB) are left out, as in the recorded peer floors.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ..validation.cases import cu_seqlens_from

HEAD_DIM = 128
LOWER_BOUND = -5.0
MIXED_SEQ_LENS: Tuple[int, ...] = (1300, 547, 2048, 963, 271, 3063)
STANDARD_TOKENS = 8192

INPUT_DTYPE = torch.bfloat16
STATE_DTYPE = torch.float32

SUITES = ("default", "extended", "cpu")
CPU_LABEL = "CPU reference path, not a GPU benchmark"


@dataclass(frozen=True)
class Task:
    """One benchmark problem. ``seq_lens`` lists the packed sequences; ``fixed`` means one unpacked sequence."""

    name: str
    H: int
    seq_lens: Tuple[int, ...]
    fixed: bool = False
    D: int = HEAD_DIM
    lower_bound: float = LOWER_BOUND
    note: str = ""

    def __post_init__(self):
        if not self.seq_lens or any(n < 0 for n in self.seq_lens):
            raise ValueError(f"task {self.name}: seq_lens must be a non-empty list of lengths >= 0")
        if self.fixed and len(self.seq_lens) != 1:
            raise ValueError(f"task {self.name}: a fixed task has exactly one sequence")

    @property
    def T(self) -> int:
        """Total tokens."""
        return sum(self.seq_lens)

    @property
    def N(self) -> int:
        """Number of sequences (rows of the state)."""
        return len(self.seq_lens)

    @property
    def scale(self) -> float:
        return self.D ** -0.5

    @property
    def layout(self) -> str:
        return "fixed" if self.fixed else "varlen"

    def as_dict(self) -> dict:
        return {
            "name": self.name, "H": self.H, "D": self.D, "T": self.T, "N": self.N,
            "seq_lens": list(self.seq_lens), "layout": self.layout, "lower_bound": self.lower_bound,
            "scale": self.scale, "input_dtype": "bfloat16", "state_dtype": "float32",
            "cu_seqlens_dtype": None if self.fixed else {"fwd": "int32", "fla": "int64"},
            "note": self.note,
        }


def _standard(H: int) -> List[Task]:
    return [
        Task(f"H{H}_fixed_8192", H, (STANDARD_TOKENS,), fixed=True, note="one sequence, no cu_seqlens"),
        Task(f"H{H}_varlen_mixed", H, MIXED_SEQ_LENS, note="mixed lengths, packed"),
        Task(f"H{H}_varlen_1024x8", H, (1024,) * 8, note="8 x 1024, packed"),
    ]


def default_tasks() -> List[Task]:
    """The six standard tasks of KDA.md §4 (names as in ``peers_h200.json``)."""
    return _standard(96) + _standard(64)


def extended_tasks() -> List[Task]:
    """Beyond the six: few heads with long sequences, many heads with short ones, many short sequences,
    one long sequence among many short ones. A pruned grid of H in {8, 16, 32, 64, 96} and T in
    {1K, 8K, 32K, 64K}; names that match ``peers_h200.json`` "extended_tasks_ms" get recorded peers."""
    def fixed(H, T):
        return Task(f"H{H}_T{T}", H, (T,), fixed=True, note="one sequence, no cu_seqlens")

    return [
        fixed(8, 1024), fixed(8, 8192), fixed(8, 65536),
        fixed(16, 32768),
        fixed(32, 8192),
        fixed(64, 65536),
        fixed(96, 1024), fixed(96, 65536),
        Task("H32_256x64", 32, (64,) * 256, note="256 short sequences, packed"),
        Task("H32_8192_among_64x64", 32, (64,) * 32 + (8192,) + (64,) * 32,
             note="one long sequence between 64 short ones, packed"),
    ]


def cpu_tasks() -> List[Task]:
    """Small shapes for the CPU reference path (so the CLI runs in CI); not a GPU benchmark."""
    return [
        Task("H4_fixed_512", 4, (512,), fixed=True, note=CPU_LABEL),
        Task("H4_varlen_mixed_512", 4, (211, 44, 257), note=CPU_LABEL),
        Task("H4_varlen_128x4", 4, (128,) * 4, note=CPU_LABEL),
    ]


def suite(name: str) -> List[Task]:
    """Tasks of a named suite: ``default``, ``extended`` or ``cpu``."""
    if name == "default":
        return default_tasks()
    if name == "extended":
        return extended_tasks()
    if name == "cpu":
        return cpu_tasks()
    raise ValueError(f"unknown suite {name!r}; expected one of {SUITES}")


def all_tasks() -> Dict[str, Task]:
    """Every named task of every suite."""
    out: Dict[str, Task] = {}
    for s in SUITES:
        for t in suite(s):
            out[t.name] = t
    return out


def select_tasks(names: Iterable[str]) -> List[Task]:
    """Tasks by name (from any suite), in the order given; unknown names raise ``ValueError``."""
    known = all_tasks()
    chosen, unknown = [], []
    for n in names:
        n = n.strip()
        if not n:
            continue
        if n in known:
            chosen.append(known[n])
        else:
            unknown.append(n)
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; known tasks: {', '.join(known)}")
    if not chosen:
        raise ValueError("no task selected")
    return chosen


# --------------------------------------------------------------------------------------------------------
# Inputs


@dataclass
class TaskInputs:
    """The tensors of one task, on one device. ``cu_seqlens`` (int32) and ``cu_seqlens_long`` (int64) are
    None for a fixed task."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    initial_state: torch.Tensor
    cu_seqlens: Optional[torch.Tensor]
    cu_seqlens_long: Optional[torch.Tensor]
    scale: float
    lower_bound: float
    seed: int


def make_inputs(task: Task, device, seed: int) -> TaskInputs:
    """Fresh inputs for ``task`` on ``device`` from ``seed`` (the peers' protocol distributions)."""
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    T, H, D, N = task.T, task.H, task.D, task.N

    def normal(*shape, dtype):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    q, k, v, g = (normal(1, T, H, D, dtype=INPUT_DTYPE) for _ in range(4))
    beta = normal(1, T, H, dtype=INPUT_DTYPE)
    A_log = torch.rand(H, generator=gen, device=device, dtype=torch.float32)
    dt_bias = torch.rand(H, D, generator=gen, device=device, dtype=torch.float32)
    initial_state = 0.1 * normal(N, H, D, D, dtype=STATE_DTYPE)
    cu32 = cu64 = None
    if not task.fixed:
        cu32 = cu_seqlens_from(task.seq_lens, torch.int32).to(device)
        cu64 = cu_seqlens_from(task.seq_lens, torch.int64).to(device)
    return TaskInputs(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state,
                      cu_seqlens=cu32, cu_seqlens_long=cu64, scale=task.scale, lower_bound=task.lower_bound,
                      seed=int(seed))


# --------------------------------------------------------------------------------------------------------
# Bytes and floors


def bytes_breakdown(task: Task) -> Dict[str, int]:
    """Bytes a forward pass of ``task`` must move, by tensor."""
    T, H, D, N = task.T, task.H, task.D, task.N
    ib = torch.empty((), dtype=INPUT_DTYPE).element_size()
    sb = torch.empty((), dtype=STATE_DTYPE).element_size()
    return {
        "read_qkvg": 4 * T * H * D * ib,
        "read_beta": T * H * ib,
        "write_out": T * H * D * ib,
        "read_write_state": 2 * N * H * D * D * sb,
    }


def bytes_moved(task: Task) -> int:
    """Total bytes a forward pass of ``task`` must move (see :func:`bytes_breakdown`)."""
    return sum(bytes_breakdown(task).values())


def floor_ms(nbytes: int, bandwidth_bytes_per_s: float) -> float:
    """Time in ms to move ``nbytes`` at the given copy bandwidth."""
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth_bytes_per_s}")
    return nbytes / bandwidth_bytes_per_s * 1e3


def geomean(values: Iterable[float]) -> Optional[float]:
    """Geometric mean of positive values; None for an empty input."""
    vals = [float(x) for x in values]
    if not vals:
        return None
    if any(not (x > 0) or math.isinf(x) for x in vals):
        raise ValueError(f"geomean needs finite positive values, got {vals}")
    return math.exp(sum(math.log(x) for x in vals) / len(vals))


# --------------------------------------------------------------------------------------------------------
# Recorded peers


@lru_cache(maxsize=1)
def load_peers() -> dict:
    """The peers' recorded H200 figures (``fastkda/bench/peers_h200.json``)."""
    text = resources.files("fastkda.bench").joinpath("peers_h200.json").read_text(encoding="utf-8")
    return json.loads(text)


def recorded_ms(task_name: str, peer: str = "flashkda") -> Optional[float]:
    """A peer's recorded H200 time for a task (``peer`` is ``flashkda`` or ``fla``), or None."""
    peers = load_peers()
    for table in ("tasks_ms", "extended_tasks_ms"):
        entry = peers.get(table, {}).get(task_name)
        if isinstance(entry, dict) and peer in entry:
            return float(entry[peer])
    return None
