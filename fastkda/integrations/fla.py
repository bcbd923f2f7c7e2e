"""fastkda as a backend of fla's ``chunk_kda`` dispatch.

fla routes ``fla.ops.kda.chunk_kda`` through a registry of backends (``fla.backends``): each backend has a
verifier that accepts or declines a call, and the first enabled backend (lowest ``priority``) that accepts
runs it; otherwise fla's own Triton path runs. Registration here is explicit::

    import fastkda
    fastkda.register_fla_backend()          # fastkda now serves fla.ops.kda.chunk_kda where it can

It is turned off again with ``FLA_FASTKDA=0`` in the environment (fla reads the variable at each call) or
with :func:`unregister_fla_backend`. fastkda accepts a call only when it can serve it exactly: CUDA
tensors, grad mode off (inference), head dims 64/128, bounded gates (``use_gate_in_kernel`` with
``lower_bound`` in [-5, 0), or ``safe_gate=True``), no context parallelism, no intermediate states, no
negative eigenvalues. Everything else stays with fla.
"""

from __future__ import annotations

from typing import Optional

BACKEND_TYPE = "fastkda"
ENV_VAR = "FLA_FASTKDA"
DEFAULT_PRIORITY = 2  # ahead of fla's FlashKDA backend (3); lower runs first

_backend_class = None


def _served_device(device) -> bool:
    """Devices on which fastkda takes calls from fla (its Triton kernels need CUDA)."""
    return device.type == "cuda"


def _chunk_kda_entry():
    from fla.ops.kda.chunk import chunk_kda
    return chunk_kda


def _make_backend_class(priority: int):
    from fla.backends import BaseBackend

    from .. import api
    from ..checks import check_index_range
    from ..kernels import CHUNK_SIZE

    class FastKDABackend(BaseBackend):
        """fastkda's Triton forward for fla's chunk_kda (inference only)."""

        backend_type = BACKEND_TYPE
        package_name = "fastkda"
        env_var = ENV_VAR
        default_enable = True

        def chunk_kda_verifier(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               *args, **kwargs):
            import torch

            if torch.is_grad_enabled():
                return False, "fastkda is forward-only: used when grad mode is off"
            if not _served_device(q.device):
                return False, "fastkda's kernels run on CUDA tensors"
            if args:
                return False, "fastkda takes chunk_kda's options by keyword only"
            if kwargs.get("use_graph"):
                return False, "use_graph's padded sentinel sequences are fla's convention"
            try:
                p = api.check_chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                        output_final_state=output_final_state, **kwargs)["problem"]
                check_index_range(p.B * p.T, p.H, p.HV, p.K, p.V, p.N, CHUNK_SIZE)
            except (ValueError, TypeError, NotImplementedError) as error:
                return False, str(error)
            return True, None

        def chunk_kda(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kwargs):
            return api.chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                 output_final_state=output_final_state, **kwargs)

    FastKDABackend.priority = priority
    return FastKDABackend


def register_fla_backend(priority: int = DEFAULT_PRIORITY) -> bool:
    """Register fastkda with fla's ``chunk_kda`` dispatch. Returns False when fla is not installed.

    ``priority`` orders backends (lower first); the default puts fastkda ahead of fla's FlashKDA backend.
    """
    global _backend_class
    try:
        from fla.backends import register
        entry = _chunk_kda_entry()
    except ImportError:
        return False
    _backend_class = _make_backend_class(priority)
    register(entry)(_backend_class)
    return True


def unregister_fla_backend() -> None:
    """Remove fastkda from fla's ``chunk_kda`` dispatch (no-op when it is not registered)."""
    registry = registry_of_chunk_kda()
    if registry is not None:
        registry._backends.pop(BACKEND_TYPE, None)


def registry_of_chunk_kda():
    """fla's backend registry for ``chunk_kda`` (None when fla is not installed)."""
    try:
        from inspect import unwrap

        from fla.backends import _function_registries
        entry = _chunk_kda_entry()
    except ImportError:
        return None
    return _function_registries.get(unwrap(entry))


def active_backend_for(*args, **kwargs) -> Optional[str]:
    """Which backend fla's dispatch would pick for this call (None: fla's own path)."""
    registry = registry_of_chunk_kda()
    if registry is None:
        return None
    for backend in registry._get_sorted_backends():
        if backend.is_available() and backend.is_enabled() and backend.verify("chunk_kda", *args, **kwargs)[0]:
            return backend.backend_type
    return None
