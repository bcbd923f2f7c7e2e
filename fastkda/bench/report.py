"""Results of a benchmark run: the data model, the environment record, the table, the JSON file and the chart.

Speedup of fastkda over a peer on a task = peer time / fastkda time; fraction of the memory floor =
floor time / measured time (1.0 would be a kernel moving its bytes at copy bandwidth). Geomeans run over
tasks where every figure involved was measured; a geomean over fewer tasks than the run had says so.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from .tasks import CPU_LABEL, Task, bytes_breakdown, geomean, load_peers, recorded_ms
from .timing import Bandwidth, TimingStats

SCHEMA = "fastkda-bench/1"
GPU_LABEL = "GPU benchmark"
MAIN = "fastkda"
RECORDED_PEER = "flash_kda"          # the implementation whose recorded times stand in when it is not installed
RECORDED_KEY = "flashkda"            # its key in peers_h200.json
HOST_BOUND = 0.9                     # host time per call / measured time from which a timing is host-bound
STATUSES = ("ok", "invalid", "error", "unavailable")


@dataclass
class ImplResult:
    """One implementation on one task. ``status``: ok (validated and timed), invalid (failed validation,
    not timed), error (raised while timing), unavailable (not installed)."""

    impl: str
    status: str
    timing: Optional[TimingStats] = None
    validation: Optional[dict] = None
    error: str = ""

    @property
    def ms(self) -> Optional[float]:
        return self.timing.median_ms if (self.status == "ok" and self.timing is not None) else None


@dataclass
class TaskResult:
    task: Task
    seed: int
    bytes: int
    floor_ms: float
    results: Dict[str, ImplResult] = field(default_factory=dict)

    def ms(self, impl: str) -> Optional[float]:
        r = self.results.get(impl)
        return r.ms if r is not None else None


@dataclass
class BenchResult:
    suite: str
    label: str
    environment: dict
    settings: dict
    bandwidth: Bandwidth
    impls: List[dict]                 # Impl.info() of every implementation, available or not
    tasks: List[TaskResult]

    @property
    def impl_names(self) -> List[str]:
        return [i["name"] for i in self.impls]

    @property
    def measured_impls(self) -> List[str]:
        """Implementations that were available in this run, in order."""
        return [i["name"] for i in self.impls if i["available"]]

    @property
    def peers(self) -> List[str]:
        return [n for n in self.measured_impls if n != MAIN]

    @property
    def show_recorded(self) -> bool:
        """Recorded FlashKDA times stand in when flash_kda was not measured in this run."""
        return RECORDED_PEER not in self.measured_impls

    @property
    def recorded_comparable(self) -> bool:
        return is_h200(self.environment.get("device_name", ""))


# --------------------------------------------------------------------------------------------------------
# Environment


def is_h200(device_name: str) -> bool:
    return "H200" in device_name.upper()


def _run(cmd: List[str], cwd: Optional[str] = None) -> Optional[str]:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def git_commit() -> str:
    """The commit the code comes from: ``FASTKDA_GIT_COMMIT`` when set (a copied working tree can carry a stale
    git folder: the caller who copied it knows better), else ``git rev-parse HEAD`` of the checkout fastkda
    is imported from, else "unknown"."""
    named = os.environ.get("FASTKDA_GIT_COMMIT")
    if named:
        return named
    here = str(Path(__file__).resolve().parent)
    return _run(["git", "rev-parse", "HEAD"], cwd=here) or "unknown"


def git_dirty() -> Optional[bool]:
    """Whether tracked files differ from that commit (None without git, or when the commit was named by
    ``FASTKDA_GIT_COMMIT``: the local git folder then says nothing about it)."""
    if os.environ.get("FASTKDA_GIT_COMMIT"):
        return None
    here = str(Path(__file__).resolve().parent)
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


def _driver_version() -> str:
    if shutil.which("nvidia-smi"):
        v = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        if v:
            return v.splitlines()[0].strip()
    try:
        v = torch._C._cuda_getDriverVersion()  # CUDA driver API version, e.g. 12080
        return f"CUDA driver API {v // 1000}.{(v % 1000) // 10} (nvidia-smi not found)"
    except Exception:
        return "unknown"


def environment(device) -> dict:
    """Device, driver, library versions, git commit and date of a run."""
    device = torch.device(device)
    try:
        import triton
        triton_version = triton.__version__
    except Exception:
        triton_version = "not installed"
    import fastkda
    env = {
        "device": str(device),
        "device_type": device.type,
        "device_name": "",
        "sm_count": None,
        "driver_version": None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton_version,
        "fastkda": fastkda.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["device_name"] = props.name
        env["sm_count"] = props.multi_processor_count
        env["memory_bytes"] = props.total_memory
        env["driver_version"] = _driver_version()
    else:
        env["device_name"] = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return env


# --------------------------------------------------------------------------------------------------------
# Figures


def speedups(tr: TaskResult, peers: List[str]) -> Dict[str, Optional[float]]:
    """peer time / fastkda time on one task (None where either is missing)."""
    mine = tr.ms(MAIN)
    out = {}
    for p in peers:
        theirs = tr.ms(p)
        out[p] = theirs / mine if (mine and theirs) else None
    return out


def summary(result: BenchResult) -> dict:
    """Geomeans over the run: per implementation (time, fraction of floor), speedups, recorded speedups."""
    n = len(result.tasks)
    floor_gm = geomean(tr.floor_ms for tr in result.tasks)
    impls = {}
    for name in result.measured_impls:
        done = [tr for tr in result.tasks if tr.ms(name)]
        impls[name] = {
            "time_ms": geomean(tr.ms(name) for tr in done),
            "fraction_of_floor": geomean(tr.floor_ms / tr.ms(name) for tr in done),
            "n_tasks": len(done),
            "complete": len(done) == n,
        }
    sp = {}
    for p in result.peers:
        vals = [s for s in (speedups(tr, [p])[p] for tr in result.tasks) if s]
        sp[p] = {"value": geomean(vals), "n_tasks": len(vals), "complete": len(vals) == n}
    rec = {}
    if result.show_recorded and result.recorded_comparable:
        vals = [recorded_ms(tr.task.name, RECORDED_KEY) / tr.ms(MAIN) for tr in result.tasks
                if tr.ms(MAIN) and recorded_ms(tr.task.name, RECORDED_KEY)]
        rec[RECORDED_KEY] = {"value": geomean(vals), "n_tasks": len(vals), "complete": len(vals) == n}
    return {"floor_ms": floor_gm, "impls": impls, "speedup": sp, "speedup_vs_recorded": rec}


def recorded_note(result: BenchResult) -> str:
    device = result.environment.get("device_name", "this device")
    if not result.show_recorded:
        return "flash_kda measured in this run; recorded figures not used"
    if result.recorded_comparable:
        return ("FlashKDA times recorded on an H200 (peers_h200.json), not measured in this run: "
                "flash_kda is not installed")
    return (f"the recorded FlashKDA figures (peers_h200.json) are for an H200 and not comparable to {device}; "
            "no speedup against them is given")


# --------------------------------------------------------------------------------------------------------
# JSON


def _impl_dict(r: ImplResult, floor: float) -> dict:
    return {
        "status": r.status,
        "time_ms": r.ms,
        "fraction_of_floor": floor / r.ms if r.ms else None,
        "timing": r.timing.as_dict() if r.timing is not None else None,
        "validation": r.validation,
        "error": r.error,
    }


def to_dict(result: BenchResult) -> dict:
    """Every figure of the run, JSON-serialisable."""
    peers = result.peers
    rec_speed = result.show_recorded and result.recorded_comparable
    tasks = []
    for tr in result.tasks:
        d = tr.task.as_dict()
        rec = {k: recorded_ms(tr.task.name, k) for k in ("flashkda", "fla")}
        mine = tr.ms(MAIN)
        d.update({
            "seed": tr.seed,
            "bytes": tr.bytes,
            "bytes_breakdown": bytes_breakdown(tr.task),
            "floor_ms": tr.floor_ms,
            "results": {name: _impl_dict(r, tr.floor_ms) for name, r in tr.results.items()},
            "speedup": speedups(tr, peers),
            "recorded_h200_ms": rec,
            "speedup_vs_recorded": ({RECORDED_KEY: rec[RECORDED_KEY] / mine}
                                    if (rec_speed and mine and rec[RECORDED_KEY]) else {}),
        })
        tasks.append(d)
    peers_json = load_peers()
    return {
        "schema": SCHEMA,
        "label": result.label,
        "suite": result.suite,
        "environment": result.environment,
        "settings": result.settings,
        "copy_bandwidth": result.bandwidth.as_dict(),
        "implementations": result.impls,
        "tasks": tasks,
        "geomean": summary(result),
        "recorded": {
            "source": "fastkda/bench/peers_h200.json",
            "what": peers_json.get("what", ""),
            "date": peers_json.get("date", ""),
            "used": result.show_recorded,
            "comparable": result.recorded_comparable,
            "note": recorded_note(result),
        },
    }


def write_json(result: BenchResult, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_dict(result), indent=1, default=str) + "\n", encoding="utf-8")
    return path


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s or "device"


def default_paths(out_dir, environment: dict) -> Tuple[Path, Path]:
    """``<out_dir>/bench-<device>-<date>.json`` and the matching ``.png``."""
    name = environment.get("device_name", "") if environment.get("device_type") == "cuda" else "cpu"
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(out_dir) / f"bench-{_slug(name)}-{stamp}"
    return base.with_suffix(".json"), base.with_suffix(".png")


# --------------------------------------------------------------------------------------------------------
# Table


def pct(x: float) -> str:
    """A fraction as a percentage with three significant digits (53.4%, 0.0534%)."""
    return f"{100 * x:.3g}%"


def _cell(r: Optional[ImplResult], floor: float) -> str:
    if r is None:
        return "-"
    if r.status == "ok" and r.ms:
        return f"{r.ms:.3f} ({pct(floor / r.ms)})"
    return {"invalid": "INVALID", "error": "ERROR", "unavailable": "n/a"}.get(r.status, r.status)


def _num(v: Optional[float], fmt: str, n: Optional[int] = None, total: Optional[int] = None) -> str:
    """``v`` in ``fmt``, with "(n/total)" when only n of total tasks contributed; "-" for None."""
    if v is None:
        return "-"
    s = fmt.format(v)
    if n is not None and total is not None and n != total:
        s += f" ({n}/{total})"
    return s


def _x(v: Optional[float], n: Optional[int] = None, total: Optional[int] = None) -> str:
    return _num(v, "{:.2f}x", n, total)


def _ms(v: Optional[float], n: Optional[int] = None, total: Optional[int] = None) -> str:
    return _num(v, "{:.3f}", n, total)


def _gm_cell(i: dict, total: int) -> str:
    if i["time_ms"] is None:
        return "-"
    s = f"{i['time_ms']:.3f} ({pct(i['fraction_of_floor'])})"
    return s if i["n_tasks"] == total else s + f" ({i['n_tasks']}/{total})"


def format_table(result: BenchResult) -> str:
    """A markdown table: per task the time of each implementation (ms, and fraction of the memory floor in
    brackets), fastkda's speedup over each peer, and a geomean row; then notes and validation failures."""
    impls, peers = result.measured_impls, result.peers
    rec = result.show_recorded and result.recorded_comparable
    head = ["task", "floor ms"] + [f"{n} ms (floor %)" for n in impls] + [f"speedup vs {p}" for p in peers]
    if rec:
        head += ["FlashKDA ms (recorded, not measured)", "speedup vs FlashKDA (recorded, not measured)"]
    rows = []
    for tr in result.tasks:
        row = [tr.task.name, f"{tr.floor_ms:.3f}"] + [_cell(tr.results.get(n), tr.floor_ms) for n in impls]
        sp = speedups(tr, peers)
        row += [_x(sp[p]) for p in peers]
        if rec:
            r = recorded_ms(tr.task.name, RECORDED_KEY)
            mine = tr.ms(MAIN)
            row += [_ms(r), _x(r / mine if (r and mine) else None)]
        rows.append(row)
    s = summary(result)
    total = len(result.tasks)
    gm = ["geomean", _ms(s["floor_ms"])]
    gm += [_gm_cell(s["impls"][n], total) for n in impls]
    gm += [_x(s["speedup"][p]["value"], s["speedup"][p]["n_tasks"], total) for p in peers]
    if rec:
        rec_gm = geomean(x for x in (recorded_ms(tr.task.name, RECORDED_KEY) for tr in result.tasks) if x)
        r = s["speedup_vs_recorded"].get(RECORDED_KEY, {})
        gm += [_ms(rec_gm), _x(r.get("value"), r.get("n_tasks"), total)]
    rows.append(gm)

    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]

    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    env = result.environment
    notes = [
        "",
        f"{result.label}: {env.get('device_name')} ({env.get('sm_count') or '-'} SMs), "
        f"copy bandwidth {result.bandwidth.TBps:.3f} TB/s (read + write), "
        f"median of {result.settings.get('repeats')} calls after {result.settings.get('warmup')} warm-up calls "
        f"({result.settings.get('timing_method')}).",
        "floor % = memory floor / time (bytes a task must move at the measured copy bandwidth); "
        "speedup vs X = time of X / time of fastkda.",
    ]
    for i in result.impls:
        if not i["available"]:
            notes.append(f"{i['name']}: {i['reason']}")
    if result.show_recorded:
        notes.append(recorded_note(result))
    bound = [f"{r.impl} on {tr.task.name} ({r.timing.host_ms:.3f} of {r.ms:.3f} ms)" for tr in result.tasks
             for r in tr.results.values() if r.ms and r.timing.host_ms is not None
             and r.timing.host_ms >= HOST_BOUND * r.ms]
    if bound:
        notes.append(f"host-bound (the host took >= {HOST_BOUND:.0%} of the measured time to issue each call; "
                     "the GPU time is lower): " + ", ".join(bound))
    failures = [(tr.task.name, r) for tr in result.tasks for r in tr.results.values()
                if r.status in ("invalid", "error")]
    for task, r in failures:
        tag = "INVALID" if r.status == "invalid" else "ERROR"
        notes.append(f"{tag} {r.impl} on {task}: {r.error}")
    return "\n".join(out + notes)


# --------------------------------------------------------------------------------------------------------
# Chart

PNG_SKIPPED = "PNG skipped: matplotlib is not installed (pip install 'fastkda[bench]')"


def write_png(result: BenchResult, path) -> Tuple[Optional[Path], str]:
    """Bar chart: per task one bar per measured implementation, the recorded FlashKDA time (hatched) and the
    memory floor (a black line). Returns ``(path, message)``; path None when skipped."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, PNG_SKIPPED
    impls = result.measured_impls
    show_rec = result.show_recorded and any(recorded_ms(tr.task.name, RECORDED_KEY) for tr in result.tasks)
    series = [(n, [tr.ms(n) for tr in result.tasks], {}) for n in impls]
    if show_rec:
        where = "H200" if result.recorded_comparable else "H200, not comparable"
        series.append((f"FlashKDA (recorded on {where}, not measured)",
                       [recorded_ms(tr.task.name, RECORDED_KEY) for tr in result.tasks],
                       {"hatch": "//", "fill": False}))
    n_tasks, n_series = len(result.tasks), len(series)
    width = 0.8 / max(1, n_series)
    fig, ax = plt.subplots(figsize=(min(16.0, max(6.0, 1.2 * n_tasks + 2)), 5.0))
    for j, (label, vals, style) in enumerate(series):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(n_tasks)]
        hs = [v if v else 0.0 for v in vals]
        bars = ax.bar(xs, hs, width, label=label, **style)
        for b, v, tr in zip(bars, vals, result.tasks):
            if v is None and label in tr.results and tr.results[label].status in ("invalid", "error"):
                ax.text(b.get_x() + b.get_width() / 2, 0, tr.results[label].status.upper(), rotation=90,
                        ha="center", va="bottom", fontsize=7)
    for i, tr in enumerate(result.tasks):
        ax.hlines(tr.floor_ms, i - 0.45, i + 0.45, colors="black", linewidth=1.5,
                  label="memory floor" if i == 0 else None)
    ax.set_xticks(range(n_tasks))
    ax.set_xticklabels([tr.task.name for tr in result.tasks], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("time per forward pass (ms, median)")
    env = result.environment
    ax.set_title(f"KDA forward: {env.get('device_name')} - {env.get('date', '')[:10]}\n{result.label}",
                 fontsize=10)
    top = max([v for _, vals, _ in series for v in vals if v] + [tr.floor_ms for tr in result.tasks])
    ax.set_ylim(0, 1.35 * top)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path, f"wrote {path}"


def label_for(device) -> str:
    return GPU_LABEL if torch.device(device).type == "cuda" else CPU_LABEL
