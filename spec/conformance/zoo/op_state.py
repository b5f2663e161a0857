"""Broken op-face caches for a state saved and loaded (OP-STATE): each is the reference
(`kvcache.op.ContiguousReferenceCache`) changed in one thing, the way a real prompt-cache round trip goes wrong,
and each must be found with a short program (tests/test_op_persist.py). Use one as a target:
`--target python:kvcache_spec.conformance.zoo.op_state:accepts_corrupted`.

- `accepts_corrupted`: a loader that trusts its input - a state whose checksum does not match is loaded as far
  as it parses, one that does not parse is ignored: lenient.
- `accepts_foreign_config`: a loader that never compares the config a state was taken under: lenient.
- `loses_a_row`: a round trip that drops the newest row of every layer (a length saved one short of the rows,
  as an off-by-one slice does): wrong.
- `ring_position_lost`: a round trip that loses a ring's write position: every ring layer's rows come back
  shifted by one slot (mlx-lm's RotatingKVCache keeps its `_idx` in a meta state a loader may drop): wrong.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from kvcache import KVCacheError, op

from .. import scope as scopes
from ..configs import JsonConfig
from .op_chunk import _config   # the reference's config of a JSON op config (the zoo reaches no layout)

_DIGEST = 32   # the reference format's SHA-256 (kvcache/_op_state.py)


class _Trusting(op.ContiguousReferenceCache):
    """Loads a state whose checksum is wrong: the checksum recomputed over what was given, then loaded if that
    parses; a state that does not parse is ignored (the error swallowed, nothing loaded)."""

    def load_state(self, data: bytes) -> None:
        try:
            super().load_state(data)
        except KVCacheError as error:
            if "another" in error.message:   # another config's or version's: still refused
                raise
            body = bytes(data[:-_DIGEST]) if len(data) > _DIGEST else b""
            try:
                super().load_state(body + hashlib.sha256(body).digest())
            except KVCacheError:
                pass


class _ConfigBlind(op.ContiguousReferenceCache):
    """Loads a state taken under another config as if it were its own (its rows fitted to this cache's)."""

    def load_state(self, data: bytes) -> None:
        try:
            super().load_state(data)
        except KVCacheError as error:
            if "another config" not in error.message:
                raise


class _RowLost(op.ContiguousReferenceCache):
    """A loaded state's newest row of every layer is lost (left zero): the slice that copied it stopped one short."""

    def load_state(self, data: bytes) -> None:
        super().load_state(data)
        newest = self.used(0) - 1
        if newest >= 0:
            for k, v in zip(self._pools.k, self._pools.v):
                k[:, :, newest % k.shape[2]] = 0
                v[:, :, newest % v.shape[2]] = 0


class _RingShifted(op.ContiguousReferenceCache):
    """A loaded state's ring layers have their rows one slot on from where they were (a write position lost)."""

    def load_state(self, data: bytes) -> None:
        super().load_state(data)
        for layer, (k, v) in enumerate(zip(self._pools.k, self._pools.v)):
            if self.config.window(layer) and k.shape[2]:
                self._pools.k[layer], self._pools.v[layer] = (_one_on(a, self._depth[layer]) for a in (k, v))


def _one_on(rows: np.ndarray, depth: int) -> np.ndarray:
    """Every row one slot on: the pool grown by a zero row in front while it is below its depth, else wrapped."""
    if rows.shape[2] < depth:
        return np.concatenate([np.zeros_like(rows[:, :, :1]), rows], axis=2)
    return np.roll(rows, 1, axis=2)


def _factory(cls: type[op.ContiguousReferenceCache], doc: str) -> Any:
    def factory(cfg: JsonConfig) -> op.ContiguousReferenceCache:
        return cls(_config(cfg))
    factory.__doc__ = doc
    factory.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
    factory.kvcache_scope = (f"spec={scopes.CURRENT_VERSION}",)   # type: ignore[attr-defined]
    return factory


accepts_corrupted = _factory(_Trusting, "A state with a wrong checksum loaded as far as it parses: lenient.")
accepts_foreign_config = _factory(_ConfigBlind, "A state of another config loaded as this cache's: lenient.")
loses_a_row = _factory(_RowLost, "A round trip that loses the newest row of every layer: wrong.")
ring_position_lost = _factory(_RingShifted, "A round trip that shifts every ring layer's rows by one slot: wrong.")

# (class, rule) each stand-in is found as; tests/test_op_persist.py holds each to it, within 4 steps
FOUND_AS: dict[str, tuple[str, str]] = {
    "accepts_corrupted": ("lenient", "OP-STATE"),
    "accepts_foreign_config": ("lenient", "OP-STATE"),
    "loses_a_row": ("wrong", "OP-ATTEND"),
    "ring_position_lost": ("wrong", "OP-ATTEND"),
}
