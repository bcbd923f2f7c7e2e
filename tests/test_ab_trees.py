"""benchmarks/ab_trees.py: two builds prepared from git, checked to import from their own trees, run
interleaved, and summarised."""

import difflib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import ab_trees  # noqa: E402


def _head():
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


needs_git = pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the git checkout")


@needs_git
def test_prepare_extracts_the_revisions_package_and_marks_its_commit(tmp_path):
    tree = ab_trees.prepare("HEAD", tmp_path)
    assert (tree / "fastkda" / "__init__.py").exists()
    assert (tree / "fastkda" / "kernels" / "chunk_recurrence_gluon.py").exists()
    assert ab_trees.tree_commit(tree) == _head()
    assert not (tree / "tests").exists()                    # the package only
    assert tree.name == _head()[:12]
    (tree / "fastkda" / "stale.py").write_text("")          # a second prepare replaces the tree
    assert not (ab_trees.prepare("HEAD", tmp_path) / "fastkda" / "stale.py").exists()


@needs_git
def test_prepare_rejects_an_unknown_revision(tmp_path):
    with pytest.raises(ValueError, match="rev"):
        ab_trees.prepare("no-such-revision-xyz", tmp_path)


def _patch_of_init(tmp_path, extra_hunk="", name="variant.diff"):
    """A git-style diff of HEAD's fastkda/__init__.py that adds a first line '# patched variant' (and extra_hunk,
    appended as it is)."""
    text = subprocess.run(["git", "show", "HEAD:fastkda/__init__.py"], cwd=ROOT, capture_output=True,
                          text=True).stdout
    lines = text.splitlines(keepends=True)
    diff = difflib.unified_diff(lines, ["# patched variant\n"] + lines, "a/fastkda/__init__.py",
                                "b/fastkda/__init__.py")
    path = tmp_path / name
    path.write_text("diff --git a/fastkda/__init__.py b/fastkda/__init__.py\n" + "".join(diff) + extra_hunk)
    return path


@needs_git
def test_prepare_applies_a_patch_and_names_it(tmp_path):
    tree = ab_trees.prepare("HEAD", tmp_path / "ab", patch=_patch_of_init(tmp_path))
    assert tree.name == f"{_head()[:12]}+variant"
    assert (tree / "fastkda" / "__init__.py").read_text().startswith("# patched variant\n")
    marker = ab_trees.tree_commit(tree)
    assert marker.startswith(_head()) and "variant.diff" in marker and "sha256" in marker
    # the unpatched tree of the same commit is another tree, untouched
    plain = ab_trees.prepare("HEAD", tmp_path / "ab")
    assert not (plain / "fastkda" / "__init__.py").read_text().startswith("# patched variant")
    assert ab_trees.tree_commit(plain) == _head()


@needs_git
def test_prepare_applies_a_patch_inside_another_git_checkout(tmp_path):
    # .ab/ lies inside the repository: git apply there would resolve the paths from that repository's root
    subprocess.run(["git", "init", "-q", str(tmp_path / "outer")], check=True)
    tree = ab_trees.prepare("HEAD", tmp_path / "outer" / "ab", patch=_patch_of_init(tmp_path))
    assert (tree / "fastkda" / "__init__.py").read_text().startswith("# patched variant\n")


@needs_git
def test_prepare_rejects_a_patch_that_does_not_apply_and_leaves_no_tree(tmp_path):
    patch = _patch_of_init(tmp_path, "@@ -40,1 +41,1 @@\n-no such line in the file\n+something else\n")
    with pytest.raises(ValueError, match="patch"):
        ab_trees.prepare("HEAD", tmp_path / "ab", patch=patch)
    assert not (tmp_path / "ab" / f"{_head()[:12]}+variant").exists()
    with pytest.raises(ValueError, match="patch"):
        ab_trees.prepare("HEAD", tmp_path / "ab", patch=tmp_path / "missing.diff")


@needs_git
def test_a_prepared_tree_imports_its_own_package(tmp_path):
    tree = ab_trees.prepare("HEAD", tmp_path)
    ab_trees.check_tree(tree)
    assert tree.resolve() in ab_trees.imported_from(tree).parents


def test_a_tree_without_the_package_is_refused(tmp_path):
    # Nothing of fastkda in the tree: the import resolves elsewhere (the installed package), or fails.
    with pytest.raises(RuntimeError):
        ab_trees.check_tree(tmp_path)


FAKE_BENCH = """
import json, os, sys
json_path, times, passed = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
tree = os.path.basename(os.getcwd())
tasks = [{"name": n, "results": {"fastkda": {"status": "ok", "time_ms": t,
                                             "validation": {"passed": passed or tree == "a"}}}}
         for n, t in times[tree].items()]
json.dump({"environment": {"device_name": "fake"}, "tasks": tasks}, open(json_path, "w"))
open(os.path.join(os.path.dirname(json_path), "order.txt"), "a").write(tree + "\\n")
"""


def _fake_bench(times, passed=True):
    """A command writing a bench-like JSON whose times depend on the tree it runs in (its working directory);
    tree b fails validation unless ``passed``."""
    def command(json_path, bench_args):
        return [sys.executable, "-c", FAKE_BENCH, str(json_path), json.dumps(times), "1" if passed else "0"]
    return command


def _trees(tmp_path):
    trees = []
    for name in ("a", "b"):
        tree = tmp_path / name
        (tree / "fastkda").mkdir(parents=True)
        (tree / "fastkda" / "__init__.py").write_text("")
        trees.append(tree)
    return trees


def test_run_interleaves_the_builds_and_summarises_them(tmp_path):
    a, b = _trees(tmp_path)
    times = {"a": {"t1": 1.0, "t2": 4.0}, "b": {"t1": 0.5, "t2": 4.0}}
    out = tmp_path / "runs"
    summary = ab_trees.run(a, b, rounds=3, out_dir=out, command=_fake_bench(times), log=lambda *_: None)
    assert (out / "order.txt").read_text().split() == ["a", "b"] * 3
    assert sorted(p.name for p in out.glob("*.json")) == ["A1.json", "A2.json", "A3.json", "B1.json", "B2.json",
                                                         "B3.json"]
    assert summary["rounds"] == 3
    assert summary["mean_ms"]["A"] == {"t1": 1.0, "t2": 4.0} and summary["mean_ms"]["B"] == {"t1": 0.5, "t2": 4.0}
    assert summary["change"] == {"t1": -0.5, "t2": 0.0}
    assert summary["geomean_ms"]["A"] == pytest.approx(2.0) and summary["geomean_ms"]["B"] == pytest.approx(2 ** 0.5)
    assert summary["geomean_change"] == pytest.approx(2 ** -0.5 - 1)
    assert summary["all_validated"] == {"A": True, "B": True}
    assert "| geomean | 2.000 | 1.414 | -29.3% |" in ab_trees.format_table(summary)


def test_a_failed_validation_shows_in_the_summary(tmp_path):
    a, b = _trees(tmp_path)
    times = {"a": {"t1": 1.0}, "b": {"t1": 1.0}}
    summary = ab_trees.run(a, b, rounds=1, out_dir=tmp_path / "runs", command=_fake_bench(times, passed=False),
                           log=lambda *_: None)
    assert summary["all_validated"] == {"A": True, "B": False}


def test_summarize_keeps_only_tasks_every_round_of_both_builds_timed():
    def bench(times):
        return {"tasks": [{"name": n, "results": {"fastkda": {"status": "ok", "time_ms": t,
                                                             "validation": {"passed": True}}}} for n, t in times.items()]}
    runs = {"A": [bench({"t1": 1.0, "t2": 2.0}), bench({"t1": 3.0, "t2": 2.0})],
            "B": [bench({"t1": 2.0}), bench({"t1": 2.0, "t2": 1.0})]}
    summary = ab_trees.summarize(runs, {"A": "a", "B": "b"}, {"A": None, "B": None})
    assert summary["mean_ms"]["A"] == {"t1": 2.0} and summary["change"] == {"t1": 0.0}


def test_run_refuses_a_tree_without_fastkda(tmp_path):
    a, _ = _trees(tmp_path)
    with pytest.raises(ValueError, match="tree B"):
        ab_trees.run(a, tmp_path / "empty", out_dir=tmp_path / "runs", log=lambda *_: None)


def test_the_command_line_takes_its_options_after_the_trees_and_passes_the_rest_to_the_bench(tmp_path, monkeypatch):
    seen = {}

    def fake_run(tree_a, tree_b, *, rounds, bench_args, out_dir):
        seen.update(trees=(tree_a, tree_b), rounds=rounds, bench_args=bench_args, out_dir=out_dir)
        return {"change": {}, "mean_ms": {"A": {}, "B": {}}, "geomean_ms": None}

    monkeypatch.setattr(ab_trees, "run", fake_run)
    summary = tmp_path / "ab.json"
    # the usage line's order: trees, then this command's options, then `--` and the bench's
    ab_trees.main(["run", "ta", "tb", "--rounds", "3", "--json", str(summary), "--", "--no-peers", "--tasks", "x"])
    assert seen == {"trees": (Path("ta"), Path("tb")), "rounds": 3, "bench_args": ["--no-peers", "--tasks", "x"],
                    "out_dir": tmp_path / "ab-runs"}
    assert json.loads(summary.read_text())["change"] == {}
    ab_trees.main(["run", "ta", "tb", "--json", str(summary)])
    assert seen["bench_args"] == ["--no-peers"] and seen["rounds"] == 2


TINY_CASES = (((5, 40), 2, True), ((33,), 1, False))


@needs_git
def test_bits_finds_two_trees_of_one_commit_equal(tmp_path):
    a = ab_trees.prepare("HEAD", tmp_path / "a")
    b = ab_trees.prepare("HEAD", tmp_path / "b")
    summary = ab_trees.bits(a, b, work_dir=tmp_path / "w", cases=TINY_CASES, log=lambda *_: None)
    assert [(c["a"], c["b"]) for c in summary["comparisons"]] == [("A:fused", "B:fused"), ("A:two", "B:two"),
                                                                 ("B:fused", "B:two")]
    assert summary["all_equal"] and all(len(c["cases"]) == 2 for c in summary["comparisons"])
    assert summary["cases"][0] == {"seq_lens": [5, 40], "heads": 2, "initial_state": True}
    assert ab_trees.format_bits(summary).endswith("ALL BITWISE EQUAL")


@needs_git
def test_bits_catches_one_ulp_in_one_final_state_element(tmp_path):
    a = ab_trees.prepare("HEAD", tmp_path / "a")
    b = ab_trees.prepare("HEAD", tmp_path / "b")
    with open(b / "fastkda" / "__init__.py", "a") as f:        # tree B nudges one element of the final state
        f.write("\nimport torch as _t\n_api_chunk_kda = chunk_kda\n\n"
                "def chunk_kda(*args, **kwargs):\n"
                "    o, s = _api_chunk_kda(*args, **kwargs)\n"
                "    s[-1, -1, -1, -1] = _t.nextafter(s[-1, -1, -1, -1], _t.tensor(_t.inf, device=s.device))\n"
                "    return o, s\n")
    summary = ab_trees.bits(a, b, routes=("fused",), work_dir=tmp_path / "w", cases=TINY_CASES, log=lambda *_: None)
    (comparison,) = summary["comparisons"]
    assert not summary["all_equal"] and not comparison["equal"]
    assert [r["out_equal"] for r in comparison["cases"]] == [True, True]
    assert [r["final_state_equal"] for r in comparison["cases"]] == [False, False]
    assert 0 < comparison["cases"][1]["final_state_max_abs_diff"] < 1e-6
    assert "DIFFER in cases [0, 1]" in ab_trees.format_bits(summary)


def test_bit_inputs_are_the_same_for_the_same_seed_and_shaped_for_packed_sequences():
    x, y = ab_trees.bit_inputs((3, 4), 2, True, seed=7), ab_trees.bit_inputs((3, 4), 2, True, seed=7)
    assert all(torch.equal(x[n], y[n]) for n in x if x[n] is not None)
    assert not torch.equal(x["q"], ab_trees.bit_inputs((3, 4), 2, True, seed=8)["q"])
    assert x["q"].shape == (1, 7, 2, 128) and x["beta"].shape == (1, 7, 2)
    assert x["initial_state"].shape == (2, 2, 128, 128) and x["cu_seqlens"].tolist() == [0, 3, 7]
    assert ab_trees.bit_inputs((3,), 1, False, seed=7)["initial_state"] is None


def test_compare_outputs_reports_shape_and_value_mismatches():
    out = torch.zeros(1, 4, 1, 8, dtype=torch.bfloat16)
    state = torch.zeros(1, 1, 8, 8)
    minus_zero = torch.full_like(state, -0.0)                  # equal as numbers, not as bits
    r = ab_trees.compare_outputs([(out, state)], [(out, minus_zero)])
    assert not r["equal"] and r["cases"][0]["out_equal"] and not r["cases"][0]["final_state_equal"]
    assert r["cases"][0]["final_state_max_abs_diff"] == 0.0
    r = ab_trees.compare_outputs([(out, state)], [(out.float(), state)])
    assert not r["cases"][0]["out_equal"] and r["cases"][0]["out_max_abs_diff"] is None
    with pytest.raises(ValueError, match="cases"):
        ab_trees.compare_outputs([(out, state)], [])


def test_bits_refuses_an_unknown_route(tmp_path):
    a, b = _trees(tmp_path)
    with pytest.raises(ValueError, match="routes"):
        ab_trees.bits(a, b, routes=("fast",), work_dir=tmp_path / "w")


FAKE_TIMES = """
import json, os, sys
times = json.loads(sys.argv[1])
tree = os.path.basename(os.getcwd())
open(os.path.join(sys.argv[2], "order.txt"), "a").write(tree + "\\n")
print("compiling ...")
print(json.dumps({t: times[tree][t] for t in sys.argv[3].split(",")}))
"""


def _fake_times(times, log_dir):
    """A tree_times command whose times depend on the tree it runs in (its working directory)."""
    def command(tasks, route, warmup, repeats):
        assert route == "fused" and (warmup, repeats) == (10, 200)
        return [sys.executable, "-c", FAKE_TIMES, json.dumps(times), str(log_dir), ",".join(tasks)]
    return command


def test_time_trees_interleaves_any_number_of_trees_and_compares_them_with_the_first(tmp_path):
    a, b = _trees(tmp_path)
    c = tmp_path / "c"
    (c / "fastkda").mkdir(parents=True)
    (c / "fastkda" / "__init__.py").write_text("")
    times = {"a": {"t1": 1.0, "t2": 4.0}, "b": {"t1": 0.5, "t2": 4.0}, "c": {"t1": 2.0, "t2": 2.0}}
    summary = ab_trees.time_trees([a, b, c], tasks=["t1", "t2"], route="fused", rounds=2,
                                  command=_fake_times(times, tmp_path), log=lambda *_: None)
    assert (tmp_path / "order.txt").read_text().split() == ["a", "b", "c"] * 2
    assert summary["rounds"] == 2 and summary["route"] == "fused"
    assert summary["mean_ms"] == {"1": times["a"], "2": times["b"], "3": times["c"]}
    assert summary["change"]["2"] == {"t1": -0.5, "t2": 0.0} and summary["change"]["1"] == {"t1": 0.0, "t2": 0.0}
    assert summary["geomean_ms"]["3"] == pytest.approx(2.0)
    assert summary["geomean_change"]["2"] == pytest.approx(2 ** -0.5 - 1)
    table = ab_trees.format_times(summary)
    assert "| geomean | 2.0000 | 1.4142 (-29.3%) | 2.0000 (+0.0%) |" in table
    assert f"tree 3: {c.resolve()}" in table


def test_summarize_times_keeps_only_tasks_every_round_of_every_tree_timed():
    samples = {"1": [{"t1": 1.0, "t2": 2.0}, {"t1": 3.0, "t2": 2.0}], "2": [{"t1": 2.0}, {"t1": 2.0, "t2": 1.0}]}
    summary = ab_trees.summarize_times(samples, {"1": "a", "2": "b"}, {"1": None, "2": None}, "rule")
    assert summary["mean_ms"] == {"1": {"t1": 2.0}, "2": {"t1": 2.0}}
    assert summary["change"]["2"] == {"t1": 0.0}


@pytest.mark.parametrize("kwargs, match", [
    (dict(route="fast"), "route"), (dict(rounds=0), "rounds"), (dict(tasks=[]), "tasks")])
def test_time_trees_refuses_bad_arguments(tmp_path, kwargs, match):
    a, _ = _trees(tmp_path)
    args = dict(dict(tasks=["t1"], route="fused", rounds=1, log=lambda *_: None), **kwargs)
    with pytest.raises(ValueError, match=match):
        ab_trees.time_trees([a], **args)
    with pytest.raises(ValueError, match="trees"):
        ab_trees.time_trees([], tasks=["t1"])


def test_time_trees_reports_a_tree_whose_process_fails(tmp_path):
    a, _ = _trees(tmp_path)

    def failing(tasks, route, warmup, repeats):
        return [sys.executable, "-c", "import sys; sys.exit('no GPU here')"]
    with pytest.raises(RuntimeError, match="tree 1 .*no GPU here"):
        ab_trees.time_trees([a], tasks=["t1"], rounds=1, command=failing, log=lambda *_: None)


def test_the_time_command_line_passes_its_options(tmp_path, monkeypatch):
    seen = {}

    def fake_time_trees(trees, **kwargs):
        seen.update(trees=trees, **kwargs)
        return ab_trees.summarize_times({"1": [{"t": 1.0}]}, {"1": "x"}, {"1": None}, kwargs["route"])

    monkeypatch.setattr(ab_trees, "time_trees", fake_time_trees)
    out = tmp_path / "t.json"
    ab_trees.main(["time", "ta", "tb", "tc", "--tasks", "x,y", "--route", "two", "--rounds", "2", "--json", str(out)])
    assert seen == {"trees": [Path("ta"), Path("tb"), Path("tc")], "tasks": ["x", "y"], "route": "two", "rounds": 2,
                    "warmup": 10, "repeats": 200}
    assert json.loads(out.read_text())["route"] == "two"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_time_runs_the_library_on_a_bench_task(tmp_path):
    summary = ab_trees.time_trees([ROOT, ROOT], tasks=["H64_varlen_1024x8"], route="fused", rounds=1, warmup=2,
                                  repeats=5, log=lambda *_: None)
    assert 0 < summary["mean_ms"]["1"]["H64_varlen_1024x8"] < 100
