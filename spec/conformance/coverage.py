"""What a conformance run exercised, and what a run must exercise before it may say CONFORMING.

A verdict is only worth what it exercised. The engine records, for every call it makes and every
answer it checks, the rules that call or check could have caught broken (`RunResult.exercised`);
the suite adds up the programs planned and run, the configurations created and their families.
A run whose coverage falls short of its scope is INCOMPLETE, never CONFORMING.

When a rule is exercised - the one place this is defined (the engine reports the events named here):

- the rule a call is checked against: every call the engine makes carries the rule a wrong answer
  would break (`Engine._call(method, args, rule)`: e.g. ADMIT for can_extend, REWIND-SOUND for an
  accepted rewind, REWIND-GROW for a rewind past the length, ARG-INT for plan(True, ...),
  COMMIT-ISSUED for a forged plan, ATOMIC for the length observed after a refused or rejected call,
  PLAN-PURE for the length observed after a plan, LEN-BOUNDS, RETAINED, CLEAR, FACES, DEPTH); the
  rule counts once the target answered that call (a crash on it exercises nothing);
- `EVENTS` below: the checks the engine makes on an answer rather than on a call (a plan's shape,
  its write and read runs and its layout; the reads of an executed plan; plans on layers that share
  a policy);
- a create with a configuration the spec rejects exercises that configuration's CFG-* rule.

Scope (the rules a run must exercise): every rule of spec/rules.py except `OUT_OF_SCOPE` (no face
call can observe them), the CFG-* validation rules for `python:` targets (they receive a
`kvcache.CacheConfig`, which validates itself), DEPTH without `depth()` and RETAINED without
`retained_from()` (optional methods: a target may leave them out).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from ..arguments import Clause, of_face
from ..rules import DECLARATION_RULES, RULES
from .configs import JsonConfig
from . import scope as scopes
from .malform import CLAUSE_PREFIX, CONFIG, cases, config_cases, malformation

# Rules no call on one cache's faces can observe, and why.
OUT_OF_SCOPE: dict[str, str] = {
    "PROTO-COMMIT": "a consumer obligation: the harness keeps it, a cache cannot break it",
    "ET-MAP": "the ExecuTorch Error/Result adapter (kvcache.et) is a language binding, not a face method",
    "REG-KEYS": "the builder registry is process-global API, not part of one cache's faces",
    "REG-SESSION": "the cache registry session is process-global API, not part of one cache's faces",
    "THREADS": "thread safety is not observable through a sequential call list",
    **{rule_id: "a declaration rule: it binds the suite (what it sends a target declaring it, what that target owes), "
                "not a call of the target" for rule_id in DECLARATION_RULES},
}
# The rules of the cell layout (spec/cell_model.py) bind cell caches only.
CELL_PREFIX = "CELL-"
# The rules of the paged layout (spec/paged_model.py) bind paged caches only, and only they do (with SCOPE-BORDER).
PAGED_PREFIX = "PAGED-"
# The rules of the op face (spec/op_model.py) bind op-face targets only, and only they do.
OP_PREFIX = "OP-"
# Checked only when the target validates configurations itself (cmd: targets get JSON configs).
CONFIG_VALIDATION = ("CFG-TYPE", "CFG-CAPACITY", "CFG-LAYERS", "CFG-POLICY", "CFG-MAX-WRITE", "CFG-SHAPE",
                     "CFG-INITIAL-CAPACITY")
# A scope feature (scope.py) -> the rules only it defines: a target whose scope leaves out every feature naming a
# rule (OP-ROWS: batch-verbs, select, merge) is never judged on it (the op engine ends a program unjudged at such a refusal), so they cannot be
# owed. Measured: the op stand-ins without `positions` exercise no OP-POS; without `steps` or
# `declarations` every rule is still exercised.
FEATURE_RULES: dict[str, tuple[str, ...]] = {"positions": ("OP-POS",), "batch": ("OP-BATCH",),
                                             "max_write": ("OP-MAX-WRITE",), "trim": ("OP-TRIM",),
                                             "sinks": ("OP-SINKS",), "chunk": ("OP-CHUNK",),
                                             "recording": ("OP-RECORD",), "state": ("OP-STATE",),
                                             "pad": ("OP-PAD",), "batch-verbs": ("OP-ROWS",),
                                             "select": ("OP-ROWS",), "merge": ("OP-ROWS",),
                                             "quantize": ("OP-QUANTIZE",)}
# A scope relaxation (scope.py; SPEC.md 6.1) -> the rules it leaves unowed, per layout: `trusted-args` is
# sent no malformed call (OP-ARGS and PAGED-ARGS have no other refusal; PAGED-FREE's count is owed still) and no
# invalid config (a cell cache's OP-BATCH is only the refusal of batch_size != 1 at construction; PAGED-CONFIG
# only refusals), `unbounded` no capacity (a contiguous cache's
# OP-CAP). A contiguous cache declaring both, and neither `positions`, `steps` nor `max_write`, is sent
# no call the spec refuses at all: OP-ATOMIC has nothing to judge (RELAXED_ATOMIC).
RELAXATION_RULES: dict[str, dict[str, tuple[str, ...]]] = {
    "trusted-args": {"op-contiguous": ("OP-ARGS",), "op-cell": ("OP-ARGS", "OP-BATCH"),
                     "paged": ("PAGED-ARGS", "PAGED-CONFIG")},
    "unbounded": {"op-contiguous": ("OP-CAP",)},
}
RELAXED_ATOMIC = (frozenset({"trusted-args", "unbounded"}), frozenset({"positions", "steps", "max_write"}))
# An optional method -> the rule only it can show.
OPTIONAL_RULES = {"depth": "DEPTH", "retained_from": "RETAINED", "ref_counts": "PAGED-REFCOUNT"}

# The rules besides the CELL- family that bind a cell cache too: its configuration, argument types
# and ranges, layer indices, one object behind both faces, and a declared scope's border.
SHARED_RULES = CONFIG_VALIDATION + ("ARG-INT", "ARG-RANGE", "ARG-TYPE", "LAYER-RANGE", "FACES", "SCOPE-BORDER")

# Engine events -> the rules their check could have caught broken.
EVENTS: dict[str, tuple[str, ...]] = {
    "plan checked": ("PLAN-SHAPE", "PLAN-WRITE", "PLAN-READ", "LAYOUT-CANON"),
    "plan executed": ("DATA-SOUND",),
    "plan on a shared policy": ("CFG-DEDUP",),
    # a CellStep executed on the harness's pool (reads by definition) and compared with the canonical one
    "cell step executed": ("CELL-DATA-SOUND", "CELL-PLACE", "CELL-STEP-SHAPE", "CELL-MASK", "CELL-WINDOW-POS",
                           "CELL-LAYOUT-CANON"),
}


# The rules a cell cache seen through its outputs is judged by (SPEC.md 5.3): the op face's cell verbs, the
# recompute, next_pos, clear and a declared scope's border.
RECOMPUTE_ONLY = ("CELL-RECOMPUTE", "CELL-KEEP", "CELL-SHIFT", "CELL-STATE")   # bind the recompute face alone
# The recompute face's additive features (scope.RECOMPUTE_FEATURES) -> the rules a target without one is not judged on
RECOMPUTE_FEATURE_RULES: dict[str, tuple[str, ...]] = {"seq-state": ("CELL-STATE",)}
RECOMPUTE_RULES = ("CELL-RECOMPUTE", "CELL-KEEP", "CELL-SHIFT", "CELL-STATE", "CELL-OWNERS", "CELL-CLEAR", "OP-FORK",
                   "OP-RM", "OP-POS", "OP-STEP", "OP-CAP",
                   "OP-ATOMIC", "OP-CONFIG", "OP-BATCH", "SCOPE-BORDER")


def _layout_rule(rule_id: str, layout: str) -> str:
    """'' when the rule binds a cache of this layout, else why it does not."""
    if layout == "paged" or rule_id.startswith(PAGED_PREFIX):
        binds = (layout == "paged") == rule_id.startswith(PAGED_PREFIX) or layout == "paged" and rule_id == "SCOPE-BORDER"
        return "" if binds else (f"a rule of the paged layout: this run drives the {layout} layout" if layout != "paged"
                                 else "a rule of another layout: this run drives a paged cache")
    if layout == "cell-recompute":
        return "" if rule_id in RECOMPUTE_RULES else \
            "not observable through outputs: this run drives a cell cache seen only through its outputs"
    if rule_id in RECOMPUTE_ONLY:
        return (f"a rule of the cell layout seen through its outputs (cell-recompute): this run drives the {layout} "
                "layout")
    if layout.startswith("op-") or rule_id.startswith(OP_PREFIX):
        binds = layout.startswith("op-") == rule_id.startswith(OP_PREFIX) or rule_id == "SCOPE-BORDER"
        other_kind = layout == "op-contiguous" and rule_id in ("OP-FORK", "OP-RM") or \
            layout == "op-cell" and rule_id in ("OP-MAX-WRITE", "OP-TRIM", "OP-SINKS", "OP-CHUNK", "OP-RECORD",
                                                 "OP-STATE", "OP-PAD", "OP-ROWS", "OP-QUANTIZE")   # no rings to
        # bound, trim, sinks, chunks, recording, saved state, batch rows or quantize
        if binds and other_kind:
            return f"a rule of the other op cache: this run drives the {layout} layout"
        return "" if binds else f"a rule of another face: this run drives the {layout} layout"
    if layout == "cell":
        return "" if rule_id.startswith(CELL_PREFIX) or rule_id in SHARED_RULES else \
            "a rule of the sequence layout: this run drives a cell cache"
    return "a rule of the cell layout: this run drives a sequence cache" if rule_id.startswith(CELL_PREFIX) else ""


def _relaxed_rule(rule_id: str, layout: str, relaxed: frozenset[str], features: Optional[frozenset[str]]) -> str:
    """Why a declared relaxation leaves the rule unowed ('' when it does not)."""
    for name in sorted(relaxed):
        if rule_id in RELAXATION_RULES.get(name, {}).get(layout, ()):
            return f"the target's scope declares {name!r}: the rule is not owed"
    needed, absent = RELAXED_ATOMIC
    if rule_id == "OP-ATOMIC" and layout == "op-contiguous" and needed <= relaxed and \
            features is not None and not features & absent:
        return (f"the target's scope declares {', '.join(sorted(needed))} and leaves out {', '.join(sorted(absent))}: "
                "no call it is sent is one the spec refuses")
    return ""


def in_scope(config_validation: bool, optional: frozenset[str], layout: str = "sequence",
             features: Optional[frozenset[str]] = None, relaxed: frozenset[str] = frozenset()) -> dict[str, str]:
    """The rules a run must exercise -> '' ; the rules outside its scope -> why. `features`: the
    target's declared scope (scope.py; None: every feature); `relaxed`: its declared relaxations."""
    scope: dict[str, str] = {}
    for rule in RULES:
        naming = [name for name, rules in FEATURE_RULES.items() if rule.id in rules]
        left_out = [name for name in naming   # the op face's features (the recompute face has its own): all left out
                    if features is not None and not features & set(naming) and layout != "cell-recompute"] + \
            [name for name, rules in RECOMPUTE_FEATURE_RULES.items()
             if rule.id in rules and features is not None and name not in features and layout == "cell-recompute"]
        if rule.id in OUT_OF_SCOPE:
            scope[rule.id] = OUT_OF_SCOPE[rule.id]
        elif _layout_rule(rule.id, layout):
            scope[rule.id] = _layout_rule(rule.id, layout)
        elif left_out:
            scope[rule.id] = f"the target's scope leaves out {left_out[0]!r}: the op engine does not judge it"
        elif _relaxed_rule(rule.id, layout, relaxed, features):
            scope[rule.id] = _relaxed_rule(rule.id, layout, relaxed, features)
        elif rule.id in CONFIG_VALIDATION and not config_validation:
            scope[rule.id] = "config validation: a python: target gets a kvcache.CacheConfig, which validates itself"
        elif any(rule.id == shown and method not in optional for method, shown in OPTIONAL_RULES.items()):
            method = next(m for m, shown in OPTIONAL_RULES.items() if shown == rule.id)
            scope[rule.id] = f"the target has no {method}() (optional)"
        else:
            scope[rule.id] = ""
    return scope


def not_owed(clause: Clause, relaxed: frozenset[str], user_config: frozenset[str] = frozenset()) -> str:
    """The relaxation under which a configuration clause is not owed ('' when it is): any under
    `trusted-args` but one of a key its `user-config` names, a size a `lazy-shapes` target is never given, the
    capacity an `unbounded` one may ignore (the op engine does not judge them: op/engine.py, _not_owed)."""
    user_set = clause.id.rsplit(".", 1)[-1] in user_config   # op.create.capacity, op.create.layers.window
    if scopes.TRUSTED_ARGS in relaxed and not user_set:   # model code creates the cache from a config its library built
        return scopes.TRUSTED_ARGS
    if scopes.LAZY_SHAPES in relaxed and clause.argument in scopes.SIZE_KEYS:
        return scopes.LAZY_SHAPES
    if scopes.UNBOUNDED in relaxed and clause.argument == "capacity":
        return scopes.UNBOUNDED
    return ""


def clause_scope(layout: str, scope: dict[str, str], optional: frozenset[str],
                 features: Optional[frozenset[str]] = None, relaxed: frozenset[str] = frozenset(),
                 configs: Optional[Iterable[JsonConfig]] = None,
                 user_config: frozenset[str] = frozenset()) -> dict[str, str]:
    """The argument and configuration cases (spec/arguments.py, derived by malform.py) a run must break ->
    '' ; the others -> why: a case of a rule outside the scope, of a scope feature the target leaves out, of
    an optional method the target does not have, a malformation a `trusted-args` target is never sent, a
    configuration key a `lazy-shapes` target is not given or an `unbounded` one may ignore. Counted per case
    - each variant of a clause the run's configurations derive (`configs`) - not per clause: a clause
    counts as broken only when every case of it was."""
    out: dict[str, str] = {}
    derived = {case.name: case.clause for cfg in configs for case in cases(layout, cfg)} if configs is not None \
        else {clause.id: clause for clause in of_face(layout)}
    if configs is not None:   # and each invalid configuration derived from a configuration clause
        derived.update((case.name, case.clause) for case, _ in config_cases(layout))
    for name, clause in sorted(derived.items()):
        if scope.get(clause.rule):
            out[name] = f"its rule {clause.rule} is out of scope: {scope[clause.rule]}"
        elif "trusted-args" in relaxed and malformation(clause):
            out[name] = "the target's scope declares 'trusted-args': no malformed call is sent"
        elif clause.kind == CONFIG and not_owed(clause, relaxed, user_config):
            out[name] = f"the target's scope declares {not_owed(clause, relaxed, user_config)!r}: this key is not owed"
        elif clause.feature and features is not None and clause.feature not in features:
            out[name] = f"the target's scope leaves out {clause.feature!r}: the op engine does not judge it"
        elif clause.call in OPTIONAL_RULES and clause.call not in optional:
            out[name] = f"the target has no {clause.call}() (optional)"
        else:
            out[name] = ""
    return out


def clauses_summary(clauses: dict[str, str], exercised: set[str]) -> dict[str, Any]:
    """The argument clauses part of a report, as `summary` gives the rules part."""
    return {"exercised": sorted(c for c, why in clauses.items() if not why and CLAUSE_PREFIX + c in exercised),
            "not_exercised": sorted(c for c, why in clauses.items() if not why and CLAUSE_PREFIX + c not in exercised),
            "out_of_scope": {c: why for c, why in sorted(clauses.items()) if why}}


def family(cfg: JsonConfig) -> str:
    """A configuration's family: its layer kinds, and whether max_write is set ('flat+ring, max_write')."""
    entries = cfg.get("groups", cfg.get("layers", []))   # a paged config's groups (paged/programs.py)
    kinds = sorted({str(entry.get("kind")) for entry in entries if isinstance(entry, dict)}) \
        if isinstance(entries, list) else []
    name = "+".join(kinds) or "no layers"
    return name + (", max_write" if cfg.get("max_write") is not None else "")


def shortfall(planned: int, run: int, configs: set[str], created: set[str], scope: dict[str, str],
              exercised: set[str], clauses: Optional[dict[str, str]] = None) -> list[str]:
    """Why a run exercised less than it promised (empty: full coverage)."""
    reasons: list[str] = []
    if run < planned:
        reasons.append(f"{run} of {planned} programs run")
    never = sorted(configs - created)
    if never:
        reasons.append(f"{len(never)} of {len(configs)} configurations never created: {', '.join(never[:4])}"
                       + (" ..." if len(never) > 4 else ""))
    missing = sorted(rule for rule, why in scope.items() if not why and rule not in exercised)
    if missing:
        reasons.append(f"rules in scope never exercised: {', '.join(missing)}")
    never_broken = clauses_summary(clauses or {}, exercised)["not_exercised"]
    if never_broken:
        reasons.append(f"{len(never_broken)} argument and configuration cases in scope never broken (a malformed call, an invalid configuration): "
                       f"{', '.join(never_broken[:4])}" + (" ..." if len(never_broken) > 4 else ""))
    return reasons


def summary(scope: dict[str, str], exercised: set[str]) -> dict[str, Any]:
    """The rules part of a report: exercised, in scope but not exercised, out of scope (with why)."""
    return {"exercised": sorted(rule for rule, why in scope.items() if not why and rule in exercised),
            "not_exercised": sorted(rule for rule, why in scope.items() if not why and rule not in exercised),
            "out_of_scope": {rule: why for rule, why in sorted(scope.items()) if why}}
