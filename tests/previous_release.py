"""Caches written against the spec's previous release (spec 1: before OP-TRIM and OP-SINKS), as their users wrote
them: an upgrade of the suite must not fail them (issue 41 point 4; scope.py, SPEC_VERSIONS).

- `tiny`: the README's tiny op cache as that release shipped it: no `kvcache_scope` (then: the whole spec), no
  `trim` method, and a layer entry read for its kind and window only - a `keep` it never heard of is ignored.
- `hello_without_sinks`: the same cache, batch 1 only, served over the protocol (`cmd:python -m
  kvcache_spec.conformance.serve python:tests.previous_release:hello_without_sinks`): its hello declares the op
  features of the time less `batch` - no `sinks`, no `trim`, no version.
(The C++ one is spec/cpp/example/serve_mlx_shaped.cpp: `op::Scope::full()` less batch and mla, as it was then.)
"""

from __future__ import annotations

from typing import Any

from kvcache_spec.examples.tiny_op_cache import TinyOpCache


class PreviousTinyOpCache(TinyOpCache):
    """The previous release's tiny cache: today's one differs only by its scope line and its refusal of a keep."""

    kvcache_scope = None   # the previous release declared none

    def __init__(self, config: dict[str, Any]) -> None:
        layers = config.get("layers")
        unread = [{key: value for key, value in entry.items() if key != "keep"} if isinstance(entry, dict) else entry
                  for entry in layers] if isinstance(layers, list) else layers   # `keep` did not exist
        super().__init__({**config, "layers": unread})


def tiny(cfg: dict[str, Any]) -> PreviousTinyOpCache:
    return PreviousTinyOpCache(cfg)


def hello_without_sinks(cfg: dict[str, Any]) -> PreviousTinyOpCache:
    if cfg.get("batch_size") != 1:
        raise ValueError("SCOPE-BORDER: batch 1 only")   # outside its declared scope: refused at creation
    return PreviousTinyOpCache(cfg)


tiny.kvcache_layout = hello_without_sinks.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
# what the previous release's server said in its hello for this cache: its features, sinks and trim unheard of
hello_without_sinks.kvcache_scope = ("flat", "ring", "max_write", "mla", "positions", "steps")   # type: ignore[attr-defined]


def trim_declared_not_implemented(cfg: dict[str, Any]) -> TinyOpCache:
    """Today's tiny cache under a scope that names `trim` (spec 2) though the cache has no trim method."""
    return TinyOpCache(cfg)


trim_declared_not_implemented.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
trim_declared_not_implemented.kvcache_scope = (*TinyOpCache.kvcache_scope, "trim")   # type: ignore[attr-defined]
