"""Single-instruction exp2 and reciprocal for stage 1's elementwise work.

Triton's exp, exp2 and division keep IEEE subnormal handling: each becomes a range test plus two predicated
multiplies around the special-function unit instruction, and division adds Newton steps. In stage 1 these
made up a fifth of all instructions (docs/perf-notes.md, v5). Every value stage 1 exponentiates is either
in the normal fp32 range or negligible (a decay below 2^-126 of the chunk's scale), so flushing subnormals
to zero changes nothing that matters. The CPU interpreter cannot run inline PTX: there the plain Triton
functions are used.
"""

import triton
import triton.language as tl


@triton.jit
def _exp2(x, INTERPRET: tl.constexpr):
    """2^x, subnormal results flushed to zero (one MUFU.EX2)."""
    if INTERPRET:
        return tl.exp2(x)
    else:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _rcp(x, INTERPRET: tl.constexpr):
    """1 / x to about one ulp (one MUFU.RCP); 1 / inf = 0."""
    if INTERPRET:
        return 1.0 / x
    else:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _sigmoid(x, INTERPRET: tl.constexpr):
    """1 / (1 + e^-x): 0 for x → −inf (2^inf = inf, 1 / inf = 0), 1 for x → +inf."""
    return _rcp(1.0 + _exp2(x * -1.4426950408889634, INTERPRET), INTERPRET)
