"""benchmarks/stage1_agreement.py: its float64 model of stage 1's a1 is the Triton kernel's math in the kernel's
layout (fp32 stage tensors, where no bf16 rounding hides a wrong row or factor), the one-piece rounding of the gate
moves it by a little and only with the gate, and the report has its keys (on the CPU: the Triton kernel only)."""

import math

import pytest
import torch

from conftest import benchmark_script


def _tool():
    return benchmark_script("stage1_agreement")


def test_the_model_is_the_triton_stage1_in_its_layout():
    # packed sequences with an empty one and a partial last chunk; GVA (HV = 2 H); fp32 inputs: fp32 stage tensors
    tool = _tool()
    x = tool.case_inputs(64, (40, 0, 7), 1, 2, (True, True, True), seed=3, dtype=torch.float32)
    st = tool.run_stage1(x, gluon=False)
    model = tool.stage1_model(x)
    assert model.shape == (2, 3, 64, 64) and int(st.chunk_offsets[-1]) == 3     # (more slots: a bound)
    a1 = st.a1[:, :3].double()
    assert float((a1 - model).norm() / model.norm()) < 1e-5           # measured 8e-7: fp32 sums and exponentials
    # the padding rows of the partial chunks (8 of 40 tokens' second chunk, 7 of 32) are zero in both
    assert torch.count_nonzero(model[:, 1, 8:32]) == 0 and torch.count_nonzero(model[:, 2, 32 + 7:]) == 0
    assert torch.count_nonzero(a1[:, 1, 8:32]) == 0


def test_the_one_piece_gate_moves_the_model_a_little_and_only_with_the_gate():
    tool = _tool()
    gated = tool.case_inputs(64, (33,), 1, 1, (True, True, True), seed=5, dtype=torch.float32)
    d = tool.stage1_model(gated, gate_fp16=True) - tool.stage1_model(gated)
    rel = float(d.norm() / tool.stage1_model(gated).norm())
    assert 1e-6 < rel < 2.0 ** -11 * 32                     # at most u per step over a chunk's steps
    plain = tool.case_inputs(64, (33,), 1, 1, (True, False, False), seed=5, dtype=torch.float32)
    assert torch.equal(tool.stage1_model(plain, gate_fp16=True), tool.stage1_model(plain))


def test_the_report_has_the_triton_rows_on_the_cpu():
    tool = _tool()
    lines = []
    rows = tool.agreement(cases=((64, (9,), 1, 1, (True, True, True)),), seed=1, device="cpu", log=lines.append)
    assert len(rows) == 1 and len(lines) == 1 and "triton_vs_model" in lines[0]
    row = rows[0]
    assert "gluon_vs_triton" not in row and math.isfinite(row["triton_vs_model"]) and row["one_piece_in_bf16"] >= 0
