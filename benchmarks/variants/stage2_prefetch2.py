"""Stage 2 with U0 and gl prefetched two chunks ahead instead of one (docs/perf-notes.md, v13).

ncu (H64 fixed, source counters): 30% of stage 2's stall samples sit on the first use of U0 (long scoreboard:
the load issued one chunk, ~1.3 us, earlier has not arrived).

    python benchmarks/stage_variants.py benchmarks/variants/stage2_prefetch2.py
"""

PREFETCH2 = [
    ("""    b_u0_next = tl.load(p_b1)          # slot c_first exists even for an empty sequence (kernels/__init__.py)
    b_gl_next = tl.load(p_gl)
""", """    b_u0_next = tl.load(p_b1)          # slot c_first exists even for an empty sequence (kernels/__init__.py)
    b_gl_next = tl.load(p_gl)
    c_1 = tl.maximum(tl.minimum(1, n_chunks - 1), 0)
    b_u0_next2 = tl.load(p_b1 + c_1 * (BT * V))
    b_gl_next2 = tl.load(p_gl + c_1 * (HV * K))
"""),
    ("""        b_u0 = b_u0_next
        b_gl = b_gl_next
        c_next = tl.minimum(c + 1, n_chunks - 1)                      # the last chunk reloads itself
        b_u0_next = tl.load(p_b1 + c_next * (BT * V))
        b_gl_next = tl.load(p_gl + c_next * (HV * K))
""", """        b_u0 = b_u0_next
        b_gl = b_gl_next
        b_u0_next = b_u0_next2
        b_gl_next = b_gl_next2
        c_next = tl.minimum(c + 2, n_chunks - 1)
        b_u0_next2 = tl.load(p_b1 + c_next * (BT * V))
        b_gl_next2 = tl.load(p_gl + c_next * (HV * K))
"""),
]
STAGE1 = {"base": []}
STAGE2 = {"base": [], "prefetch2": PREFETCH2, "prefetch2_stages4": PREFETCH2, "stages4": []}
LAUNCH = {"prefetch2_stages4": {"STAGE2_STAGES": 4}, "stages4": {"STAGE2_STAGES": 4}}
