"""Stage 1 picks G's middle and last rows with tl.gather instead of masked row sums (docs/perf-notes.md, v12).

ncu (H64 fixed, source counters): the two masked row sums (`tl.sum(tl.where(o_t == ..., b_G, 0), 0)`) write and
read Triton's reduction scratch with 16-way bank conflicts: 32 instructions, 79% of stage 1's excess
shared-memory wavefronts, a third of all of them. A gather of one row is exact (the same bits).

    python benchmarks/stage_variants.py benchmarks/variants/gather_rows.py
"""

GATHER = [
    ("""    r_mid = tl.sum(tl.where((o_t == BT // 2 - 1)[:, None], b_G, 0.0), 0)
    g_last = tl.sum(tl.where((o_t == BT - 1)[:, None], b_G, 0.0), 0)            # G at the chunk's last row
""", """    r_mid = tl.gather(b_G, tl.full([1, K], BT // 2 - 1, tl.int32), 0)
    g_last = tl.gather(b_G, tl.full([1, K], BT - 1, tl.int32), 0)
"""),
    ("    k_neg = b_k * _exp2(r_mid[None, :] - b_G, INTERPRET)", "    k_neg = b_k * _exp2(r_mid - b_G, INTERPRET)"),
    ("(k_neg * _exp2(g_last - r_mid, INTERPRET)[None, :])", "(k_neg * _exp2(g_last - r_mid, INTERPRET))"),
    ("    tl.store(gl + (i_c * HV + i_hv) * K + o_k, _exp2(g_last, INTERPRET))",
     "    tl.store(gl + (i_c * HV + i_hv) * K + o_k[None, :], _exp2(g_last, INTERPRET))"),
    ("    e_pos = _exp2(b_G - r_mid[None, :], INTERPRET)", "    e_pos = _exp2(b_G - r_mid, INTERPRET)"),
    ("(q_pos * (e_r * scale)[None, :])", "(q_pos * (e_r * scale))"),
    ("    k_beta = k_pos * (e_r[None, :] * b_beta[:, None])", "    k_beta = k_pos * (e_r * b_beta[:, None])"),
]
STAGE1 = {"base": [], "gather": GATHER}
STAGE2 = {}
LAUNCH = {}
