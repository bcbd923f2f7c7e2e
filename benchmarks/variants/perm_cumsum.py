"""Stage 1 with the chunk's rows in a permuted token order, so that the cumulative sum over tokens runs inside
threads (docs/perf-notes.md, v12). Row j of every stage-1 tile holds token (j % 8)·(BT/8) + j / 8: in the
tiles' register layout (4 warps × 2 lanes along rows, BT/8 rows per thread) each thread then holds BT/8
consecutive tokens, and the scan becomes an in-thread scan plus a small one over 8 group sums. Every other
step (products, masks, stores) only needs each row's token index, which o_t now carries. Also timed with v
loaded first on the packed path (packed_early_v.py).

    python benchmarks/stage_variants.py benchmarks/variants/perm_cumsum.py
"""

PERM = [
    ("    o_t = tl.arange(0, BT)\n",
     "    o_t = (tl.arange(0, BT) % 8) * (BT // 8) + tl.arange(0, BT) // 8\n"),
    ("    b_G = tl.cumsum(tl.where(m_t[:, None], b_a, 0.0), 0)\n",
     "    b_a3 = tl.reshape(tl.where(m_t[:, None], b_a, 0.0), (BT // 8, 8, K))\n"
     "    b_tot = tl.sum(b_a3, 0)\n"
     "    b_G = tl.reshape(tl.cumsum(b_a3, 0) + (tl.cumsum(b_tot, 0) - b_tot)[None, :, :], (BT, K))\n"),
]
EARLY_V = [
    ("    # Whole-chunk tiles: k̂, q̂ and the cumulative log-decay G",
     "    if IS_VARLEN:\n"
     "        b_v = _load_rows(v, rows * HV + i_hv, V, o_v, m_t)\n"
     "    # Whole-chunk tiles: k̂, q̂ and the cumulative log-decay G"),
    ("    b_v = _load_rows(v, rows * HV + i_hv, V, o_v, m_t)\n    b_u = tl.dot(",
     "    if not IS_VARLEN:\n        b_v = _load_rows(v, rows * HV + i_hv, V, o_v, m_t)\n    b_u = tl.dot("),
]

STAGE1 = {"base": [], "perm": PERM, "early_v_packed": EARLY_V, "perm_early_v_packed": PERM + EARLY_V}
STAGE2 = {"base": []}
LAUNCH = {}
