"""The op face: upstream's `update_and_fetch` caches, `AttendSpec` and `attend`, over this project's
contract-checked integer layouts, with a numpy byte layer (torch tensors accepted when torch is installed).

The names are those of ExecuTorch's `extension/llm/cache/reference_cache.py`, so

    from kvcache.op import CacheConfig, ContiguousReferenceCache, CellReferenceCache, attend

replaces the import of upstream's module. Needs numpy (a dependency of kvcache-spec), never torch.
"""

from ._errors import TrimError
from ._op_attend import attend
from ._op_cells import MAX_SEQS, CellReferenceCache
from ._op_contiguous import ContiguousReferenceCache
from ._op_types import AttendSpec, CacheConfig, CacheSizing, LayerKind, LayerPolicy, MaskKind

__all__ = ["MAX_SEQS", "AttendSpec", "CacheConfig", "CacheSizing", "CellReferenceCache", "ContiguousReferenceCache",
           "LayerKind", "LayerPolicy", "MaskKind", "TrimError", "attend"]
