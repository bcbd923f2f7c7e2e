"""Stage 1's two masked row sums (G at the chunk's middle and last rows) as one reduction of 16 operands with one
column per thread each (docs/perf-notes.md, v12). ncu: the plain sums hold 8 columns per thread, and Triton's
reduction scratch then takes 16-way bank conflicts (79% of stage 1's excess shared wavefronts).

    python benchmarks/stage_variants.py benchmarks/variants/split_reduce.py
"""

HELPERS = '''
@triton.jit
def _split8(x, BT: tl.constexpr, K: tl.constexpr):
    """A [BT, K] tile as 8 tiles [BT, K / 8]: column 8c + i of x is column c of the i-th."""
    x01, x23 = tl.split(tl.reshape(x, (BT, K // 8, 2, 2, 2)))   # splits the last axis: bit 0 of i... (see below)
    x0, x1 = tl.split(x01)
    x2, x3 = tl.split(x23)
    y0, y1 = tl.split(x0)
    y2, y3 = tl.split(x1)
    y4, y5 = tl.split(x2)
    y6, y7 = tl.split(x3)
    return y0, y1, y2, y3, y4, y5, y6, y7


@triton.jit
def _join8(y0, y1, y2, y3, y4, y5, y6, y7, K: tl.constexpr):
    """Inverse of _split8 for [K / 8] vectors."""
    x0 = tl.join(y0, y1)
    x1 = tl.join(y2, y3)
    x2 = tl.join(y4, y5)
    x3 = tl.join(y6, y7)
    x01 = tl.join(x0, x1)
    x23 = tl.join(x2, x3)
    return tl.reshape(tl.join(x01, x23), (K,))


@triton.jit
def _add16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15,
           b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15):
    return (a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5, a6 + b6, a7 + b7,
            a8 + b8, a9 + b9, a10 + b10, a11 + b11, a12 + b12, a13 + b13, a14 + b14, a15 + b15)


@triton.jit
def _log2_decay('''

SPLIT = [
    ("\n@triton.jit\ndef _log2_decay(", HELPERS),
    ("""    r_mid = tl.sum(tl.where((o_t == BT // 2 - 1)[:, None], b_G, 0.0), 0)
    g_last = tl.sum(tl.where((o_t == BT - 1)[:, None], b_G, 0.0), 0)            # G at the chunk's last row
""", """    m0, m1, m2, m3, m4, m5, m6, m7 = _split8(tl.where((o_t == BT // 2 - 1)[:, None], b_G, 0.0), BT, K)
    l0, l1, l2, l3, l4, l5, l6, l7 = _split8(tl.where((o_t == BT - 1)[:, None], b_G, 0.0), BT, K)
    m0, m1, m2, m3, m4, m5, m6, m7, l0, l1, l2, l3, l4, l5, l6, l7 = tl.reduce(
        (m0, m1, m2, m3, m4, m5, m6, m7, l0, l1, l2, l3, l4, l5, l6, l7), 0, _add16)
    r_mid = _join8(m0, m1, m2, m3, m4, m5, m6, m7, K)
    g_last = _join8(l0, l1, l2, l3, l4, l5, l6, l7, K)
"""),
]
STAGE1 = {"base": [], "split_reduce": SPLIT}
STAGE2 = {}
LAUNCH = {}
