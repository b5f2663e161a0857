"""Rows of a batch that differ and the batch verbs of the contiguous op cache (OP-PAD, OP-ROWS).

Every batch row of a contiguous cache shares the positions; a row may begin with *pads* (left padding: the
caller writes a row's shorter prompt after `left_padding[b]` filler tokens), which no query of that row at a
real position attends. While any row has pads the answer says what each row attends: an EXPLICIT mask
[B, q_len, rows], one per batch row (OP-MASK); a query at a pad position attends only itself (its output is
the caller's to discard; the spec does not judge it, and the softmax stays defined).

The verbs act on the batch axis of every layer's K and V at once and keep the positions: `select` (filter),
`reorder` (beam search's beam_idx), `repeat` (beams starting), `extend` (another cache's rows appended),
`extract` (one row as a cache of its own). Each checks every argument before anything changes (OP-ATOMIC)
and abandons an open step first (OP-STEP), as every verb does.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Optional, Sequence

import icontract
import numpy as np

from ._errors import ArgumentTypeError, ArgumentValueError, KVCacheError, StepError
from ._ints import is_int
from ._op_arrays import found
from ._op_types import CacheConfig, Mask


def rows_mask(mask: Mask, positions: Sequence[int], keys: Sequence[int], pads: Sequence[int]) -> Mask:
    """OP-PAD: a step's mask [q_len, rows] per batch row [B, q_len, rows]: row b's real queries attend none of
    its pads; its pad queries attend only themselves. Without pads the mask itself ([q_len, rows])."""
    if not any(pads):
        return mask
    queries = np.asarray(positions, dtype=np.int64)[:, None]
    key_at = np.asarray(keys, dtype=np.int64)[None, :]
    out: Mask = np.empty((len(pads),) + mask.shape, dtype=np.bool_)
    for row, pad in enumerate(pads):
        out[row] = np.where(queries < pad, key_at == queries, mask & (key_at >= pad))
    return out


def masks_agree(answered: Mask, wanted: Mask) -> bool:
    """OP-MASK, OP-PAD: two masks mean the same, a [q_len, rows] one standing for every batch row alike."""
    if answered.shape[-2:] != wanted.shape[-2:]:
        return False
    left, right = np.broadcast_arrays(answered, wanted)
    return bool(np.array_equal(left, right))


def _rows_error(verb: str, rows: Any, batch: int, *, distinct: bool, length: Optional[int],
                argument: str = "rows") -> Optional[KVCacheError]:
    """OP-ROWS: rows is a non-empty list or tuple of ints (not bools) in [0, batch); distinct where the verb keeps a
    row at most once; `length` of them where the batch keeps its size. The error names `argument` (extract's `row`)."""
    if type(rows) not in (list, tuple):
        return ArgumentTypeError("OP-ROWS", argument, f"{verb} takes a list of batch-row indices", type=type(rows).__name__)
    if not rows:
        return ArgumentValueError("OP-ROWS", argument, f"{verb} would leave an empty batch")
    for row in rows:
        if not is_int(row):
            return ArgumentTypeError("OP-ROWS", argument, "every index is an int (bool is not an int here)", value=row,
                                     type=type(row).__name__)
        if not 0 <= row < batch:
            return ArgumentValueError("OP-ROWS", argument, f"every index lies in [0, batch_size {batch})", value=row)
    if length is not None and len(rows) != length:
        return ArgumentValueError("OP-ROWS", argument, f"{verb} names one source row per batch row", size=len(rows),
                                  batch_size=length)
    if distinct and len(set(rows)) != len(rows):
        return ArgumentValueError("OP-ROWS", argument, f"{verb} keeps each row at most once (reorder repeats rows)",
                                  rows=list(rows))
    return None


class BatchRows:
    """The batch half of `ContiguousReferenceCache`: its pads and its batch verbs (the cache supplies
    `config`, `_pools`, `_layout`, `_step` and `_abandon`)."""

    config: CacheConfig
    _pads: tuple[int, ...] = ()   # OP-PAD: per batch row; empty = no row has pads

    def pads(self) -> tuple[int, ...]:
        """OP-PAD: per batch row, the positions below which it holds pads."""
        return self._pads or (0,) * self.config.batch_size

    def _batch_state(self) -> tuple[Any, ...]:
        return self.config.batch_size, self.pads()

    # --- OP-PAD --------------------------------------------------------------------------------------

    def _pad_error(self, left_padding: Any) -> Optional[KVCacheError]:
        batch, capacity = self.config.batch_size, self.config.capacity
        if type(left_padding) not in (list, tuple):
            return ArgumentTypeError("OP-PAD", "left_padding", "must be a list of ints, one per batch row",
                                     type=type(left_padding).__name__)
        if len(left_padding) != batch:
            return ArgumentValueError("OP-PAD", "left_padding", "needs one pad count per batch row",
                                      size=len(left_padding), batch_size=batch)
        for pad in left_padding:
            if not is_int(pad):
                return ArgumentTypeError("OP-PAD", "left_padding", "every pad count is an int (bool is not)", value=pad,
                                         type=type(pad).__name__)
            if not 0 <= pad <= capacity:
                return ArgumentValueError("OP-PAD", "left_padding", f"every pad count lies in [0, capacity {capacity}]",
                                          value=pad)
        if self._layout.length() or self._step is not None:   # type: ignore[attr-defined]
            return StepError("OP-PAD", "left_padding", "padding is declared before the first step (the cache holds "
                                                       "tokens)", held=self._layout.length())  # type: ignore[attr-defined]
        return None

    @icontract.require(lambda self, left_padding: self._pad_error(left_padding) is None,
                       "OP-PAD: one pad count per batch row, each an int in [0, capacity], on a cache holding nothing",
                       error=lambda self, left_padding: found(self._pad_error(left_padding)), enabled=True)
    @icontract.ensure(lambda self, left_padding: self.pads() == tuple(left_padding),
                      "OP-PAD: each row's positions below its pad count are its pads")
    def pad(self, left_padding: Sequence[int]) -> None:
        """Declare left padding (mlx-lm's BatchKVCache(left_padding), a mask's leading zeros): batch row b's
        first left_padding[b] positions are pads, which none of its queries at a real position attends."""
        self._pads = tuple(left_padding)

    # --- OP-ROWS -------------------------------------------------------------------------------------

    def _take(self, rows: Sequence[int]) -> None:
        """The batch becomes the rows named, in that order, on every layer (an open step abandoned first)."""
        self._abandon()   # type: ignore[attr-defined]
        pools = self._pools   # type: ignore[attr-defined]
        index = np.asarray(rows, dtype=np.int64)
        pools.k = [k[index] for k in pools.k]
        pools.v = [v[index] for v in pools.v]
        pads = self.pads()
        self._pads = tuple(pads[row] for row in rows) if any(pads) else ()
        self.config = replace(self.config, batch_size=len(rows))
        pools.config = self.config

    @icontract.require(lambda self, rows: _rows_error("select", rows, self.config.batch_size, distinct=True,
                                                      length=None) is None,
                       "OP-ROWS: rows is a non-empty list of distinct ints in [0, batch_size)",
                       error=lambda self, rows: found(_rows_error("select", rows, self.config.batch_size,
                                                                  distinct=True, length=None)), enabled=True)
    @icontract.ensure(lambda self, rows: self.config.batch_size == len(rows), "OP-ROWS: one batch row per index")
    def select(self, rows: Sequence[int]) -> None:
        """Keep the batch rows named, in that order (mlx-lm's filter, transformers' batch_select_indices)."""
        self._take(rows)

    @icontract.require(lambda self, rows: _rows_error("reorder", rows, self.config.batch_size, distinct=False,
                                                      length=self.config.batch_size) is None,
                       "OP-ROWS: rows names a source row in [0, batch_size) for each batch row (repeats allowed)",
                       error=lambda self, rows: found(_rows_error("reorder", rows, self.config.batch_size,
                                                                  distinct=False, length=self.config.batch_size)),
                       enabled=True)
    def reorder(self, rows: Sequence[int]) -> None:
        """Batch row b becomes row rows[b] (beam search's beam_idx, transformers' reorder_cache)."""
        self._take(rows)

    @icontract.require(lambda times: is_int(times) and times >= 1, "OP-ROWS: times is an int >= 1",
                       error=lambda times: ArgumentValueError("OP-ROWS", "times", "must be an int >= 1 (bool is "
                                                              "not an int here)", value=times), enabled=True)
    def repeat(self, times: int) -> None:
        """Each batch row `times` times in a row (transformers' batch_repeat_interleave, as beams start)."""
        self._take([row for row in range(self.config.batch_size) for _ in range(times)])

    def _extend_error(self, other: Any) -> Optional[KVCacheError]:
        if type(other) is not type(self):
            return ArgumentTypeError("OP-ROWS", "other", f"must be a {type(self).__name__}", type=type(other).__name__)
        if other is self:
            return ArgumentValueError("OP-ROWS", "other", "must be another cache (a cache's own rows: repeat)")
        if replace(other.config, batch_size=1) != replace(self.config, batch_size=1):
            return ArgumentValueError("OP-ROWS", "other", "must have this cache's config but for batch_size")
        step = self._step   # type: ignore[attr-defined]   # an open step of this cache is abandoned first (OP-STEP)
        mine = step.start if step is not None else self._layout.length()   # type: ignore[attr-defined]
        theirs = other._layout.length()   # type: ignore[attr-defined]
        if mine != theirs or other._step is not None:   # type: ignore[attr-defined]
            return StepError("OP-ROWS", "other", "must hold the same positions and no open step (rows of different "
                                                 "lengths differ by their pads)", held=mine, other=theirs)
        return None

    @icontract.require(lambda self, other: self._extend_error(other) is None,
                       "OP-ROWS: other is another cache of this config (but batch_size) holding the same positions",
                       error=lambda self, other: found(self._extend_error(other)), enabled=True)
    def extend(self, other: Any) -> None:
        """Append other's batch rows, each with its own history and pads (mlx-lm's extend, merge); other is
        unchanged."""
        self._abandon()   # type: ignore[attr-defined]
        pools, theirs = self._pools, other._pools   # type: ignore[attr-defined]
        mine_pads, their_pads = self.pads(), other.pads()
        for layer in range(self.config.n_layers):
            rows = max(pools.k[layer].shape[2], theirs.k[layer].shape[2])
            pools.k[layer] = np.concatenate([_grown(pools.k[layer], rows), _grown(theirs.k[layer], rows)])
            pools.v[layer] = np.concatenate([_grown(pools.v[layer], rows), _grown(theirs.v[layer], rows)])
        self._pads = mine_pads + their_pads if any(mine_pads + their_pads) else ()
        self.config = replace(self.config, batch_size=self.config.batch_size + other.config.batch_size)
        pools.config = self.config

    @icontract.require(lambda self, row: _rows_error("extract", [row], self.config.batch_size, distinct=True,
                                                     length=None, argument="row") is None,
                       "OP-ROWS: row is an int in [0, batch_size)",
                       error=lambda self, row: found(_rows_error("extract", [row], self.config.batch_size,
                                                                 distinct=True, length=None, argument="row")), enabled=True)
    @icontract.ensure(lambda result: result.config.batch_size == 1, "OP-ROWS: a cache of one batch row")
    def extract(self, row: int) -> Any:
        """Batch row `row` as a cache of its own (batch 1, its history and pads); this cache unchanged. An open
        step is not carried over (the copy is abandoned, this cache's step stays open)."""
        out = copy.deepcopy(self)
        out._take([row])
        return out


def _grown(array: Any, rows: int) -> Any:
    """A layer's K or V with zero rows appended up to `rows` (DYNAMIC sizing may have grown one cache further)."""
    if array.shape[2] >= rows:
        return array
    pad = np.zeros(array.shape[:2] + (rows - array.shape[2],) + array.shape[3:], dtype=array.dtype)
    return np.concatenate([array, pad], axis=2)
