"""A target's declared scope: which parts of the spec it implements (SCOPE-BORDER).

A real implementation may legitimately implement part of the spec: ExecuTorch's first sequence
cache (PR #21412) has only the flat policy and a CacheConfig without `max_write`. A scope is a set
of **features**:

- `flat`, `ring`: the layer kinds the target implements;
- `max_write`: the config field of that name (a target without it serves only `max_write: null`).

The suite drives only configurations inside the scope, lists what it left unexercised (the
configuration families and the rules only they exercise), and checks the border: a valid
configuration outside the scope must be refused at creation. A target that accepts it and serves
it another way (a sliding-window layer served as full history: silently wrong attention) is a
`wrong` SCOPE-BORDER finding; one that accepts it and happens to answer as the spec is `lenient`
(declare the feature, or refuse the configuration); one that dies on it is a `crash`.

Where a scope comes from (the first that applies):
- the CLI: `kvcache conformance --scope flat` (or `flat,max_write`, `all`);
- a `cmd:` target's `hello` answer: `"scope": ["flat"]` (spec/PROTOCOL.md, "Scope");
- a `python:` target's factory attribute `kvcache_scope` (a list or tuple of feature names);
- otherwise the whole spec: every feature (targets written before scopes existed).
Unknown feature names in a declaration are ignored (a newer target talking to an older harness).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from .configs import JsonConfig, describe

FEATURES: dict[str, str] = {
    "flat": "flat (full-history) layers",
    "ring": "ring (sliding-window) layers",
    "max_write": "the max_write config field (configs with max_write set)",
}
BORDER_RULE = "SCOPE-BORDER"
# The op face's parts a target may leave out (op_engine.py; SPEC.md section 8.4): a config needing `mla`
# lies outside a scope without it; `positions`, `steps` and `declarations` are about programs, so a step
# whose refusal or effect only they define ends its program unjudged.
OP_FEATURES: dict[str, str] = {
    "mla": "a value width of its own (v_head_dim != head_dim)",
    "positions": "placing by the `position` argument (a cache that appends at its used length leaves it out)",
    "steps": "a forward as one step across layers (a cache of independent per-layer histories leaves it out)",
    "declarations": "a verb drops a begin_step declaration no layer has used yet (upstream's cell cache keeps it)",
}


def needs(cfg: JsonConfig) -> frozenset[str]:
    """The features a (valid) configuration needs: its layer kinds, and max_write when it is set."""
    kinds = {entry.get("kind") for entry in cfg.get("layers", []) if isinstance(entry, dict)}
    wanted = {kind for kind in kinds if kind in FEATURES}
    if cfg.get("max_write") is not None:
        wanted.add("max_write")
    if "v_head_dim" in cfg and cfg["v_head_dim"] != cfg.get("head_dim"):
        wanted.add("mla")
    return frozenset(wanted)


def family(cfg: JsonConfig) -> str:
    """A configuration family: the features it needs, in a stable order ('flat+ring+max_write')."""
    return "+".join(name for name in {**FEATURES, **OP_FEATURES} if name in needs(cfg)) or "none"


@dataclass(frozen=True)
class Scope:
    features: frozenset[str]
    source: str = "not declared: the whole spec"
    ignored: tuple[str, ...] = ()   # unknown names in the declaration

    @property
    def full(self) -> bool:
        return self.features >= frozenset(FEATURES)

    def missing(self, cfg: JsonConfig) -> frozenset[str]:
        """The features `cfg` needs that the scope leaves out (empty: the config is inside)."""
        return needs(cfg) - self.features

    def covers(self, cfg: JsonConfig) -> bool:
        return not self.missing(cfg)

    def names(self) -> list[str]:
        return [name for name in {**FEATURES, **OP_FEATURES} if name in self.features]

    def __str__(self) -> str:
        return ",".join(self.names()) or "nothing"


FULL = Scope(frozenset(FEATURES) | frozenset(OP_FEATURES))


class ScopeError(ValueError):
    """A scope declaration that is not a list of feature names."""


def parse_text(text: str, source: str) -> Scope:
    """A scope written on a command line: comma-separated feature names ('flat,max_write', 'all')."""
    return parse([part.strip() for part in text.split(",") if part.strip()], source)


def parse(value: Any, source: str) -> Scope:
    """A declared scope: a list (or tuple) of feature names; `all` stands for every feature.

    Raises ScopeError for anything that is not such a list (a bare string included: "flat" is not
    ["flat"], and a protocol value must be exact).
    """
    if isinstance(value, (list, tuple, frozenset, set)):
        items = list(value)
    else:
        raise ScopeError(f"a scope is a list of feature names ({', '.join(FEATURES)}), not {value!r}"[:200])
    if not all(isinstance(item, str) for item in items):
        raise ScopeError(f"a scope lists feature names as strings, got {value!r}"[:200])
    every = {**FEATURES, **OP_FEATURES}
    if "all" in items:
        items = [name for name in items if name != "all"] + list(every)
    known = frozenset(item for item in items if item in every)
    return Scope(known, source, tuple(sorted({item for item in items if item not in every})))


def from_factory(factory: Any) -> Scope:
    """A python: target's scope: its factory's `kvcache_scope` attribute, or the whole spec."""
    declared = getattr(factory, "kvcache_scope", None)
    return FULL if declared is None else parse(declared, "the factory's kvcache_scope")


def split(configs: Iterable[JsonConfig], scope: Scope) -> tuple[list[JsonConfig], list[JsonConfig]]:
    """(inside, outside) the scope, each in the given order."""
    inside: list[JsonConfig] = []
    outside: list[JsonConfig] = []
    for cfg in configs:
        (inside if scope.covers(cfg) else outside).append(cfg)
    return inside, outside


# --- scope flags of the golden vectors ----------------------------------------------------------------

# A test flagged NEEDS-X creates a config that needs feature X: a replayer whose scope leaves X out
# skips it. A test flagged WITHOUT-X checks the border of a scope that leaves X out (a config needing
# X must be refused at creation): a replayer whose scope includes X skips it.
NEEDS = {name: "NEEDS-" + name.upper().replace("_", "-") for name in FEATURES}
WITHOUT = {name: "WITHOUT-" + name.upper().replace("_", "-") for name in FEATURES}
FLAG_NOTES: dict[str, str] = {
    **{flag: f"the test needs {FEATURES[name]}: skip it when the target's scope leaves out {name!r}"
       for name, flag in NEEDS.items()},
    **{flag: f"a border test for targets whose scope leaves out {name!r} (SCOPE-BORDER): skip it otherwise"
       for name, flag in WITHOUT.items()},
}


def needs_flags(cfg: JsonConfig) -> list[str]:
    return [NEEDS[name] for name in FEATURES if name in needs(cfg)]


def applies(flags: Iterable[str], scope: Scope) -> bool:
    """Whether a golden-vector test with these flags is for a target with this scope."""
    flags = set(flags)
    return all(NEEDS[name] not in flags for name in FEATURES if name not in scope.features) and \
        all(WITHOUT[name] not in flags for name in FEATURES if name in scope.features)


# --- what a partial scope leaves unexercised ----------------------------------------------------------

VECTORS_PATH = Path(__file__).resolve().parent.parent / "vectors" / "kvcache_vectors.json"


def flags_by_need(document: Optional[dict[str, Any]] = None) -> list[tuple[frozenset[str], frozenset[str]]]:
    """(features a golden-vector test needs, its flags) for every test with a config.

    The golden vectors flag each test with the rules and bug classes its calls exercise (computed
    from the calls, `vectors._flags`): they are the suite's statement of what exercises what.
    """
    document = document or json.loads(VECTORS_PATH.read_text())
    out = []
    for group in document["testGroups"]:
        if group["config"] is None:
            continue   # invalid configs: every target must refuse them, whatever its scope
        wanted = needs(group["config"])
        for test in group["tests"]:
            out.append((wanted, frozenset(test["flags"])))
    return out


def unexercised(scope: Scope, configs: Iterable[JsonConfig],
                document: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """What a run inside `scope` leaves out: the configuration families (with the suite configs not
    driven) and the rules and bug classes that only tests outside the scope exercise."""
    families: dict[str, list[str]] = {}
    for cfg in configs:
        if not scope.covers(cfg):
            families.setdefault(family(cfg), []).append(describe(cfg))
    inside: set[str] = set()
    everywhere: set[str] = set()
    for wanted, flags in flags_by_need(document):
        everywhere |= flags
        if wanted <= scope.features:
            inside |= flags
    left = everywhere - inside
    return {"families": families,
            "rules": sorted(flag for flag in left if not flag.startswith(("BUG-", "UPSTREAM-", "NEEDS-", "WITHOUT-"))),
            "bug_classes": sorted(flag for flag in left if flag.startswith(("BUG-", "UPSTREAM-")))}


def summary(scope: Scope, configs: Iterable[JsonConfig]) -> dict[str, Any]:
    """The report's scope section (also turned into skipped notes, so every report format shows it)."""
    configs = list(configs)
    inside, outside = split(configs, scope)
    report: dict[str, Any] = {"features": scope.names(), "source": scope.source, "full": scope.full,
                              "configs_driven": len(inside), "configs_outside": len(outside)}
    if scope.ignored:
        report["ignored_features"] = list(scope.ignored)
    if not scope.full:
        report["unexercised"] = unexercised(scope, configs)
    return report


def notes(report: dict[str, Any]) -> list[str]:
    """Human lines for a partial scope: what was not driven (never mistaken for a full pass)."""
    if report.get("full", True):
        return []
    left = report["unexercised"]
    lines = [f"scope: [{','.join(report['features'])}] only ({report['source']}): "
             f"{report['configs_driven']} suite configurations driven, {report['configs_outside']} outside the "
             f"scope were only checked to be refused at creation ({BORDER_RULE})"]
    for name, described in left["families"].items():
        lines.append(f"scope: configuration family {name} not exercised: {'; '.join(described)}")
    if left["rules"]:
        lines.append(f"scope: rules exercised only outside the scope: {', '.join(left['rules'])}")
    if left["bug_classes"]:
        lines.append(f"scope: bug classes exercised only outside the scope: {', '.join(left['bug_classes'])}")
    return lines
