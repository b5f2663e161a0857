"""`CellReferenceCache`: the op face (`update_and_fetch`) of many sequences over `CellCache`'s cells.

`CellCache` decides the cells and the masks (`declare_step`, `place_step`); this module adds the byte layer
(per layer one numpy array for K and one for V, [1, n_kv_heads, cells, dim]: a cell's row is its name and
never moves) and upstream's runner verbs. Upstream's sequence ids are chosen by the caller in [0, 63);
`CellCache` hands out its own (the lowest id not live). The cache keeps a map from the caller's ids to
`CellCache`'s: an id gets one when its sequence first holds a token (its first step, or a fork onto it),
and loses it when it holds nothing again, so every live `CellCache` id is the image of exactly one
caller id.

Preconditions validate the caller's input, raise a typed `KVCacheError` naming the argument and the rule
before anything changes (OP-ATOMIC), and stay enabled under `python -O`; postconditions and invariants
check this implementation and follow `__debug__`.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import icontract
import numpy as np

from ._cells import CellCache
from ._errors import ArgumentTypeError, ArgumentValueError, CapacityError, ConfigError, ForwardError, \
    KVCacheError, StepError
from ._ints import INT_MAX
from ._op_arrays import found, to_kind, to_numpy
from ._op_pools import KVPools, checked_step, fetch_contracts, step_positions_or_error
from ._op_types import AttendSpec, CacheConfig, CacheSizing, Mask, MaskKind, layout_config, mask_of, \
    takes_op_config, validated

#: Upstream's bound on the caller's sequence ids: [0, 63), the owners word's sign bit left out.
MAX_SEQS = 63


def _id_error(rule: str, argument: str, value: Any) -> Optional[KVCacheError]:
    """`rule`: a sequence id is an int (bool is not) in [0, MAX_SEQS)."""
    if type(value) is not int:
        return ArgumentTypeError(rule, argument, "must be an int (bool is not an int here)", value=value,
                                 type=type(value).__name__)
    if not 0 <= value < MAX_SEQS:
        return ArgumentValueError(rule, argument, f"must lie in [0, {MAX_SEQS})", value=value)
    return None


def _int_error(rule: str, argument: str, value: Any, low: int) -> Optional[KVCacheError]:
    """`rule`: value is an int (bool is not) in [low, INT_MAX]."""
    if type(value) is not int:
        return ArgumentTypeError(rule, argument, "must be an int (bool is not an int here)", value=value,
                                 type=type(value).__name__)
    if not low <= value <= INT_MAX:
        return ArgumentValueError(rule, argument, f"must lie in [{low}, {INT_MAX}]", value=value)
    return None


def _attended_by_table(cells: CellCache, ids: dict[int, int], seq_ids: Sequence[int], positions: Sequence[int],
                       window: int, rows: int) -> Mask:
    """OP-ATTEND over the cell table, in the caller's ids: query i (sequence s, position q) attends cell j
    iff s holds j and j's position p satisfies p <= q and, windowed, p > q - window."""
    mask = np.zeros((len(seq_ids), rows), dtype=np.bool_)
    for i, (s, q) in enumerate(zip(seq_ids, positions)):
        bit = 1 << ids[s]
        for j, (p, owners) in enumerate(zip(cells._pos, cells._owners)):
            mask[i, j] = p >= 0 and owners & bit != 0 and p <= q and (window == 0 or p > q - window)
    return mask


@icontract.invariant(lambda self: set(self._ids.values()) == set(self._cells.live())
                     and all(self._cells.seq_len(i) > 0 for i in self._ids.values()),
                     "OP-STEP: the caller's ids that hold tokens map one to one onto CellCache's live ids")
@icontract.invariant(lambda self: self._pools.within_depths(), "OP-CAP: a layer's rows never exceed the capacity")
@icontract.invariant(lambda self: self._placed is None or (
    self._declared is not None and 0 < len(self._served) < self.config.n_layers),
                     "OP-STEP: a placed step is declared and some layer has not served it yet")
class CellReferenceCache:
    """Several sequences over one pool of per-token cells (upstream's `CellReferenceCache`).

    A step: `begin_step(seq_ids)` declares the owner of each token of the next forward; every layer is then
    served once by `update_and_fetch`, with the same positions; the first places the tokens. A step that
    not every layer served is abandoned at the next `begin_step`, at `seq_cp`, `seq_rm` or `reset`: its
    tokens leave every layer (OP-STEP). Always EXPLICIT: a cell's visibility is its sequence's business.
    """

    # Preconditions run bottom-up: the type check below runs before this one reads batch_size.
    @icontract.require(lambda config: config.batch_size == 1,
                       "OP-BATCH: the cell cache's tokens share one token axis: batch_size == 1",
                       error=lambda config: ConfigError("OP-BATCH", "CacheConfig.batch_size", "must be 1 for the "
                                                        "cell cache (every sequence's tokens share one token axis)",
                                                        value=config.batch_size),
                       enabled=True)
    @icontract.require(lambda config: not any(policy.keep for policy in config.layers),
                       "OP-CONFIG: the cell cache keeps no sinks (OP-SINKS is the contiguous cache's)",
                       error=lambda config: ConfigError("OP-CONFIG", "CacheConfig.layers", "the cell cache keeps no "
                                                        "sinks: every keep must be 0",
                                                        keeps=[policy.keep for policy in config.layers]),
                       enabled=True)
    @icontract.require(lambda config: not any(policy.chunk for policy in config.layers) and not config.record_past,
                       "OP-CONFIG: the cell cache has no chunk layers (OP-CHUNK) and records no past (OP-RECORD): "
                       "both are the contiguous cache's",
                       error=lambda config: ConfigError("OP-CONFIG", "CacheConfig.layers", "the cell cache has no chunk "
                                                        "layers and no record_past (the contiguous cache's)",
                                                        chunks=[policy.chunk for policy in config.layers],
                                                        record_past=config.record_past),
                       enabled=True)
    @takes_op_config
    def __init__(self, config: CacheConfig) -> None:
        config = validated(config)  # OP-CONFIG: re-validated and copied; the caller's object cannot reach it later
        self.config = config
        self._cells = CellCache(layout_config(config, ring_rows=True))
        self._ids: dict[int, int] = {}
        self._declared: Optional[tuple[int, ...]] = None
        self._placed: Optional[tuple[int, ...]] = None
        self._served: frozenset[int] = frozenset()
        self._pools = KVPools(config, (config.capacity,) * config.n_layers)  # a row per cell

    def __delattr__(self, name: str) -> None:
        """Deleting an attribute would break the invariants behind the API's back, so it is refused.

        :raises AttributeError: always
        """
        raise AttributeError(f"CellReferenceCache.{name} cannot be deleted")

    def _state(self) -> tuple[Any, ...]:
        """Everything a later call can observe, as values (the tests' before/after snapshots)."""
        return (self._cells._state(), tuple(sorted(self._ids.items())), self._declared, self._placed, self._served,
                self._pools.snapshot())

    # --- queries ----------------------------------------------------------------------------------------

    def free_cells(self) -> int:
        """Cells no sequence holds (mid-step, the open step's placed tokens hold theirs)."""
        return self._cells.free_cells()

    def _admissible(self) -> int:
        """OP-CAP: the most tokens begin_step admits now - the free cells once the open step, which
        begin_step abandons, has released its placed tokens' cells."""
        return self._cells.free_cells() + (0 if self._placed is None else len(self._placed))

    @icontract.require(lambda n: _int_error("OP-ARGS", "n", n, 0) is None, "OP-ARGS: n is an int >= 0",
                       error=lambda n: found(_int_error("OP-ARGS", "n", n, 0)), enabled=True)
    @icontract.ensure(lambda self, n, result: result == (n <= self._admissible()),
                      "OP-CAP: n tokens fit the cells free once the open step is abandoned: begin_step of n tokens "
                      "is admitted")
    def can_extend(self, n: int = 1) -> bool:
        """Whether begin_step of `n` tokens is admitted now (cache-wide: a shared prefix counts once; the cells
        of an open step, which begin_step abandons, count as free)."""
        return n <= self._admissible()

    @icontract.require(lambda seq_id: _id_error("OP-ARGS", "seq_id", seq_id) is None,
                       "OP-ARGS: seq_id is an int in [0, 63)",
                       error=lambda seq_id: found(_id_error("OP-ARGS", "seq_id", seq_id)), enabled=True)
    def seq_len(self, seq_id: int) -> int:
        """The cells sequence `seq_id` holds."""
        internal = self._ids.get(seq_id)
        return 0 if internal is None else self._cells.seq_len(internal)

    def used_end(self) -> int:
        """One past the highest occupied cell: the rows `update_and_fetch` returns."""
        return self._cells.used_end()

    # --- the step ---------------------------------------------------------------------------------------

    def _step_tokens(self, seq_id: int) -> int:
        """Tokens of `seq_id` the open step has placed (they leave when the step is abandoned)."""
        if self._placed is None or self._declared is None:
            return 0
        return sum(1 for s in self._declared if s == seq_id)

    def _abandon(self) -> None:
        """OP-STEP: an open step's placed tokens leave every layer; its declaration is dropped."""
        declared, placed, served = self._declared, self._placed, self._served
        self._declared, self._placed, self._served = None, None, frozenset()
        if declared is None or placed is None:
            return
        for layer in range(self.config.n_layers):  # CellCache closes a forward once every layer has served it
            if layer not in served:
                self._cells.place_step(layer, list(placed))
        for s in set(declared):
            first = min(q for t, q in zip(declared, placed) if t == s)  # the step's tokens are s's newest
            self._cells.seq_rm(self._ids[s], first, None)
        self._prune()

    def _prune(self) -> None:
        live = self._cells.live()
        self._ids = {s: i for s, i in self._ids.items() if i in live}

    def _begin_error(self, seq_ids: Any) -> Optional[KVCacheError]:
        """OP-STEP, OP-CAP: seq_ids is a non-empty list or tuple of ids that fits the free cells."""
        if type(seq_ids) not in (list, tuple):
            return ArgumentTypeError("OP-STEP", "seq_ids", "must be a list or tuple of sequence ids",
                                     type=type(seq_ids).__name__)
        if not seq_ids:
            return ArgumentValueError("OP-STEP", "seq_ids", "must not be empty (a step has at least one token)")
        for index, seq_id in enumerate(seq_ids):
            error = _id_error("OP-STEP", f"seq_ids[{index}]", seq_id)
            if error is not None:
                return error
        free = self._admissible()
        if len(seq_ids) > free:
            return CapacityError("OP-CAP", "seq_ids", "more tokens than free cells", tokens=len(seq_ids),
                                 free=free)
        return None

    @icontract.require(lambda self, seq_ids: self._begin_error(seq_ids) is None,
                       "OP-STEP, OP-CAP, OP-ATOMIC: a non-empty list or tuple of ids in [0, 63), no more than the "
                       "free cells, checked before an open step is abandoned",
                       error=lambda self, seq_ids: found(self._begin_error(seq_ids)), enabled=True)
    @icontract.ensure(lambda self, seq_ids: self._declared == tuple(seq_ids) and self._placed is None,
                      "OP-STEP: the step is declared, nothing placed yet")
    def begin_step(self, seq_ids: Sequence[int]) -> None:
        """Declare the sequence of each token of the next forward (abandoning an unfinished step)."""
        self._abandon()
        self._declared = tuple(seq_ids)

    def _fetch_error(self, layer_id: Any, k: Any, v: Any, position: Any) -> Optional[KVCacheError]:
        """OP-ARGS, OP-STEP, OP-POS: the error of an update_and_fetch call, else None."""
        positions = step_positions_or_error(self.config, layer_id, k, v, position)
        if isinstance(positions, KVCacheError):
            return positions
        declared = self._declared
        if declared is None:
            return ForwardError("OP-STEP", "update_and_fetch", "no step is declared (begin_step first)",
                                layer_id=layer_id)
        if layer_id in self._served:
            return ForwardError("OP-STEP", "layer_id", "was already served in this step", layer_id=layer_id,
                                served=sorted(self._served))
        if len(positions) != len(declared):
            return StepError("OP-STEP", "position", "must hold one position per declared token",
                             q_len=len(positions), declared=len(declared))
        if self._placed is not None:
            if tuple(positions) != self._placed:
                return ForwardError("OP-STEP", "position", "must be the positions every other layer of this step "
                                                           "took", positions=positions, step=list(self._placed))
            return None
        newest = {s: self._cells.next_pos(self._ids[s]) - 1 if s in self._ids else -1 for s in set(declared)}
        for index, (s, q) in enumerate(zip(declared, positions)):
            if q <= newest[s]:
                return StepError("OP-POS", f"position[{index}]", "must be newer than every position its sequence "
                                 "holds and than its earlier tokens in this step (a query would find two tokens at "
                                 "one position)", value=q, seq_id=s, newest=newest[s])
            newest[s] = q
        return None

    @fetch_contracts("OP-ARGS, OP-STEP, OP-POS, OP-ATOMIC: a declared step, a layer not yet served, positions that "
                     "fit, checked before anything changes")
    @icontract.snapshot(lambda self: self._declared, name="declared")
    @icontract.ensure(lambda self, OLD, layer_id, position, result: np.array_equal(
        mask_of(result[2], len(OLD.declared), to_numpy(result[0]).shape[2]),
        _attended_by_table(self._cells, self._ids, OLD.declared, [int(p) for p in to_numpy(position).reshape(-1)],
                           self.config.window(layer_id), to_numpy(result[0]).shape[2])),
                      "OP-ATTEND: a query attends exactly the cells its sequence holds at or before its position, "
                      "inside its window")
    def update_and_fetch(self, layer_id: int, k: Any, v: Any, position: Any) -> tuple[Any, Any, AttendSpec]:
        """Write the step's K/V into its cells on layer `layer_id`; return (k_hist, v_hist, spec) over cells
        [0, used_end()) (OP-HIST; spec EXPLICIT).

        k [1, Hkv, q_len, D], v [1, Hkv, q_len, Dv], position [q_len, 1] ints; numpy arrays or torch tensors,
        the answer has k's kind.
        """
        config = self.config
        k_values, v_values, positions, kind = checked_step(config, layer_id, k, v, position)
        declared = self._declared
        assert declared is not None  # a precondition
        if self._placed is None:
            for s in declared:
                if s not in self._ids:
                    internal = self._cells.seq_new()
                    assert internal is not None  # at most 63 caller ids hold tokens; CellCache has 64
                    self._ids[s] = internal
            accepted = self._cells.declare_step([self._ids[s] for s in declared])
            assert accepted  # begin_step admitted the tokens, and nothing has freed a cell since
            self._placed = tuple(positions)
        step = self._cells.place_step(layer_id, list(positions))
        self._served = self._served | {layer_id}
        if len(self._served) == config.n_layers:
            self._declared, self._placed, self._served = None, None, frozenset()
        self._pools.write(layer_id, np.array(step.cells, dtype=np.int64), k_values, v_values)
        k_hist, v_hist = self._pools.read(layer_id, np.arange(step.read_len, dtype=np.int64))
        mask = np.frombuffer(step.mask_bits, dtype=np.uint8).reshape(step.length, step.read_len).astype(np.bool_)
        return to_kind(k_hist, kind), to_kind(v_hist, kind), AttendSpec(MaskKind.EXPLICIT, to_kind(mask, kind))

    # --- the sequence verbs -----------------------------------------------------------------------------

    def _fork_error(self, src_id: Any, dst_id: Any, upto: Any) -> Optional[KVCacheError]:
        """OP-FORK: ids in [0, 63), src_id != dst_id, upto None or an int >= 0, dst_id holding nothing."""
        error = _id_error("OP-FORK", "src_id", src_id) or _id_error("OP-FORK", "dst_id", dst_id)
        if error is None and upto is not None:
            error = _int_error("OP-FORK", "upto", upto, 0)
        if error is not None:
            return error
        if src_id == dst_id:
            return ArgumentValueError("OP-FORK", "dst_id", "must differ from src_id", src_id=src_id, dst_id=dst_id)
        held = self.seq_len(dst_id) - self._step_tokens(dst_id)  # what dst holds once the open step is abandoned
        if held:
            return ArgumentValueError("OP-FORK", "dst_id", "must hold nothing: merging two histories can put two "
                                                           "tokens at one position", dst_id=dst_id, held=held)
        return None

    @icontract.require(lambda self, src_id, dst_id, upto: self._fork_error(src_id, dst_id, upto) is None,
                       "OP-FORK, OP-ATOMIC: distinct ids in [0, 63), upto None or >= 0, dst holding nothing, "
                       "checked before an open step is abandoned",
                       error=lambda self, src_id, dst_id, upto: found(self._fork_error(src_id, dst_id, upto)),
                       enabled=True)
    @icontract.snapshot(lambda self: self._all_held(), name="held")
    @icontract.ensure(lambda self, src_id, dst_id, upto: self._held(dst_id) == {
        p: cell for p, cell in self._held(src_id).items() if upto is None or p < upto},
                      "OP-FORK: dst holds exactly src's tokens below upto, in src's cells (shared, not copied)")
    @icontract.ensure(lambda self, OLD, dst_id: OLD.held is None or all(
        self._held(s) == OLD.held[s] for s in range(MAX_SEQS) if s != dst_id),
                      "OP-FORK: every other sequence keeps its tokens")
    def seq_cp(self, src_id: int, dst_id: int, upto: Optional[int] = None) -> None:
        """Give `dst_id` src_id's tokens at positions below `upto` (all when None), sharing their cells."""
        self._abandon()
        src = self._ids.get(src_id)
        if src is None:
            return  # src holds nothing: dst is given nothing
        fork = self._cells.seq_clone(src, upto)
        assert fork is not None  # at most 63 caller ids hold tokens; CellCache has 64
        if self._cells.seq_len(fork) == 0:
            self._cells.seq_rm(fork, 0)  # upto cut everything: the fork holds nothing, so it stops being live
        else:
            self._ids[dst_id] = fork

    def _held(self, seq_id: int) -> dict[int, int]:
        """position -> cell, for every token sequence `seq_id` holds."""
        internal = self._ids.get(seq_id)
        if internal is None:
            return {}
        bit = 1 << internal
        return {p: j for j, (p, owners) in enumerate(zip(self._cells._pos, self._cells._owners)) if owners & bit}

    def _all_held(self) -> Optional[list[dict[int, int]]]:
        """Every sequence's tokens (position -> cell) when no step is placed, for the verbs' contracts (an
        open step is abandoned first, which the contracts then need not restate); else None."""
        return None if self._placed is not None else [self._held(s) for s in range(MAX_SEQS)]

    def _rm_error(self, seq_id: Any, p0: Any, p1: Any) -> Optional[KVCacheError]:
        """OP-RM: seq_id in [0, 63), p0 an int >= 0, p1 None or an int >= p0."""
        error = _id_error("OP-RM", "seq_id", seq_id) or _int_error("OP-RM", "p0", p0, 0)
        if error is None and p1 is not None:
            error = _int_error("OP-RM", "p1", p1, p0)
        return error

    @icontract.require(lambda self, seq_id, p0, p1: self._rm_error(seq_id, p0, p1) is None,
                       "OP-RM, OP-ATOMIC: seq_id in [0, 63), 0 <= p0, p1 None or >= p0, checked before an open step is "
                       "abandoned",
                       error=lambda self, seq_id, p0, p1: found(self._rm_error(seq_id, p0, p1)), enabled=True)
    @icontract.snapshot(lambda self: self._all_held(), name="held")
    @icontract.ensure(lambda self, OLD, seq_id, p0, p1: OLD.held is None or self._held(seq_id) == {
        p: j for p, j in OLD.held[seq_id].items() if not (p0 <= p and (p1 is None or p < p1))},
                      "OP-RM: the sequence keeps exactly its tokens outside [p0, p1)")
    @icontract.ensure(lambda self, OLD, seq_id: OLD.held is None or all(
        self._held(s) == OLD.held[s] for s in range(MAX_SEQS) if s != seq_id),
                      "OP-RM: every other sequence keeps its tokens (a shared cell stays)")
    def seq_rm(self, seq_id: int, p0: int = 0, p1: Optional[int] = None) -> None:
        """Remove `seq_id`'s tokens at positions in [p0, p1) (to the end when None) from every layer."""
        self._abandon()
        internal = self._ids.get(seq_id)
        if internal is not None:
            self._cells.seq_rm(internal, p0, p1)
            self._prune()

    @icontract.ensure(lambda self: self.free_cells() == self.config.capacity and not self._ids
                      and self._declared is None, "OP-STEP: after reset no sequence holds a token, no step is open")
    def reset(self) -> None:
        """Forget every token, sequence and step; DYNAMIC sizing also frees the rows."""
        self._cells.clear()
        self._ids = {}
        self._declared, self._placed, self._served = None, None, frozenset()
        if self.config.sizing is CacheSizing.DYNAMIC:
            self._pools.reset()
