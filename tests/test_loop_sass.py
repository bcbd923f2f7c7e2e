"""benchmarks/loop_sass.py: loops found in a disassembly, compared opcode by opcode, and the fused kernel's three
chunk loops found in its real SASS (compiled for sm_90a without a GPU)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import loop_sass  # noqa: E402

# A listing in nvdisasm -c's form: an outer span (0x0010..0x00b0) around an inner loop (0x0030..0x0070), and a
# branch from after the inner loop back into its middle (0x0050..0x0090: not a loop of its own).
LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   IMAD R2, R1, 0x2, RZ ;
        /*0020*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_1:
        /*0030*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0040*/                   FMUL R3, R2, 0.5 ;
.L_x_2:
        /*0050*/                   FADD R4, R3, R2 ;
        /*0060*/                   ISETP.GE.AND P0, PT, R4, RZ, PT ;
        /*0070*/              @!P0 BRA `(.L_x_1) ;
        /*0080*/                   STG.E [R6.64], R4 ;
        /*0090*/               @P0 BRA `(.L_x_2) ;
        /*00a0*/                   ISETP.NE.AND P1, PT, R2, RZ, PT ;
        /*00b0*/               @P1 BRA `(.L_x_0) ;
        /*00c0*/                   EXIT ;
"""


def test_backward_branches_are_loops_and_the_innermost_are_kept():
    loops = loop_sass.find_loops(LISTING)
    assert [(lp.start, lp.end) for lp in loops] == [(0x10, 0xb0), (0x30, 0x70), (0x50, 0x90)]
    inner = loop_sass.innermost(loops, min_instr=1)
    assert [(lp.start, lp.end) for lp in inner] == [(0x30, 0x70)]
    assert inner[0].count("HGMMA") == 1 and inner[0].opcodes[-1] == "BRA" and len(inner[0].instructions) == 5
    assert loop_sass.innermost(loops, min_instr=6) == [loops[0]]     # the inner one is too short


def test_loop_lines_count_each_source_lines_instructions_inside_the_loop_only():
    # nvdisasm -g puts a `//## File` comment before the instructions of each source line
    listing = (LISTING.replace("        /*0030*/", '\t//## File "/k/a.py", line 7\n        /*0030*/')
               .replace("        /*0050*/", '\t//## File "/k/b.py", line 9\n        /*0050*/')
               .replace("        /*0080*/", '\t//## File "/k/a.py", line 7\n        /*0080*/'))
    loop = _inner(listing)                    # 0x30..0x70: two instructions of a.py:7, three of b.py:9
    assert loop.start == 0x30 and loop.end == 0x70
    rows = loop_sass.loop_lines(listing, loop, 5)
    assert [(key, n) for key, n, _ in rows] == [("b.py:9", 3), ("a.py:7", 2)]
    assert dict(rows[1][2]) == {"HGMMA": 1, "FMUL": 1}
    assert loop_sass.loop_lines(listing, loop, 1) == rows[:1]


def _inner(listing):
    return loop_sass.innermost(loop_sass.find_loops(listing), 1)[0]


def test_compare_tells_renamed_registers_from_a_reordering():
    base = _inner(LISTING)
    assert loop_sass.compare_loop(base, base) == loop_sass.LoopDiff((5, 5), 0, 0)
    renamed = _inner(LISTING.replace("FMUL R3, R2", "FMUL R5, R2"))
    assert loop_sass.compare_loop(base, renamed) == loop_sass.LoopDiff((5, 5), 0, 1)
    swapped = _inner(LISTING.replace("FMUL R3, R2, 0.5", "@@").replace("FADD R4, R3, R2", "FMUL R3, R2, 0.5")
                     .replace("@@", "FADD R4, R3, R2"))
    d = loop_sass.compare_loop(base, swapped)
    assert d.reordered == 2 and d.operands is None


def test_the_fused_kernels_chunk_loops_are_found_in_its_sass():
    # Compiled once (~20 s on two cores): each producer's chunk loop (12 HGMMA: two k-steps of each block's
    # decay product, four of each block's [L; Aqk] product) and the chain's (56 HGMMA), in an order that depends
    # on the Triton version; a tree compared with itself shows the same SASS.
    sass = loop_sass.compile_fused_sass(ROOT)
    loops = loop_sass.innermost(loop_sass.find_loops(sass), 100)
    assert sorted(lp.count("HGMMA") for lp in loops) == [12, 12, 56]
    text = loop_sass.report([".", "."], [sass, sass], 100)
    assert text.count("same SASS") == 3 and "reordered" not in text
    # the listing carries source lines: every instruction of the chain's loop is counted once, on a kernel line
    chain = next(lp for lp in loops if lp.count("HGMMA") == 56)
    rows = loop_sass.loop_lines(sass, chain, 1000)
    assert sum(n for _, n, _ in rows) == len(chain.instructions)
    assert any(key.startswith("chunk_recurrence_gluon.py:") for key, _, _ in rows)
    assert "chunk_recurrence_gluon.py:" in loop_sass.report(["."], [sass], 100, by_line=3)
