"""Two builds of fastkda timed side by side on one machine: the forward before and after a change.

    python benchmarks/ab_trees.py prepare REV                      # here: REV's fastkda/ into .ab/COMMIT/
    python benchmarks/ab_trees.py prepare REV --patch FILE.diff    # ... with a prepared variant applied
    python benchmarks/ab_trees.py run .ab/COMMIT . --json OUT.json # on the device (carry .ab): A, B, A, B, ...
    python benchmarks/ab_trees.py bits .ab/COMMIT . --json OUT.json  # on the device: same outputs, to the bit?
    python benchmarks/ab_trees.py time TREE... --tasks T1,T2 --route fused --json OUT.json   # GPU times only

Machines differ by a few percent (docs/perf-notes.md), more than many changes gain, so a change is judged
on one machine, its runs interleaved so that drift hits both builds alike. `run` runs `python -m fastkda.bench`
(validation first on each shape, then the timing) once per build per round, each from its own tree: the
tree is the working directory as well as PYTHONPATH, because Python puts the working directory ahead of
PYTHONPATH and a run from the repository root would import the root's fastkda whatever PYTHONPATH says
(session 15 did that once). Before timing, each build's import is checked to come from its tree. The
summary: per task the mean of the rounds' medians for each build, B's change against A, the geomeans, and
whether every validation passed. The device copy has no .git, so `prepare` runs here and `.ab/` travels as a
carried path. `--patch` applies a diff (`git diff` output, such as docs/variants/*.diff: variants prepared in one
session for the next, since branches do not travel between sessions) to the prepared package; the tree is named
COMMIT+PATCH and its marker names the patch and its hash.

`bits` asks whether a change that should not move a single bit (a reordering, an exact rewrite) moved none:
each tree computes the outputs and final states of BIT_CASES (partial chunks, packed sequences, initial states,
both routes) from the same inputs, made on the CPU from fixed seeds, and the two trees' results are compared
bit for bit per route, and tree B's two routes against each other (the fused kernel and the two stages give
the same bits by design: fused_gluon.py).

`time` compares any number of trees (variants, ablations whose results are wrong by design) on GPU time alone:
CUDA-graph replays of fastkda.fwd on named bench tasks through one route, a process per tree and round, the
trees interleaved within each round, no validation. Check outputs with `bits` (or `run`) before believing a
faster variant.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
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


def prepare(rev: str, out_dir: Path = AB_DIR, repo: Path = ROOT, patch: Optional[Path] = None) -> Path:
    """``rev``'s fastkda package (git archive) into out_dir/<its commit, 12 digits>/, replacing what was there (a
    name like HEAD or a branch moves); with ``patch`` (a diff with a/ and b/ paths from the repository root) applied,
    into out_dir/<commit>+<patch name>/. Returns that tree; a patch that does not apply leaves no tree."""
    full = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=repo, capture_output=True,
                          text=True)
    if full.returncode != 0:
        raise ValueError(f"rev: not a commit of {repo}: {rev!r}")
    commit = full.stdout.strip()
    if patch is not None and not Path(patch).is_file():
        raise ValueError(f"patch: no such file: {str(patch)!r}")
    tree = Path(out_dir) / (commit[:12] + (f"+{Path(patch).stem}" if patch is not None else ""))
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "fastkda.tar"
        subprocess.run(["git", "archive", "-o", str(archive), commit, "fastkda"], cwd=repo, check=True)
        with tarfile.open(archive) as tar:
            try:
                tar.extractall(tree, filter="data")
            except TypeError:                       # Python without extraction filters
                tar.extractall(tree)
    marker = commit
    if patch is not None:
        # git apply outside any repository (paths relative to the tree, the a/ and b/ prefixes stripped): inside one
        # (.ab/ lies in the checkout) it would take the paths from the repository's root and silently skip them
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(GIT_CEILING_DIRECTORIES=str(tree.resolve().parent), LC_ALL="C")   # (C: its messages in English)
        applied = subprocess.run(["git", "apply", "--verbose", str(Path(patch).resolve())], cwd=tree, env=env,
                                 capture_output=True, text=True)
        if applied.returncode == 0 and "Applied patch" not in applied.stderr:
            applied.returncode, applied.stderr = 1, "no file of the patch was applied"
        if applied.returncode != 0:
            shutil.rmtree(tree)
            raise ValueError(f"patch: {str(patch)!r} does not apply to {rev!r} ({commit[:12]}): "
                             f"{applied.stderr.strip().splitlines()[0] if applied.stderr.strip() else ''}")
        digest = hashlib.sha256(Path(patch).read_bytes()).hexdigest()[:12]
        marker += f" + {Path(patch).name} (sha256 {digest})"
    (tree / "AB_COMMIT").write_text(marker + "\n")
    return tree


def tree_commit(tree: Path) -> Optional[str]:
    """The commit a prepared tree came from, and the patch applied to it if any (None for a working tree)."""
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


def _checked_trees(named: Dict[str, Path]) -> Dict[str, Path]:
    """The trees by name, resolved, each holding fastkda and importing it from itself."""
    trees = {name: Path(tree).resolve() for name, tree in named.items()}
    for name, tree in trees.items():
        if not (tree / "fastkda" / "__init__.py").exists():
            raise ValueError(f"tree {name}: no fastkda package in {tree}")
        check_tree(tree)
    return trees


def _fastkda_of_this_tree():
    """fastkda, imported in a tree's process (its working directory); raises unless it comes from that tree."""
    import fastkda
    if Path.cwd().resolve() not in Path(fastkda.__file__).resolve().parents:
        raise RuntimeError(f"fastkda imported from {fastkda.__file__}, not from the tree {Path.cwd()}")
    return fastkda


def bench_command(json_path: Path, bench_args: Sequence[str], python: str = sys.executable) -> List[str]:
    return [python, "-m", "fastkda.bench", "--no-png", "--json", str(json_path), *bench_args]


def run(tree_a: Path, tree_b: Path, *, rounds: int = 2, bench_args: Sequence[str] = ("--no-peers",),
        out_dir: Path, command: Callable[[Path, Sequence[str]], List[str]] = bench_command, log=print) -> dict:
    """Interleaved bench runs (A, B per round) of two trees; the bench JSONs in out_dir; returns the summary."""
    if rounds < 1:
        raise ValueError(f"rounds: expected at least 1, got {rounds}")
    trees = _checked_trees({"A": tree_a, "B": tree_b})
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


# Cases of the bit check: (sequence lengths, value heads, initial state?), K = V = 128, packed. Partial chunks
# (lengths not multiples of 32), one-token and one-chunk sequences, a long one beside short ones, many short ones.
BIT_CASES = (
    ((8192,), 96, False), ((1000, 33, 4096, 77, 2500), 64, True), ((1024,) * 8, 96, True),
    ((31, 32, 33, 65, 200, 1), 64, True), ((3000, 2999), 32, False), ((32,) * 90, 64, True),
    ((4097,), 64, True), ((511, 1537, 2049), 96, False), ((64, 64, 64, 700), 16, True),
)
ROUTES = {"fused": True, "two": False, "rule": None}    # kernels.FUSED for each route


def bit_inputs(lens: Sequence[int], heads: int, with_state: bool, seed: int, D: int = 128):
    """The inputs of one bit-check case (fastkda.chunk_kda's, gate, norms and β sigmoid in the kernel), made on
    the CPU from ``seed`` so that every tree and device sees the same values."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)
    return dict(
        q=randn(1, T, heads, D).bfloat16(), k=randn(1, T, heads, D).bfloat16(), v=randn(1, T, heads, D).bfloat16(),
        g=(2 * randn(1, T, heads, D)).bfloat16(), beta=randn(1, T, heads).bfloat16(),
        A_log=2 * torch.rand(heads, generator=gen) - 1, dt_bias=0.5 * randn(heads * D),
        initial_state=0.1 * randn(len(lens), heads, D, D) if with_state else None,
        cu_seqlens=torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32))


def tree_outputs(path: Path, route: str, cases=BIT_CASES) -> None:
    """In a tree (its working directory, PYTHONPATH): every case's output and final state through ``route``
    (kernels.FUSED), saved to ``path``. On a machine without CUDA the reference runs (routes alike)."""
    import torch
    fastkda = _fastkda_of_this_tree()
    from fastkda import kernels
    kernels.FUSED = ROUTES[route]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = []
    for i, (lens, heads, with_state) in enumerate(cases):
        x = {n: (t.to(device) if t is not None else None) for n, t in bit_inputs(lens, heads, with_state, 1234 + i).items()}
        out, state = fastkda.chunk_kda(**x, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                       use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=-5.0)
        results.append((out.cpu(), state.cpu()))
    torch.save(results, path)


def _bits(t):
    import torch
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def compare_outputs(a: list, b: list) -> dict:
    """Case by case: whether outputs and final states agree to the bit, and their largest difference."""
    import torch
    if len(a) != len(b):
        raise ValueError(f"the two results hold {len(a)} and {len(b)} cases")
    cases = []
    for (out_a, st_a), (out_b, st_b) in zip(a, b):
        row = {}
        for name, x, y in (("out", out_a, out_b), ("final_state", st_a, st_b)):
            same_shape = x.shape == y.shape and x.dtype == y.dtype
            row[f"{name}_equal"] = same_shape and torch.equal(_bits(x), _bits(y))
            row[f"{name}_max_abs_diff"] = (x.float() - y.float()).abs().max().item() if same_shape else None
        cases.append(row)
    return {"equal": all(r["out_equal"] and r["final_state_equal"] for r in cases), "cases": cases}


def bits(tree_a: Path, tree_b: Path, *, routes: Sequence[str] = ("fused", "two"), work_dir: Path,
         cases=BIT_CASES, log=print) -> dict:
    """Each tree's outputs per route (a process per tree and route, run in the tree); tree A against tree B per
    route, and tree B's routes against each other."""
    for r in routes:
        if r not in ROUTES:
            raise ValueError(f"routes: expected names from {sorted(ROUTES)}, got {r!r}")
    trees = _checked_trees({"A": tree_a, "B": tree_b})
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    import torch
    saved = {}
    for name, tree in trees.items():
        for r in routes:
            path = work_dir / f"bits-{name}-{r}.pt"
            code = ("import sys; sys.path.insert(0, sys.argv[1]); import ab_trees, json; "
                    "ab_trees.tree_outputs(ab_trees.Path(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]))")
            proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parent), str(path), r,
                                   json.dumps(cases)], cwd=tree, env=_env(tree), capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"tree {name}, route {r}: exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
            saved[f"{name}:{r}"] = torch.load(path)
            log(f"tree {name} route {r}: outputs saved")
    pairs = [(f"A:{r}", f"B:{r}") for r in routes] + list(itertools.combinations([f"B:{r}" for r in routes], 2))
    comparisons = [dict(a=a, b=b, **compare_outputs(saved[a], saved[b])) for a, b in pairs]
    return {"what": "outputs and final states of two builds, bit for bit (benchmarks/ab_trees.py bits)",
            "trees": {n: str(t) for n, t in trees.items()},
            "commits": {n: tree_commit(t) for n, t in trees.items()},
            "cases": [{"seq_lens": list(lens), "heads": heads, "initial_state": st} for lens, heads, st in cases],
            "comparisons": comparisons, "all_equal": all(c["equal"] for c in comparisons)}


def format_bits(summary: dict) -> str:
    lines = []
    for c in summary["comparisons"]:
        differ = [i for i, r in enumerate(c["cases"]) if not (r["out_equal"] and r["final_state_equal"])]
        lines.append(f"{c['a']} vs {c['b']}: " + ("bitwise equal" if c["equal"] else
                                                   f"DIFFER in cases {differ}"))
    lines.append("ALL BITWISE EQUAL" if summary["all_equal"] else "NOT EQUAL")
    return "\n".join(lines)


def tree_times(tasks: Sequence[str], route: str, warmup: int, repeats: int) -> Dict[str, float]:
    """In a tree (its working directory, PYTHONPATH): the median GPU time (ms) of fastkda.fwd on each named bench
    task through ``route`` (kernels.FUSED), from CUDA-graph replays. No validation: for variants whose outputs
    `bits` checks, or ablations that are wrong by design."""
    fastkda = _fastkda_of_this_tree()
    from fastkda import kernels
    from fastkda.bench.impls import bind_fwd
    from fastkda.bench.tasks import make_inputs, select_tasks
    from fastkda.bench.timing import time_cuda_graph
    kernels.FUSED = ROUTES[route]
    times = {}
    for task in select_tasks(tasks):
        call = bind_fwd(fastkda.fwd, make_inputs(task, "cuda", 0))
        times[task.name] = time_cuda_graph(call, warmup=warmup, repeats=repeats).median_ms
    return times


def tree_times_command(tasks: Sequence[str], route: str, warmup: int, repeats: int) -> List[str]:
    """The process that runs tree_times in a tree and prints its result as the last line of JSON."""
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import ab_trees; "
            "print(json.dumps(ab_trees.tree_times(sys.argv[2].split(','), sys.argv[3], int(sys.argv[4]), "
            "int(sys.argv[5]))))")
    return [sys.executable, "-c", code, str(Path(__file__).resolve().parent), ",".join(tasks), route, str(warmup),
            str(repeats)]


def time_trees(trees: Sequence[Path], *, tasks: Sequence[str], route: str = "rule", rounds: int = 3,
               warmup: int = 10, repeats: int = 200, command: Callable[..., List[str]] = tree_times_command,
               log=print) -> dict:
    """GPU times of any number of trees on the named tasks, a process per tree and round, the trees interleaved
    within each round; per tree and task the mean of the rounds' medians and the change against the first
    tree. For ablations and many variants in one device call; `run` is the validated A/B of two builds."""
    if route not in ROUTES:
        raise ValueError(f"route: expected one of {sorted(ROUTES)}, got {route!r}")
    if rounds < 1:
        raise ValueError(f"rounds: expected at least 1, got {rounds}")
    if not trees:
        raise ValueError("trees: expected at least one tree")
    if not tasks:
        raise ValueError("tasks: expected at least one task name")
    named = _checked_trees({str(i + 1): tree for i, tree in enumerate(trees)})
    samples: Dict[str, List[Dict[str, float]]] = {name: [] for name in named}
    for r in range(rounds):
        for name, tree in named.items():
            proc = subprocess.run(command(tasks, route, warmup, repeats), cwd=tree, env=_env(tree),
                                  capture_output=True, text=True)
            lines = proc.stdout.strip().splitlines()
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"tree {name} ({tree}), round {r + 1}: exit {proc.returncode}: "
                                   f"{proc.stderr.strip()[-800:]}")
            samples[name].append(json.loads(lines[-1]))
            log(f"tree {name} round {r + 1}: {samples[name][-1]}")
    return summarize_times(samples, {name: str(tree) for name, tree in named.items()},
                           {name: tree_commit(tree) for name, tree in named.items()}, route)


def summarize_times(samples: Dict[str, List[Dict[str, float]]], trees: Dict[str, str],
                    commits: Dict[str, Optional[str]], route: str) -> dict:
    """Per tree and task the mean over rounds of the medians, the change against the first tree, geomeans over
    the tasks every round of every tree timed."""
    first = next(iter(samples))
    tasks = [t for t in samples[first][0] if all(t in s for runs in samples.values() for s in runs)]
    means = {name: {t: sum(s[t] for s in runs) / len(runs) for t in tasks} for name, runs in samples.items()}
    geo = {name: _geomean(list(m.values())) for name, m in means.items()} if tasks else {}
    return {
        "what": "fastkda.fwd GPU time (CUDA-graph replays, no validation) of several trees on one machine, "
                "interleaved rounds (benchmarks/ab_trees.py time)",
        "route": route, "trees": trees, "commits": commits, "rounds": len(samples[first]),
        "samples_ms": samples, "mean_ms": means,
        "change": {name: {t: means[name][t] / means[first][t] - 1 for t in tasks} for name in means},
        "geomean_ms": geo,
        "geomean_change": {name: g / geo[first] - 1 for name, g in geo.items()} if geo else {},
    }


def format_times(summary: dict) -> str:
    names = list(summary["mean_ms"])
    lines = ["| task | " + " | ".join(f"tree {n} ms" for n in names) + " |",
             "|---|" + "---:|" * len(names)]
    rows = [(t, {n: summary["mean_ms"][n][t] for n in names}, {n: summary["change"][n][t] for n in names})
            for t in summary["mean_ms"][names[0]]]
    if summary["geomean_ms"]:
        rows.append(("geomean", summary["geomean_ms"], summary["geomean_change"]))
    for label, ms, change in rows:
        cells = [f"{ms[n]:.4f}" + ("" if i == 0 else f" ({100 * change[n]:+.1f}%)") for i, n in enumerate(names)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [f"tree {n}: {path}" for n, path in summary["trees"].items()]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="REV's fastkda package into .ab/COMMIT (here, in the git checkout); "
                                           "prints the tree")
    p.add_argument("rev")
    p.add_argument("--patch", default=None, help="a diff to apply to the prepared package (docs/variants/*.diff)")
    r = sub.add_parser("run", help="interleaved bench runs of two trees (on the device)")
    r.add_argument("tree_a")
    r.add_argument("tree_b")
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--out-dir", default=None, help="the bench JSONs and logs (default: next to --json)")
    r.add_argument("--json", required=True, help="the summary")
    b = sub.add_parser("bits", help="outputs and final states of two trees, bit for bit (on the device)")
    b.add_argument("tree_a")
    b.add_argument("tree_b")
    b.add_argument("--routes", default="fused,two", help="comma-separated, of fused, two, rule (default fused,two)")
    b.add_argument("--work-dir", default=None, help="the saved outputs (default: a temporary folder)")
    b.add_argument("--json", required=True, help="the summary")
    t = sub.add_parser("time", help="GPU times of any number of trees, interleaved, no validation (on the device)")
    t.add_argument("trees", nargs="+")
    t.add_argument("--tasks", required=True, help="comma-separated bench task names (python -m fastkda.bench --list)")
    t.add_argument("--route", default="rule", help="fused, two or rule (default rule)")
    t.add_argument("--rounds", type=int, default=3)
    t.add_argument("--warmup", type=int, default=10)
    t.add_argument("--repeats", type=int, default=200)
    t.add_argument("--json", required=True, help="the summary")
    # What follows `--` goes to the bench untouched: split off before parsing (a REMAINDER positional would
    # also swallow this command's own options written after the trees, as the usage line writes them).
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    if args.cmd == "prepare":
        print(prepare(args.rev, patch=Path(args.patch) if args.patch else None))
        return
    if args.cmd == "bits":
        with tempfile.TemporaryDirectory() as tmp:
            summary = bits(Path(args.tree_a), Path(args.tree_b), routes=args.routes.split(","),
                           work_dir=Path(args.work_dir or tmp))
        Path(args.json).write_text(json.dumps(summary, indent=1))
        print(format_bits(summary))
        raise SystemExit(0 if summary["all_equal"] else 1)
    if args.cmd == "time":
        summary = time_trees([Path(x) for x in args.trees], tasks=args.tasks.split(","), route=args.route,
                             rounds=args.rounds, warmup=args.warmup, repeats=args.repeats)
        Path(args.json).write_text(json.dumps(summary, indent=1))
        print(format_times(summary))
        return
    bench_args = argv[cut + 1:] or ["--no-peers"]
    out_dir = Path(args.out_dir) if args.out_dir else Path(args.json).resolve().parent / "ab-runs"
    summary = run(Path(args.tree_a), Path(args.tree_b), rounds=args.rounds, bench_args=bench_args, out_dir=out_dir)
    Path(args.json).write_text(json.dumps(summary, indent=1))
    print(format_table(summary))


if __name__ == "__main__":
    main()
