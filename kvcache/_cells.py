"""The cell layout: many sequences over one pool of per-token cells (upstream PR #21902's `CellCache`).

`CellCache` is the controller (its handoff to the backend, `CellStep`, is a value type in `_types`), the
engineered way upstream builds it: per cell a position (FREE = -1) and an owner bitset, per sequence
id its cell count and newest position, the live ids as a bitset, the cells of one forward's placement
and one memoized step per window. The executable model (`kvcache_spec`) is the brute-force one; this
module never calls it. Its contracts restate the layout's promises from the table alone (small pure
helpers such as `mask_by_formula`), never through the code that computes the answers.

Preconditions validate the caller's input, raise a typed `KVCacheError` naming the argument and the
rule before the body runs (so the state is untouched), and stay enabled under `python -O`.
Postconditions and class invariants check this implementation and follow `__debug__`.
The order of the checks, when several fail at once: the arguments' types and ranges (ARG-INT,
ARG-RANGE, LAYER-RANGE, CELL-SEQ-ID, CELL-DECLARE, CELL-POS, CELL-RM for p1 < p0), then the forward
protocol (CELL-FORWARD), then liveness (CELL-SEQ-LIVE), then the positions' order (CELL-POS).

Why the table is as long as the used extent, not the capacity: cells at and past used_end() are free by
CELL-USED-END, so they need no entry, and a capacity up to INT_MAX (a valid config) allocates nothing
up front. Placing a token past the end appends its cell; removals trim the free tail.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, TypeVar

import icontract

from ._cell_table import (FREE, MAX_POSITION, MAX_SEQS, _positions_unique_per_seq, _State, _Table, declared_in,
                          lowest_free_by_formula, mask_by_formula, others_view, owned_cells, placed_only_free_cells)
from ._errors import ArgumentTypeError, ArgumentValueError, ConfigTypeError, ForwardError, KVCacheError, StepError, \
    not_an_int, out_of_range
from ._faces import BatchControl, CacheBase, CellStepper, returns_self
from ._ints import INT_MAX, in_range, is_int
from ._layers import layer_in_range, layer_is_int
from ._types import CacheConfig, CellStep, Kind


# --- CellCache ---------------------------------------------------------------------------------------

def _books_agree(self: CellCache) -> bool:
    """CELL-OWNERS: each id's count and newest position are those of the cells it owns (one pass)."""
    count, newest = [0] * self.max_seqs, [FREE] * self.max_seqs
    for p, owners in zip(self._pos, self._owners):
        for s in _bits(owners):
            if s >= self.max_seqs:
                return False
            count[s] += 1
            newest[s] = max(newest[s], p)
    return count == self._count and newest == self._newest


def _cells_well_formed(self: CellCache) -> bool:
    """CELL-OWNERS: a free cell has no owner; an occupied cell has an owner and a position in [0, MAX_POSITION].

    The bound is CELL-POS's (a token's position is at most INT_MAX - 1), not INT_MAX: with INT_MAX the
    invariants admitted a cell at position INT_MAX, from which next_pos answers INT_MAX + 1 (the CrossHair
    gate's counterexample to "CELL-POS: next_pos fits an int"); no call reaches such a state, and now the
    invariants say so."""
    return len(self._pos) == len(self._owners) and all(
        (p == FREE and o == 0) or (0 <= p <= MAX_POSITION and o != 0) for p, o in zip(self._pos, self._owners))


def _forward_consistent(self: CellCache) -> bool:
    """CELL-FORWARD: the open forward is one declaration, at most one placement and the layers served."""
    declared, positions, cells = self._declared, self._positions, self._cells
    if declared is None:
        return positions is None and cells is None and not self._served and not self._steps
    if not declared or not all(self._live >> s & 1 for s in declared):
        return False
    if positions is None or cells is None:
        return positions is None and cells is None and not self._served and not self._steps
    return (len(positions) == len(cells) == len(declared) and len(set(cells)) == len(cells)
            and all(c < len(self._pos) and self._pos[c] == q and self._owners[c] == 1 << s
                    for s, q, c in zip(declared, positions, cells))
            and self._served <= set(range(self.n_layers)) and 0 < len(self._served) < self.n_layers
            and set(self._steps) <= {self._layer_window[layer] for layer in self._served})


def _step_agrees(self: CellCache, window: Optional[int], step: CellStep) -> bool:
    """CELL-STEP-SHAPE, CELL-MASK: a step of the open forward matches the table as it is now."""
    declared, positions, cells = self._declared, self._positions, self._cells
    if declared is None or positions is None or cells is None:
        return False
    return (step.length == len(declared) and step.read_len == len(self._pos) and step.cells == cells
            and step.mask_bits == mask_by_formula(self._pos, self._owners, declared, positions, window,
                                                  step.read_len))


# --- typed errors ------------------------------------------------------------------------------------
# The validators of the preconditions below return None for valid input, else a `_Fault`: a builder of the
# typed error, not the error itself. The precondition asks only `... is None`; icontract's `error=` builds
# the error (`_found`). Why deferred: building an error formats the offending value (its repr), and
# under the CrossHair gate that value is symbolic - formatting it realises it, one path per value outside
# the valid range (measured on seq_len: over 1000 paths and the 60 s CPU safety net for every condition,
# against at most a few hundred paths once the precondition no longer formats). The rule checked, its
# order and the error raised are the same.
_Fault = Callable[[], KVCacheError]


def _seq_id_error(self: CellCache, argument: str, value: Any) -> Optional[_Fault]:
    """CELL-SEQ-ID: the typed error for a seq id argument that is not an int in [0, max_seqs), else None."""
    if not is_int(value):
        return lambda: ArgumentTypeError("CELL-SEQ-ID", argument, "must be an int (bool is not an int here)",
                                         value=value, type=type(value).__name__)
    if not 0 <= value < self.max_seqs:
        return lambda: ArgumentValueError("CELL-SEQ-ID", argument, f"must lie in [0, {self.max_seqs})", value=value)
    return None


def _found(fault: Optional[_Fault]) -> KVCacheError:
    """The error a failed precondition found: its condition is `..._error(...) is None`, so never None here."""
    if fault is None:
        raise RuntimeError("a precondition failed without naming its error")
    return fault()


def _not_live(self: CellCache, argument: str, value: int) -> ArgumentValueError:
    return ArgumentValueError("CELL-SEQ-LIVE", argument, "is not a live sequence", value=value,
                              live=sorted(_bits(self._live)))


def _forward_open(self: CellCache, verb: str) -> ForwardError:
    return ForwardError("CELL-FORWARD", verb, "would change the table while a forward is open (serve every "
                                              "layer first, or clear())",
                        declared=self._declared, served=sorted(self._served), n_layers=self.n_layers)


def _seq_ids_error(self: CellCache, seq_ids: Any) -> Optional[_Fault]:
    """CELL-DECLARE, CELL-SEQ-ID: declare_step takes a non-empty list or tuple of seq ids."""
    if type(seq_ids) not in (list, tuple):  # exactly: a subclass could iterate differently after the check
        return lambda: ArgumentTypeError("CELL-DECLARE", "seq_ids", "must be a list or tuple of seq ids",
                                         value=seq_ids, type=type(seq_ids).__name__)
    for index, seq_id in enumerate(seq_ids):
        fault = _seq_id_error(self, f"seq_ids[{index}]", seq_id)
        if fault is not None:
            return fault
    if not seq_ids:
        return lambda: ArgumentValueError("CELL-DECLARE", "seq_ids",
                                          "must not be empty (a step has at least one token)", value=seq_ids)
    return None


def _positions_type_error(positions: Any) -> Optional[_Fault]:
    """CELL-POS: positions is a list or tuple of ints in [0, MAX_POSITION]."""
    if type(positions) not in (list, tuple):  # exactly: a subclass could iterate differently after the check
        return lambda: ArgumentTypeError("CELL-POS", "positions", "must be a list or tuple of ints", value=positions,
                                         type=type(positions).__name__)
    for index, position in enumerate(positions):
        # Each fault is returned at once, so its lambda sees this iteration's index and position.
        if not is_int(position):
            return lambda: ArgumentTypeError("CELL-POS", f"positions[{index}]",
                                             "must be an int (bool is not an int here)",
                                             value=position, type=type(position).__name__)
        if not in_range(position, 0, MAX_POSITION):
            return lambda: ArgumentValueError("CELL-POS", f"positions[{index}]",
                                              f"must lie in [0, {MAX_POSITION}] (INT_MAX - 1, so next_pos fits an int)",
                                              value=position)
    return None


def _forward_error(self: CellCache, layer: int, positions: Sequence[int]) -> Optional[_Fault]:
    """CELL-FORWARD, CELL-POS: place_step fits the open forward (its arguments' types already checked)."""
    declared = self._declared
    if declared is None:
        return lambda: ForwardError("CELL-FORWARD", "place_step", "no step is declared (declare_step first)",
                                    layer=layer)
    if layer in self._served:
        return lambda: ForwardError("CELL-FORWARD", "layer", "was already served in this forward", layer=layer,
                                    served=sorted(self._served))
    if len(positions) != len(declared):
        return lambda: StepError("CELL-POS", "positions", "must hold one position per declared token",
                                 length=len(positions), declared=len(declared))
    if self._positions is not None:
        placed = self._positions
        if tuple(positions) != placed:
            return lambda: ForwardError("CELL-FORWARD", "positions",
                                        "differ from the positions the forward was placed at",
                                        positions=list(positions), placed=list(placed))
        return None
    newest = {s: self._newest[s] for s in set(declared)}
    for index, (s, q) in enumerate(zip(declared, positions)):
        if q <= newest[s]:
            held = newest[s]
            return lambda: StepError("CELL-POS", f"positions[{index}]", "must be newer than every position its "
                                     "sequence holds and than its earlier tokens in this step",
                                     value=q, seq_id=s, newest=held)
        newest[s] = q
    return None


def _bits(mask: int) -> list[int]:
    """The ids whose bit is set in `mask`, lowest first."""
    return [s for s in range(mask.bit_length()) if mask >> s & 1]


def _lowest_clear_bit(mask: int) -> int:
    """The lowest id whose bit is clear in `mask`."""
    return (~mask & (mask + 1)).bit_length() - 1


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _state_of(self: CellCache) -> _State:
    return self._state()


def _none_iff_every_id_live(self: CellCache, OLD: Any, result: Optional[int]) -> bool:
    """CELL-NEW, CELL-FORK: a new id is refused (None) exactly when every id was live."""
    return bool((result is None) == (OLD.state[0][4] == (1 << self.max_seqs) - 1))


def _refusal_changes_nothing(self: CellCache, OLD: Any, result: Optional[int]) -> bool:
    """CELL-ATOMIC: a refused seq_new or seq_clone leaves the state as it was."""
    return result is not None or self._state() == OLD.state


def _takes_lowest_free_id(rule: str, verb: str) -> Callable[[_Method], _Method]:
    """The contracts seq_new and seq_clone share (`rule` is CELL-NEW or CELL-FORK): the state before is
    snapshotted as OLD.state for the method's own postconditions below this decorator, the answer is
    None exactly when every id is live, and a refusal changes nothing (CELL-ATOMIC). Named functions,
    not lambdas: icontract and CrossHair read a lambda's text from the decorator line it is written on."""
    contracts = (icontract.snapshot(_state_of, name="state"),
                 icontract.ensure(_none_iff_every_id_live, f"{rule}: None exactly when every id is live"),
                 icontract.ensure(_refusal_changes_nothing, f"CELL-ATOMIC: a refused {verb} changes nothing"))

    def decorate(method: _Method) -> _Method:
        for contract in reversed(contracts):
            method = contract(method)
        return method
    return decorate


def _max_seqs_error(max_seqs: Any) -> KVCacheError:
    if not is_int(max_seqs):
        return ArgumentTypeError("CELL-MAX-SEQS", "max_seqs", "must be an int (bool is not an int here)",
                                 value=max_seqs, type=type(max_seqs).__name__)
    return ArgumentValueError("CELL-MAX-SEQS", "max_seqs", f"must lie in [1, {MAX_SEQS}]", value=max_seqs)


@icontract.invariant(lambda self: _cells_well_formed(self),
                     "CELL-OWNERS: a free cell has no owner; an occupied cell has an owner and a position")
@icontract.invariant(lambda self: _positions_unique_per_seq(self._pos, self._owners),
                     "CELL-OWNERS: a sequence never owns two cells of one position")
@icontract.invariant(lambda self: _books_agree(self),
                     "CELL-OWNERS: seq_len and next_pos are the count and newest position of the cells owned")
@icontract.invariant(lambda self: self._live >> self.max_seqs == 0, "CELL-MAX-SEQS: live ids lie in [0, max_seqs)")
@icontract.invariant(lambda self: all(o & ~self._live == 0 for o in self._owners),
                     "CELL-ID-REUSE: no cell carries an id that is not live")
@icontract.invariant(lambda self: all(self._count[s] == 0 for s in range(self.max_seqs) if not self._live >> s & 1),
                     "CELL-OWNERS, CELL-ID-REUSE: live ids and owned cells agree: an id that is not live owns nothing")
@icontract.invariant(lambda self: len(self._pos) <= self._capacity and (not self._pos or self._pos[-1] != FREE),
                     "CELL-USED-END: the used extent covers every occupied cell and is tight")
@icontract.invariant(lambda self: self._occupied == sum(1 for p in self._pos if p != FREE),
                     "CELL-USED-END: free_cells is capacity minus the occupied cells")
@icontract.invariant(lambda self: _forward_consistent(self),
                     "CELL-FORWARD: one declaration, at most one placement, the layers served so far")
@icontract.invariant(lambda self: all(_step_agrees(self, window, step) for window, step in self._steps.items()),
                     "CELL-STEP-SHAPE, CELL-MASK: every memoized step agrees with the table")
class CellCache(CacheBase, BatchControl, CellStepper):
    """Many sequences over one pool of `capacity` per-token cells, shared by every layer.

    The runner declares which sequence each token of the next forward belongs to (`declare_step`), the
    backend asks each layer's `place_step(layer, positions)`; the first layer places the tokens in the
    lowest free cells, every layer gets the cells and the mask of its window. Between forwards the
    runner creates, forks and trims sequences (`seq_new`, `seq_clone`, `seq_rm`).

    Not thread-safe by design, like the sequence cache.
    """

    kvcache_layout = "cell"   # the conformance suite drives `python:kvcache:CellCache` as a cell cache

    @icontract.require(lambda max_seqs: is_int(max_seqs) and 1 <= max_seqs <= MAX_SEQS,
                       "CELL-MAX-SEQS: max_seqs is an int in [1, 64]", error=_max_seqs_error, enabled=True)
    @icontract.require(lambda config: isinstance(config, CacheConfig), "CFG-TYPE: config is a CacheConfig",
                       error=lambda config: ConfigTypeError("CFG-TYPE", "config", "must be a CacheConfig",
                                                            value=config),
                       enabled=True)
    def __init__(self, config: CacheConfig, max_seqs: int = MAX_SEQS) -> None:
        config = dataclasses.replace(config)  # re-runs the CFG-* checks on a config tampered with after creation
        self.config = config
        self.n_layers = config.n_layers
        self.max_seqs = max_seqs
        self._capacity = config.capacity
        # CELL-MASK: a ring layer masks to its window (in positions, CELL-WINDOW-POS); a flat one does not.
        self._layer_window: tuple[Optional[int], ...] = tuple(
            config.layer(i).policy.window if config.layer(i).policy.kind is Kind.RING else None
            for i in range(config.n_layers))
        # The table (as long as the used extent).
        self._pos: list[int] = []
        self._owners: list[int] = []
        self._occupied = 0
        # Per sequence id.
        self._count = [0] * max_seqs
        self._newest = [FREE] * max_seqs
        self._live = 0
        # The open forward.
        self._declared: Optional[tuple[int, ...]] = None
        self._positions: Optional[tuple[int, ...]] = None
        self._cells: Optional[tuple[int, ...]] = None
        self._served: frozenset[int] = frozenset()
        self._steps: dict[Optional[int], CellStep] = {}

    def __delattr__(self, name: str) -> None:
        """Deleting an attribute would break the invariants behind the API's back, so it is refused.

        :raises AttributeError: always
        """
        raise AttributeError(f"CellCache.{name} cannot be deleted")

    # --- state as values (snapshots for the contracts) --------------------------------------------------

    def _table(self) -> _Table:
        return (tuple(self._pos), tuple(self._owners), tuple(self._count), tuple(self._newest), self._live,
                self._occupied)

    def _state(self) -> _State:
        return (self._table(), (self._declared, self._positions, self._cells, self._served,
                                tuple(self._steps.items())))

    # --- queries ------------------------------------------------------------------------------------------

    @icontract.require(lambda n: 0 <= n <= INT_MAX, "ARG-RANGE: 0 <= n <= INT_MAX",
                       error=lambda n: out_of_range("n", n, 0), enabled=True)
    @icontract.require(lambda n: is_int(n), "ARG-INT: n is an int", error=lambda n: not_an_int("n", n), enabled=True)
    @icontract.ensure(lambda self, n, result: result == (n <= self._capacity - self._occupied),
                      "CELL-USED-END: can_extend(n) iff n <= free_cells()")
    def can_extend(self, n: int = 1) -> bool:
        return n <= self._capacity - self._occupied

    def capacity(self) -> int:
        return self._capacity

    @icontract.ensure(lambda self, result: result == self._capacity - sum(1 for p in self._pos if p != FREE),
                      "CELL-USED-END: free_cells() is capacity minus the occupied cells")
    def free_cells(self) -> int:
        return self._capacity - self._occupied

    @icontract.ensure(lambda self, result: result == 1 + max((j for j, p in enumerate(self._pos) if p != FREE),
                                                             default=-1),
                      "CELL-USED-END: used_end() is one past the highest occupied cell (0 when none)")
    def used_end(self) -> int:
        return len(self._pos)

    @icontract.ensure(lambda self, result: all(self._live >> s & 1 for s in result)
                      and len(result) == bin(self._live).count("1"), "CELL-SEQ-LIVE: the live ids")
    def live(self) -> frozenset[int]:
        return frozenset(_bits(self._live))

    @icontract.require(lambda self, seq_id: self._live >> seq_id & 1, "CELL-SEQ-LIVE: seq_id is live",
                       error=lambda self, seq_id: _not_live(self, "seq_id", seq_id), enabled=True)
    @icontract.require(lambda self, seq_id: _seq_id_error(self, "seq_id", seq_id) is None,
                       "CELL-SEQ-ID: seq_id is an int in [0, max_seqs)",
                       error=lambda self, seq_id: _found(_seq_id_error(self, "seq_id", seq_id)), enabled=True)
    @icontract.ensure(lambda self, seq_id, result: result == len(owned_cells(self._table(), seq_id)),
                      "CELL-OWNERS: seq_len is the number of cells the sequence owns")
    def seq_len(self, seq_id: int) -> int:
        return self._count[seq_id]

    @icontract.require(lambda self, seq_id: self._live >> seq_id & 1, "CELL-SEQ-LIVE: seq_id is live",
                       error=lambda self, seq_id: _not_live(self, "seq_id", seq_id), enabled=True)
    @icontract.require(lambda self, seq_id: _seq_id_error(self, "seq_id", seq_id) is None,
                       "CELL-SEQ-ID: seq_id is an int in [0, max_seqs)",
                       error=lambda self, seq_id: _found(_seq_id_error(self, "seq_id", seq_id)), enabled=True)
    @icontract.ensure(lambda self, seq_id, result: result == 1 + max(owned_cells(self._table(), seq_id).values(),
                                                                     default=-1),
                      "CELL-OWNERS: next_pos is one past the newest position owned (0 when none)")
    @icontract.ensure(lambda result: 0 <= result <= INT_MAX, "CELL-POS: next_pos fits an int")
    def next_pos(self, seq_id: int) -> int:
        return self._newest[seq_id] + 1

    # --- the runner's verbs -----------------------------------------------------------------------------

    @icontract.require(lambda self, seq_ids: all(self._live >> s & 1 for s in seq_ids),
                       "CELL-SEQ-LIVE: every declared id is live",
                       error=lambda self, seq_ids: next(_not_live(self, f"seq_ids[{i}]", s)
                                                        for i, s in enumerate(seq_ids) if not self._live >> s & 1),
                       enabled=True)
    @icontract.require(lambda self: self._declared is None, "CELL-FORWARD: no forward is open",
                       error=lambda self: _forward_open(self, "declare_step"), enabled=True)
    @icontract.require(lambda self, seq_ids: _seq_ids_error(self, seq_ids) is None,
                       "CELL-DECLARE, CELL-SEQ-ID: a non-empty list or tuple of seq ids",
                       error=lambda self, seq_ids: _found(_seq_ids_error(self, seq_ids)), enabled=True)
    @icontract.snapshot(lambda self: self._state(), name="state")
    @icontract.ensure(lambda self, OLD, seq_ids, result: result == (len(seq_ids) <= self._capacity - OLD.state[0][5]),
                      "CELL-DECLARE: refused exactly when the tokens outnumber the free cells")
    @icontract.ensure(lambda self, OLD, result: result or self._state() == OLD.state,
                      "CELL-ATOMIC: a refused declaration changes nothing")
    @icontract.ensure(lambda self, OLD, seq_ids, result: not result or (
        self._table() == OLD.state[0] and self._declared == tuple(seq_ids) and self._positions is None),
                      "CELL-DECLARE: an accepted declaration opens a forward and leaves the table as it was")
    def declare_step(self, seq_ids: Sequence[int]) -> bool:
        if len(seq_ids) > self._capacity - self._occupied:
            return False
        self._declared = tuple(seq_ids)
        return True

    @icontract.require(lambda self: self._declared is None, "CELL-FORWARD: no forward is open",
                       error=lambda self: _forward_open(self, "seq_new"), enabled=True)
    @_takes_lowest_free_id("CELL-NEW", "seq_new")
    @icontract.ensure(lambda self, OLD, result: result is None or (
        result == _lowest_clear_bit(OLD.state[0][4]) and self._live == OLD.state[0][4] | 1 << result
        and self._count[result] == 0 and tuple(self._pos) == OLD.state[0][0]
        and tuple(self._owners) == OLD.state[0][1]),
                      "CELL-NEW: the lowest id not live becomes live with an empty history; no cell changes")
    def seq_new(self) -> Optional[int]:
        seq_id = self._free_id()
        if seq_id is not None:
            self._live |= 1 << seq_id
        return seq_id

    @icontract.require(lambda self, src: self._live >> src & 1, "CELL-SEQ-LIVE: src is live",
                       error=lambda self, src: _not_live(self, "src", src), enabled=True)
    @icontract.require(lambda self: self._declared is None, "CELL-FORWARD: no forward is open",
                       error=lambda self: _forward_open(self, "seq_clone"), enabled=True)
    @icontract.require(lambda upto: upto is None or 0 <= upto <= INT_MAX, "ARG-RANGE: upto is None or in [0, INT_MAX]",
                       error=lambda upto: out_of_range("upto", upto, 0), enabled=True)
    @icontract.require(lambda upto: upto is None or is_int(upto), "ARG-INT: upto is None or an int",
                       error=lambda upto: not_an_int("upto", upto), enabled=True)
    @icontract.require(lambda self, src: _seq_id_error(self, "src", src) is None,
                       "CELL-SEQ-ID: src is an int in [0, max_seqs)",
                       error=lambda self, src: _found(_seq_id_error(self, "src", src)), enabled=True)
    @_takes_lowest_free_id("CELL-FORK", "seq_clone")
    @icontract.ensure(lambda self, OLD, src, upto, result: result is None or (
        result == _lowest_clear_bit(OLD.state[0][4]) and self._live == OLD.state[0][4] | 1 << result
        and owned_cells(self._table(), result) == {j: p for j, p in owned_cells(OLD.state[0], src).items()
                                                    if upto is None or p < upto}),
                      "CELL-FORK: the lowest free id, sharing exactly src's cells below upto")
    @icontract.ensure(lambda self, OLD, result: result is None or (
        tuple(self._pos) == OLD.state[0][0] and others_view(self._table(), result) == others_view(OLD.state[0], result)),
                      "CELL-FORK: nothing is copied or placed; every other sequence keeps its cells")
    def seq_clone(self, src: int, upto: Optional[int] = None) -> Optional[int]:
        fork = self._free_id()
        if fork is not None:
            self._share(src, fork, upto)
            self._live |= 1 << fork
        return fork

    @icontract.require(lambda self, seq_id: self._live >> seq_id & 1, "CELL-SEQ-LIVE: seq_id is live",
                       error=lambda self, seq_id: _not_live(self, "seq_id", seq_id), enabled=True)
    @icontract.require(lambda self: self._declared is None, "CELL-FORWARD: no forward is open",
                       error=lambda self: _forward_open(self, "seq_rm"), enabled=True)
    @icontract.require(lambda p0, p1: p1 is None or p0 <= p1, "CELL-RM: p0 <= p1",
                       error=lambda p0, p1: ArgumentValueError("CELL-RM", "p1", "must be None or >= p0", p0=p0, p1=p1),
                       enabled=True)
    @icontract.require(lambda p1: p1 is None or 0 <= p1 <= INT_MAX, "ARG-RANGE: p1 is None or in [0, INT_MAX]",
                       error=lambda p1: out_of_range("p1", p1, 0), enabled=True)
    @icontract.require(lambda p1: p1 is None or is_int(p1), "ARG-INT: p1 is None or an int",
                       error=lambda p1: not_an_int("p1", p1), enabled=True)
    @icontract.require(lambda p0: 0 <= p0 <= INT_MAX, "ARG-RANGE: p0 in [0, INT_MAX]",
                       error=lambda p0: out_of_range("p0", p0, 0), enabled=True)
    @icontract.require(lambda p0: is_int(p0), "ARG-INT: p0 is an int", error=lambda p0: not_an_int("p0", p0),
                       enabled=True)
    @icontract.require(lambda self, seq_id: _seq_id_error(self, "seq_id", seq_id) is None,
                       "CELL-SEQ-ID: seq_id is an int in [0, max_seqs)",
                       error=lambda self, seq_id: _found(_seq_id_error(self, "seq_id", seq_id)), enabled=True)
    @icontract.snapshot(lambda self: self._state(), name="state")
    @icontract.ensure(lambda result: result is True, "CELL-RM: seq_rm answers True")
    @icontract.ensure(lambda self, OLD, seq_id, p0, p1: owned_cells(self._table(), seq_id) == {
        j: p for j, p in owned_cells(OLD.state[0], seq_id).items() if not (p0 <= p and (p1 is None or p < p1))},
                      "CELL-RM: the sequence keeps exactly its cells outside [p0, p1)")
    @icontract.ensure(lambda self, OLD, seq_id: others_view(self._table(), seq_id) == others_view(OLD.state[0], seq_id),
                      "CELL-RM: every other sequence keeps its cells and their positions (a shared cell stays)")
    @icontract.ensure(lambda self, seq_id: bool(self._live >> seq_id & 1) == (self._count[seq_id] > 0),
                      "CELL-RM: the sequence stays live iff it still owns a cell")
    def seq_rm(self, seq_id: int, p0: int, p1: Optional[int] = None) -> bool:
        self._drop(seq_id, p0, INT_MAX + 1 if p1 is None else p1)
        self._trim()
        if self._count[seq_id] == 0:
            self._live &= ~(1 << seq_id)
        return True

    @icontract.ensure(lambda self: self._state() == (((), (), (0,) * self.max_seqs, (FREE,) * self.max_seqs, 0, 0),
                                                     (None, None, None, frozenset(), ())),
                      "CELL-CLEAR: every cell free, no id live, no open forward")
    def clear(self) -> None:
        self._pos, self._owners, self._occupied = [], [], 0
        self._count = [0] * self.max_seqs
        self._newest = [FREE] * self.max_seqs
        self._live = 0
        self._close_forward()

    # --- the backend's face -----------------------------------------------------------------------------

    @icontract.require(lambda self, layer, positions: _forward_error(self, layer, positions) is None,
                       "CELL-FORWARD, CELL-POS: a declared forward, a layer not yet served, positions that fit",
                       error=lambda self, layer, positions: _found(_forward_error(self, layer, positions)), enabled=True)
    @icontract.require(lambda positions: _positions_type_error(positions) is None,
                       "CELL-POS: positions is a list or tuple of ints in [0, MAX_POSITION]",
                       error=lambda positions: _found(_positions_type_error(positions)), enabled=True)
    @layer_in_range
    @layer_is_int
    @icontract.snapshot(lambda self: self._state(), name="state")
    @icontract.ensure(lambda self, OLD, result: result.length == len(declared_in(OLD.state))
                      and result.read_len == len(self._pos)
                      and (OLD.state[1][2] is None or result.cells == OLD.state[1][2]),
                      "CELL-STEP-SHAPE: one cell per declared token (the forward's placement), the read window "
                      "is the used extent")
    @icontract.ensure(lambda self, OLD, layer, positions, result: result.mask_bits == mask_by_formula(
        self._pos, self._owners, declared_in(OLD.state), positions, self._layer_window[layer], result.read_len),
                      "CELL-MASK, CELL-WINDOW-POS: token i attends exactly its sequence's cells inside its "
                      "window, measured in positions")
    @icontract.ensure(lambda OLD, result: OLD.state[1][1] is not None
                      or result.cells == lowest_free_by_formula(OLD.state[0][0], result.length),
                      "CELL-LAYOUT-CANON: each token takes the lowest free cell, in token order")
    @icontract.ensure(lambda self, OLD, positions, result: OLD.state[1][1] is not None
                      or placed_only_free_cells(OLD.state[0], self._table(), declared_in(OLD.state), positions,
                                                result.cells),
                      "CELL-PLACE: the first layer writes each token into a cell that was free, at its position, "
                      "owned by its sequence only; no other cell changes")
    @icontract.ensure(lambda self, OLD: OLD.state[1][1] is None or self._table() == OLD.state[0],
                      "CELL-PLACE: later layers reuse the placement and change no cell")
    @icontract.ensure(lambda self, OLD, layer, result: all(step == result for window, step in OLD.state[1][4]
                                                           if window == self._layer_window[layer]),
                      "CELL-STEP-SHAPE: layers with the same window get equal steps")
    @icontract.ensure(lambda self, OLD, layer: (self._served == OLD.state[1][3] | {layer})
                      if len(OLD.state[1][3]) + 1 < self.n_layers else self._declared is None,
                      "CELL-FORWARD: the layer is served; the forward closes when every layer has been")
    def place_step(self, layer: int, positions: Sequence[int]) -> CellStep:
        if self._positions is None:
            self._place(tuple(positions))
        window = self._layer_window[layer]
        step = self._steps.get(window)
        if step is None:
            step = self._build_step(window)
            self._steps[window] = step
        self._serve(layer)
        return step

    # --- the bodies (private; the broken variants of kvcache_proofs._cell_broken override these) --------

    def _free_id(self) -> Optional[int]:
        """CELL-NEW, CELL-FORK: the lowest id not live, the one a new sequence gets; None when all are live."""
        return None if self._live == (1 << self.max_seqs) - 1 else _lowest_clear_bit(self._live)

    def _share(self, src: int, fork: int, upto: Optional[int]) -> None:
        """CELL-FORK: `fork` co-owns src's cells with a position below upto (all when None)."""
        src_bit, fork_bit = 1 << src, 1 << fork
        count, newest = 0, FREE
        for j, p in enumerate(self._pos):
            if self._owners[j] & src_bit and (upto is None or p < upto):
                self._owners[j] |= fork_bit
                count += 1
                newest = max(newest, p)
        self._count[fork], self._newest[fork] = count, newest

    def _drop(self, seq_id: int, p0: int, p1: int) -> None:
        """CELL-RM: seq_id stops owning its cells with position in [p0, p1); unowned cells become free."""
        bit = 1 << seq_id
        newest = FREE
        for j, p in enumerate(self._pos):
            if not self._owners[j] & bit:
                continue
            if p0 <= p < p1:
                self._owners[j] &= ~bit
                self._count[seq_id] -= 1
                if not self._owners[j]:
                    self._pos[j] = FREE
                    self._occupied -= 1
            else:
                newest = max(newest, p)
        self._newest[seq_id] = newest

    def _trim(self) -> None:
        """CELL-USED-END: the used extent shrinks from the top past the cells that became free."""
        while self._pos and self._pos[-1] == FREE:
            self._pos.pop()
            self._owners.pop()

    def _lowest_free(self, k: int) -> list[int]:
        """CELL-LAYOUT-CANON: the k lowest free cells, by a scan of the table, then past its end."""
        cells: list[int] = []
        for j, p in enumerate(self._pos):
            if len(cells) == k:
                return cells
            if p == FREE:
                cells.append(j)
        end = len(self._pos)
        return cells + list(range(end, end + k - len(cells)))

    def _place(self, positions: tuple[int, ...]) -> None:
        """CELL-PLACE: each declared token takes a free cell, owned by its sequence only, at its position."""
        declared = self._declared
        assert declared is not None  # a precondition of place_step
        cells = self._lowest_free(len(declared))
        for s, q, cell in zip(declared, positions, cells):
            if cell == len(self._pos):  # cells come in increasing order, so a cell past the end is the next one
                self._pos.append(FREE)
                self._owners.append(0)
            self._pos[cell], self._owners[cell] = q, 1 << s
            self._count[s] += 1
            self._newest[s] = q  # positions of one sequence increase within the step (CELL-POS)
        self._occupied += len(cells)
        self._positions, self._cells = positions, tuple(cells)

    def _build_step(self, window: Optional[int]) -> CellStep:
        """CELL-MASK per sequence: each sequence's cells sorted by position once, then each token's row is
        the slice of its sequence's cells whose position lies in [q - window + 1, q] (found by bisection)."""
        declared, positions, cells = self._declared, self._positions, self._cells
        assert declared is not None and positions is not None and cells is not None  # placed by now
        read_len = len(self._pos)
        step_bits = 0
        for s in declared:
            step_bits |= 1 << s
        by_seq: dict[int, list[tuple[int, int]]] = {s: [] for s in _bits(step_bits)}
        for j, (p, owners) in enumerate(zip(self._pos, self._owners)):
            for s in _bits(owners & step_bits):
                by_seq[s].append((p, j))
        for entries in by_seq.values():
            entries.sort()
        keys = {s: [p for p, _ in entries] for s, entries in by_seq.items()}
        mask = bytearray(len(declared) * read_len)
        for i, (s, q) in enumerate(zip(declared, positions)):
            low = 0 if window is None else q - window + 1
            first, last = bisect.bisect_left(keys[s], low), bisect.bisect_right(keys[s], q)
            for _, j in by_seq[s][first:last]:
                mask[i * read_len + j] = 1
        return CellStep(len(declared), read_len, cells, bytes(mask))

    def _serve(self, layer: int) -> None:
        """CELL-FORWARD: mark the layer served; the forward closes once every layer has been."""
        self._served = self._served | {layer}
        if len(self._served) == self.n_layers:
            self._close_forward()

    def _close_forward(self) -> None:
        self._declared, self._positions, self._cells = None, None, None
        self._served = frozenset()
        self._steps = {}

    # --- faces --------------------------------------------------------------------------------------------

    @returns_self("the cell runner's")
    def as_batch_control(self) -> BatchControl:
        return self

    @returns_self("the cell backend's")
    def as_cell_stepper(self) -> CellStepper:
        return self
