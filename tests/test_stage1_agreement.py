"""benchmarks/stage1_agreement.py: its float64 model of stage 1 is the Triton kernel's math in the kernel's layouts
(fp32 stage tensors, where no bf16 rounding hides a wrong row or factor), its rounded form rounds where the kernels
do, the one-piece rounding of the gate moves it only with the gate, and the report has its keys (on the CPU: the
Triton kernel only)."""

import math

import pytest
import torch

from conftest import benchmark_script


def _tool():
    return benchmark_script("stage1_agreement")


@pytest.mark.parametrize("flags", [(True, True, True), (False, False, True)])
def test_the_model_is_the_triton_stage1_in_its_layouts(flags):
    # packed sequences with an empty one and a partial last chunk; GVA (HV = 2 H); fp32 inputs: fp32 stage tensors
    tool = _tool()
    x = tool.case_inputs(64, (40, 0, 7), 1, 2, flags, seed=3, dtype=torch.float32)
    st = tool.run_stage1(x, gluon=False)
    model = tool.stage1_model(x)
    assert model["a1"].shape == (2, 3, 64, 64) and int(st.chunk_offsets[-1]) == 3     # (more slots: a bound)
    got = tool.kernel_tensors(st, 3)
    for name in tool.TENSORS:
        assert got[name].shape == model[name].shape, name
        # measured 2e-8..9e-7: fp32 sums and exponentials
        assert tool.relative_l2(got[name], model[name]) < 1e-5, name
    # the padding rows of the partial chunks (8 of 40 tokens' second chunk, 7 of 32) are zero in both
    assert torch.count_nonzero(model["a1"][:, 1, 8:32]) == 0 and torch.count_nonzero(model["a1"][:, 2, 32 + 7:]) == 0
    assert torch.count_nonzero(got["a1"][:, 1, 8:32]) == 0 and torch.count_nonzero(got["kt"][:, 1, 8:]) == 0


def test_the_rounded_model_rounds_the_stored_tensors_to_bf16_and_the_operands_inside():
    tool = _tool()
    x = tool.case_inputs(64, (33,), 1, 1, (True, True, True), seed=5)
    exact, rounded = tool.stage1_model(x), tool.stage1_model(x, rounded=True)
    bf16 = lambda t: t.to(torch.bfloat16).double()
    for name in ("a1", "aqk", "kt"):
        assert torch.equal(rounded[name], bf16(rounded[name])), name
    # Qg and kt are the exact values rounded once; −W and Aqk also carry their operands' roundings
    assert torch.equal(rounded["a1"][:, :, 32:], bf16(exact["a1"][:, :, 32:]))
    assert torch.equal(rounded["kt"], bf16(exact["kt"]))
    for name, rows in (("a1", slice(0, 32)), ("aqk", slice(None))):
        assert not torch.equal(rounded[name][:, :, rows], bf16(exact[name][:, :, rows])), name
    assert torch.equal(rounded["gl"], exact["gl"])


def test_the_one_piece_gate_moves_the_model_a_little_and_only_with_the_gate():
    tool = _tool()
    gated = tool.case_inputs(64, (33,), 1, 1, (True, True, True), seed=5, dtype=torch.float32)
    exact = tool.stage1_model(gated)["a1"]
    rel = tool.relative_l2(tool.stage1_model(gated, gate_fp16=True)["a1"], exact)
    assert 1e-6 < rel < 2.0 ** -11 * 32                     # at most u per step over a chunk's steps
    # through the bf16 operand roundings the same change reshuffles which go up and which down: several times more
    bf = dict(rounded=True)
    shift = tool.relative_l2(tool.stage1_model(gated, gate_fp16=True, **bf)["a1"], tool.stage1_model(gated, **bf)["a1"])
    assert shift > 3 * rel
    plain = tool.case_inputs(64, (33,), 1, 1, (True, False, False), seed=5, dtype=torch.float32)
    for name, t in tool.stage1_model(plain, gate_fp16=True).items():
        assert torch.equal(t, tool.stage1_model(plain)[name]), name


def test_the_report_has_the_triton_rows_on_the_cpu():
    tool = _tool()
    lines = []
    rows = tool.agreement(cases=((64, (9,), 1, 1, (True, True, True)),), seed=1, device="cpu", log=lines.append)
    assert len(rows) == 1 and len(lines) == len(tool.TENSORS) and "triton_vs_model_bf16" in lines[0]
    for name in tool.TENSORS:
        d = rows[0][name]
        assert "gluon_vs_triton" not in d and math.isfinite(d["triton_vs_model"]) and d["one_piece_shift_bf16"] >= 0
