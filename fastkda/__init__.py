"""fastkda: Kimi Delta Attention (KDA) forward kernels for NVIDIA Hopper, in Triton, and the suite that checks them.

Public surface:
    fwd        FlashKDA's signature: writes ``out`` (and ``final_state``) in place.
    chunk_kda  fla's keyword names: returns ``(o, final_state)``.
"""

from .api import chunk_kda, fwd
from .checks import set_strict_checks

__version__ = "0.1.0"

__all__ = ["fwd", "chunk_kda", "set_strict_checks", "__version__"]
