"""kvcache: the contract-checked reference of off-graph LLM KV-cache controllers (sequence, cell and paged layouts).

The public surface mirrors ExecuTorch's `extension/llm/cache` so code and docs translate one to one.
The normative rules live in `kvcache_spec.rules`; every contract here cites their ids. The op face
(upstream's `update_and_fetch` caches, `AttendSpec` and `attend`, over these layouts) is `kvcache.op`,
imported on its own: `import kvcache` stays free of numpy.
"""

from ._cache import SequenceCache
from ._cell_table import MAX_SEQS
from ._cells import CellCache
from ._errors import (ArgumentTypeError, ArgumentValueError, CapacityError, ConfigError, ConfigTypeError,
                      ForwardError, KVCacheError, LayerIndexError, PlanError, StepError, TrimError)
from ._faces import BatchControl, CacheBase, CacheControl, CellStepper, SequenceControl, SequencePlanner
from ._ints import INT_MAX
from ._paged_cache import PagedCache
from ._policies import FlatPolicy, LayoutPolicy, RingPolicy
from ._registry import CacheBuilderRegistry, CacheRegistry, CacheSession, make_unique_key
from ._types import CacheConfig, CellStep, Kind, LayerConfig, LayerPolicy, Run, SeqStepPlan

__all__ = [
    "INT_MAX", "MAX_SEQS", "ArgumentTypeError", "ArgumentValueError", "BatchControl", "CacheBase", "CacheBuilderRegistry",
    "CacheConfig", "CacheControl", "CapacityError", "CacheRegistry", "CacheSession", "CellCache", "CellStep", "CellStepper", "ConfigError",
    "ConfigTypeError", "FlatPolicy", "ForwardError", "KVCacheError", "Kind",
    "LayerConfig", "LayerIndexError", "LayerPolicy", "LayoutPolicy", "PagedCache", "PlanError", "RingPolicy", "Run",
    "SeqStepPlan", "SequenceCache", "SequenceControl", "SequencePlanner", "StepError", "TrimError", "make_unique_key",
]
