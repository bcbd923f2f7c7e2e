"""Implementations under test, each wrapped with FlashKDA's ``fwd`` signature.

    fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
        initial_state=None, final_state=None, cu_seqlens=None)        # writes out (and final_state)

* ``fastkda``   -- :func:`fastkda.fwd`; always present.
* ``flash_kda`` -- ``flash_kda.fwd`` (MoonshotAI/FlashKDA), when importable.
* ``fla``       -- ``fla.ops.kda.chunk_kda``, when importable; imported with ``FLA_FLASH_KDA=0`` so that fla's own
  kernels are measured rather than its FlashKDA backend, and called under ``torch.inference_mode()`` with
  ``safe_gate=True``, every ``*_in_kernel`` flag True, ``state_v_first=True``, ``output_final_state=True``
  and int64 ``cu_seqlens`` (the peers' protocol).
* ``module:function`` -- any other callable with the ``fwd`` signature.

Every :class:`Impl` carries ``fwd`` (what validation calls) and ``bind`` (what timing calls). For a
``fwd``-signature implementation ``bind`` allocates ``out`` and ``final_state`` once, outside the timed
region, as FlashKDA's API takes them. For fla, the timed call is fla's own ``chunk_kda`` call, whose output
allocation is part of fla's cost; its ``fwd`` wrapper copies fla's results into ``out``/``final_state``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Callable, ContextManager, List, Optional, Sequence

import torch

from ..validation.suite import fla_fwd, resolve_impl
from .tasks import TaskInputs

FwdFn = Callable[..., None]


@dataclass
class Impl:
    """One implementation. ``available`` is False (with ``reason``) when it could not be imported."""

    name: str
    fwd: Optional[FwdFn] = None
    available: bool = True
    reason: str = ""
    version: str = ""
    source: str = ""
    bind: Optional[Callable[[TaskInputs], Callable[[], object]]] = None
    context: Callable[[], ContextManager] = contextlib.nullcontext

    def timed_call(self, inputs: TaskInputs) -> Callable[[], object]:
        """A zero-argument callable running one forward pass on ``inputs`` (buffers allocated here, once)."""
        if not self.available:
            raise RuntimeError(f"{self.name} is not available: {self.reason}")
        if self.bind is not None:
            return self.bind(inputs)
        return bind_fwd(self.fwd, inputs)

    def info(self) -> dict:
        return {"name": self.name, "available": self.available, "reason": self.reason,
                "version": self.version, "source": self.source}


def bind_fwd(fwd: FwdFn, inputs: TaskInputs) -> Callable[[], object]:
    """Allocate ``out`` and ``final_state`` for ``inputs`` and return a call of ``fwd`` that writes them."""
    x = inputs
    out = torch.empty_like(x.v)
    final_state = torch.empty_like(x.initial_state)

    def call():
        fwd(x.q, x.k, x.v, x.g, x.beta, x.scale, out, x.A_log, x.dt_bias, x.lower_bound,
            x.initial_state, final_state, x.cu_seqlens)

    call.out = out                      # kept reachable for callers that want to look at the results
    call.final_state = final_state
    return call


def _version(module, *dists: str) -> str:
    v = getattr(module, "__version__", None)
    if v:
        return str(v)
    from importlib import metadata
    for d in dists:
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def _not_installed(name: str, hint: str, err: BaseException) -> Impl:
    return Impl(name=name, available=False, reason=f"not installed ({hint}): {type(err).__name__}: {err}")


def fastkda_impl() -> Impl:
    import fastkda
    return Impl(name="fastkda", fwd=fastkda.fwd, version=fastkda.__version__, source="fastkda.fwd")


def flash_kda_impl() -> Impl:
    try:
        mod = importlib.import_module("flash_kda")
        fwd = mod.fwd
    except Exception as e:  # ImportError, or a broken build raising something else
        return _not_installed("flash_kda", "build MoonshotAI/FlashKDA to compare against it", e)
    return Impl(name="flash_kda", fwd=fwd, version=_version(mod, "flash-kda", "flash_kda"),
                source="flash_kda.fwd")


def _import_fla_chunk_kda():
    """``fla.ops.kda.chunk_kda`` imported with ``FLA_FLASH_KDA=0`` (so fla does not hand off to FlashKDA)."""
    if os.environ.get("FLA_FLASH_KDA") != "0" and any(m == "fla" or m.startswith("fla.") for m in sys.modules):
        print("warning: fla was imported before the benchmark set FLA_FLASH_KDA=0; "
              "its FlashKDA backend may still be used", file=sys.stderr)
    os.environ["FLA_FLASH_KDA"] = "0"
    from fla.ops.kda import chunk_kda
    return chunk_kda


def fla_impl() -> Impl:
    try:
        chunk_kda = _import_fla_chunk_kda()
        import fla
    except Exception as e:
        return _not_installed("fla", "pip install fastkda[fla]", e)

    def fla_call(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, output_final_state,
                 cu_seqlens_long):
        return chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                         output_final_state=output_final_state, use_qk_l2norm_in_kernel=True,
                         use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
                         lower_bound=lower_bound, state_v_first=True, cu_seqlens=cu_seqlens_long,
                         A_log=A_log, dt_bias=dt_bias)

    def bind(x: TaskInputs):
        def call():
            return fla_call(x.q, x.k, x.v, x.g, x.beta, x.scale, x.A_log, x.dt_bias, x.lower_bound,
                            x.initial_state, True, x.cu_seqlens_long)
        return call

    # validation goes through the suite's fwd-signature wrapper; timing calls chunk_kda itself (bind)
    return Impl(name="fla", fwd=fla_fwd, bind=bind, context=torch.inference_mode,
                version=_version(fla, "fla-core", "flash-linear-attention"),
                source="fla.ops.kda.chunk_kda (FLA_FLASH_KDA=0, inference_mode)")


def custom_impl(spec: str) -> Impl:
    """``module:function`` -> an :class:`Impl` named ``spec``; raises ``ValueError`` if it cannot be loaded."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--impl {spec!r}: expected module:function, e.g. mypkg.kda:fwd")
    fn = resolve_impl(spec)
    root = sys.modules.get(module_name.split(".")[0])
    return Impl(name=spec, fwd=fn, version=_version(root), source=spec)


def resolve_impls(extra: Sequence[str] = (), peers: bool = True) -> List[Impl]:
    """fastkda, then (with ``peers``) flash_kda and fla -- available or not -- then each ``module:function``."""
    impls = [fastkda_impl()]
    if peers:
        impls += [flash_kda_impl(), fla_impl()]
    seen = {i.name for i in impls}
    for spec in extra:
        if spec in seen:
            continue
        impls.append(custom_impl(spec))
        seen.add(spec)
    return impls
