"""Stage 1's W product like U0's (v13): (T·diag(β))_hi·K + (T·diag(β))_lo·K with K = k̂ ⊙ e^{G−r} rounded to
bf16 (as in the L product) and e^r applied to W's columns afterwards; no fp32 right operand through shared
memory (8-way bank conflicts, ncu). Measured on v12: stage 1 −5..7% with U0 split too. It rounds k̂ ⊙ e^{G−r}
to bf16 where the tf32 product keeps 11 bits: validate before adopting.

    python benchmarks/stage_variants.py benchmarks/variants/w_split.py
"""

W = [
    ("""    k_beta = k_pos * (e_r[None, :] * b_beta[:, None])
""", ""),
    ("""    tl.store(p_a1, (-tl.dot(b_T, k_beta, input_precision=DOT_PRECISION)).to(a1.dtype.element_ty))
""", """    b_Tw = b_T * b_beta[None, :]
    if MM_DTYPE == tl.bfloat16:
        tw_hi = b_Tw.to(tl.bfloat16)
        tw_lo = (b_Tw - tw_hi.to(tl.float32)).to(tl.bfloat16)
        k_pb = k_pos.to(MM_DTYPE)
        b_w = (_mm(tw_hi, k_pb, INTERPRET) + _mm(tw_lo, k_pb, INTERPRET)) * e_r[None, :]
    else:
        b_w = tl.dot(b_Tw, k_pos * e_r[None, :], input_precision=DOT_PRECISION)
    tl.store(p_a1, (-b_w).to(a1.dtype.element_ty))
"""),
]
STAGE1 = {"base": [], "w_split": W}
STAGE2 = {}
LAUNCH = {}
