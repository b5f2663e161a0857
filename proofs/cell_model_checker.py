"""Exhaustive model checker for the cell layout: every reachable state of (cell model x implementation).

The search is `model_checker`'s (breadth-first, deduplicated by the harness's key, shortest
counterexample, worker processes, one wall-clock budget); this module gives it the cell layout's
`Layout`: the harness `CellLockstep` (spec/cell_stateful.py), the transitions and the checks.

Transitions, from every state within the bounds:
- between forwards: seq_new; seq_clone of every live id with every cut (None and 0 .. next_pos - 1);
  seq_rm of every live id over every range [p0, p1) and [p0, end) with 0 <= p0 <= next_pos (before,
  at and after every fork's cut and every window edge, as the positions are all of them); a
  declare_step of every sequence of live ids of 1 .. max_tokens tokens that fits (both step patterns:
  one id repeated, several ids); clear;
- inside a forward (so half-done forwards are states too): the first place_step on every layer with
  every position choice (each token its sequence's next position, or one further: a gap), every
  position below `max_position`; then each unserved layer in turn; clear (abandoning it).
Checks, at every state (each must change nothing): every query (live, free_cells, used_end, capacity,
seq_len / next_pos of every id and of out-of-range ones, can_extend of every n), and bad calls of
every verb: dead and out-of-range ids, bools, negatives, p1 < p0, INT_MAX + 1, an empty or too large
declaration (a refusal), place_step with nothing declared, mid-forward verbs (CELL-FORWARD), a layer
served twice, other positions, a wrong count, a position not above the sequence's newest.

Bounds (`CellBounds`, `PROFILES`): configurations exhaustively (deep: up to capacity 6 with 3 ids, at
positions below 3); where a group says so, to a stated depth of calls, every state within it with
every check and transition, the states past it counted in the report (pre-merge's capacity 6 with 3
ids at positions below 6).

States are explored once per class of id renamings (`canonical`, docs/verification.md, "How the cell layout is verified"): a renaming that maps
live ids to live ids with the same histories and keeps the free ids in increasing order (what the
lowest-free allocator observes) relates states with the same futures. Cells are not renamed. The
target's class invariants are checked once per state (`model_checker.invariants_suspended`).

Usage: python -m kvcache_proofs.model_checker --layout cell [--profile quick|pre-merge|deep] [--jobs N]
       [--target python:MODULE:FACTORY] [--time-budget S] [--json FILE] [--no-symmetry]
       [--engine processes|ray] [--ray-address ADDRESS]
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import kvcache
from kvcache_spec import cell_model as cm
from kvcache_spec.cell_stateful import Call, CellConfigSpec, CellFactory, CellLockstep, cell_reference_factory
from kvcache_spec.stateful import Observe

from .model_checker import check_all
from .model_search import Layout

INT_MAX = cm.INT_MAX


#: (max_seqs, max_capacity, layer_sets[, max_depth[, max_position]]); max_capacity n is 1..n, (lo, hi) lo..hi
Group = tuple[Any, ...]


def _capacities(group: Group) -> range:
    low, high = group[1] if isinstance(group[1], tuple) else (1, group[1])
    return range(low, high + 1)


@dataclass(frozen=True)
class CellBounds:
    """Each group (max_seqs, max_capacity, layer_sets[, max_depth[, max_position]]) gives every capacity
    in 1..max_capacity (or lo..hi when it is a pair) with each layer set (0 = a flat layer, w = a window of w) and max_seqs ids;
    forwards have 1..max_tokens tokens, positions stay below max_position (the group's, else the
    bounds'). A group with a max_depth (None: none) is checked to that depth: every state reachable in
    at most max_depth calls gets every check and every transition (`model_checker.check_config`), the
    states one call further are reached and their transition checked but not explored. A
    configuration in several groups is governed by the first exhaustive one (no depth bound), else by
    the one with the deepest bound."""

    groups: tuple[Group, ...]
    max_tokens: int
    max_position: int

    def configs(self) -> list[CellConfigSpec]:
        """Smallest first, so the first failing configuration is a small one."""
        specs = {CellConfigSpec(capacity, windows, group[0])
                 for group in self.groups for capacity in _capacities(group) for windows in group[2]}
        return sorted(specs, key=lambda s: (s.capacity, s.max_seqs, len(s.windows), s.windows))

    def governing(self, spec: CellConfigSpec) -> tuple[Optional[int], int]:
        """(max_depth, max_position) for `spec` (see the class docstring)."""
        return self._bound(self.groups[self.governing_group(spec)])

    def governing_group(self, spec: CellConfigSpec) -> int:
        """The index of the group that governs `spec`: the first exhaustive one covering it, else the
        covering one with the deepest bound."""
        covering = [index for index, group in enumerate(self.groups)
                    if spec.max_seqs == group[0] and spec.capacity in _capacities(group) and spec.windows in group[2]]
        exhaustive = [index for index in covering if self._bound(self.groups[index])[0] is None]
        return exhaustive[0] if exhaustive else max(covering, key=lambda index: self._bound(self.groups[index])[0] or 0)

    def _bound(self, group: Group) -> tuple[Optional[int], int]:
        return group[3] if len(group) > 3 else None, group[4] if len(group) > 4 else self.max_position

    def max_depth(self, spec: CellConfigSpec) -> Optional[int]:
        return self.governing(spec)[0]


FLAT, WINDOW, BOTH = (0,), (2,), (0, 2)

#: The state space grows fast with the capacity, the ids and the positions (the counts below are of
#: canonical states, one per class of id renamings, docs/verification.md, "How the cell layout is verified"; CPU seconds on this 2-core machine at
#: load 5-9, one job). Capacity 3 with 3 ids and positions below 3: 1,901 states flat, 1,901 windowed,
#: 4,179 flat+windowed (29 s). Capacity 4 with 3 ids, positions below 4, flat: past 50,000 states (cut
#: at 225 s), so capacity 6 with 3 ids stays out of exhaustive reach on one core; capacities 4-6 with 3
#: ids (positions below 6, so one sequence can fill the pool) are checked to a depth bound: every state
#: reachable in at most D calls, with every check and every transition; the report counts the states
#: past the bound. Reduction by the symmetry (full / reduced states): 1.9x with 2 ids, 2.1x for capacity
#: 6 with 3 ids at depth 6.
#: pre-merge: the face2b5 bounds (2,580 states then, 1,127 canonical now; side by side, one job, load 2-3,
#: `proofs/bench_cell_checker.py`: 7.2-8.8 s of CPU then, 2.2-2.8 s now, 2.8-3.6x) plus capacity 5 with 2 ids and a window, exhaustive (5,023 states, 15.5 s of CPU): about
#: 20 s of CPU, spread over 2 jobs one configuration at a time.
#: deep: exhaustive, every layer kind: capacity up to 5 with 2 ids and up to 3 with 3 ids at positions
#: below 4, and capacities 4-6 with 3 ids at positions below 3 (each sequence holds at most 3 cells, so
#: filling 6 takes two or three sequences; one sequence filling the pool at positions below 6 is
#: pre-merge's depth-4 group). Measured (canonical states): capacity 5 with 3 ids 80,847 flat, 80,847
#: windowed, 214,793 flat+windowed; capacity 6 with 3 ids 382,836 flat, 382,836 windowed (the model's
#: own state count, found by a model-only search, is the same number) and 1,014,856 flat+windowed. The
#: whole profile, run end to end (`--profile deep --jobs 2`): holds, 33/33 configurations, 2,455,510
#: states, 5,313 s wall on 2 jobs, 7,401 s of CPU, 1.1 GB at most (load about 3); the mixed capacity-6
#: configuration alone about 2,900 s, the last on one job. Growth per added cell at positions below 3 (flat, 3
#: ids, capacity 4 counted by the model-only search): 13,896 -> 80,847 -> 382,836 (x5.8, x4.7).
PROFILES: dict[str, CellBounds] = {
    "quick": CellBounds(groups=((2, 2, (FLAT, WINDOW)), (3, 1, (FLAT,))), max_tokens=2, max_position=3),
    "pre-merge": CellBounds(groups=((2, 3, (WINDOW,)), (3, 2, (WINDOW,)), (2, 2, (BOTH,)), (2, (5, 5), (WINDOW,)),
                                    (3, (6, 6), (FLAT, WINDOW, BOTH), 4, 6)), max_tokens=2, max_position=3),
    "deep": CellBounds(groups=((2, 5, (FLAT, WINDOW, BOTH)), (3, 3, (FLAT, WINDOW, BOTH)),
                               (3, (4, 6), (FLAT, WINDOW, BOTH), None, 3)), max_tokens=2, max_position=4),
}
DEFAULT_BUDGET = {"quick": 15.0, "pre-merge": 60.0, "deep": 14400.0}


def _live(lock: CellLockstep) -> list[int]:
    return sorted(cm.live(lock.state))


def _next_pos(lock: CellLockstep, seq_id: int) -> int:
    return lock.newest(seq_id) + 1


def _position_choices(lock: CellLockstep, seq_ids: tuple[int, ...], max_position: int) -> Iterator[list[int]]:
    """Every assignment giving each token its sequence's next position or one further (a gap)."""
    for gaps in itertools.product((0, 1), repeat=len(seq_ids)):
        positions = list(lock.positions_for(seq_ids, gaps))
        if max(positions) < max_position:
            yield positions


def transitions(lock: CellLockstep, max_tokens: int, max_position: int) -> Iterator[Call]:
    """Every call a consumer may make now, forwards of at most `max_tokens` tokens at positions below
    `max_position` (see the module docstring)."""
    state, n_layers = lock.state, lock.spec.n_layers
    forward = state.forward
    if forward is not None:
        unserved = [layer for layer in range(n_layers) if layer not in forward.served]
        if forward.positions is None:
            for positions in _position_choices(lock, forward.seq_ids, max_position):
                for layer in sorted({unserved[0], unserved[-1]}):
                    yield Call("place_step", (layer, positions))
        else:
            for layer in unserved:
                yield Call("place_step", (layer, list(forward.positions)))
        yield Call("clear")
        return
    live = _live(lock)
    if len(live) < lock.spec.max_seqs:
        yield Call("seq_new")
        for src in live:
            for upto in [None, *range(_next_pos(lock, src))]:
                yield Call("seq_clone", (src, upto))
    for seq_id in live:
        end = _next_pos(lock, seq_id)
        for p0 in range(end + 1):
            for p1 in [None, *range(p0 + 1, end + 1)]:
                yield Call("seq_rm", (seq_id, p0, p1))
    free = cm.free_cells(lock.config, state)
    for n in range(1, min(free, max_tokens) + 1):
        for seq_ids in itertools.product(live, repeat=n):
            if any(True for _ in _position_choices(lock, seq_ids, max_position)):
                yield Call("declare_step", (list(seq_ids),))
    if live:
        yield Call("clear")


def checks(lock: CellLockstep) -> Iterator[Any]:
    state, spec = lock.state, lock.spec
    live = _live(lock)
    dead = [s for s in range(spec.max_seqs) if s not in live]
    some = _renamed_zero(lock) if live else 0      # the id renamed 0: the same check in every related state
    yield Observe()
    for bad in (True, None, 1.0):
        yield Call("seq_len", (bad,))
    for bad in (-1, True, INT_MAX + 1):
        yield Call("can_extend", (bad,))
    forward = state.forward
    if forward is not None:  # CELL-FORWARD: every table-changing verb raises; bad place_steps
        yield from (Call("seq_new"), Call("seq_clone", (some,)), Call("seq_rm", (some, 0)),
                    Call("declare_step", ([some],)))
        for layer in (spec.n_layers, -1, True):
            yield Call("place_step", (layer, [0] * len(forward.seq_ids)))
        if forward.positions is not None:
            served = sorted(forward.served)[0]
            yield Call("place_step", (served, list(forward.positions)))               # served twice
            other = [*forward.positions[:-1], forward.positions[-1] + 1]
            unserved = [layer for layer in range(spec.n_layers) if layer not in forward.served]
            if unserved:
                yield Call("place_step", (unserved[0], other))                        # other positions
                yield Call("place_step", (unserved[0], list(forward.positions) + [9]))  # a wrong count
        else:
            newest = lock.newest(forward.seq_ids[0])
            if newest >= 0:
                yield Call("place_step", (0, [newest] * len(forward.seq_ids)))          # not above the newest
            repeated = [k for k, seq_id in enumerate(forward.seq_ids) if seq_id in forward.seq_ids[:k]]
            if repeated:                                                                  # one position twice
                positions = list(lock.positions_for(forward.seq_ids))
                k = repeated[0]
                positions[k] = positions[forward.seq_ids.index(forward.seq_ids[k])]
                yield Call("place_step", (0, positions))
            yield Call("place_step", (0, [-1] * len(forward.seq_ids)))
            yield Call("place_step", (0, "0"))
        return
    yield Call("place_step", (0, [0]))                                                  # nothing declared
    yield from (Call("declare_step", ([],)), Call("declare_step", ([spec.max_seqs],)),
                Call("declare_step", ([True],)), Call("declare_step", ("0",)))
    if live:
        yield Call("declare_step", ([some] * (cm.free_cells(lock.config, state) + 1),))  # refused: too many
        yield from (Call("seq_rm", (some, 2, 1)), Call("seq_rm", (some, -1)), Call("seq_rm", (some, True)),
                    Call("seq_rm", (some, 0, INT_MAX + 1)), Call("seq_clone", (some, -1)))
    if dead:
        d = dead[0]
        yield from (Call("seq_rm", (d, 0)), Call("seq_clone", (d,)), Call("declare_step", ([d],)),
                    Call("next_pos", (d,)))
    else:
        yield from (Call("seq_new"), Call("seq_clone", (some,)))                        # refused: every id live
    yield from (Call("seq_clone", (spec.max_seqs,)), Call("seq_rm", (-1, 0)))


def _cell_harness(spec: CellConfigSpec, factory: CellFactory) -> CellLockstep:
    return CellLockstep(spec, factory, thorough=False)


# --- symmetry over sequence ids (the argument: docs/verification.md, "How the cell layout is verified") -------------------------------------------
# The canonical form numbers the live ids 0..k-1 in the order of their (history, forward roles) and the
# free ids k.. in increasing order, and renames the model, the open forward and the target's own tables
# with it; ties take the least renamed table. Only the reference's representation is renamed.

@functools.lru_cache(maxsize=None)
def _reference_attributes() -> frozenset[str]:
    return frozenset(vars(kvcache.CellCache(CellConfigSpec(1, (0,), 1).cache_config(), 1)))


@functools.lru_cache(maxsize=None)
def _cache_config(spec: CellConfigSpec) -> kvcache.CacheConfig:
    config: kvcache.CacheConfig = spec.cache_config()
    return config


def _renameable(lock: CellLockstep) -> bool:
    """The target holds the reference's tables and nothing else (its config unchanged: the key leaves it out)."""
    target = lock.target
    return (isinstance(target, kvcache.CellCache) and frozenset(vars(target)) == _reference_attributes()
            and vars(target)["config"] == _cache_config(lock.spec))


def _rename_bits(bits: int, beta: list[int]) -> int:
    renamed = 0
    while bits:
        low = bits & -bits
        renamed |= 1 << beta[low.bit_length() - 1]
        bits ^= low
    return renamed


def _renamed_target(target: Any, beta: list[int]) -> tuple[Any, ...]:
    """The reference's attributes with every id renamed by beta (IndexError: an id outside max_seqs)."""
    v = vars(target)
    count, newest = [0] * len(beta), [0] * len(beta)
    if len(v["_count"]) != len(beta) or len(v["_newest"]) != len(beta) or v["_live"] >> len(beta):
        raise IndexError("ids outside max_seqs")
    for old, new in enumerate(beta):
        count[new], newest[new] = v["_count"][old], v["_newest"][old]
    declared = v["_declared"]
    steps = v["_steps"]
    return (tuple(v["_pos"]), tuple(_rename_bits(o, beta) for o in v["_owners"]), v["_occupied"], tuple(count),
            tuple(newest), _rename_bits(v["_live"], beta),
            None if declared is None else tuple(beta[s] for s in declared), v["_positions"], v["_cells"],
            tuple(sorted(v["_served"])), tuple(sorted(steps.items(), key=lambda item: -1 if item[0] is None else item[0])),
            v["_capacity"], v["n_layers"], v["max_seqs"], v["_layer_window"])


def canonical(lock: CellLockstep) -> tuple[tuple[Any, ...], list[int]]:
    """(the state's canonical key, its live ids in canonical order: the first is renamed 0)."""
    key, orders = _canonical_orders(lock)
    return key, orders[0]


def automorphisms(lock: CellLockstep) -> list[dict[int, int]]:
    """The renamings that map the state onto itself (its key is the same under each), as maps of the
    live ids; the identity first. A transition and its image under one of them lead to related states
    and are checked alike (docs/verification.md, "How the cell layout is verified"), so `transitions` makes one of each such set."""
    signature = _signatures(lock.state)
    if len(set(signature.values())) == len(signature):  # no two ids alike: the identity alone (the common case)
        return [{s: s for s in signature}]
    _, orders = _canonical_orders(lock)
    return [dict(zip(orders[0], order)) for order in orders]


def _renamed_zero(lock: CellLockstep) -> int:
    """`canonical(lock)[1][0]`, without renaming the target when one live id's signature is the least alone."""
    signature = _signatures(lock.state)
    order = sorted(signature, key=signature.__getitem__)
    if _renameable(lock) and (len(order) == 1 or signature[order[0]] != signature[order[1]]):
        return order[0]
    return canonical(lock)[1][0]


def _where(state: cm.CellState) -> dict[int, int]:
    """content -> the model cell holding it (a content is written once, never moved)."""
    return {held[1]: cell for cell, held in enumerate(state.written) if held is not None}


def _signatures(state: cm.CellState, where: Optional[dict[int, int]] = None) -> dict[int, tuple[Any, ...]]:
    """Each live id's (history as (position, cell) pairs, its roles in the open forward): what a
    renaming must preserve."""
    where = _where(state) if where is None else where
    declared = state.forward.seq_ids if state.forward is not None else ()
    return {s: (tuple((p, where[c]) for p, c in past), tuple(k for k, t in enumerate(declared) if t == s))
            for s, past in state.histories}


def _canonical_orders(lock: CellLockstep) -> tuple[tuple[Any, ...], list[list[int]]]:
    """(the canonical key, every order of the live ids that gives it: the first is `canonical`'s)."""
    state = lock.state
    forward = state.forward
    where = _where(state)
    signature = _signatures(state, where)
    target = lock.target
    if not _renameable(lock):
        return ("as-is", lock.key()), [sorted(signature)]
    live = sorted(signature, key=signature.__getitem__)
    dead = [s for s in range(lock.spec.max_seqs) if s not in signature]
    live_contents = {content for _, past in state.histories for _, content in past}

    def canon(held: cm.Written) -> Optional[tuple[int, int]]:
        return (held[0], where[held[1]]) if held is not None and held[1] in live_contents else None

    pools = tuple(tuple(canon(held) for held in pool) for pool in lock.pools)
    best: Optional[tuple[Any, ...]] = None
    orders: list[list[int]] = []
    groups = [list(group) for _, group in itertools.groupby(live, key=signature.__getitem__)]
    for choice in itertools.product(*(itertools.permutations(group) for group in groups)):
        order = [s for group in choice for s in group]
        beta = [0] * lock.spec.max_seqs
        for new, old in enumerate(order + dead):
            beta[old] = new
        try:
            renamed = _renamed_target(target, beta)
        except (IndexError, KeyError, TypeError):  # not the reference's tables after all: no renaming
            return ("as-is", lock.key()), [sorted(signature)]
        if best is None or renamed < best:
            best, orders = renamed, [order]
        elif renamed == best:   # a tie: the renaming from orders[0] to this order is an automorphism
            orders.append(order)
    assert best is not None
    order = orders[0]
    beta_forward = {old: new for new, old in enumerate(order)}
    return (("renamed", tuple(signature[s][0] for s in order),
             None if forward is None else (tuple(beta_forward[s] for s in forward.seq_ids), forward.positions,
                                           forward.cells, forward.served),
             pools, best), orders)


def canonical_key(lock: CellLockstep) -> tuple[Any, ...]:
    return canonical(lock)[0]


def _plain_key(lock: CellLockstep) -> tuple[Any, ...]:
    return ("plain", lock.key())


def layout(bounds: CellBounds, symmetry: bool = True) -> Layout:
    """The cell layout's search; `symmetry` (the default) explores one state per class of id renamings."""
    return Layout("cell", "kvcache_spec.cell_stateful", _cell_harness, "CellLockstep", cell_reference_factory,
                  _Transitions(bounds, symmetry), checks, max_depth=bounds.max_depth,
                  key=canonical_key if symmetry else _plain_key)


@dataclass(frozen=True)
class _Transitions:
    """The transitions within `bounds`, as a picklable callable (the layout travels to worker processes)."""

    bounds: CellBounds
    symmetry: bool = True

    def __call__(self, lock: CellLockstep) -> Iterator[Call]:
        calls = transitions(lock, self.bounds.max_tokens, self.bounds.governing(lock.spec)[1])
        return one_per_orbit(calls, automorphisms(lock)) if self.symmetry else calls


def _renamed_call(call: Call, pi: dict[int, int]) -> Call:
    """`call` with its sequence ids renamed by pi (the verbs that take ids; the others are unchanged)."""
    if call.verb in ("seq_clone", "seq_rm"):
        return Call(call.verb, (pi[call.args[0]], *call.args[1:]))
    if call.verb == "declare_step":
        return Call(call.verb, ([pi[s] for s in call.args[0]],))
    return call


def one_per_orbit(calls: Iterator[Call], symmetries: list[dict[int, int]]) -> Iterator[Call]:
    """The calls, but of those that the state's automorphisms map onto each other only the first made.
    Which one is kept does not matter: one state of each class is explored, and every call of an orbit
    leads to related states (docs/verification.md, "How the cell layout is verified")."""
    if len(symmetries) == 1:   # the identity alone: the common case
        yield from calls
        return
    made: set[str] = set()
    for call in calls:
        if not any(repr(_renamed_call(call, pi)) in made for pi in symmetries[1:]):
            yield call
        made.add(repr(call))


def check_cells(profile: str = "pre-merge", factory: Optional[CellFactory] = None,
                time_budget: Optional[float] = None, *, jobs: int = 1, target: Optional[str] = None,
                progress: bool = False, symmetry: bool = True, engine: str = "processes",
                ray_address: Optional[str] = None, ray_partition_from: Optional[int] = None) -> Any:
    bounds = PROFILES[profile]
    return check_all(bounds, factory, DEFAULT_BUDGET[profile] if time_budget is None else time_budget,
                     jobs=jobs, target=target, progress=progress, layout=layout(bounds, symmetry),
                     engine=engine, ray_address=ray_address, ray_partition_from=ray_partition_from)
