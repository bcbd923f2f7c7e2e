"""Where a kernel's stalls and shared-memory traffic go, by source line, from ncu's per-instruction counters.

On the device (Triton keeps each compiled cubin in its cache, ~/.triton/cache, and ships nvdisasm):

    ncu --clock-control none --section SourceCounters -k regex:_chunk_prepare_kernel -o rep python3 ...
    ncu --import rep.ncu-rep --page source --print-source sass --csv > src.csv
    .../triton/backends/nvidia/bin/nvdisasm -g -c _chunk_prepare_kernel.cubin > kernel.sass

then anywhere:

    python benchmarks/ncu_lines.py src.csv kernel.sass [--kernel 0] [--top 25] [--sort samples|excess|wavefronts]

ncu's source page lists every SASS instruction with its counters (stall samples by reason, shared-memory
wavefronts and their bank-conflict excess, ...) but without source lines for Triton kernels; the cubin's line
table (nvdisasm -g) gives them. Instructions are matched by their offset from the kernel's first instruction
and checked by opcode, so a SASS file from another build is refused. Counts are shares of the kernel's totals.
This is how docs/perf-notes.md (session 3) found the bank-conflicted row sums of stage 1.
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


def by_line(rows: List[dict], sass: Dict[int, Tuple[Line, str]]) -> Tuple[Dict[Line, Counter], Counter]:
    """Counters summed per source line, and the kernel's totals. Raises if the SASS is another build's."""
    base = int(rows[0]["Address"], 16)
    per_line: Dict[Line, Counter] = defaultdict(Counter)
    totals: Counter = Counter()
    mismatched = 0
    for row in rows:
        where, opcode = sass.get(int(row["Address"], 16) - base, (None, ""))
        if opcode != _opcode(row.get("Source", "")):
            mismatched += 1
        for key in (SAMPLES, WAVEFRONTS, EXCESS) + STALLS:
            value = _number(row.get(key, "0"))
            per_line[where][key] += value
            totals[key] += value
    if mismatched > len(rows) // 100:
        raise ValueError(f"{mismatched} of {len(rows)} instructions differ from the SASS file: another build?")
    return per_line, totals


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
    args = ap.parse_args(argv)
    with open(args.csv) as f:
        kernels = parse_source_csv(f.read())
    with open(args.sass) as f:
        sass = parse_sass(f.read())
    name, rows = kernels[args.kernel]
    per_line, totals = by_line(rows, sass)
    print(f"{name} ({len(rows)} instructions)")
    print(report(per_line, totals, args.sort, args.top))


if __name__ == "__main__":
    main()
