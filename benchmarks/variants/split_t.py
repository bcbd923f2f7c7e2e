"""Stage 1's U0 (and W) products with bf16 right operands and the left operand T·diag(β) split into bf16 high
and low halves (docs/perf-notes.md, v13); stage 2 with 32-column value blocks.

ncu (v12, H64 fixed): the fp32 right operands of the two tf32 products, vβ and k̂β·e^G, reach shared memory
with 8-way bank conflicts (77% of the remaining excess wavefronts). U0 = (T·diag(β))·V: V is bf16 already,
so (T·diag(β))_hi·V + (T·diag(β))_lo·V is as many MMA instructions as one tf32 product (k16 instead of k8),
with ~16 bits of the left operand (tf32: 11) and V exact. W the same way with k̂⊙e^{G−r} rounded to bf16
(as in the L product) and e^r applied to W's columns afterwards.
Stage 2: BV = 32 doubles the programs (fixed-length tasks have one program per SM at BV = 64), at the price
of mma.sync instead of wgmma (M = 32).

    python benchmarks/stage_variants.py benchmarks/variants/split_t.py
"""

U0 = [
    ("""    b_v = _load_rows(v, rows * HV + i_hv, V, o_v, m_t)
    b_u = tl.dot(b_T, b_v * b_beta[:, None], input_precision=DOT_PRECISION)
""", """    if v.dtype.element_ty == tl.bfloat16:
        b_Tb = b_T * b_beta[None, :]
        t_hi = b_Tb.to(tl.bfloat16)
        t_lo = (b_Tb - t_hi.to(tl.float32)).to(tl.bfloat16)
        b_vr = tl.load(v + (rows * HV + i_hv)[:, None] * V + o_v[None, :], mask=m_t[:, None], other=0.0)
        b_u = _mm(t_hi, b_vr, INTERPRET) + _mm(t_lo, b_vr, INTERPRET)
    else:
        b_v = _load_rows(v, rows * HV + i_hv, V, o_v, m_t)
        b_u = tl.dot(b_T, b_v * b_beta[:, None], input_precision=DOT_PRECISION)
"""),
]
W = [
    ("""    k_beta = k_pos * (e_r[None, :] * b_beta[:, None])
""", ""),
    ("""    tl.store(p_a1, (-tl.dot(b_T, k_beta, input_precision=DOT_PRECISION)).to(a1.dtype.element_ty))
""", """    b_Tb = b_T * b_beta[None, :]
    if MM_DTYPE == tl.bfloat16:
        t_hi = b_Tb.to(tl.bfloat16)
        t_lo = (b_Tb - t_hi.to(tl.float32)).to(tl.bfloat16)
        k_pb = k_pos.to(MM_DTYPE)
        b_w = (_mm(t_hi, k_pb, INTERPRET) + _mm(t_lo, k_pb, INTERPRET)) * e_r[None, :]
    else:
        b_w = tl.dot(b_Tb, k_pos * e_r[None, :], input_precision=DOT_PRECISION)
    tl.store(p_a1, (-b_w).to(a1.dtype.element_ty))
"""),
]
U0_AFTER_W = [
    ("""    b_v = _load_rows(v, rows * HV + i_hv, V, o_v, m_t)
    b_u = tl.dot(b_T, b_v * b_beta[:, None], input_precision=DOT_PRECISION)
""", """    if v.dtype.element_ty == tl.bfloat16:
        b_vr = tl.load(v + (rows * HV + i_hv)[:, None] * V + o_v[None, :], mask=m_t[:, None], other=0.0)
        b_u = _mm(t_hi, b_vr, INTERPRET) + _mm(t_lo, b_vr, INTERPRET)
    else:
        b_v = _load_rows(v, rows * HV + i_hv, V, o_v, m_t)
        b_u = tl.dot(b_Tb, b_v, input_precision=DOT_PRECISION)
"""),
]

STAGE1 = {"base": [], "u0_split": U0, "wu_split": W + U0_AFTER_W}
STAGE2 = {"base": [], "bv32": [], "bv32_2warps": []}
LAUNCH = {"bv32": {"VALUE_BLOCK": 32}, "bv32_2warps": {"VALUE_BLOCK": 32, "STAGE2_WARPS": 2}}
