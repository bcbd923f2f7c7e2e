"""benchmarks/error_budget.py: its float64 model without rounding is the forward itself (packed sequences, GVA, an
initial state), each rounding point rounds one value to bf16 (or the gate to fp16) and moves the output by about that
much, and the errors of independent points add in quadrature."""

import json

import pytest
import torch

from conftest import benchmark_script
from fastkda import reference
from fastkda.validation import cases, metrics


def _tool():
    return benchmark_script("error_budget")


def _inputs(lens=(40, 1, 70), H=1, HV=2, D=64, seed=7):
    return cases.model_like_inputs(torch.Generator().manual_seed(seed), list(lens), H=H, D=D, HV=HV)


def test_the_model_without_rounding_is_the_float64_recurrence():
    tool = _tool()
    x = _inputs()
    assert x.initial_state is not None and x.cu_seqlens is not None
    out, state = tool.model_forward(x, ())
    ref_out, ref_state = reference.kda_recurrence(
        x.q, x.k, x.v, x.g, x.beta, scale=x.scale, A_log=x.A_log, dt_bias=x.dt_bias, lower_bound=x.lower_bound,
        initial_state=x.initial_state, cu_seqlens=x.cu_seqlens, state_v_first=True, dtype=torch.float64)
    # chunked vs token by token in float64: ~1e-15
    assert float((out - ref_out).norm() / ref_out.norm()) < 1e-12
    assert float((state - ref_state).norm() / ref_state.norm()) < 1e-12


def test_each_point_moves_the_output_by_its_own_rounding():
    tool = _tool()
    x = _inputs(lens=(96,), HV=1)
    exact, _ = tool.model_forward(x, ())
    for p in tool.POINTS:
        got, _ = tool.model_forward(x, {p})
        rel = float((got - exact).norm() / exact.norm())
        # at most about bf16's unit roundoff 2^-9 ≈ 2e-3 (measured 1.4–1.9e-3 on the intra-chunk points; 1.5e-5 to
        # 6e-5 on those that act through this short sequence's small state, and the gate's fp16); a point that
        # rounded nothing gives 0, a wrong factor far more
        assert 1e-6 < rel < 1e-2, (p, rel)
    out, _ = tool.model_forward(x, {"out"})
    assert torch.equal(out, out.to(torch.bfloat16).double())


def test_the_budget_adds_in_quadrature_and_names_every_point():
    tool = _tool()
    x = _inputs(lens=(160,), HV=2)
    res = tool.budget(x)
    assert res["none"] < 1e-12
    assert set(res) == {"none", "all"} | {f"{w}-{p}" for p in tool.POINTS for w in ("only", "all")}
    squares = sum(res["only-" + p] ** 2 for p in tool.POINTS)
    assert abs(squares ** 0.5 / res["all"] - 1) < 0.2
    for p in tool.POINTS:                 # leaving a point out never costs more than a few % (a random draw)
        assert res["all-" + p] < 1.05 * res["all"], p


def test_a_set_of_points_left_out_is_the_model_without_them():
    tool = _tool()
    x = _inputs(lens=(70,), HV=1)
    res = tool.budget(x, without={"UO", "aqk"})
    ref = tool.budget(x)
    assert set(res) - set(ref) == {"all-aqk-UO"} and all(res[k] == ref[k] for k in ref)
    truth = reference.kda_recurrence(x.q, x.k, x.v, x.g, x.beta, scale=x.scale, A_log=x.A_log, dt_bias=x.dt_bias,
                                     lower_bound=x.lower_bound, initial_state=x.initial_state, state_v_first=True,
                                     dtype=torch.float64)[0]
    out, _ = tool.model_forward(x, set(tool.POINTS) - {"UO", "aqk"})
    floor = metrics.magnitude_floor(x.input_scale() * x.scale, truth.numel())
    assert res["all-aqk-UO"] == metrics.relative_l2(out, truth, floor)


def test_the_intra_chunk_operands_are_rounded_to_bf16_or_truncated_to_tf32():
    tool = _tool()
    t = torch.randn(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 100
    tf = tool._tf32(t)
    assert bool(((tf.float().view(torch.int32) & 0x1FFF) == 0).all())            # 10 fraction bits left
    assert bool((tf.abs() <= t.float().double().abs()).all())                      # truncated toward zero
    assert float(((tf - t) / t).abs().max()) < 2.0 ** -10
    x = _inputs(lens=(96,), HV=1)
    exact, _ = tool.model_forward(x, ())
    moved = {intra: float((tool.model_forward(x, {"UO"}, intra=intra)[0] - exact).norm() / exact.norm())
             for intra in ("tf32", "bf16")}
    # tf32 keeps 3 more bits than bf16: its truncation moves the output ~4x less than bf16's rounding to nearest
    assert 0 < moved["tf32"] < moved["bf16"] / 2, moved
    # the kernels' arithmetic is the default: Aqk rounded to bf16 once, where the product takes it
    got, _ = tool.model_forward(x, {"aqk"})
    assert not torch.equal(got, exact) and torch.equal(got, tool.model_forward(x, {"aqk"}, intra="bf16")[0])
    with pytest.raises(ValueError, match="intra: expected one of"):
        tool.model_forward(x, (), intra="fp16")


def test_the_split_output_is_the_forward_with_the_values_in_place_of_u():
    tool = _tool()
    x = _inputs()
    exact, exact_state = tool.model_forward(x, ())
    out, state = tool.model_forward(x, (), intra="split")
    # (Qg − Aqk·W)·S + (Aqk·T·diag(β))·V = Qg·S + Aqk·U exactly: the same forward to float64 rounding
    assert float((out - exact).norm() / exact.norm()) < 1e-12 and torch.equal(state, exact_state)
    # no operand Aqk or U there: those points round nothing; Qg's point rounds Qg − Aqk·W once more
    assert torch.equal(tool.model_forward(x, {"aqk", "UO"}, intra="split")[0], out)
    once, _ = tool.model_forward(x, {"qg"})
    twice, _ = tool.model_forward(x, {"qg"}, intra="split")
    assert 0 < float((once - exact).norm()) < float((twice - exact).norm())


def test_unknown_points_are_refused_by_name():
    with pytest.raises(ValueError, match="rounded: unknown rounding points"):
        _tool().model_forward(_inputs(), {"W"})
    with pytest.raises(ValueError, match="without: unknown rounding points"):
        _tool().budget(_inputs(), without={"U"})
    with pytest.raises(SystemExit):
        _tool().main(["--size", "small", "--without", "U"])


def test_the_command_line_reports_a_case_and_writes_json(tmp_path, capsys):
    path = tmp_path / "budget.json"
    assert _tool().main(["--tier", "model", "--case", "synthetic_model_varlen", "--size", "small", "--seed", "3",
                         "--json", str(path)]) == 0
    text = capsys.readouterr().out
    assert "model/synthetic_model_varlen run seed 3" in text and "aqk" in text and "intra-chunk part: bf16" in text
    data = json.loads(path.read_text())
    assert data["case"] == "synthetic_model_varlen" and data["run_seed"] == 3 and data["intra"] == "bf16"
    assert 1e-3 < data["errors"]["all"] < 1e-2 and data["errors"]["none"] < 1e-12
