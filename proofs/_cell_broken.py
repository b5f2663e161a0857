"""Broken-on-purpose cell caches: the bug classes the cell layout is known for, one per class.

Each is a `kvcache.CellCache` subclass that overrides one private body (never a public, contracted
method, so the reference's contracts stay wrapped around the bug), and `BROKEN` maps a name to its
factory `(config, max_seqs=64) -> CellCache`, usable anywhere a cell factory is taken.

Two ways to see each bug:
- with assertions on (`__debug__`), the reference's own contracts raise `icontract.ViolationError` at
  the first call that goes wrong, citing the rule (tests/test_cell_cache.py::test_broken_*);
- under `python -O` the contracts are compiled out (the typed preconditions stay) and the variant
  answers wrongly without complaint, which is what a model-based checker has to find by comparing
  answers and masks (the same tests show each wrong answer in a subprocess).
"""

from __future__ import annotations

from typing import Callable, Optional

from kvcache import MAX_SEQS, CacheConfig, CellCache, CellStep, LayerConfig, LayerPolicy


class StaleOwnerBit(CellCache):
    """Stale owner bit: seq_rm forgets to clear the sequence's bit on a cell another sequence shares."""

    def _drop(self, seq_id: int, p0: int, p1: int) -> None:
        bit = 1 << seq_id
        shared = [j for j, (p, owners) in enumerate(zip(self._pos, self._owners))
                  if owners & bit and owners != bit and p0 <= p < p1]
        super()._drop(seq_id, p0, p1)
        for j in shared:  # the bug: the count drops, the bit stays
            self._owners[j] |= bit


class ForkPastCut(CellCache):
    """Fork sharing past the cut: seq_clone(src, upto) shares src's cell at position upto too (<=, not <)."""

    def _share(self, src: int, fork: int, upto: Optional[int]) -> None:
        super()._share(src, fork, None if upto is None else upto + 1)


class RmOffByOne(CellCache):
    """Off-by-one removal at p1: seq_rm(s, p0, p1) removes [p0, p1] instead of [p0, p1)."""

    def _drop(self, seq_id: int, p0: int, p1: int) -> None:
        super()._drop(seq_id, p0, p1 + 1)


class StaleMemoMask(CellCache):
    """Stale memoized mask after a verb: steps are memoized by (window, declaration, positions) across
    forwards and never invalidated by seq_rm / seq_clone, so a repeated step gets the old table's mask."""

    def _build_step(self, window: Optional[int]) -> CellStep:
        memo: dict[object, CellStep] = self.__dict__.setdefault("_memo_across_forwards", {})
        key = (window, self._declared, self._positions)
        if key not in memo:
            memo[key] = super()._build_step(window)
        return memo[key]


class IdReusedWhileOwned(CellCache):
    """Id reused while a cell still carries it: a seq_rm from position 0 retires the id even when the
    sequence still owns cells at or after p1, so seq_new hands it out with those cells attached."""

    def _drop(self, seq_id: int, p0: int, p1: int) -> None:
        super()._drop(seq_id, p0, p1)
        if p0 == 0:
            self._live &= ~(1 << seq_id)


def _factory(cls: type[CellCache]) -> Callable[..., CellCache]:
    def make(config: CacheConfig, max_seqs: int = MAX_SEQS) -> CellCache:
        return cls(config, max_seqs)
    make.__doc__ = cls.__doc__
    make.__name__ = cls.__name__
    make.kvcache_layout = "cell"  # type: ignore[attr-defined]  # a conformance target of the cell layout
    return make


stale_owner_bit = _factory(StaleOwnerBit)
fork_past_cut = _factory(ForkPastCut)
rm_off_by_one = _factory(RmOffByOne)
stale_memo_mask = _factory(StaleMemoMask)
id_reused_while_owned = _factory(IdReusedWhileOwned)

BROKEN: dict[str, Callable[..., CellCache]] = {
    "stale_owner_bit": stale_owner_bit,
    "fork_past_cut": fork_past_cut,
    "rm_off_by_one": rm_off_by_one,
    "stale_memo_mask": stale_memo_mask,
    "id_reused_while_owned": id_reused_while_owned,
}


# --- minimal programs: each shows its variant's bug in a few calls -------------------------------------
# A program takes a cell-cache factory and returns what a caller observes; on the reference it returns
# the answer the rules give (computed by hand in the comments), on its variant something else (or, with
# the contracts on, the variant raises icontract.ViolationError inside the program).

def _cache(factory: Callable[..., CellCache]) -> CellCache:
    return factory(CacheConfig(8, 1, [LayerConfig(LayerPolicy.flat())]), 4)


def _prompt(c: CellCache, n: int) -> int:
    s = c.seq_new()
    assert s is not None
    _forward(c, [s] * n, list(range(n)))
    return s


def _forward(c: CellCache, seq_ids: list[int], positions: list[int]) -> str:
    """One forward on the single flat layer; the mask rows as '0'/'1' strings joined by '|'."""
    if not c.declare_step(seq_ids):
        raise RuntimeError("refused")
    step = c.place_step(0, positions)
    return "|".join("".join(str(b) for b in step.mask_bits[i * step.read_len:(i + 1) * step.read_len])
                    for i in range(step.length))


def program_stale_owner_bit(factory: Callable[..., CellCache]) -> object:
    c = _cache(factory)
    s = _prompt(c, 3)                       # cells 0..2
    c.seq_clone(s)                          # a fork co-owns cells 0..2
    c.seq_rm(s, 0, 2)                       # s keeps cell 2 only
    return _forward(c, [s], [3])            # reference: "0011" (cell 2 and its own cell 3)


def program_fork_past_cut(factory: Callable[..., CellCache]) -> object:
    c = _cache(factory)
    s = _prompt(c, 3)
    f = c.seq_clone(s, 1)                   # shares position 0 only
    assert f is not None
    return c.seq_len(f), _forward(c, [f], [2])   # reference: (1, "1001")


def program_rm_off_by_one(factory: Callable[..., CellCache]) -> object:
    c = _cache(factory)
    s = _prompt(c, 4)
    c.seq_rm(s, 1, 3)                       # positions 1 and 2 leave; 0 and 3 stay
    return c.seq_len(s), _forward(c, [s], [4])   # reference: (2, "1101"): cell 1 reused, cell 3 kept


def program_stale_memo_mask(factory: Callable[..., CellCache]) -> object:
    c = _cache(factory)
    s = _prompt(c, 4)                       # cells 0..3
    _forward(c, [s], [4])                   # cell 4
    c.seq_rm(s, 4)                          # roll position 4 back ...
    c.seq_rm(s, 0, 1)                       # ... and drop position 0: cell 0 is free
    return _forward(c, [s], [4])            # the same step again; reference: "1111" (in cell 0, 4 cells read)


def program_id_reused_while_owned(factory: Callable[..., CellCache]) -> object:
    c = _cache(factory)
    s = _prompt(c, 4)                       # cells 0..3
    c.seq_rm(s, 0, 2)                       # s keeps positions 2, 3: still live
    t = c.seq_new()                         # reference: 1 (s is live)
    assert t is not None
    return t, _forward(c, [t], [4])         # reference: (1, "1000"): only its own cell 0


PROGRAMS: dict[str, Callable[[Callable[..., CellCache]], object]] = {
    "stale_owner_bit": program_stale_owner_bit,
    "fork_past_cut": program_fork_past_cut,
    "rm_off_by_one": program_rm_off_by_one,
    "stale_memo_mask": program_stale_memo_mask,
    "id_reused_while_owned": program_id_reused_while_owned,
}
