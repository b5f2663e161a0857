"""Today's target path for ExecuTorch's released caches, kept: `python:kvcache_spec.conformance.op.upstream:NAME`
loads the factory `kvcache_spec.conformance.libraries.executorch` defines (the adapter lives there, beside the
other judged libraries)."""

from __future__ import annotations

from ..libraries.executorch import MODULE, TARGETS, cell, contiguous

__all__ = ["MODULE", "TARGETS", "cell", "contiguous"]
