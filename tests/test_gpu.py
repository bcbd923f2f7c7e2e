"""GPU-only checks (skipped without CUDA): graph capture, the six benchmark shapes, the full validation suite."""

import pytest
import torch

import fastkda
from fastkda.validation import quick_check, run_suite

from conftest import HAS_CUDA, benchmark_script

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")

MIXED = [1300, 547, 2048, 963, 271, 3063]
BENCHMARK_SHAPES = [(H, lens) for H in (96, 64) for lens in ([8192], MIXED, [1024] * 8)]


def _inputs(lens, H=4, D=128, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    x = [torch.randn(1, T, H, D, generator=gen).to(torch.bfloat16).cuda() for _ in range(4)]
    beta = torch.randn(1, T, H, generator=gen).to(torch.bfloat16).cuda()
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32).cuda()
    h0 = (0.1 * torch.randn(len(lens), H, D, D, generator=gen)).cuda()
    return x, beta, cu, h0


def test_cuda_graph_capture_and_replay_on_new_inputs():
    H, D = 4, 128
    (q, k, v, g), beta, cu, h0 = _inputs([100, 0, 333, 64], H=H)
    A_log, dt_bias = torch.rand(H).cuda(), torch.rand(H, D).cuda()
    out, ht = torch.empty_like(v), torch.empty_like(h0)

    def call():
        fastkda.fwd(q, k, v, g, beta, D ** -0.5, out, A_log, dt_bias, -5.0, h0, ht, cu)

    from fastkda.bench.timing import capture_graph
    graph = capture_graph(call)             # its first call, on a side stream, compiles outside the capture
    # new values, same shapes (new sequence boundaries too): the replay must follow them
    (q2, k2, v2, g2), beta2, cu2, h02 = _inputs([7, 250, 0, 240], H=H, seed=1)
    for dst, src in ((q, q2), (k, k2), (v, v2), (g, g2), (beta, beta2), (cu, cu2), (h0, h02)):
        dst.copy_(src)
    out.fill_(float("nan"))
    ht.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    out_eager, ht_eager = torch.empty_like(out), torch.empty_like(ht)
    fastkda.fwd(q2, k2, v2, g2, beta2, D ** -0.5, out_eager, A_log, dt_bias, -5.0, h02, ht_eager, cu2)
    assert torch.equal(out, out_eager) and torch.equal(ht, ht_eager)


@pytest.mark.parametrize("H,lens", BENCHMARK_SHAPES, ids=[f"H{H}-{len(l)}seq" for H, l in BENCHMARK_SHAPES])
def test_quick_check_on_the_six_benchmark_shapes(H, lens):
    result = quick_check(fastkda.fwd, seq_lens=lens, H=H, device="cuda")
    assert result.passed, result.message


def test_full_validation_suite_passes_every_tier():
    report = run_suite(fastkda.fwd, tiers="all", device="cuda", size="full")
    print(report.table())
    assert report.passed, "\n".join(r.message for r in report.results if not r.passed)


def test_validation_suite_passes_on_the_fused_kernel(monkeypatch):
    # Every case of the suite the fused kernel covers (bf16, K = V = 128: most of them) runs on it, whatever
    # its size; the others run the two stages.
    from fastkda import kernels
    monkeypatch.setattr(kernels, "FUSED", True)
    report = run_suite(fastkda.fwd, tiers="all", device="cuda", size="full")
    print(report.table())
    assert report.passed, "\n".join(r.message for r in report.results if not r.passed)


def test_unaligned_inputs_run_on_the_triton_kernels():
    # Inputs that start one bf16 element into their storage cannot be copied in 16-byte pieces: the launcher
    # routes them to the Triton stage 1 and stage 2. Both paths are ~3.7e-3 from float64 (validation suite)
    # with the same bf16 rounding points but different fp32 values before them: they agree to well within
    # that; the wrong data or an unwritten output would be O(1) or NaN.
    from fastkda import kernels
    H, D = 2, 128
    (q, k, v, g), beta, cu, h0 = _inputs([70, 0, 33], H=H)

    def shifted(x):                   # same values, storage offset of one element
        buf = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
        y = buf[1:].view(x.shape)
        y.copy_(x)
        return y

    qs, ks, vs, gs = (shifted(x) for x in (q, k, v, g))
    assert not kernels.gluon_stage1_applies(qs, ks, gs) and kernels.gluon_stage1_applies(q, k, g)
    A_log, dt_bias = torch.rand(H).cuda(), torch.rand(H, D).cuda()
    results = []
    for args in ((q, k, v, g), (qs, ks, vs, gs)):
        out, ht = torch.full_like(v, float("nan")), torch.full_like(h0, float("nan"))
        fastkda.fwd(*args, beta, D ** -0.5, out, A_log, dt_bias, -5.0, h0, ht, cu)
        results.append((out.float(), ht))
    (o_a, s_a), (o_u, s_u) = results
    assert not o_u.isnan().any() and not s_u.isnan().any()
    assert float((o_u - o_a).norm() / o_a.norm()) < 5e-3
    assert float((s_u - s_a).norm() / s_a.norm()) < 5e-3


# The gate arithmetic of the Gluon stage 1 (chunk_prepare_gluon._block_decays): False while 2^11·a goes in two fp16
# pieces (G − r within 2^-22 of exact), True where it is rounded once to fp16.
GLUON_GATE_FP16 = True


@pytest.mark.parametrize("case", benchmark_script("stage1_agreement").CASES)
def test_each_stage1_kernel_matches_a_float64_model_of_its_rounding(case):
    # The Hopper stage 1 (Gluon) and the portable one (Triton), each against benchmarks/stage1_agreement.py's
    # float64 model with the kernels' bf16 rounding points (the tensor-core operands k̂⊙e^{±(G−r)}, q̂⊙e^{G−r}
    # and the stored a1, aqk, kt, all to nearest) and the kernel's own gate arithmetic. What is left is each
    # kernel's T (fp16 products or bf16 high/low halves vs tf32: ~11 bits) and fp32 sums and exponentials, which
    # move a rounding only where a value sits at a rounding boundary: the tolerances are those that held the
    # two kernels to each other. Measured on the H200 (session 38): Gluon a1 ≤ 6.7e-4, aqk ≤ 3.9e-4, kt ≤ 6e-7,
    # tb ≤ 6e-6, gl ≤ 1.3e-5; Triton a1 ≤ 3e-5, aqk ≤ 4.2e-4, kt ≤ 9e-7, tb ≤ 7.4e-6. Against the
    # model, not each other: a G that differs by ~1e-4 relative (the gate rounded once) reshuffles which operand
    # roundings go up and down and moves the kernels 2.7–3.8e-3 apart on a1 and aqk, the size of the bf16
    # rounding itself, with neither kernel farther from the exact math (docs/perf-notes.md, session 38).
    # A wrong mask, factor, row or layout is O(1).
    from fastkda import kernels
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon stage 1 runs on Hopper")
    tool = benchmark_script("stage1_agreement")
    D, lens, H, HV, flags = case
    x = tool.case_inputs(D, lens, H, HV, flags, seed=D + len(lens), device="cuda")
    assert kernels.gluon_stage1_applies(x["q"], x["k"], x["g"])
    tolerances = {"a1": 2e-3, "aqk": 2e-3, "kt": 5e-4, "tb": 5e-4, "gl": 5e-4}
    exact = tool.stage1_model(x)
    reports, ok = [], True
    for name, gluon, gate_fp16 in (("gluon", True, GLUON_GATE_FP16), ("triton", False, False)):
        model = tool.stage1_model(x, gate_fp16=gate_fp16, rounded=True)
        got = tool.kernel_tensors(tool.run_stage1(x, gluon), model["a1"].shape[1])
        assert all(bool(torch.isfinite(t).all()) for t in got.values()), name
        errors = {t: tool.relative_l2(got[t], model[t]) for t in tolerances}
        ok &= all(errors[t] < tol for t, tol in tolerances.items())
        # gl = e^{G_last} element by element against the exact math: a gate rounded once to fp16 (u = 2^-11
        # relative per step, every step's a ≤ 0 of one sign) puts the exponent within u·|ln gl| of the exact one
        # and gl within e^that − 1, relative; fp32 sums and exponentials add ~1e-5 of the exponent (32 steps of fp32,
        # ex2.approx); below 2^-120 both flush toward zero. A wrong channel, chunk or sum is off by O(1) factors.
        gl_exact = exact["gl"]
        u = 2.0 ** -11 if gate_fp16 and flags[1] else 0.0
        bound = gl_exact * torch.expm1((u + 1e-5) * gl_exact.clamp_min(2.0 ** -126).log().abs() + 1e-5) + 2.0 ** -120
        excess = float(((got["gl"] - gl_exact).abs() / bound).max())
        ok &= excess <= 1.0
        # every tensor's error in the message (and printed: `pytest -rP` shows it for a pass)
        reports.append(name + ": " + ", ".join(f"{t} {e:.2e} (< {tolerances[t]:.0e})" for t, e in errors.items())
                       + f", gl at {excess:.2f} of its element bound")
    print("; ".join(reports))
    assert ok, "; ".join(reports)


def test_gluon_number_helpers_are_exact_in_the_accumulator_layout():
    # chunk_prepare_gluon's conversions by hand (inline PTX and register picks) against torch, on a [64, 32]
    # tile in the wgmma accumulator layout the producers use: an element in the wrong half of a register pair,
    # or the wrong register picked as the last column, is wrong by O(1) here; the conversions are exact.
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernels run on Hopper")
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from fastkda.kernels.chunk_prepare_gluon import _last_column, _to_f32

    @gluon.jit
    def helpers(x16, x32, up, last, R: gl.constexpr, C: gl.constexpr):
        acc: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, C, 16])
        r = gl.arange(0, R, layout=gl.SliceLayout(1, acc))
        c = gl.arange(0, C, layout=gl.SliceLayout(0, acc))
        off = r[:, None] * C + c[None, :]
        gl.store(up + off, _to_f32(gl.load(x16 + off)))
        gl.store(last + r, _last_column(gl.load(x32 + off), R, C))

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 32, generator=gen) * torch.logspace(-6, 3.5, 32)).cuda()
    x16 = x.to(torch.bfloat16)
    up, last = torch.empty_like(x), torch.empty(64, device="cuda")
    helpers[(1,)](x16, x, up, last, 64, 32, num_warps=4)
    assert torch.equal(up, x16.float())
    assert torch.equal(last, x[:, 31])


@pytest.mark.parametrize("D,lens,H,HV,with_h0,state_v_first", [
    (128, [8192], 2, 2, True, True),
    (128, [100, 0, 333, 64, 1], 2, 4, False, False),
    (64, [31, 32, 33, 0], 1, 2, True, False),
])
def test_gluon_stage2_matches_the_triton_stage2(D, lens, H, HV, with_h0, state_v_first):
    # The Hopper stage 2 (Gluon) and the portable one (Triton) run the same math on the same stage-1 tensors;
    # they differ only in fp32 summation order (Uᵀ in one accumulator vs three), which the bf16 rounding of
    # Uᵀ for the next products amplifies to ~1e-4 relative. Covers padding rows, an empty sequence (final
    # state = initial state exactly), both state layouts, no initial state, K = V = 64.
    from fastkda import kernels
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon stage 2 runs on Hopper")
    gen = torch.Generator().manual_seed(len(lens))
    T = sum(lens)
    q, k = (torch.randn(1, T, H, D, generator=gen).to(torch.bfloat16).cuda() for _ in range(2))
    v, g = (torch.randn(1, T, HV, D, generator=gen).to(torch.bfloat16).cuda() for _ in range(2))
    beta = torch.randn(1, T, HV, generator=gen).to(torch.bfloat16).cuda()
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32).cuda()
    h0 = (0.1 * torch.randn(len(lens), HV, D, D, generator=gen)).cuda() if with_h0 else None
    st = kernels.prepare_chunks(q, k, v, g, beta, scale=D ** -0.5, A_log=torch.rand(HV, generator=gen).cuda(),
                                dt_bias=torch.rand(HV, D, generator=gen).cuda(), lower_bound=-5.0, cu_seqlens=cu,
                                use_qk_l2norm=True, use_gate=True, use_beta_sigmoid=True)
    assert kernels.gluon_stage2_applies(st, v)
    results = []
    for use_gluon in (True, False):
        out = torch.full_like(v, float("nan"))
        ht = torch.full((len(lens), HV, D, D), float("nan"), device="cuda")
        saved, kernels.STAGE2_GLUON = kernels.STAGE2_GLUON, use_gluon
        try:
            kernels.run_recurrence(st, v, out=out, initial_state=h0, final_state=ht, cu_seqlens=cu,
                                   state_v_first=state_v_first)
        finally:
            kernels.STAGE2_GLUON = saved
        results.append((out.float(), ht))
    (o_g, s_g), (o_t, s_t) = results
    assert not o_g.isnan().any() and not s_g.isnan().any()
    assert float((o_g - o_t).norm() / o_t.norm()) < 1e-3
    assert float((s_g - s_t).norm() / s_t.norm()) < 1e-3
    empty = [n for n, length in enumerate(lens) if length == 0]
    for n in empty:
        assert torch.equal(s_g[n], h0[n] if with_h0 else torch.zeros_like(s_g[n]))
