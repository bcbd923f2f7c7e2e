"""Test setup: without CUDA, Triton kernels run through Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is first imported, hence here, at collection time.
"""

import importlib.util
import os
import subprocess
import sys

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def benchmark_script(name: str):
    """benchmarks/<name>.py loaded as a module (the scripts are not a package)."""
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    if folder not in sys.path:          # the scripts import each other as a script's own folder allows
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_stamped_fused(load: str):
    """Compile for sm_90a, in a child process without the interpreter, a stamped copy of the fused kernel: `load`
    is Python, run with benchmarks/ importable, that binds `k` to it; compiled in the launcher's packed
    configuration with its extra argument `stamps` (int64 pointer). Returns the finished process."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import sys; sys.path.insert(0, 'benchmarks')\n"
        "import compile_report\n"
        f"{load}\n"
        "for name, kernel, consts, warps, stages, nreg, source, types in compile_report.launcher_configurations(128):\n"
        "    if name.startswith('fused') and 'packed' in name:\n"
        "        c = compile_report.compile_sm90(k, consts, warps, stages, nreg, source=source, "
        "types=dict(stamps='*i64'))\n"
        "        print('ok', len(c.asm['cubin']))\n")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=root)
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=900)
