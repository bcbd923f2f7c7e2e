"""fastkda.kernels.direct_launch: the direct launch runs the kernel Triton would run (GPU), and steps aside for
launch hooks and the interpreter (CPU)."""

import pytest
import torch
from triton import knobs

import fastkda
from fastkda.kernels import direct_launch as launch_mod

from conftest import HAS_CUDA


def test_hooks_are_detected():
    assert not launch_mod._hooked()

    def hook(metadata):
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert launch_mod._hooked()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert not launch_mod._hooked()


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter runs only without CUDA (conftest)")
def test_interpreter_takes_tritons_path():
    assert launch_mod.INTERPRETING and not launch_mod._direct


def test_only_the_tested_triton_launches_directly():
    import triton
    tested = triton.__version__.startswith(launch_mod.TESTED_TRITON)
    assert launch_mod._direct == (tested and not launch_mod.INTERPRETING)


def _call(T, H=4, D=128, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, g = (torch.randn(1, T, H, D, generator=gen).to(torch.bfloat16).cuda() for _ in range(4))
    beta = torch.randn(1, T, H, generator=gen).to(torch.bfloat16).cuda()
    A_log, dt_bias = torch.rand(H, generator=gen).cuda(), torch.rand(H, D, generator=gen).cuda()
    h0 = (0.1 * torch.randn(1, H, D, D, generator=gen)).cuda()

    def run():
        out, ht = torch.empty_like(v), torch.empty_like(h0)
        fastkda.fwd(q, k, v, g, beta, D ** -0.5, out, A_log, dt_bias, -5.0, h0, ht)
        return out, ht
    return run


@pytest.mark.skipif(not HAS_CUDA or not launch_mod._direct, reason="needs a CUDA device and the tested Triton")
def test_direct_launch_matches_tritons_launch_across_specializations(monkeypatch):
    # T = 1024 and T = 1000 specialize the integer arguments differently (divisible by 16 or not): each must
    # get its own compiled kernel, and the direct launches must give Triton's results bit for bit.
    from fastkda import kernels
    monkeypatch.setattr(kernels, "FUSED", False)     # the two stages (short fixed-length calls are fused by rule)
    for T in (1024, 1000, 1024):
        run = _call(T)
        monkeypatch.setattr(launch_mod, "_direct", False)
        expected = run()
        monkeypatch.setattr(launch_mod, "_direct", True)
        before = len(launch_mod._compiled)
        run()                 # first launch of a new specialization: through Triton, then kept
        after_first = len(launch_mod._compiled)
        got = run()           # direct
        torch.cuda.synchronize()
        assert len(launch_mod._compiled) == after_first >= before
        assert launch_mod._direct, "the direct path fell back to Triton's launch path"
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    keys = {key[2] for key in launch_mod._compiled}
    assert len(keys) >= 2 * 2, "T = 1024 and T = 1000 should have compiled stage 1 and stage 2 separately"
