"""Today's target path for transformers' caches, kept: `python:kvcache_spec.conformance.op.hf:NAME` loads the
factory `kvcache_spec.conformance.libraries.hf` defines (the adapter lives there, beside the other judged
libraries)."""

from __future__ import annotations

from ..libraries.hf import (TARGETS, dynamic_full, dynamic_sliding, quantized_fp8, quantized_hqq, quantized_quanto,
                            static_full, static_sliding)

__all__ = ["TARGETS", "dynamic_full", "dynamic_sliding", "quantized_fp8", "quantized_hqq", "quantized_quanto",
           "static_full", "static_sliding"]
