"""The floor that memory traffic alone sets on the forward, measured with its real access patterns.

    python benchmarks/byte_floor.py [--tasks a,b] [--json PATH]

Three Triton kernels move exactly the bytes of a design, in its layouts and program order, and compute next
to nothing (each output a cheap function of everything read, so that no load is dead):

- stage 1's traffic: one program per (chunk slot, value head) reads the chunk's q, k, g rows and β and writes
  its blocks of a1 [2·BT, K], kt [BT, K], aqk [BT, BT], tb [2·BT, BT] and gl [K] (fastkda.kernels' tensors);
- stage 2's traffic: one program per (value block, sequence, value head), packed sequences longest first, walks
  its sequence's chunks, reading every stage-1 block and its value block and writing its output block, after
  the initial state block and before the final one;
- one fused kernel's: the same programs reading q, k, g, β and v directly (the forward's floor: inputs once
  per value block, output once, states once).

Set against fastkda's own stage times (each stage on its own, as profile_stages.py) and the whole forward,
in the same run: how much of each design's time is its bytes, on this GPU, with these patterns -- the copy
bandwidth of `dst.copy_(src)` is the optimistic reference. A diagnosis, not a record: records come from
`python -m fastkda.bench`.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

import fastkda
from fastkda import kernels
from fastkda.bench.tasks import default_tasks, make_inputs, select_tasks
from fastkda.bench.timing import copy_bandwidth, time_cuda
from fastkda.kernels import CHUNK_SIZE, chunk_tables, prepare_chunks, run_recurrence
from fastkda.kernels.chunk_prepare import _chunk_span
from fastkda.kernels.chunk_recurrence import _sequence_span


@triton.jit
def _stage1_traffic(q, k, g, beta, a1, tb, aqk, kt, gl, chunk_rows, T, NC, H, HV,
                    K: tl.constexpr, BT: tl.constexpr, HV_PER_H: tl.constexpr, IS_VARLEN: tl.constexpr):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // HV_PER_H
    t0, eos = _chunk_span(i_c, chunk_rows, T, BT, IS_VARLEN)
    r = tl.arange(0, BT)
    ck = tl.arange(0, K)
    cb = tl.arange(0, BT)
    tok = t0 + r
    m = (tok < eos)[:, None]
    b_q = tl.load(q + (tok * H + i_h)[:, None] * K + ck[None, :], mask=m, other=0.0)
    b_k = tl.load(k + (tok * H + i_h)[:, None] * K + ck[None, :], mask=m, other=0.0)
    b_g = tl.load(g + (tok * HV + i_hv)[:, None] * K + ck[None, :], mask=m, other=0.0)
    b_b = tl.load(beta + tok * HV + i_hv, mask=tok < eos, other=0.0)
    # The first BT columns again (cached: no new device-memory bytes) for the [BT, BT] blocks.
    b_qs = (tl.load(q + (tok * H + i_h)[:, None] * K + cb[None, :], mask=m, other=0.0).to(tl.float32)
            + b_b.to(tl.float32)[:, None]).to(q.dtype.element_ty)
    b_ks = tl.load(k + (tok * H + i_h)[:, None] * K + cb[None, :], mask=m, other=0.0)
    blk = (i_hv * NC + i_c).to(tl.int64)
    tile_k = r[:, None] * K + ck[None, :]
    tile_t = r[:, None] * BT + cb[None, :]
    tl.store(a1 + blk * (2 * BT * K) + tile_k, b_q)
    tl.store(a1 + blk * (2 * BT * K) + BT * K + tile_k, b_k)
    tl.store(kt + blk * (BT * K) + tile_k, b_g)
    tl.store(aqk + blk * (BT * BT) + tile_t, b_qs)
    tl.store(tb + blk * (2 * BT * BT) + tile_t, b_ks)
    tl.store(tb + blk * (2 * BT * BT) + BT * BT + tile_t, b_qs)
    tl.store(gl + (i_c * HV + i_hv) * K + ck, tl.sum(b_g.to(tl.float32), 0))


@triton.jit
def _stage2_traffic(a1, tb, aqk, kt, gl, v, h0, ht, o, cu_seqlens, chunk_offsets, seq_order, T, NC, HV,
                    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_hv = i_nh % HV
    n, bos, eos, c_first = _sequence_span(i_nh, HV, seq_order, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    r = tl.arange(0, BT)
    ck = tl.arange(0, K)
    cb = tl.arange(0, BT)
    cv = i_v * BV + tl.arange(0, BV)
    o_state = (n * HV + i_hv) * K * V + cv[:, None] * K + ck[None, :]
    b_s = tl.load(h0 + o_state)
    tile_k = r[:, None] * K + ck[None, :]
    tile_t = r[:, None] * BT + cb[None, :]
    for c in tl.range(0, tl.cdiv(eos - bos, BT), num_stages=3):
        blk = (i_hv * NC + c_first + c).to(tl.int64)
        x = (tl.load(a1 + blk * (2 * BT * K) + tile_k).to(tl.float32)
             + tl.load(a1 + blk * (2 * BT * K) + BT * K + tile_k).to(tl.float32)
             + tl.load(kt + blk * (BT * K) + tile_k).to(tl.float32))
        y = (tl.load(aqk + blk * (BT * BT) + tile_t).to(tl.float32)
             + tl.load(tb + blk * (2 * BT * BT) + tile_t).to(tl.float32)
             + tl.load(tb + blk * (2 * BT * BT) + BT * BT + tile_t).to(tl.float32))
        s = tl.sum(x, 1) + tl.sum(y, 1) + tl.sum(tl.load(gl + ((c_first + c) * HV + i_hv) * K + ck), 0)
        rows = bos + c * BT + r
        mv = (rows < eos)[:, None]
        b_v = tl.load(v + (rows * HV + i_hv)[:, None] * V + cv[None, :], mask=mv, other=0.0).to(tl.float32)
        tl.store(o + (rows * HV + i_hv)[:, None] * V + cv[None, :], (b_v + s[:, None]).to(o.dtype.element_ty),
                 mask=mv)
    tl.store(ht + o_state, b_s)


@triton.jit
def _fused_traffic(q, k, g, beta, v, h0, ht, o, cu_seqlens, chunk_offsets, seq_order, T, H, HV,
                   K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, HV_PER_H: tl.constexpr,
                   IS_VARLEN: tl.constexpr):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_hv = i_nh % HV
    i_h = i_hv // HV_PER_H
    n, bos, eos, c_first = _sequence_span(i_nh, HV, seq_order, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    r = tl.arange(0, BT)
    ck = tl.arange(0, K)
    cv = i_v * BV + tl.arange(0, BV)
    o_state = (n * HV + i_hv) * K * V + cv[:, None] * K + ck[None, :]
    b_s = tl.load(h0 + o_state)
    for c in tl.range(0, tl.cdiv(eos - bos, BT), num_stages=3):
        rows = bos + c * BT + r
        m = (rows < eos)[:, None]
        x = (tl.load(q + (rows * H + i_h)[:, None] * K + ck[None, :], mask=m, other=0.0).to(tl.float32)
             + tl.load(k + (rows * H + i_h)[:, None] * K + ck[None, :], mask=m, other=0.0).to(tl.float32)
             + tl.load(g + (rows * HV + i_hv)[:, None] * K + ck[None, :], mask=m, other=0.0).to(tl.float32))
        s = tl.sum(x, 1) + tl.load(beta + rows * HV + i_hv, mask=rows < eos, other=0.0).to(tl.float32)
        b_v = tl.load(v + (rows * HV + i_hv)[:, None] * V + cv[None, :], mask=m, other=0.0).to(tl.float32)
        tl.store(o + (rows * HV + i_hv)[:, None] * V + cv[None, :], (b_v + s[:, None]).to(o.dtype.element_ty), mask=m)
    tl.store(ht + o_state, b_s)


def design_bytes(T: int, H: int, HV: int, D: int, N: int, slots: int) -> dict:
    """Device-memory bytes each design must move (bf16 inputs and stage tensors, fp32 states and gl), the
    stage tensors counted over all ``slots`` chunk slots (packed calls: one per sequence more than chunks)."""
    bf, f32, BT = 2, 4, CHUNK_SIZE
    qkg = T * (2 * H + HV) * D * bf + T * HV * bf                       # q, k, g, β
    values = out = T * HV * D * bf
    stage_tensors = HV * slots * (3 * BT * D + 3 * BT * BT) * bf + slots * HV * D * f32
    states = 2 * N * HV * D * D * f32
    return {"stage1": qkg + stage_tensors, "stage2": stage_tensors + values + out + states,
            "fused": qkg + values + out + states}


def traffic(x):
    """The three traffic kernels on inputs ``x`` (fastkda.bench.tasks.TaskInputs): ({"stage1", "stage2",
    "fused": a launcher each}, the buffers they write), each output a cheap function of what its kernel reads."""
    B, T, H, D = x.q.shape
    HV = x.v.shape[2]
    BT, BV = CHUNK_SIZE, min(kernels.VALUE_BLOCK, D)
    varlen = x.cu_seqlens is not None
    N = x.cu_seqlens.numel() - 1 if varlen else B
    if varlen:
        slots, chunk_offsets, chunk_rows, seq_order = chunk_tables(x.cu_seqlens, B * T)
    else:
        slots, chunk_offsets, chunk_rows, seq_order = B * triton.cdiv(T, BT), None, None, None
    dev = x.q.device
    buf = dict(a1=torch.empty(HV, slots, 2 * BT, D, dtype=torch.bfloat16, device=dev),
               tb=torch.empty(HV, slots, 2 * BT, BT, dtype=torch.bfloat16, device=dev),
               aqk=torch.empty(HV, slots, BT, BT, dtype=torch.bfloat16, device=dev),
               kt=torch.empty(HV, slots, BT, D, dtype=torch.bfloat16, device=dev),
               gl=torch.empty(slots, HV, D, dtype=torch.float32, device=dev),
               out=torch.empty_like(x.v), ht=torch.empty_like(x.initial_state),
               chunk_offsets=chunk_offsets, N=N, slots=slots)
    common = dict(K=D, BT=BT, IS_VARLEN=varlen, num_warps=4)
    grid2 = (D // BV, N * HV)
    a1, tb, aqk, kt, gl, out, ht = (buf[n] for n in ("a1", "tb", "aqk", "kt", "gl", "out", "ht"))

    def stage1():
        _stage1_traffic[(slots, HV)](x.q, x.k, x.g, x.beta, a1, tb, aqk, kt, gl, chunk_rows, T, slots, H, HV,
                                      HV_PER_H=HV // H, **common)

    def stage2():
        _stage2_traffic[grid2](a1, tb, aqk, kt, gl, x.v, x.initial_state, ht, out, x.cu_seqlens, chunk_offsets,
                               seq_order, T, slots, HV, V=D, BV=BV, **common)

    def fused():
        _fused_traffic[grid2](x.q, x.k, x.g, x.beta, x.v, x.initial_state, ht, out, x.cu_seqlens, chunk_offsets,
                              seq_order, T, H, HV, V=D, BV=BV, HV_PER_H=HV // H, **common)

    return dict(stage1=stage1, stage2=stage2, fused=fused), buf


def measure(task, x, repeats: int = 100) -> dict:
    """Milliseconds of the three traffic kernels and of fastkda's stages and forward, on one task's inputs."""
    launch, buf = traffic(x)
    B, T, H, D = x.q.shape
    kw = dict(scale=task.scale, A_log=x.A_log, dt_bias=x.dt_bias, lower_bound=task.lower_bound,
              cu_seqlens=x.cu_seqlens, use_qk_l2norm=True, use_gate=True, use_beta_sigmoid=True)
    st = prepare_chunks(x.q, x.k, x.v, x.g, x.beta, **kw)
    out, fs = buf["out"], buf["ht"]

    def fastkda_stage2():
        run_recurrence(st, x.v, out=out, initial_state=x.initial_state, final_state=fs, cu_seqlens=x.cu_seqlens,
                       state_v_first=True)

    def forward():
        fastkda.fwd(x.q, x.k, x.v, x.g, x.beta, task.scale, out, x.A_log, x.dt_bias, task.lower_bound,
                    x.initial_state, fs, x.cu_seqlens)

    timed = {"stage1_traffic": launch["stage1"], "stage2_traffic": launch["stage2"], "fused_traffic": launch["fused"],
             "fastkda_stage1": lambda: prepare_chunks(x.q, x.k, x.v, x.g, x.beta, **kw),
             "fastkda_stage2": fastkda_stage2, "fastkda_forward": forward}
    ms = {name: time_cuda(fn, warmup=10, repeats=repeats).median_ms for name, fn in timed.items()}
    return dict(task=task.name, bytes=design_bytes(B * T, H, x.v.shape[2], D, buf["N"], buf["slots"]), ms=ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=None, help="comma-separated task names (default: the six standard tasks)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    tasks = select_tasks(args.tasks.split(",")) if args.tasks else default_tasks()
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev).TBps
    rows = []
    print(f"device {torch.cuda.get_device_name(dev)}, copy bandwidth {bw:.3f} TB/s")
    # ms: the traffic of stage 1, of stage 2, both; fastkda's forward and the traffic's share of it; the fused
    # design's traffic, and its bytes at the copy bandwidth.
    print(f"{'task':<20} {'stage 1':>8} {'stage 2':>8} {'both':>8} {'fastkda':>8} {'share':>6} "
          f"{'fused':>8} {'at copy':>8}")
    for i, task in enumerate(tasks):
        row = measure(task, make_inputs(task, dev, seed=i))
        ms, nb = row["ms"], row["bytes"]
        two = ms["stage1_traffic"] + ms["stage2_traffic"]
        row.update(copy_TBps=bw, two_stage_traffic_ms=two, fastkda_share_of_two_stage_floor=two / ms["fastkda_forward"])
        rows.append(row)
        print(f"{task.name:<20} {ms['stage1_traffic']:>8.3f} {ms['stage2_traffic']:>8.3f} {two:>8.3f} "
              f"{ms['fastkda_forward']:>8.3f} {two / ms['fastkda_forward']:>6.0%} {ms['fused_traffic']:>8.3f} "
              f"{nb['fused'] / bw / 1e9:>8.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__,
                           triton=triton.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
