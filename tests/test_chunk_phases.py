"""benchmarks/chunk_phases.py: the stamps go into the library's fused kernel at the producer's phases and the chain's
wait (or the tool names the edit that no longer applies), the stamped kernel compiles for Hopper, and the phases
come out of the stamps right."""

import ast
import re

import pytest
import torch

from conftest import HAS_CUDA, benchmark_script, compile_stamped_fused


def _tool():
    return benchmark_script("chunk_phases")


def _stamped(first=32, count=32):
    tool = _tool()
    timeline = benchmark_script("item_timeline")
    return tool, timeline.stamped_source(tool.kernel_source().read_text(), tool.edits(first, count))


def test_each_event_is_stamped_once_in_its_partition():
    tool, out = _stamped(first=5, count=7)
    ast.parse(out)
    events = [int(e) for e in re.findall(r"_tick\(stamps, c, (\d), 5, 7, 71\)", out)]   # 7 chunks of 10, the SM id
    assert sorted(events) == list(range(10))
    producer = out[out.index("def _producer("):out.index("def _store_output(")]
    chain = out[out.index("def _chain("):out.index("def _fused_kernel(")]
    assert [int(e) for e in re.findall(r"_tick\(stamps, c, (\d)", producer)] == list(range(7))
    assert [int(e) for e in re.findall(r"_tick\(stamps, c, (\d)", chain)] == [7, 8, 9]
    # the chain's wait sits between its two stamps, the producer's wait for `free` between 2 and 3
    assert re.search(r"_tick\(stamps, c, 7, [^\n]*\n\s*mbarrier.wait\(ready[^\n]*\n\s*_tick\(stamps, c, 8,", chain)
    assert re.search(r"_tick\(stamps, c, 2, [^\n]*\n\s*mbarrier.wait\(free[^\n]*\n\s*_tick\(stamps, c, 3,", producer)
    assert "from ." not in out and out.count("LOG2_BT, stamps)),") == 2
    # the chain stamps its SM once, before its loop, in the row's last column; the cycle counter by default
    assert re.search(r"\n    _stamp_smid\(stamps, 71\)\n    for c in range\(0, n_chunks\):", chain)
    assert "%clock64" in out and "%globaltimer" not in out and "%smid" in out


def test_the_global_timer_replaces_the_cycle_counter_and_a_bad_timer_is_refused():
    tool = _tool()
    timeline = benchmark_script("item_timeline")
    out = timeline.stamped_source(tool.kernel_source().read_text(), tool.edits(0, 4, timer="global"))
    ast.parse(out)
    assert "%globaltimer" in out and "%clock64" not in out
    with pytest.raises(ValueError, match="timer must be one of"):
        tool.edits(0, 4, timer="wall")


def test_a_changed_kernel_is_refused_naming_the_edit():
    tool = _tool()
    timeline = benchmark_script("item_timeline")
    source = tool.kernel_source().read_text().replace("        t0 = bos + c * BT\n", "        t0 = c * BT + bos\n")
    with pytest.raises(ValueError, match=r"edit 'loop top \(0\)' occurs 0 times, expected 1"):
        timeline.stamped_source(source, tool.edits(0, 4))


def _synthetic(n_chunks, first, count, phase=(100, 200, 300, 400, 500, 600), wait=50, work=700, period=1000):
    """Stamps of programs whose chunks follow fixed phases (cycles): the producer's six phases, then the chain waits
    `wait` for `ready` after the chunk is signalled ... (a chunk every `period` cycles)."""
    rows = []
    for n in n_chunks:
        row = torch.zeros(count, 10, dtype=torch.int64)
        for j in range(count):
            c = first + j
            if c >= n:
                break
            t = 10_000 + c * period
            e = [t]
            for d in phase:
                e.append(e[-1] + d)
            e += [e[6] - 20, e[6] + wait, e[6] + wait + work]      # chain: 7 before the wait, 8 after, 9 done
            row[j] = torch.tensor(e)
        rows.append(row.view(-1))
    return torch.stack(rows)


def test_summarize_recovers_the_phases():
    tool = _tool()
    stamps = _synthetic([40, 36, 3], first=4, count=8)     # the last program has no chunk in the window
    out = tool.summarize(stamps, [40, 36, 3], first=4, count=8, clock_ghz=2.0)
    assert out["chunks"] == 16
    cyc = out["median_cycles"]
    assert [cyc[k] for k in tool.PRODUCER_PHASES] == [100, 200, 300, 400, 500, 600]
    assert cyc["producer_chunk"] == 2100 and cyc["chunk_waits_for_chain"] == 50 and cyc["chain_wait_ready"] == 70
    assert cyc["chain_work"] == 700 and cyc["chain_period"] == 1000
    assert out["median_us"]["chain_period"] == pytest.approx(0.5)
    assert out["mean_us"]["chain_work"] == pytest.approx(0.35) and out["p90_us"]["inputs"] == pytest.approx(0.05)
    # a window past a program's end counts only its chunks
    out = tool.summarize(_synthetic([6], first=4, count=8), [6], first=4, count=8, clock_ghz=2.0)
    assert out["chunks"] == 2 and out["median_cycles"]["chain_period"] == 1000


def test_the_stamped_kernel_compiles_for_sm90():
    run = compile_stamped_fused("import chunk_phases, item_timeline\n"
                                "k = item_timeline.load_stamped_kernel(chunk_phases.kernel_source(), "
                                "chunk_phases.edits(32, 32))")
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout + run.stderr[-3000:]


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_the_phases_of_a_packed_task_on_the_gpu():
    tool = _tool()
    out = tool.phases("H64_varlen_1024x8", first=4, count=8, rounds=1, repeats=20)
    # 8 sequences × 64 heads = 512 programs of 32 chunks, each stamped in chunks 4..11
    assert out["bitwise_equal"] and out["chunks"] == 8 * 64 * 8
    cyc = out["median_cycles"]
    assert all(cyc[k] >= 0 for k in tool.PRODUCER_PHASES)
    assert 0 < cyc["chain_work"] < cyc["chain_period"] and cyc["producer_chunk"] > cyc["chain_period"]
    # every program's SM is one of the device's (four waves of 128+ programs: every SM that ran one is named)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    smids = [r["smid"] for r in out["by_program"]["programs"]]
    assert len(smids) == 8 * 64 and all(0 <= s < sms for s in smids) and len(set(smids)) > sms // 2


def test_the_mean_and_the_tail_show_slow_chunks_that_the_median_hides():
    tool = _tool()
    stamps = _synthetic([20], first=0, count=20)
    s = stamps.view(20, 10)
    s[3:, :] += 4000                                   # chunk 3 starts 4,000 cycles late: its wait for `ready` too
    s[3, 7] -= 4000                                    # (the chain came to its wait on time)
    out = tool.summarize(stamps, [20], first=0, count=20, clock_ghz=1.0)
    assert out["median_cycles"]["chain_wait_ready"] == 70
    assert out["mean_us"]["chain_wait_ready"] == pytest.approx((19 * 70 + 4070) / 20 / 1e3)
    assert out["p90_us"]["chain_period"] == pytest.approx(1.0) and out["mean_us"]["chain_period"] > 1.2


def test_by_position_shows_chunks_slowing_along_the_window():
    tool = _tool()
    stamps = _synthetic([12, 12], first=0, count=12)
    s = stamps.view(2, 12, 10)
    for j in range(12):                                # from chunk 8 on, each chunk's operands phase +1,000 cycles
        s[:, j, 4:] += 1000 * max(0, j - 7)
        s[:, j, 7] -= 1000 * max(0, j - 7)            # (the chain reaches its wait on its own time)
    rows = tool.by_position(stamps, [12, 12], first=0, count=12, clock_ghz=1.0, bucket=4)
    assert [r["chunks"] for r in rows] == ["0..3", "4..7", "8..11"]
    assert [r["chunks"] for r in tool.by_position(stamps, [12, 12], 0, 12, 1.0, bucket=5)] == ["0..4", "5..9", "10..11"]
    assert rows[0]["mean_us"]["operands"] == pytest.approx(0.4) and rows[1]["mean_us"]["operands"] == pytest.approx(0.4)
    assert rows[2]["mean_us"]["operands"] > 0.4 and rows[2]["mean_us"]["producer_chunk"] > rows[1]["mean_us"]["producer_chunk"]


def test_slow_periods_name_the_producer_phase_that_made_the_next_chunk_late():
    tool = _tool()
    stamps = _synthetic([30, 30, 30], first=0, count=30)
    s = stamps.view(3, 30, 10)
    s[1, 10, 5:] += 3000                               # program 1's chunk 10: [L; Aqk] 3,000 cycles longer,
    s[1, 11:, :] += 3000                               # so its `ready` and everything after it come 3,000 later
    s[1, 10, 7] -= 3000                                # (the chain came to its wait for chunk 10 on time)
    out = tool.slow_periods(stamps, [30, 30, 30], first=0, count=30, clock_ghz=1.0)
    assert out["periods"] == 1 and out["median_period_us"] == pytest.approx(1.0)
    assert out["mean_slow_period_us"] == pytest.approx(4.0)
    ex = out["excess_us"]
    assert ex["l_aqk_masks (j + 1)"] == pytest.approx(3.0) and ex["chain_wait_ready (j + 1)"] == pytest.approx(3.0)
    assert ex["chain_work (j)"] == pytest.approx(0.0) and ex["operands (j + 1)"] == pytest.approx(0.0)
    # a window of one chunk per program has no period: nothing to attribute, the keys all there
    out = tool.slow_periods(_synthetic([1], first=0, count=1), [1], first=0, count=1, clock_ghz=1.0)
    assert out["periods"] == 0 and out["excess_us"] == {} and out["median_period_us"] != out["median_period_us"]


def test_by_program_finds_the_slowest_program_and_splits_by_shared_tpc():
    tool = _tool()
    stamps = _synthetic([10, 10, 10], first=0, count=10)
    s = stamps.view(3, 10, 10)
    for j in range(10):                                # program 2 runs every chunk 500 cycles slower
        s[2, j, :] += 500 * j
    sm = torch.tensor([[4], [5], [9]])                 # programs 0 and 1 share TPC 2 (SMs 4, 5); program 2 is alone
    out = tool.by_program(torch.cat([stamps, sm], 1), [10, 10, 10], first=0, count=10, clock_ghz=1.0)
    assert [r["smid"] for r in out["programs"]] == [4, 5, 9]
    assert out["slowest_program"] == 2 and out["max_mean_us"] == pytest.approx(1.5)
    assert out["median_of_means_us"] == pytest.approx(1.0)
    assert out["tpc_shared_programs"] == 2 and out["tpc_shared_mean_us"] == pytest.approx(1.0)
    assert out["tpc_alone_programs"] == 1 and out["tpc_alone_mean_us"] == pytest.approx(1.5)
    # stamps without the SM column (the summaries' own tests use them): the periods, no split
    out = tool.by_program(stamps, [10, 10, 10], first=0, count=10, clock_ghz=1.0)
    assert out["slowest_program"] == 2 and "tpc_shared_programs" not in out
    # one call's spread: the summary without the rows, and the SMs of the programs within 1% of the slowest
    sm = torch.tensor([[4], [5], [9]])
    spread = tool._spread(tool.by_program(torch.cat([stamps, sm], 1), [10, 10, 10], first=0, count=10, clock_ghz=1.0))
    assert "programs" not in spread and spread["slowest_smids"] == [9] and spread["max_mean_us"] == pytest.approx(1.5)


def test_bad_counts_are_refused_before_any_gpu_work():
    tool = _tool()
    with pytest.raises(SystemExit, match="--captures and --burst >= 1"):
        tool.main(["--tasks", "H96_fixed_8192", "--captures", "0"])
