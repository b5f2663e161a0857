"""Broken op-face caches for extend and extract (OP-ROWS, scope feature `merge`): each is the reference
(`kvcache.op.ContiguousReferenceCache`) changed in one thing, the way a real batch cache's merge goes wrong, and
each must be found with a short program (tests/test_op_merge.py). Use one as a target:
`--target python:kvcache_spec.conformance.zoo.op_merge:extend_drops_pads`.

- `extend_drops_pads`: the appended rows lose their pads (the other cache's left padding not carried over, as a
  merge that concatenates K and V and keeps only this cache's padding): their real queries attend their pads:
  wrong (OP-PAD).
- `extract_changes_original`: extract takes the row out of the original too (a pop: the cache keeps the other
  rows), so the cache kept beside is not the one it was: the next step on it is refused: over-strict (OP-ROWS).
- `extend_shares_history`: the appended rows are filled from this cache's rows, not other's (`self` where `other`
  belongs): their queries attend another row's history: wrong (OP-ROWS).
- `extend_takes_foreign`: an extend of a cache of another capacity served (the config compared without it):
  lenient (OP-ROWS). On a static config the reference's own invariant then fails inside the extend, which has
  changed the cache: wrong (OP-ATOMIC) there too.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from kvcache import op
from kvcache._errors import KVCacheError

from .op_state import _factory   # a stand-in class as a python: factory of the whole spec's scope


class _ExtendDropsPads(op.ContiguousReferenceCache):
    """extend keeps this cache's pads and gives the appended rows none."""

    def extend(self, other: Any) -> None:
        mine = self.pads()
        super().extend(other)
        self._pads = mine + (0,) * other.config.batch_size if any(mine) else ()


class _ExtractChangesOriginal(op.ContiguousReferenceCache):
    """extract pops the row: the extracted cache, and this one without it (a batch of one is left as it is)."""

    def extract(self, row: int) -> Any:
        out = super().extract(row)
        if self.config.batch_size > 1:
            self._take([other for other in range(self.config.batch_size) if other != row])
        return out


class _ExtendSharesHistory(op.ContiguousReferenceCache):
    """extend appends other's pads, but K and V of this cache's first row in every appended row."""

    def extend(self, other: Any) -> None:
        first = [(k[:1].copy(), v[:1].copy()) for k, v in zip(self._pools.k, self._pools.v)]
        super().extend(other)
        theirs = other.config.batch_size
        for layer, (k, v) in enumerate(first):
            rows = min(k.shape[2], self._pools.k[layer].shape[2])
            self._pools.k[layer][-theirs:, :, :rows] = k[:, :, :rows]
            self._pools.v[layer][-theirs:, :, :rows] = v[:, :, :rows]


class _ExtendTakesForeign(op.ContiguousReferenceCache):
    """extend compares the configs without their capacity: another capacity's cache is taken."""

    def _extend_error(self, other: Any) -> Optional[KVCacheError]:
        if type(other) is not type(self) or other.config.capacity == self.config.capacity:
            return super()._extend_error(other)
        theirs = other.config
        other.config = replace(theirs, capacity=self.config.capacity)
        try:
            return super()._extend_error(other)
        finally:
            other.config = theirs


extend_drops_pads = _factory(_ExtendDropsPads, "An extend whose appended rows lose their pads: wrong.")
extract_changes_original = _factory(_ExtractChangesOriginal, "An extract that takes the row out of the original "
                                                             "too: over-strict.")
extend_shares_history = _factory(_ExtendSharesHistory, "An extend that fills the appended rows from this cache's "
                                                       "rows: wrong.")
extend_takes_foreign = _factory(_ExtendTakesForeign, "An extend of a cache of another capacity served: lenient.")

# (class, rule) each stand-in is found as; tests/test_op_merge.py holds each to it, within 4 steps
FOUND_AS: dict[str, tuple[str, str]] = {
    "extend_drops_pads": ("wrong", "OP-PAD"),
    "extract_changes_original": ("over-strict", "OP-ROWS"),
    "extend_shares_history": ("wrong", "OP-ROWS"),
    "extend_takes_foreign": ("lenient", "OP-ROWS"),
}
