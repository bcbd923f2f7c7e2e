"""Argument checks (fastkda/checks.py), exercised through ``fastkda.fwd`` and directly.

The contract: every rejected call raises ``ValueError`` or ``TypeError`` whose message names the bad
argument, and nothing is written before the checks pass -- ``out`` and ``final_state`` keep their contents.
Without a GPU, a device mismatch is made with the ``meta`` device.
"""

import os
import subprocess
import sys

import pytest
import torch

import fastkda
from fastkda import checks

BF16 = torch.bfloat16
OUT_SENTINEL = 12345.0
STATE_SENTINEL = -777.0


def base_args(B=1, T=24, H=2, HV=2, K=64, V=64, N=None, cu_seqlens=None, dtype=BF16, seed=0):
    """A valid fwd call; out and final_state filled with sentinels."""
    gen = torch.Generator().manual_seed(seed)
    N = B if N is None else N

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(dt)

    return dict(
        q=rnd(B, T, H, K), k=rnd(B, T, H, K), v=rnd(B, T, HV, V), g=rnd(B, T, HV, K), beta=rnd(B, T, HV),
        scale=K ** -0.5,
        out=torch.full((B, T, HV, V), OUT_SENTINEL, dtype=dtype),
        A_log=rnd(HV, dt=torch.float32), dt_bias=rnd(HV, K, dt=torch.float32), lower_bound=-5.0,
        initial_state=rnd(N, HV, V, K, dt=torch.float32),
        final_state=torch.full((N, HV, V, K), STATE_SENTINEL, dtype=torch.float32),
        cu_seqlens=cu_seqlens,
    )


def varlen_args(**kw):
    cu = torch.tensor([0, 5, 5, 24], dtype=torch.int32)
    return base_args(T=24, N=3, cu_seqlens=cu, **kw)


def meta(x):
    return torch.empty(x.shape, dtype=x.dtype, device="meta")


def noncontig(x):
    """The same shape and values, with a non-contiguous layout."""
    y = torch.empty(*x.shape, 2, dtype=x.dtype)[..., 0]
    y.copy_(x)
    assert not y.is_contiguous()
    return y


def set_(**changes):
    def mutate(a):
        a.update({k: (v(a) if callable(v) else v) for k, v in changes.items()})
    return mutate


def heads(H, HV):
    def mutate(a):
        a.update(base_args(H=H, HV=HV))
    return mutate


def dims(K, V):
    def mutate(a):
        a.update(base_args(K=K, V=V))
    return mutate


def out_overlaps_v(a):
    buf = torch.zeros(2 * a["v"].numel(), dtype=BF16)
    n = a["v"].numel()
    buf[:n].copy_(a["v"].reshape(-1))
    a["v"] = buf[:n].view(a["v"].shape)
    a["out"] = buf[n // 2: n // 2 + n].view(a["v"].shape)       # a contiguous view over v's second half


def final_overlaps_out(a):
    """out (bf16) and final_state (fp32) as views of one byte buffer that overlap."""
    out_bytes = a["out"].numel() * 2
    st_bytes = a["final_state"].numel() * 4
    buf = torch.zeros(out_bytes + st_bytes, dtype=torch.uint8)
    a["out"] = buf[:out_bytes].view(BF16).view(a["out"].shape)
    a["out"].fill_(OUT_SENTINEL)
    start = out_bytes - 64                                        # 64 bytes shared
    a["final_state"] = buf[start:start + st_bytes].view(torch.float32).view(a["final_state"].shape)


def final_overlaps_initial(a):
    shape, n = a["initial_state"].shape, a["initial_state"].numel()
    buf = torch.zeros(2 * n)
    buf[:n].copy_(a["initial_state"].reshape(-1))
    a["initial_state"] = buf[:n].view(shape)
    a["final_state"] = buf[n // 2: n // 2 + n].view(shape)     # half a state apart: a partial overlap


def final_is_q(a):
    # q [1, T=64, H=2, K=64] fp32 has the size of one fp32 state [1, HV=2, V=64, K=64]
    a.update(base_args(T=64, dtype=torch.float32))
    a["final_state"] = a["q"].view(1, 2, 64, 64)


def kfirst_state(name):
    def mutate(a):
        a.update(base_args(K=64, V=128))
        a[name] = a[name].transpose(-1, -2).contiguous()          # [N, HV, K, V]: fla's layout, not fwd's
    return mutate


def with_grad(name):
    def mutate(a):
        a[name] = a[name].clone().requires_grad_(True)
    return mutate


# (id, mutation, exception, text that must appear in the message)
BAD_CASES = [
    # not tensors, wrong rank
    ("q-not-tensor", set_(q=1.0), TypeError, "q"),
    ("k-list", set_(k=lambda a: a["k"].tolist()), TypeError, "k"),
    ("beta-not-tensor", set_(beta=0.5), TypeError, "beta"),
    ("A_log-not-tensor", set_(A_log=[0.0, 0.0]), TypeError, "A_log"),
    ("out-not-tensor", set_(out=None), TypeError, "out"),
    ("q-3d", set_(q=lambda a: a["q"][0]), ValueError, "q"),
    ("beta-4d", set_(beta=lambda a: a["beta"][..., None]), ValueError, "beta"),
    ("initial_state-3d", set_(initial_state=lambda a: a["initial_state"][0]), ValueError, "initial_state"),
    # dtypes
    ("q-fp64", set_(q=lambda a: a["q"].double()), ValueError, "q"),
    ("q-int", set_(q=lambda a: a["q"].to(torch.int32)), ValueError, "q"),
    ("k-fp32", set_(k=lambda a: a["k"].float()), ValueError, "k"),
    ("v-fp16", set_(v=lambda a: a["v"].half()), ValueError, "v"),
    ("g-fp32", set_(g=lambda a: a["g"].float()), ValueError, "g"),
    ("beta-int", set_(beta=lambda a: a["beta"].to(torch.int32)), ValueError, "beta"),
    ("beta-fp16", set_(beta=lambda a: a["beta"].half()), ValueError, "beta"),
    ("A_log-bf16", set_(A_log=lambda a: a["A_log"].to(BF16)), ValueError, "A_log"),
    ("dt_bias-fp64", set_(dt_bias=lambda a: a["dt_bias"].double()), ValueError, "dt_bias"),
    ("out-fp32", set_(out=lambda a: a["out"].float()), ValueError, "out"),
    ("initial_state-fp16", set_(initial_state=lambda a: a["initial_state"].half()), ValueError, "initial_state"),
    ("initial_state-fp64", set_(initial_state=lambda a: a["initial_state"].double()), ValueError,
     "initial_state"),
    ("final_state-fp64", set_(final_state=lambda a: a["final_state"].double()), ValueError, "final_state"),
    ("final_state-int", set_(final_state=lambda a: a["final_state"].int()), ValueError, "final_state"),
    # devices (meta stands in for a second device)
    ("q-meta", set_(q=lambda a: meta(a["q"])), ValueError, "k"),
    ("k-meta", set_(k=lambda a: meta(a["k"])), ValueError, "k"),
    ("v-meta", set_(v=lambda a: meta(a["v"])), ValueError, "v"),
    ("g-meta", set_(g=lambda a: meta(a["g"])), ValueError, "g"),
    ("beta-meta", set_(beta=lambda a: meta(a["beta"])), ValueError, "beta"),
    ("A_log-meta", set_(A_log=lambda a: meta(a["A_log"])), ValueError, "A_log"),
    ("dt_bias-meta", set_(dt_bias=lambda a: meta(a["dt_bias"])), ValueError, "dt_bias"),
    ("out-meta", set_(out=lambda a: meta(a["out"])), ValueError, "out"),
    ("initial_state-meta", set_(initial_state=lambda a: meta(a["initial_state"])), ValueError, "initial_state"),
    ("final_state-meta", set_(final_state=lambda a: meta(a["final_state"])), ValueError, "final_state"),
    # shapes
    ("k-shape", set_(k=lambda a: a["k"][:, :-1].contiguous()), ValueError, "k"),
    ("k-heads", set_(k=lambda a: a["k"][:, :, :1].contiguous()), ValueError, "k"),
    ("v-tokens", set_(v=lambda a: a["v"][:, :-1].contiguous()), ValueError, "v"),
    ("g-heads", set_(g=lambda a: a["g"][:, :, :1].contiguous()), ValueError, "g"),
    ("g-dim", set_(g=lambda a: a["g"][..., :32].contiguous()), ValueError, "g"),
    ("beta-heads", set_(beta=lambda a: a["beta"][..., :1].contiguous()), ValueError, "beta"),
    ("HV-not-multiple", heads(2, 3), ValueError, "v"),
    ("HV-less-than-H", heads(4, 2), ValueError, "v"),
    ("H-zero", heads(0, 0), ValueError, "q"),
    ("K-32", dims(32, 64), ValueError, "q"),
    ("K-256", dims(256, 64), ValueError, "q"),
    ("V-256", dims(64, 256), ValueError, "v"),
    ("V-32", dims(64, 32), ValueError, "v"),
    ("A_log-shape", set_(A_log=torch.zeros(3)), ValueError, "A_log"),
    ("A_log-none", set_(A_log=None), ValueError, "A_log"),
    ("dt_bias-shape", set_(dt_bias=torch.zeros(2, 32)), ValueError, "dt_bias"),
    ("dt_bias-flat-shape", set_(dt_bias=torch.zeros(2 * 64 + 1)), ValueError, "dt_bias"),
    ("dt_bias-none", set_(dt_bias=None), ValueError, "dt_bias"),
    ("out-shape", set_(out=lambda a: torch.full((1, 24, 2, 32), OUT_SENTINEL, dtype=BF16)), ValueError, "out"),
    # non-contiguous
    *[(f"{n}-noncontig", set_(**{n: (lambda a, n=n: noncontig(a[n]))}), ValueError, n)
      for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "out", "initial_state", "final_state")],
    # state shapes, v-first layout [N, HV, V, K] only
    ("initial_state-N", set_(initial_state=lambda a: torch.cat([a["initial_state"]] * 2)), ValueError,
     "initial_state"),
    ("final_state-N", set_(final_state=lambda a: torch.cat([a["final_state"]] * 2)), ValueError, "final_state"),
    ("initial_state-HV", set_(initial_state=lambda a: a["initial_state"][:, :1].contiguous()), ValueError,
     "initial_state"),
    ("final_state-HV", set_(final_state=lambda a: a["final_state"][:, :1].contiguous()), ValueError,
     "final_state"),
    ("initial_state-kfirst", kfirst_state("initial_state"), ValueError, "initial_state"),
    ("final_state-kfirst", kfirst_state("final_state"), ValueError, "final_state"),
    # aliasing
    ("out-is-q", set_(out=lambda a: a["q"]), ValueError, "out"),
    ("out-is-v", set_(out=lambda a: a["v"]), ValueError, "out"),
    ("out-overlaps-v", out_overlaps_v, ValueError, "out"),
    ("final-overlaps-out", final_overlaps_out, ValueError, "final_state"),
    ("final-overlaps-initial", final_overlaps_initial, ValueError, "final_state"),
    ("final-is-q", final_is_q, ValueError, "final_state"),
    # scalars
    *[(f"lower_bound-{v!r}", set_(lower_bound=v), ValueError, "lower_bound")
      for v in (-5.5, 0, 0.0, 0.1, float("nan"), float("-inf"), -5.000001, True, None, "-5")],
    *[(f"scale-{v!r}", set_(scale=v), ValueError, "scale")
      for v in (float("inf"), float("-inf"), float("nan"), None, True, "0.1")],
    # forward only
    *[(f"{n}-requires-grad", with_grad(n), NotImplementedError, "no_grad")
      for n in ("q", "v", "beta", "A_log", "dt_bias", "initial_state")],
]

CU_CASES = [
    ("cu-float", torch.tensor([0.0, 5.0, 5.0, 24.0]), ValueError, "cu_seqlens"),
    ("cu-int16", torch.tensor([0, 5, 5, 24], dtype=torch.int16), ValueError, "cu_seqlens"),
    ("cu-2d", torch.tensor([[0, 5], [5, 24]], dtype=torch.int32), ValueError, "cu_seqlens"),
    ("cu-one-entry", torch.tensor([0], dtype=torch.int32), ValueError, "cu_seqlens"),
    ("cu-not-from-0", torch.tensor([1, 5, 5, 24], dtype=torch.int32), ValueError, "cu_seqlens"),
    ("cu-decreasing", torch.tensor([0, 6, 5, 24], dtype=torch.int64), ValueError, "cu_seqlens"),
    ("cu-short", torch.tensor([0, 5, 5, 23], dtype=torch.int32), ValueError, "cu_seqlens"),
    ("cu-long", torch.tensor([0, 5, 5, 25], dtype=torch.int32), ValueError, "cu_seqlens"),
    ("cu-meta", torch.empty(4, dtype=torch.int32, device="meta"), ValueError, "cu_seqlens"),
    ("cu-noncontig", torch.tensor([0, 9, 5, 9, 5, 9, 24, 9], dtype=torch.int32)[::2], ValueError, "cu_seqlens"),
    ("cu-list", [0, 5, 5, 24], TypeError, "cu_seqlens"),
]


def _call_and_check_untouched(a, exc, text):
    snap = {n: a[n].clone() for n in ("out", "final_state")
            if isinstance(a.get(n), torch.Tensor) and a[n].device.type == "cpu"}
    assert snap, "the case must leave something to watch"
    with pytest.raises(exc) as info:
        fastkda.fwd(**a)
    assert text in str(info.value), f"message does not name {text!r}: {info.value}"
    for n, before in snap.items():
        assert torch.equal(a[n], before), f"{n} was written by a rejected call"
    return info


def test_base_call_is_valid():
    """The unmodified arguments are accepted: every rejection below is due to its one change."""
    for a in (base_args(), varlen_args(), base_args(K=64, V=128), base_args(H=2, HV=4)):
        fastkda.fwd(**a)
        assert not (a["out"] == OUT_SENTINEL).any()
        assert not (a["final_state"] == STATE_SENTINEL).any()


@pytest.mark.parametrize("mutate,exc,text", [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_fwd_rejects_and_writes_nothing(mutate, exc, text):
    a = base_args()
    mutate(a)
    _call_and_check_untouched(a, exc, text)


@pytest.mark.parametrize("cu,exc,text", [c[1:] for c in CU_CASES], ids=[c[0] for c in CU_CASES])
def test_fwd_rejects_bad_cu_seqlens(cu, exc, text):
    a = varlen_args()
    a["cu_seqlens"] = cu
    _call_and_check_untouched(a, exc, text)
    assert (a["out"] == OUT_SENTINEL).all() and (a["final_state"] == STATE_SENTINEL).all()


def test_fwd_rejects_batch_with_cu_seqlens():
    a = base_args(B=2, T=12, N=3)
    a["cu_seqlens"] = torch.tensor([0, 5, 5, 12], dtype=torch.int32)
    info = _call_and_check_untouched(a, ValueError, "cu_seqlens")
    assert "B=2" in str(info.value)


@pytest.mark.parametrize("lb", [-5, -5.0, -4.999, -2.5, -1e-6, -1])
def test_lower_bound_range_accepted(lb):
    a = base_args(T=8)
    fastkda.fwd(**dict(a, lower_bound=lb))
    assert not (a["out"] == OUT_SENTINEL).any()
    assert checks.check_lower_bound(lb) == float(lb)
    assert isinstance(checks.check_lower_bound(lb), float)


@pytest.mark.parametrize("scale", [0.125, 1, 0.0, -0.5, 1e30])
def test_scale_finite_accepted(scale):
    assert checks.check_scale(scale) == float(scale)


def test_final_state_may_be_initial_state_but_not_overlap_otherwise():
    a = base_args()
    s0 = a["initial_state"].clone()
    a["final_state"] = a["initial_state"]
    fastkda.fwd(**a)                                              # accepted (result checked in test_api.py)
    assert not torch.equal(a["initial_state"], s0)
    # the same memory seen as another dtype or shape is not "the same tensor"
    a = base_args(T=8)
    a["final_state"] = a["initial_state"].view(torch.int32).view(torch.float32)[:, :, :, :]
    fastkda.fwd(**a)                                              # identical view: fine
    a = base_args(T=8)
    a["final_state"] = a["initial_state"].view(2, 1, 64, 64)      # N=1, HV=2 seen as N=2, HV=1: wrong shape
    with pytest.raises(ValueError, match="final_state"):
        fastkda.fwd(**a)


def test_zero_size_buffers_do_not_count_as_overlap():
    a = base_args(T=0)
    a["cu_seqlens"] = None
    fastkda.fwd(**a)                                              # empty out: nothing to alias
    assert torch.equal(a["final_state"], a["initial_state"])


# --------------------------------------------------------------------------------------------------
# checks.py directly
# --------------------------------------------------------------------------------------------------

def test_check_inputs_problem():
    a = base_args(B=3, T=10, H=2, HV=6, K=64, V=128)
    p = checks.check_inputs(a["q"], a["k"], a["v"], a["g"], a["beta"])
    assert (p.B, p.T, p.H, p.HV, p.K, p.V, p.N, p.varlen) == (3, 10, 2, 6, 64, 128, 3, False)
    assert checks.state_shape(p, True) == (3, 6, 128, 64)
    assert checks.state_shape(p, False) == (3, 6, 64, 128)
    # beta may be fp32 with bf16 inputs
    checks.check_inputs(a["q"], a["k"], a["v"], a["g"], a["beta"].float())
    # fp16 and fp32 inputs are accepted
    for dt in (torch.float16, torch.float32):
        checks.check_inputs(*(a[n].to(dt) for n in ("q", "k", "v", "g", "beta")))


def test_check_cu_seqlens_problem():
    a = varlen_args()
    p = checks.check_inputs(a["q"], a["k"], a["v"], a["g"], a["beta"])
    for dt in (torch.int32, torch.int64):
        pv = checks.check_cu_seqlens(torch.tensor([0, 5, 5, 24], dtype=dt), p, torch.device("cpu"))
        assert (pv.N, pv.varlen, pv.B, pv.T) == (3, True, 1, 24)
    assert checks.check_cu_seqlens(None, p, torch.device("cpu")) is p


@pytest.fixture
def strict_off():
    before = checks.strict_checks()
    fastkda.set_strict_checks(False)
    yield
    fastkda.set_strict_checks(before)


def _meta_problem(T=24):
    return checks.Problem(B=1, T=T, H=2, HV=2, K=64, V=64, N=1, varlen=False)


def test_device_cu_seqlens_values_read_only_when_strict(strict_off):
    """On a non-CPU device the values are not read unless strict checks are on (they would sync)."""
    dev = torch.device("meta")
    cu = torch.empty(4, dtype=torch.int32, device=dev)              # values unknown
    p = checks.check_cu_seqlens(cu, _meta_problem(), dev)
    assert (p.N, p.varlen, p.max_seqlen) == (3, True, None)
    fastkda.set_strict_checks(True)
    assert checks.strict_checks() is True
    with pytest.raises(Exception):                                 # strict: the values are read (impossible on meta)
        checks.check_cu_seqlens(cu, _meta_problem(), dev)
    fastkda.set_strict_checks(False)
    assert checks.strict_checks() is False
    checks.check_cu_seqlens(cu, _meta_problem(), dev)


@pytest.mark.parametrize("strict", [False, True])
def test_cu_seqlens_cpu_values_are_checked(strict_off, strict):
    fastkda.set_strict_checks(strict)
    dev = torch.device("meta")
    cu = torch.empty(4, dtype=torch.int32, device=dev)
    good = torch.tensor([0, 5, 5, 24], dtype=torch.int32)
    p = checks.check_cu_seqlens(cu, _meta_problem(), dev, cu_seqlens_cpu=good)
    assert p.N == 3 and p.max_seqlen == 19                         # the longest sequence, for the route
    for bad, what in (([1, 5, 5, 24], "start at 0"), ([0, 6, 5, 24], "non-decreasing"),
                      ([0, 5, 5, 23], "end at the token count")):
        with pytest.raises(ValueError, match="cu_seqlens") as info:
            checks.check_cu_seqlens(cu, _meta_problem(), dev, cu_seqlens_cpu=torch.tensor(bad, dtype=torch.int32))
        assert what in str(info.value)
    with pytest.raises(ValueError, match="cu_seqlens_cpu"):
        checks.check_cu_seqlens(cu, _meta_problem(), dev, cu_seqlens_cpu=torch.tensor([0, 24], dtype=torch.int32))
    with pytest.raises(TypeError, match="cu_seqlens_cpu"):
        checks.check_cu_seqlens(cu, _meta_problem(), dev, cu_seqlens_cpu=[0, 5, 5, 24])


@pytest.mark.parametrize("n_seq", [checks._CU_SEQLENS_WALK_MAX, checks._CU_SEQLENS_WALK_MAX + 1, 5000])
def test_cu_seqlens_values_checked_alike_for_few_and_many_sequences(n_seq):
    # Up to _CU_SEQLENS_WALK_MAX sequences the offsets are walked in Python, beyond by tensor operations: the
    # same verdicts, messages and longest sequence either way.
    gen = torch.Generator().manual_seed(n_seq)
    lengths = torch.randint(0, 50, (n_seq,), generator=gen)
    lengths[n_seq // 3] = 77                                       # the longest, somewhere inside
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    T = int(cu[-1])
    dev = torch.device("meta")
    meta = torch.empty(n_seq + 1, dtype=torch.int32, device=dev)
    p = checks.check_cu_seqlens(meta, _meta_problem(T), dev, cu_seqlens_cpu=cu.to(torch.int32))
    assert p.N == n_seq and p.max_seqlen == 77
    i = n_seq // 2
    dec = cu.clone()
    dec[i] = dec[i - 1] - 1                                        # the first decrease, at index i
    dec[i + 1:] = dec[i + 1:].clamp(min=int(dec[i]))               # (a later one would not be reported)
    cases = ((cu + 1, "start at 0, got 1"),
             (dec, f"non-decreasing values, got {int(dec[i - 1])} then {int(dec[i])} at index {i}"),
             (torch.cat([cu[:-1], cu[-1:] - 1]), f"end at the token count T={T}, got {T - 1}"))
    for bad, what in cases:
        with pytest.raises(ValueError, match="cu_seqlens") as info:
            checks.check_cu_seqlens(meta, _meta_problem(T), dev, cu_seqlens_cpu=bad)
        assert what in str(info.value)


def test_cu_seqlens_cpu_takes_precedence_in_chunk_kda():
    """chunk_kda reads the values from cu_seqlens_cpu when given (no device sync), so a bad copy is caught."""
    a = varlen_args()
    kw = dict(q=a["q"], k=a["k"], v=a["v"], g=-torch.rand(a["g"].shape).to(BF16), beta=torch.rand(1, 24, 2).to(BF16),
              safe_gate=True, cu_seqlens=a["cu_seqlens"])
    fastkda.chunk_kda(**kw, cu_seqlens_cpu=a["cu_seqlens"].clone())
    with pytest.raises(ValueError, match="cu_seqlens"):
        fastkda.chunk_kda(**kw, cu_seqlens_cpu=torch.tensor([0, 7, 5, 24], dtype=torch.int32))


@pytest.mark.parametrize("value,expected", [("1", True), ("0", False), ("", False)])
def test_strict_checks_env_variable(value, expected):
    env = dict(os.environ, FASTKDA_STRICT_CHECKS=value)
    r = subprocess.run([sys.executable, "-c", "import fastkda.checks as c; print(c.strict_checks())"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(expected)


def test_overlap_detection():
    buf = torch.zeros(100)
    assert checks._overlaps(buf[:50], buf[49:])
    assert not checks._overlaps(buf[:50], buf[50:])
    assert checks._overlaps(buf, buf[10:20])
    assert not checks._overlaps(buf[:0], buf)                      # empty tensors touch nothing
    assert not checks._overlaps(torch.zeros(10), torch.zeros(10))
    # spans are byte ranges: an fp32 view and a bf16 view of one byte buffer
    raw = torch.zeros(64, dtype=torch.uint8)
    assert checks._overlaps(raw[:32].view(torch.float32), raw[30:].view(BF16))
    assert not checks._overlaps(raw[:32].view(torch.float32), raw[32:].view(BF16))


def test_check_no_alias_allowed_pair_needs_identical_tensor():
    s = torch.zeros(2, 3, 4)
    checks.check_no_alias(dict(final_state=s), dict(initial_state=s), allowed=(("final_state", "initial_state"),))
    with pytest.raises(ValueError, match="final_state"):
        checks.check_no_alias(dict(final_state=s), dict(initial_state=s))
    with pytest.raises(ValueError, match="final_state"):
        checks.check_no_alias(dict(final_state=s[1:]), dict(initial_state=s),
                              allowed=(("final_state", "initial_state"),))
    # the allowance is for that pair only
    with pytest.raises(ValueError, match="out"):
        checks.check_no_alias(dict(out=s), dict(initial_state=s), allowed=(("final_state", "initial_state"),))
    with pytest.raises(ValueError, match="out: must not share memory with final_state"):
        checks.check_no_alias(dict(out=s.view(-1)[:13], final_state=s.view(-1)[12:]),
                              dict(initial_state=None))
    checks.check_no_alias(dict(out=s.view(-1)[:12], final_state=s.view(-1)[12:]), dict(initial_state=None))
    checks.check_no_alias(dict(out=None, final_state=s), dict(q=torch.zeros(3)))


def test_message_says_what_was_expected():
    a = base_args()
    with pytest.raises(ValueError) as info:
        fastkda.fwd(**dict(a, k=a["k"].float()))
    assert "bfloat16" in str(info.value) and "float32" in str(info.value)
    with pytest.raises(ValueError) as info:
        fastkda.fwd(**dict(a, lower_bound=-5.5))
    assert "-5.5" in str(info.value)
    with pytest.raises(ValueError) as info:
        fastkda.fwd(**dict(a, initial_state=a["initial_state"][:, :1].contiguous()))
    assert "(1, 2, 64, 64)" in str(info.value)


def test_span_of_contiguous_and_strided_tensors():
    """The contiguous shortcut of checks._span gives the same byte range as the per-dimension extent."""
    from fastkda.checks import _span
    x = torch.zeros(3, 4, 5, dtype=torch.bfloat16)
    assert _span(x) == (x.data_ptr(), x.data_ptr() + 60 * 2)
    t = x.transpose(0, 2)                              # not contiguous: the extent formula
    assert not t.is_contiguous() and _span(t) == _span(x)
    s = x[:, 1:3, ::2]                                 # strided view: from its first to its last element
    last = s[-1, -1, -1].data_ptr()
    assert _span(s) == (s.data_ptr(), last + 2)
