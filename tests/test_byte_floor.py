"""benchmarks/byte_floor.py: the traffic kernels read and write exactly the blocks of the designs they stand for
(else the floor they time is another pattern's). Each output is a known function of what was read."""

import pytest
import torch

from fastkda.bench.tasks import Task, make_inputs
from fastkda.kernels import CHUNK_SIZE as BT

from conftest import HAS_CUDA, benchmark_script


def _tool():
    return benchmark_script("byte_floor")


def _chunks(x):
    """(sequence n, token start, token end) of every chunk, in chunk-slot order (fastkda.kernels.chunk_tables)."""
    if x.cu_seqlens is None:
        B, T = x.q.shape[:2]
        bounds = [(n * T, (n + 1) * T) for n in range(B)]
    else:
        cu = x.cu_seqlens.tolist()
        bounds = list(zip(cu[:-1], cu[1:]))
    return [(n, t, min(t + BT, eos)) for n, (bos, eos) in enumerate(bounds) for t in range(bos, eos, BT)]


@pytest.mark.parametrize("seq_lens,fixed", [((40,), True), ((5, 37, 0, 33), False)])
def test_traffic_kernels_touch_the_designs_blocks(seq_lens, fixed):
    tool = _tool()
    H, D = 2, 128
    x = make_inputs(Task("t", H, seq_lens, fixed=fixed, D=D), "cuda" if HAS_CUDA else "cpu", seed=3)
    q, k, g, beta, v = (t.reshape(-1, H, D) if t.dim() == 4 else t.reshape(-1, H) for t in (x.q, x.k, x.g, x.beta, x.v))
    launch, buf = tool.traffic(x)
    launch["stage1"]()
    chunks = _chunks(x)
    for h in range(H):
        for n, t0, t1 in chunks:
            slot = _slot(buf, n, t0, x)
            rows = slice(0, t1 - t0)
            a1, kt = buf["a1"][h, slot], buf["kt"][h, slot]
            assert torch.equal(a1[:BT][rows], q[t0:t1, h]) and torch.equal(a1[BT:][rows], k[t0:t1, h])
            assert torch.equal(kt[rows], g[t0:t1, h])
            assert torch.equal(a1[:BT][t1 - t0:], torch.zeros_like(a1[:BT][t1 - t0:]))     # padding rows zero
            assert torch.equal(buf["tb"][h, slot][:BT][rows], k[t0:t1, h, :BT])
            assert torch.allclose(buf["gl"][slot, h], g[t0:t1, h].float().sum(0))
    launch["stage2"]()
    expected = torch.empty_like(v, dtype=torch.float32)
    for h in range(H):
        for n, t0, t1 in chunks:
            slot = _slot(buf, n, t0, x)
            blocks = (buf["a1"][h, slot].float().sum(1).view(2, BT).sum(0) + buf["kt"][h, slot].float().sum(1)
                      + buf["aqk"][h, slot].float().sum(1) + buf["tb"][h, slot].float().sum(1).view(2, BT).sum(0)
                      + buf["gl"][slot, h].sum())
            expected[t0:t1, h] = v[t0:t1, h].float() + blocks[:t1 - t0, None]
    got = buf["out"].reshape(-1, H, D).float()
    assert torch.allclose(got, expected.bfloat16().float(), rtol=1e-2, atol=1e-1)
    assert torch.equal(buf["ht"], x.initial_state)
    buf["out"].zero_()
    launch["fused"]()
    s = (q.float() + k.float() + g.float()).sum(-1) + beta.float()
    assert torch.allclose(buf["out"].reshape(-1, H, D).float(), (v.float() + s[..., None]).bfloat16().float(),
                          rtol=1e-2, atol=1e-1)


def _slot(buf, n, t0, x):
    """Chunk slot of sequence n's chunk starting at token t0 (packed: chunk_offsets from the traffic's tables)."""
    if x.cu_seqlens is None:
        T = x.q.shape[1]
        return n * -(-T // BT) + (t0 - n * T) // BT
    bos = int(x.cu_seqlens[n])
    return int(buf["chunk_offsets"][n]) + (t0 - bos) // BT


def test_design_bytes_count_what_each_design_moves():
    tool = _tool()
    nb = tool.design_bytes(T=8192, H=64, HV=64, D=128, N=1, slots=256)
    per_token_head = {key: val / (8192 * 64) for key, val in nb.items()}
    states = 2 * 128 * 128 * 4 / 8192
    assert per_token_head["fused"] == pytest.approx(5 * 256 + 2 + states)              # q k g v out, β, states
    # stage tensors: a1 2·D, kt D, tb 2·BT, aqk BT bf16 per token; gl fp32 D per chunk
    tensors = (3 * 128 + 3 * BT) * 2 + 128 * 4 / BT
    assert per_token_head["stage1"] == pytest.approx(3 * 256 + 2 + tensors)
    assert per_token_head["stage2"] == pytest.approx(tensors + 2 * 256 + states)


def test_profile_stages_counts_the_slots_the_kernels_allocate():
    # profile_stages takes its bytes from design_bytes, with as many chunk slots as fastkda.kernels allocates.
    from fastkda.kernels import _plan_chunks
    profile = benchmark_script("profile_stages")
    for task in (Task("f", 2, (100,), fixed=True, D=64), Task("p", 2, (5, 37, 0, 33), D=64)):
        x = make_inputs(task, "cuda" if HAS_CUDA else "cpu", seed=1)
        st, _ = _plan_chunks(x.q, x.k, x.v, x.g, x.beta, scale=task.scale, A_log=x.A_log, dt_bias=x.dt_bias,
                             lower_bound=task.lower_bound, cu_seqlens=x.cu_seqlens, use_qk_l2norm=True,
                             use_gate=True, use_beta_sigmoid=True)
        assert profile.stage_slots(task) == st.a1.shape[1]
