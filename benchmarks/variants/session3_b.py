"""Session 3, second A/B round: the row sum for G_last with one column per thread (split_reduce.py), with the
reference r = G_last / 2 instead of G at the middle row (one sum instead of two: |G − r| <= |G_last| / 2,
the same bound), and beta loaded early."""
import importlib.util, os

def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

_a, _sr = _load("session3_a"), _load("split_reduce")
BETA_EARLY = _a.BETA_EARLY
HELPERS = '''
@triton.jit
def _split8(x, BT: tl.constexpr, K: tl.constexpr):
    """[BT, K] -> 8 tiles [BT, K / 8]; tile 4·i2 + 2·i1 + i0 holds columns 8c + 4·i2 + 2·i1 + i0."""
    x0, x1 = tl.split(tl.reshape(x, (BT, K // 8, 2, 2, 2)))        # i0
    x00, x01 = tl.split(x0)                                           # i1 (for i0 = 0)
    x10, x11 = tl.split(x1)
    y000, y100 = tl.split(x00)                                        # i2
    y010, y110 = tl.split(x01)
    y001, y101 = tl.split(x10)
    y011, y111 = tl.split(x11)
    return y000, y001, y010, y011, y100, y101, y110, y111


@triton.jit
def _join8(y000, y001, y010, y011, y100, y101, y110, y111, K: tl.constexpr):
    """Inverse of _split8 for [K / 8] vectors: y<i2 i1 i0> holds columns 8c + 4·i2 + 2·i1 + i0."""
    z00 = tl.join(y000, y001)             # [K/8, i0]   (i2 = 0, i1 = 0)
    z01 = tl.join(y010, y011)
    z10 = tl.join(y100, y101)
    z11 = tl.join(y110, y111)
    w0 = tl.join(z00, z01)                # [K/8, i0, i1]
    w1 = tl.join(z10, z11)
    v = tl.join(w0, w1)                   # [K/8, i0, i1, i2]
    return tl.reshape(tl.permute(v, (0, 3, 2, 1)), (K,))


@triton.jit
def _add8(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5, a6 + b6, a7 + b7


@triton.jit
def _split4(x, BT: tl.constexpr, K: tl.constexpr):
    """[BT, K] -> 4 tiles [BT, K / 8, 2]; tile 2·i1 + i0 holds columns 8c + 4·i2 + 2·i1 + i0 at [c, i2]."""
    x0, x1 = tl.split(tl.reshape(x, (BT, K // 8, 2, 2, 2)))
    x00, x01 = tl.split(x0)
    x10, x11 = tl.split(x1)
    return x00, x10, x01, x11


@triton.jit
def _join4(y00, y01, y10, y11, K: tl.constexpr):
    """Inverse of _split4 for [K / 8, 2] tiles (y<i1 i0>[c, i2])."""
    w0 = tl.join(y00, y01)               # [K/8, i2, i0]   i1 = 0
    w1 = tl.join(y10, y11)               # i1 = 1
    v = tl.join(w0, w1)                  # [K/8, i2, i0, i1]
    return tl.reshape(tl.permute(v, (0, 1, 3, 2)), (K,))


@triton.jit
def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _log2_decay('''

OLD = """    r_mid = tl.sum(tl.where((o_t == BT // 2 - 1)[:, None], b_G, 0.0), 0)
    g_last = tl.sum(tl.where((o_t == BT - 1)[:, None], b_G, 0.0), 0)            # G at the chunk's last row
"""
LAST8 = [
    ("\n@triton.jit\ndef _log2_decay(", HELPERS),
    (OLD, """    l0, l1, l2, l3, l4, l5, l6, l7 = _split8(tl.where((o_t == BT - 1)[:, None], b_G, 0.0), BT, K)
    l0, l1, l2, l3, l4, l5, l6, l7 = tl.reduce((l0, l1, l2, l3, l4, l5, l6, l7), 0, _add8)
    g_last = _join8(l0, l1, l2, l3, l4, l5, l6, l7, K)
    r_mid = g_last * 0.5
"""),
]
LAST4 = [
    ("\n@triton.jit\ndef _log2_decay(", HELPERS),
    (OLD, """    l0, l1, l2, l3 = _split4(tl.where((o_t == BT - 1)[:, None], b_G, 0.0), BT, K)
    l0, l1, l2, l3 = tl.reduce((l0, l1, l2, l3), 0, _add4)
    g_last = _join4(l0, l1, l2, l3, K)
    r_mid = g_last * 0.5
"""),
]
STAGE1 = {
    "base": [],
    "split16_beta_early": _sr.STAGE1["split_reduce"] + BETA_EARLY,
    "last8": LAST8,
    "last8_beta_early": LAST8 + BETA_EARLY,
    "last4_beta_early": LAST4 + BETA_EARLY,
}
STAGE2 = {}
LAUNCH = {}
