"""The Triton kernels against the float64 recurrence, feature by feature.

Without CUDA these run through Triton's CPU interpreter on tiny shapes (conftest sets TRITON_INTERPRET).
Tolerances: on the GPU, bf16 inputs are held to the project's 5e-3 relative L2. The interpreter converts fp32
to bf16 by truncation (measured: max relative error 7.6e-3, mean bias -2.8e-3, against round-to-nearest's
3.9e-3 and no bias on the GPU), so there bf16 runs are held to 2e-2, and exactness is checked with fp32
inputs, whose stage tensors stay fp32 (and products full fp32): 2e-4.
"""

import math

import pytest
import torch

from fastkda.api import forward
from fastkda.reference import kda_recurrence

from conftest import HAS_CUDA

DEVICE = "cuda" if HAS_CUDA else "cpu"
BF16_TOL = 5e-3 if HAS_CUDA else 2e-2
FP32_TOL = 5e-3 if HAS_CUDA else 2e-4   # on the GPU the products run in tf32 (10-bit mantissa)


def rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make(lens=None, B=1, T=64, H=1, HV=1, K=64, V=64, dtype=torch.bfloat16, state=torch.float32,
         state_v_first=True, with_h0=True, seed=0, gate_shift=0.0):
    gen = torch.Generator().manual_seed(seed)
    if lens is not None:
        B, T = 1, sum(lens)
    rnd = lambda *s: torch.randn(*s, generator=gen)
    x = dict(q=rnd(B, T, H, K).to(dtype), k=rnd(B, T, H, K).to(dtype), v=rnd(B, T, HV, V).to(dtype),
             g=(rnd(B, T, HV, K) + gate_shift).to(dtype), beta=rnd(B, T, HV).to(dtype))
    x = {n: t.to(DEVICE) for n, t in x.items()}
    N = B if lens is None else len(lens)
    shape = (N, HV, V, K) if state_v_first else (N, HV, K, V)
    p = dict(A_log=torch.rand(HV, generator=gen).to(DEVICE), dt_bias=torch.rand(HV, K, generator=gen).to(DEVICE),
             lower_bound=-5.0, scale=K ** -0.5,
             initial_state=(0.1 * rnd(*shape)).to(state).to(DEVICE) if with_h0 else None,
             cu_seqlens=None if lens is None else torch.tensor([0] + list(torch.tensor(lens).cumsum(0)),
                                                               dtype=torch.int32, device=DEVICE))
    return x, p, shape


def run_triton(x, p, shape, state_dtype=torch.float32, state_v_first=True, flags=(True, True, True), final=True):
    out = torch.full_like(x["v"], float("nan"))
    fs = torch.full(shape, float("nan"), dtype=state_dtype, device=DEVICE) if final else None
    forward(**x, **p, out=out, final_state=fs, state_v_first=state_v_first, use_qk_l2norm=flags[0],
            use_gate=flags[1], use_beta_sigmoid=flags[2], backend="triton")
    return out, fs


def truth(x, p, state_v_first=True, flags=(True, True, True)):
    return kda_recurrence(**{n: t.cpu() for n, t in x.items()}, scale=p["scale"],
                          A_log=None if p["A_log"] is None else p["A_log"].cpu(),
                          dt_bias=None if p["dt_bias"] is None else p["dt_bias"].cpu(),
                          lower_bound=p["lower_bound"],
                          initial_state=None if p["initial_state"] is None else p["initial_state"].cpu(),
                          cu_seqlens=None if p["cu_seqlens"] is None else p["cu_seqlens"].cpu(),
                          state_v_first=state_v_first, use_qk_l2norm=flags[0], use_gate=flags[1],
                          use_beta_sigmoid=flags[2])


def record_launches(monkeypatch, entry=lambda kernel, kwargs: getattr(kernel, "__name__", str(kernel))):
    """The launches through fastkda.kernels.launch from now on, as entry(kernel, kwargs) each (they still run)."""
    from fastkda import kernels
    launched, launch = [], kernels.launch

    def recording(kernel, grid, *args, **kwargs):
        launched.append(entry(kernel, kwargs))
        return launch(kernel, grid, *args, **kwargs)
    monkeypatch.setattr(kernels, "launch", recording)
    return launched


def check(x, p, shape, tol, **kw):
    out, fs = run_triton(x, p, shape, **kw)
    assert not out.isnan().any(), "unwritten or NaN output"
    o_ref, s_ref = truth(x, p, kw.get("state_v_first", True), kw.get("flags", (True, True, True)))
    assert rel(out.cpu(), o_ref) < tol
    if fs is not None:
        assert not fs.isnan().any(), "unwritten or NaN final state"
        assert rel(fs.cpu(), s_ref) < tol
    return out, fs


def test_fixed_length_exact_in_fp32():
    x, p, shape = make(B=2, T=70, dtype=torch.float32)
    check(x, p, shape, FP32_TOL)


def test_fixed_length_bf16_head_dim_128():
    x, p, shape = make(T=80, K=128, V=128, seed=1)
    check(x, p, shape, BF16_TOL)


def test_varlen_edges_and_empty_sequences():
    lens = [0, 1, 31, 0, 32, 33, 65, 0]
    x, p, shape = make(lens, dtype=torch.float32, seed=2)
    out, fs = check(x, p, shape, FP32_TOL)
    # an empty sequence's final state is its initial state, exactly
    for n in (0, 3, 7):
        assert torch.equal(fs[n], p["initial_state"][n])


def test_varlen_int64_offsets_gva_and_mixed_head_dims():
    x, p, shape = make([5, 70], H=1, HV=2, K=64, V=128, dtype=torch.float32, seed=3)
    p["cu_seqlens"] = p["cu_seqlens"].long()
    check(x, p, shape, FP32_TOL)


def test_state_layout_k_first_and_no_initial_state():
    x, p, shape = make(T=40, K=64, V=128, dtype=torch.float32, state_v_first=False, with_h0=False, seed=4)
    check(x, p, shape, FP32_TOL, state_v_first=False)


def test_fp16_inputs_write_fp16_outputs():
    x, p, shape = make([20, 45], dtype=torch.float16, seed=11)
    out, _ = check(x, p, shape, BF16_TOL)
    assert out.dtype == torch.float16


def test_bf16_states_in_and_out():
    x, p, shape = make([30, 50], state=torch.bfloat16, seed=5)
    check(x, p, shape, BF16_TOL, state_dtype=torch.bfloat16)


def test_no_final_state_requested():
    x, p, shape = make(T=20, dtype=torch.float32, seed=6)
    out, fs = check(x, p, shape, FP32_TOL, final=False)
    assert fs is None


@pytest.mark.parametrize("flags", [(False, True, True), (True, True, False), (True, False, True)])
def test_unfused_options(flags):
    x, p, shape = make(T=50, dtype=torch.float32, seed=7)
    if not flags[0]:   # without the fused norm, keep q, k at unit scale as a caller would
        x["q"], x["k"] = x["q"] / 11.3, x["k"] / 11.3
    if not flags[1]:   # g is the log-decay itself, in [-5, 0]
        x["g"] = -5.0 * torch.sigmoid(x["g"])
        p.update(A_log=None, dt_bias=None, lower_bound=None)
    if not flags[2]:
        x["beta"] = torch.sigmoid(x["beta"])
    check(x, p, shape, FP32_TOL, flags=flags)


def test_gate_without_A_log_or_dt_bias():
    x, p, shape = make(T=30, dtype=torch.float32, seed=8)
    p.update(A_log=None, dt_bias=None)
    check(x, p, shape, FP32_TOL)


@pytest.mark.parametrize("gate_shift", [50.0, -50.0])
def test_gates_pinned_at_both_ends(gate_shift):
    # +50: every step decays by the lower bound (e^{-5}); -50: almost no decay (long memory)
    x, p, shape = make(T=130, dtype=torch.float32, gate_shift=gate_shift, seed=9)
    check(x, p, shape, FP32_TOL)


def test_final_state_in_place_over_initial_state():
    x, p, shape = make([20, 44], dtype=torch.float32, seed=10)
    out_ref, fs_ref = run_triton(x, p, shape)
    h = p["initial_state"].clone()
    out = torch.empty_like(x["v"])
    forward(**x, **{**p, "initial_state": h}, out=out, final_state=h, state_v_first=True, use_qk_l2norm=True,
            use_gate=True, use_beta_sigmoid=True, backend="triton")
    assert torch.equal(out, out_ref) and torch.equal(h, fs_ref)


def test_problems_beyond_32_bit_offsets_are_rejected_before_any_launch():
    # 180K tokens x 96 heads x 128: more elements than the kernels' 32-bit offsets address (meta tensors:
    # shapes only, nothing allocated)
    T, H, D = 180_000, 96, 128
    x = {n: torch.empty(1, T, H, D, dtype=torch.bfloat16, device="meta") for n in ("q", "k", "v", "g")}
    x["beta"] = torch.empty(1, T, H, dtype=torch.bfloat16, device="meta")
    out = torch.empty_like(x["v"])
    with pytest.raises(ValueError, match="2\\^31"):
        forward(**x, scale=D ** -0.5, out=out, final_state=None, A_log=None, dt_bias=None, lower_bound=-5.0,
                initial_state=None, cu_seqlens=None, state_v_first=True, use_qk_l2norm=True, use_gate=True,
                use_beta_sigmoid=True, backend="triton")
    from fastkda.checks import check_index_range
    check_index_range(170_000, 96, 96, 128, 128, 1, 32)          # just inside: accepted
    with pytest.raises(ValueError, match="initial_state"):
        check_index_range(1000, 96, 96, 128, 128, 1400, 32)       # 1400 states of 96 x 128 x 128


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("long", [False, True])
def test_chunk_tables_of_packed_sequences(cu_dtype, long):
    # Stage 1 finds its rows in these tables; every slot must name its sequence's range, and slots past the
    # last chunk an empty one (stage 1 then writes zeros there), including the slot after the last chunk.
    # `long`: more slots than the tables kernel handles in one pass (RBLOCK = 1024).
    from fastkda.kernels import CHUNK_SIZE as BT, chunk_tables
    lens = [0, 1, BT, BT + 1, 0, 3 * BT, 5, 0] + ([700 * BT + 3, 9, 500 * BT] if long else [])
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=cu_dtype, device=DEVICE)
    slots, offsets, rows, _ = chunk_tables(cu, sum(lens))
    expect_rows, expect_offsets, start = [], [0], 0
    for n in lens:
        chunks = -(-n // BT)
        expect_rows += [(start + c * BT, start + n) for c in range(chunks)]
        expect_offsets.append(expect_offsets[-1] + chunks)
        start += n
    assert slots == -(-sum(lens) // BT) + len(lens) and slots > len(expect_rows)
    if long:
        assert slots > 1024
    assert offsets.cpu().tolist() == expect_offsets
    pairs = rows.cpu().view(-1, 2).tolist()
    assert [tuple(p) for p in pairs[:len(expect_rows)]] == expect_rows
    assert all(t0 == eos == 0 for t0, eos in pairs[len(expect_rows):])


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("in_kernel", [True, False])
def test_sequences_longest_first_ties_in_order(cu_dtype, in_kernel, monkeypatch):
    # Stage 2 starts the longest sequences' programs first; every sequence exactly once (a permutation),
    # equal lengths in their packed order -- ranked in the chunk-offsets kernel (more sequences than one
    # JBLOCK of 16) or sorted (longest_first), the same order.
    from fastkda import kernels
    monkeypatch.setattr(kernels, "ORDER_IN_KERNEL", 256 if in_kernel else 0)
    lens = [3, 0, 70, 3, 64, 70, 1] + [5] * 12 + [0, 70]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=cu_dtype, device=DEVICE)
    order = kernels.chunk_tables(cu, sum(lens))[3]
    assert order.dtype == torch.int32
    expect = sorted(range(len(lens)), key=lambda n: (-lens[n], n))
    assert order.cpu().tolist() == expect
    assert kernels.longest_first(cu).cpu().tolist() == expect


def test_gluon_kernels_need_16_byte_aligned_inputs():
    # Their cp.async copies move 16-byte pieces: a contiguous view that starts one element into its storage
    # must send the call to the Triton kernels (tests/test_gpu.py runs one).
    from fastkda.kernels import _aligned16
    buf = torch.zeros(1 + 4 * 128, dtype=torch.bfloat16)
    assert buf.data_ptr() % 64 == 0 and _aligned16(buf[:4 * 128])       # torch allocations are aligned
    assert not _aligned16(buf[1:])
    assert not _aligned16(buf[:8], buf[1:9])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_stage1_tb_holds_the_transposed_inverse_times_beta(dtype):
    # Stage 2 forms U0ᵀ = Vᵀ·(high half + low half): tb[j, i] + tb[BT + j, i] must be
    # (T·diag(β))[i, j], with T = (I + L)⁻¹ unit lower triangular: upper triangular in (j, i), β on the
    # diagonal, zero for padding tokens (β = 0 there). Halves: bf16 high and low parts; fp32 keeps one.
    from fastkda.kernels import CHUNK_SIZE as BT, prepare_chunks
    lens = [BT + 5, 3]
    x, p, _ = make(lens, K=64, V=64, dtype=dtype, seed=12)
    st = prepare_chunks(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=p["scale"], A_log=p["A_log"],
                        dt_bias=p["dt_bias"], lower_bound=p["lower_bound"], cu_seqlens=p["cu_seqlens"],
                        use_qk_l2norm=True, use_gate=True, use_beta_sigmoid=True)
    tb = st.tb[0, :3].float().cpu()                               # the three chunks of the two sequences
    hi, lo = tb[:, :BT], tb[:, BT:]
    tbt = hi + lo                                                 # [chunk, j, i] = (T·diag(β))[i, j]
    beta = torch.sigmoid(x["beta"][0, :, 0].float().cpu())
    betas = [beta[:BT], torch.cat([beta[BT:BT + 5], torch.zeros(BT - 5)]),
             torch.cat([beta[BT + 5:], torch.zeros(BT - 3)])]
    for c in range(3):
        assert torch.allclose(torch.diagonal(tbt[c]), betas[c], rtol=1e-2, atol=1e-6)
        assert torch.count_nonzero(torch.tril(tbt[c], -1)) == 0   # (Tβ)ᵀ: nothing below the diagonal
    assert torch.count_nonzero(tbt[1][:, 5:]) == 0 and torch.count_nonzero(tbt[2][:, 3:]) == 0
    if dtype == torch.float32:
        assert torch.count_nonzero(lo) == 0
    else:                                                         # the low half refines the high half
        assert lo.abs().max() > 0 and bool((lo.abs() <= hi.abs() * 2 ** -7 + 1e-30).all())


@pytest.mark.parametrize("K", [64, 128])
def test_stage1_tma_descriptors_cover_the_outputs_row_by_row(K):
    # The Gluon stage 1 stores a1, kt and aqk with TMA: each descriptor must view its whole tensor as rows of
    # K (or BT) values, in blocks of BT rows shaped and swizzled like the kernel's shared tiles ([BT, 64] with
    # 128-byte rows, [BT, BT] with 64-byte rows), so that row (chunk block)·rows + i is row i of that block.
    from fastkda import kernels
    BT, HV, slots = kernels.CHUNK_SIZE, 3, 5
    st = kernels.Stage1(a1=torch.empty(HV, slots, 2 * BT, K, dtype=torch.bfloat16), tb=None,
                        aqk=torch.empty(HV, slots, BT, BT, dtype=torch.bfloat16),
                        kt=torch.empty(HV, slots, BT, K, dtype=torch.bfloat16), gl=None, chunk_offsets=None,
                        seq_order=None, n_chunks=slots, N=1)
    d = kernels._stage1_descriptors(st, K, BT)
    for name, t, cols, block, swizzle in (("a1_desc", st.a1, K, [BT, 64], 128), ("kt_desc", st.kt, K, [BT, 64], 128),
                                          ("aqk_desc", st.aqk, BT, [BT, BT], 64)):
        desc = d[name]
        assert desc.base is t and t.is_contiguous()
        assert list(desc.shape) == [HV * slots * t.shape[2], cols] and list(desc.strides) == [cols, 1]
        assert list(desc.block_shape) == block and desc.layout.swizzle_byte_width == swizzle


def test_stage1_descriptors_equal_the_checked_constructor(monkeypatch):
    # With direct launches the descriptors are built without the dataclass's checks (host time): the same
    # fields as Gluon's checked TensorDescriptor, which accepts them.
    from fastkda import kernels
    from fastkda.kernels import direct_launch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    BT, K = kernels.CHUNK_SIZE, 128
    st = kernels.Stage1(a1=torch.empty(2, 3, 2 * BT, K, dtype=torch.bfloat16), tb=None,
                        aqk=torch.empty(2, 3, BT, BT, dtype=torch.bfloat16),
                        kt=torch.empty(2, 3, BT, K, dtype=torch.bfloat16), gl=None, chunk_offsets=None,
                        seq_order=None, n_chunks=3, N=1)
    built = {}
    for direct in (False, True):
        monkeypatch.setattr(direct_launch, "_direct", direct)
        built[direct] = kernels._stage1_descriptors(st, K, BT)
    for name, fast in built[True].items():
        checked = built[False][name]
        assert type(fast) is TensorDescriptor and fast == checked and fast.base is checked.base
        TensorDescriptor(fast.base, fast.shape, fast.strides, fast.block_shape, fast.layout)   # passes its checks


@pytest.mark.skipif(not HAS_CUDA, reason="windows run on the Gluon kernels (Hopper)")
@pytest.mark.parametrize("B,T,windows", [(1, 2000, 3), (3, 1024, 4), (2, 96, 2)])
@pytest.mark.parametrize("in_place", [False, True])
def test_windows_of_chunks_give_the_unwindowed_results_bit_for_bit(B, T, windows, in_place, monkeypatch):
    # Windows split the chunk slots (B = 3, 4 windows: sequences cut mid-way and windows that hold none of a
    # sequence's chunks); the state crosses windows in fp32, so the results are the same bits. The state
    # buffer is poisoned, so a window that read it before the previous one wrote it would show.
    from fastkda import kernels
    from fastkda.kernels import _is_hopper
    if not _is_hopper(torch.device("cuda")):
        pytest.skip("needs Hopper")
    monkeypatch.setattr(kernels, "FUSED", False)     # (short fixed-length calls take the fused kernel by rule)
    x, p, shape = make(B=B, T=T, H=2, HV=4, K=128, V=128, seed=3)
    results = []
    empty = torch.empty
    monkeypatch.setattr(kernels.torch, "empty",
                        lambda *a, **k: empty(*a, **k).fill_(float("nan")) if k.get("dtype") == torch.float32
                        else empty(*a, **k))
    for n in (1, windows):
        monkeypatch.setattr(kernels, "WINDOWS", n)
        h0 = p["initial_state"].clone()
        out = torch.full_like(x["v"], float("nan"))
        fs = h0 if in_place else torch.full(shape, float("nan"), device=DEVICE)
        forward(**x, **dict(p, initial_state=h0), out=out, final_state=fs, state_v_first=True, use_qk_l2norm=True,
                use_gate=True, use_beta_sigmoid=True, backend="triton")
        results.append((out, fs))
    assert not results[1][0].isnan().any() and not results[1][1].isnan().any()
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.skipif(not HAS_CUDA, reason="windows run on the Gluon kernels (Hopper)")
def test_windows_in_a_cuda_graph(monkeypatch):
    # Windows launch stage 1 by programmatic dependent launch and hand states over through flags: captured
    # in a graph and replayed on new inputs, they must give the eager results.
    from fastkda import kernels
    from fastkda.kernels import _is_hopper
    if not _is_hopper(torch.device("cuda")):
        pytest.skip("needs Hopper")
    monkeypatch.setattr(kernels, "FUSED", False)     # (short fixed-length calls take the fused kernel by rule)
    monkeypatch.setattr(kernels, "WINDOWS", 3)
    x, p, shape = make(B=2, T=1000, H=2, HV=4, K=128, V=128, seed=5)
    out, fs = torch.empty_like(x["v"]), torch.empty(shape, device=DEVICE)

    def call():
        forward(**x, **p, out=out, final_state=fs, state_v_first=True, use_qk_l2norm=True, use_gate=True,
                use_beta_sigmoid=True, backend="triton")
    from fastkda.bench.timing import capture_graph
    graph = capture_graph(call)
    x2, p2, _ = make(B=2, T=1000, H=2, HV=4, K=128, V=128, seed=6)
    for name in x:
        x[name].copy_(x2[name])
    p["initial_state"].copy_(p2["initial_state"])
    graph.replay()
    torch.cuda.synchronize()
    monkeypatch.setattr(kernels, "WINDOWS", 1)
    expected = run_triton(x, p, shape)
    assert torch.equal(out, expected[0]) and torch.equal(fs, expected[1])


def test_windows_by_rule(monkeypatch):
    # Windows only where stage 2 has at most one program per WINDOW_SM_SHARE SMs and the sequences one
    # length; one window per WINDOW_CHUNKS chunk slots, at most MAX_WINDOWS.
    from fastkda import kernels
    monkeypatch.setattr(kernels, "gluon_stage1_applies", lambda q, k, g: True)
    monkeypatch.setattr(kernels, "_sm_count", lambda device: 132)

    def windows(B, T, HV, cu=None):
        v = torch.empty(B, T, HV, 128, dtype=torch.bfloat16)
        return kernels.stage2_windows(None, None, None, v, cu)
    per_window = kernels.WINDOW_CHUNKS * kernels.CHUNK_SIZE
    assert windows(1, 32768, 16) == min(kernels.MAX_WINDOWS, 32768 // per_window) > 1
    assert windows(1, 65536, 8) == kernels.MAX_WINDOWS
    assert windows(2, 32768, 8) == kernels.MAX_WINDOWS        # windows count chunk slots of all sequences
    assert windows(1, per_window, 16) == 1
    assert windows(1, 65536, 64) == 1                         # 128 stage-2 programs: stage 2 fills the GPU
    assert windows(1, 65536, 16, cu=torch.tensor([0, 65536])) == 1
    monkeypatch.setattr(kernels, "WINDOWS", 3)
    assert windows(1, 8192, 64) == 3                          # forced (experiments), where windows can run
    assert windows(1, 8192, 64, cu=torch.tensor([0, 8192])) == 1


@pytest.mark.skipif(not HAS_CUDA, reason="the wide stage 2 is a Gluon kernel (Hopper)")
@pytest.mark.parametrize("lens,B,T,K,with_h0,state_v_first", [
    (None, 2, 1000, 128, True, True),              # fixed length, a partial last chunk
    ((0, 33, 1000, 64), None, None, 128, False, True),   # packed: an empty sequence, partial chunks, no h0
    ((300, 17, 700), None, None, 128, True, False),     # the state K-first
    ((300, 17, 700), None, None, 64, True, True),       # keys of 64 channels, values of 128
])
def test_wide_stage2_gives_the_two_program_results_bit_for_bit(lens, B, T, K, with_h0, state_v_first, monkeypatch):
    # Both value blocks of a head in one program of two warpgroups: each warpgroup computes its 64 state rows
    # exactly as a program of its own would, so the results are the same bits. The launches are recorded,
    # so that the test fails if the wide kernel did not run.
    from fastkda import kernels
    from fastkda.kernels import _is_hopper
    if not _is_hopper(torch.device("cuda")):
        pytest.skip("needs Hopper")
    monkeypatch.setattr(kernels, "FUSED", False)     # (short fixed-length calls take the fused kernel by rule)
    kw = dict(lens=lens) if lens is not None else dict(B=B, T=T)
    x, p, shape = make(**kw, H=2, HV=4, K=K, V=128, seed=11, with_h0=with_h0, state_v_first=state_v_first)
    launched = record_launches(monkeypatch, lambda kernel, kwargs: (getattr(kernel, "__name__", str(kernel)),
                                                                    kwargs.get("BV"), kwargs.get("num_warps")))
    results = []
    for wide in (False, True):
        monkeypatch.setattr(kernels, "STAGE2_WIDE", wide)
        launched.clear()
        results.append(run_triton(x, p, shape, state_v_first=state_v_first))
        stage2 = [entry for entry in launched if "recurrence_gluon" in entry[0]]
        assert stage2 == [("_chunk_recurrence_gluon_kernel", 128, 8) if wide else
                          ("_chunk_recurrence_gluon_kernel", 64, 4)]
    assert not results[1][0].isnan().any() and not results[1][1].isnan().any()
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.skipif(not HAS_CUDA, reason="the ring belongs to the Gluon stage 2 (Hopper)")
@pytest.mark.parametrize("lens,B,T,with_h0,wide", [
    (None, 2, 1000, True, False),               # fixed length, a partial last chunk
    ((0, 33, 1000, 64), None, None, False, False),   # packed: an empty sequence, partial chunks, no h0
    ((300, 17, 700), None, None, True, True),   # both value blocks in one program
])
def test_stage2_ring_depths_give_the_same_bits(lens, B, T, with_h0, wide, monkeypatch):
    # The loader partition fills a ring of RING slots ahead of the chain; the chain's arithmetic does not depend
    # on how far ahead, so every depth gives the same bits. The launches are recorded, so that the test fails
    # if the forced depth did not run.
    from fastkda import kernels
    from fastkda.kernels import _is_hopper
    if not _is_hopper(torch.device("cuda")):
        pytest.skip("needs Hopper")
    monkeypatch.setattr(kernels, "FUSED", False)     # (short fixed-length calls take the fused kernel by rule)
    kw = dict(lens=lens) if lens is not None else dict(B=B, T=T)
    x, p, shape = make(**kw, H=2, HV=4, K=128, V=128, seed=5, with_h0=with_h0, state_v_first=True)
    monkeypatch.setattr(kernels, "STAGE2_WIDE", wide)
    launched = record_launches(monkeypatch, lambda kernel, kwargs: kwargs.get("RING"))
    results = []
    for ring in ((2, 3, 4) if wide else (2, 3, 6)):
        monkeypatch.setattr(kernels, "STAGE2_RING", ring)
        launched.clear()
        results.append(run_triton(x, p, shape, state_v_first=True))
        assert ring in launched
    assert not results[0][0].isnan().any() and not results[0][1].isnan().any()
    for other in results[1:]:
        assert torch.equal(results[0][0], other[0]) and torch.equal(results[0][1], other[1])


def test_stage2_ring_by_rule(monkeypatch):
    # Six slots where no two narrow programs need to share an SM, else three (two narrow programs per SM); a wide
    # program always three. The register caps keep those occupancies: 8 warps (chain + loader) at 128 registers
    # are half an SM's 64 K registers, 12 warps (wide) at 168 fit one SM.
    from fastkda import kernels
    monkeypatch.setattr(kernels, "_sm_count", lambda device: 132)
    assert kernels.stage2_ring(128, False, None) == 6        # H64, 8,192 tokens: one program per SM
    assert kernels.stage2_ring(132, False, None) == 6
    assert kernels.stage2_ring(133, False, None) == 3        # some SMs hold two programs
    assert kernels.stage2_ring(1024, False, None) == 3       # H64, 8 x 1,024 tokens
    assert kernels.stage2_ring(96, True, None) == 3          # H96 wide: 96 programs
    monkeypatch.setattr(kernels, "STAGE2_RING", 4)
    assert kernels.stage2_ring(1024, False, None) == 4 and kernels.stage2_ring(96, True, None) == 4
    registers = 64 * 1024
    assert kernels._stage2_maxnreg(3, False) * 8 * 32 * 2 <= registers
    assert kernels._stage2_maxnreg(6, False) * 8 * 32 <= registers
    assert kernels._stage2_maxnreg(3, True) * 12 * 32 <= registers
    assert kernels._stage2_maxnreg(3, False) - kernels.STAGE2_LOADER_REGS > 0


def test_wide_stage2_by_rule(monkeypatch):
    # One program per head only with 128-channel keys, at least WIDE_MIN_HEAD_SHARE two-program programs per
    # SM for one sequence, sequences averaging WIDE_MIN_TOKENS or more, and V of two value blocks;
    # STAGE2_WIDE forces it where it can run.
    from fastkda import kernels
    monkeypatch.setattr(kernels, "_sm_count", lambda device: 132)
    wide = lambda N, HV, T_total, K=128, V=128: kernels.stage2_wide(N, HV, K, V, T_total, None)
    assert wide(1, 96, 8192)                 # H96, 8,192 tokens: 192 programs, 1.45 per SM
    assert wide(6, 96, 8192)                 # H96, six sequences averaging 1,365 tokens
    assert wide(9, 96, 8192 + 8 * 1024)      # a long sequence among shorter ones: its own programs fill the GPU
    assert not wide(1, 88, 8192)             # 176 programs: 1.33 per SM
    assert not wide(1, 64, 8192)             # 128 programs: one per SM, bound by the chains
    assert not wide(8, 64, 8192)             # H64, 8 x 1,024: one sequence's programs do not fill the GPU
    assert not wide(9, 32, 8192 + 8 * 1024)  # a long sequence among shorter ones, 64 programs: its chain bounds
    assert not wide(256, 96, 256 * 64)       # 256 sequences of 64 tokens: state loads and stores dominate
    assert not wide(1, 96, 8192, K=64)       # smaller tiles: not measured to pay
    assert not wide(1, 96, 8192, V=64)       # one value block only
    minimum = kernels.WIDE_MIN_TOKENS
    assert wide(8, 96, 8 * minimum) and not wide(8, 96, 8 * minimum - 1)
    monkeypatch.setattr(kernels, "STAGE2_WIDE", True)
    assert wide(1, 64, 8192) and wide(1, 96, 8192, K=64) and not wide(1, 96, 8192, V=64)
    monkeypatch.setattr(kernels, "STAGE2_WIDE", False)
    assert not wide(1, 96, 8192)


@pytest.mark.skipif(not HAS_CUDA, reason="the fused kernel is a Gluon kernel (Hopper)")
@pytest.mark.parametrize("lens,B,T,H,HV,with_h0,state,state_v_first,final,cu_dtype", [
    ((5, 70, 0, 33, 1, 96, 300), None, None, 2, 2, True, torch.float32, True, True, torch.int32),
    ((64, 129, 0), None, None, 2, 4, False, torch.float32, False, True, torch.int64),   # GVA, K-first, no h0
    ((33, 100, 33, 0, 100, 1, 33), None, None, 2, 2, True, torch.float32, True, True, torch.int32),   # equal lengths
    ((40, 7) * 20, None, None, 1, 1, True, torch.float32, True, True, torch.int64),   # 40 sequences, equal lengths
    (None, 3, 100, 3, 3, True, torch.bfloat16, True, True, None),     # fixed length, bf16 states in and out
    (None, 2, 1000, 1, 2, True, torch.float32, True, False, None),    # no final state
])
def test_fused_kernel_gives_the_two_stage_results_bit_for_bit(lens, B, T, H, HV, with_h0, state, state_v_first,
                                                              final, cu_dtype, monkeypatch):
    # The fused kernel runs stage 1's and stage 2's code with the same rounding points, so outputs and final
    # states are the same bits (empty, one-token and partial sequences included). The launches are recorded,
    # so that the test fails if the fused kernel did not run, or ran when turned off.
    from fastkda import kernels
    from fastkda.kernels import _is_hopper
    if not _is_hopper(torch.device("cuda")):
        pytest.skip("needs Hopper")
    kw = dict(lens=lens) if lens is not None else dict(B=B, T=T)
    x, p, shape = make(**kw, H=H, HV=HV, K=128, V=128, seed=7, with_h0=with_h0, state=state,
                       state_v_first=state_v_first)
    if cu_dtype is not None:
        p["cu_seqlens"] = p["cu_seqlens"].to(cu_dtype)
    launched = record_launches(monkeypatch)
    results = []
    for fused in (False, True):
        monkeypatch.setattr(kernels, "FUSED", fused)
        launched.clear()
        results.append(run_triton(x, p, shape, state_dtype=state, state_v_first=state_v_first, final=final))
        assert ("_fused_kernel" in launched) == fused
    (o_two, s_two), (o_fused, s_fused) = results
    assert not o_fused.isnan().any() and torch.equal(o_two, o_fused)
    if final:
        assert not s_fused.isnan().any() and torch.equal(s_two, s_fused)


@pytest.mark.skipif(not HAS_CUDA, reason="the fused kernel is a Gluon kernel (Hopper)")
def test_a_sequence_gets_the_same_bits_in_any_batch(monkeypatch):
    # Each (sequence, head) is computed on its own on either route, and the routes give the same bits, so a
    # sequence's output and final state do not depend on the batch it is served in: alone, in a fixed-length
    # batch, or packed among others at any offset, fused or in two stages (the route follows the batch's shape).
    from fastkda import kernels
    from fastkda.kernels import _is_hopper
    if not _is_hopper(torch.device("cuda")):
        pytest.skip("needs Hopper")
    L, a = 257, 257 + 100 + 33                        # sequence 3: L tokens from offset a
    x, p, shape = make(lens=[L, 100, 33, L, 1, 64], H=2, HV=2, K=128, V=128, seed=5)
    h0 = p["initial_state"]
    alone = ({n: t[:, a:a + L].contiguous() for n, t in x.items()}, dict(p, initial_state=h0[3:4].clone(),
             cu_seqlens=None), (1,) + shape[1:])
    pair = ({n: torch.cat([t[:, :L], t[:, a:a + L]]) for n, t in x.items()}, dict(p, initial_state=h0[[0, 3]],
            cu_seqlens=None), (2,) + shape[1:])
    launched = record_launches(monkeypatch)
    monkeypatch.setattr(kernels, "FUSED", False)
    o_ref, s_ref = run_triton(*alone)
    for fused in (False, True):
        monkeypatch.setattr(kernels, "FUSED", fused)
        launched.clear()
        o, s = run_triton(*alone)
        assert torch.equal(o, o_ref) and torch.equal(s, s_ref)
        o, s = run_triton(x, p, shape)
        assert torch.equal(o[:, a:a + L], o_ref) and torch.equal(s[3:4], s_ref)
        o, s = run_triton(*pair)
        assert torch.equal(o[1:], o_ref) and torch.equal(s[1:], s_ref)
        assert launched.count("_fused_kernel") == (3 if fused else 0)


@pytest.mark.skipif(not HAS_CUDA, reason="the fused kernel is a Gluon kernel (Hopper)")
def test_cu_seqlens_cpu_keeps_one_long_sequence_off_the_fused_kernel(monkeypatch):
    # 4 heads, one sequence of 8,192 tokens among 100 of 300: 404 programs, fused by the average alone, where it
    # is 2.4x slower (fused_sweep); with cu_seqlens_cpu the rule sees the longest sequence and runs the two
    # stages. Same bits either way.
    import fastkda
    from fastkda.kernels import _is_hopper
    if not _is_hopper(torch.device("cuda")):
        pytest.skip("needs Hopper")
    x, p, shape = make(lens=[8192] + [300] * 100, H=4, HV=4, K=128, V=128, seed=11)
    launched = record_launches(monkeypatch)
    results = []
    for cpu_copy in (None, p["cu_seqlens"].cpu()):
        launched.clear()
        out, fs = torch.empty_like(x["v"]), torch.empty(shape, dtype=torch.float32, device=DEVICE)
        fastkda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], p["scale"], out, p["A_log"], p["dt_bias"],
                    p["lower_bound"], p["initial_state"], fs, p["cu_seqlens"], cu_seqlens_cpu=cpu_copy)
        assert ("_fused_kernel" in launched) == (cpu_copy is None)
        results.append((out, fs))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_fused_kernel_applies_to_the_production_path_only(monkeypatch):
    # bf16 inputs where the Gluon stages run, K = V = 128, the gate with A_log and dt_bias, the l2 norm and the
    # β sigmoid; FUSED = False turns it off everywhere.
    from fastkda import kernels
    monkeypatch.setattr(kernels, "gluon_stage1_applies", lambda q, k, g: True)
    q = torch.empty(1, 64, 2, 128, dtype=torch.bfloat16)
    v = torch.empty(1, 64, 2, 128, dtype=torch.bfloat16)
    A_log, dt_bias = torch.empty(2), torch.empty(2, 128)

    def applies(q=q, v=v, A_log=A_log, dt_bias=dt_bias, flags=(True, True, True)):
        return kernels.fused_applies(q, q, q, v, A_log, dt_bias, *flags)
    assert applies()
    assert not applies(flags=(False, True, True)) and not applies(flags=(True, False, True))
    assert not applies(flags=(True, True, False))
    assert not applies(A_log=None) and not applies(dt_bias=None)
    assert not applies(q=torch.empty(1, 64, 2, 64, dtype=torch.bfloat16))
    assert not applies(v=torch.empty(1, 64, 2, 64, dtype=torch.bfloat16))
    assert not applies(v=torch.empty(1, 64, 2, 128, dtype=torch.float16))
    monkeypatch.setattr(kernels, "FUSED", False)
    assert not applies()


def test_fused_kernel_by_rule(monkeypatch):
    # Sequences of FUSED_MIN_TOKENS or more on average, then: packed, FUSED_MIN_PROGRAMS_PER_SM (sequence, head)
    # programs per SM (the rule cannot see one long sequence among short ones); fixed-length, waves of programs
    # at least FUSED_MIN_WAVE_FILL full on average, or sequences of at most FUSED_SHORT_TOKENS in one wave.
    from fastkda import kernels
    S = 132
    packed = lambda N, HV, T_total: kernels.fused_by_rule(N, HV, T_total, S, packed=True)
    fixed = lambda B, HV, T: kernels.fused_by_rule(B, HV, B * T, S, packed=False)
    mixed = 1300 + 547 + 2048 + 963 + 271 + 3063
    assert packed(8, 64, 8192) and packed(8, 96, 8192)       # 8 x 1,024 tokens: 512 and 768 programs
    assert packed(6, 64, mixed) and packed(6, 96, mixed)     # six mixed lengths: 384 and 576 programs
    assert not fixed(1, 64, 8192) and fixed(1, 96, 8192)      # one sequence of 8,192: 64 programs (0.48 full), 96 (0.73)
    assert fixed(1, 128, 8192) and fixed(1, 112, 8192)       # one wave 0.97 and 0.85 full
    assert fixed(1, 100, 8192) and fixed(1, 104, 4096)       # one wave 0.76 and 0.79 full
    assert fixed(4, 64, 2048) and fixed(2, 100, 2048)        # two waves 0.97 full; 0.76
    assert fixed(2, 96, 4096) and fixed(2, 88, 4096) and not fixed(2, 80, 4096)   # two waves 0.73, 0.67 full; 0.61
    assert fixed(3, 90, 2048) and fixed(1, 270, 2048)        # three waves 0.68 full (three or more: 0.67 at least)
    assert fixed(1, 96, 2048) and fixed(1, 88, 8192) and not fixed(1, 84, 8192)   # one wave 0.73, 0.67; 0.64
    assert not fixed(2, 32, 4096)                            # two waves 0.48 full
    assert fixed(1, 8, 1024) and fixed(1, 96, 1024) and fixed(4, 8, 1024) and fixed(1, 96, 128)   # short, one wave
    assert not fixed(1, 8, 1025) and not fixed(1, 133, 1024)   # longer; two waves 0.50 full
    assert not fixed(5, 32, 1024)                              # short in two waves 0.61 full: the wave rule
    assert not packed(2, 64, 4096) and not packed(8, 16, 8192)   # 128 packed programs: under 2.5 per SM
    assert not packed(1 + 32, 4, 8192 + 32 * 300)            # one long sequence among short ones, 132 programs
    assert not packed(256, 32, 256 * 64) and not fixed(256, 32, 64)   # 8,192 programs of 64 tokens
    assert not packed(65, 32, 64 * 64 + 8192)                # one long sequence among 64 short (avg 189)
    # with the longest sequence known (cu_seqlens_cpu): at most 1.5 SM shares of the tokens
    longest = lambda N, HV, T_total, n: kernels.fused_by_rule(N, HV, T_total, S, packed=True, max_seqlen=n)
    skew = 8192 + 100 * 300                                  # 404 programs: fused by the average alone
    assert packed(101, 4, skew) and not longest(101, 4, skew, 8192)
    assert longest(6, 64, mixed, 3063) and longest(6, 96, mixed, 3063) and longest(8, 64, 8192, 1024)
    assert longest(101, 8, 2048 + 30000, 2048) and not longest(101, 8, 3072 + 30000, 3072)   # 1.05, 1.53 shares
    share = kernels.FUSED_MAX_LONGEST_SHARE * 4 * skew / S
    assert longest(101, 4, skew, math.floor(share)) and not longest(101, 4, skew, math.floor(share) + 1)
    # fewer programs, the longest known: waves of programs as long as the longest, as fixed-length
    assert longest(8, 16, 8192, 1024) and longest(8, 32, 8192, 1024)       # one wave 0.97 full; two 0.97
    assert longest(8, 12, 8192, 1024) and longest(8, 11, 8192, 1024)       # one wave 0.73, 0.67 full
    assert not longest(8, 10, 8192, 1024)                                  # ... 0.61
    assert longest(8, 22, 8192, 1024) and not longest(8, 20, 8192, 1024)   # two waves 0.67 full; 0.61
    assert not longest(2, 70, 4096, 2048)                                  # two waves 0.53 full
    assert not longest(6, 32, mixed, 3063)              # 192 programs: one wave of 3,063 tokens 0.648 full
    assert longest(6, 48, mixed, 3063) and not packed(6, 48, mixed)         # 0.97 full; by the average alone
    assert not longest(16, 8, 1024 + 15 * 600, 1024) and longest(16, 8, 16 * 1024, 1024)   # 0.59; 0.97
    # the longest known, sequences need only FUSED_MIN_TOKENS_KNOWN tokens on average (the longest is bounded)
    assert longest(256, 32, 256 * 64, 64) and not packed(256, 32, 256 * 64)   # 8,192 programs of 64 tokens
    assert not longest(512, 32, 512 * 63, 63) and not longest(8, 16, 8 * 63, 63)
    assert longest(1 + 128, 32, 2048 + 128 * 64, 2048)  # 0.83 shares, 79 tokens on average
    assert not longest(1 + 64, 32, 8192 + 64 * 64, 8192)     # 2.75 shares
    assert not longest(1 + 256, 16, 4096 + 256 * 32, 4096)   # 48 tokens on average
    # the bounds, exactly
    least = math.ceil(kernels.FUSED_MIN_PROGRAMS_PER_SM * S)
    assert packed(least, 1, least * 256) and not packed(least - 1, 1, (least - 1) * 256)
    assert not packed(least, 1, least * 256 - 1)
    longer = kernels.FUSED_SHORT_TOKENS + 1
    for waves in (1, 2):                                     # (from 3 waves on, every count is 0.67 full)
        fill = math.ceil(kernels.FUSED_MIN_WAVE_FILL * waves * S)
        assert -(-fill // S) == waves
        assert fixed(fill, 1, longer) and not fixed(fill - 1, 1, longer)
        if waves > 1:
            assert fixed(fill, 1, 256) and not fixed(fill, 1, 255)
    short = kernels.FUSED_SHORT_TOKENS                       # short sequences: one wave, however full
    assert fixed(S, 1, short) and fixed(1, 1, short) and fixed(1, 1, 1) and not fixed(S + 1, 1, short)


def test_the_forward_takes_the_fused_kernel_by_rule(monkeypatch):
    # kda_forward counts the programs (sequences × value heads) and the mean sequence length of the call it
    # gets, packed or fixed-length, and takes the fused kernel where the rule says so; FUSED overrides.
    from fastkda import kernels

    class TwoStages(Exception):
        pass

    def two_stages(*args, **kwargs):
        raise TwoStages
    taken = []
    monkeypatch.setattr(kernels, "fused_applies", lambda *args: True)
    monkeypatch.setattr(kernels, "_sm_count", lambda device: 4)        # packed: at least 10 programs
    monkeypatch.setattr(kernels, "run_fused", lambda *args, **kwargs: taken.append("fused"))
    monkeypatch.setattr(kernels, "_plan_chunks", two_stages)

    def route(lens=None, B=1, T=0, HV=1, max_seqlen=None):
        if lens is not None:
            B, T = 1, sum(lens)
        q = torch.empty(B, T, 1, 128, dtype=torch.bfloat16)
        v = torch.empty(B, T, HV, 128, dtype=torch.bfloat16)
        cu = None if lens is None else torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
        try:
            kernels.kda_forward(q, q, v, v, v[..., 0], scale=1.0, out=v, final_state=None, A_log=None, dt_bias=None,
                                lower_bound=-5.0, initial_state=None, cu_seqlens=cu, state_v_first=True,
                                use_qk_l2norm=True, use_gate=True, use_beta_sigmoid=True, max_seqlen=max_seqlen)
            return taken.pop()
        except TwoStages:
            return "two stages"
    assert route(lens=[256] * 10) == "fused"
    assert route(lens=[256] * 9) == "two stages"          # 9 programs
    assert route(lens=[256] * 5, HV=2) == "fused"          # 10 programs
    assert route(lens=[300, 200, 255, 255, 270] * 2) == "fused"           # 256 tokens on average
    assert route(lens=[300, 200, 255, 255, 269] * 2) == "two stages"      # just under
    # the longest sequence, where known: at most 1.5 SM shares of the tokens (1.5 · (9 × 256 + 1382) / 4 ≥ 1382)
    assert route(lens=[256] * 9 + [1382], max_seqlen=1382) == "fused"
    assert route(lens=[256] * 9 + [1383], max_seqlen=1383) == "two stages"
    assert route(lens=[256] * 9 + [1383]) == "fused"                     # unknown: by the average alone
    # fewer programs, the longest known: two waves of 8 × 256 tokens, 1.0 full; of 5, 0.63
    assert route(lens=[256] * 8, max_seqlen=256) == "fused" and route(lens=[256] * 8) == "two stages"
    assert route(lens=[256] * 5, max_seqlen=256) == "two stages"
    # ... and sequences of FUSED_MIN_TOKENS_KNOWN on average suffice
    assert route(lens=[64] * 10, max_seqlen=64) == "fused" and route(lens=[64] * 10) == "two stages"
    assert route(lens=[63] * 10, max_seqlen=63) == "two stages"
    # fixed-length: waves at least 0.65 full on average (3 of 4 programs, 6 of 8), not 0.5 (2 programs) or
    # 0.625 (5) ...
    long = kernels.FUSED_SHORT_TOKENS + 32
    assert route(B=3, T=long) == "fused" and route(B=6, T=256) == "fused" and route(B=3, T=256, HV=2) == "fused"
    assert route(B=2, T=long) == "two stages" and route(B=5, T=256) == "two stages"
    assert route(B=6, T=255) == "two stages"
    # ... or sequences of at most FUSED_SHORT_TOKENS in one wave (4 programs), however full
    assert route(B=3, T=kernels.FUSED_SHORT_TOKENS) == "fused" and route(B=1, T=1) == "fused"
    assert route(B=5, T=kernels.FUSED_SHORT_TOKENS) == "two stages"     # two waves, 0.63 full
    monkeypatch.setattr(kernels, "FUSED", True)
    assert route(lens=[1]) == "fused"
    monkeypatch.setattr(kernels, "FUSED", False)
    assert route(B=4, T=256) == "two stages" and route(lens=[256] * 10) == "two stages"
