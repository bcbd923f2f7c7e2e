"""Next candidate (docs/perf-notes.md, "what to try next" 3): on the packed (varlen) path stage 1 first loads
its rows' range from a table, so its input loads start one memory latency late; issuing v's load with
q, k, g overlaps that latency with the work before the U0 product. Measured once on the H200 as part of
other changes: stage 1 −2..3% packed, +1% fixed-length (where v stays last).

    python benchmarks/stage_variants.py benchmarks/variants/packed_early_v.py
"""

EARLY_V = [
    ("    # Whole-chunk tiles: k̂, q̂ and the cumulative log-decay G",
     "    if IS_VARLEN:\n"
     "        b_v = _load_rows(v, rows * HV + i_hv, V, o_v, m_t)\n"
     "    # Whole-chunk tiles: k̂, q̂ and the cumulative log-decay G"),
    ("    b_v = _load_rows(v, rows * HV + i_hv, V, o_v, m_t)\n    b_u = tl.dot(",
     "    if not IS_VARLEN:\n        b_v = _load_rows(v, rows * HV + i_hv, V, o_v, m_t)\n    b_u = tl.dot("),
]

STAGE1 = {"base": [], "early_v_packed": EARLY_V}
STAGE2 = {}
LAUNCH = {}
