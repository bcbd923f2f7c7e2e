"""Where a kernel's stalls and shared-memory traffic go, by source line, from ncu's per-instruction counters.

On the device (Triton keeps each compiled cubin in its cache, ~/.triton/cache, and ships nvdisasm):

    ncu --clock-control none --section SourceCounters -k regex:_chunk_prepare_kernel -o rep python3 ...
    ncu --import rep.ncu-rep --page source --print-source sass --csv > src.csv
    .../triton/backends/nvidia/bin/nvdisasm -g -c _chunk_prepare_kernel.cubin > kernel.sass

then anywhere:

    python benchmarks/ncu_lines.py src.csv kernel.sass [--kernel 0] [--top 25] [--sort samples|excess|wavefronts]
    python benchmarks/ncu_lines.py src.csv kernel.sass --by-loop     # per chunk loop instead (the fused kernel)

ncu's source page lists every SASS instruction with its counters (stall samples by reason, shared-memory
wavefronts and their bank-conflict excess, ...) but without source lines for Triton kernels; the cubin's line
table (nvdisasm -g) gives them. Instructions are matched by their offset from the kernel's first instruction
and checked by opcode, so a SASS file from another build is refused. Counts are shares of the kernel's totals.
This is how docs/perf-notes.md (session 3) found the bank-conflicted row sums of stage 1.

`--by-loop` sums the counters over each innermost loop of at least 100 instructions (loop_sass.py's: in the fused
kernel each producer's chunk loop and the chain's) and over the rest: the stall samples by reason and the warp
instructions each partition spent, for comparing two builds partition by partition (docs/perf-notes.md, session 35).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
from collections import Counter, defaultdict
from typing import Dict, List, Optional, Tuple

SAMPLES = "Warp Stall Sampling (All Samples)"
WAVEFRONTS = "L1 Wavefronts Shared"
EXCESS = "L1 Wavefronts Shared Excessive"
STALLS = ("stall_long_sb", "stall_short_sb", "stall_mio", "stall_wait", "stall_barrier", "stall_no_inst")
SORT_KEYS = {"samples": SAMPLES, "excess": EXCESS, "wavefronts": WAVEFRONTS}

Line = Optional[Tuple[str, int]]


def parse_sass(text: str) -> Dict[int, Tuple[Line, str]]:
    """nvdisasm -g output -> {offset: ((file name, line) or None, opcode)}."""
    where: Line = None
    table = {}
    for ln in text.splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', ln)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", ln)
        if m:
            table[int(m.group(1), 16)] = (where, _opcode(m.group(2)))
    return table


def _opcode(instruction: str) -> str:
    words = instruction.strip().split()
    if words and words[0].startswith("@"):        # predicate
        words = words[1:]
    return words[0] if words else ""


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def parse_source_csv(text: str) -> List[Tuple[str, List[dict]]]:
    """ncu --page source --csv output -> [(kernel name, [row per instruction]), ...] in launch order."""
    kernels: List[Tuple[str, List[dict]]] = []
    header = None
    for row in csv.reader(io.StringIO(text)):
        if row and row[0] == "Kernel Name":
            kernels.append((row[1], []))
        elif row and row[0] == "Address":
            header = row
        elif kernels and header and row and row[0].startswith("0x"):
            kernels[-1][1].append(dict(zip(header, row)))
    return kernels


def _offsets(rows: List[dict], sass: Dict[int, Tuple[Line, str]]) -> List[int]:
    """Each row's offset from the kernel's first instruction; ValueError if more than 1% of the rows' opcodes differ
    from the SASS file's at that offset (the SASS of another build)."""
    base = int(rows[0]["Address"], 16)
    offsets = [int(row["Address"], 16) - base for row in rows]
    mismatched = sum(sass.get(off, (None, ""))[1] != _opcode(row.get("Source", "")) for off, row in zip(offsets, rows))
    if mismatched > len(rows) // 100:
        raise ValueError(f"{mismatched} of {len(rows)} instructions differ from the SASS file: another build?")
    return offsets


def by_line(rows: List[dict], sass: Dict[int, Tuple[Line, str]]) -> Tuple[Dict[Line, Counter], Counter]:
    """Counters summed per source line, and the kernel's totals. Raises if the SASS is another build's."""
    per_line: Dict[Line, Counter] = defaultdict(Counter)
    totals: Counter = Counter()
    for off, row in zip(_offsets(rows, sass), rows):
        where = sass.get(off, (None, ""))[0]
        for key in (SAMPLES, WAVEFRONTS, EXCESS) + STALLS:
            value = _number(row.get(key, "0"))
            per_line[where][key] += value
            totals[key] += value
    return per_line, totals


INSTRUCTIONS = "Instructions Executed"


def by_loop(rows: List[dict], sass_text: str, min_instr: int = 100) -> Tuple[List[Tuple[str, int, int]],
                                                                          Dict[str, Counter]]:
    """Counters (the samples, every stall reason, the warp instructions) summed over each innermost loop of at least
    min_instr instructions and over the rest ("other"): ([(name, first offset, last offset), ...], {name: Counter}).
    Raises if the SASS is another build's."""
    from loop_sass import find_loops, innermost      # (loop_sass imports this module: imported when used)
    loops = [(f"loop {i}", lp.start, lp.end) for i, lp in enumerate(innermost(find_loops(sass_text), min_instr), 1)]
    keys = [k for k in rows[0] if k == SAMPLES or k == INSTRUCTIONS or k.startswith("stall_")]
    per: Dict[str, Counter] = {name: Counter() for name, _, _ in loops}
    per["other"] = Counter()
    for off, row in zip(_offsets(rows, parse_sass(sass_text)), rows):
        region = next((name for name, start, end in loops if start <= off <= end), "other")
        for key in keys:
            per[region][key] += _number(row.get(key, "0"))
    return loops, per


def report_loops(loops: List[Tuple[str, int, int]], per: Dict[str, Counter], reasons: int = 6) -> str:
    total = sum(c[SAMPLES] for c in per.values()) or 1.0
    out = []
    for name, c in per.items():
        span = next((f" {start:#x}..{end:#x}" for n, start, end in loops if n == name), "")
        stalls = sorted(((k[6:], v) for k, v in c.items() if k.startswith("stall_") and "Not Issued" not in k),
                        key=lambda kv: -kv[1])[:reasons]
        out.append(f"{name}{span}: {100.0 * c[SAMPLES] / total:.1f}% of {int(total)} samples, "
                   f"{int(c[INSTRUCTIONS])} warp instructions; " + ", ".join(f"{k} {int(v)}" for k, v in stalls))
    return "\n".join(out)


def report(per_line: Dict[Line, Counter], totals: Counter, sort: str = "samples", top: int = 25) -> str:
    key = SORT_KEYS[sort]

    def share(c: Counter, k: str) -> float:
        return 100.0 * c[k] / totals[k] if totals[k] else 0.0

    out = [f"{'line':<36}{'samples%':>9}{'excess%':>9}{'wavefr%':>9}   " + " ".join(s[6:] for s in STALLS)]
    for where, c in sorted(per_line.items(), key=lambda kv: -kv[1][key])[:top]:
        name = "?" if where is None else f"{where[0]}:{where[1]}"
        out.append(f"{name:<36}{share(c, SAMPLES):9.1f}{share(c, EXCESS):9.1f}{share(c, WAVEFRONTS):9.1f}   "
                   + " ".join(f"{int(c[s])}" for s in STALLS))
    out.append(f"totals: {int(totals[SAMPLES])} stall samples, {int(totals[WAVEFRONTS])} shared wavefronts "
               f"({100.0 * totals[EXCESS] / max(totals[WAVEFRONTS], 1):.0f}% bank-conflict excess)")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    ap.add_argument("sass", help="nvdisasm -g output of the same kernel's cubin")
    ap.add_argument("--kernel", type=int, default=0, help="which profiled launch in the CSV (default: first)")
    ap.add_argument("--sort", choices=sorted(SORT_KEYS), default="samples")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--by-loop", action="store_true", help="sum per chunk loop (loop_sass.py's loops), not per line")
    args = ap.parse_args(argv)
    with open(args.csv) as f:
        kernels = parse_source_csv(f.read())
    with open(args.sass) as f:
        sass_text = f.read()
    name, rows = kernels[args.kernel]
    if args.by_loop:
        print(f"{name} ({len(rows)} instructions)")
        print(report_loops(*by_loop(rows, sass_text)))
        return
    sass = parse_sass(sass_text)
    per_line, totals = by_line(rows, sass)
    print(f"{name} ({len(rows)} instructions)")
    print(report(per_line, totals, args.sort, args.top))


if __name__ == "__main__":
    main()
