"""The executable spec model: small, pure, brute force.

State is an immutable value; every operation is a function `(config, state, args) -> result`.
The ground truth is data-level (DATA-SOUND): the model keeps each layer's pool as slot -> row,
where a row is (logical position, content tag), and a "truth" tag per logical position of the
current branch. A step is sound when every row it reads holds (position, truth[position]).

Everything else is derived by brute force from that: plans are built position by position from the
canonical slot function (LAYOUT-CANON) and the attention span; depth is the number of distinct
slots; retained_from is found by scanning the pool; rewind succeeds iff a simulated next step reads
only sound rows. This module does not import `kvcache`: the model and the reference are independent.

A call the spec rejects returns `Rejected(rule, argument)`; a refusal returns None (plan) or False
(rewind) and the state unchanged. (ET-MAP: the ExecuTorch adapter maps a Rejected to InvalidArgument,
a refused plan to OutOfResources and a refused rewind to InvalidArgument.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence, TypeGuard, Union

INT_MAX = 2**31 - 1
FLAT, RING = 0, 1

Runs = tuple[tuple[int, int], ...]            # ((start, len), ...) physical runs in logical order
Row = tuple[int, int]                         # (logical position, content tag)


@dataclass(frozen=True)
class Plan:
    write: Runs
    read: Runs
    read_base_pos: int


@dataclass(frozen=True)
class Rejected:
    """The spec rejects the call (a caller error): `rule` is a rule id, `argument` what is at fault."""

    rule: str
    argument: str


@dataclass(frozen=True)
class Layer:
    """CFG-DEDUP: a layer's layout depends only on its own Layer (the model keeps one per layer)."""

    kind: int
    window: int
    max_write: Optional[int]  # effective: a ring layer's max_write (its window when unset); None for flat


@dataclass(frozen=True)
class Config:
    capacity: int
    layers: tuple[Layer, ...]  # one per layer, broadcast already applied


@dataclass(frozen=True)
class State:
    length: int                            # LEN-BOUNDS: one length for the whole model, in [0, capacity]
    open_step: Optional[tuple[int, int]]   # (position, T) of the step last committed, still open
    truth: tuple[int, ...]                 # content tag of each position in [0, length)
    pools: tuple[tuple[Optional[Row], ...], ...]  # per layer: slot -> row held, None if never written
    open_tag: Optional[int]                # content tag of the open step's tokens
    next_tag: int                          # tags are never reused, so a stale row never looks current


def _is_int(value: Any) -> TypeGuard[int]:
    """ARG-INT: exactly an int (bool and every other subclass of int are not)."""
    return type(value) is int


# --- configuration ------------------------------------------------------------------------------

def make_config(capacity: Any, n_layers: Any, layers: Any, initial_capacity: Any = 512,
                max_write: Any = None) -> Union[Config, Rejected]:
    """Check a raw configuration. `layers` is a sequence of (kind, window, n_kv_heads, head_dim).

    CFG-TYPE: every integer field is an int (bool is not) in [low, INT_MAX]; a violation is rejected
    under the field's own rule.
    """
    def bad_int(value: Any, low: int) -> bool:
        return not _is_int(value) or not low <= value <= INT_MAX

    if bad_int(capacity, 1):
        return Rejected("CFG-CAPACITY", "capacity")
    if bad_int(n_layers, 1):
        return Rejected("CFG-LAYERS", "n_layers")
    if not isinstance(layers, (list, tuple)) or len(layers) not in (1, n_layers):
        return Rejected("CFG-LAYERS", "layers")
    for entry in layers:
        kind, window, n_kv_heads, head_dim = entry
        if kind not in (FLAT, RING) or isinstance(kind, bool) or not _is_int(kind):
            return Rejected("CFG-POLICY", "kind")
        if bad_int(window, 0) or (kind == FLAT and window != 0) or (kind == RING and window < 1):
            return Rejected("CFG-POLICY", "window")
        if bad_int(n_kv_heads, 1):
            return Rejected("CFG-SHAPE", "n_kv_heads")
        if bad_int(head_dim, 1):
            return Rejected("CFG-SHAPE", "head_dim")
    if bad_int(initial_capacity, 0):
        return Rejected("CFG-INITIAL-CAPACITY", "initial_capacity")
    if max_write is not None and bad_int(max_write, 1):
        return Rejected("CFG-MAX-WRITE", "max_write")
    per_layer = [layers[0] if len(layers) == 1 else layers[i] for i in range(n_layers)]
    return Config(capacity, tuple(
        Layer(kind, window, None if kind == FLAT else (window if max_write is None else max_write))
        for kind, window, _, _ in per_layer))


# --- layout, by brute force ------------------------------------------------------------------------

def slot(layer: Layer, position: int) -> int:
    """LAYOUT-CANON: the physical row of a logical position."""
    if layer.kind == FLAT:
        return position
    assert layer.max_write is not None
    return position % (layer.window + layer.max_write - 1)


def depth_of(config: Config, layer: Layer) -> int:
    """DEPTH: the number of distinct rows the positions of a full sequence occupy."""
    return len({slot(layer, q) for q in range(config.capacity)})


def attends(layer: Layer, token: int) -> range:
    """The keys one token attends to: all before it (flat) or the last `window`, itself included (ring)."""
    return range(0, token + 1) if layer.kind == FLAT else range(max(0, token - layer.window + 1), token + 1)


def read_span(layer: Layer, position: int, T: int) -> range:
    """PLAN-READ: the union of the new tokens' attention spans, which must be one contiguous range."""
    keys = sorted(set().union(*(attends(layer, t) for t in range(position, position + T))))
    assert keys == list(range(keys[0], keys[-1] + 1)), "attention spans of consecutive tokens are contiguous"
    return range(keys[0], keys[-1] + 1)


def group_runs(slots: Sequence[int]) -> Runs:
    """Consecutive physical rows, in the given (logical) order, grouped into runs."""
    runs: list[tuple[int, int]] = []
    for s in slots:
        if runs and runs[-1][0] + runs[-1][1] == s:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((s, 1))
    return tuple(runs)


def canonical_plan(layer: Layer, position: int, T: int) -> Plan:
    """PLAN-WRITE, PLAN-READ, LAYOUT-CANON: built position by position."""
    span = read_span(layer, position, T)
    return Plan(write=group_runs([slot(layer, q) for q in range(position, position + T)]),
                read=group_runs([slot(layer, q) for q in span]),
                read_base_pos=span.start)


def step_limit(config: Config) -> Optional[int]:
    """STEP-T-MAX: a step is planned for every layer, so it fits the smallest ring max_write."""
    limits = [layer.max_write for layer in config.layers if layer.max_write is not None]
    return min(limits) if limits else None


# --- the data level ------------------------------------------------------------------------------

def initial(config: Config) -> State:
    return State(length=0, open_step=None, truth=(), open_tag=None, next_tag=0,
                 pools=tuple((None,) * depth_of(config, layer) for layer in config.layers))


def step_truth(state: State, position: int, T: int) -> tuple[int, ...]:
    """The truth the step (position, T) establishes: its tokens get the open step's tag or a fresh one."""
    tag = state.open_tag if state.open_step == (position, T) else state.next_tag
    assert tag is not None
    return state.truth[:position] + (tag,) * T


def positions_of(runs: Runs, first: int) -> list[tuple[int, int]]:
    """(physical row, logical position) for every row of `runs`, positions counting up from `first`."""
    rows = [start + i for start, length in runs for i in range(length)]
    return [(row, first + i) for i, row in enumerate(rows)]


def execute(pool: tuple[Optional[Row], ...], truth: tuple[int, ...], position: int, T: int,
            plan: Plan) -> tuple[tuple[Optional[Row], ...], list[str]]:
    """Play the backend: write the step's rows, then read, checking DATA-SOUND and the plan's coverage.

    Works for any plan (a target's layout may differ from the canonical one). Returns the new pool
    and the problems found, each a sentence naming the rule broken.
    """
    problems: list[str] = []
    cells = list(pool)
    writes = positions_of(plan.write, position)
    if len(writes) != T:
        problems.append(f"PLAN-WRITE: the write runs hold {len(writes)} rows, not T={T}")
    for row, q in writes:
        if not 0 <= row < len(cells):
            problems.append(f"PLAN-SHAPE: write of position {q} to row {row} outside [0, {len(cells)})")
            continue
        cells[row] = (q, truth[q]) if q < len(truth) else (q, -1)
    reads = positions_of(plan.read, plan.read_base_pos)
    if reads and reads[-1][1] != position + T - 1:
        problems.append(f"PLAN-READ: the read runs end at position {reads[-1][1]}, not {position + T - 1}")
    for row, q in reads:
        if not 0 <= row < len(cells):
            problems.append(f"PLAN-SHAPE: read of position {q} at row {row} outside [0, {len(cells)})")
        elif q >= len(truth) or cells[row] != (q, truth[q]):
            problems.append(f"DATA-SOUND: row {row} read as position {q} holds {cells[row]}")
    return tuple(cells), problems


# --- the operations ------------------------------------------------------------------------------

def check_layer(config: Config, layer: Any) -> Optional[Rejected]:
    if not _is_int(layer):
        return Rejected("ARG-INT", "layer")
    if not 0 <= layer < len(config.layers):
        return Rejected("LAYER-RANGE", "layer")
    return None


def check_step(config: Config, state: State, position: Any, T: Any) -> Optional[Rejected]:
    """ARG-*, STEP-T, STEP-T-MAX, STEP-APPEND, in that order."""
    if not _is_int(position):
        return Rejected("ARG-INT", "position")
    if not 0 <= position <= INT_MAX:
        return Rejected("ARG-RANGE", "position")
    if not _is_int(T):
        return Rejected("ARG-INT", "T")
    if not 1 <= T <= INT_MAX:
        return Rejected("STEP-T", "T")
    limit = step_limit(config)
    if limit is not None and T > limit:
        return Rejected("STEP-T-MAX", "T")
    if position != state.length and state.open_step != (position, T):
        return Rejected("STEP-APPEND", "position")
    return None


def plan(config: Config, state: State, layer: Any, position: Any, T: Any) -> Union[Plan, None, Rejected]:
    """PLAN-PURE: no new state. None is the only refusal (ADMIT)."""
    problem = check_layer(config, layer) or check_step(config, state, position, T)
    if problem:
        return problem
    if position + T > config.capacity:
        return None
    return canonical_plan(config.layers[layer], position, T)


def can_extend(config: Config, state: State, n: Any = 1) -> Union[bool, Rejected]:
    if not _is_int(n):
        return Rejected("ARG-INT", "n")
    if not 0 <= n <= INT_MAX:
        return Rejected("ARG-RANGE", "n")
    return state.length + n <= config.capacity


def current_steps(config: Config, state: State) -> list[tuple[int, int]]:
    """Every step plan() accepts now: the open step, and each admissible new step at the length."""
    limit = step_limit(config)
    top = config.capacity - state.length if limit is None else min(limit, config.capacity - state.length)
    steps = [(state.length, T) for T in range(1, top + 1)]
    return ([state.open_step] if state.open_step else []) + steps


def commit(config: Config, state: State, plan_: Any) -> Union[State, Rejected]:
    """COMMIT-ISSUED by search: the plan must equal the plan of some layer for some current step."""
    if type(plan_) is not Plan:  # ARG-TYPE: exactly a Plan; a subclass could answer its own ==
        return Rejected("ARG-TYPE", "plan")
    for position, T in current_steps(config, state):
        if any(canonical_plan(layer, position, T) == plan_ for layer in config.layers):
            if state.open_step == (position, T):
                return state  # COMMIT-ADVANCE: idempotent within the step
            return replace(state, length=position + T, open_step=(position, T),
                           truth=step_truth(state, position, T), open_tag=state.next_tag,
                           next_tag=state.next_tag + 1)
    return Rejected("COMMIT-ISSUED", "plan")


def run_layer(config: Config, state: State, layer: int, position: int, T: int) -> tuple[State, list[str]]:
    """The backend's work for one layer of a step: execute the canonical plan on the model's pool."""
    truth = step_truth(state, position, T)
    pool, problems = execute(state.pools[layer], truth, position, T,
                             canonical_plan(config.layers[layer], position, T))
    pools = state.pools[:layer] + (pool,) + state.pools[layer + 1:]
    return replace(state, pools=pools), problems


def next_step_sound(config: Config, state: State) -> bool:
    """Would every admissible next step, on every layer, read only sound rows? (tried, not computed)"""
    for position, T in current_steps(config, replace(state, open_step=None)):
        trial = state
        for index in range(len(config.layers)):
            trial, problems = run_layer(config, trial, index, position, T)
            if problems:
                return False
    return True


def rewind(config: Config, state: State, new_len: Any) -> Union[tuple[bool, State], Rejected]:
    """REWIND-GROW, REWIND-SOUND by simulation; ATOMIC on refusal."""
    if not _is_int(new_len):
        return Rejected("ARG-INT", "new_len")
    if not 0 <= new_len <= INT_MAX:
        return Rejected("ARG-RANGE", "new_len")
    if new_len > state.length:
        return False, state
    candidate = replace(state, length=new_len, open_step=None, open_tag=None, truth=state.truth[:new_len])
    if not next_step_sound(config, candidate):
        return False, state
    return True, candidate


def rewind_floor(config: Config, state: State) -> int:
    """The smallest r such that every rewind target in [r, length] succeeds (found by search)."""
    floor = state.length
    while floor > 0:
        outcome = rewind(config, state, floor - 1)
        if isinstance(outcome, Rejected) or not outcome[0]:
            break
        floor -= 1
    return floor


def clear(config: Config, state: State) -> State:
    """CLEAR: forget the sequence; the pools keep stale rows whose tags never match again."""
    return replace(state, length=0, open_step=None, open_tag=None, truth=())


def retained_from(config: Config, state: State, layer: Any) -> Union[int, Rejected]:
    """RETAINED: scan down from the length while the layer still holds the current row.

    The open step counts as written on every layer: mid-way through a per-layer step the cache cannot
    know which layers ran it (plan is pure), so the scan runs on the pool with the step (re)executed.
    Executing it again is harmless on a layer that already ran it: the same rows get the same tags.
    """
    problem = check_layer(config, layer)
    if problem:
        return problem
    if state.open_step is not None:
        state, _ = run_layer(config, state, layer, *state.open_step)
    spec_layer, pool = config.layers[layer], state.pools[layer]
    oldest = state.length
    while oldest > 0 and pool[slot(spec_layer, oldest - 1)] == (oldest - 1, state.truth[oldest - 1]):
        oldest -= 1
    return oldest


def depth(config: Config, layer: Any) -> Union[int, Rejected]:
    problem = check_layer(config, layer)
    return problem if problem else depth_of(config, config.layers[layer])
