"""The drop-in (`kvcache.reference_cache`) as op-face conformance targets: its caches answer with upstream's
AttendSpec when executorch imports (then they are handed torch tensors), else with the project's.

    kvcache conformance --strict --target python:tests.dropin_targets:cell
"""

from __future__ import annotations

from typing import Any

import kvcache.reference_cache as dropin
from kvcache_spec.conformance.op.targets import config_for


def _config(cfg: Any) -> Any:
    if dropin.USING_UPSTREAM_TYPES:
        import torch
        dtype: Any = torch.float32
    else:
        import numpy as np
        dtype = np.float32
    return config_for(dropin, cfg, dtype, v_head_dim=cfg.get("v_head_dim", cfg["head_dim"]), max_write=cfg.get("max_write"))


def contiguous(cfg: Any) -> Any:
    """kvcache.reference_cache.ContiguousReferenceCache."""
    return dropin.ContiguousReferenceCache(_config(cfg))


def cell(cfg: Any) -> Any:
    """kvcache.reference_cache.CellReferenceCache."""
    return dropin.CellReferenceCache(_config(cfg))


for _factory, _layout in ((contiguous, "op-contiguous"), (cell, "op-cell")):
    _factory.kvcache_layout = _layout   # type: ignore[attr-defined]
    _factory.kvcache_tensors = "torch" if dropin.USING_UPSTREAM_TYPES else "numpy"   # type: ignore[attr-defined]
    _factory.kvcache_scope = ("spec=2",)   # type: ignore[attr-defined]   # the reference's: trim and sinks too
