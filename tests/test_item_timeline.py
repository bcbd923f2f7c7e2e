"""benchmarks/item_timeline.py: the stamps go into the library's fused kernel where they should (or the tool says
which edit no longer applies), the stamped kernel compiles for Hopper, and the phases come out of the stamps right."""

import ast

import pytest
import torch

from conftest import HAS_CUDA, benchmark_script, compile_stamped_fused


def _tool():
    return benchmark_script("item_timeline")


def test_the_stamps_go_into_the_library_kernel():
    tool = _tool()
    out = tool.stamped_source(tool.KERNEL_SOURCE.read_text())
    ast.parse(out)
    calls = out.count("_stamp(stamps, ") - out.count("def _stamp(stamps, ")
    assert calls == 7 and out.count("    _stamp_smid(stamps)") == 1
    for event in ("_stamp(stamps, 4)", "_stamp(stamps, 5)", "_stamp(stamps, 6 + P)", "_stamp(stamps, 1)",
                  "_stamp(stamps, gl.where(c == n_chunks - 1, 127, 8 + c))", "_stamp(stamps, 2)", "_stamp(stamps, 3)"):
        assert event in out, event
    assert "from ." not in out                       # imported from a temporary folder
    assert "PRODUCER_REGS: gl.constexpr, stamps):" in out and out.count("LOG2_BT, stamps)),") == 2


def test_a_changed_kernel_is_refused_naming_the_edit():
    tool = _tool()
    source = tool.KERNEL_SOURCE.read_text().replace(
        "        mbarrier.arrive(free.index(p), count=1)\n    if STORE_HT:", "    if STORE_HT:")
    with pytest.raises(ValueError, match=r"edit 'loop end \(2\)' occurs 0 times, expected 1"):
        tool.stamped_source(source)


def _synthetic(starts_ns, sms, n, clock_ghz=2.0):
    """Stamps of programs with the given starts and SMs, n chunks each, fixed phases (ns)."""
    events = {4: 0, 5: 3000, 8: 8000, 2: 8000 + (n - 1) * 2500 + 1400}
    for c in range(1, n - 1):
        events[8 + c] = 8000 + c * 2500
    events[127] = 8000 + (n - 1) * 2500
    events[3] = events[2] + 1100
    rows = []
    for start, sm in zip(starts_ns, sms):
        gt = torch.zeros(128, dtype=torch.int64)
        gt[1] = start
        for e, t in events.items():
            gt[e] = start + t
        ck = (gt.double() * clock_ghz).long()
        gt[0] = ck[0] = sm
        rows.append(torch.cat([gt, ck]))
    return torch.stack(rows), events


def test_summarize_recovers_the_phases_waves_and_gaps():
    tool = _tool()
    n = 6
    first, ev = _synthetic([0, 100], [0, 1], n)
    end = ev[3]
    stamps = torch.cat([first, _synthetic([end + 1500, 100 + end + 2500], [0, 1], n)[0]])
    out = tool.summarize(stamps, [n] * 4)
    assert out["sm_clock_ghz"] == pytest.approx(2.0)
    assert out["sms"] == 2 and out["gap_us"] == pytest.approx(2.0) and out["gap_max_us"] == pytest.approx(2.5)
    med = out["median"]
    assert med["first_inputs"] == pytest.approx(3.0) and med["first_ready"] == pytest.approx(8.0)
    assert med["period"] == pytest.approx(2.5) and med["last_chunk"] == pytest.approx(1.4)
    assert med["final_state"] == pytest.approx(1.1)
    assert med["program"] == pytest.approx(end / 1e3)
    assert [w["programs"] for w in out["waves"]] == [2, 2]
    assert out["waves"][1]["start_us"] == pytest.approx((end + 1500 + end + 2600) / 2 / 1e3)


def test_programs_take_the_longest_sequences_first():
    tool = _tool()
    from fastkda.bench.tasks import Task
    assert tool.program_chunks(Task("t", 2, (40, 100, 7))) == [4, 4, 2, 2, 1, 1]
    assert tool.program_chunks(Task("f", 3, (65,), fixed=True)) == [3, 3, 3]


def test_the_stamped_kernel_compiles_for_sm90():
    run = compile_stamped_fused('import item_timeline; k = item_timeline.load_stamped_kernel()')
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout + run.stderr[-3000:]


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_the_timeline_of_a_packed_task_on_the_gpu():
    tool = _tool()
    out = tool.timeline("H64_varlen_1024x8", rounds=1, repeats=20)
    assert out["bitwise_equal"]
    med = out["median"]
    assert 0 < med["first_inputs"] < med["first_ready"] < med["program"]
    assert 0.5 < med["period"] < 20 and len(out["rows"]) == 8 * 64
