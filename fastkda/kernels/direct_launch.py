"""Kernel launches with less host time than Triton's ``kernel[grid](*args, **kwargs)``.

    launch(kernel, grid, *args, **kwargs)     the same effect as kernel[grid](*args, **kwargs)

On every call Triton's launch path binds and specializes the arguments, then builds a cache key (a string of
the compile options), checks the kernel's globals, reads its configuration knobs and builds launch metadata
for profiler hooks, before the compiled kernel's launcher runs: tens of microseconds of host time per launch
on the H200's host, and fastkda.fwd makes two to four launches per call (docs/perf-notes.md, session 11).

Here Triton's own binder specializes the arguments (the same function Triton calls, so the same dtypes,
16-byte alignments, integers equal to 1 or divisible by 16, i32 or i64), and the compiled kernel is kept per
(kernel, device, specialization, compile options). The first launch of each goes through Triton, which
compiles or loads the kernel, launches it and returns it; later ones call its launcher directly. A launch
therefore runs the compiled kernel Triton would have run. Triton's path runs instead under the CPU
interpreter, while a launch hook is installed (profilers such as proton rely on it), with Triton versions
other than the one this was measured and tested with (TESTED_TRITON: the binder and the compiled kernel's
launcher are internals), and for good once those internals are not what this module expects.
"""

from __future__ import annotations

import os

import torch
import triton
from triton import knobs

# Triton reads TRITON_INTERPRET when a kernel is defined (at import), and so does this module.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"
TESTED_TRITON = ("3.6.",)
_compiled: dict = {}
# False also once Triton's internals turned out different from what launch() expects
_direct = not INTERPRETING and triton.__version__.startswith(TESTED_TRITON)


def direct_launch_enabled() -> bool:
    """Whether launches take the direct path (the Triton version it was tested with, its internals as expected)."""
    return _direct


def _hooked() -> bool:
    """Whether a launch hook is installed (a chain of hooks in recent Triton, a callable or None before)."""
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, launching the compiled kernel directly after its first launch."""
    global _direct
    if not _direct or _hooked():
        kernel[grid](*args, **kwargs)
        return
    try:
        device = torch.cuda.current_device()
        binder = kernel.device_caches[device][4]
        bound, specialization, options = binder(*args, **kwargs)
        key = (kernel, device, tuple(specialization), tuple(options.items()))
    except Exception:   # noqa: BLE001 -- another Triton's internals: its own launch path from now on
        _direct = False
        kernel[grid](*args, **kwargs)
        return
    compiled = _compiled.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)
        if hasattr(compiled, "result"):     # an asynchronous compile's future
            compiled = compiled.result()
        compiled._init_handles()
        _compiled[key] = compiled
        return
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    compiled.run(grid[0], g1, g2, torch._C._cuda_getCurrentRawStream(device), compiled.function,
                 compiled.packed_metadata, None, None, None, *bound.values())
