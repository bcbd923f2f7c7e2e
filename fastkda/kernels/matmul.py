"""A matrix product that also runs correctly under Triton's CPU interpreter."""

import triton
import triton.language as tl


@triton.jit
def _mm(a, b, INTERPRET: tl.constexpr):
    """a · b with fp32 accumulation. Triton's CPU interpreter mis-multiplies bf16 operands, so there the
    (exactly representable) operands are widened to fp32 first: the same products, the same sums."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)
