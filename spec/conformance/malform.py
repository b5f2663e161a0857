"""Malformed arguments, derived from the argument contract (spec/arguments.py), never from a list.

A `Case` is one clause and one way of breaking it (a variant of the clause's kind). `cases(face, cfg)`
derives every case a configuration can show: a dimension's 0, 1, n-1, n+1 and the other argument's size
(each only where it differs from the valid size; the token axis also in a step of MULTI_TOKEN tokens, so
its 1 and n-1 are sent), an id's -1, n, bool, float and huge value, a position
list's repeat, gap, descending order, re-placed, negative and int32 positions, a tensor's dtype and
rank, a list's emptiness. Each layout's programs turn a case into its own steps (op_programs,
programs, cell_programs); every such step carries `"clause"` (and the op face's `"variant"`), and the
engines record the clause as exercised once the target answered the malformed call (`CLAUSE_PREFIX`
in `RunResult.exercised`), so coverage reports the clauses a run exercised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..arguments import BY_ID, CLAUSES, CONFIG, DIM, ID, INT, LIST, POSITIONS, TENSOR, Clause, of_face, variants
from .configs import JsonConfig, config, layer

CLAUSE_PREFIX = "clause:"       # a clause id in RunResult.exercised (rule ids never start so)
INT_MAX = 2**31 - 1
HUGE = 2**31                    # past every int argument's range, and past a C++ int
INT32_LIMIT = 2**31 - 1         # one past the largest position: 2**31 - 2 (OP-POS), INT_MAX - 1 (CELL-POS)


# The step length a token-axis case is also sent at: a 1 and an n-1 on that axis are malformations only in a
# step of more than one token (V of one token beside K of three: what a runner passing the wrong tensor sends).
MULTI_TOKEN = 3


@dataclass(frozen=True)
class Case:
    clause: Clause
    variant: str
    q_len: int = 1    # the step length the case is sent at (a DIM case on the token axis: 1 or MULTI_TOKEN)

    @property
    def name(self) -> str:
        """The case's name, and its key in a report's coverage (each case counts: a clause is broken only
        when every case of it in scope was)."""
        return f"{self.clause.id} {self.variant}" + (f" at q_len {self.q_len}" if self.q_len != 1 else "")

    def tag(self) -> dict[str, Any]:
        """What a step carries to name the case (the engines read it)."""
        return {"clause": self.clause.id, "variant": self.variant, **({"q_len": self.q_len} if self.q_len != 1 else {})}


def sizes_of(cfg: JsonConfig, q_len: int = 1) -> dict[str, int]:
    """The sizes a DIM clause can name, for one op config and a step of q_len tokens."""
    head = int(cfg.get("head_dim", 1))
    return {"batch_size": int(cfg.get("batch_size", 1)), "n_kv_heads": int(cfg.get("n_kv_heads", 1)),
            "head_dim": head, "v_head_dim": int(cfg.get("v_head_dim", head)), "q_len": q_len, "1": 1}


def dim_value(clause: Clause, variant: str, sizes: dict[str, int]) -> Optional[int]:
    """The size a DIM case gives its dimension, or None where it is no malformation in these sizes
    (equal to the valid size, negative, or an `other` the clause does not have)."""
    n = sizes[clause.size]
    value = {"0": 0, "1": 1, "n-1": n - 1, "n+1": n + 1,
             "other": sizes.get(clause.other, n) if clause.other else n}[variant]
    return value if value != n and value >= 0 else None


def dim_values(clause: Clause, sizes: dict[str, int]) -> list[tuple[str, int]]:
    """The distinct malformed sizes of a DIM clause, each under the first variant that gives it."""
    seen: dict[int, str] = {}
    for variant in variants(clause):
        value = dim_value(clause, variant, sizes)
        if value is not None and value not in seen:
            seen[value] = variant
    return [(variant, value) for value, variant in seen.items()]


def id_value(variant: str, n: Any) -> Any:
    """An ID case's value; n is the clause's bound (an int, or a relative bound like {"n": 0})."""
    return {"-1": -1, "n": n, "bool": True, "float": 0.0, "huge": HUGE}[variant]


def int_value(clause: Clause, variant: str, low: Any = None, above: Any = None) -> Any:
    """An INT case's value: one below the lower bound (`low`: the bound's value when it is another
    argument), a bool, a float, one above the upper bound (`above`: the face's relative form of it)."""
    bound = int(clause.low) if clause.low.lstrip("-").isdigit() else low
    if variant == "below":
        return None if bound is None else bound - 1
    if variant == "bool":
        return True
    if variant == "float":
        return float(bound if isinstance(bound, int) else 0)
    if above is not None:
        return above
    return HUGE if clause.size == "INT_MAX" else None


def malformed_positions(variant: str, following: Sequence[int], held_newest: int) -> Optional[list[int]]:
    """A POSITIONS case from the positions a step would take (`following`: at least two) and the newest
    position its sequence holds (-1: none); None where the case cannot be shown (nothing held)."""
    p = following[0]
    if variant == "repeat":
        return [p, p]
    if variant == "descending":
        return [following[1], p]
    if variant == "gap":
        return [p + 1]
    if variant == "held":
        return None if held_newest < 0 else [held_newest]
    if variant == "negative":
        return [-1]
    if variant == "int32":
        return [INT32_LIMIT]
    return None


def tokens_of(variant: str) -> int:
    """The tokens a POSITIONS case's step takes (the owners a cell step declares)."""
    return 2 if variant in ("repeat", "descending") else 1


def step_bound(cfg: JsonConfig) -> Optional[int]:
    """OP-MAX-WRITE: the most tokens a step of an op config writes - its max_write when it has a ring
    layer - else None (no bound: the clause `op.update_and_fetch.q_len.max_write` has no case there)."""
    max_write = cfg.get("max_write")
    rings = any(isinstance(entry, dict) and entry.get("kind") == "ring" for entry in cfg.get("layers", []))
    return max_write if rings and type(max_write) is int else None


def cases(face: str, cfg: Optional[JsonConfig] = None) -> list[Case]:
    """Every case of the face's clauses a configuration can show (DIM cases depend on its sizes; a
    clause bounded by max_write binds only a config whose steps it bounds)."""
    out: list[Case] = []
    for clause in of_face(face):
        if clause.kind == CONFIG:   # a configuration's case is a configuration (config_cases), not a call
            continue
        if clause.size == "max_write" and step_bound(cfg or {}) is None:
            continue
        if clause.kind == DIM:
            sizes = sizes_of(cfg or {})
            out += [Case(clause, variant) for variant, _ in dim_values(clause, sizes)]
            if "q_len" in (clause.size, clause.other) and clause.variants != ("0",):   # the token axis
                out += [Case(clause, variant, MULTI_TOKEN) for variant, _ in
                        dim_values(clause, sizes_of(cfg or {}, MULTI_TOKEN)) if variant in ("1", "n-1", "other")]
        else:   # an INT clause without an upper bound has no value above it
            out += [Case(clause, variant) for variant in variants(clause)
                    if not (clause.kind == INT and variant == "above" and not clause.size)]
    return out


def op_base_config(window: int = 0) -> JsonConfig:
    """The valid op configuration a configuration case breaks one key of (a ring layer where it needs one)."""
    return {**config(4, [layer("ring" if window else "flat", window, 1, 2)]), "n_kv_heads": 1, "head_dim": 2,
            "v_head_dim": 2, "batch_size": 1, "sizing": "dynamic"}


def _config_value(variant: str, valid: Any) -> Any:
    """A key's malformed value: by type, by range, by enumeration."""
    return {"0": 0, "negative": -1, "bool": True, "float": float(valid) if isinstance(valid, int) else 1.0,
            "string": str(valid), "null": None, "unknown": "unknown", "n+1": valid + 1 if isinstance(valid, int) else 2
            }[variant]


def config_of(case: Case) -> JsonConfig:
    """The invalid configuration a configuration case (a CONFIG clause and variant) stands for."""
    clause, variant = case.clause, case.variant
    key = clause.id.split(".", 2)[2]
    if key == "layers":
        if variant == "count":
            return {**op_base_config(), "n_layers": 3, "layers": [layer("flat", 0, 1, 2)] * 2}
        # not a list: one bare policy where the list of them belongs
        return {**op_base_config(), "layers": [] if variant == "empty" else {"kind": "flat", "window": 0}}
    if key == "layers.kind":
        base = op_base_config(2)
        return {**base, "layers": [{**base["layers"][0], "kind": _config_value(variant, "ring")}]}
    if key == "layers.window":
        if variant == "flat with a window":
            return {**op_base_config(), "layers": [layer("flat", 2, 1, 2)]}
        base = op_base_config(2)
        window = 0 if variant == "ring window 0" else _config_value(variant, 2)
        return {**base, "layers": [{**base["layers"][0], "window": window}]}
    name = clause.argument
    base = op_base_config(2) if name == "max_write" else op_base_config()   # max_write bounds a ring's steps
    return {**base, name: _config_value(variant, base.get(name) or 2)}


def config_cases(face: str) -> list[tuple[Case, JsonConfig]]:
    """Every configuration case of a face, with the invalid configuration it stands for."""
    return [(Case(clause, variant), config_of(Case(clause, variant)))
            for clause in of_face(face) if clause.kind == CONFIG for variant in variants(clause)]


def config_case(face: str, cfg: JsonConfig) -> Optional[Case]:
    """The configuration case a configuration is (the suite sends each as derived), or None."""
    as_sent = json.dumps(cfg, sort_keys=True)   # by its JSON: True == 1 == 1.0 in Python, not here
    return next((case for case, bad in config_cases(face) if json.dumps(bad, sort_keys=True) == as_sent), None)


def case_of(step: dict[str, Any]) -> Optional[Case]:
    """The case a step names ("clause", "variant"), or None."""
    clause = BY_ID.get(str(step.get("clause")))
    q_len = step.get("q_len", 1)
    return None if clause is None else Case(clause, str(step.get("variant", "")), q_len if type(q_len) is int else 1)


def malformation(clause: Clause) -> bool:
    """Whether breaking `clause` is a malformed call - a value no model code passes: a wrong shape, dtype or
    rank, q_len 0, an id or an int out of its range, a position outside [0, 2**31 - 2] - rather than a call
    the state refuses (positions that do not continue the history or repeat one, a step longer than
    max_write) or an invalid configuration (OP-CONFIG stays owed). The scope relaxation `trusted-args`
    (scope.py) leaves exactly these out."""
    return clause.rule != "OP-MAX-WRITE" and clause.kind != CONFIG and \
        not (clause.kind == POSITIONS and not clause.id.endswith(".range"))


def sendable(program: list[dict[str, Any]], relaxed: frozenset[str]) -> list[dict[str, Any]]:
    """The program as a target with these scope relaxations is sent it: under `trusted-args` no malformed
    call (`malformation`); under `lazy-shapes` no call of a malformed shape (DIM, TENSOR) on a layer not
    served since the cache was created or reset - its first update is where it learns its sizes."""
    trusted, lazy = "trusted-args" in relaxed, "lazy-shapes" in relaxed
    if not (trusted or lazy):
        return program
    out: list[dict[str, Any]] = []
    served: set[Any] = set()
    for step in program:
        case = case_of(step)
        if case is not None and trusted and malformation(case.clause):
            continue
        if step.get("op") == "reset":
            served = set()
        elif step.get("op") == "fetch":
            if case is not None and lazy and case.clause.kind in (DIM, TENSOR) and step.get("layer") not in served:
                continue
            if case is None:
                served.add(step.get("layer"))
        out.append(step)
    return out


def broken_state(data: bytes, form: str) -> bytes:
    """A saved state (OP-STATE, CELL-STATE) broken as the suite can break it without knowing its format: its last
    byte cut off ("truncated"), or its middle byte's lowest bit flipped ("flipped"); any other form leaves it whole."""
    if form == "truncated":
        return data[:-1]
    if form == "flipped" and data:
        middle = len(data) // 2
        return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1:]
    return data


def faces() -> set[str]:
    return {face for clause in CLAUSES for face in clause.faces}


__all__ = ["CLAUSE_PREFIX", "CONFIG", "MULTI_TOKEN", "Case", "DIM", "ID", "INT", "LIST", "POSITIONS", "TENSOR",
           "broken_state", "case_of", "cases", "config_case", "config_cases", "config_of", "dim_value", "dim_values",
           "id_value", "int_value", "malformation", "malformed_positions", "op_base_config", "sendable", "sizes_of",
           "step_bound", "tokens_of"]
