"""Broken op-face caches for rows of a batch that differ and the batch verbs (OP-PAD, OP-ROWS): each is the
reference (`kvcache.op.ContiguousReferenceCache`) changed in one thing, the way a real batch cache goes wrong,
and each must be found with a short program (tests/test_op_batch.py). Use one as a target:
`--target python:kvcache_spec.conformance.zoo.op_batch:reorder_drops_padding`.

- `padding_ignored`: pad() accepted and forgotten: a row's real queries attend its pads: wrong (OP-PAD).
- `padding_bool_taken`: a pad count of True taken for 1 (Python's bool is an int): lenient (OP-PAD).
- `reorder_drops_padding`: a verb moves each row's K and V but leaves the pads at their old indices (the row
  now at index b is masked by the pads of the row that was there, and loses its own tokens): wrong (OP-ROWS).
- `reorder_k_only`: a verb moves K and not V (half a beam reorder): wrong (OP-ATTEND: a row not one token's).
- `negative_row_wraps`: a row index of -1 taken as the last row (numpy's indexing): lenient (OP-ROWS).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence

import numpy as np

from kvcache import op

from .. import scope as scopes
from ..configs import JsonConfig


class PaddingIgnored(op.ContiguousReferenceCache):
    def pad(self, left_padding: Sequence[int]) -> None:
        super().pad(left_padding)
        self._pads = ()


class PaddingBoolTaken(op.ContiguousReferenceCache):
    def pad(self, left_padding: Sequence[int]) -> None:
        super().pad([int(p) if type(p) is bool else p for p in left_padding] if type(left_padding) is list
                    else left_padding)


class ReorderDropsPadding(op.ContiguousReferenceCache):
    def _take(self, rows: Sequence[int]) -> None:
        pads = self.pads()
        super()._take(rows)
        self._pads = tuple(pads[row] if row < len(pads) else 0 for row in range(len(rows))) if any(pads) else ()


class ReorderKOnly(op.ContiguousReferenceCache):
    def _take(self, rows: Sequence[int]) -> None:
        old_v = list(self._pools.v)
        super()._take(rows)
        index = np.arange(len(rows)) % old_v[0].shape[0]
        self._pools.v = [v[index] for v in old_v]


class NegativeRowWraps(op.ContiguousReferenceCache):
    def _wrapped(self, rows: Any) -> Any:
        batch = self.config.batch_size
        return [row + batch if type(row) is int and -batch <= row < 0 else row for row in rows] \
            if type(rows) is list else rows

    def select(self, rows: Sequence[int]) -> None:
        super().select(self._wrapped(rows))

    def reorder(self, rows: Sequence[int]) -> None:
        super().reorder(self._wrapped(rows))


def _factory(name: str, cls: type) -> Callable[[JsonConfig], Any]:
    def factory(cfg: JsonConfig) -> Any:
        # the reference's own config of the JSON one; the op layout reached by name (the zoo imports no layout)
        return cls(importlib.import_module("kvcache_spec.conformance.op.targets").contiguous(cfg).config)
    factory.__name__ = factory.__qualname__ = name
    factory.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
    factory.kvcache_scope = (f"spec={scopes.CURRENT_VERSION}",)   # type: ignore[attr-defined]   # the reference's
    return factory


padding_ignored = _factory("padding_ignored", PaddingIgnored)
padding_bool_taken = _factory("padding_bool_taken", PaddingBoolTaken)
reorder_drops_padding = _factory("reorder_drops_padding", ReorderDropsPadding)
reorder_k_only = _factory("reorder_k_only", ReorderKOnly)
negative_row_wraps = _factory("negative_row_wraps", NegativeRowWraps)

# name -> (the finding's class, its rule): what the suite must report on each (tests/test_op_batch.py)
FOUND_AS: dict[str, tuple[str, str]] = {
    "padding_ignored": ("wrong", "OP-PAD"),
    "padding_bool_taken": ("lenient", "OP-PAD"),
    "reorder_drops_padding": ("wrong", "OP-ROWS"),
    "reorder_k_only": ("wrong", "OP-ATTEND"),
    "negative_row_wraps": ("lenient", "OP-ROWS"),
}
