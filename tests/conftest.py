"""Test setup: without CUDA, Triton kernels run through Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is first imported, hence here, at collection time.
"""

import importlib.util
import os
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
