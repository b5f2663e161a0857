"""The paged layout (a serving engine's KV memory): `PagedCache`, a block pool with per-group block tables,
prefix caching and sliding-window groups, contract-checked. The rules it checks are the PAGED-* rules of
`kvcache_spec.rules`; the conformance suite drives it as `python:kvcache.paged:PagedCache`.
"""

from ._paged_cache import PagedCache
from ._paged_config import PagedConfig, paged_config

__all__ = ["PagedCache", "PagedConfig", "paged_config"]
