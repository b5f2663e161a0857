"""Lockstep checking of a cell-layout cache against the cell model, and a Hypothesis state machine.

The cell layout's counterpart of `stateful.py`, built the same way and sharing its layout-independent
pieces (`_call`, `_describe`, `rejection_problems`, `ints_and_bad`, `Observe`, the settings profiles):

* `CellLockstep` runs a *target* (any object with `kvcache.CellCache`'s public methods, built by a
  factory from a `kvcache.CacheConfig` and `max_seqs`) side by side with `cell_model`. Every call is
  an op value (`Call(verb, args)` for one call by name, `Forward` for a whole forward); `apply(op)` makes
  it on both and returns the problems, each a sentence that starts with the rule broken. The checks:
  answers equal the model's (values, refusals, and for caller errors a `KVCacheError` naming one of
  the rules the model lists); a refusal or a caller error leaves the target exactly as it was
  (CELL-ATOMIC); every CellStep the target returns is executed on data-level pools of our own, one
  per layer, and every read is checked by definition (CELL-DATA-SOUND, CELL-PLACE, CELL-STEP-SHAPE,
  `cell_model.execute_step`) - this holds for any placement; separately, the step must equal the
  model's canonical one (CELL-LAYOUT-CANON). The cell model checker drives the same class.

* `make_cell_machine(factory)` wraps it in a Hypothesis `RuleBasedStateMachine` with both step
  patterns (a multi-token step of one sequence, a batch of sequences), forks, removals placed
  relative to the newest position, the fork's cut and the windows, clears, a forward left open
  while other calls come in (mid-forward verbs must raise CELL-FORWARD), and bad calls of every verb.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

import kvcache

from . import cell_model as cm
from .model import FLAT, RING
from .stateful import (ConfigSpec, LockstepMachine, Observe, Outcome, _call, _describe, atomic_snapshot, call_target,
                       fingerprint_of, ints_and_bad, rejection_problems, snapshot_unchanged, twin_of,
                       twins_of)

CellFactory = Callable[[kvcache.CacheConfig, int], Any]


def cell_reference_factory(config: kvcache.CacheConfig, max_seqs: int) -> kvcache.CellCache:
    """The default target: the contract-checked reference `kvcache.CellCache`."""
    return kvcache.CellCache(config, max_seqs=max_seqs)


@dataclass(frozen=True)
class CellConfigSpec:
    """A cell-layout configuration in one line: `windows` as in ConfigSpec (0 = flat layer, w = ring
    policy of window w: a window mask for the cell layout), `max_seqs` ids."""

    capacity: int
    windows: tuple[int, ...]
    max_seqs: int = 3
    max_write: Optional[int] = None

    @property
    def n_layers(self) -> int:
        return len(self.windows)

    def cache_config(self) -> kvcache.CacheConfig:
        return ConfigSpec(self.capacity, self.windows, self.max_write).cache_config()

    def model_config(self) -> cm.CellConfig:
        config = cm.make_cell_config(self.capacity, len(self.windows),
                                     [(RING if w else FLAT, w, 1, 1) for w in self.windows],
                                     max_write=self.max_write, max_seqs=self.max_seqs)
        assert isinstance(config, cm.CellConfig), f"{self} is not a valid configuration: {config}"
        return config


# --- operations ------------------------------------------------------------------------------------

#: Every call by name: what it is (a verb that answers and may change the table, a query, the forward's
#: place_step, clear) and the rule a wrong answer breaks. `cell_model` has a function of the same name
#: for each, taking (config, state, *args): one op type drives both sides.
CALLS: dict[str, tuple[str, str]] = {
    "seq_new": ("verb", "CELL-NEW"), "seq_clone": ("verb", "CELL-FORK"), "seq_rm": ("verb", "CELL-RM"),
    "declare_step": ("verb", "CELL-DECLARE"), "place_step": ("place", "CELL-PLACE"),
    "seq_len": ("query", "CELL-OWNERS"), "next_pos": ("query", "CELL-OWNERS"),
    "can_extend": ("query", "CELL-USED-END"), "clear": ("clear", "CELL-CLEAR"),
}


@dataclass(frozen=True)
class Call:
    """One call, any arguments: `Call("seq_rm", (0, 2))` is seq_rm(0, 2) on the target and on the model."""

    verb: str
    args: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.verb not in CALLS:
            raise ValueError(f"unknown cell call {self.verb!r}")


@dataclass(frozen=True)
class Forward:
    """A whole forward: declare_step(seq_ids), then place_step(layer, positions) on every layer in
    `order` (default 0, 1, ...), each step executed and checked."""

    seq_ids: tuple[int, ...]
    positions: tuple[int, ...]
    order: Optional[tuple[int, ...]] = None


CellOp = Union[Call, Forward, Observe]


def _same(outcome: Outcome, answer: Any) -> bool:
    """The target returned exactly the model's answer (True is not 1 here, None is not False)."""
    ok, value = outcome
    return ok and type(value) is type(answer) and value == answer


# --- the lockstep harness ----------------------------------------------------------------------------

@dataclass
class CellLockstep:
    """A cell-layout target and the cell model, driven together. `apply(op)` returns the problems found.

    CELL-ATOMIC is checked by the target's attribute fingerprint (`repr(vars(target))`) before and
    after each call that must change nothing; `thorough` (the default when the target has no
    fingerprint) compares every query's answer instead.
    """

    spec: CellConfigSpec
    factory: CellFactory = cell_reference_factory
    thorough: bool = False
    target: Any = field(init=False)
    state: cm.CellState = field(init=False)          # the model's
    pools: list[cm.Pool] = field(init=False)          # per layer: our data-level pool of the target's cells
    setup_problems: list[str] = field(init=False, default_factory=list)
    clean: Optional[str] = field(init=False, default=None, repr=False, compare=False)  # see call_target

    @functools.cached_property
    def config(self) -> cm.CellConfig:
        return self.spec.model_config()

    def __post_init__(self) -> None:
        self.target = self.factory(self.spec.cache_config(), self.spec.max_seqs)
        self.state = cm.initial(self.config)
        self.pools = [(None,) * self.spec.capacity for _ in range(self.spec.n_layers)]
        for face in ("as_batch_control", "as_cell_stepper"):
            outcome = call_target(self, getattr(self.target, face))
            if outcome != (True, self.target):
                self.setup_problems.append(f"FACES: {face}() {_describe(outcome)}, not the cache itself")

    # --- copying and identity (the model checker) --------------------------------------------------

    def clone(self) -> CellLockstep:
        return twin_of(self, "pools", "setup_problems")

    def twins(self) -> Callable[[], CellLockstep]:
        return twins_of(self, "pools", "setup_problems")

    def fingerprint(self) -> Optional[str]:
        return fingerprint_of(self.target)

    def key(self) -> tuple[Any, ...]:
        """The abstract state, for deduplication: content ids renamed to the model cell holding them
        (a content is written once, never reused), stale contents to None."""
        where = {held[1]: cell for cell, held in enumerate(self.state.written) if held is not None}
        live_contents = {content for _, past in self.state.histories for _, content in past}

        def canon(held: cm.Written) -> Optional[tuple[int, int]]:
            return (held[0], where[held[1]]) if held is not None and held[1] in live_contents else None

        forward = self.state.forward
        return (tuple((s, tuple((p, where[c]) for p, c in past)) for s, past in self.state.histories),
                None if forward is None else (forward.seq_ids, forward.positions, forward.cells, forward.served),
                tuple(tuple(canon(held) for held in pool) for pool in self.pools),
                self.clean if self.clean is not None else self.fingerprint())

    # --- observing --------------------------------------------------------------------------------

    def _queries(self) -> tuple[Any, ...]:
        t = self.target
        ids = range(-1, self.spec.max_seqs + 1)
        return (call_target(self, t.live), call_target(self, t.free_cells), call_target(self, t.used_end), call_target(self, t.capacity),
                tuple(call_target(self, t.seq_len, s) for s in ids), tuple(call_target(self, t.next_pos, s) for s in ids),
                tuple(call_target(self, t.can_extend, n) for n in range(self.spec.capacity + 2)))

    def _snapshot(self) -> tuple[Any, ...]:
        if not self.thorough:
            fingerprint = atomic_snapshot(self)
            if fingerprint is not None:
                return (fingerprint,)
        return (self.fingerprint(), repr(self._queries()))

    def _unchanged(self, before: tuple[Any, ...], what: str) -> list[str]:
        same, after = snapshot_unchanged(self, before)
        return [] if same else [f"CELL-ATOMIC: {what} changed the target: {before!r} -> {after!r}"]

    def observe(self, ns: tuple[int, ...] = ()) -> list[str]:
        """Every query against the model: live ids, free cells, used extent, capacity, seq_len and
        next_pos of every id (a dead or out-of-range id must raise), can_extend(n)."""
        problems: list[str] = []
        t, config, state = self.target, self.config, self.state
        for what, outcome, expected, rule_id in (
                ("live()", call_target(self, t.live), cm.live(state), "CELL-OWNERS"),
                ("free_cells()", call_target(self, t.free_cells), cm.free_cells(config, state), "CELL-USED-END"),
                ("used_end()", call_target(self, t.used_end), cm.used_end(state), "CELL-USED-END"),
                ("capacity()", call_target(self, t.capacity), config.capacity, "CFG-CAPACITY")):
            if not _same(outcome, expected):
                problems.append(f"{rule_id}: {what} {_describe(outcome)}, the model says {expected!r}")
        for seq_id in range(-1, self.spec.max_seqs + 1):
            for name, model_query in (("seq_len", cm.seq_len), ("next_pos", cm.next_pos)):
                problems += self._compare(f"{name}({seq_id})", model_query(config, state, seq_id),
                                          call_target(self, getattr(t, name), seq_id), "CELL-OWNERS")
        for n in ns or range(self.spec.capacity + 2):
            problems += self._compare(f"can_extend({n})", cm.can_extend(config, state, n),
                                      call_target(self, t.can_extend, n), "CELL-USED-END")
        if state.forward is not None and state.forward.positions is not None:
            for layer in range(self.spec.n_layers):  # the model's own consistency: formula == definition
                if cm.mask_by_formula(config, state, layer) != cm.canonical_step(config, state, layer).mask_bits:
                    problems.append(f"CELL-MASK: the model's formula and definition differ on layer {layer}")
        return problems

    @staticmethod
    def _compare(what: str, expected: Any, outcome: Outcome, rule_id: str) -> list[str]:
        if isinstance(expected, cm.CellRejected):
            return rejection_problems(what, expected.rules, expected.argument, outcome)
        return [] if _same(outcome, expected) else [
            f"{rule_id}: {what} {_describe(outcome)}, the model says {expected!r}"]

    # --- single calls, compared -----------------------------------------------------------------------

    def _verb(self, what: str, expected: cm.Result, call: Callable[[], Any], rule_id: str) -> list[str]:
        """A verb that answers a value: compared; a refusal or a caller error must change nothing."""
        before = self._snapshot()
        outcome = call_target(self, call)
        if isinstance(expected, cm.CellRejected):
            return rejection_problems(what, expected.rules, expected.argument, outcome) + self._unchanged(before, what)
        answer, state = expected
        problems = self._compare(what, answer, outcome, rule_id)
        if answer is None or answer is False:
            problems += self._unchanged(before, what)
        self.state = state
        return problems

    def _place(self, layer: Any, positions: Any) -> list[str]:
        expected = cm.place_step(self.config, self.state, layer, positions)
        what = f"place_step({layer!r}, {positions!r})"
        before_state = self.state
        before = self._snapshot()
        outcome = call_target(self, self.target.place_step, layer, positions)
        if isinstance(expected, cm.CellRejected):
            return rejection_problems(what, expected.rules, expected.argument, outcome) + self._unchanged(before, what)
        model_step, state = expected
        self.state = state
        ok, step = outcome
        if not ok or step is None:
            return [f"CELL-PLACE: {what} {_describe(outcome)}; the model issues {model_step}"]
        assert before_state.forward is not None
        forward = (before_state.forward if before_state.forward.positions is not None
                   else cm.placement(self.config, before_state, positions).forward)
        assert forward is not None
        pool, problems = cm.execute_step(self.config, state, forward, layer, self.pools[layer], step)
        self.pools[layer] = pool
        if problems:
            return [f"{p} ({what})" for p in problems]
        seen = cm.CellStep(step.length, step.read_len, tuple(step.cells), bytes(step.mask_bits))
        if seen != model_step:
            return [f"CELL-LAYOUT-CANON: {what} returned {seen}; the canonical step is {model_step}"]
        return []

    def apply(self, op: CellOp) -> list[str]:
        problems = list(self.setup_problems)
        self.setup_problems = []
        if isinstance(op, Call):
            problems += self._apply_call(op.verb, op.args)
        elif isinstance(op, Forward):
            expected = cm.declare_step(self.config, self.state, list(op.seq_ids))
            problems += self._apply_call("declare_step", (list(op.seq_ids),))
            if not problems and not isinstance(expected, cm.CellRejected) and expected[0] is True:
                for layer in op.order or range(self.spec.n_layers):
                    problems += self._place(layer, op.positions)
        elif isinstance(op, Observe):
            problems += self.observe(op.ns)
        else:
            raise TypeError(f"not a cell operation: {op!r}")
        return problems

    def _apply_call(self, verb: str, args: tuple[Any, ...]) -> list[str]:
        kind, rule_id = CALLS[verb]
        what = f"{verb}({', '.join(repr(a) for a in args)})"
        model_call: Callable[..., Any] = getattr(cm, verb)
        target_call: Callable[..., Any] = getattr(self.target, verb)
        if kind == "place":
            return self._place(*args)
        if kind == "clear":
            self.state = cm.clear(self.config, self.state)
            outcome = call_target(self, target_call)
            return [] if _same(outcome, None) else [f"{rule_id}: clear() {_describe(outcome)}"]
        if kind == "query":
            before = self._snapshot()
            return (self._compare(what, model_call(self.config, self.state, *args), call_target(self, target_call, *args), rule_id)
                    + self._unchanged(before, what))
        return self._verb(what, model_call(self.config, self.state, *args), lambda: target_call(*args), rule_id)

    # --- what the drivers may do next ----------------------------------------------------------------

    def newest(self, seq_id: int) -> int:
        """The newest position `seq_id` holds (-1 when none): a new token must be above it (CELL-POS)."""
        past = cm.history(self.state, seq_id) or ()
        return past[-1][0] if past else -1

    def positions_for(self, seq_ids: tuple[int, ...], gaps: tuple[int, ...] = ()) -> tuple[int, ...]:
        """Valid positions for a forward of `seq_ids`: per sequence, increasing from its next position,
        token k skipping gaps[k] positions (0: none)."""
        newest = {s: self.newest(s) for s in seq_ids}
        positions = []
        for k, seq_id in enumerate(seq_ids):
            newest[seq_id] += 1 + (gaps[k] if k < len(gaps) else 0)
            positions.append(newest[seq_id])
        return tuple(positions)


# --- the state machine -------------------------------------------------------------------------------

def cell_config_specs(max_capacity: int = 12) -> st.SearchStrategy[CellConfigSpec]:
    """Small pools (so they fill up), flat and windowed layers (windows 1-4, one past small capacities)."""
    window = st.one_of(st.just(0), st.integers(1, 4))
    return st.builds(CellConfigSpec, capacity=st.one_of(st.integers(1, 3), st.integers(4, max_capacity),
                                                        st.integers(4, max_capacity)),
                     windows=st.lists(window, min_size=1, max_size=3).map(tuple),
                     max_seqs=st.integers(1, 4), max_write=st.one_of(st.none(), st.integers(1, 3)))


ANCHORS = ("start", "newest", "cut", "window")


def make_cell_machine(factory: CellFactory = cell_reference_factory, *, name: str = "CellMachine",
                      configs: Optional[st.SearchStrategy[CellConfigSpec]] = None) -> type[RuleBasedStateMachine]:
    """A state machine running `factory`'s cell caches in lockstep with the cell model. Paste a
    failure's program next to `Name = make_cell_machine(factory, name="Name")`."""
    config_strategy = cell_config_specs() if configs is None else configs

    class Machine(LockstepMachine[CellLockstep]):
        def __init__(self) -> None:
            super().__init__()
            self.cuts: dict[int, int] = {}       # fork id -> its cut (for removals around it)

        def idle(self) -> bool:
            return self.h is not None and self.h.state.forward is None

        def live(self) -> list[int]:
            return sorted(cm.live(self.lock.state))

        def pick(self, k: int) -> int:
            ids = self.live()
            return ids[k % len(ids)]

        @initialize(config=config_strategy)
        def configure(self, config: CellConfigSpec) -> None:
            self.start(CellLockstep(config, factory))

        # --- sequences
        @precondition(lambda self: self.idle())
        @rule()
        def seq_new(self) -> None:
            self.check(self.lock.apply(Call("seq_new")))

        @precondition(lambda self: self.idle() and self.live())
        @rule(k=st.integers(0, 3), upto=st.one_of(st.none(), st.integers(0, 6)))
        def seq_clone(self, k: int, upto: Optional[int]) -> None:
            before, src = cm.live(self.lock.state), self.pick(k)
            cut = self.lock.newest(src) + 1 if upto is None else upto
            self.check(self.lock.apply(Call("seq_clone", (src, upto))))
            for new in cm.live(self.lock.state) - before:
                self.cuts[new] = cut

        @precondition(lambda self: self.idle() and self.live())
        @rule(k=st.integers(0, 3), anchor=st.sampled_from(ANCHORS), offset=st.integers(-3, 2),
              length=st.one_of(st.none(), st.integers(0, 3)), layer=st.integers(0, 2))
        def seq_rm(self, k: int, anchor: str, offset: int, length: Optional[int], layer: int) -> None:
            """[p0, p0 + length) (None: to the end), p0 around the start, the newest position, the
            sequence's cut (a fork) or the window of one layer back from the newest position."""
            seq_id = self.pick(k)
            newest = self.lock.newest(seq_id)
            windows = self.lock.spec.windows
            base = {"start": 0, "newest": newest, "cut": self.cuts.get(seq_id, newest),
                    "window": newest - (windows[layer % len(windows)] or newest + 1) + 1}[anchor]
            p0 = max(0, base + offset)
            self.check(self.lock.apply(Call("seq_rm", (seq_id, p0, None if length is None else p0 + length))))

        # --- the two step patterns
        @precondition(lambda self: self.idle() and self.live())
        @rule(k=st.integers(0, 3), gaps=st.lists(st.sampled_from((0, 0, 0, 1, 3)), min_size=1, max_size=4),
              order=st.randoms(use_true_random=False))
        def forward_one_sequence(self, k: int, gaps: list[int], order: Any) -> None:
            """A multi-token step (a prompt chunk, or a token plus drafts) of one sequence."""
            seq_ids = (self.pick(k),) * len(gaps)
            layers = list(range(self.lock.spec.n_layers))
            order.shuffle(layers)
            self.check(self.lock.apply(Forward(seq_ids, self.lock.positions_for(seq_ids, tuple(gaps)), tuple(layers))))

        @precondition(lambda self: self.idle() and len(self.live()) >= 2)
        @rule(picks=st.lists(st.integers(0, 3), min_size=2, max_size=5),
              gaps=st.lists(st.sampled_from((0, 0, 1)), max_size=5))
        def forward_batch(self, picks: list[int], gaps: list[int]) -> None:
            """A batch: tokens of several sequences, interleaved in the given order."""
            seq_ids = tuple(self.pick(k) for k in picks)
            self.check(self.lock.apply(Forward(seq_ids, self.lock.positions_for(seq_ids, tuple(gaps)))))

        # --- a forward left open: mid-forward verbs, layers one by one, abandoning it
        @precondition(lambda self: self.idle() and self.live())
        @rule(picks=st.lists(st.integers(0, 3), min_size=1, max_size=3))
        def declare_only(self, picks: list[int]) -> None:
            self.check(self.lock.apply(Call("declare_step", ([self.pick(k) for k in picks],))))

        @precondition(lambda self: self.h is not None and self.h.state.forward is not None)
        @rule(layer=st.integers(0, 2), gaps=st.lists(st.sampled_from((0, 1)), max_size=3))
        def place_one_layer(self, layer: int, gaps: list[int]) -> None:
            forward = self.lock.state.forward
            assert forward is not None
            positions = forward.positions or self.lock.positions_for(forward.seq_ids, tuple(gaps))
            self.check(self.lock.apply(Call("place_step", (layer % self.lock.spec.n_layers, list(positions)))))

        @precondition(lambda self: self.h is not None and self.h.state.forward is not None)
        @rule(verb=st.sampled_from(("seq_new", "seq_clone", "seq_rm", "declare_step")), k=st.integers(0, 3))
        def verb_mid_forward(self, verb: str, k: int) -> None:
            """CELL-FORWARD: a table-changing verb while a forward is open raises and changes nothing."""
            seq_id = self.pick(k) if self.live() else k
            ops: dict[str, CellOp] = {"seq_new": Call("seq_new"), "seq_clone": Call("seq_clone", (seq_id,)), "seq_rm": Call("seq_rm", (seq_id, 0)),
                                      "declare_step": Call("declare_step", ([seq_id],))}
            op = ops[verb]
            self.check(self.lock.apply(op))

        @precondition(lambda self: self.h is not None and self.h.state.forward is not None)
        @rule()
        def abandon_forward(self) -> None:
            """clear() is the escape hatch from an open forward (CELL-FORWARD, CELL-CLEAR)."""
            self.check(self.lock.apply(Call("clear")))
            self.cuts.clear()

        @precondition(lambda self: self.h is not None and self.h.state.forward is not None)
        @rule(offset=st.integers(-1, 1))
        def place_other_positions(self, offset: int) -> None:
            """Positions that differ from the first layer's, or break CELL-POS, or a wrong count."""
            forward = self.lock.state.forward
            assert forward is not None
            positions = list(forward.positions or self.lock.positions_for(forward.seq_ids))
            positions[-1] += offset
            self.check(self.lock.apply(Call("place_step", (0, positions if offset else positions + [positions[-1] + 1]))))

        @precondition(lambda self: self.h is not None and len(cm.live(self.h.state)) >= 2)
        @rule()
        def clear(self) -> None:
            self.check(self.lock.apply(Call("clear")))
            self.cuts.clear()

        # --- bad calls and probes (each must change nothing); one rule, so they do not crowd out the verbs
        @rule(kind=st.sampled_from(("declare", "place", "seq_rm", "seq_clone", "query", "can_extend")),
              data=st.data())
        def bad_call_or_probe(self, kind: str, data: st.DataObject) -> None:
            draw = data.draw
            ids, small = ints_and_bad(-1, 5), ints_and_bad(0, 6)
            args: tuple[Any, ...]
            if kind == "declare":
                args = (draw(st.one_of(st.lists(ids, max_size=4), st.sampled_from(((), "01", {0}, None)))),)
            elif kind == "place":
                args = (draw(ints_and_bad(-1, 3)), draw(st.one_of(st.lists(ints_and_bad(0, 9), max_size=4),
                                                                  st.sampled_from(("0", None, (0.0,))))))
            elif kind == "seq_rm":
                args = (draw(ids), draw(small), draw(st.one_of(st.none(), small)))
            elif kind == "seq_clone":
                args = (draw(ids), draw(st.one_of(st.none(), small)))
            elif kind == "query":
                kind, args = draw(st.sampled_from(("seq_len", "next_pos"))), (draw(ids),)
            else:
                args = (draw(ints_and_bad(0, 10)),)
            op = Call({"declare": "declare_step", "place": "place_step"}.get(kind, kind), args)
            before = cm.live(self.lock.state)
            self.check(self.lock.apply(op))
            for new in cm.live(self.lock.state) - before:  # a valid clone: remember its cut
                upto = op.args[1] if op.verb == "seq_clone" else None
                self.cuts[new] = upto if isinstance(upto, int) and not isinstance(upto, bool) else 0

    Machine.__name__ = Machine.__qualname__ = name
    return Machine


__all__ = ["CALLS", "Call", "CellConfigSpec", "CellLockstep", "Forward", "Observe", "cell_config_specs",
           "cell_reference_factory", "make_cell_machine"]
