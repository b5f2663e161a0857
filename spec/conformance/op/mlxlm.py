"""Today's target path for mlx-lm's caches, kept: `python:kvcache_spec.conformance.op.mlxlm:NAME` loads the factory
`kvcache_spec.conformance.libraries.mlxlm` defines (the adapter lives there, beside the other judged libraries). Every
name is forwarded, so a target added there loads here too without a list to keep in step."""

from __future__ import annotations

from typing import Any

from ..libraries import mlxlm as _library
from ..libraries.mlxlm import TARGETS

__all__ = ["TARGETS"]


def __getattr__(name: str) -> Any:
    """A factory (or any name) of the adapter's module, looked up when asked for: the list cannot go stale."""
    return getattr(_library, name)
