"""The executable spec model of the cell layout: small, pure, brute force.

Many sequences share one pool of per-token cells. The ground truth is data-level (CELL-DATA-SOUND):
every live sequence has a *history*, the tuple of (position, content id) it has written - a fork's
history is its source's history below the cut, then its own - and a query token must attend exactly
the cells holding its own sequence's history inside its window. Content ids are fresh for every token
placed and never reused, so a stale cell can never look current.

The cell table is not kept as bookkeeping: the model keeps what each cell was last *written* with
(position, content id), and everything else is derived from the histories by definition:
- a cell is occupied iff its content is in some live history, free otherwise (CELL-RM, CELL-CLEAR);
- its owners are the live sequences whose history holds its content (CELL-OWNERS, CELL-ID-REUSE);
- seq_len(s) is the length of s's history, next_pos(s) one past its newest position;
- a step's mask bit (i, j) is 1 iff cell j's content is in the history of token i's sequence at a
  position inside token i's window (CELL-WINDOW-POS) - never the owner/position formula (CELL-MASK).

Every verb is a function `(config, state, args) -> (answer, new state)`, or a `Rejected` for a caller
error (the state then is unchanged, CELL-ATOMIC). A call that breaks several rules is rejected with
the first in the model's order and lists the others in `Rejected.also`: an implementation may name
any of them (SPEC.md, "The cell layout": one caller error, several rules).

`execute_step` plays the backend for any implementation's CellStep: it writes each query token's
content into the step's cell of a data-level pool of our own and checks every read by definition.

This module does not import `kvcache`: the model and the reference are independent.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence, Union

from .model import INT_MAX, RING, Config, Layer, Rejected, _is_int, check_layer, make_config

MAX_SEQS = 64                                  # CELL-MAX-SEQS: upstream's kMaxSeqs, one owner bit each
MAX_POSITION = INT_MAX - 1                     # CELL-POS: the largest position, so next_pos fits an int

History = tuple[tuple[int, int], ...]          # ((position, content id), ...), positions strictly increasing
Written = Optional[tuple[int, int]]            # what a cell was last written with: (position, content id)


@dataclass(frozen=True)
class CellRejected(Rejected):
    """A caller error; `also` names the other rules the same call breaks (any of them may be raised)."""

    also: tuple[str, ...] = field(default=(), compare=False)  # a rejection is its (rule, argument)

    @property
    def rules(self) -> tuple[str, ...]:
        return (self.rule,) + self.also


@dataclass(frozen=True)
class CellConfig:
    base: Config                               # capacity and the layers (CFG-*, broadcast applied)
    max_seqs: int

    @property
    def capacity(self) -> int:
        return self.base.capacity

    @property
    def layers(self) -> tuple[Layer, ...]:
        return self.base.layers


@dataclass(frozen=True)
class Forward:
    """An open forward (CELL-FORWARD): the declared ids, and once the first layer is served the
    positions, the placement (cells) and the content id of each token, and the layers served."""

    seq_ids: tuple[int, ...]
    positions: Optional[tuple[int, ...]] = None
    cells: Optional[tuple[int, ...]] = None
    contents: Optional[tuple[int, ...]] = None
    served: frozenset[int] = frozenset()


@dataclass(frozen=True)
class CellState:
    written: tuple[Written, ...]               # cell -> last (position, content id) written, None if never
    histories: tuple[tuple[int, History], ...]  # (id, history) of every live id, ids increasing
    forward: Optional[Forward]
    next_content: int                          # content ids are never reused


@dataclass(frozen=True)
class CellStep:
    """The model's CellStep: the same fields as the API's (CELL-STEP-SHAPE)."""

    length: int
    read_len: int
    cells: tuple[int, ...]
    mask_bits: bytes

    def attends(self, i: int, j: int) -> bool:
        return self.mask_bits[i * self.read_len + j] == 1


def mask_rows(step: Any) -> list[str]:
    """A CellStep's mask as one string per query token, "1" where it attends ("0110": cells 1 and 2)."""
    n = step.read_len
    return ["".join(str(b) for b in step.mask_bits[i * n:(i + 1) * n]) for i in range(step.length)]


Answer = Any
Result = Union[tuple[Answer, CellState], CellRejected]


def _reject(broken: Sequence[tuple[str, str]]) -> Optional[CellRejected]:
    """The first broken (rule, argument) as the rejection, the others' rules as `also`."""
    if not broken:
        return None
    rules = tuple(dict.fromkeys(rule for rule, _ in broken[1:] if rule != broken[0][0]))
    return CellRejected(broken[0][0], broken[0][1], rules)


# --- configuration ------------------------------------------------------------------------------

def make_cell_config(capacity: Any, n_layers: Any, layers: Any, initial_capacity: Any = 512,
                     max_write: Any = None, kv_dtype: Any = None,
                     max_seqs: Any = MAX_SEQS) -> Union[CellConfig, Rejected]:
    """The sequence cache's configuration rules (CFG-*), kv_dtype (CFG-TYPE: None or an int >= 0,
    unused by the layout) and CELL-MAX-SEQS. max_write is valid per CFG-MAX-WRITE and has no effect:
    cells are never evicted, so a step cannot overwrite what it reads."""
    base = make_config(capacity, n_layers, layers, initial_capacity, max_write)
    if isinstance(base, Rejected):
        return base
    if kv_dtype is not None and (not _is_int(kv_dtype) or not 0 <= kv_dtype <= INT_MAX):
        return Rejected("CFG-TYPE", "kv_dtype")
    if not _is_int(max_seqs) or not 1 <= max_seqs <= MAX_SEQS:
        return Rejected("CELL-MAX-SEQS", "max_seqs")
    return CellConfig(base, max_seqs)


def initial(config: CellConfig) -> CellState:
    return CellState(written=(None,) * config.capacity, histories=(), forward=None, next_content=0)


# --- derived views (by definition, from the histories) -------------------------------------------

def history(state: CellState, seq_id: int) -> Optional[History]:
    """The history of a live id; None when the id is not live."""
    for live_id, past in state.histories:
        if live_id == seq_id:
            return past
    return None


def live(state: CellState) -> frozenset[int]:
    return frozenset(seq_id for seq_id, _ in state.histories)


def owners(state: CellState, cell: int) -> frozenset[int]:
    """CELL-OWNERS, CELL-ID-REUSE: the live ids whose history holds this cell's content."""
    held = state.written[cell]
    return frozenset() if held is None else frozenset(
        seq_id for seq_id, past in state.histories if held in past)


def occupied(state: CellState) -> tuple[int, ...]:
    return tuple(cell for cell in range(len(state.written)) if owners(state, cell))


def free_cells(config: CellConfig, state: CellState) -> int:
    """CELL-USED-END: capacity minus the occupied cells."""
    return config.capacity - len(occupied(state))


def used_end(state: CellState) -> int:
    """CELL-USED-END: one past the highest occupied cell, 0 when none."""
    cells = occupied(state)
    return cells[-1] + 1 if cells else 0


def window_of(layer: Layer, q: int) -> range:
    """CELL-WINDOW-POS: the positions a query at q may see - [q - w + 1, q] (ring policy), [0, q] (flat)."""
    return range(max(0, q - layer.window + 1) if layer.kind == RING else 0, q + 1)


def expected_reads(config: CellConfig, state: CellState, layer: int, seq_id: int, q: int) -> frozenset[tuple[int, int]]:
    """CELL-DATA-SOUND: the (position, content) a query of `seq_id` at q must see on `layer`."""
    seen = window_of(config.layers[layer], q)
    return frozenset(entry for entry in history(state, seq_id) or () if entry[0] in seen)


# --- the verbs between forwards -------------------------------------------------------------------

def _seq_id_problems(config: CellConfig, value: Any, argument: str) -> list[tuple[str, str]]:
    if not _is_int(value):
        return [("ARG-INT", argument), ("CELL-SEQ-ID", argument)]  # CELL-SEQ-ID's statement names the type too
    if not 0 <= value < config.max_seqs:
        return [("CELL-SEQ-ID", argument)]
    return []


def _live_problems(state: CellState, value: Any, argument: str) -> list[tuple[str, str]]:
    return [] if value in live(state) else [("CELL-SEQ-LIVE", argument)]


def _int_problems(value: Any, argument: str, low: int = 0, high: int = INT_MAX) -> list[tuple[str, str]]:
    if not _is_int(value):
        return [("ARG-INT", argument)]
    if not low <= value <= high:
        return [("ARG-RANGE", argument)]
    return []


def _forward_problems(state: CellState) -> list[tuple[str, str]]:
    return [("CELL-FORWARD", "forward")] if state.forward is not None else []


def _verb_problems(config: CellConfig, state: CellState, seq_id: Any, argument: str,
                   other_arguments: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A table-changing verb on one id, in the model's order: the id (ARG-INT, CELL-SEQ-ID), the other
    arguments, the open forward (CELL-FORWARD), then liveness (CELL-SEQ-LIVE, for a valid id only)."""
    id_problems = _seq_id_problems(config, seq_id, argument)
    return (id_problems + other_arguments + _forward_problems(state)
            + ([] if id_problems else _live_problems(state, seq_id, argument)))


def _with_history(state: CellState, seq_id: int, past: Optional[History]) -> CellState:
    """The state with `seq_id`'s history replaced (None: the id stops being live)."""
    others = [(i, h) for i, h in state.histories if i != seq_id]
    if past is not None:
        others.append((seq_id, past))
    return replace(state, histories=tuple(sorted(others)))


def _lowest_free_id(config: CellConfig, state: CellState) -> Optional[int]:
    taken = live(state)
    return next((i for i in range(config.max_seqs) if i not in taken), None)


def seq_new(config: CellConfig, state: CellState) -> Result:
    """CELL-NEW: the lowest id not live, with an empty history; None when all are live."""
    rejected = _reject(_forward_problems(state))
    if rejected:
        return rejected
    seq_id = _lowest_free_id(config, state)
    if seq_id is None:
        return None, state
    return seq_id, _with_history(state, seq_id, ())


def seq_clone(config: CellConfig, state: CellState, src: Any, upto: Any = None) -> Result:
    """CELL-FORK: a snapshot of src's history below the cut, sharing its cells."""
    rejected = _reject(_verb_problems(config, state, src, "src", [] if upto is None else _int_problems(upto, "upto")))
    if rejected:
        return rejected
    seq_id = _lowest_free_id(config, state)
    if seq_id is None:
        return None, state
    source = history(state, src) or ()
    return seq_id, _with_history(state, seq_id, tuple(e for e in source if upto is None or e[0] < upto))


def seq_rm(config: CellConfig, state: CellState, seq_id: Any, p0: Any, p1: Any = None) -> Result:
    """CELL-RM: drop [p0, p1) from the history; the cells follow by definition (free when no history
    holds them any more, kept for the other owners otherwise); an emptied sequence is no longer live."""
    range_problems = _int_problems(p0, "p0") + ([] if p1 is None else _int_problems(p1, "p1"))
    if not range_problems and p1 is not None and p1 < p0:
        range_problems.append(("CELL-RM", "p1"))
    rejected = _reject(_verb_problems(config, state, seq_id, "seq_id", range_problems))
    if rejected:
        return rejected
    end = INT_MAX + 1 if p1 is None else p1
    kept = tuple(e for e in history(state, seq_id) or () if not p0 <= e[0] < end)
    return True, _with_history(state, seq_id, kept if kept else None)


def _query_id(config: CellConfig, state: CellState, seq_id: Any) -> Union[History, CellRejected]:
    broken = _seq_id_problems(config, seq_id, "seq_id")
    broken += [] if broken else _live_problems(state, seq_id, "seq_id")
    rejected = _reject(broken)
    if rejected:
        return rejected
    past = history(state, seq_id)
    assert past is not None
    return past


def seq_len(config: CellConfig, state: CellState, seq_id: Any) -> Union[int, CellRejected]:
    """CELL-OWNERS: the number of cells the sequence owns (its history's length)."""
    past = _query_id(config, state, seq_id)
    return past if isinstance(past, CellRejected) else len(past)


def next_pos(config: CellConfig, state: CellState, seq_id: Any) -> Union[int, CellRejected]:
    """CELL-OWNERS: one past the newest position, 0 when the history is empty."""
    past = _query_id(config, state, seq_id)
    return past if isinstance(past, CellRejected) else (past[-1][0] + 1 if past else 0)


def can_extend(config: CellConfig, state: CellState, n: Any = 1) -> Union[bool, CellRejected]:
    """CELL-USED-END: n <= free_cells()."""
    rejected = _reject(_int_problems(n, "n"))
    return rejected if rejected else n <= free_cells(config, state)


def clear(config: CellConfig, state: CellState) -> CellState:
    """CELL-CLEAR: no live id (so no occupied cell), no forward. Written contents stay, unreferenced."""
    return replace(state, histories=(), forward=None)


# --- a forward -------------------------------------------------------------------------------------

def declare_step(config: CellConfig, state: CellState, seq_ids: Any) -> Result:
    """CELL-DECLARE: a non-empty list or tuple of live ids; False (refusal) when it does not fit."""
    broken: list[tuple[str, str]] = []
    if type(seq_ids) not in (list, tuple):  # exactly: a subclass may iterate differently each time
        broken += [("ARG-TYPE", "seq_ids"), ("CELL-DECLARE", "seq_ids")]  # its statement names the type too
    elif not seq_ids:
        broken.append(("CELL-DECLARE", "seq_ids"))
    else:
        for value in seq_ids:
            broken += _seq_id_problems(config, value, "seq_ids")
    broken += _forward_problems(state)
    if type(seq_ids) in (list, tuple) and all(not _seq_id_problems(config, v, "") for v in seq_ids):
        for value in seq_ids:
            broken += _live_problems(state, value, "seq_ids")
    rejected = _reject(broken)
    if rejected:
        return rejected
    if len(seq_ids) > free_cells(config, state):
        return False, state
    return True, replace(state, forward=Forward(tuple(seq_ids)))


def _positions_type_problems(positions: Any) -> list[tuple[str, str]]:
    """ARG-TYPE / CELL-POS (a list or tuple), ARG-INT, ARG-RANGE: checkable with or without a forward."""
    if type(positions) not in (list, tuple):  # exactly, as seq_ids
        return [("ARG-TYPE", "positions"), ("CELL-POS", "positions")]  # its statement names the type too
    # CELL-POS's statement names the ints and their range too
    return [problem for value in positions
            for problem in _int_problems(value, "positions", high=MAX_POSITION) + [("CELL-POS", "positions")]
            if _int_problems(value, "positions", high=MAX_POSITION)]


def _positions_problems(state: CellState, forward: Forward, positions: Sequence[int]) -> list[tuple[str, str]]:
    """For well-typed positions: CELL-POS (one per token), CELL-FORWARD (the first layer's), CELL-POS (order)."""
    if len(positions) != len(forward.seq_ids):
        return [("CELL-POS", "positions")]
    if forward.positions is not None:
        return [("CELL-FORWARD", "positions")] if tuple(positions) != forward.positions else []
    newest = {seq_id: (history(state, seq_id) or ((-1, -1),))[-1][0] for seq_id in forward.seq_ids}
    for seq_id, q in zip(forward.seq_ids, positions):
        if q <= newest[seq_id]:
            return [("CELL-POS", "positions")]
        newest[seq_id] = q
    return []


def canonical_step(config: CellConfig, state: CellState, layer: int) -> CellStep:
    """The step of `layer` for the placed forward, by definition: bit (i, j) iff cell j holds an entry
    of token i's sequence's history inside token i's window (CELL-DATA-SOUND, CELL-STEP-SHAPE)."""
    forward = state.forward
    assert forward is not None and forward.positions is not None and forward.cells is not None
    read_len = used_end(state)
    bits = bytearray()
    for seq_id, q in zip(forward.seq_ids, forward.positions):
        wanted = expected_reads(config, state, layer, seq_id, q)
        bits += bytes(1 if state.written[j] in wanted else 0 for j in range(read_len))
    return CellStep(len(forward.seq_ids), read_len, forward.cells, bytes(bits))


def placement(config: CellConfig, state: CellState, positions: Sequence[int]) -> CellState:
    """CELL-PLACE, CELL-LAYOUT-CANON: the open forward placed - each token in the lowest free cell, in
    token order, written with its position and a fresh content id, appended to its sequence's history.
    (Called on a declared, not yet placed forward with valid positions.)"""
    forward = state.forward
    assert forward is not None and forward.positions is None
    free = [cell for cell in range(config.capacity) if not owners(state, cell)]
    cells = tuple(free[:len(forward.seq_ids)])
    contents = tuple(range(state.next_content, state.next_content + len(cells)))
    written = list(state.written)
    placed = state
    for seq_id, q, cell, content in zip(forward.seq_ids, positions, cells, contents):
        written[cell] = (q, content)
        placed = _with_history(placed, seq_id, (history(placed, seq_id) or ()) + ((q, content),))
    return replace(placed, written=tuple(written), next_content=state.next_content + len(cells),
                   forward=replace(forward, positions=tuple(positions), cells=cells, contents=contents))


def mask_by_formula(config: CellConfig, state: CellState, layer: int) -> bytes:
    """CELL-MASK: the formula a cache computes - bit (i, j) iff cell j is occupied, token i's sequence
    owns it and its position p has p <= q_i and (flat, or p >= q_i - w + 1) - over the model's derived
    table, for the placed forward. Never used to answer: only to cross-check `canonical_step`, which is
    the definition (the lockstep does it in every state with a placed forward)."""
    forward = state.forward
    assert forward is not None and forward.positions is not None
    spec = config.layers[layer]
    bits = bytearray()
    for seq_id, q in zip(forward.seq_ids, forward.positions):
        for j in range(used_end(state)):
            held = state.written[j]
            bits.append(int(held is not None and seq_id in owners(state, j) and held[0] <= q
                            and (spec.kind != RING or held[0] >= q - spec.window + 1)))
    return bytes(bits)


def place_step(config: CellConfig, state: CellState, layer: Any, positions: Any) -> Result:
    """CELL-FORWARD, CELL-POS: the first layer places the forward (`placement`); the others reuse it.
    The answer is the layer's CellStep; the forward closes when every layer is served."""
    broken: list[tuple[str, str]] = []
    layer_problem = check_layer(config.base, layer)
    if layer_problem:
        broken.append((layer_problem.rule, layer_problem.argument))
    forward = state.forward
    type_problems = _positions_type_problems(positions)
    broken += type_problems
    if forward is None:
        broken.append(("CELL-FORWARD", "forward"))
    else:
        broken += [] if type_problems else _positions_problems(state, forward, positions)
        if not layer_problem and layer in forward.served:
            broken.append(("CELL-FORWARD", "layer"))
    rejected = _reject(broken)
    if rejected:
        return rejected
    assert forward is not None
    if forward.positions is None:
        state = placement(config, state, positions)
        forward = state.forward
        assert forward is not None
    step = canonical_step(config, state, layer)
    served = forward.served | {layer}
    closed = len(served) == len(config.layers)
    return step, replace(state, forward=None if closed else replace(forward, served=served))


# --- playing the backend for an implementation's step ---------------------------------------------

Pool = tuple[Written, ...]


def execute_step(config: CellConfig, state: CellState, forward: Forward, layer: int, pool: Pool,
                 step: Any) -> tuple[Pool, list[str]]:
    """Run an implementation's CellStep on our own data-level pool of `layer` and check every read.

    `state` is the model's state after this layer's place_step (the forward's tokens are in the
    histories) and `forward` the placed forward (its positions and content ids). Writes: token i's
    (position, content) into cell step.cells[i] - a cell that still held an entry of a live history
    is an overwrite (CELL-PLACE). Reads: the (position, content) of the cells with mask bit 1 must be
    exactly expected_reads, each once (CELL-DATA-SOUND). Shape problems (CELL-STEP-SHAPE) stop the
    execution. Returns the new pool and the problems, each a sentence naming the rule broken.
    """
    assert forward.positions is not None and forward.contents is not None
    n = len(forward.seq_ids)
    problems: list[str] = []
    try:
        length, read_len, cells, bits = step.length, step.read_len, tuple(step.cells), bytes(step.mask_bits)
    except (AttributeError, TypeError) as error:
        return pool, [f"CELL-STEP-SHAPE: not a CellStep ({error})"]
    if length != n or len(cells) != n:
        problems.append(f"CELL-STEP-SHAPE: length {length} with {len(cells)} cells, {n} tokens declared")
    if not _is_int(read_len) or not 0 <= read_len <= len(pool):
        problems.append(f"CELL-STEP-SHAPE: read_len {read_len!r} outside [0, {len(pool)}]")
    elif len(bits) != n * read_len or any(b not in (0, 1) for b in bits):
        problems.append(f"CELL-STEP-SHAPE: mask_bits has {len(bits)} bytes (values {sorted(set(bits))}), "
                        f"not {n} x {read_len} bytes of 0/1")
    if len(set(cells)) != len(cells) or not all(_is_int(c) and 0 <= c < (read_len if _is_int(read_len) else 0)
                                                 for c in cells):
        problems.append(f"CELL-STEP-SHAPE: cells {cells} not distinct or not in [0, read_len={read_len})")
    if problems:
        return pool, problems
    live_entries = {entry for _, past in state.histories for entry in past}
    new_entries = set(zip(forward.positions, forward.contents))
    cells_now = list(pool)
    for i, cell in enumerate(cells):
        held = cells_now[cell]
        if held is not None and held in live_entries and held not in new_entries:
            problems.append(f"CELL-PLACE: token {i} placed in cell {cell}, which holds {held} of a live history")
        cells_now[cell] = (forward.positions[i], forward.contents[i])
    for i, (seq_id, q) in enumerate(zip(forward.seq_ids, forward.positions)):
        read = [(j, cells_now[j]) for j in range(read_len) if bits[i * read_len + j] == 1]
        wanted = expected_reads(config, state, layer, seq_id, q)
        got = {held for _, held in read}
        if len(got) != len(read):
            problems.append(f"CELL-DATA-SOUND: token {i} (seq {seq_id}, position {q}) attends one entry twice "
                            f"(cells {[j for j, _ in read]})")
        for j, held in read:
            if held not in wanted:
                problems.append(f"CELL-DATA-SOUND: token {i} (seq {seq_id}, position {q}) attends cell {j} "
                                f"holding {held}, not in its history window")
        for entry in sorted(wanted - got):
            problems.append(f"CELL-DATA-SOUND: token {i} (seq {seq_id}, position {q}) misses its "
                            f"(position, content) {entry}")
    return tuple(cells_now), problems


# --- a cell cache seen only through its outputs (CELL-RECOMPUTE, SPEC.md section 5.3) -------------------------
# Such a target (llama.cpp) shows no K/V: per token of a decode it answers an output vector. Which tokens each
# query attends is the op face's cell table (`op_model.OpModel`, caller-chosen ids; OP-FORK, OP-RM, OP-POS,
# OP-CAP); what the output must be is decided here: the target's own recompute over the rows the spec names.

RECOMPUTE_ATOL = 1e-3    # CELL-RECOMPUTE: |got - want| <= atol + rtol * max|want|, elementwise (float32 logits)
RECOMPUTE_RTOL = 1e-3

Entry = tuple[int, int, int]   # (position, token, uid): one token a sequence holds; uids are never reused


def recompute_rows(entries: Sequence[Entry], q: int) -> tuple[Entry, ...]:
    """CELL-RECOMPUTE: the rows a query at position q recomputes over - its sequence's entries at positions
    <= q (the query itself last), in position order. The windows are not applied here: the recompute applies
    them, as the decode must (a query at q on a window-w layer attends positions [q - w + 1, q] of these)."""
    return tuple(sorted(entry for entry in entries if entry[0] <= q))


def recompute_decidable(n_layers: int, rows: Sequence[Entry], written_over: dict[int, tuple[int, ...]]) -> bool:
    """CELL-RECOMPUTE: whether a fresh recompute over `rows` is the oracle of the query (the last row). With one
    layer a token's output is a function of the rows it attends only. With more, a row's upper-layer K/V also
    depend on the rows *it* attended when it was written (`written_over[uid]`: the uids then below it in its
    sequence), so the recompute is the oracle only where every row was written over exactly the rows now
    below it (no middle removal under it since, no fork that changed it)."""
    if n_layers == 1:
        return True
    uids = [uid for _, _, uid in rows]
    return all(written_over.get(uid) == tuple(uids[:i]) for i, uid in enumerate(uids))


def outputs_agree(got: Sequence[float], want: Sequence[float],
                  atol: float = RECOMPUTE_ATOL, rtol: float = RECOMPUTE_RTOL) -> bool:
    """CELL-RECOMPUTE's tolerance: the same length, every element within atol + rtol * max|want|."""
    if len(got) != len(want) or not want:
        return False
    bound = atol + rtol * max(abs(w) for w in want)
    return all(abs(g - w) <= bound for g, w in zip(got, want))
