"""Stage 1's W and U0 products as three bf16 products (hi·hi + hi·lo + lo·hi) instead of one tf32 product
(docs/perf-notes.md, v13). ncu (v12, H64 fixed): their fp32 right operands (k̂β·e^G and vβ, [BT, 128]) reach
shared memory with 8-way bank conflicts, 77% of stage 1's remaining excess wavefronts; bf16 operands take the
conflict-free path of the other products. The split keeps ~16 bits of each operand (tf32: 11).

    python benchmarks/stage_variants.py benchmarks/variants/bf16x3_wu.py
"""

HELPER = '''
@triton.jit
def _mm3(a, b, INTERPRET: tl.constexpr):
    """a · b (fp32) as three bf16 products of the high and low halves: about 16 significant bits per operand."""
    a_hi = a.to(tl.bfloat16)
    a_lo = (a - a_hi.to(tl.float32)).to(tl.bfloat16)
    b_hi = b.to(tl.bfloat16)
    b_lo = (b - b_hi.to(tl.float32)).to(tl.bfloat16)
    return _mm(a_hi, b_hi, INTERPRET) + _mm(a_hi, b_lo, INTERPRET) + _mm(a_lo, b_hi, INTERPRET)


@triton.jit
def _log2_decay('''

X3 = [
    ("\n@triton.jit\ndef _log2_decay(", HELPER),
    ("(-tl.dot(b_T, k_beta, input_precision=DOT_PRECISION))", "(-_mm3(b_T, k_beta, INTERPRET))"),
    ("    b_u = tl.dot(b_T, b_v * b_beta[:, None], input_precision=DOT_PRECISION)",
     "    b_u = _mm3(b_T, b_v * b_beta[:, None], INTERPRET)"),
]
STAGE1 = {"base": [], "bf16x3_wu": X3}
STAGE2 = {}
LAUNCH = {}
