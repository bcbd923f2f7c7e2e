"""Tests of the two torch references (fastkda/reference.py).

``kda_recurrence`` is checked against the math of KDA.md §1 written out by hand; ``kda_chunked`` is then
checked against ``kda_recurrence`` across chunk sizes, packed sequences, layouts, gate variants and strong
decay. The references accept any head dim, so small dims keep these tests fast.
"""

import itertools
import math

import pytest
import torch

from fastkda.reference import kda_chunked, kda_gate, kda_recurrence, l2_normalize

F64 = torch.float64


def make_inputs(T=40, H=2, HV=None, K=16, V=16, B=1, N=None, dtype=F64, seed=0, lower_bound=-5.0,
                initial_state=True, state_v_first=True):
    """Random raw inputs in the library's layouts; N sequences share the initial state's first dim."""
    HV = H if HV is None else HV
    N = B if N is None else N
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen, dtype=F64) * s)

    x = dict(
        q=rnd(B, T, H, K).to(dtype),
        k=rnd(B, T, H, K).to(dtype),
        v=rnd(B, T, HV, V).to(dtype),
        g=rnd(B, T, HV, K, s=2.0).to(dtype),
        beta=rnd(B, T, HV, s=2.0).to(dtype),
        A_log=rnd(HV, s=0.5).float(),
        dt_bias=rnd(HV, K, s=0.5).float(),
        lower_bound=lower_bound,
    )
    if initial_state:
        shape = (N, HV, V, K) if state_v_first else (N, HV, K, V)
        x["initial_state"] = rnd(*shape).float()
    return x


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def assert_close64(a, b, tol=1e-12):
    """Elementwise |a - b| <= tol * (1 + |b|): float64 agreement to ~1e-12."""
    assert a.shape == b.shape
    assert a.dtype == b.dtype == F64
    err = ((a - b).abs() / (1 + b.abs())).max().item() if a.numel() else 0.0
    assert err <= tol, f"max scaled error {err:.3e} > {tol:.1e}"


# --------------------------------------------------------------------------------------------------
# Hand-computed examples
# --------------------------------------------------------------------------------------------------

def test_two_token_example_raw_activations_literal_numbers():
    """Two tokens, K = V = 2, activations off, numbers chosen so every step is exact by hand.

    S0 (K x V) = [[2, 0], [0, 4]]
    t=1: decay exp(a1) = [0.5, 0.25]  ->  S = [[1, 0], [0, 1]]
         k1 = [1, 0], beta1 = 0.5, v1 = [3, 1]: pred = k1ᵀS = [1, 0], v1 - pred = [2, 1]
         S += 0.5 * [1, 0]ᵀ[2, 1]  ->  S = [[2, 0.5], [0, 1]]
         q1 = [1, 1], scale 2: o1 = 2 * [2, 1.5] = [4, 3]
    t=2: decay [1, 0.5]  ->  S = [[2, 0.5], [0, 0.5]]
         k2 = [1, 1], beta2 = 0.25, v2 = [0, 0]: pred = [2, 1], v2 - pred = [-2, -1]
         S += [0.25, 0.25]ᵀ[-2, -1]  ->  S = [[1.5, 0.25], [-0.5, 0.25]]
         q2 = [0, 1]: o2 = 2 * [-0.5, 0.25] = [-1, 0.5]
    """
    q = torch.tensor([[1.0, 1.0], [0.0, 1.0]], dtype=F64).reshape(1, 2, 1, 2)
    k = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=F64).reshape(1, 2, 1, 2)
    v = torch.tensor([[3.0, 1.0], [0.0, 0.0]], dtype=F64).reshape(1, 2, 1, 2)
    g = torch.tensor([[math.log(0.5), math.log(0.25)], [0.0, math.log(0.5)]], dtype=F64).reshape(1, 2, 1, 2)
    beta = torch.tensor([[0.5, 0.25]], dtype=F64).reshape(1, 2, 1)
    s0_kv = torch.tensor([[[[2.0, 0.0], [0.0, 4.0]]]], dtype=F64)            # [N, HV, K, V]
    flags = dict(use_qk_l2norm=False, use_gate=False, use_beta_sigmoid=False, scale=2.0)

    expected_o = torch.tensor([[4.0, 3.0], [-1.0, 0.5]], dtype=F64).reshape(1, 2, 1, 2)
    expected_s_kv = torch.tensor([[[[1.5, 0.25], [-0.5, 0.25]]]], dtype=F64)

    o, s = kda_recurrence(q, k, v, g, beta, initial_state=s0_kv, state_v_first=False, **flags)
    assert_close64(o, expected_o)
    assert_close64(s, expected_s_kv)

    # the same in FlashKDA's v-first layout: states transposed, output unchanged
    o, s = kda_recurrence(q, k, v, g, beta, initial_state=s0_kv.transpose(-1, -2).contiguous(),
                          state_v_first=True, **flags)
    assert_close64(o, expected_o)
    assert_close64(s, expected_s_kv.transpose(-1, -2))

    for C in (1, 2, 16):
        o, s = kda_chunked(q, k, v, g, beta, initial_state=s0_kv, state_v_first=False, dtype=F64,
                           chunk_size=C, **flags)
        assert_close64(o, expected_o)
        assert_close64(s, expected_s_kv)


def test_two_token_example_fused_activations_by_hand():
    """Two tokens, K = V = 2, every activation on, computed step by step with python floats (KDA.md §1)."""
    K = V = 2
    q_raw = [[1.0, 2.0], [-0.5, 0.25]]
    k_raw = [[3.0, 4.0], [1.0, -1.0]]
    v_raw = [[1.0, -2.0], [0.5, 3.0]]
    g_raw = [[0.3, -0.7], [-1.0, 0.4]]
    b_raw = [0.0, 1.5]
    A_log = math.log(2.0)
    dt_bias = [0.5, -0.25]
    lower_bound = -2.0
    scale = 0.7
    S0 = [[0.1, -0.2], [0.3, 0.4]]                                               # K x V

    def l2norm(x):
        n = math.sqrt(sum(xi * xi for xi in x) + 1e-6)                           # eps inside the sqrt
        return [xi / n for xi in x]

    def sigmoid(z):
        return 1.0 / (1.0 + math.exp(-z))

    S = [row[:] for row in S0]
    outs = []
    for t in range(2):
        qh, kh = l2norm(q_raw[t]), l2norm(k_raw[t])
        a = [lower_bound * sigmoid(math.exp(A_log) * (g_raw[t][i] + dt_bias[i])) for i in range(K)]
        b = sigmoid(b_raw[t])
        S = [[math.exp(a[i]) * S[i][j] for j in range(V)] for i in range(K)]     # S = diag(exp(a)) S
        pred = [sum(kh[i] * S[i][j] for i in range(K)) for j in range(V)]         # k̂ᵀS
        S = [[S[i][j] + b * kh[i] * (v_raw[t][j] - pred[j]) for j in range(V)] for i in range(K)]
        outs.append([scale * sum(qh[i] * S[i][j] for i in range(K)) for j in range(V)])

    # spot-check the hand arithmetic itself on one number: k̂1 = [3, 4] / sqrt(25 + 1e-6)
    assert abs(l2norm(k_raw[0])[0] - 3.0 / math.sqrt(25.000001)) < 1e-15

    def t(x):
        return torch.tensor(x, dtype=F64)

    # the references take A_log / dt_bias in float64 too (the fp32 requirement is the public API's):
    # log(2) is not exact in fp32, and the hand numbers use the float64 value
    args = dict(
        q=t(q_raw).reshape(1, 2, 1, K), k=t(k_raw).reshape(1, 2, 1, K), v=t(v_raw).reshape(1, 2, 1, V),
        g=t(g_raw).reshape(1, 2, 1, K), beta=t(b_raw).reshape(1, 2, 1),
        A_log=t([A_log]), dt_bias=t([dt_bias]), lower_bound=lower_bound, scale=scale,
    )
    o, s = kda_recurrence(**args, initial_state=t([[S0]]), state_v_first=False)
    assert_close64(o, t(outs).reshape(1, 2, 1, V))
    assert_close64(s, t([[S]]))
    o, s = kda_recurrence(**args, initial_state=t([[S0]]).transpose(-1, -2), state_v_first=True)
    assert_close64(o, t(outs).reshape(1, 2, 1, V))
    assert_close64(s, t([[S]]).transpose(-1, -2))


def test_l2_normalize_eps_inside_sqrt():
    x = torch.tensor([[1e-3, 0.0], [0.0, 0.0], [3.0, 4.0]], dtype=F64)
    y = l2_normalize(x)
    # eps inside the sqrt: 1e-3 / sqrt(1e-6 + 1e-6) = 1/sqrt(2), not 1e-3 / (1e-3 + eps) ~ 1
    assert abs(y[0, 0].item() - 1 / math.sqrt(2)) < 1e-12
    assert torch.equal(y[1], torch.zeros(2, dtype=F64))                         # no NaN on a zero vector
    assert abs(y[2, 1].item() - 4 / math.sqrt(25 + 1e-6)) < 1e-15


# --------------------------------------------------------------------------------------------------
# Recurrence vs chunked
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk_size", [1, 16, 32, 64])
@pytest.mark.parametrize("T", [64, 77])
def test_chunked_matches_recurrence_float64(chunk_size, T):
    x = make_inputs(T=T, seed=chunk_size + T)
    o_ref, s_ref = kda_recurrence(**x)
    o, s = kda_chunked(**x, dtype=F64, chunk_size=chunk_size)
    assert_close64(o, o_ref)
    assert_close64(s, s_ref)


def test_chunked_chunk_batch_does_not_change_result():
    x = make_inputs(T=100, seed=3)
    o1, s1 = kda_chunked(**x, dtype=F64, chunk_size=8, chunk_batch=1)
    o2, s2 = kda_chunked(**x, dtype=F64, chunk_size=8, chunk_batch=64)
    o_ref, s_ref = kda_recurrence(**x)
    assert_close64(o1, o_ref)
    assert_close64(s1, s_ref)
    assert_close64(o1, o2, tol=1e-14)
    assert_close64(s1, s2, tol=1e-14)


def test_chunked_rejects_bad_chunk_size():
    x = make_inputs(T=4)
    with pytest.raises(ValueError, match="chunk_size"):
        kda_chunked(**x, chunk_size=0)


def test_batch_rows_are_independent_sequences():
    x = make_inputs(T=30, B=3, seed=5)
    o, s = kda_recurrence(**x)
    for b in range(3):
        xb = dict(x, q=x["q"][b:b + 1], k=x["k"][b:b + 1], v=x["v"][b:b + 1], g=x["g"][b:b + 1],
                  beta=x["beta"][b:b + 1], initial_state=x["initial_state"][b:b + 1])
        ob, sb = kda_recurrence(**xb)
        assert_close64(o[b:b + 1], ob, tol=0)
        assert_close64(s[b:b + 1], sb, tol=0)
    oc, sc = kda_chunked(**x, dtype=F64, chunk_size=16)
    assert_close64(oc, o)
    assert_close64(sc, s)


@pytest.mark.parametrize("with_state", [True, False])
def test_varlen_with_empty_sequences(with_state):
    lens = [0, 13, 0, 27, 5, 0]                                                 # empty first, middle, last
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int64)
    T = int(cu[-1])
    x = make_inputs(T=T, N=len(lens), seed=11, initial_state=with_state)
    o, s = kda_recurrence(**x, cu_seqlens=cu)
    assert s.shape == (len(lens), 2, 16, 16)
    # each packed sequence equals the same sequence run alone
    for n in range(len(lens)):
        a, b = int(cu[n]), int(cu[n + 1])
        xn = {kk: (vv[:, a:b] if kk in ("q", "k", "v", "g", "beta") else vv) for kk, vv in x.items()}
        if with_state:
            xn["initial_state"] = x["initial_state"][n:n + 1]
        on, sn = kda_recurrence(**xn)
        assert_close64(o[:, a:b], on, tol=0)
        assert_close64(s[n:n + 1], sn, tol=0)
    for C in (4, 16):
        oc, sc = kda_chunked(**x, cu_seqlens=cu.to(torch.int32), dtype=F64, chunk_size=C)
        assert_close64(oc, o)
        assert_close64(sc, s)
    # empty sequences: the final state is the initial state, bit for bit
    for n in (0, 2, 5):
        expect = x["initial_state"][n].double() if with_state else torch.zeros(2, 16, 16, dtype=F64)
        assert torch.equal(s[n], expect)
        assert torch.equal(sc[n], expect)


def test_gva_matches_chunked_and_maps_value_head_to_q_head():
    """HV = 2H: value head j reads q/k head j // (HV // H) (fla's grouped-value convention)."""
    x = make_inputs(T=50, H=2, HV=4, seed=7)
    o, s = kda_recurrence(**x)
    oc, sc = kda_chunked(**x, dtype=F64, chunk_size=16)
    assert_close64(oc, o)
    assert_close64(sc, s)
    xe = dict(x, q=x["q"].repeat_interleave(2, dim=2), k=x["k"].repeat_interleave(2, dim=2))
    oe, se = kda_recurrence(**xe)
    assert_close64(o, oe, tol=0)
    assert_close64(s, se, tol=0)
    # and not the other grouping (j % H): the test would not notice a swap otherwise
    xw = dict(x, q=x["q"].repeat(1, 1, 2, 1), k=x["k"].repeat(1, 1, 2, 1))
    ow, _ = kda_recurrence(**xw)
    assert rel_l2(ow, o) > 1e-3


@pytest.mark.parametrize("with_state", [True, False])
def test_initial_state_present_or_absent(with_state):
    x = make_inputs(T=45, seed=13, initial_state=with_state)
    o, s = kda_recurrence(**x)
    oc, sc = kda_chunked(**x, dtype=F64, chunk_size=32)
    assert_close64(oc, o)
    assert_close64(sc, s)
    if with_state:
        # the initial state matters: dropping it changes the output
        o0, _ = kda_recurrence(**dict(x, initial_state=None))
        assert rel_l2(o0, o) > 1e-3
    else:
        zeros = torch.zeros(1, 2, 16, 16)
        o0, s0 = kda_recurrence(**dict(x, initial_state=zeros))
        assert_close64(o0, o, tol=0)
        assert_close64(s0, s, tol=0)


def test_bf16_inputs_upcast():
    x = make_inputs(T=40, seed=17, dtype=torch.bfloat16)
    o, s = kda_recurrence(**x)
    assert o.dtype == s.dtype == F64
    oc, sc = kda_chunked(**x, dtype=F64, chunk_size=16)
    assert_close64(oc, o)
    assert_close64(sc, s)
    # the bf16 values themselves are used, upcast exactly
    x64 = {kk: (vv.double() if isinstance(vv, torch.Tensor) and vv.dtype == torch.bfloat16 else vv)
           for kk, vv in x.items()}
    o64, s64 = kda_recurrence(**x64)
    assert_close64(o64, o, tol=0)
    assert_close64(s64, s, tol=0)


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_chunked_float32_close_to_recurrence(chunk_size):
    x = make_inputs(T=150, seed=19, dtype=torch.float32)
    o_ref, s_ref = kda_recurrence(**x)
    o, s = kda_chunked(**x, dtype=torch.float32, chunk_size=chunk_size)
    assert o.dtype == s.dtype == torch.float32
    assert rel_l2(o, o_ref) < 1e-5
    assert rel_l2(s, s_ref) < 1e-5
    assert (o.double() - o_ref).abs().max().item() < 1e-5 * (1 + o_ref.abs().max().item())


# --------------------------------------------------------------------------------------------------
# Layouts and empty sequences
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", ["recurrence", "chunked"])
def test_state_layouts_are_transposes(fn):
    run = kda_recurrence if fn == "recurrence" else (lambda **kw: kda_chunked(**kw, dtype=F64, chunk_size=16))
    x = make_inputs(T=33, K=8, V=12, seed=23, state_v_first=True)              # K != V: the layouts differ
    s0_vk = x["initial_state"]
    assert s0_vk.shape == (1, 2, 12, 8)
    o_vf, s_vf = run(**x, state_v_first=True)
    o_kf, s_kf = run(**dict(x, initial_state=s0_vk.transpose(-1, -2).contiguous()), state_v_first=False)
    assert s_vf.shape == (1, 2, 12, 8) and s_kf.shape == (1, 2, 8, 12)
    assert_close64(o_vf, o_kf, tol=1e-14)
    assert_close64(s_vf, s_kf.transpose(-1, -2), tol=1e-14)
    # and the layout flag is read: the same tensor read the other way round is another state
    x_sq = make_inputs(T=33, K=8, V=8, seed=29)
    o_a, _ = run(**x_sq, state_v_first=True)
    o_b, _ = run(**x_sq, state_v_first=False)
    assert rel_l2(o_a, o_b) > 1e-3


@pytest.mark.parametrize("fn", ["recurrence", "chunked"])
def test_zero_length_inputs(fn):
    run = kda_recurrence if fn == "recurrence" else (lambda **kw: kda_chunked(**kw, chunk_size=16))
    # packed, every sequence empty
    x = make_inputs(T=0, N=3, seed=31)
    o, s = run(**x, cu_seqlens=torch.tensor([0, 0, 0, 0], dtype=torch.int32))
    assert o.shape == (1, 0, 2, 16)
    assert torch.equal(s, x["initial_state"].to(s.dtype))
    # batched, T = 0
    x = make_inputs(T=0, B=2, seed=37)
    o, s = run(**x)
    assert o.shape == (2, 0, 2, 16)
    assert torch.equal(s, x["initial_state"].to(s.dtype))
    # no initial state: zeros, in the requested layout
    x = make_inputs(T=0, B=2, K=8, V=4, initial_state=False)
    _, s = run(**x, state_v_first=False)
    assert s.shape == (2, 2, 8, 4) and not s.any()
    # no sequence at all
    x = make_inputs(T=0, N=0, initial_state=False)
    o, s = run(**x, cu_seqlens=torch.tensor([0], dtype=torch.int64))
    assert s.shape == (0, 2, 16, 16)


def test_empty_sequence_state_exact_in_float32_chunked():
    x = make_inputs(T=10, N=3, seed=41, dtype=torch.float32)
    cu = torch.tensor([0, 0, 10, 10], dtype=torch.int32)
    _, s = kda_chunked(**x, cu_seqlens=cu, dtype=torch.float32, chunk_size=16)
    assert torch.equal(s[0], x["initial_state"][0])
    assert torch.equal(s[2], x["initial_state"][2])
    assert not torch.equal(s[1], x["initial_state"][1])


# --------------------------------------------------------------------------------------------------
# Gate and activation variants
# --------------------------------------------------------------------------------------------------

def _both(x, **kw):
    """Recurrence and chunked (float64) on the same arguments; checks they agree and returns the former."""
    o, s = kda_recurrence(**x, **kw)
    oc, sc = kda_chunked(**x, **kw, dtype=F64, chunk_size=16)
    assert_close64(oc, o)
    assert_close64(sc, s)
    return o, s


def _with_gate(x, a):
    """x with g replaced by the precomputed log-decay a and the gate switched off."""
    return dict(x, g=a, A_log=None, dt_bias=None, lower_bound=None), dict(use_gate=False)


def test_gate_default_formula():
    x = make_inputs(T=37, seed=43, lower_bound=-3.0)
    A, dt = x["A_log"].double(), x["dt_bias"].double()
    a = -3.0 * torch.sigmoid(torch.exp(A)[:, None] * (x["g"] + dt))
    assert torch.allclose(kda_gate(x["g"], x["A_log"], x["dt_bias"], -3.0), a, rtol=0, atol=1e-15)
    assert (a < 0).all() and (a >= -3.0).all()
    o, s = _both(x)
    xa, kw = _with_gate(x, a)
    o2, s2 = _both(xa, **kw)
    assert_close64(o, o2)
    assert_close64(s, s2)


def test_use_gate_false_takes_g_as_log_decay():
    x = make_inputs(T=37, seed=47)
    a = -torch.rand(x["g"].shape, generator=torch.Generator().manual_seed(1), dtype=F64) * 4
    xa, kw = _with_gate(x, a)
    o, s = _both(xa, **kw)
    # A_log / dt_bias / lower_bound are not applied when the gate is off
    o2, s2 = _both(dict(x, g=a), use_gate=False)
    assert_close64(o, o2, tol=0)
    assert_close64(s, s2, tol=0)
    # a hand check of the decay on a state with no input: k = 0 keeps only S_t = exp(a_t) S_{t-1}
    x0 = dict(xa, k=torch.zeros_like(x["k"]))
    _, s0 = _both(x0, **kw)
    decay = torch.exp(a[0].sum(0))                                             # [HV, K], product over t
    expect = x["initial_state"].double() * decay[None, :, None, :]             # v-first: K is last
    assert_close64(s0, expect)


def test_unbounded_gate_without_lower_bound():
    x = make_inputs(T=37, seed=53)
    A, dt = x["A_log"].double(), x["dt_bias"].double()
    z = x["g"] + dt
    a = -torch.exp(A)[:, None] * torch.log1p(torch.exp(z))                     # -exp(A_log) * softplus
    o, s = _both(dict(x, lower_bound=None))
    xa, kw = _with_gate(x, a)
    o2, s2 = _both(xa, **kw)
    assert_close64(o, o2)
    assert_close64(s, s2)
    with pytest.raises(ValueError, match="A_log"):
        kda_recurrence(**dict(x, lower_bound=None, A_log=None))


def test_gate_without_A_log():
    x = make_inputs(T=37, seed=59, lower_bound=-5.0)
    a = -5.0 * torch.sigmoid(x["g"] + x["dt_bias"].double())
    o, s = _both(dict(x, A_log=None))
    xa, kw = _with_gate(x, a)
    o2, s2 = _both(xa, **kw)
    assert_close64(o, o2)
    assert_close64(s, s2)
    o3, _ = kda_recurrence(**x)                                                 # A_log does matter otherwise
    assert rel_l2(o3, o) > 1e-3


def test_gate_without_dt_bias():
    x = make_inputs(T=20, seed=61)
    a = -5.0 * torch.sigmoid(torch.exp(x["A_log"].double())[:, None] * x["g"])
    o, s = _both(dict(x, dt_bias=None))
    xa, kw = _with_gate(x, a)
    o2, s2 = _both(xa, **kw)
    assert_close64(o, o2)
    assert_close64(s, s2)


def test_flat_dt_bias_equals_2d():
    x = make_inputs(T=30, HV=4, H=2, seed=67)
    o, s = _both(x)
    o2, s2 = _both(dict(x, dt_bias=x["dt_bias"].reshape(-1)))
    assert_close64(o, o2, tol=0)
    assert_close64(s, s2, tol=0)
    o3, _ = _both(dict(x, dt_bias=x["dt_bias"].flip(0)))                        # heads are not mixed up
    assert rel_l2(o3, o) > 1e-3


def test_beta_sigmoid_off_takes_beta_as_is():
    x = make_inputs(T=30, seed=71)
    o, s = _both(x)
    o2, s2 = _both(dict(x, beta=torch.sigmoid(x["beta"])), use_beta_sigmoid=False)
    assert_close64(o, o2)
    assert_close64(s, s2)
    o3, _ = _both(x, use_beta_sigmoid=False)
    assert rel_l2(o3, o) > 1e-3


def test_qk_l2norm_off_takes_q_k_as_is():
    x = make_inputs(T=30, seed=73)
    o, s = _both(x)
    def nrm(t):
        return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)
    o2, s2 = _both(dict(x, q=nrm(x["q"]), k=nrm(x["k"])), use_qk_l2norm=False)
    assert_close64(o, o2)
    assert_close64(s, s2)
    # unnormalised keys/queries (scaled down so the delta rule stays stable) give something else
    xs = dict(x, q=x["q"] * 0.2, k=x["k"] * 0.2)
    o3, _ = _both(xs, use_qk_l2norm=False)
    assert rel_l2(o3, o) > 1e-3


def test_default_scale_is_inverse_sqrt_k():
    x = make_inputs(T=20, K=16, seed=79)
    o, _ = kda_recurrence(**x)
    o2, _ = kda_recurrence(**x, scale=0.25)
    assert_close64(o, o2, tol=0)
    o3, _ = kda_recurrence(**x, scale=0.5)
    assert_close64(o3, 2 * o, tol=1e-14)


# --------------------------------------------------------------------------------------------------
# Strong decay
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_gates_at_lower_bound_chunk64_finite_and_exact(dtype):
    """a = -5 on every channel: exp(-G) would reach exp(320) in a chunk of 64; the pairwise form must not."""
    x = make_inputs(T=150, seed=83, dtype=torch.float32)
    x["g"] = torch.full_like(x["g"], 60.0)                                    # sigmoid(exp(A_log)*(60+b)) = 1
    a = kda_gate(x["g"].double(), x["A_log"], x["dt_bias"], -5.0)
    assert torch.all(a == -5.0)
    o_ref, s_ref = kda_recurrence(**x)
    o, s = kda_chunked(**x, dtype=dtype, chunk_size=64)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    if dtype == F64:
        assert_close64(o, o_ref)
        assert_close64(s, s_ref)
    else:
        assert rel_l2(o, o_ref) < 1e-5
        assert rel_l2(s, s_ref) < 1e-5


def test_mixed_strong_and_weak_decay_chunk64():
    """Half the channels pinned at -5, half near 0 (long memory), with the raw gate off: a in [-5, 0]."""
    x = make_inputs(T=200, K=16, seed=89, dtype=torch.float32)
    a = torch.empty_like(x["g"])
    a[..., ::2] = -5.0
    a[..., 1::2] = -1e-3
    xa, kw = _with_gate(x, a)
    o_ref, s_ref = kda_recurrence(**xa, **kw)
    for dtype, tol in ((torch.float32, 1e-5), (F64, 1e-12)):
        o, s = kda_chunked(**xa, **kw, dtype=dtype, chunk_size=64)
        assert torch.isfinite(o).all() and torch.isfinite(s).all()
        assert rel_l2(o, o_ref) < tol
        assert rel_l2(s, s_ref) < tol
