"""Can this Triton keep two Hopper wgmma products in flight and wait once? (Gluon, on a GPU)

    python benchmarks/gluon_wgmma_probe.py

Plain Triton waits for every wgmma product whose accumulator is not loop-carried right after issuing it
(docs/perf-notes.md, session 4): stage 2's independent products run one after another. Gluon
(`triton.experimental.gluon`, shipped in the same wheel) issues them with `is_async=True` and waits where
told (`warpgroup_mma_wait`). This probe runs one 64 × 64 × 64 bf16 product with both operands in shared
memory and one with the left operand in registers (as stage 2's state is), both asynchronous, then a single
wait, and checks them against torch. On the H200 with Triton 3.6.0 (2026-11-30) both match to 6e-6.
"""

import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait


@gluon.jit
def _two_async_products(a_ptr, b_ptr, c_ptr, d_ptr, M: gl.constexpr, N: gl.constexpr, K: gl.constexpr):
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    o_m = gl.arange(0, M, layout=gl.SliceLayout(1, blk))
    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, blk))
    o_kr = gl.arange(0, K, layout=gl.SliceLayout(1, blk))
    o_n = gl.arange(0, N, layout=gl.SliceLayout(0, blk))
    a = gl.load(a_ptr + o_m[:, None] * K + o_k[None, :])
    b = gl.load(b_ptr + o_kr[:, None] * N + o_n[None, :])
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    a_s = gl.allocate_shared_memory(gl.bfloat16, [M, K], smem, a)
    b_s = gl.allocate_shared_memory(gl.bfloat16, [K, N], smem, b)
    fence_async_shared()
    acc: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 16])
    x = warpgroup_mma(a_s, b_s, gl.zeros([M, N], gl.float32, layout=acc), is_async=True)
    a_r = gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2))
    y = warpgroup_mma(a_r, b_s, gl.zeros([M, N], gl.float32, layout=acc), is_async=True)
    x, y = warpgroup_mma_wait(0, deps=[x, y])
    o_mc = gl.arange(0, M, layout=gl.SliceLayout(1, acc))
    o_nc = gl.arange(0, N, layout=gl.SliceLayout(0, acc))
    gl.store(c_ptr + o_mc[:, None] * N + o_nc[None, :], x)
    gl.store(d_ptr + o_mc[:, None] * N + o_nc[None, :], y)


def main():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("gluon_wgmma_probe: needs a Hopper GPU")
    M = N = K = 64
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(M, N, device="cuda")
    d = torch.empty(M, N, device="cuda")
    _two_async_products[(1,)](a, b, c, d, M, N, K, num_warps=4)
    ref = a.float() @ b.float()
    err_s, err_r = (c - ref).abs().max().item(), (d - ref).abs().max().item()
    print(f"triton {triton.__version__}: max |error| shared-memory operands {err_s:.1e}, register operand {err_r:.1e}")
    sys.exit(0 if max(err_s, err_r) < 1e-3 else 1)


if __name__ == "__main__":
    main()
