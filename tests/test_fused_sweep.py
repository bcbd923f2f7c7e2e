"""benchmarks/fused_sweep.py: shapes parse strictly, and each row's verdict says whether the dispatch rule picked the
faster route (the point of the sweep)."""

import pytest
import torch

from fastkda import kernels

from conftest import HAS_CUDA, benchmark_script


def _tool():
    return benchmark_script("fused_sweep")


def test_shapes_parse_and_bad_ones_are_refused():
    tool = _tool()
    assert tool.parse_shape("H32x8x1024") == (32, (1024,) * 8, False)
    assert tool.parse_shape(" H96x2x2048 ") == (96, (2048, 2048), False)
    assert tool.parse_shape("H4x1x8192+2x300") == (4, (8192, 300, 300), False)
    assert tool.parse_shape("H64xB2x4096") == (64, (4096, 4096), True)
    for bad in ("32x8x1024", "H32x8", "H0x8x1024", "H32x8x1024x2", "Hax8x1024", "H4x1x8192+", "H4x0x64",
                "H4x1x8192+2x0", "H64xB2x4096+1x5", "H64xB0x4096"):
        with pytest.raises(ValueError, match="shape: expected H<heads>x<sequences>x<tokens>"):
            tool.parse_shape(bad)
    for shape in tool.DEFAULT_SHAPES:
        tool.parse_shape(shape)


def test_the_verdict_compares_the_rule_with_the_faster_route():
    tool = _tool()
    sm = 132
    # 512 programs of 1,024 tokens: the rule picks the fused kernel
    assert kernels.fused_by_rule(8, 64, 8 * 1024, sm, packed=True)
    right = tool.verdict(64, (1024,) * 8, False, fused_ms=0.40, two_stage_ms=0.45, sm_count=sm)
    assert right["rule_picks"] == "fused" and right["faster"] == "fused" and right["rule_right"]
    assert right["programs"] == 512 and right["fused_vs_two_stages"] == pytest.approx(0.40 / 0.45 - 1)
    wrong = tool.verdict(64, (1024,) * 8, False, fused_ms=0.50, two_stage_ms=0.45, sm_count=sm)
    assert wrong["faster"] == "two stages" and not wrong["rule_right"]
    # fixed-length, 140 programs: two waves 0.53 full, the rule keeps the two stages
    assert not kernels.fused_by_rule(2, 70, 2 * 2048, sm, packed=False)
    missed = tool.verdict(70, (2048, 2048), True, fused_ms=0.20, two_stage_ms=0.25, sm_count=sm)
    assert missed["rule_picks"] == "two stages" and not missed["rule_right"]
    assert tool.verdict(70, (2048, 2048), True, fused_ms=0.30, two_stage_ms=0.25, sm_count=sm)["rule_right"]
    # ... 128 programs fill one wave: fused; packed, the same 128 programs keep the two stages
    assert tool.verdict(64, (2048, 2048), True, fused_ms=0.2, two_stage_ms=0.3, sm_count=sm)["rule_picks"] == "fused"
    assert tool.verdict(64, (2048, 2048), False, fused_ms=0.2, two_stage_ms=0.3,
                        sm_count=sm)["rule_picks"] == "two stages"
    # one long sequence among 100 short ones, 404 programs: fused by the average, two stages knowing the lengths
    skew = tool.verdict(4, (8192,) + (300,) * 100, False, fused_ms=0.72, two_stage_ms=0.30, sm_count=sm)
    assert skew["rule_picks"] == "fused" and not skew["rule_right"]
    assert skew["rule_picks_knowing_lengths"] == "two stages" and skew["rule_right_knowing_lengths"]
    assert right["rule_picks_knowing_lengths"] == "fused"


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal without a GPU")
def test_without_a_gpu_the_sweep_refuses_clearly():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        _tool().run(["H8x2x64"])


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.get_device_capability()[0] != 9, reason="the fused kernel is Hopper's")
def test_both_routes_agree_bitwise_and_are_timed():
    tool = _tool()
    row = tool.measure("H16x24x100+3x40", repeats=3, rounds=1, seed=0)
    assert row["bitwise_equal"] and row["N"] == 27 and row["tokens"] == 24 * 100 + 3 * 40
    assert row["fused_ms"] > 0 and row["two_stages_ms"] > 0 and len(row["fused_rounds"]) == 1
    row = tool.measure("H4xB3x100", repeats=3, rounds=1, seed=0, graph=True)
    assert row["bitwise_equal"] and row["fixed_length"] and row["timing"] == "graph"
    assert row["fused_ms"] > 0 and row["two_stages_ms"] > 0 and len(row["fused_rounds"]) == 1
    assert "fused_packed_ms" not in row
    # a fixed-length batch also through the fused kernel's packed specialisation: the same bits
    row = tool.measure("H4xB3x100", repeats=3, rounds=1, seed=0, graph=True, fixed_as_packed=True)
    assert row["bitwise_equal"] and row["fused_packed_bitwise_equal"] and row["fused_packed_ms"] > 0
    assert len(row["fused_packed_rounds"]) == 1
    assert "fused_packed_ms" not in tool.measure("H16x24x100", repeats=3, rounds=1, seed=0, fixed_as_packed=True)
    for graph in (False, True):                      # sustained by eager calls, or by graph replays
        row = tool.measure("H4xB3x100", repeats=3, rounds=1, seed=0, graph=graph, sustain_s=0.2)
        assert row["bitwise_equal"] and row["sustain_s"] == 0.2
        if tool.read_clock_and_power() is not None:  # the load under sustained calls, where nvidia-smi reads it
            assert row["fused_clock_mhz"] > 0 and row["two_stages_power_w"] > 0


def test_sustain_runs_the_call_in_batches_for_its_time_and_reads_the_load_after_the_first():
    tool = _tool()
    calls, syncs = [], []
    readings = iter([(1980.0, 650.0), None, (1755.0, 694.0), (1700.0, 690.0)])
    now = [0.0]

    def call():                                      # each call takes 1 ms of the fake clock: 7 ms a batch
        calls.append(1)
        now[0] += 0.001
    got = tool.sustain(call, 0.03, batch=7, read=lambda: next(readings), sync=lambda: syncs.append(len(calls)),
                       clock=lambda: now[0])
    assert syncs == [7, 14, 21, 28, 35]              # whole batches, then a sync, until 30 ms have passed
    # the first batch starts from idle: not read; a failed reading (None) is skipped
    assert got == [(1980.0, 650.0), (1755.0, 694.0), (1700.0, 690.0)]
    assert tool.sustain(call, 0.0, sync=lambda: None) == [] and len(calls) == 35


def test_clock_and_power_are_none_without_nvidia_smi(monkeypatch):
    tool = _tool()
    monkeypatch.setattr(tool.shutil, "which", lambda name: None)
    assert tool.read_clock_and_power() is None


def test_a_negative_sustain_is_refused():
    with pytest.raises(SystemExit, match="--sustain must be >= 0 seconds, got -1.0"):
        _tool().main(["--sustain", "-1", "--shapes", "H8x2x64"])
