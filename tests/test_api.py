"""The public API (fastkda/api.py) on CPU tensors, against the float64 recurrence.

On CPU both ``fastkda.fwd`` and ``fastkda.chunk_kda`` run the float32 chunked reference, so what is tested
here is the API's contract: in-place writes, layouts, dtypes, flags and keyword handling, and that the
numbers are the recurrence's to within bf16 rounding of ``out``.
"""

import itertools

import pytest
import torch

import fastkda
from fastkda.reference import kda_recurrence

BF16 = torch.bfloat16
F32 = torch.float32
SENTINEL = 12345.0


def make(B=1, T=48, H=2, HV=4, K=64, V=64, N=None, dtype=BF16, state_dtype=F32, seed=0, lower_bound=-5.0):
    gen = torch.Generator().manual_seed(seed)
    N = B if N is None else N

    def rnd(*shape, dt=dtype, s=1.0):
        return (torch.randn(*shape, generator=gen) * s).to(dt)

    return dict(
        q=rnd(B, T, H, K), k=rnd(B, T, H, K), v=rnd(B, T, HV, V), g=rnd(B, T, HV, K, s=2.0),
        beta=rnd(B, T, HV, s=2.0), A_log=rnd(HV, dt=F32, s=0.5), dt_bias=rnd(HV, K, dt=F32, s=0.5),
        lower_bound=lower_bound, initial_state=rnd(N, HV, V, K, dt=state_dtype),
    )


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def run_fwd(x, scale=None, cu_seqlens=None, with_initial=True, final_dtype=F32):
    """fastkda.fwd on fresh sentinel-filled buffers; returns (out, final_state)."""
    K = x["q"].shape[-1]
    out = torch.full_like(x["v"], SENTINEL)
    s0 = x["initial_state"]
    final = None if final_dtype is None else torch.full(s0.shape, SENTINEL, dtype=final_dtype)
    ret = fastkda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], K ** -0.5 if scale is None else scale, out,
                      x["A_log"], x["dt_bias"], x["lower_bound"], s0 if with_initial else None, final, cu_seqlens)
    assert ret is None
    return out, final


def ref(x, scale=None, cu_seqlens=None, with_initial=True, **kw):
    args = {n: x[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "lower_bound")}
    return kda_recurrence(**args, scale=scale, cu_seqlens=cu_seqlens,
                          initial_state=x["initial_state"] if with_initial else None, **kw)


# --------------------------------------------------------------------------------------------------
# fwd
# --------------------------------------------------------------------------------------------------

def test_fwd_fixed_length_matches_recurrence():
    x = make(B=2, T=70)
    out, final = run_fwd(x)
    o_ref, s_ref = ref(x)
    assert out.dtype == BF16 and final.dtype == F32
    assert rel_l2(out, o_ref) < 5e-3
    assert rel_l2(final, s_ref) < 1e-4


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
def test_fwd_varlen_matches_recurrence(cu_dtype):
    lens = [0, 30, 1, 45, 0, 17]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=cu_dtype)
    x = make(T=int(cu[-1]), N=len(lens), seed=1)
    out, final = run_fwd(x, cu_seqlens=cu)
    o_ref, s_ref = ref(x, cu_seqlens=cu)
    assert rel_l2(out, o_ref) < 5e-3
    assert rel_l2(final, s_ref) < 1e-4
    for n in (0, 4):                                       # empty sequences: final state = initial state
        assert torch.equal(final[n], x["initial_state"][n])
    # sequences are independent: each packed one equals the fixed-length run of it alone
    a, b = int(cu[3]), int(cu[4])
    xs = dict(x, initial_state=x["initial_state"][3:4].clone(),
              **{n: x[n][:, a:b].contiguous() for n in ("q", "k", "v", "g", "beta")})
    out3, final3 = run_fwd(xs)
    assert rel_l2(out[:, a:b], out3) < 1e-2 and rel_l2(final[3:4], final3) < 1e-5


def test_fwd_without_initial_and_final_state():
    x = make(T=40, seed=2)
    out, final = run_fwd(x, with_initial=False, final_dtype=None)
    assert final is None
    o_ref, _ = ref(x, with_initial=False)
    assert rel_l2(out, o_ref) < 5e-3
    # and the initial state is used when given
    out_s, _ = run_fwd(x, final_dtype=None)
    assert rel_l2(out_s, o_ref) > 1e-2


def test_fwd_final_state_without_initial_state():
    x = make(T=40, seed=3)
    out, final = run_fwd(x, with_initial=False)
    o_ref, s_ref = ref(x, with_initial=False)
    assert rel_l2(out, o_ref) < 5e-3
    assert rel_l2(final, s_ref) < 1e-4


def test_fwd_empty_sequences_without_initial_state_are_written_as_zeros():
    """FlashKDA leaves an empty sequence's final state unwritten; fastkda writes its (zero) initial state."""
    cu = torch.tensor([0, 0, 20, 20], dtype=torch.int32)
    x = make(T=20, N=3, seed=4)
    _, final = run_fwd(x, cu_seqlens=cu, with_initial=False)
    assert torch.equal(final[0], torch.zeros_like(final[0]))
    assert torch.equal(final[2], torch.zeros_like(final[2]))
    assert not (final == SENTINEL).any()


@pytest.mark.parametrize("state_dtype", [BF16, F32])
def test_fwd_zero_tokens(state_dtype):
    x = make(T=0, N=2, seed=5, state_dtype=state_dtype)
    out, final = run_fwd(x, cu_seqlens=torch.tensor([0, 0, 0], dtype=torch.int64), final_dtype=state_dtype)
    assert out.shape == (1, 0, 4, 64)
    assert torch.equal(final, x["initial_state"])


def test_fwd_bf16_states():
    x = make(T=50, seed=6, state_dtype=BF16)
    out, final = run_fwd(x, final_dtype=BF16)
    assert final.dtype == BF16
    o_ref, s_ref = ref(x)                                   # the bf16 initial state upcast exactly
    assert rel_l2(out, o_ref) < 5e-3
    assert rel_l2(final, s_ref) < 5e-3                       # bf16 rounding of the stored state (2^-9 relative)
    _, final32 = run_fwd(x, final_dtype=F32)
    assert torch.equal(final, final32.to(BF16))


def test_fwd_final_state_in_place_on_initial_state():
    x = make(B=2, T=33, seed=7)
    out_sep, final_sep = run_fwd(x)
    s = x["initial_state"].clone()
    out = torch.full_like(x["v"], SENTINEL)
    fastkda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.125, out, x["A_log"], x["dt_bias"], -5.0,
                initial_state=s, final_state=s)
    assert torch.equal(out, out_sep)
    assert torch.equal(s, final_sep)


def test_the_longest_sequence_reaches_the_dispatch(monkeypatch):
    # Where the host knows cu_seqlens' values (cu_seqlens_cpu, or cu_seqlens on the CPU), the longest sequence
    # goes to the kernels' route (kernels.fused_by_rule); a fixed-length call's is T. A bad copy raises.
    cu = torch.tensor([0, 11, 11, 30], dtype=torch.int32)
    x = make(T=30, N=3, seed=8)
    seen = []
    monkeypatch.setattr(fastkda.api, "forward", lambda *args, **kwargs: seen.append(kwargs["max_seqlen"]))
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], 0.125, torch.empty_like(x["v"]), x["A_log"], x["dt_bias"],
            -5.0)
    fastkda.fwd(*args, cu_seqlens=cu, cu_seqlens_cpu=cu.clone())
    fastkda.fwd(*args, cu_seqlens=cu)
    ck(x, **FUSED, cu_seqlens=cu, cu_seqlens_cpu=cu.clone())
    xf = make(B=2, T=70)
    fastkda.fwd(xf["q"], xf["k"], xf["v"], xf["g"], xf["beta"], 0.125, torch.empty_like(xf["v"]), xf["A_log"],
                xf["dt_bias"], -5.0)
    assert seen == [19, 19, 19, 70]
    with pytest.raises(ValueError, match="cu_seqlens"):
        fastkda.fwd(*args, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 11, 12, 30], dtype=torch.int32) - 1)
    assert len(seen) == 4


def test_fwd_in_place_varlen_with_empty_sequence():
    cu = torch.tensor([0, 11, 11, 30], dtype=torch.int32)
    x = make(T=30, N=3, seed=8)
    _, final_sep = run_fwd(x, cu_seqlens=cu)
    s = x["initial_state"].clone()
    fastkda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.125, torch.empty_like(x["v"]), x["A_log"],
                x["dt_bias"], -5.0, initial_state=s, final_state=s, cu_seqlens=cu)
    assert torch.equal(s, final_sep)
    assert torch.equal(s[1], x["initial_state"][1])


@pytest.mark.parametrize("K,V", [(128, 128), (64, 128), (128, 64)])
def test_fwd_head_dims(K, V):
    x = make(T=20, H=1, HV=2, K=K, V=V, seed=9)
    out, final = run_fwd(x)
    assert final.shape == (1, 2, V, K)
    o_ref, s_ref = ref(x)
    assert rel_l2(out, o_ref) < 5e-3
    assert rel_l2(final, s_ref) < 1e-4


def test_fwd_fp32_inputs_and_fp32_beta():
    x = make(T=40, dtype=F32, seed=10)
    out, final = run_fwd(x)
    o_ref, s_ref = ref(x)
    assert out.dtype == F32
    assert rel_l2(out, o_ref) < 1e-4
    assert rel_l2(final, s_ref) < 1e-4
    # bf16 inputs with an fp32 beta holding the same values give the same result as a bf16 beta
    xb = make(T=40, seed=11)
    o1, s1 = run_fwd(xb)
    o2, s2 = run_fwd(dict(xb, beta=xb["beta"].float()))
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


def test_fwd_scale_and_lower_bound_are_used():
    x = make(T=30, seed=12)
    o1, _ = run_fwd(x, scale=0.125)
    o2, _ = run_fwd(x, scale=0.25)
    assert rel_l2(o2, 2 * o1.float()) < 1e-2
    o_ref, _ = ref(dict(x, lower_bound=-1.0), scale=0.3)
    o3, _ = run_fwd(dict(x, lower_bound=-1.0), scale=0.3)
    assert rel_l2(o3, o_ref) < 5e-3
    assert rel_l2(o3, ref(x, scale=0.3)[0]) > 1e-2


def test_fwd_requires_grad():
    x = make(T=10, seed=13)
    xg = dict(x, q=x["q"].clone().requires_grad_(True))
    with pytest.raises(NotImplementedError):
        run_fwd(xg)
    with torch.no_grad():
        out, _ = run_fwd(xg)
    assert not out.requires_grad
    with torch.inference_mode():
        out2, _ = run_fwd(xg)
    assert torch.equal(out, out2)


# --------------------------------------------------------------------------------------------------
# chunk_kda
# --------------------------------------------------------------------------------------------------

FUSED = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)


def ck(x, **kw):
    """chunk_kda on x's tensors (initial state and gate params passed unless overridden)."""
    args = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                lower_bound=x["lower_bound"])
    args.update(kw)
    return fastkda.chunk_kda(**args)


def test_chunk_kda_without_final_state_returns_none():
    x = make(T=20, seed=20)
    o, s = ck(x, **FUSED)
    assert s is None
    assert o.shape == x["v"].shape and o.dtype == x["v"].dtype
    assert rel_l2(o, ref(x, with_initial=False)[0]) < 5e-3


@pytest.mark.parametrize("state_v_first", [False, True])
def test_chunk_kda_final_state_layout(state_v_first):
    x = make(T=30, K=64, V=128, seed=21)                      # K != V: the layouts differ in shape
    s0_vk = x["initial_state"]
    s0 = s0_vk if state_v_first else s0_vk.transpose(-1, -2).contiguous()
    o, s = ck(x, **FUSED, initial_state=s0, output_final_state=True, state_v_first=state_v_first)
    assert s.dtype == F32
    assert s.shape == ((1, 4, 128, 64) if state_v_first else (1, 4, 64, 128))
    o_ref, s_ref = ref(x)                                     # v-first
    assert rel_l2(o, o_ref) < 5e-3
    assert rel_l2(s if state_v_first else s.transpose(-1, -2), s_ref) < 1e-4


def test_chunk_kda_state_layout_default_is_k_first():
    x = make(T=10, K=64, V=128, seed=22)
    with pytest.raises(ValueError, match="initial_state"):
        ck(x, **FUSED, initial_state=x["initial_state"])      # v-first shape without state_v_first
    with pytest.raises(ValueError, match="initial_state"):
        ck(x, **FUSED, initial_state=x["initial_state"].transpose(-1, -2).contiguous(), state_v_first=True)
    with pytest.raises(ValueError, match="initial_state"):
        ck(x, **FUSED, initial_state=x["initial_state"].double(), state_v_first=True)


def test_chunk_kda_bf16_initial_state_gives_fp32_final_state():
    x = make(T=10, seed=23, state_dtype=BF16)
    _, s = ck(x, **FUSED, initial_state=x["initial_state"], state_v_first=True, output_final_state=True)
    assert s.dtype == F32
    assert rel_l2(s, ref(x)[1]) < 1e-4


def test_chunk_kda_matches_fwd_for_fused_flags():
    lens = [13, 0, 40]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    x = make(T=53, N=3, seed=24)
    out, final = run_fwd(x, scale=0.1, cu_seqlens=cu)
    o, s = ck(x, **FUSED, scale=0.1, initial_state=x["initial_state"], output_final_state=True,
              state_v_first=True, cu_seqlens=cu)
    torch.testing.assert_close(o, out, rtol=0, atol=0)
    torch.testing.assert_close(s, final, rtol=0, atol=0)


def test_chunk_kda_default_scale():
    x = make(T=20, seed=25)
    o, _ = ck(x, **FUSED)
    o2, _ = ck(x, **FUSED, scale=64 ** -0.5)
    assert torch.equal(o, o2)
    o3, _ = ck(x, **FUSED, scale=1.0)
    assert rel_l2(o3, 8 * o.float()) < 1e-2


def test_chunk_kda_flat_dt_bias():
    x = make(T=20, seed=26)
    o, s = ck(x, **FUSED, output_final_state=True)
    o2, s2 = ck(x, **FUSED, output_final_state=True, dt_bias=x["dt_bias"].reshape(-1))
    assert torch.equal(o, o2) and torch.equal(s, s2)
    with pytest.raises(ValueError, match="dt_bias"):
        ck(x, **FUSED, dt_bias=x["dt_bias"].reshape(-1)[:-1].contiguous())


def test_chunk_kda_gate_without_A_log_or_dt_bias():
    x = make(T=20, seed=27)
    o, s = ck(x, **FUSED, A_log=None, output_final_state=True, state_v_first=True)
    o_ref, s_ref = ref(dict(x, A_log=None), with_initial=False)
    assert rel_l2(o, o_ref) < 5e-3 and rel_l2(s, s_ref) < 1e-4
    o, _ = ck(x, **FUSED, dt_bias=None)
    assert rel_l2(o, ref(dict(x, dt_bias=None), with_initial=False)[0]) < 5e-3


def test_chunk_kda_gate_off_requires_safe_gate():
    x = make(T=20, seed=28)
    with pytest.raises(ValueError, match="safe_gate"):
        ck(x, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    with pytest.raises(ValueError, match="safe_gate"):
        fastkda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"])   # fla's defaults: gate off, not safe


def test_chunk_kda_gate_off_uses_g_as_log_decay():
    x = make(T=40, seed=29)
    a = (-5 * torch.rand(x["g"].shape, generator=torch.Generator().manual_seed(3))).to(BF16)
    xa = dict(x, g=a)
    o, s = ck(xa, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
              output_final_state=True, state_v_first=True)
    o_ref, s_ref = kda_recurrence(x["q"], x["k"], x["v"], a, x["beta"], use_gate=False)
    assert rel_l2(o, o_ref) < 5e-3 and rel_l2(s, s_ref) < 1e-4
    # A_log, dt_bias and lower_bound are ignored without the in-kernel gate
    o2, s2 = ck(xa, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
                output_final_state=True, state_v_first=True, A_log=None, dt_bias=None, lower_bound=None)
    assert torch.equal(o, o2) and torch.equal(s, s2)


def test_chunk_kda_activations_off_by_default():
    """fla's defaults: q, k, beta and g are used as given (safe_gate asserts g is a bounded log-decay)."""
    x = make(T=30, seed=30)
    gen = torch.Generator().manual_seed(4)
    qn = torch.nn.functional.normalize(x["q"].float(), dim=-1).to(BF16)
    kn = torch.nn.functional.normalize(x["k"].float(), dim=-1).to(BF16)
    a = (-torch.rand(x["g"].shape, generator=gen)).to(BF16)
    b = torch.rand(x["beta"].shape, generator=gen).to(BF16)
    o, s = fastkda.chunk_kda(qn, kn, x["v"], a, b, safe_gate=True, output_final_state=True)
    o_ref, s_ref = kda_recurrence(qn, kn, x["v"], a, b, use_qk_l2norm=False, use_gate=False,
                                  use_beta_sigmoid=False, state_v_first=False)
    assert rel_l2(o, o_ref) < 5e-3 and rel_l2(s, s_ref) < 1e-4
    # turning the flags on changes the result (the beta sigmoid maps b in [0, 1] to [0.5, 0.73])
    o2, _ = fastkda.chunk_kda(qn, kn, x["v"], a, b, safe_gate=True, use_beta_sigmoid_in_kernel=True)
    assert rel_l2(o2, o_ref) > 1e-2


def test_chunk_kda_lower_bound_required_with_gate():
    x = make(T=10, seed=31)
    with pytest.raises(ValueError, match="lower_bound"):
        ck(x, **FUSED, lower_bound=None)
    for lb in (-5.5, 0.0, 0.1, float("nan")):
        with pytest.raises(ValueError, match="lower_bound"):
            ck(x, **FUSED, lower_bound=lb)
    ck(x, **FUSED, lower_bound=-5)


def test_chunk_kda_checks_gate_params_and_scale():
    x = make(T=10, seed=32)
    with pytest.raises(ValueError, match="A_log"):
        ck(x, **FUSED, A_log=x["A_log"].to(BF16))
    with pytest.raises(ValueError, match="dt_bias"):
        ck(x, **FUSED, dt_bias=x["dt_bias"][:, :32].contiguous())
    with pytest.raises(ValueError, match="scale"):
        ck(x, **FUSED, scale=float("inf"))
    with pytest.raises(ValueError, match="k"):
        ck(x, **FUSED, k=x["k"].float())


@pytest.mark.parametrize("kw", [dict(allow_neg_eigval=True), dict(return_intermediate_states=True),
                                dict(cp_context=object()), dict(use_graph=True)],
                         ids=lambda kw: next(iter(kw)))
def test_chunk_kda_unsupported_kwargs(kw):
    x = make(T=10, seed=33)
    with pytest.raises(NotImplementedError, match=next(iter(kw))):
        ck(x, **FUSED, **kw)


def test_chunk_kda_unsupported_kwargs_at_their_neutral_value_are_accepted():
    x = make(T=10, seed=34)
    o, _ = ck(x, **FUSED)
    o2, _ = ck(x, **FUSED, allow_neg_eigval=False, return_intermediate_states=False, cp_context=None,
               use_graph=False)
    assert torch.equal(o, o2)


def test_chunk_kda_unknown_kwarg():
    x = make(T=10, seed=35)
    with pytest.raises(TypeError, match="not_a_real_option"):
        ck(x, **FUSED, not_a_real_option=1)


def test_chunk_kda_ignored_kwargs():
    x = make(T=10, seed=36)
    o, s = ck(x, **FUSED, output_final_state=True)
    o2, s2 = ck(x, **FUSED, output_final_state=True, disable_recompute=True, max_num_seqs=4, chunk_size=128)
    assert torch.equal(o, o2) and torch.equal(s, s2)


def test_chunk_kda_grad():
    x = make(T=10, seed=37)
    for name in ("q", "g", "A_log", "dt_bias", "initial_state"):
        xg = dict(x, **{name: x[name].clone().requires_grad_(True)})
        kw = dict(initial_state=xg["initial_state"], state_v_first=True)
        with pytest.raises(NotImplementedError, match="no_grad"):
            ck(xg, **FUSED, **kw)
        with torch.no_grad():
            o, _ = ck(xg, **FUSED, **kw)
        assert not o.requires_grad
        with torch.inference_mode():
            o2, _ = ck(xg, **FUSED, **kw)
        assert torch.equal(o, o2)
    # A_log with requires_grad is not read when the gate is off: no error
    xa = dict(x, A_log=x["A_log"].clone().requires_grad_(True), g=-torch.rand(x["g"].shape).to(BF16))
    ck(xa, safe_gate=True)


def test_chunk_kda_varlen_cu_seqlens_cpu():
    cu = torch.tensor([0, 9, 9, 25], dtype=torch.int64)
    x = make(T=25, N=3, seed=38)
    o, s = ck(x, **FUSED, cu_seqlens=cu, cu_seqlens_cpu=cu.clone(), initial_state=x["initial_state"],
              state_v_first=True, output_final_state=True)
    o_ref, s_ref = ref(x, cu_seqlens=cu)
    assert rel_l2(o, o_ref) < 5e-3 and rel_l2(s, s_ref) < 1e-4
    assert torch.equal(s[1], x["initial_state"][1])
    for bad in ([0, 9, 9, 24], [0, 10, 9, 25], [2, 9, 9, 25]):
        with pytest.raises(ValueError, match="cu_seqlens"):
            ck(x, **FUSED, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor(bad))
    with pytest.raises(ValueError, match="cu_seqlens"):
        ck(x, **FUSED, cu_seqlens=torch.tensor([0, 9, 9, 24]))
