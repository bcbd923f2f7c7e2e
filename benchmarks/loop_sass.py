"""Whether a change moved the fused kernel's loops: their SASS in two or more trees, compared without a GPU.

    python benchmarks/loop_sass.py TREE [TREE ...] [--fixed] [--min-instr 100] [--sass-dir DIR] [--by-line N]

A TREE is a folder holding a `fastkda` package: the checkout (`.`) or one that `ab_trees.py prepare` made
(`.ab/<commit>[+patch]`). Each tree's fused kernel (fastkda/kernels/fused_gluon.py) is compiled for sm_90a with
the launcher's settings (compile_report.py, in a child process per tree: two fastkda packages cannot share one
interpreter), disassembled, and its loops found as backward branches. For every tree after the first, each loop
is compared with the first tree's loop of the same rank: its instruction count, how many lines of its opcode
sequence differ (a reordering: ptxas scheduled it otherwise) and, where the opcodes are the same, how many
instructions differ only in their operands (other registers).

Why: ptxas schedules the whole kernel at once, so a change outside a loop (the final state's stores, after the
chain's loop) can reschedule the loops that bound the time, and an A/B then measures both. Session 33 measured
register renaming in the loops at −0.1%, and told the final state's conversion (+0.8% per half) from the loops'
reordering by comparing forms of the store that reordered the loops differently (docs/perf-notes.md): this shows
what a variant changed in the loops before it takes device time.

`--by-line N` adds, for the first tree, each loop's N kernel source lines with the most instructions (and their
commonest opcodes): where a loop's issue slots go, which is what the fused kernel's time follows (its SM is
work-conserving: docs/perf-notes.md, sessions 23 and 28).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ncu_lines import _opcode, parse_sass      # benchmarks/ is the script's own folder, hence on sys.path

HERE = Path(__file__).resolve().parent
_INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b.*?`?\(?(\.L_x_\d+)")


@dataclass
class Loop:
    start: int                           # byte offset of the loop's first instruction
    end: int                             # ... and of its backward branch
    instructions: List[str]              # without offsets, predicates kept

    @property
    def opcodes(self) -> List[str]:
        return [_opcode(i) for i in self.instructions]

    def count(self, prefix: str) -> int:
        return sum(op.startswith(prefix) for op in self.opcodes)


def find_loops(sass: str) -> List[Loop]:
    """Every backward branch of an nvdisasm listing (`nvdisasm -c`) as a Loop, ordered by (start, end)."""
    instructions: List[Tuple[int, str]] = []
    labels = {}
    pending: List[str] = []
    for line in sass.splitlines():
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.match(line)
        if m:
            offset = int(m.group(1), 16)
            for name in pending:
                labels[name] = offset
            pending = []
            instructions.append((offset, m.group(2)))
    loops = []
    for offset, text in instructions:
        m = _BRANCH.search(text)
        if m and m.group(1) in labels and labels[m.group(1)] <= offset:
            start = labels[m.group(1)]
            loops.append(Loop(start, offset, [t for o, t in instructions if start <= o <= offset]))
    return sorted(loops, key=lambda lp: (lp.start, lp.end))


@dataclass
class LoopDiff:
    instructions: Tuple[int, int]        # (first tree, this tree)
    reordered: int                       # opcode-sequence lines added or removed (difflib), 0 if same order
    operands: Optional[int]              # instructions whose operands alone differ (only when reordered == 0)


def compare_loop(base: Loop, other: Loop) -> LoopDiff:
    a, b = base.opcodes, other.opcodes
    reordered = sum(1 for line in difflib.ndiff(a, b) if line[:1] in "+-")
    operands = None
    if reordered == 0:
        operands = sum(x != y for x, y in zip(base.instructions, other.instructions))
    return LoopDiff((len(a), len(b)), reordered, operands)


def compile_fused_sass(tree: Path, fixed: bool = False) -> str:
    """The SASS of `tree`'s fused kernel (packed, or fixed-length), compiled in a child process."""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(Path(tree).resolve()))
    args = [sys.executable, str(HERE / "loop_sass.py"), "--emit"] + (["--fixed"] if fixed else [])
    run = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise RuntimeError(f"compiling the fused kernel of {tree} failed:\n{run.stderr[-3000:]}")
    return run.stdout


def _emit(fixed: bool) -> None:
    """(Child process.) The fused kernel of the fastkda on PYTHONPATH, compiled as the launcher does, to stdout."""
    import compile_report
    name = f"fused (Gluon), bf16, {'fixed-length' if fixed else 'packed'}"
    config = next(c for c in compile_report.launcher_configurations(128) if c[0] == name)
    _, kernel, constexprs, warps, stages, maxnreg, source, types = config
    # with source lines (`nvdisasm -g`: comment lines beside the same instructions, for --by-line)
    sass = compile_report.disassemble(compile_report.compile_sm90(kernel, constexprs, warps, stages, maxnreg, source,
                                                                  types), line_info=True)
    if not sass.strip():
        raise SystemExit("nvdisasm gave no SASS")
    sys.stdout.write(sass)


def innermost(loops: Sequence[Loop], min_instr: int) -> List[Loop]:
    """The loops of at least min_instr instructions that contain no other such loop (in the fused kernel: each
    producer's chunk loop and the chain's; the spans around them are the partitions' dispatch, not loops), nor
    start inside one and end after it (a branch back into a loop from code after it)."""
    big = [lp for lp in loops if len(lp.instructions) >= min_instr]
    inner = [lp for lp in big if not any(o is not lp and lp.start <= o.start and o.end <= lp.end for o in big)]
    return [lp for lp in inner if not any(o.start < lp.start <= o.end < lp.end for o in inner)]


def loop_lines(sass: str, loop: Loop, top: int) -> List[Tuple[str, int, List[Tuple[str, int]]]]:
    """The `top` kernel source lines with the most instructions in `loop`, from an `nvdisasm -g` listing:
    ("file:line", instructions, [(opcode, count), ...] commonest first, at most four)."""
    count: Counter = Counter()
    opcodes = {}
    for offset, (where, opcode) in parse_sass(sass).items():
        if loop.start <= offset <= loop.end:
            key = "?" if where is None else f"{where[0]}:{where[1]}"
            count[key] += 1
            opcodes.setdefault(key, Counter())[opcode.split(".")[0]] += 1
    return [(key, n, opcodes[key].most_common(4)) for key, n in count.most_common(top)]


def report(trees: Sequence[str], sass: Sequence[str], min_instr: int, by_line: int = 0) -> str:
    loops = [innermost(find_loops(s), min_instr) for s in sass]
    rows = [f"tree 1 ({trees[0]}): innermost loops of at least {min_instr} instructions"]
    for i, lp in enumerate(loops[0], 1):
        rows.append(f"  loop {i} {lp.start:#x}..{lp.end:#x}: {len(lp.instructions)} instructions, "
                    f"{lp.count('HGMMA')} HGMMA, {lp.count('BAR')} BAR")
        for key, n, common in (loop_lines(sass[0], lp, by_line) if by_line else []):
            rows.append(f"    {n:5d}  {key:36s} " + ", ".join(f"{op} {k}" for op, k in common))
    for t, (tree, theirs) in enumerate(zip(trees[1:], loops[1:]), 2):
        rows.append(f"tree {t} ({tree}) against tree 1:")
        if len(theirs) != len(loops[0]):
            rows.append(f"  other loops: {len(theirs)} against {len(loops[0])} (no loop-by-loop comparison)")
            continue
        for i, (a, b) in enumerate(zip(loops[0], theirs), 1):
            d = compare_loop(a, b)
            what = ("same SASS" if d.reordered == 0 and d.operands == 0 else
                    f"same opcodes in the same order, {d.operands} instructions with other operands"
                    if d.reordered == 0 else f"reordered: {d.reordered} opcode lines differ")
            delta = d.instructions[1] - d.instructions[0]
            rows.append(f"  loop {i}: {d.instructions[1]} instructions ({delta:+d}), {what}")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="*", help="folders holding a fastkda package (the first is the base)")
    ap.add_argument("--fixed", action="store_true", help="the fixed-length kernel (default: packed sequences)")
    ap.add_argument("--min-instr", type=int, default=100, help="loops shorter than this are left out")
    ap.add_argument("--sass-dir", default=None, help="also write each tree's SASS here (tree1.sass, ...)")
    ap.add_argument("--by-line", type=int, default=0, metavar="N",
                    help="also list each loop's N source lines with the most instructions (first tree)")
    ap.add_argument("--emit", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.emit:
        _emit(args.fixed)
        return 0
    if not args.trees:
        ap.error("at least one tree is needed")
    for tree in args.trees:
        if not (Path(tree) / "fastkda" / "kernels" / "fused_gluon.py").is_file():
            ap.error(f"tree {tree!r} holds no fastkda package (fastkda/kernels/fused_gluon.py)")
    sass = [compile_fused_sass(Path(tree), args.fixed) for tree in args.trees]
    if args.sass_dir:
        os.makedirs(args.sass_dir, exist_ok=True)
        for i, text in enumerate(sass, 1):
            Path(args.sass_dir, f"tree{i}.sass").write_text(text)
    print(report(args.trees, sass, args.min_instr, args.by_line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
