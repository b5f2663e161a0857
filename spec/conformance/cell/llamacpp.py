"""The command of llama.cpp's targets (`python -m kvcache_spec.conformance.cell.llamacpp [MODE]`): a thin entry
to spec/conformance/libraries/llamacpp.py, which holds them."""

from __future__ import annotations

import sys

from ..libraries.llamacpp import MODES, LlamaCppCells, SwaSmall, Unified, UnifiedSwaSmall, main, write_model

__all__ = ["MODES", "LlamaCppCells", "SwaSmall", "Unified", "UnifiedSwaSmall", "main", "write_model"]

if __name__ == "__main__":
    sys.exit(main())
