"""Today's target path for mlx-lm's caches, kept: `python:kvcache_spec.conformance.op.mlxlm:NAME` loads the
factory `kvcache_spec.conformance.libraries.mlxlm` defines (the adapter lives there, beside the other judged
libraries)."""

from __future__ import annotations

from ..libraries.mlxlm import (TARGETS, chunked, concatenate, kv, llama4_chunked, llama_sliding, llama_sliding_saved,
                                prompt_cache, prompt_cache_saved, quantized)

__all__ = ["TARGETS", "chunked", "concatenate", "kv", "llama4_chunked", "llama_sliding", "llama_sliding_saved",
           "prompt_cache", "prompt_cache_saved", "quantized"]
