"""The project's op-face reference (`kvcache.op`) as conformance targets, built from the suite's JSON configs.

    kvcache conformance --target python:kvcache_spec.conformance.op.targets:contiguous --strict
    kvcache conformance --target python:kvcache_spec.conformance.op.targets:cell --strict

`kvcache.op` mirrors upstream's names, so one builder (`config_for`) serves it and upstream's module
(upstream.py): it maps the JSON config field by field onto the module's own CacheConfig, and the
module's constructors validate it (OP-CONFIG). The reference declares the whole op face of the current spec
version (`spec=3`, scope.py: a target that names no version is judged as spec 1, without trim, sinks, chunks and
recording).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

from .. import scope as scopes
from ..configs import JsonConfig


def config_for(module: Any, cfg: JsonConfig, dtype: Any, **extra: Any) -> Any:
    """`module.CacheConfig` for a JSON op config (programs.op_config), nothing checked here."""
    layers = tuple(module.LayerPolicy(kind=module.LayerKind(entry["kind"]), window=entry["window"],
                                      **{key: entry[key] for key in ("keep", "chunk") if key in entry})   # OP-SINKS, OP-CHUNK
                   for entry in cfg["layers"])
    if "record_past" in cfg:   # OP-RECORD
        extra["record_past"] = cfg["record_past"]
    return module.CacheConfig(n_layers=cfg["n_layers"], n_kv_heads=cfg["n_kv_heads"], head_dim=cfg["head_dim"],
                              capacity=cfg["capacity"], sizing=module.CacheSizing(cfg.get("sizing", "dynamic")),
                              dtype=dtype, batch_size=cfg["batch_size"], layers=layers, **extra)


def _reference(cfg: JsonConfig) -> Any:
    import numpy as np

    op = importlib.import_module("kvcache.op")
    return op, config_for(op, cfg, np.float32, v_head_dim=cfg.get("v_head_dim", cfg["head_dim"]),
                          max_write=cfg.get("max_write"))


def contiguous(cfg: JsonConfig) -> Any:
    """kvcache.op.ContiguousReferenceCache."""
    op, config = _reference(cfg)
    return op.ContiguousReferenceCache(config)


def cell(cfg: JsonConfig) -> Any:
    """kvcache.op.CellReferenceCache."""
    op, config = _reference(cfg)
    return op.CellReferenceCache(config)


contiguous.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
contiguous.kvcache_scope = (f"spec={scopes.CURRENT_VERSION}",)   # type: ignore[attr-defined]
cell.kvcache_layout = "op-cell"   # type: ignore[attr-defined]


def library_target(name: str, build: Callable[[JsonConfig], Any], scope: tuple[str, ...], doc: str,
                   tensors: Optional[str] = None, spec: int = 2) -> Callable[[JsonConfig], Any]:
    """A field library's op-face target (hf.py, mlxlm.py): `build` under the name a user types after the colon,
    declaring the contiguous op layout, the library's scope, (`tensors`) the tensor kind it is written, and
    (`spec`) the spec version it is written against: 2 for the first adapters; a target judged on a later
    version's features (chunk layers, saved states) names that version."""
    def factory(cfg: JsonConfig) -> Any:
        return build(cfg)
    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = doc
    factory.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
    if tensors is not None:
        factory.kvcache_tensors = tensors   # type: ignore[attr-defined]
    factory.kvcache_scope = (*scope, f"spec={spec}")   # type: ignore[attr-defined]
    return factory
