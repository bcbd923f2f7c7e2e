"""Integrations with other libraries (fla's backend dispatch)."""

from .fla import register_fla_backend, unregister_fla_backend

__all__ = ["register_fla_backend", "unregister_fla_backend"]
