"""Tests of the benchmark (fastkda.bench): tasks and floors, geomeans, the validation gate, JSON, CLI on the CPU."""

import importlib.util
import json
import math
import os
import sys
import time
import types
from dataclasses import asdict, dataclass

import pytest
import torch

import fastkda
import fastkda.validation
from fastkda.bench import run_benchmark
from fastkda.bench import impls as bimpls
from fastkda.bench import report, tasks, timing
from fastkda.bench.__main__ import main
from fastkda.bench.impls import Impl, bind_fwd, custom_impl
from fastkda.bench.report import BenchResult, ImplResult, TaskResult
from fastkda.bench.tasks import Task

TINY = Task("tiny_varlen", 2, (40, 24))            # small enough for the real quick_check on this CPU
TINY_FIXED = Task("tiny_fixed", 2, (48,), fixed=True)
BW = timing.Bandwidth(bytes_per_s=4.25e12, buffer_bytes=1 << 30, bytes_counted=2 << 30, median_ms=0.5,
                      repeats=10, method="test")


# --------------------------------------------------------------------------------------------------------
# helpers


@dataclass
class FakeCase:
    """Stand-in with the CaseResult contract (fields and as_dict)."""

    tier: str
    name: str
    shape: str
    seed: int
    out_err: float
    state_err: float
    token_err: float
    passed: bool
    message: str = ""

    def as_dict(self):
        return asdict(self)


def passing_quick_check(impl, *, seq_lens, H, D=128, device="cpu", seed=None):
    return FakeCase("quick", f"H{H}", f"T={list(seq_lens)} H{H} D{D}", 7, 1e-3, 1e-3, 1e-2, True)


def zeros_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
              cu_seqlens=None):
    """A deliberately wrong implementation: writes zeros."""
    zeros_fwd.calls += 1
    out.zero_()
    if final_state is not None:
        final_state.zero_()


zeros_fwd.calls = 0


class CountingTimer:
    """A timer that runs the call ``warmup + repeats`` times and remembers what it timed."""

    def __init__(self):
        self.timed = []

    def __call__(self, fn, *, warmup, repeats, rounds):
        self.timed.append(fn)
        return timing.time_host(fn, warmup=warmup, repeats=repeats)


def fake_result(times, device_name="NVIDIA H200", peer="fla", flash_kda_available=False):
    """A BenchResult over the six standard tasks with given {impl: [ms or None per task]}."""
    trs = []
    for j, t in enumerate(tasks.default_tasks()):
        nb = tasks.bytes_moved(t)
        tr = TaskResult(t, j, nb, tasks.floor_ms(nb, BW.bytes_per_s))
        for name, ms in times.items():
            if ms[j] is None:
                tr.results[name] = ImplResult(name, "invalid", validation={"passed": False}, error="out_err=1")
            else:
                st = timing.summarize([ms[j]], warmup=0, rounds=1, method="cuda_events")
                tr.results[name] = ImplResult(name, "ok", timing=st, validation={"passed": True})
        trs.append(tr)
    infos = [{"name": n, "available": True, "reason": "", "version": "", "source": ""} for n in times]
    if not flash_kda_available and "flash_kda" not in times:
        infos.append({"name": "flash_kda", "available": False, "reason": "not installed (test)", "version": "",
                      "source": ""})
    env = {"device_name": device_name, "device_type": "cuda", "sm_count": 132, "date": "2026-12-01T00:00:00"}
    return BenchResult("default", report.GPU_LABEL, env, {"repeats": 300, "warmup": 20,
                                                          "timing_method": "cuda_events"}, BW, infos, trs)


# --------------------------------------------------------------------------------------------------------
# tasks, bytes, floors, geomean


def test_standard_task_names_match_recorded_peers():
    names = [t.name for t in tasks.default_tasks()]
    assert names == list(tasks.load_peers()["tasks_ms"])
    for t in tasks.default_tasks():
        assert t.T == 8192 and t.D == 128 and t.lower_bound == -5.0
        assert t.fixed == t.name.endswith("fixed_8192")
    assert tasks.select_tasks(["H64_varlen_mixed"])[0].seq_lens == (1300, 547, 2048, 963, 271, 3063)
    assert tasks.select_tasks(["H96_varlen_1024x8"])[0].seq_lens == (1024,) * 8


def test_bytes_of_h96_fixed_by_hand():
    t = tasks.select_tasks(["H96_fixed_8192"])[0]
    T, H, D = 8192, 96, 128
    by_hand = 4 * T * H * D * 2 + T * H * 2 + T * H * D * 2 + 2 * 1 * H * D * D * 4
    assert by_hand == 1_020_788_736
    assert tasks.bytes_moved(t) == by_hand
    assert tasks.floor_ms(by_hand, 4.25e12) == pytest.approx(0.240186, abs=1e-6)   # KDA.md: 0.24 ms
    mixed = tasks.select_tasks(["H96_varlen_mixed"])[0]
    assert tasks.bytes_moved(mixed) == by_hand + 5 * 2 * H * D * D * 4                # five more states


def test_floors_reproduce_recorded_peer_floors():
    peers = tasks.load_peers()
    bw = peers["copy_bandwidth_TBps"] * 1e12
    for t in tasks.default_tasks():
        # the recorded bandwidth is rounded to 4.25 TB/s, hence a relative tolerance
        assert tasks.floor_ms(tasks.bytes_moved(t), bw) == pytest.approx(peers["tasks_ms"][t.name]["floor"],
                                                                         rel=1e-3)
    gm = tasks.geomean(tasks.floor_ms(tasks.bytes_moved(t), bw) for t in tasks.default_tasks())
    assert gm == pytest.approx(peers["geomean_ms"]["floor"], rel=1e-3)


def test_geomean_by_hand():
    assert tasks.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert tasks.geomean([2.0, 8.0, 4.0]) == pytest.approx(4.0)
    assert tasks.geomean([3.0]) == pytest.approx(3.0)
    assert tasks.geomean([]) is None
    for bad in ([1.0, 0.0], [1.0, -2.0], [float("nan")], [float("inf")]):
        with pytest.raises(ValueError):
            tasks.geomean(bad)
    peers = tasks.load_peers()
    rec = [v["flashkda"] for v in peers["tasks_ms"].values()]
    assert tasks.geomean(rec) == pytest.approx(peers["geomean_ms"]["flashkda"], abs=1e-4)


def test_summary_speedups_and_geomeans_by_hand():
    fk = [0.5, 0.4, 0.4, 0.25, 0.25, 0.2]
    fla = [2.0, 1.6, None, 0.5, 1.0, 0.8]            # invalid on the third task
    res = fake_result({"fastkda": fk, "fla": fla})
    s = report.summary(res)
    # speedups 4, 4, -, 2, 4, 4 -> geomean (4^4 * 2)^(1/5)
    assert s["speedup"]["fla"]["value"] == pytest.approx((4 ** 4 * 2) ** 0.2)
    assert s["speedup"]["fla"]["n_tasks"] == 5 and not s["speedup"]["fla"]["complete"]
    assert s["impls"]["fastkda"]["time_ms"] == pytest.approx(math.prod(fk) ** (1 / 6))
    assert s["impls"]["fastkda"]["complete"]
    floors = [tr.floor_ms for tr in res.tasks]
    assert s["impls"]["fastkda"]["fraction_of_floor"] == pytest.approx(
        math.prod(f / x for f, x in zip(floors, fk)) ** (1 / 6))
    # recorded FlashKDA stands in (flash_kda not installed, device an H200)
    rec = [tasks.recorded_ms(t.name) for t in tasks.default_tasks()]
    assert rec[0] == pytest.approx(1.4004)
    assert s["speedup_vs_recorded"]["flashkda"]["value"] == pytest.approx(
        math.prod(r / x for r, x in zip(rec, fk)) ** (1 / 6))


def test_table_marks_invalid_and_recorded():
    res = fake_result({"fastkda": [0.5] * 6, "fla": [2.0, 2.0, None, 2.0, 2.0, 2.0]})
    table = report.format_table(res)
    lines = table.splitlines()
    row = next(line for line in lines if line.startswith("| H96_varlen_1024x8"))
    assert "INVALID" in row
    assert "INVALID fla on H96_varlen_1024x8" in table
    assert "recorded, not measured" in table
    assert "4.00x" in next(line for line in lines if line.startswith("| H96_fixed_8192"))   # 2.0 / 0.5
    assert "2.80x" in next(line for line in lines if line.startswith("| H96_fixed_8192"))   # 1.4004 / 0.5
    assert lines[len(tasks.default_tasks()) + 2].startswith("| geomean")
    # on another device the recorded H200 figures are named as not comparable, and no speedup is given
    other = report.format_table(fake_result({"fastkda": [0.5] * 6}, device_name="NVIDIA A100"))
    assert "not comparable" in other and "speedup vs FlashKDA" not in other
    # with flash_kda measured, the recorded figures are not used
    measured = fake_result({"fastkda": [0.5] * 6, "flash_kda": [1.0] * 6})
    assert "recorded, not measured" not in report.format_table(measured)
    assert report.summary(measured)["speedup"]["flash_kda"]["value"] == pytest.approx(2.0)


def test_table_names_host_bound_timings():
    # A timing whose host time per call reaches 90% of the measured time is named host-bound, with both
    # numbers; one well below it is not.
    res = fake_result({"fastkda": [0.5] * 6, "fla": [2.0] * 6})
    fixed = res.tasks[0]
    fixed.results["fastkda"].timing.host_ms = 0.46          # 92% of 0.5
    fixed.results["fla"].timing.host_ms = 1.0               # 50% of 2.0
    table = report.format_table(res)
    note = next(line for line in table.splitlines() if line.startswith("host-bound"))
    assert "fastkda on H96_fixed_8192 (0.460 of 0.500 ms)" in note and "fla" not in note
    assert "host-bound" not in report.format_table(fake_result({"fastkda": [0.5] * 6}))
    assert report.to_dict(res)["tasks"][0]["results"]["fastkda"]["timing"]["host_ms"] == 0.46


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_timing_measures_host_time_per_call():
    # A call that only sleeps on the host is host-bound: its host time is about its measured time.
    st = timing.time_cuda(lambda: time.sleep(2e-3), warmup=1, repeats=6, rounds=2)
    assert 1.5 <= st.host_ms <= st.median_ms * 1.5 and st.median_ms >= 1.5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_timing_replays_the_gpu_work_without_the_host_work():
    # A call that sleeps 2 ms on the host and adds on the GPU: eager it takes >= 2 ms; replayed from a graph
    # the sleep happened once, at capture, and each replay still adds (the GPU work is what is timed).
    x = torch.zeros(1 << 20, device="cuda")

    def call():
        time.sleep(2e-3)
        x.add_(1.0)
    st = timing.time_cuda_graph(call, warmup=2, repeats=20, rounds=2)
    torch.cuda.synchronize()
    assert st.method == "cuda_graph_replay" and st.n == 20 and st.warmup == 2
    assert st.median_ms < 0.5
    # 2 warm-up calls, 1 on the side stream, 1 replay after capture, 20 timed replays (the capture adds none)
    assert float(x[0]) == 2 + 1 + 1 + 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_benchmark_times_fastkda_from_a_graph():
    # fastkda is capturable (no host synchronisation): validated eagerly, then timed by graph replay.
    task = Task("H4_varlen_small", 4, (300, 17, 700))
    res = run_benchmark([task], [bimpls.fastkda_impl()], device="cuda", warmup=2, repeats=10, bandwidth=BW,
                        progress=None, timing="graph")
    r = res.tasks[0].results["fastkda"]
    assert r.status == "ok", r.error
    assert r.timing.method == "cuda_graph_replay" and res.settings["timing_method"] == "cuda_graph_replay"
    assert 0 < r.timing.median_ms < 1.0


def test_graph_timing_needs_cuda(monkeypatch, capsys):
    with pytest.raises(ValueError, match="needs a CUDA device"):
        timing.timer_for("cpu", "graph")
    with pytest.raises(ValueError, match="expected one of"):
        timing.timer_for("cpu", "graphs")
    assert timing.timer_for("cpu") is timing.time_host
    assert main(["--device", "cpu", "--timing", "graph", "--tasks", "H4_fixed_512"]) == 2
    assert "--timing graph needs a CUDA device" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------
# inputs and implementations


def test_make_inputs_protocol():
    t = tasks.Task("t", 3, (100, 0, 60))
    x = tasks.make_inputs(t, "cpu", seed=5)
    assert x.q.shape == (1, 160, 3, 128) and x.q.dtype == torch.bfloat16
    assert x.beta.shape == (1, 160, 3) and x.beta.dtype == torch.bfloat16
    assert x.A_log.shape == (3,) and x.dt_bias.shape == (3, 128) and x.A_log.dtype == torch.float32
    assert x.initial_state.shape == (3, 3, 128, 128) and x.initial_state.dtype == torch.float32
    assert x.cu_seqlens.tolist() == [0, 100, 100, 160] and x.cu_seqlens.dtype == torch.int32
    assert x.cu_seqlens_long.dtype == torch.int64
    assert 0 <= float(x.A_log.min()) and float(x.dt_bias.max()) < 1
    assert abs(float(x.q.float().std()) - 1) < 0.05 and abs(float(x.initial_state.std()) - 0.1) < 0.005
    y = tasks.make_inputs(t, "cpu", seed=5)
    z = tasks.make_inputs(t, "cpu", seed=6)
    assert torch.equal(x.v, y.v) and not torch.equal(x.v, z.v)
    f = tasks.make_inputs(TINY_FIXED, "cpu", seed=0)
    assert f.cu_seqlens is None and f.cu_seqlens_long is None and f.initial_state.shape[0] == 1


def test_bind_fwd_passes_fwd_signature():
    seen = {}

    def spy(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
            cu_seqlens=None):
        seen.update(locals())

    x = tasks.make_inputs(TINY, "cpu", seed=0)
    call = bind_fwd(spy, x)
    call()
    assert seen["scale"] == pytest.approx(128 ** -0.5) and seen["lower_bound"] == -5.0
    assert seen["q"] is x.q and seen["beta"] is x.beta and seen["A_log"] is x.A_log
    assert seen["initial_state"] is x.initial_state and seen["final_state"] is not x.initial_state
    assert seen["out"].shape == x.v.shape and seen["final_state"].shape == x.initial_state.shape
    assert seen["cu_seqlens"].dtype == torch.int32
    out_before = seen["out"]
    call()
    assert seen["out"] is out_before                        # buffers allocated once, outside the timed calls


def test_impls_resolution(monkeypatch):
    monkeypatch.setenv("FLA_FLASH_KDA", "1")
    found = bimpls.resolve_impls(["fastkda:fwd"])
    names = [i.name for i in found]
    assert names[:3] == ["fastkda", "flash_kda", "fla"] and names[3] == "fastkda:fwd"
    assert found[0].fwd is fastkda.fwd and found[3].fwd is fastkda.fwd
    assert os.environ["FLA_FLASH_KDA"] == "0"               # set before fla is (tried to be) imported
    for i in found[1:3]:
        try:
            __import__({"flash_kda": "flash_kda", "fla": "fla"}[i.name])
        except ImportError:
            assert not i.available and "not installed" in i.reason
    for bad in ("fastkda", "nonexistent_module_xyz:fwd", "fastkda:no_such_fn", ":fwd"):
        with pytest.raises(ValueError):
            custom_impl(bad)


def test_flash_kda_is_used_when_importable(monkeypatch):
    # An importable flash_kda is benchmarked side by side (its fwd, its version), not reported missing.
    fake = types.ModuleType("flash_kda")
    fake.fwd = lambda *args, **kwargs: None
    fake.__version__ = "9.9"
    monkeypatch.setitem(sys.modules, "flash_kda", fake)
    impl = bimpls.flash_kda_impl()
    assert impl.available and impl.fwd is fake.fwd and impl.version == "9.9", impl.reason


# --------------------------------------------------------------------------------------------------------
# the validation gate


def test_gate_with_real_quick_check():
    """The real quick_check passes fastkda and rejects an implementation that writes zeros, which is never timed."""
    from fastkda.validation import quick_check
    zeros_fwd.calls = 0
    timer = CountingTimer()
    impls = [bimpls.fastkda_impl(), Impl(name="zeros", fwd=zeros_fwd)]
    res = run_benchmark([TINY, TINY_FIXED], impls, device="cpu", warmup=0, repeats=2, quick_check=quick_check,
                        timer=timer, bandwidth=BW, progress=None)
    for tr in res.tasks:
        bad = tr.results["zeros"]
        assert bad.status == "invalid" and bad.timing is None and bad.ms is None
        assert bad.validation["passed"] is False and bad.validation["out_err"] > 0.5
        assert "5e-03" in bad.error or "rel" in bad.error
        good = tr.results["fastkda"]
        assert good.status == "ok" and good.timing.n == 2 and good.validation["passed"] is True
        assert good.validation["seed"] is not None
    assert len(timer.timed) == 2                              # fastkda on each task, never zeros
    assert zeros_fwd.calls == 2 * 2                           # by validation only: two calls per task (the gate's repeat)
    d = report.to_dict(res)
    assert d["tasks"][0]["results"]["zeros"]["time_ms"] is None
    assert d["tasks"][0]["results"]["zeros"]["status"] == "invalid"
    assert "INVALID" in report.format_table(res)


def test_gate_crash_and_failed_case_are_invalid_and_untimed():
    zeros_fwd.calls = 0
    timer = CountingTimer()

    def judge(impl, *, seq_lens, H, D=128, device="cpu", seed=None):
        if impl is zeros_fwd:
            return FakeCase("quick", "q", "s", 3, 1.0, 1.0, 2.0, False, "out rel L2 1.00e+00 > 5e-03")
        raise RuntimeError("kernel crashed")

    impls = [Impl(name="zeros", fwd=zeros_fwd), Impl(name="crashes", fwd=zeros_fwd.__call__)]
    res = run_benchmark([TINY], impls, device="cpu", warmup=1, repeats=3, quick_check=judge, timer=timer,
                        bandwidth=BW, progress=None)
    r = res.tasks[0].results
    assert r["zeros"].status == "invalid" and "seed=3" in r["zeros"].error
    assert r["crashes"].status == "invalid" and "kernel crashed" in r["crashes"].error
    assert timer.timed == [] and zeros_fwd.calls == 0


def test_missing_quick_check_refuses_to_time(monkeypatch):
    monkeypatch.delattr(fastkda.validation, "quick_check", raising=False)
    with pytest.raises(RuntimeError, match="quick_check"):
        run_benchmark([TINY], [bimpls.fastkda_impl()], device="cpu", bandwidth=BW, progress=None)


# --------------------------------------------------------------------------------------------------------
# timing


def test_host_timer_and_rounds():
    n = {"calls": 0}

    def f():
        n["calls"] += 1

    st = timing.time_host(f, warmup=2, repeats=7)
    assert n["calls"] == 9 and st.n == 7 and st.method == "host_clock"
    assert st.min_ms <= st.p10_ms <= st.median_ms <= st.p90_ms <= st.max_ms
    assert timing._round_sizes(300, 3) == [100, 100, 100]
    assert sum(timing._round_sizes(301, 3)) == 301 and timing._round_sizes(2, 3) == [1, 1]
    s = timing.summarize([3.0, 1.0, 2.0, 10.0], warmup=0, rounds=1, method="x")
    assert s.median_ms == 2.5 and s.mean_ms == 4.0 and s.min_ms == 1.0 and s.max_ms == 10.0
    bw = timing.copy_bandwidth("cpu", nbytes=4 << 20, repeats=3)
    assert bw.bytes_counted == 2 * bw.buffer_bytes == 8 << 20 and bw.bytes_per_s > 0


# --------------------------------------------------------------------------------------------------------
# JSON and CLI


def _check_schema(d, task_names, impl_names):
    assert d["schema"] == report.SCHEMA
    assert isinstance(d["label"], str) and isinstance(d["suite"], str)
    env = d["environment"]
    for key in ("device", "device_name", "sm_count", "driver_version", "cuda", "torch", "triton",
                "git_commit", "date"):
        assert key in env
    assert isinstance(env["torch"], str) and isinstance(env["git_commit"], str) and env["git_commit"]
    for key in ("warmup", "repeats", "rounds", "seed", "timing_method"):
        assert isinstance(d["settings"][key], (int, str))
    assert d["copy_bandwidth"]["bytes_per_s"] > 0 and d["copy_bandwidth"]["bytes_counted"] > 0
    assert [i["name"] for i in d["implementations"]] == impl_names
    assert [t["name"] for t in d["tasks"]] == task_names
    for t in d["tasks"]:
        for key, typ in (("H", int), ("D", int), ("T", int), ("seq_lens", list), ("seed", int), ("bytes", int),
                         ("floor_ms", float), ("results", dict), ("speedup", dict), ("recorded_h200_ms", dict)):
            assert isinstance(t[key], typ), key
        assert set(t["results"]) == set(impl_names)
        for r in t["results"].values():
            assert r["status"] in report.STATUSES
            if r["status"] == "ok":
                assert isinstance(r["time_ms"], float) and r["time_ms"] > 0
                assert isinstance(r["fraction_of_floor"], float)
                assert r["timing"]["n"] == d["settings"]["repeats"]
                assert r["validation"]["passed"] is True and "seed" in r["validation"]
            else:
                assert r["time_ms"] is None and r["timing"] is None and r["error"]
    assert isinstance(d["geomean"]["floor_ms"], float) and "fastkda" in d["geomean"]["impls"]
    assert isinstance(d["recorded"]["comparable"], bool)


def test_json_schema(tmp_path):
    res = run_benchmark([TINY_FIXED, TINY], [bimpls.fastkda_impl(), Impl(name="zeros", fwd=zeros_fwd)],
                        device="cpu", warmup=0, repeats=2, quick_check=passing_quick_check, bandwidth=BW,
                        progress=None)
    path = report.write_json(res, tmp_path / "sub" / "r.json")
    d = json.loads(path.read_text())
    _check_schema(d, ["tiny_fixed", "tiny_varlen"], ["fastkda", "zeros"])
    assert d["tasks"][1]["speedup"]["zeros"] is not None
    assert d["tasks"][1]["seed"] == 1 and d["tasks"][0]["seed"] == 0       # inputs regenerated per task
    assert d["label"] == tasks.CPU_LABEL


def test_cli_on_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fastkda.validation, "quick_check", passing_quick_check)
    out = tmp_path / "cli.json"
    rc = main(["--device", "cpu", "--tasks", "H4_varlen_128x4", "--repeats", "2", "--warmup", "0",
               "--json", str(out)])
    captured = capsys.readouterr()
    assert rc == 0
    assert "| H4_varlen_128x4" in captured.out and tasks.CPU_LABEL in captured.out
    assert "[1/1] H4_varlen_128x4 fastkda: validating... timing..." in captured.err
    d = json.loads(out.read_text())
    _check_schema(d, ["H4_varlen_128x4"], ["fastkda", "flash_kda", "fla"])
    assert d["environment"]["device_type"] == "cpu" and d["settings"]["repeats"] == 2
    png = out.with_suffix(".png")
    if importlib.util.find_spec("matplotlib") is not None:
        assert png.exists() and png.stat().st_size > 0
    else:
        assert not png.exists() and "matplotlib is not installed" in captured.out


def test_cli_default_paths_and_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fastkda.validation, "quick_check", passing_quick_check)
    rc = main(["--device", "cpu", "--tasks", "H4_fixed_512", "--repeats", "1", "--warmup", "0", "--no-png",
               "--out-dir", str(tmp_path), "--no-peers"])
    assert rc == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert len(written) == 1 and written[0].startswith("bench-cpu-") and written[0].endswith(".json")
    assert main(["--device", "cpu", "--tasks", "no_such_task"]) == 2
    assert main(["--device", "cpu", "--impl", "not_a_spec"]) == 2
    assert "no_such_task" in capsys.readouterr().err
    assert main(["--list"]) == 0
    assert "H96_fixed_8192" in capsys.readouterr().out


def test_cli_exit_status_when_fastkda_is_invalid(tmp_path, monkeypatch):
    def failing(impl, *, seq_lens, H, D=128, device="cpu", seed=None):
        return FakeCase("quick", "q", "s", 1, 1.0, 1.0, 1.0, False, "wrong")

    monkeypatch.setattr(fastkda.validation, "quick_check", failing)
    rc = main(["--device", "cpu", "--tasks", "H4_fixed_512", "--no-png", "--json", str(tmp_path / "x.json"),
               "--no-peers"])
    assert rc == 1
    d = json.loads((tmp_path / "x.json").read_text())
    assert d["tasks"][0]["results"]["fastkda"]["status"] == "invalid"


def test_named_commit_wins_over_a_stale_git_folder(monkeypatch):
    # A copied working tree can carry an old .git: the commit its copier names is the one recorded.
    monkeypatch.setenv("FASTKDA_GIT_COMMIT", "0123456789abcdef")
    assert report.git_commit() == "0123456789abcdef"
    assert report.git_dirty() is None
    monkeypatch.delenv("FASTKDA_GIT_COMMIT")
    assert report.git_commit() != "0123456789abcdef"
