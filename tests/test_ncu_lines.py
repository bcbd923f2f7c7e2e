"""benchmarks/ncu_lines.py: ncu's per-instruction counters summed by source line through the cubin's line table."""

import pytest

from conftest import benchmark_script


def _tool():
    return benchmark_script("ncu_lines")


SASS = """
	//## File "/tmp/x/kern.py", line 10
        /*0000*/                   LDC R1, c[0x0][0x28] ;
	//## File "/tmp/x/kern.py", line 12
        /*0010*/                   STS [R2], R3 ;
        /*0020*/              @!P0 LDS R4, [R2] ;
	//## File "/opt/triton/language/standard.py", line 293
        /*0030*/                   SHFL.BFLY PT, R5, R4, 0x8, 0x1f ;
"""

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","L1 Wavefronts Shared Excessive",'
          '"L1 Wavefronts Shared","stall_long_sb","stall_short_sb"')


def _csv(rows, base=0x7F0000):
    lines = ['"Kernel Name","k",', HEADER]
    for off, src, samples, excess, wf in rows:
        lines.append(f'"{hex(base + off)}","{src}","{samples}","{excess}","{wf}","0","{samples}"')
    return "\n".join(lines) + "\n"


def test_counters_are_summed_per_source_line():
    tool = _tool()
    csv_text = _csv([(0x0, "      LDC R1, c[0x0][0x28]", 10, 0, 0),
                     (0x10, "      STS [R2], R3", 30, "1,500", "2,000"),
                     (0x20, "  @!P0 LDS R4, [R2]", 20, 500, 1000),
                     (0x30, "      SHFL.BFLY PT, R5, R4, 0x8, 0x1f", 40, 0, 0)])
    (name, rows), = tool.parse_source_csv(csv_text)
    per_line, totals = tool.by_line(rows, tool.parse_sass(SASS))
    assert name == "k" and totals[tool.SAMPLES] == 100 and totals[tool.EXCESS] == 2000
    assert per_line[("kern.py", 12)][tool.SAMPLES] == 50 and per_line[("kern.py", 12)][tool.WAVEFRONTS] == 3000
    assert per_line[("standard.py", 293)][tool.SAMPLES] == 40
    text = tool.report(per_line, totals, sort="excess", top=1)
    assert text.splitlines()[1].startswith("kern.py:12") and "100.0" in text.splitlines()[1]


def test_sass_of_another_build_is_refused():
    tool = _tool()
    csv_text = _csv([(0x0, "      MOV R1, R2", 1, 0, 0), (0x10, "      IADD3 R1, R2, R3, RZ", 1, 0, 0)])
    (_, rows), = tool.parse_source_csv(csv_text)
    with pytest.raises(ValueError, match="another build"):
        tool.by_line(rows, tool.parse_sass(SASS))


LOOP_SASS = """
        /*0000*/                   MOV R1, R2 ;
.L_x_1:
        /*0010*/                   FADD R3, R3, R4 ;
        /*0020*/                   FMUL R5, R3, R3 ;
        /*0030*/              @P0 BRA `(.L_x_1) ;
        /*0040*/                   EXIT ;
"""


def test_counters_are_summed_per_loop_and_the_rest():
    tool = _tool()
    header = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait",'
              '"stall_long_sb"')
    rows = [(0x0, "MOV R1, R2", 5, 10, 1, 4), (0x10, "FADD R3, R3, R4", 20, 100, 15, 5),
            (0x20, "FMUL R5, R3, R3", 30, 100, 10, 20), (0x30, "@P0 BRA `(.L_x_1)", 10, 100, 10, 0),
            (0x40, "EXIT", 1, 10, 0, 1)]
    csv_text = "\n".join(['"Kernel Name","k",', header] + [
        f'"{hex(0x7F0000 + off)}","{src}","{s}","{n}","{w}","{lsb}"' for off, src, s, n, w, lsb in rows]) + "\n"
    (_, parsed), = tool.parse_source_csv(csv_text)
    loops, per = tool.by_loop(parsed, LOOP_SASS, min_instr=3)
    assert loops == [("loop 1", 0x10, 0x30)]
    assert per["loop 1"][tool.SAMPLES] == 60 and per["loop 1"][tool.INSTRUCTIONS] == 300
    assert per["loop 1"]["stall_wait"] == 35 and per["loop 1"]["stall_long_sb"] == 25
    assert per["other"][tool.SAMPLES] == 6 and per["other"]["stall_long_sb"] == 5
    text = tool.report_loops(loops, per)
    assert text.splitlines()[0].startswith("loop 1 0x10..0x30: 90.9% of 66 samples, 300 warp instructions; wait 35")
    # a loop shorter than min_instr is not a region of its own
    loops, per = tool.by_loop(parsed, LOOP_SASS, min_instr=4)
    assert loops == [] and per["other"][tool.SAMPLES] == 66
    # the SASS of another build is refused, as by_line refuses it
    with pytest.raises(ValueError, match="another build"):
        tool.by_loop(parsed, LOOP_SASS.replace("FADD", "IADD3").replace("FMUL", "IMAD"), min_instr=3)
