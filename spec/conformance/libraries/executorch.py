"""The released upstream caches as op-face targets, unchanged: ExecuTorch 1.5.1's reference caches.

    kvcache conformance --target python:kvcache_spec.conformance.libraries.executorch:contiguous
    kvcache conformance --target python:kvcache_spec.conformance.libraries.executorch:cell

Each factory builds upstream's own `CacheConfig` from the suite's JSON config, field by field, and
returns upstream's cache object as it is: no method is wrapped, no argument or answer is changed (the
suite hands it torch tensors, `kvcache_tensors = "torch"`). Needs torch and executorch (the `upstream`
extra; the README, "Upstream findings"): `pip install torch==2.13.0 ruamel.yaml flatbuffers tabulate` and
`pip install --no-deps executorch==1.5.1`.

The declared scopes follow what upstream documents (scope.py, OP_FEATURES):
- ContiguousReferenceCache leaves out `positions` - its docstring: "This contiguous single-sequence
  cache appends at its used length, so the causal offset is that prior length; non-contiguous (tree)
  caches will consume ``position`` directly" - and `steps` - it is a "Per-layer contiguous float KV
  history", each layer appended on its own (`used(layer_id)`), with no step across layers.
- CellReferenceCache leaves out `declarations`: a verb keeps an unused begin_step declaration, as its
  comment says: "The step protocol state is deliberately left alone: a mutation must not disguise a
  forward that skipped begin_step."
- Both declare `mla`: `update_and_fetch` documents "v_head_dim may differ from head_dim, e.g. MLA".
  Upstream's CacheConfig has no v_head_dim, so the cache is built with head_dim and handed values of
  the config's v_head_dim, as its docstring says it takes them.
- Neither declares `max_write`: upstream's Python CacheConfig has no such field (a ring layer keeps its
  whole history), so a config that sets it is refused here, at creation (SCOPE-BORDER). The contiguous
  cache declares `batch` (it serves batch rows); the cell cache needs none (it refuses batch_size != 1).
- Neither declares `trim` or `sinks`: upstream's caches have no trim verb and its LayerPolicy no keep, so
  a config with sinks is refused here, at creation (SCOPE-BORDER). The contiguous target declares `spec=2`
  (scope.py, SPEC_VERSIONS): the adapter is written against spec 2, so those configurations stay border checks.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..._extras import version_line
from ..configs import JsonConfig
from ..op.targets import config_for

MODULE = "executorch.extension.llm.cache.reference_cache"

# On a release of ExecuTorch this adapter was not written for, loading a target names both versions (the CLI's
# "cannot load" line, exit 2); without executorch the module loads and each creation names the missing import.
_OTHER_VERSION = version_line("upstream", "kvcache_spec.conformance.libraries.executorch")
if _OTHER_VERSION:
    raise ImportError(_OTHER_VERSION)


def _config(cfg: JsonConfig) -> Any:
    import torch

    if cfg.get("max_write") is not None:   # upstream's Python CacheConfig cannot carry it
        raise ValueError(f"SCOPE-BORDER: upstream's CacheConfig has no max_write (got {cfg['max_write']!r})")
    if any(entry.get("keep", 0) != 0 for entry in cfg["layers"]):   # nor sinks (OP-SINKS)
        raise ValueError("SCOPE-BORDER: upstream's LayerPolicy has no keep (attention sinks)")

    return config_for(importlib.import_module(MODULE), cfg, torch.float32)


def contiguous(cfg: JsonConfig) -> Any:
    """upstream's ContiguousReferenceCache, as it is."""
    return importlib.import_module(MODULE).ContiguousReferenceCache(_config(cfg))


def cell(cfg: JsonConfig) -> Any:
    """upstream's CellReferenceCache, as it is."""
    return importlib.import_module(MODULE).CellReferenceCache(_config(cfg))


contiguous.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
contiguous.kvcache_tensors = "torch"   # type: ignore[attr-defined]
contiguous.kvcache_scope = ("flat", "ring", "batch", "mla", "spec=2")   # type: ignore[attr-defined]
cell.kvcache_layout = "op-cell"   # type: ignore[attr-defined]
cell.kvcache_tensors = "torch"   # type: ignore[attr-defined]
cell.kvcache_scope = ("flat", "ring", "mla", "positions", "steps")   # type: ignore[attr-defined]

TARGETS = ("contiguous", "cell")
