"""benchmarks/stage1_phases.py: stamps between the Gluon stage 1's phases, and their medians."""

import ast

import pytest
import torch

from fastkda.kernels import chunk_prepare_gluon

from conftest import benchmark_script


def _tool():
    return benchmark_script("stage1_phases")


def test_the_instrumented_source_stamps_every_phase_in_program_order(tmp_path):
    tool = _tool()
    kernel = tool.instrumented_kernel(str(tmp_path))
    assert kernel is not chunk_prepare_gluon._chunk_prepare_gluon_kernel
    (path,) = tmp_path.glob("*.py")                 # the module stage_variants.variant_module wrote
    src = path.read_text()
    ast.parse(src)
    body = src[src.index("def _chunk_prepare_gluon_kernel("):]
    order = [body.index(f"_stamp(prof + i_c * {tool.STAMPS}, {p}, i_hv == 0)") for p in range(tool.STAMPS)]
    assert order == sorted(order)                 # stamp p after stamp p - 1 in the kernel body
    assert "prof=None" in body and "from ." not in src
    # the last stamp follows the wait for the bulk stores and a barrier (every thread past them)
    assert body.index("tma.store_wait(0)") < order[-1]


def test_a_moved_anchor_stops_the_tool(tmp_path, monkeypatch):
    tool = _tool()
    monkeypatch.setattr(tool, "_AFTER", tool._AFTER + (("no such line in the kernel\n", "x\n"),))
    with pytest.raises(ValueError, match="anchor found 0 times.*no such line"):
        tool.instrumented_kernel(str(tmp_path))


def test_phase_medians_skip_unwritten_rows_and_take_medians():
    tool = _tool()
    S = tool.STAMPS
    steps = torch.tensor([[10, 20, 30, 40, 50, 60, 70], [12, 20, 30, 40, 50, 60, 70], [14, 20, 30, 40, 50, 60, 90]])
    rows = torch.cat([torch.full((3, 1), 1000), 1000 + steps.cumsum(1)], 1)
    stamps = torch.cat([rows, torch.zeros(2, S, dtype=rows.dtype)])      # two slots no program wrote
    m = tool.phase_medians(stamps)
    assert m["rows"] == 3
    assert m["inputs"] == 12 and m["gate"] == 20 and m["drain"] == 70
    assert m["program"] == float(steps.sum(1).median())
    with pytest.raises(ValueError, match="no program wrote"):
        tool.phase_medians(torch.zeros(4, S, dtype=torch.int64))


def test_one_phase_between_each_pair_of_stamps():
    tool = _tool()
    assert len(tool.PHASES) == tool.STAMPS - 1 == len(tool._AFTER) - 1
