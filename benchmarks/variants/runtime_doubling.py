"""Stage 1's doubling levels as a runtime loop instead of an unrolled one (docs/perf-notes.md, v13).

ncu (v12, H64 fixed): 13% of stage 1's stall samples were `no_instruction` (instruction fetch); the four
unrolled doubling levels are a third of the kernel's ~4,000 SASS instructions.

    python benchmarks/stage_variants.py benchmarks/variants/runtime_doubling.py
"""

STAGE1 = {"base": [], "runtime_doubling": [("    for lvl in tl.static_range(1, LOG2_BT):",
                                            "    for lvl in range(1, LOG2_BT):")]}
STAGE2 = {}
LAUNCH = {}
