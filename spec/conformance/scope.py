"""A target's declared scope: which parts of the spec it implements (SCOPE-BORDER).

A real implementation may legitimately implement part of the spec: ExecuTorch's first sequence
cache (PR #21412) has only the flat policy and a CacheConfig without `max_write`. A scope is a set
of **features**:

- `flat`, `ring`: the layer kinds the target implements;
- `max_write`: the config field of that name (a target without it serves only `max_write: null`);
- `max_seqs=N` (the cell layout): the one `max_seqs` the target serves. Upstream's cell cache (PR #21902)
  fixes it at 64 (`kMaxSeqs`) and its constructor takes no such argument, so it declares
  `max_seqs=64`: cell configurations with another `max_seqs` lie outside its scope (absent: 64).

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
# The cell layout's fixed-max_seqs feature: "max_seqs=64" in a declaration. Not a member of FEATURES:
# it carries a value, and no declaration (the whole spec) means every max_seqs.
MAX_SEQS = "max_seqs"
DEFAULT_MAX_SEQS = 64   # a cell config without the field (spec/PROTOCOL.md, "Cell methods")
# The op face's parts a target may leave out (op/engine.py; SPEC.md section 8.4): a config needing `mla`
# lies outside a scope without it; `positions`, `steps` and `declarations` are about programs, so a step
# whose refusal or effect only they define ends its program unjudged.
OP_FEATURES: dict[str, str] = {
    "batch": "batch rows (batch_size > 1; a target without it serves batch 1 only, as the MLX runtime's pools do)",
    "mla": "a value width of its own (v_head_dim != head_dim)",
    "positions": "placing by the `position` argument (a cache that appends at its used length leaves it out)",
    "steps": "a forward as one step across layers (a cache of independent per-layer histories leaves it out)",
    "declarations": "a verb drops a begin_step declaration no layer has used yet (upstream's cell cache keeps it)",
    # additive: the target implements them (absent: its programs send no trim, its configs carry no keep)
    "trim": "the trim(n) verb: drop the newest n tokens of every layer (OP-TRIM)",
    "sinks": "ring layers with attention sinks (a policy's keep > 0, OP-SINKS)",
}
EVERY_FEATURE: dict[str, str] = {**FEATURES, **OP_FEATURES}
# The features that make up the whole of each layout's face: a scope holding them all is the whole spec
# for that layout (an op target without `positions` is partial, a sequence target needs no `mla`).
LAYOUT_FEATURES: dict[str, frozenset[str]] = {
    "sequence": frozenset(FEATURES),
    "cell": frozenset(FEATURES),
    "op-contiguous": frozenset({"flat", "ring", "max_write", "batch", "mla", "positions", "steps", "trim", "sinks"}),
    "op-cell": frozenset({"flat", "ring", "mla", "positions", "steps", "declarations"}),
}



def features_per_layout() -> str:
    """Each layout's features, as `--scope` accepts them: 'sequence: flat, ring, max_write; cell: ...'."""
    return "; ".join(f"{layout}: " + ", ".join([name for name in EVERY_FEATURE if name in features]
                                               + ([f"{MAX_SEQS}=N"] if layout == "cell" else []))
                     for layout, features in LAYOUT_FEATURES.items())

def needs(cfg: JsonConfig) -> frozenset[str]:
    """The features a (valid) configuration needs: its layer kinds, and max_write when it is set."""
    kinds = {entry.get("kind") for entry in cfg.get("layers", []) if isinstance(entry, dict)}
    wanted = {kind for kind in kinds if kind in FEATURES}
    if cfg.get("max_write") is not None:
        wanted.add("max_write")
    if "v_head_dim" in cfg and cfg["v_head_dim"] != cfg.get("head_dim"):
        wanted.add("mla")
    if cfg.get("batch_size", 1) != 1:   # an op config's batch rows (absent from the other layouts' configs)
        wanted.add("batch")
    if any(isinstance(entry, dict) and entry.get("keep", 0) != 0 for entry in cfg.get("layers", [])):
        wanted.add("sinks")   # a ring with attention sinks (OP-SINKS)
    return frozenset(wanted)


def family(cfg: JsonConfig) -> str:
    """A configuration family: the features it needs, in a stable order ('flat+ring+max_write')."""
    return "+".join(name for name in EVERY_FEATURE if name in needs(cfg)) or "none"


def max_seqs_of(cfg: JsonConfig) -> Any:
    """A cell configuration's max_seqs as it is (absent: 64)."""
    return cfg.get(MAX_SEQS, DEFAULT_MAX_SEQS)


@dataclass(frozen=True)
class Scope:
    features: frozenset[str]
    source: str = "not declared: the whole spec"
    ignored: tuple[str, ...] = ()   # unknown names in the declaration
    max_seqs: Optional[int] = None   # the one max_seqs served ("max_seqs=64"); None: every max_seqs

    def full_for(self, layout: str) -> bool:
        """Whether the scope is the whole spec for `layout` (targets.LAYOUTS): every feature of its face."""
        return self.features >= LAYOUT_FEATURES[layout] and self.max_seqs is None

    def missing(self, cfg: JsonConfig) -> frozenset[str]:
        """The features `cfg` needs that the scope leaves out (empty: the config is inside). A cell
        config whose max_seqs is not the scope's fixed one misses "max_seqs"."""
        other = self.max_seqs is not None and MAX_SEQS in cfg and not _same_int(cfg[MAX_SEQS], self.max_seqs)
        return (needs(cfg) - self.features) | (frozenset({MAX_SEQS}) if other else frozenset())

    def covers(self, cfg: JsonConfig) -> bool:
        return not self.missing(cfg)

    def names(self) -> list[str]:
        fixed = [] if self.max_seqs is None else [f"{MAX_SEQS}={self.max_seqs}"]
        return [name for name in EVERY_FEATURE if name in self.features] + fixed

    def family(self, cfg: JsonConfig) -> str:
        """The family a configuration outside the scope is listed under: its features, and its max_seqs
        when that is what puts it outside ('flat, max_seqs 3')."""
        name = family(cfg)
        return name + (f", max_seqs {cfg[MAX_SEQS]!r}" if MAX_SEQS in self.missing(cfg) else "")

    def __str__(self) -> str:
        return ",".join(self.names()) or "nothing"


FULL = Scope(frozenset(EVERY_FEATURE))


def _same_int(value: Any, fixed: int) -> bool:
    return type(value) is int and value == fixed   # bool is not an int (True is not max_seqs 1)


class ScopeError(ValueError):
    """A scope declaration that is not a list of feature names."""


def parse_text(text: str, source: str) -> Scope:
    """A scope written on a command line: comma-separated feature names ('flat,max_write', 'all')."""
    return parse([part.strip() for part in text.split(",") if part.strip()], source)


def parse(value: Any, source: str) -> Scope:
    """A declared scope: a list (or tuple) of feature names; `all` stands for every feature, and
    `max_seqs=N` (N an int from 1 to 64) fixes the one max_seqs served.

    Raises ScopeError for anything that is not such a list (a bare string included: "flat" is not
    ["flat"], and a protocol value must be exact), and for a `max_seqs=` item that is not one such N.
    """
    if isinstance(value, (list, tuple, frozenset, set)):
        items = list(value)
    else:
        raise ScopeError(f"a scope is a list of feature names ({', '.join(FEATURES)}), not {value!r}"[:200])
    if not all(isinstance(item, str) for item in items):
        raise ScopeError(f"a scope lists feature names as strings, got {value!r}"[:200])
    fixed = {item for item in items if item.startswith(MAX_SEQS + "=")}
    items = [item for item in items if item not in fixed]
    max_seqs = _fixed_max_seqs(fixed) if fixed else None
    if "all" in items:
        items = [name for name in items if name != "all"] + list(EVERY_FEATURE)
    known = frozenset(item for item in items if item in EVERY_FEATURE)
    return Scope(known, source, tuple(sorted({item for item in items if item not in EVERY_FEATURE})), max_seqs)


def _fixed_max_seqs(items: set[str]) -> int:
    """The N of the `max_seqs=N` items (one value, 1..64: the cell layout's CELL-MAX-SEQS range)."""
    values = {item.split("=", 1)[1].strip() for item in items}
    if len(values) != 1:
        raise ScopeError(f"a scope fixes one max_seqs, got {sorted(items)}"[:200])
    text = values.pop()
    if not (text.isdigit() and text.isascii() and 1 <= int(text) <= DEFAULT_MAX_SEQS):
        raise ScopeError(f"max_seqs={text}: a fixed max_seqs is an int from 1 to {DEFAULT_MAX_SEQS}"[:200])
    return int(text)


def from_factory(factory: Any) -> Scope:
    """A python: target's scope: its factory's `kvcache_scope` attribute, or the whole spec."""
    declared = getattr(factory, "kvcache_scope", None)
    return FULL if declared is None else parse(declared, "the factory's kvcache_scope")


def with_twins(configs: Iterable[JsonConfig], scope: Scope) -> tuple[JsonConfig, ...]:
    """The configurations, plus - for a scope that fixes max_seqs - the twin inside the scope of each one
    outside it by its max_seqs alone (the same config with the scope's max_seqs), unless that one is
    already there. A cache with upstream's fixed 64 ids is then driven over every layer family and edge
    the suite has (capacity 1, window 1, broadcast, ...), not only over the configurations that happen
    to have 64 ids; the originals stay outside the scope, checked refused at creation."""
    configs = list(configs)
    if scope.max_seqs is None:
        return tuple(configs)
    out = list(configs)
    for cfg in configs:
        twin = {**cfg, MAX_SEQS: scope.max_seqs}
        if scope.missing(cfg) == {MAX_SEQS} and twin not in out:
            out.append(twin)
    return tuple(out)


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
WITHOUT = {name: "WITHOUT-" + name.upper().replace("_", "-") for name in (*FEATURES, MAX_SEQS)}
FLAG_NOTES: dict[str, str] = {
    **{flag: f"the test needs {FEATURES[name]}: skip it when the target's scope leaves out {name!r}"
       for name, flag in NEEDS.items()},
    **{flag: f"a border test for targets whose scope leaves out {name!r} (SCOPE-BORDER): skip it otherwise"
       for name, flag in WITHOUT.items() if name in FEATURES},
    WITHOUT[MAX_SEQS]: "a border test for targets whose scope fixes another max_seqs than the config's "
                       "(SCOPE-BORDER): skip it otherwise",
}


def needs_flags(cfg: JsonConfig) -> list[str]:
    return [NEEDS[name] for name in FEATURES if name in needs(cfg)]


def applies(flags: Iterable[str], scope: Scope, cfg: Optional[JsonConfig] = None) -> bool:
    """Whether a golden-vector test with these flags (in a group of this config) is for a target with
    this scope. The max_seqs a scope fixes is read from the group's config, not from flags: a cell
    config with another max_seqs lies outside."""
    flags = set(flags)
    return all(NEEDS[name] not in flags for name in FEATURES if name not in scope.features) and \
        all(WITHOUT[name] not in flags for name in FEATURES if name in scope.features) and \
        (scope.max_seqs is not None or WITHOUT[MAX_SEQS] not in flags) and \
        (cfg is None or MAX_SEQS not in scope.missing(cfg))


# --- what a partial scope leaves unexercised ----------------------------------------------------------

VECTORS_PATH = Path(__file__).resolve().parent.parent / "vectors" / "kvcache_vectors.json"
# Each layout's golden vectors (vectors.py writes them), whose flags say what exercises what.
LAYOUT_VECTORS = {"sequence": "kvcache_vectors.json", "cell": "cell_vectors.json"}


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


def unexercised(scope: Scope, configs: Iterable[JsonConfig], layout: str = "sequence",
                document: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """What a run inside `scope` leaves out: the configuration families (with the suite configs not
    driven) and the rules and bug classes that only `layout`'s golden vectors outside the scope exercise
    (the op face has no golden vectors: nothing is claimed for it)."""
    families: dict[str, list[str]] = {}
    for cfg in configs:
        if not scope.covers(cfg):
            families.setdefault(scope.family(cfg), []).append(describe(cfg))
    inside: set[str] = set()
    everywhere: set[str] = set()
    if document is None and layout in LAYOUT_VECTORS:
        document = json.loads((VECTORS_PATH.parent / LAYOUT_VECTORS[layout]).read_text())
    for wanted, flags in (flags_by_need(document) if document is not None else []):
        everywhere |= flags
        if wanted <= scope.features:
            inside |= flags
    left = everywhere - inside
    return {"families": families,
            "rules": sorted(flag for flag in left if not flag.startswith(("BUG-", "UPSTREAM-", "NEEDS-", "WITHOUT-"))),
            "bug_classes": sorted(flag for flag in left if flag.startswith(("BUG-", "UPSTREAM-")))}


def summary(scope: Scope, configs: Iterable[JsonConfig], layout: str) -> dict[str, Any]:
    """The report's scope section for a target of `layout` (also turned into skipped notes, so every
    report format shows it)."""
    configs = list(configs)
    inside, outside = split(configs, scope)
    full = scope.full_for(layout)
    report: dict[str, Any] = {"features": scope.names(), "source": scope.source, "full": full,
                              "configs_driven": len(inside), "configs_outside": len(outside)}
    if scope.max_seqs is not None:
        report["max_seqs"] = scope.max_seqs
    if scope.ignored:
        report["ignored_features"] = list(scope.ignored)
    if not full:
        report["unexercised"] = unexercised(scope, configs, layout)
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
