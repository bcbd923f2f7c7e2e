"""Two builds of fastkda timed side by side on one machine: the forward before and after a change.

    python benchmarks/ab_trees.py prepare REV                      # here: REV's fastkda/ into .ab/COMMIT/
    python benchmarks/ab_trees.py run .ab/COMMIT . --json OUT.json # on the device (carry .ab): A, B, A, B, ...

Machines differ by a few percent (docs/perf-notes.md), more than many changes gain, so a change is judged
on one machine, its runs interleaved so that drift hits both builds alike. `run` runs `python -m fastkda.bench`
(validation first on each shape, then the timing) once per build per round, each from its own tree: the
tree is the working directory as well as PYTHONPATH, because Python puts the working directory ahead of
PYTHONPATH and a run from the repository root would import the root's fastkda whatever PYTHONPATH says
(session 15 did that once). Before timing, each build's import is checked to come from its tree. The
summary: per task the mean of the rounds' medians for each build, B's change against A, the geomeans, and
whether every validation passed. The device copy has no .git, so `prepare` runs here and `.ab/` travels as a
carried path.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
AB_DIR = ROOT / ".ab"


def prepare(rev: str, out_dir: Path = AB_DIR, repo: Path = ROOT) -> Path:
    """``rev``'s fastkda package (git archive) into out_dir/<its commit, 12 digits>/, replacing what was there (a
    name like HEAD or a branch moves); returns that tree."""
    full = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=repo, capture_output=True,
                          text=True)
    if full.returncode != 0:
        raise ValueError(f"rev: not a commit of {repo}: {rev!r}")
    tree = Path(out_dir) / full.stdout.strip()[:12]
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "fastkda.tar"
        subprocess.run(["git", "archive", "-o", str(archive), full.stdout.strip(), "fastkda"], cwd=repo, check=True)
        with tarfile.open(archive) as tar:
            try:
                tar.extractall(tree, filter="data")
            except TypeError:                       # Python without extraction filters
                tar.extractall(tree)
    (tree / "AB_COMMIT").write_text(full.stdout.strip() + "\n")
    return tree


def tree_commit(tree: Path) -> Optional[str]:
    """The commit a prepared tree came from (None for a working tree)."""
    marker = Path(tree) / "AB_COMMIT"
    return marker.read_text().strip() if marker.exists() else None


def _env(tree: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(tree), PYTHONUNBUFFERED="1")


def imported_from(tree: Path, python: str = sys.executable) -> Path:
    """Where `import fastkda` resolves when run from ``tree`` with PYTHONPATH = tree."""
    run = subprocess.run([python, "-c", "import fastkda; print(fastkda.__file__)"], cwd=tree, env=_env(tree),
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"importing fastkda from {tree} failed: {run.stderr.strip()[-500:]}")
    return Path(run.stdout.strip()).resolve()


def check_tree(tree: Path, python: str = sys.executable) -> None:
    """Raise unless fastkda imports from ``tree`` itself."""
    tree = Path(tree).resolve()
    got = imported_from(tree, python)
    if tree not in got.parents:
        raise RuntimeError(f"a run from {tree} imports fastkda from {got}, not from the tree")


def bench_command(json_path: Path, bench_args: Sequence[str], python: str = sys.executable) -> List[str]:
    return [python, "-m", "fastkda.bench", "--no-png", "--json", str(json_path), *bench_args]


def run(tree_a: Path, tree_b: Path, *, rounds: int = 2, bench_args: Sequence[str] = ("--no-peers",),
        out_dir: Path, command: Callable[[Path, Sequence[str]], List[str]] = bench_command, log=print) -> dict:
    """Interleaved bench runs (A, B per round) of two trees; the bench JSONs in out_dir; returns the summary."""
    if rounds < 1:
        raise ValueError(f"rounds: expected at least 1, got {rounds}")
    trees = {"A": Path(tree_a).resolve(), "B": Path(tree_b).resolve()}
    for name, tree in trees.items():
        if not (tree / "fastkda" / "__init__.py").exists():
            raise ValueError(f"tree {name}: no fastkda package in {tree}")
        check_tree(tree)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: Dict[str, List[dict]] = {"A": [], "B": []}
    for r in range(rounds):
        for name, tree in trees.items():
            path = out_dir / f"{name}{r + 1}.json"
            proc = subprocess.run(command(path, bench_args), cwd=tree, env=_env(tree), capture_output=True,
                                  text=True)
            (out_dir / f"{name}{r + 1}.log").write_text(proc.stdout + proc.stderr)
            if not path.exists():
                raise RuntimeError(f"bench of tree {name} (round {r + 1}) wrote no JSON; exit {proc.returncode}: "
                                   f"{proc.stderr.strip()[-500:]}")
            runs[name].append(json.loads(path.read_text()))
            log(f"tree {name} round {r + 1}: exit {proc.returncode}")
    return summarize(runs, {name: str(tree) for name, tree in trees.items()},
                     {name: tree_commit(tree) for name, tree in trees.items()})


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(runs: Dict[str, List[dict]], trees: Dict[str, str], commits: Dict[str, Optional[str]]) -> dict:
    """Per task the mean over rounds of each build's median (ms), B / A − 1, geomeans over the tasks both builds
    timed, and whether every run validated every task it timed."""
    means, validated = {}, {}
    for name, bench_runs in runs.items():
        per_task: Dict[str, List[float]] = {}
        ok = True
        for bench in bench_runs:
            for task in bench["tasks"]:
                result = task["results"].get("fastkda", {})
                ok &= result.get("status") == "ok" and bool((result.get("validation") or {}).get("passed"))
                if result.get("time_ms") is not None:
                    per_task.setdefault(task["name"], []).append(result["time_ms"])
        means[name] = {task: sum(ts) / len(ts) for task, ts in per_task.items() if len(ts) == len(bench_runs)}
        validated[name] = ok
    tasks = [t for t in means["A"] if t in means["B"]]
    change = {t: means["B"][t] / means["A"][t] - 1 for t in tasks}
    geo = {name: _geomean([means[name][t] for t in tasks]) for name in ("A", "B")} if tasks else {}
    environment = next((b.get("environment") for b in runs["A"] if b.get("environment")), {})
    return {
        "what": "fastkda forward, two builds on one machine, interleaved rounds (benchmarks/ab_trees.py)",
        "trees": trees, "commits": commits, "rounds": len(runs["A"]),
        "environment": {k: environment.get(k) for k in ("device_name", "driver_version", "cuda", "torch",
                                                        "triton", "date")},
        "mean_ms": {"A": {t: means["A"][t] for t in tasks}, "B": {t: means["B"][t] for t in tasks}},
        "change": change,
        "geomean_ms": geo,
        "geomean_change": (geo["B"] / geo["A"] - 1) if geo else None,
        "all_validated": validated,
    }


def format_table(summary: dict) -> str:
    lines = ["| task | A ms | B ms | change |", "|---|---:|---:|---:|"]
    for task, ch in summary["change"].items():
        lines.append(f"| {task} | {summary['mean_ms']['A'][task]:.3f} | {summary['mean_ms']['B'][task]:.3f} | "
                     f"{100 * ch:+.1f}% |")
    if summary["geomean_ms"]:
        g = summary["geomean_ms"]
        lines.append(f"| geomean | {g['A']:.3f} | {g['B']:.3f} | {100 * summary['geomean_change']:+.1f}% |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="REV's fastkda package into .ab/COMMIT (here, in the git checkout); "
                                           "prints the tree")
    p.add_argument("rev")
    r = sub.add_parser("run", help="interleaved bench runs of two trees (on the device)")
    r.add_argument("tree_a")
    r.add_argument("tree_b")
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--out-dir", default=None, help="the bench JSONs and logs (default: next to --json)")
    r.add_argument("--json", required=True, help="the summary")
    # What follows `--` goes to the bench untouched: split off before parsing (a REMAINDER positional would
    # also swallow this command's own options written after the trees, as the usage line writes them).
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    if args.cmd == "prepare":
        print(prepare(args.rev))
        return
    bench_args = argv[cut + 1:] or ["--no-peers"]
    out_dir = Path(args.out_dir) if args.out_dir else Path(args.json).resolve().parent / "ab-runs"
    summary = run(Path(args.tree_a), Path(args.tree_b), rounds=args.rounds, bench_args=bench_args, out_dir=out_dir)
    Path(args.json).write_text(json.dumps(summary, indent=1))
    print(format_table(summary))


if __name__ == "__main__":
    main()
