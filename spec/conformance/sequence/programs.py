"""The sequence layout's programs: systematic edge programs per config, random programs from a seed.

Programs are JSON step lists with relative arguments (see engine.py), so removing a step keeps the
others meaningful (the suite's shrinker, ../suite/shrink.py, relies on it).
"""

from __future__ import annotations

import random
from typing import Any

from ... import model
from ...arguments import ID, POSITIONS
from ..configs import JsonConfig, to_model
from ..engine import Step
from ..malform import Case, cases, id_value, int_value

INT_MAX = model.INT_MAX


def step(T: Any, commit: str = "once", **extra: Any) -> Step:
    return {"op": "step", "T": T, "commit": commit, **extra}


def plan(layer: Any = 0, position: Any = None, T: Any = 1) -> Step:
    return {"op": "plan", "layer": layer, "position": {"rel": 0} if position is None else position, "T": T}


# The relative form of a bound a malformed value refers to (engine.py resolves it when the step runs).
_RELATIVE = {"n_layers": {"n": 0}, "limit": {"limit": 1}, "length": {"rel": 1}}


def _malformed(case: Case) -> Step:
    """The call that breaks a case of the sequence face's argument contract (spec/arguments.py)."""
    clause, variant = case.clause, case.variant
    if clause.kind == ID:
        value: Any = id_value(variant, _RELATIVE[clause.size])
    elif clause.kind == POSITIONS:   # STEP-APPEND: a gap past the length, or a position it already has
        value = {"rel": 1} if variant == "gap" else {"rel": -1}
    else:
        value = int_value(clause, variant, above=_RELATIVE.get(clause.size))
    tag = {"clause": clause.id, "variant": variant}
    if clause.call == "plan":
        return {**plan(**{clause.argument: value}), **tag}
    return {"op": clause.call, clause.argument: value, **tag}


# Every bad call the harness makes: (name, step). The malformed arguments are derived from the argument
# contract (malform.py); a forged plan is no argument value, and an open step's other T is a relation.
BAD_CALLS: tuple[tuple[str, Step], ...] = tuple((f"{case.clause.call} {case.clause.argument} {case.variant}"
                                                 f" ({case.clause.rule})", _malformed(case))
                                                for case in cases("sequence")) + (
    ("plan open step other T", plan(position={"open": 0}, T={"open": 1})),
    ("commit stale plan", {"op": "commit", "plan": {"forge": "stale"}}),
    ("commit shifted read base", {"op": "commit", "plan": {"forge": "shift-base"}}),
    ("commit extra row", {"op": "commit", "plan": {"forge": "extra-row"}}),
    ("commit empty write", {"op": "commit", "plan": {"forge": "empty"}}),
    ("commit three runs", {"op": "commit", "plan": {"forge": "three-runs"}}),
    ("commit future step", {"op": "commit", "plan": {"forge": "future"}}),
    ("commit not a plan", {"op": "commit", "plan": {"forge": "not-a-plan"}}),
    # the same (position, T), other rows: only a commit that compares the rows rejects these
    ("commit write runs shifted", {"op": "commit", "plan": {"forge": "shift-write"}}),
    ("commit read runs shifted", {"op": "commit", "plan": {"forge": "shift-read"}}),
    ("commit write run split", {"op": "commit", "plan": {"forge": "split-write"}}),
    ("commit read run split", {"op": "commit", "plan": {"forge": "split-read"}}),
    ("commit another policy's layout", {"op": "commit", "plan": {"forge": "other-layout"}}),
)


def _limit(cfg: model.Config) -> int:
    limit = model.step_limit(cfg)
    return cfg.capacity if limit is None else min(limit, cfg.capacity)


def edge_programs(cfg_json: JsonConfig) -> list[tuple[str, list[Step]]]:
    """Systematic programs: admission edges, both commit patterns, wrap-around, rewind chains, bad calls."""
    cfg = to_model(cfg_json)
    assert isinstance(cfg, model.Config)
    limit, capacity = _limit(cfg), cfg.capacity
    fill = [step(limit)] * (capacity // limit) + ([step(capacity % limit)] if capacity % limit else [])
    wrap = [step(1 + i % limit, "per-layer" if i % 2 else "once") for i in range(2 * capacity)]
    programs: list[tuple[str, list[Step]]] = [
        ("fill to exactly the capacity, then one more", fill + [step(1), {"op": "can_extend", "n": 0},
                                                           {"op": "can_extend", "n": 1}]),
        ("admission at the edge: position + T == capacity", [step({"room": 0}) if capacity <= limit
                                                             else step(limit), step({"room": 0}),
                                                             {"op": "can_extend", "n": {"room": 0}},
                                                             {"op": "can_extend", "n": {"room": 1}}]),
        ("one token at a time, per-layer commit", [step(1, "per-layer")] * capacity + [step(1, "per-layer")]),
        ("max-size steps, commit once, re-commit", [step(limit, recommit=True)] * (capacity // limit + 1)),
        ("wrap-around with mixed step sizes", wrap),
        ("rewind one token after every step", [op for i in range(capacity) for op in
                                               (step(min(limit, 2)), {"op": "rewind", "new_len": {"back": 1}})]),
        ("chains of rewinds", [op for i in range(min(capacity, 8)) for op in
                               (step(limit), step(1), {"op": "rewind", "new_len": {"back": 1 + i % 3}},
                                {"op": "rewind", "new_len": {"back": 1}})]),
        ("rewind floor scan", fill[:3] + [{"op": "rewind", "new_len": {"back": k}} for k in range(capacity + 2)]),
        ("rewind to 0 and to the length", wrap[:capacity] + [{"op": "rewind", "new_len": {"rel": 0}},
                                                             {"op": "rewind", "new_len": 0}] + wrap[:4]),
        ("clear and reuse", wrap[:capacity] + [{"op": "clear"}] + wrap[:capacity] +
         [{"op": "rewind", "new_len": {"back": k}} for k in range(1, 4)]),
        ("aborted steps (planned, never executed)", [step(1), plan(T=min(2, limit)), plan(layer={"n": -1}),
                                                     step(1), plan(), step(limit)]),
        ("bad calls on an empty cache", [bad for _, bad in BAD_CALLS]),
        ("bad calls in the middle of a step", [step(1, "per-layer"), step(min(2, limit))] +
         [op for _, bad in BAD_CALLS for op in (bad, {"op": "commit", "plan": {"forge": "open", "layer": 0}})]),
        ("bad calls at the capacity", fill + [bad for _, bad in BAD_CALLS]),
        ("queries", [{"op": "capacity"}, {"op": "faces"}] + [{"op": "depth", "layer": k}
                                                             for k in range(len(cfg.layers))]
         + [step(1), {"op": "length"}, {"op": "capacity"}, {"op": "faces"}]),
    ]
    return programs


def random_program(cfg_json: JsonConfig, rng: random.Random, size: int) -> list[Step]:
    """A random program; the ops are weighted toward full steps and rewinds, with bad calls mixed in."""
    cfg = to_model(cfg_json)
    assert isinstance(cfg, model.Config)
    limit = _limit(cfg)
    program: list[Step] = []
    for _ in range(size):
        roll = rng.random()
        if roll < 0.45:
            T: Any = rng.choice([1, 1, rng.randint(1, limit), limit, {"room": 0}, {"room": 1}])
            program.append(step(T, rng.choice(["once", "per-layer"]), commit_layer=rng.randrange(len(cfg.layers)),
                                recommit=rng.random() < 0.1))
        elif roll < 0.56:
            program.append({"op": "rewind", "new_len": rng.choice([{"back": rng.randint(0, 4)}, {"back": 1},
                                                                   {"back": rng.randint(0, cfg.capacity)}, 0])})
        elif roll < 0.62:
            # a chain of small rewinds: a floor must remember what the earlier ones cost
            program += [{"op": "rewind", "new_len": {"back": rng.randint(1, limit + 1)}}
                        for _ in range(rng.randint(2, 4))]
        elif roll < 0.65:
            program.append({"op": "clear"})
        elif roll < 0.70:
            program.append(plan(layer=rng.randrange(len(cfg.layers)), T=rng.randint(1, limit)))
        elif roll < 0.75:
            program.append({"op": "can_extend", "n": rng.choice([{"room": 0}, {"room": 1}, {"room": -1}, 0, 1])})
        elif roll < 0.78:
            program.append({"op": "commit", "plan": {"forge": "open", "layer": rng.randrange(len(cfg.layers))}})
        else:
            program.append(rng.choice(BAD_CALLS)[1])
    return program
