"""Stage 1 without cross-warp reductions (docs/perf-notes.md, v12).

ncu (H64 fixed, source counters): the two masked row sums that pick G at the chunk's middle and last rows
(`tl.sum(tl.where(o_t == ..., b_G, 0), 0)`) write and read Triton's reduction scratch with 16-way bank
conflicts: 32 instructions, 79% of stage 1's excess shared-memory wavefronts, a third of all of them.
Here every row forms its own reference from a second (reverse) scan, G_last = G_i + Σ_{t>i} a_t, and
r_i = G_last / 2 (|G − r| <= log2(e)·5·BT/2, the bound of the middle token); gl is stored by the last row.

    python benchmarks/stage_variants.py benchmarks/variants/reverse_scan.py
"""

SCAN = [
    ("    b_G = tl.cumsum(tl.where(m_t[:, None], b_a, 0.0), 0)\n",
     "    b_a = tl.where(m_t[:, None], b_a, 0.0)\n"
     "    b_G = tl.cumsum(b_a, 0)\n"),
    ("""    r_mid = tl.sum(tl.where((o_t == BT // 2 - 1)[:, None], b_G, 0.0), 0)
    g_last = tl.sum(tl.where((o_t == BT - 1)[:, None], b_G, 0.0), 0)            # G at the chunk's last row
    e_r = _exp2(r_mid, INTERPRET)
""", """    b_r = (b_G + (tl.cumsum(b_a, 0, reverse=True) - b_a)) * 0.5
    e_r = _exp2(b_r, INTERPRET)
"""),
    ("""    k_neg = b_k * _exp2(r_mid[None, :] - b_G, INTERPRET)                         # k̂_j e^{r − G_j}
    tl.store(kt + blk * (BT * K) + o_t[:, None] * K + o_k[None, :],
             (k_neg * _exp2(g_last - r_mid, INTERPRET)[None, :]).to(kt.dtype.element_ty))  # k̂ e^{G_last − G}
    tl.store(gl + (i_c * HV + i_hv) * K + o_k, _exp2(g_last, INTERPRET))
""", """    k_neg = b_k * _exp2(b_r - b_G, INTERPRET)                         # k̂_j e^{r − G_j}
    tl.store(kt + blk * (BT * K) + o_t[:, None] * K + o_k[None, :],
             (k_neg * e_r).to(kt.dtype.element_ty))  # k̂ e^{G_last − G}
    tl.store(gl + (i_c * HV + i_hv) * K + (o_t * 0)[:, None] + o_k[None, :], e_r * e_r,
             mask=(o_t == BT - 1)[:, None])
"""),
    ("    e_pos = _exp2(b_G - r_mid[None, :], INTERPRET)", "    e_pos = _exp2(b_G - b_r, INTERPRET)"),
    ("(q_pos * (e_r * scale)[None, :])", "(q_pos * (e_r * scale))"),
]
KBETA_LATE = [("    k_beta = k_pos * (e_r[None, :] * b_beta[:, None])", "    k_beta = k_pos * (e_r * b_beta[:, None])")]
KBETA_EARLY = [
    ("    k_beta = k_pos * (e_r[None, :] * b_beta[:, None])\n", ""),
    ("    q_pos = b_q * e_pos\n", "    q_pos = b_q * e_pos\n    k_pos = b_k * e_pos\n    k_beta = k_pos * (e_r * b_beta[:, None])\n"),
    ("    k_pos = b_k * e_pos\n    b_L", "    b_L"),
]

STAGE1 = {"base": [], "reverse_scan": SCAN + KBETA_LATE, "reverse_scan_kbeta_early": SCAN + KBETA_EARLY}
STAGE2 = {}
LAUNCH = {}
