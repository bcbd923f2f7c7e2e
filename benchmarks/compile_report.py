"""Registers, spills and shared memory of fastkda's kernels for Hopper, compiled on a machine without a GPU.

    python benchmarks/compile_report.py [--warps N] [--chunk 32] [--head-dim 128] [--by-line N]
    python benchmarks/compile_report.py --all-configs      # every configuration the launcher picks compiles

Triton compiles the kernels for sm_90a without a device, with the launcher's settings (warps, register cap,
pipeline depth) and the divisibility the JIT would see on the benchmark shapes; ptxas (from a CUDA toolkit
on PATH, or Triton's own) then reports what the hardware would run. Registers decide how many programs share
an SM (stage 1 at 168: three), so this is the cheapest first check of a kernel change -- no device time.
The local Triton may be newer than the device's (3.6): counts differ by a few registers. When the CUDA
toolkit's ptxas is older than the PTX Triton emits, the PTX version line is lowered to the toolkit's (the
instructions Triton uses for sm_90a are older than both).
"""

from __future__ import annotations

import argparse
from collections import Counter
import os
import re
import shutil
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as triton_compile

from fastkda import kernels
from ncu_lines import parse_sass      # benchmarks/ is the script's own folder, hence on sys.path
from fastkda.kernels.chunk_prepare import _chunk_prepare_kernel, _chunk_tables_kernel
from fastkda.kernels.chunk_recurrence import _chunk_recurrence_kernel

RUNTIME_TYPES = {
    "q": "*bf16", "k": "*bf16", "v": "*bf16", "g": "*bf16", "beta": "*bf16", "A_log": "*fp32",
    "dt_bias": "*fp32", "a1": "*bf16", "tb": "*bf16", "aqk": "*bf16", "kt": "*bf16",
    "gl": "*fp32", "gl_ptr": "*fp32", "h0": "*fp32", "ht": "*fp32", "o": "*bf16",
    "cu_seqlens": "*i32", "chunk_offsets": "*i32", "seq_order": "*i32", "chunk_rows": "*i32",
    "T": "i32", "NC": "i32", "N": "i32", "H": "i32", "HV": "i32", "search_steps": "i32",
    "s_state_k": "i32", "s_state_v": "i32", "scale": "fp32", "lower_bound": "fp32",
    "state_buf": "*fp32", "flags": "*i32", "slot_lo": "i32", "slot_hi": "i32", "window_idx": "i32",
}


def _ptxas():
    for candidate in (shutil.which("ptxas"), "/usr/local/cuda/bin/ptxas",
                      os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")):
        if candidate and os.path.exists(candidate):
            return candidate
    raise SystemExit("no ptxas found: install a CUDA toolkit or put ptxas on PATH")


def _ptxas_version_limit(ptxas: str) -> str:
    out = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    major, minor = re.search(r"release (\d+)\.(\d+)", out).groups()
    # PTX ISA 8.x ships with CUDA 12.x, 9.0 with CUDA 13.0: ISA major = CUDA major - 4, minor as released.
    return f"{int(major) - 4}.{minor}"


# Arguments Triton's JIT would find divisible by 16 in the benchmark tasks (pointers; 8192 tokens, 64/96 heads).
NOT_DIVISIBLE = ("N", "scale", "lower_bound", "s_state_v")


def compile_sm90(kernel, constexprs: dict, num_warps: int, num_stages: int, maxnreg=None, source=ASTSource,
                 types=None):
    """The kernel compiled for sm_90a (cubin included); ``types`` overrides RUNTIME_TYPES per argument."""
    names = kernel.arg_names
    # Arguments left at their defaults: constexprs and None as compile-time values, others by RUNTIME_TYPES.
    constexprs = dict({p.name: p.default for p in kernel.params if p.has_default and p.name not in constexprs
                       and (p.is_constexpr or (p.default is None and p.name not in (types or {})))}, **constexprs)
    types = dict(RUNTIME_TYPES, **(types or {}))
    signature = {n: (types[n] if n not in constexprs else "constexpr") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n not in constexprs and n not in NOT_DIVISIBLE}
    src = source(fn=kernel, signature=signature, attrs=attrs,
                 constexprs={(names.index(n),): v for n, v in constexprs.items()})
    options = dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return triton_compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def report(compiled) -> str:
    """ptxas's resource line for the kernel's PTX (the toolkit's ptxas, as a second opinion on Triton's)."""
    ptxas = _ptxas()
    ptx = re.sub(r"^\.version \d+\.\d+", f".version {_ptxas_version_limit(ptxas)}", compiled.asm["ptx"],
                 count=1, flags=re.M)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        run = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", path, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True)
    if run.returncode != 0:
        return f"ptxas failed: {run.stderr.strip()[-400:]}"
    lines = [ln.strip() for ln in run.stderr.splitlines() if "registers" in ln or "spill" in ln]
    codes = serialized_codes(run.stderr)
    if codes:
        lines.append(f"wgmma SERIALIZED ({', '.join(codes)})")
    return f"shared {compiled.metadata.shared} B; " + "; ".join(lines)


# ptxas's notes that it serialised every wgmma of a kernel (each product then waits for the one before): a
# cliff, not a slope -- the Gluon stage 1 near its register cap fell off it in session 8 (C7511), variants of the
# fused chain in sessions 23 and 27 (C7512, "insufficient register resources" too, another code).
_SERIALIZED = re.compile(r"\((C75\d\d)\)[^\n]*wgmma\S* instructions are serialized")


def serialized_codes(ptxas_log: str) -> list:
    """The codes of ptxas's notes that it serialised a kernel's wgmma products, in order of appearance."""
    return _SERIALIZED.findall(ptxas_log)


# Bytes per thread moved by one shared- or local-memory instruction, by its width suffix.
_WIDTH = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "32": 4, "64": 8, "128": 16}
_MATRIX = {"LDSM", "STSM"}       # ldmatrix / stmatrix: 4 bytes per thread per 8x8 matrix (.x1, .x2, .x4)


def disassemble(compiled, line_info: bool = False) -> str:
    """The compiled kernel's SASS (`nvdisasm -c`, Triton's own nvdisasm; `-g`: with its source lines)."""
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        return subprocess.run([nvdisasm] + (["-g"] if line_info else []) + ["-c", path], capture_output=True,
                              text=True).stdout


def by_line(compiled, top: int) -> str:
    """SASS instructions, shared/local-memory bytes per warp and barriers, per kernel source line.

    Static counts (a loop body counts once) of straight-line code are a proxy for where the time goes, not a
    measurement: the v11 variant of docs/perf-notes.md cut stage 1's count by 10% and ran 5% slower."""
    sass = disassemble(compiled, line_info=True)
    count, smem, bars, opcodes = Counter(), Counter(), Counter(), {}
    for where, opcode in parse_sass(sass).values():
        op = opcode.split(".")
        count[where] += 1
        opcodes.setdefault(where, Counter())[op[0]] += 1
        if op[0] == "BAR":
            bars[where] += 1
        if op[0] in _MATRIX:
            smem[where] += 32 * 4 * {"4": 4, "2": 2}.get(op[-1], 1)
        elif op[0] in ("LDS", "STS", "LDL", "STL"):
            smem[where] += 32 * next((_WIDTH[p] for p in op[1:] if p in _WIDTH), 4)
    total_i, total_s = sum(count.values()), sum(smem.values())
    name = lambda key: "?" if key is None else f"{key[0]}:{key[1]}"           # noqa: E731
    rows = [f"  {total_i} instructions, {total_s} shared/local bytes per warp; top lines by shared bytes:"]
    for key, b in smem.most_common(top):
        rows.append(f"  {b:7d} B ({100 * b / max(total_s, 1):4.1f}%) {count[key]:5d} instr {bars[key]:3d} bar  "
                    f"{name(key)}")
    # An issue-bound kernel (the Gluon stage 1 since session 7) spends its time where its instructions are.
    rows.append("  top lines by instructions:")
    for key, n in count.most_common(top):
        mix = ", ".join(f"{op} {k}" for op, k in opcodes[key].most_common(3))
        rows.append(f"  {n:7d} ({100 * n / max(total_i, 1):4.1f}%) {smem[key]:7d} B {bars[key]:3d} bar  {name(key)}"
                    f"  [{mix}]")
    return "\n".join(rows)


def launcher_configurations(D: int = 64):
    """(name, kernel, constexprs, warps, stages, maxnreg, source, types) of every kernel configuration the
    launcher (fastkda.kernels) can pick: stage 0's tables kernel (packed sequences), with its ordering part or
    without; the Triton stage 1 with bf16 or fp32 stage tensors; the Triton
    stage 2 with bf16 stage tensors and bf16 or fp16 values, or fp32 throughout; the Gluon stage 2 and the
    Gluon stage 1, packed and fixed-length (Hopper, bf16); the fused kernel (K = V = 128), packed and
    fixed-length."""
    from triton.experimental.gluon._runtime import GluonASTSource
    from fastkda.kernels.chunk_prepare_gluon import _chunk_prepare_gluon_kernel
    from fastkda.kernels.chunk_recurrence_gluon import _chunk_recurrence_gluon_kernel

    BT = kernels.CHUNK_SIZE
    tensors = ("a1", "tb", "aqk", "kt")
    # Stage 0 (packed sequences), as chunk_tables launches it: its order part is compiled in or not.
    for order in (True, False):
        yield (f"stage 0, chunk tables{'' if order else ', order sorted outside'}", _chunk_tables_kernel,
               dict(BT=BT, BLOCK=1024, ORDER=order, NBLOCK=max(kernels.ORDER_IN_KERNEL, 16), JBLOCK=16, RBLOCK=1024),
               4, 1, None, ASTSource, dict(n_slots="i32"))
    for dt, mm in (("bf16", tl.bfloat16), ("fp32", tl.float32)):
        consts = dict(K=D, BT=BT, LOG2_BT=BT.bit_length() - 1, IS_VARLEN=True, USE_L2NORM=True, USE_GATE=True,
                      USE_BETA_SIGMOID=True, HAS_A_LOG=True, HAS_DT_BIAS=True, DOT_PRECISION="tf32",
                      MM_DTYPE=mm, INTERPRET=False)
        types = {n: f"*{dt}" for n in ("q", "k", "g", "beta") + tensors}
        yield (f"stage 1, {dt}", _chunk_prepare_kernel, consts, kernels.STAGE1_WARPS, 1, kernels.STAGE1_MAXNREG,
               ASTSource, types)
    for dt, vdt in (("bf16", "bf16"), ("bf16", "fp16"), ("fp32", "fp32")):
        consts = dict(K=D, V=D, BV=kernels.VALUE_BLOCK, BT=BT, IS_VARLEN=False, HAS_H0=True, STORE_HT=True,
                      INTERPRET=False)
        types = dict({n: f"*{dt}" for n in tensors}, v=f"*{vdt}", o=f"*{vdt}")
        stages = kernels.STAGE2_STAGES if dt == "bf16" else 1
        yield (f"stage 2 (Triton), {dt} stage tensors, {vdt} values", _chunk_recurrence_kernel, consts,
               kernels.STAGE2_WARPS, stages, None, ASTSource, types)
    consts = dict(K=D, V=D, BV=kernels.VALUE_BLOCK, BT=BT, IS_VARLEN=True, HAS_H0=True, STORE_HT=True,
                  LOADER_REGS=kernels.STAGE2_LOADER_REGS)
    for ring in (3, 6):       # the rings stage2_ring picks: two programs per SM, or one
        yield (f"stage 2 (Gluon), bf16, {ring}-slot ring", _chunk_recurrence_gluon_kernel, dict(consts, RING=ring),
               kernels.STAGE2_WARPS, 1, kernels._stage2_maxnreg(ring, False), GluonASTSource, None)
    if D == 2 * kernels.VALUE_BLOCK:
        yield ("stage 2 (Gluon), bf16, both value blocks in one program (stage2_wide)", _chunk_recurrence_gluon_kernel,
               dict(consts, BV=D, RING=3), 2 * kernels.STAGE2_WARPS, 1, kernels._stage2_maxnreg(3, True),
               GluonASTSource, None)
    yield ("stage 2 (Gluon), bf16, windows of chunks", _chunk_recurrence_gluon_kernel,
           dict(consts, IS_VARLEN=False, WINDOWED=True, RING=6), kernels.STAGE2_WARPS, 1,
           kernels._stage2_maxnreg(6, False), GluonASTSource, dict(state_buf="*fp32", flags="*i32"))
    for varlen in (True, False):
        yield (f"stage 1 (Gluon), bf16, {'packed' if varlen else 'fixed-length'}", _chunk_prepare_gluon_kernel,
               _gluon_stage1_constexprs(D, varlen), 4, 1, kernels.STAGE1_GLUON_MAXNREG, GluonASTSource,
               gluon_stage1_types(D))
    yield ("stage 1 (Gluon), bf16, fixed-length, windows of chunks", _chunk_prepare_gluon_kernel,
           dict(_gluon_stage1_constexprs(D, False), WINDOWED=True), 4, 1, kernels.STAGE1_GLUON_MAXNREG,
           GluonASTSource, gluon_stage1_types(D))
    # Without the gate, the key norm or the β sigmoid, the Gluon stage 1 takes its bf16 paths (G − r in
    # three bf16 pieces without the gate, the doubling in bf16 halves): other kernel bodies.
    yield ("stage 1 (Gluon), bf16, g the log-decay, beta as given", _chunk_prepare_gluon_kernel,
           _gluon_stage1_constexprs(D, True, flags=False), 4, 1, kernels.STAGE1_GLUON_MAXNREG, GluonASTSource,
           gluon_stage1_types(D))
    yield ("stage 1 (Gluon), bf16, keys as given", _chunk_prepare_gluon_kernel,
           _gluon_stage1_constexprs(D, True, l2norm=False), 4, 1, kernels.STAGE1_GLUON_MAXNREG, GluonASTSource,
           gluon_stage1_types(D))
    if D == 128:
        from fastkda.kernels.fused_gluon import _fused_kernel
        for varlen in (True, False):
            yield (f"fused (Gluon), bf16, {'packed' if varlen else 'fixed-length'}", _fused_kernel,
                   dict(S_STATE_K=1, S_STATE_V=D, HV_PER_H=1, K=D, V=D, BT=BT, LOG2_BT=BT.bit_length() - 1,
                        IS_VARLEN=varlen, HAS_H0=True,
                        STORE_HT=True, PRODUCER_REGS=kernels.FUSED_PRODUCER_REGS), 4, 1, kernels.FUSED_MAXNREG,
                   GluonASTSource, None)


def _gluon_stage1_constexprs(D: int, varlen: bool, flags: bool = True, l2norm: bool = True) -> dict:
    BT = kernels.CHUNK_SIZE
    return dict(K=D, BT=BT, LOG2_BT=BT.bit_length() - 1, IS_VARLEN=varlen, USE_L2NORM=l2norm, USE_GATE=flags,
                USE_BETA_SIGMOID=flags, HAS_A_LOG=flags, HAS_DT_BIAS=flags, HV_PER_H=1)


def gluon_stage1_types(D: int) -> dict:
    """Argument types of the Gluon stage 1's TMA descriptors (kernels._stage1_descriptors): bf16 blocks of BT
    rows, 128-byte swizzle for a1 and kt ([BT, 64]), 64-byte for aqk ([BT, BT])."""
    BT = kernels.CHUNK_SIZE

    def desc(cols, swizzle):
        return f"tensordesc<bf16[{BT},{cols}],{kernels._nvmma_layout(swizzle)!r}>"
    return dict(a1_desc=desc(64, 128), kt_desc=desc(64, 128), aqk_desc=desc(BT, 64))


def check_all(D: int) -> int:
    """Compile every launcher configuration; one line each; the number that failed."""
    failed = 0
    for name, kernel, consts, warps, stages, nreg, source, types in launcher_configurations(D):
        try:
            compiled = compile_sm90(kernel, consts, warps, stages, nreg, source=source, types=types)
            if "SERIALIZED" in report(compiled):
                failed += 1
                print(f"FAILED  {name}: ptxas serialises its wgmma products (too few registers)")
                continue
            print(f"ok      {name}: {len(compiled.asm['cubin'])} bytes of cubin")
        except Exception as exc:                       # report every configuration, not just the first failure
            failed += 1
            print(f"FAILED  {name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warps", type=int, default=None, help="both stages (default: the launcher's rule)")
    ap.add_argument("--chunk", type=int, default=32, help="BT of the Triton kernels (the Gluon ones: the launcher's)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--by-line", type=int, default=0, metavar="N",
                    help="also list the N source lines that move the most shared-memory bytes, and the N with "
                         "the most instructions")
    ap.add_argument("--all-configs", action="store_true",
                    help="only compile every configuration the launcher can pick; exit status 1 if one fails")
    args = ap.parse_args()
    if args.all_configs:
        raise SystemExit(1 if check_all(args.head_dim) else 0)
    D, BT = args.head_dim, args.chunk
    common = dict(K=D, BT=BT, IS_VARLEN=True)
    stage1 = dict(common, LOG2_BT=BT.bit_length() - 1, USE_L2NORM=True, USE_GATE=True, USE_BETA_SIGMOID=True,
                  HAS_A_LOG=True, HAS_DT_BIAS=True, DOT_PRECISION="tf32", MM_DTYPE=tl.bfloat16, INTERPRET=False)
    stage2 = dict(common, V=D, BV=64, HAS_H0=True, STORE_HT=True, INTERPRET=False)
    w1 = args.warps or kernels.STAGE1_WARPS
    w2 = args.warps or kernels.STAGE2_WARPS
    for title, kernel, consts, warps, stages, nreg in (
            (f"stage 1 (BT={BT}, D={D}, {w1} warps, maxnreg {kernels.STAGE1_MAXNREG})", _chunk_prepare_kernel,
             stage1, w1, 1, kernels.STAGE1_MAXNREG),
            (f"stage 2 (BT={BT}, D={D}, {w2} warps, {kernels.STAGE2_STAGES} stages)", _chunk_recurrence_kernel,
             stage2, w2, kernels.STAGE2_STAGES, None)):
        compiled = compile_sm90(kernel, consts, warps, stages, nreg)
        print(f"{title}: {report(compiled)}")
        if args.by_line:
            print(by_line(compiled, args.by_line))
    # The Gluon kernels (what runs on Hopper with bf16 inputs), as the launcher configures them (its BT).
    for name, kernel, consts, warps, stages, nreg, source, types in launcher_configurations(D):
        if name in ("stage 2 (Gluon), bf16, 3-slot ring", "stage 2 (Gluon), bf16, 6-slot ring",
                    "stage 1 (Gluon), bf16, packed"):
            compiled = compile_sm90(kernel, consts, warps, stages, nreg, source=source, types=types)
            print(f"{name} (BT={kernels.CHUNK_SIZE}, D={D}, {warps} warps): {report(compiled)}")
            if args.by_line:
                print(by_line(compiled, args.by_line))


if __name__ == "__main__":
    main()
