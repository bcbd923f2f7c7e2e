"""Every kernel configuration the launcher can pick compiles for Hopper (sm_90a), on a machine without a GPU.

The CPU interpreter runs the kernels' arithmetic but not Triton's GPU compiler passes, so a kernel can pass
every CPU test and still fail to compile for the device: the Triton stage 2 with fp32 stage tensors did
(a joined product operand that Triton's shared-layout pass rejects; found on the H200 in session 6). This
runs the real compiler down to the cubin with the launcher's settings (benchmarks/compile_report.py), in a
child process: the test session itself runs Triton in interpreter mode.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_launcher_configuration_compiles_for_sm90(head_dim):
    # "ok" also means ptxas kept the wgmma products asynchronous: near a register cap it may serialise all of
    # them (C7511), a silent 2x on the kernel's products (the Gluon stage 1 at 96 registers, session 8).
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compile_report.py"), "--all-configs",
                          "--head-dim", str(head_dim)], env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in run.stdout.splitlines() if line.startswith(("ok", "FAILED"))]
    # K = V = 128 adds the wide stage 2 (both value blocks in one program) and the fused kernel (two layouts)
    expected = 15 + 3 * (head_dim == 128)
    assert run.returncode == 0 and len(lines) == expected and all(line.startswith("ok") for line in lines), (
        run.stdout + run.stderr[-3000:])


def test_the_report_recognises_every_note_of_serialised_wgmma_products():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import compile_report
    note = ("ptxas info    : ({}) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
            "insufficient register resources for the function '_fused_kernel'")
    log = "\n".join(["ptxas info    : Used 168 registers, used 4 barriers", note.format("C7512"), note.format("C7511")])
    assert compile_report.serialized_codes(log) == ["C7512", "C7511"]
    # another performance note, and a clean log, are not serialisation
    assert compile_report.serialized_codes(
        "ptxas info    : (C7599) Potential Performance Loss: an injected wait\n"
        "ptxas info    : Used 168 registers, 0 bytes spill stores") == []
