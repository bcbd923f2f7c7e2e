"""fastkda: Kimi Delta Attention (KDA) forward kernels for NVIDIA Hopper, in Triton, and the suite that checks them.

Public surface:
    fwd        FlashKDA's signature: writes ``out`` (and ``final_state``) in place.
    chunk_kda  fla's keyword names: returns ``(o, final_state)``.
    register_fla_backend  serve fla.ops.kda.chunk_kda from fastkda where it can (see integrations/fla.py).
"""

from .api import chunk_kda, fwd
from .checks import set_strict_checks
from .integrations import register_fla_backend, unregister_fla_backend

__version__ = "0.1.0"

__all__ = [
    "fwd", "chunk_kda", "set_strict_checks", "register_fla_backend", "unregister_fla_backend", "__version__",
]
