"""Cell programs: the suite's configurations for the cell layout, edge programs, random programs.

Programs are JSON step lists with relative arguments (engine.py), so the shared shrinker
(programs.shrink) keeps them meaningful while it drops steps. The ops (spec/PROTOCOL.md, "Cell
programs"): forward (declare_step then place_step on the layers), declare, place, seq_new,
seq_clone, seq_rm, seq_len, next_pos, can_extend, free_cells, used_end, live, capacity, faces, clear.
"""

from __future__ import annotations

import random
from typing import Any

from ... import model
from ...arguments import ID, INT, LIST, POSITIONS
from ..configs import BAD_CONFIGS, JsonConfig, config, layer
from ..engine import Step
from ..malform import INT32_LIMIT, Case, cases, id_value, int_value, tokens_of

INT_MAX = model.INT_MAX
LIVE0, LIVE1, DEAD = {"live": 0}, {"live": 1}, {"dead": 0}


def cell_config(capacity: int, layers: list[dict[str, Any]], max_seqs: int, **extra: Any) -> JsonConfig:
    return {**config(capacity, layers, **extra), "max_seqs": max_seqs}


# The configurations the suite drives for a cell cache: flat and windowed layers, broadcast, a window
# of 1, mixed windows, max_write (valid, no effect), and max_seqs small enough that every id is live.
CELL_CONFIGS: tuple[JsonConfig, ...] = (
    cell_config(8, [layer("flat")], 3),
    cell_config(1, [layer("flat")], 1),                                     # the smallest cache
    cell_config(12, [layer("flat")], 4, n_layers=3),                        # broadcast
    cell_config(10, [layer("ring", 3)], 3),                                 # a window
    cell_config(8, [layer("ring", 1)], 2),                                  # window 1
    cell_config(12, [layer("flat"), layer("ring", 2)], 3),                  # mixed
    cell_config(16, [layer("ring", 2), layer("ring", 4), layer("flat")], 64, max_write=1),  # windows, max_write
)

# Configurations only the cell layout rejects (CELL-MAX-SEQS): a python: target gets max_seqs as it is.
BAD_CELL_CONFIGS: tuple[tuple[str, JsonConfig, str], ...] = (
    ("max_seqs 0", cell_config(4, [layer("flat")], 0), "CELL-MAX-SEQS"),
    ("max_seqs 65", cell_config(4, [layer("flat")], 65), "CELL-MAX-SEQS"),
    ("max_seqs true", cell_config(4, [layer("flat")], True), "CELL-MAX-SEQS"),   # bool is not an int here
)


def bad_cell_configs(validates_configs: bool) -> list[JsonConfig]:
    """The invalid configurations a target must refuse: CELL-MAX-SEQS always, CFG-* when it gets JSON."""
    shared = [{**bad, "max_seqs": 2} for _, bad, _ in BAD_CONFIGS] if validates_configs else []
    return [bad for _, bad, _ in BAD_CELL_CONFIGS] + shared


def forward(*seqs: Any, **extra: Any) -> Step:
    return {"op": "forward", "seqs": list(seqs), **extra}


def prompt(n: int, seq: Any = LIVE0, **extra: Any) -> Step:
    return forward(*([seq] * n), **extra)


NEW: Step = {"op": "seq_new"}
CLEAR: Step = {"op": "clear"}
QUERIES: list[Step] = [{"op": name} for name in ("capacity", "faces", "free_cells", "used_end", "live")]


def _malformed(case: Case) -> Step:
    """The call that breaks a case of the cell face's argument contract (spec/arguments.py): sequence
    LIVE0's where a live id is needed besides; a place_step's inside the forward the program opened."""
    clause, variant, tag = case.clause, case.variant, {"clause": case.clause.id, "variant": case.variant}
    if clause.kind == ID:
        value: Any = id_value(variant, {"n": 0} if clause.size == "n_layers" else {"max_seqs": 0})
    elif clause.kind == INT:
        value = int_value(clause, variant, low=2)
    elif clause.kind == LIST:
        value = [] if variant == "empty" else "0"
    else:   # place_step's positions, relative to the sequence's next one ({"next": d}, token by token)
        value = {"repeat": [{"next": 0}, {"next": -1}], "descending": [{"next": 1}, {"next": -2}],
                 "held": [{"next": -1}], "negative": [-1], "int32": [INT32_LIMIT], "not a list": "0"}[variant]
    call, argument = clause.call, clause.argument
    if call == "declare_step":
        return {"op": "declare", "seqs": value if clause.kind == LIST else [value], **tag}
    if call == "place_step":
        return {"op": "place", argument: value, **tag}
    extras: dict[str, dict[str, Any]] = {"seq_rm": {"seq_id": LIVE0, "p0": 2 if argument == "p1" else 0},
                                         "seq_clone": {"src": LIVE0}}
    extra = extras.get(call, {})
    return {"op": call, **extra, argument: value, **tag}


def _name(case: Case) -> str:
    return f"{case.clause.call} {case.clause.argument} {case.variant} ({case.clause.rule})"


_CASES = cases("cell")
# A place_step whose positions are two tokens of one sequence needs a forward declared with two.
TWO_TOKENS = tuple((_name(c), _malformed(c)) for c in _CASES if c.clause.kind == POSITIONS and tokens_of(c.variant) == 2)
# Every bad call outside a forward: the malformed arguments derived from the contract (malform.py), and
# calls on ids that are not live (CELL-SEQ-LIVE: a relation to the table, not a value).
BAD_CELL_CALLS: tuple[tuple[str, Step], ...] = tuple((_name(c), _malformed(c)) for c in _CASES
                                                     if c.clause.call != "place_step") + (
    ("seq_len of a dead id", {"op": "seq_len", "seq_id": DEAD}),
    ("next_pos of a dead id", {"op": "next_pos", "seq_id": DEAD}),
    ("seq_rm of a dead id", {"op": "seq_rm", "seq_id": DEAD, "p0": 0}),
    ("seq_clone of a dead id", {"op": "seq_clone", "src": DEAD}),
    ("declare a dead id", {"op": "declare", "seqs": [DEAD]}),
    ("place with nothing declared", {"op": "place", "layer": 0}),
)

# Calls inside an open forward of one token (declared, maybe placed on some layers): CELL-FORWARD, and
# the place_step malformations of one token (CELL-POS, LAYER-RANGE).
MID_FORWARD: tuple[tuple[str, Step], ...] = (
    ("seq_new mid-forward", NEW),
    ("seq_clone mid-forward", {"op": "seq_clone", "src": LIVE0}),
    ("seq_rm mid-forward", {"op": "seq_rm", "seq_id": LIVE0, "p0": 0}),
    ("declare mid-forward", {"op": "declare", "seqs": [LIVE0]}),
    ("place positions too many", {"op": "place", "positions": [{"next": 0}, {"next": 0}]}),
    ("queries mid-forward", {"op": "free_cells"}),
) + tuple((_name(c), _malformed(c)) for c in _CASES
          if c.clause.call == "place_step" and not (c.clause.kind == POSITIONS and tokens_of(c.variant) == 2))


def edge_cell_programs(cfg: JsonConfig) -> list[tuple[str, list[Step]]]:
    """Systematic programs: admission at the edge, batches, forks around the cut, removals around the
    cut and the window, id reuse, all ids live, clears, bad calls and verbs in the middle of a forward."""
    capacity, n_layers = cfg["capacity"], cfg["n_layers"]
    half = max(1, capacity // 2)
    rest = capacity - half
    two = [NEW, prompt(half), NEW, prompt(max(1, rest - 1), LIVE1)] if capacity >= 3 else [NEW, prompt(1)]
    mid_forward = [op for _, bad in MID_FORWARD for op in (bad,)]
    programs: list[tuple[str, list[Step]]] = [
        ("queries on an empty cache", QUERIES + [NEW] + QUERIES),
        ("fill to exactly the capacity, then one more", [NEW, prompt(capacity), prompt(1),
                                                         {"op": "can_extend", "n": {"free": 0}},
                                                         {"op": "can_extend", "n": {"free": 1}}]),
        ("one token at a time", [NEW] + [prompt(1)] * (capacity + 1)),
        ("a batch of two sequences, then decode both", two + [forward(LIVE0, LIVE1)] * 2),
        ("layers served in reverse order", [NEW, prompt(min(2, capacity), order="reverse"),
                                            forward(LIVE0, order="reverse")]),
        ("positions with gaps (windows measure positions)", [NEW, forward(LIVE0, LIVE0, positions=[0, 3]),
                                                             forward(LIVE0, positions=[{"next": 2}]), prompt(1)]),
        ("forks: whole, at every cut, of an empty source", [NEW, prompt(min(4, capacity - 1) if capacity > 1 else 1)]
         + [op for cut in range(0, 5) for op in ({"op": "seq_clone", "src": LIVE0, "upto": cut},
                                                 forward({"live": -1}), {"op": "seq_rm", "seq_id": {"live": -1},
                                                                         "p0": 0})]
         + [{"op": "seq_clone", "src": LIVE0}, forward(LIVE0, {"live": -1}), NEW,
            {"op": "seq_clone", "src": {"live": -1}}]),
        ("removals around the cut and the window", [NEW, prompt(min(5, capacity)), {"op": "seq_clone", "src": LIVE0,
                                                                                    "upto": 3}]
         + [op for p0, p1 in ((2, 3), (3, 4), (0, 1), (4, None))
            for op in ({"op": "seq_rm", "seq_id": LIVE0, "p0": p0, "p1": p1}, forward(LIVE0, LIVE1))]),
        ("speculative rollback", [NEW, prompt(min(3, capacity))]
         + [op for _ in range(3) for op in (forward(LIVE0, LIVE0), {"op": "seq_rm", "seq_id": LIVE0,
                                                                     "p0": {"back": 1}})]),
        # the same step (ids and positions) again after a rollback, with the table changed underneath:
        # a step memoized across forwards (by ids and positions, not the table) serves the old mask
        ("the same step again after a rollback and a removal at the front",
         [NEW, prompt(min(4, capacity)), forward(LIVE0), {"op": "seq_rm", "seq_id": LIVE0, "p0": {"back": 1}},
          {"op": "seq_rm", "seq_id": LIVE0, "p0": 0, "p1": 1}, forward(LIVE0)]),
        ("id reuse after a removal empties a sequence", [NEW, prompt(1), NEW, prompt(1, LIVE1),
                                                         {"op": "seq_rm", "seq_id": LIVE0, "p0": 0}, NEW,
                                                         forward(LIVE0), forward(LIVE0, LIVE1)]),
        ("every id live, then one more", [NEW] * (cfg.get("max_seqs", 64) + 1)
         + [{"op": "seq_clone", "src": LIVE0}]),
        ("the largest position, next_pos INT_MAX, then nothing newer",
         [NEW, forward(LIVE0, positions=[INT_MAX - 1]), {"op": "next_pos", "seq_id": LIVE0},
          {"op": "declare", "seqs": [LIVE0]}, {"op": "place", "layer": 0, "positions": [INT_MAX]}, CLEAR]),
        ("clear and reuse", [NEW, prompt(min(2, capacity)), NEW, CLEAR, NEW, prompt(1), CLEAR, CLEAR]),
        ("bad calls on an empty cache", [bad for _, bad in BAD_CELL_CALLS]),
        ("bad calls with live sequences", [NEW, prompt(min(2, capacity))] + [bad for _, bad in BAD_CELL_CALLS]),
        ("verbs between declare and the first layer", [NEW, prompt(1), {"op": "declare", "seqs": [LIVE0]}]
         + mid_forward + [{"op": "place", "layer": k} for k in range(n_layers)] + [prompt(1)]),
        ("verbs between the layers of one forward", [NEW, forward(LIVE0, stop=1)] + mid_forward
         + [{"op": "place", "layer": 0}, {"op": "place", "layer": {"n": -1}}, CLEAR, NEW, prompt(1)]),
    ]
    for name, bad in TWO_TOKENS:   # two tokens of one sequence, placed out of order, then placed right
        programs.append((f"{name} in a forward of two tokens", [NEW, prompt(1), {"op": "declare", "seqs": [LIVE0, LIVE0]},
                                                              {**bad, "layer": 0}]
                         + [{"op": "place", "layer": k} for k in range(n_layers)] + [prompt(1)]))
    return programs


def random_cell_program(cfg: JsonConfig, rng: random.Random, size: int) -> list[Step]:
    """A random program weighted toward forwards (single sequences and batches), forks and removals."""
    n_layers = cfg["n_layers"]
    program: list[Step] = [NEW]

    def some() -> Any:
        return {"live": rng.randrange(4)}

    for _ in range(size):
        roll = rng.random()
        if roll < 0.35:
            seqs = [some() for _ in range(rng.choice([1, 1, 2, 3]))]
            if rng.random() < 0.3:
                seqs = [seqs[0]] * rng.randint(1, 3)
            extra: dict[str, Any] = {}
            if rng.random() < 0.15:
                extra["positions"] = [{"next": rng.choice([0, 0, 1, 3])} for _ in seqs]
            if rng.random() < 0.2:
                extra["order"] = "reverse"
            program.append(forward(*seqs, **extra))
        elif roll < 0.45:
            program.append(NEW)
        elif roll < 0.55:
            upto = rng.choice([None, None, {"back": rng.randint(0, 3)}, rng.randint(0, 6)])
            program.append({"op": "seq_clone", "src": some(), "upto": upto})
        elif roll < 0.67:
            p0 = rng.choice([0, {"back": rng.randint(1, 3)}, rng.randint(0, 5)])
            p1 = rng.choice([None, None, {"next": 0}, {"back": rng.randint(0, 2)}, rng.randint(0, 8)])
            if isinstance(p0, int) and isinstance(p1, int) and p1 < p0:
                p0, p1 = p1, p0
            program.append({"op": "seq_rm", "seq_id": some(), "p0": p0, "p1": p1})
        elif roll < 0.70:
            program.append(CLEAR)
        elif roll < 0.76:
            program.append(rng.choice([{"op": "seq_len", "seq_id": some()}, {"op": "next_pos", "seq_id": some()},
                                       {"op": "can_extend", "n": {"free": rng.choice([0, 1, -1])}}]))
        elif roll < 0.82:
            program += [forward(some(), stop=rng.randrange(1, n_layers + 1)) if n_layers > 1 else
                        {"op": "declare", "seqs": [some()]}, rng.choice(MID_FORWARD)[1]]
            # close the forward: served layers again are CELL-FORWARD errors, the others close it
            program += [{"op": "place", "layer": k} for k in range(n_layers)]
        else:
            program.append(rng.choice(BAD_CELL_CALLS)[1])
    return program
