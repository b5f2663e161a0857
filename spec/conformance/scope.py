"""A target's declared scope: which parts of the spec it implements (SCOPE-BORDER).

A real implementation may legitimately implement part of the spec: ExecuTorch's first sequence
cache (PR #21412) has only the flat policy and a CacheConfig without `max_write`. A scope is a set
of **features**:

- `flat`, `ring`: the layer kinds the target implements;
- `max_write`: the config field of that name (a target without it serves only `max_write: null`);
- `max_seqs=N` (the cell layout): the one `max_seqs` the target serves. Upstream's cell cache (PR #21902)
  fixes it at 64 (`kMaxSeqs`) and its constructor takes no such argument, so it declares
  `max_seqs=64`: cell configurations with another `max_seqs` lie outside its scope (absent: 64);
- `keep=N` (the contiguous op layout, with `sinks` when N > 0): the one `keep` of every ring layer the target
  serves. mlx-lm's `make_prompt_cache` builds every ring with keep 4, so it declares `keep=4`: the suite adds
  a twin of each ring configuration with keep N (its window part past the sinks unchanged), and the
  configurations with another keep lie outside the scope (refused at creation).

The suite drives only configurations inside the scope, lists what it left unexercised (the
configuration families and the rules only they exercise), and checks the border: a valid
configuration outside the scope must be refused at creation. A target that accepts it and serves
it another way (a sliding-window layer served as full history: silently wrong attention) is a
`wrong` SCOPE-BORDER finding; one that accepts it and happens to answer as the spec is `lenient`
(declare the feature, or refuse the configuration); one that dies on it is a `crash`.

A feature above is *additive*: declaring it says the target implements that part, and a scope without it
owes less. A **relaxation** has the other polarity: declaring it says the target owes less than the spec,
and the whole spec (no declaration) declares none. The op face's relaxations (SPEC.md section 6.1):

- `trusted-args`: the cache's caller is model code: the suite sends no malformed call (a clause of the
  argument contract broken, spec/arguments.py) and OP-ARGS is not owed; nor any invalid configuration
  (OP-CONFIG's refusals are not owed; a valid one outside the scope is still refused, SCOPE-BORDER);
- `unbounded` (op-contiguous only; declared on another layout it is a ScopeError, SCOPE-DECLARE): no capacity:
  steps past the config's capacity are served, OP-CAP is not owed;
- `lazy-shapes`: sizes (n_kv_heads, head_dim, v_head_dim, batch_size) are learnt from the first update:
  the config the target gets has none, each layer's first update is well-formed, OP-CONFIG for sizes is
  not owed;
- `lossy=<tol>`: stored K and V may differ from what was written by up to `tol` (a float in (0, 0.5)) in
  every element: the suite writes row codes of small integers (1 and 2 but a row's last element) and reads a
  row as the one code within `tol` of it;
- `min_head_dim=<N>`: the target serves only head_dim and v_head_dim >= N: the suite drives a twin of
  each narrower configuration with its widths raised to N (the originals lie outside the scope);
- `window-steps`: a step longer than a ring layer's window may be refused on that layer, while flat layers serve
  any length (a library whose sliding-window layers take at most a window per call): such a refusal is not
  over-strict, and the program is not judged past it (the step stands served on some layers, refused on one);
- `no-length` (contiguous): the cache keeps no length of its own - the caller passes positions, and nothing in
  the cache counts them - so `used(layer)` is not called (a C++ op cache without `used` announces it itself); the
  cache is judged by its answers, which name every token each query attends (OP-ATTEND);
- `user-config=<key>[+<key>]` (with `trusted-args`): these configuration keys come from the library's user
  (a command-line flag: mlx-lm's `--max-kv-size` is the ring's window), not from its model code: an invalid
  configuration that a change of these keys alone makes valid is still sent, and its refusal is owed.
- `requires=<precondition>[+<precondition>]` (every face with the cell verbs: op-cell, cell-recompute): the
  library documents these preconditions on its caller (PRECONDITIONS: an id in range, an empty destination
  for a copy, ...): the suite never sends a call breaking one (preconditions.py), and the report says so.

**Spec versions** (SPEC_VERSIONS): each release of the spec that added features names them, and a target is
judged on the features of the version it declares, `spec=<N>` in any declaration. A declaration that names a
feature declares at least the version that added it (`trim` is spec 2); one that names none, and a target that
declares nothing, is judged as spec 1, the first release: a target that says nothing was written before
versions existed, so judging it on what came later would fail a cache that did not change. A feature added
after the declared version is opt-in: no configuration needing it, and no configuration carrying a key added
with it (a ring's `keep`), is ever sent - neither driven nor checked at the border. `all`, and a declaration
of relaxations or a version alone, stand for every feature of the declared version.

Where a scope comes from (the first that applies):
- the CLI: `kvcache conformance --scope flat` (or `flat,max_write`, `all`);
- a `cmd:` target's `hello` answer: `"scope": ["flat"]` (spec/PROTOCOL.md, "Scope");
- a `python:` target's factory attribute `kvcache_scope` (a list or tuple of feature names);
- otherwise the whole spec of spec 1 (targets written before scopes and versions existed).
Unknown feature names are an error on the CLI and in `kvcache_scope` (a typo must not silently widen
what is owed); in a `cmd:` target's hello they are ignored and reported (a newer target talking to an
older harness).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from .configs import JsonConfig, describe

FEATURES: dict[str, str] = {
    "flat": "flat (full-history) layers",
    "ring": "ring (sliding-window) layers",
    "max_write": "the max_write config field (configs with max_write set)",
}
BORDER_RULE = "SCOPE-BORDER"
PAGED_GROUP_KINDS = {"full": "flat", "window": "ring"}   # a paged group's kind -> the feature it needs
# The cell layout's fixed-max_seqs feature: "max_seqs=64" in a declaration. Not a member of FEATURES:
# it carries a value, and no declaration (the whole spec) means every max_seqs.
MAX_SEQS = "max_seqs"
DEFAULT_MAX_SEQS = 64   # a cell config without the field (spec/PROTOCOL.md, "Cell methods")
# The contiguous op layout's fixed keep: "keep=4" in a declaration (mlx-lm's make_prompt_cache builds every
# ring with keep 4). Like max_seqs it carries a value: every ring layer of a config in the scope has keep N.
KEEP = "keep"
# The op face's parts a target may leave out (op/engine.py; SPEC.md section 6.1, SCOPE-BORDER): a config needing `mla`
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
    "chunk": "chunk layers: a query attends its own chunk of `chunk` positions (OP-CHUNK)",
    "recording": "configs with record_past: ring layers keep their past until a trim (OP-RECORD)",
    "state": "state() and load_state(data): the cache's state as bytes, saved and loaded (OP-STATE)",
    "pad": "pad(left_padding): rows of a batch that differ, answered with a mask per row (OP-PAD)",
    "batch-verbs": "the batch verbs select, reorder and repeat: rows moved with their history and pads (OP-ROWS)",
    # select alone: mlx-lm's BatchGenerator drops finished rows (filter) and never reorders nor repeats them
    "select": "the batch verb select alone (mlx-lm's filter): rows kept with their history and pads (OP-ROWS); "
              "`batch-verbs` includes it",
    "quantize": "quantize(bits): the cache quantized mid-generation, every row read within its bound (OP-QUANTIZE)",
    # spec 5: a second cache, the side cache, held by the harness (PROTOCOL.md: aside, swap, extend, extract);
    # not in `batch-verbs`: a library with select, reorder and repeat but no extend is judged as before
    "merge": "extend and extract: another cache's rows appended, one row out as a cache of its own (mlx-lm's "
             "BatchKVCache extend / merge / extract) (OP-ROWS)",
}
# A feature that includes others: declaring it declares them (`batch-verbs` is select, reorder and repeat).
INCLUDES: dict[str, frozenset[str]] = {"batch-verbs": frozenset({"select"})}
# The recompute face's part a target may leave out (SPEC.md 5.3): llama.cpp keeps each sequence's positions
# consecutive, so a decode past next_pos ends its program unjudged.
RECOMPUTE_FEATURES: dict[str, str] = {
    "position-gaps": "a decode at a position past the sequence's next one (llama.cpp's positions are consecutive)",
    # additive (spec 5): without it no seq_save / seq_load is sent, and the target is judged as before
    "seq-state": "seq_save(seq) and seq_load(seq, data): one sequence's state saved and restored (CELL-STATE)",
}
# The paged layout's additive part (SPEC.md part 7, PAGED-CONFIG): a target without it is sent no config with "pools".
PAGED_FEATURES: dict[str, str] = {
    "pools": 'the "pools" config key: "per-group" gives each KV group a pool of its own (SGLang\'s SWA pool)',
}
EVERY_FEATURE: dict[str, str] = {**FEATURES, **OP_FEATURES, **RECOMPUTE_FEATURES, **PAGED_FEATURES}
# The spec's versions: each the features it added (SPEC.md section 6.1, "Spec versions"), and the configuration keys that
# came with them (of a layer entry: `keep` with sinks). Every feature is added by exactly one version; a later
# version only adds (a relaxation owes less, so it needs no version: a target that never declares one owes all).
SPEC = "spec"   # "spec=2" in a declaration: the version the target was written against
SPEC_VERSIONS: dict[int, tuple[str, frozenset[str]]] = {
    1: ("the first release: the sequence, cell, op and recompute faces, before trim and sinks",
        frozenset(EVERY_FEATURE) - {"trim", "sinks", "chunk", "recording", "state", "pad", "batch-verbs", "select",
                                    "pools", "quantize", "seq-state", "merge"}),
    2: ("the op face's trim(n) verb (OP-TRIM) and ring layers with attention sinks (OP-SINKS)",
        frozenset({"trim", "sinks"})),
    3: ("chunk layers (OP-CHUNK), rings recording their past for a trim (OP-RECORD), a state saved and loaded "
        "(OP-STATE)", frozenset({"chunk", "recording", "state"})),
    4: ("left-padded batch rows (OP-PAD), the batch verbs (OP-ROWS; `select` alone too), the paged layout's "
        "per-group pools (PAGED-CONFIG) and a quantize mid-generation (OP-QUANTIZE)",
        frozenset({"pad", "batch-verbs", "select", "pools", "quantize"})),
    5: ("one sequence's state saved and restored on the cell-recompute face (CELL-STATE), and the op face's extend "
        "and extract (OP-ROWS)", frozenset({"seq-state", "merge"})),
}
CHUNK, RECORD_PAST = "chunk", "record_past"   # a layer entry's chunk size; the config's recording flag
VERSION_LAYER_KEYS: dict[int, frozenset[str]] = {2: frozenset({KEEP}), 3: frozenset({CHUNK})}   # config keys a version added
FIRST_VERSION, CURRENT_VERSION = min(SPEC_VERSIONS), max(SPEC_VERSIONS)
UNDECLARED_VERSION = FIRST_VERSION   # a target that names no version nor any later feature (see the docstring)


def features_of(version: int) -> frozenset[str]:
    """Every feature of spec `version`: those its version and the earlier ones added."""
    return frozenset().union(*(added for number, (_, added) in SPEC_VERSIONS.items() if number <= version))


def version_of(feature: str) -> int:
    """The spec version that added `feature` (an EVERY_FEATURE name)."""
    return min(number for number, (_, added) in SPEC_VERSIONS.items() if feature in added)


def later_keys(version: int) -> frozenset[str]:
    """The layer-entry config keys added after spec `version`: a target of that version is never sent one."""
    return frozenset().union(*(keys for number, keys in VERSION_LAYER_KEYS.items() if number > version))
# Relaxations (SPEC.md section 6.1): the target owes LESS when it declares one; absent means owed. Not
# members of EVERY_FEATURE: `all` (the whole spec) declares none of them.
TRUSTED_ARGS, UNBOUNDED, LAZY_SHAPES, LOSSY, MIN_HEAD_DIM, USER_CONFIG, WINDOW_STEPS, NO_LENGTH = \
    "trusted-args", "unbounded", "lazy-shapes", "lossy", "min_head_dim", "user-config", "window-steps", "no-length"
RELAXATIONS: dict[str, str] = {
    TRUSTED_ARGS: "the caller is model code or a scheduler: no malformed call or invalid config is sent, OP-ARGS "
                  "(PAGED-ARGS) is not owed",
    UNBOUNDED: "no capacity (contiguous): steps past the config's capacity are served, OP-CAP is not owed",
    LAZY_SHAPES: "sizes are learnt from the first update: the config carries none, OP-CONFIG for sizes is not owed",
    LOSSY: "lossy=<tol>: stored K/V may differ from what was written by up to tol in each element (0 < tol < 0.5)",
    MIN_HEAD_DIM: "min_head_dim=<N>: only head_dim and v_head_dim >= N are served (configs are drawn that wide)",
    USER_CONFIG: "user-config=<key>[+<key>] (with trusted-args): the user sets these config keys, so an invalid "
                 "config a change of them alone makes valid is still sent and its refusal owed",
    WINDOW_STEPS: "a step longer than a ring layer's window may be refused on that layer (flat layers serve any "
                  "length): the program is not judged past such a refusal",
    NO_LENGTH: "no length of its own (contiguous: the caller passes positions, the cache keeps no count): "
               "used(layer) is not called, the cache is judged by its answers",
}
# The configuration keys a user may set (USER_CONFIG): each a key of the op config, `window` and `keep` those
# of every ring layer. Brute force over small values decides "a change of these keys alone makes it valid".
USER_CONFIG_KEYS: dict[str, tuple[Any, ...]] = {
    "capacity": tuple(range(1, 17)),
    "max_write": (None, *range(1, 9)),
    "window": tuple(range(1, 17)),
    "keep": tuple(range(0, 5)),
}
REQUIRES = "requires"
RELAXATIONS[REQUIRES] = ("requires=<precondition>[+<precondition>]: the library documents these preconditions on "
                         "its caller: no call breaking one is sent")
# The preconditions on caller errors a library may document (REQUIRES; SPEC.md 6.1, SCOPE-REQUIRES): each
# keeps back the calls of the cell verbs that break it (preconditions.broken says which call breaks which).
PRECONDITIONS: dict[str, str] = {
    "ids-in-range": "every sequence id a call names is an int in [0, 63)",
    "empty-destination": "seq_cp copies onto a sequence that holds nothing and is not its source",
    "whole-copies": "seq_cp copies the whole source sequence (upto None)",
    "ordered-ranges": "a range starts at an int p0 >= 0 and ends at None or an int >= p0 (seq_rm, seq_add; "
                      "seq_cp's upto None or >= 0)",
}
FLAG_RELAXATIONS = (TRUSTED_ARGS, UNBOUNDED, LAZY_SHAPES, WINDOW_STEPS, NO_LENGTH)   # the relaxations without a value
# The configuration keys a lazy-shapes target is not given (the sizes it learns from the first update),
# and the scope features a config needs by those sizes alone (it cannot refuse them at creation).
SIZE_KEYS = ("n_kv_heads", "head_dim", "v_head_dim", "batch_size")
SIZE_FEATURES = frozenset({"mla", "batch", MIN_HEAD_DIM})
# The features that make up the whole of each layout's face: a scope holding them all is the whole spec
# for that layout (an op target without `positions` is partial, a sequence target needs no `mla`).
LAYOUT_FEATURES: dict[str, frozenset[str]] = {
    "sequence": frozenset(FEATURES),
    "cell": frozenset(FEATURES),
    "op-contiguous": frozenset({"flat", "ring", "max_write", "batch", "mla", "positions", "steps", "trim", "sinks",
                                "chunk", "recording", "state", "pad", "batch-verbs", "select", "quantize", "merge"}),
    "op-cell": frozenset({"flat", "ring", "mla", "positions", "steps", "declarations"}),
    "cell-recompute": frozenset({"flat", "ring", "position-gaps", "seq-state"}),
    "paged": frozenset({"flat", "ring", "pools"}),   # full groups need `flat`, window ones `ring`; "pools" `pools`
}



def features_per_layout() -> str:
    """Each layout's features, as `--scope` accepts them: 'sequence: flat, ring, max_write; cell: ...'."""
    return "; ".join(f"{layout}: " + ", ".join([name for name in EVERY_FEATURE if name in features]
                                               + ([f"{MAX_SEQS}=N"] if layout == "cell" else [])
                                               + ([f"{KEEP}=N"] if layout == "op-contiguous" else []))
                     for layout, features in LAYOUT_FEATURES.items()) + \
        "; relaxations (declaring one owes less; op faces, trusted-args paged too, requires= the faces with the cell verbs): " + ", ".join(relaxation_names()) + \
        f"; {SPEC}=<N>, the spec version written against (" + \
        "; ".join(f"{number}: {text}" for number, (text, _) in SPEC_VERSIONS.items()) + \
        f"; none declared: {UNDECLARED_VERSION})"


def relaxation_names() -> list[str]:
    """The relaxations as a declaration spells them ('lossy=<tol>')."""
    return [*FLAG_RELAXATIONS, f"{LOSSY}=<tol>", f"{MIN_HEAD_DIM}=<N>", f"{USER_CONFIG}=<key>[+<key>]",
            f"{REQUIRES}=<precondition>[+<precondition>]"]


def user_variants(cfg: JsonConfig, keys: frozenset[str]) -> Iterator[JsonConfig]:
    """Every configuration a user reaches from `cfg` by setting the keys `keys` (USER_CONFIG_KEYS) alone:
    `window` sets every ring layer's window to one value (and a flat layer's to 0, as a window flag leaves
    full-attention layers alone), `keep` every ring layer's keep. Nothing else of `cfg` changes."""
    names = sorted(keys)
    for values in itertools.product(*(USER_CONFIG_KEYS[name] for name in names)):
        chosen: dict[str, Any] = dict(zip(names, values))
        out: JsonConfig = {**cfg, **{key: chosen[key] for key in ("capacity", "max_write") if key in chosen}}
        layers = cfg.get("layers")
        if isinstance(layers, list) and ("window" in chosen or "keep" in chosen):
            out["layers"] = [_user_layer(entry, chosen) for entry in layers]
        yield out


def _user_layer(entry: Any, chosen: dict[str, Any]) -> Any:
    if not isinstance(entry, dict):
        return entry
    ring = entry.get("kind") == "ring"
    out = dict(entry)
    if "window" in chosen:
        out["window"] = chosen["window"] if ring else 0
    if "keep" in chosen and ring:
        out["keep"] = chosen["keep"]
    return out

def needs(cfg: JsonConfig) -> frozenset[str]:
    """The features a (valid) configuration needs: its layer kinds, and max_write when it is set."""
    kinds = {entry.get("kind") for entry in cfg.get("layers", []) if isinstance(entry, dict)}
    # a paged config's groups (paged/programs.py): a full group is a flat layer's kind, a window group a ring's
    groups = cfg.get("groups")
    kinds |= {PAGED_GROUP_KINDS.get(str(entry.get("kind"))) for entry in (groups if isinstance(groups, list) else [])
              if isinstance(entry, dict)}
    wanted = {kind for kind in kinds if kind in FEATURES}
    if isinstance(groups, list) and "pools" in cfg:   # a paged config naming its pools, valid or not (PAGED-CONFIG)
        wanted.add("pools")
    if cfg.get("max_write") is not None:
        wanted.add("max_write")
    if "v_head_dim" in cfg and cfg["v_head_dim"] != cfg.get("head_dim"):
        wanted.add("mla")
    if cfg.get("batch_size", 1) != 1:   # an op config's batch rows (absent from the other layouts' configs)
        wanted.add("batch")
    if any(isinstance(entry, dict) and entry.get("keep", 0) != 0 for entry in cfg.get("layers", [])):
        wanted.add("sinks")   # a ring with attention sinks (OP-SINKS)
    if any(isinstance(entry, dict) and (entry.get("kind") == CHUNK or CHUNK in entry) for entry in cfg.get("layers", [])):
        wanted.add("chunk")   # a chunk layer, or a chunk size on another (OP-CHUNK)
    if RECORD_PAST in cfg:
        wanted.add("recording")   # the config's record_past, whatever its value (OP-RECORD)
    return frozenset(wanted)


def without_sizes(cfg: JsonConfig) -> JsonConfig:
    """The configuration a lazy-shapes target is given: without the sizes it learns from its first update
    (SIZE_KEYS), nor the copies of them its layer entries carry."""
    out = {key: value for key, value in cfg.items() if key not in SIZE_KEYS}
    if isinstance(out.get("layers"), list):
        out["layers"] = [{key: value for key, value in entry.items() if key not in ("n_kv_heads", "head_dim")}
                         if isinstance(entry, dict) else entry for entry in out["layers"]]
    return out


def _listed_layers(cfg: JsonConfig) -> list[Any]:
    """A configuration's layer entries, none when `layers` is not a list (an invalid configuration's)."""
    layers = cfg.get("layers")
    return layers if isinstance(layers, list) else []


def _needs_any(cfg: JsonConfig) -> frozenset[str]:
    """needs() of any configuration, an invalid one included (its layer entries read only when a list)."""
    return needs({**cfg, "layers": _listed_layers(cfg)})


def family(cfg: JsonConfig) -> str:
    """A configuration family: the features it needs, in a stable order ('flat+ring+max_write')."""
    return "+".join(name for name in EVERY_FEATURE if name in needs(cfg)) or "none"


def max_seqs_of(cfg: JsonConfig) -> Any:
    """A cell configuration's max_seqs as it is (absent: 64)."""
    return cfg.get(MAX_SEQS, DEFAULT_MAX_SEQS)


@dataclass(frozen=True)
class Scope:
    features: frozenset[str]
    source: str = "not declared: the whole of spec 1"
    ignored: tuple[str, ...] = ()   # unknown names in the declaration
    max_seqs: Optional[int] = None   # the one max_seqs served ("max_seqs=64"); None: every max_seqs
    relaxed: frozenset[str] = frozenset()   # the FLAG_RELAXATIONS declared
    lossy: Optional[float] = None            # lossy=<tol>: the tolerance on stored K/V; None: exact
    min_head_dim: Optional[int] = None       # min_head_dim=<N>: the narrowest width served; None: every width
    keep: Optional[int] = None               # keep=<N>: the one keep of every ring layer served; None: every keep
    user_config: frozenset[str] = frozenset()   # user-config=<keys>: config keys the user sets (USER_CONFIG_KEYS)
    version: int = UNDECLARED_VERSION           # spec=<N>: the spec version the target was written against
    requires: frozenset[str] = frozenset()      # requires=<names>: the caller's documented preconditions (PRECONDITIONS)

    def full_for(self, layout: str) -> bool:
        """Whether the scope is the whole spec for `layout` (targets.LAYOUTS): every feature of its face,
        and no relaxation."""
        return self.features >= LAYOUT_FEATURES[layout] & features_of(self.version) and self.max_seqs is None and \
            self.keep is None and not self.relaxations()

    def relaxes(self, name: str) -> bool:
        """Whether the scope declares the relaxation `name` (a FLAG_RELAXATIONS member, LOSSY or MIN_HEAD_DIM)."""
        return name in self.relaxations()

    def relaxations(self) -> frozenset[str]:
        return self.relaxed | frozenset(name for name, value in ((LOSSY, self.lossy), (MIN_HEAD_DIM, self.min_head_dim),
                                                                 (REQUIRES, self.requires or None))
                                        if value is not None)

    def narrow(self, cfg: JsonConfig) -> bool:
        """A configuration narrower than the scope's min_head_dim (a width below N)."""
        return self.min_head_dim is not None and any(
            type(cfg.get(key)) is int and cfg[key] < self.min_head_dim for key in ("head_dim", "v_head_dim"))

    def other_keep(self, cfg: JsonConfig) -> bool:
        """A configuration with a ring layer whose keep is not the scope's fixed keep=N (absent: 0)."""
        return self.keep is not None and any(
            isinstance(entry, dict) and entry.get("kind") == "ring" and not _same_int(entry.get(KEEP, 0), self.keep)
            for entry in cfg.get("layers", []))

    def without(self, feature: str, why: str) -> Scope:
        """The scope less `feature`, its source saying why (a python: cache without a trim method)."""
        return replace(self, features=self.features - {feature}, source=f"{self.source}; {why}")

    def speaks(self, cfg: JsonConfig) -> bool:
        """Whether `cfg` is in the target's spec version: it needs no feature added later and carries no
        layer key added later (a spec-1 cache never sees a `keep`, not even keep 0). A configuration that is
        not is never sent: neither driven nor checked at the border (SCOPE-BORDER owes only what the version
        could say)."""
        keys = later_keys(self.version)
        return _needs_any(cfg) <= features_of(self.version) and not any(
            isinstance(entry, dict) and keys & entry.keys() for entry in _listed_layers(cfg))

    def missing(self, cfg: JsonConfig) -> frozenset[str]:
        """The features `cfg` needs that the scope leaves out (empty: the config is inside). A cell
        config whose max_seqs is not the scope's fixed one misses "max_seqs"; one narrower than the
        scope's min_head_dim misses "min_head_dim"; one with a ring layer of another keep than the scope's
        keep=N misses "keep"."""
        other = self.max_seqs is not None and MAX_SEQS in cfg and not _same_int(cfg[MAX_SEQS], self.max_seqs)
        return (needs(cfg) - self.features) | (frozenset({MAX_SEQS}) if other else frozenset()) | \
            (frozenset({MIN_HEAD_DIM}) if self.narrow(cfg) else frozenset()) | \
            (frozenset({KEEP}) if self.other_keep(cfg) else frozenset())

    def covers(self, cfg: JsonConfig) -> bool:
        return not self.missing(cfg)

    def names(self) -> list[str]:
        fixed = ([] if self.max_seqs is None else [f"{MAX_SEQS}={self.max_seqs}"]) + \
            ([] if self.keep is None else [f"{KEEP}={self.keep}"])
        relaxed = [name for name in FLAG_RELAXATIONS if name in self.relaxed] + \
            ([] if self.lossy is None else [f"{LOSSY}={self.lossy:g}"]) + \
            ([] if self.min_head_dim is None else [f"{MIN_HEAD_DIM}={self.min_head_dim}"]) + \
            ([f"{USER_CONFIG}={'+'.join(sorted(self.user_config))}"] if self.user_config else []) + \
            ([f"{REQUIRES}={'+'.join(sorted(self.requires))}"] if self.requires else [])
        # a feature another declared one includes is not named again (`batch-verbs` says `select`)
        included = frozenset().union(*(INCLUDES.get(name, frozenset()) for name in self.features))
        return [name for name in EVERY_FEATURE if name in self.features - included] + fixed + relaxed

    def announced(self) -> list[str]:
        """The declaration that reads back as this scope (a served hello): its names, and `spec=N` when its
        features do not imply the version (spec 2 less trim and sinks is not spec 1)."""
        implied = max([UNDECLARED_VERSION, *map(version_of, self.features)])
        return self.names() + ([f"{SPEC}={self.version}"] if self.version > implied else [])

    def family(self, cfg: JsonConfig) -> str:
        """The family a configuration outside the scope is listed under: its features, and its max_seqs
        when that is what puts it outside ('flat, max_seqs 3')."""
        name = family(cfg)
        missing = self.missing(cfg)
        return name + (f", max_seqs {cfg[MAX_SEQS]!r}" if MAX_SEQS in missing else "") + \
            (f", head_dim {cfg.get('head_dim')!r} below {MIN_HEAD_DIM} {self.min_head_dim}"
             if MIN_HEAD_DIM in missing else "") + (f", a ring's keep other than {self.keep}" if KEEP in missing else "")

    def __str__(self) -> str:
        return ",".join(self.names()) or "nothing"


FULL = Scope(features_of(UNDECLARED_VERSION))   # nothing declared: the whole of spec 1


def _same_int(value: Any, fixed: int) -> bool:
    return type(value) is int and value == fixed   # bool is not an int (True is not max_seqs 1)


class ScopeError(ValueError):
    """A scope declaration that is not a list of feature names."""


def parse_text(text: str, source: str) -> Scope:
    """A scope written on a command line: comma-separated feature names ('flat,max_write', 'all')."""
    return parse([part.strip() for part in text.split(",") if part.strip()], source)


def _value_items(items: list[str], name: str) -> tuple[list[str], Optional[str]]:
    """The items without `name=value` ones, and that value (one value only; a bare `name` is no value)."""
    given = {item for item in items if item == name or item.startswith(name + "=")}
    if not given:
        return items, None
    values = {item.split("=", 1)[1].strip() if "=" in item else "" for item in given}
    if len(values) != 1 or "" in values:
        raise ScopeError(f"{name} takes one value: {name}=<{'tol' if name == LOSSY else 'key' if name == USER_CONFIG else 'N'}>, got {sorted(given)}"[:200])
    return [item for item in items if item not in given], values.pop()


def _tolerance(text: str) -> float:
    """lossy=<tol>: a float in (0, 0.5): the row codes' elements are integers, so a tolerance below half of
    1 reads every row as at most one code."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value < 0.5):
        raise ScopeError(f"{LOSSY}={text}: the tolerance is a number above 0 and below 0.5 (lossy=0.25)"[:200])
    return value


def _min_head_dim(text: str) -> int:
    """min_head_dim=<N>: an int >= 1."""
    if not (text.isdigit() and text.isascii() and int(text) >= 1):
        raise ScopeError(f"{MIN_HEAD_DIM}={text}: the narrowest width is an int >= 1 (min_head_dim=32)"[:200])
    return int(text)


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
    items, tolerance = _value_items(items, LOSSY)
    items, narrowest = _value_items(items, MIN_HEAD_DIM)
    items, keep = _value_items(items, KEEP)
    items, user_keys = _value_items(items, USER_CONFIG)
    items, declared_version = _value_items(items, SPEC)
    items, required = _value_items(items, REQUIRES)
    relaxed = frozenset(item for item in items if item in FLAG_RELAXATIONS)
    user_config = frozenset() if user_keys is None else _user_config(user_keys, relaxed)
    items = [item for item in items if item not in relaxed]
    named = frozenset(item for item in items if item in EVERY_FEATURE) | \
        ({"sinks"} if keep not in (None, "0") else set())   # keep=N (N > 0) is a ring's sinks
    newer = declared_version is not None and declared_version.isascii() and declared_version.isdigit() and \
        int(declared_version) > CURRENT_VERSION   # a newer target talking to an older harness: reported
    version = max([UNDECLARED_VERSION if declared_version is None else CURRENT_VERSION if newer else
                   _version(declared_version), *map(version_of, named)])   # naming a feature opts into its version
    if newer:
        items.append(f"{SPEC}={declared_version}")   # among the ignored names: an error but in a hello
    if "all" in items or (not items and (relaxed or tolerance is not None or narrowest is not None
                                         or declared_version is not None or required is not None)):
        # relaxations (or a version) alone relax the whole spec of that version: `--scope trusted-args` leaves
        # out no feature of spec 1, `spec=2` is every feature of spec 2
        items = [name for name in items if name != "all"] + sorted(features_of(version))
    known = frozenset(item for item in items if item in EVERY_FEATURE)
    known = known.union(*(INCLUDES.get(name, frozenset()) for name in known))   # batch-verbs declares select
    fixed_keep = None if keep is None else _fixed_keep(keep)
    if fixed_keep and "sinks" not in known:
        raise ScopeError(f"{KEEP}={keep}: a keep above 0 is a ring's sinks; the scope must have 'sinks'"[:200])
    return Scope(known, source, tuple(sorted({item for item in items if item not in EVERY_FEATURE})), max_seqs,
                 relaxed, None if tolerance is None else _tolerance(tolerance),
                 None if narrowest is None else _min_head_dim(narrowest), fixed_keep, user_config, version,
                 frozenset() if required is None else _preconditions(required))


def _version(text: str) -> int:
    """spec=<N>: one of SPEC_VERSIONS (a number above them all is a newer target's: parse reports it)."""
    if not (text.isdigit() and text.isascii() and int(text) in SPEC_VERSIONS):
        raise ScopeError(f"{SPEC}={text}: the spec versions are {', '.join(map(str, SPEC_VERSIONS))} (spec=2: "
                         f"{SPEC_VERSIONS[CURRENT_VERSION][0]})"[:200])
    return int(text)


def _user_config(text: str, relaxed: frozenset[str]) -> frozenset[str]:
    """user-config=<key>[+<key>]: keys of USER_CONFIG_KEYS, and only with trusted-args (without it every invalid
    configuration is sent already: the declaration would say nothing)."""
    keys = frozenset(part.strip() for part in text.split("+"))
    if not keys <= USER_CONFIG_KEYS.keys() or "" in keys:
        raise ScopeError(f"{USER_CONFIG}={text}: the keys are {'+'.join(USER_CONFIG_KEYS)} joined by '+' "
                         f"(user-config=window)"[:200])
    if TRUSTED_ARGS not in relaxed:
        raise ScopeError(f"{USER_CONFIG}={text} qualifies '{TRUSTED_ARGS}': without it every invalid configuration "
                         "is sent already"[:200])
    return keys


def _preconditions(text: str) -> frozenset[str]:
    """requires=<name>[+<name>]: names of PRECONDITIONS (an unknown one is an error: a typo must not send a
    call the target was promised it would not get, nor keep back one it owes)."""
    names = frozenset(part.strip() for part in text.split("+"))
    if not names <= PRECONDITIONS.keys():
        raise ScopeError(f"{REQUIRES}={text}: the preconditions are {', '.join(PRECONDITIONS)}, joined by '+' "
                         f"(requires=ids-in-range+whole-copies)"[:300])
    return names


def _fixed_keep(text: str) -> int:
    """keep=<N>: an int >= 0, the keep of every ring layer served (OP-SINKS)."""
    if not (text.isdigit() and text.isascii()):
        raise ScopeError(f"{KEEP}={text}: a fixed keep is an int >= 0 (keep=4)"[:200])
    return int(text)


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
    if declared is None:
        return FULL
    scope = parse(declared, "the factory's kvcache_scope")
    if scope.ignored:   # a typo must not silently widen what the target owes (as on --scope)
        raise ScopeError(f"unknown feature(s) {', '.join(scope.ignored)}; choose from all or, per layout, "
                         f"{features_per_layout()}"[:400])
    return scope


def with_twins(configs: Iterable[JsonConfig], scope: Scope) -> tuple[JsonConfig, ...]:
    """The configurations, plus - for a scope that fixes max_seqs - the twin inside the scope of each one
    outside it by its max_seqs alone (the same config with the scope's max_seqs), unless that one is
    already there. A cache with upstream's fixed 64 ids is then driven over every layer family and edge
    the suite has (capacity 1, window 1, broadcast, ...), not only over the configurations that happen
    to have 64 ids; the originals stay outside the scope, checked refused at creation."""
    configs = list(configs)
    if scope.max_seqs is None and scope.min_head_dim is None and scope.keep is None:
        return tuple(configs)
    out = list(configs)
    for cfg in configs:
        missing = scope.missing(cfg)
        if not missing or not missing <= {MAX_SEQS, MIN_HEAD_DIM, KEEP}:
            continue
        twin = dict(cfg)
        if MAX_SEQS in missing:
            twin[MAX_SEQS] = scope.max_seqs
        if MIN_HEAD_DIM in missing:
            twin = widened(twin, scope.min_head_dim or 1)
        if KEEP in missing:
            twin = kept(twin, scope.keep or 0)
        if twin not in out:
            out.append(twin)
    return tuple(out)


def kept(cfg: JsonConfig, keep: int) -> JsonConfig:
    """The twin of an op configuration whose every ring layer has keep N (keep=N): the part of its window
    past the sinks, w - k, stays what it was (ring(w, keep k) becomes ring(w - k + N, keep N)), so the
    twin keeps the original's edges (a window part of 1, the ring wrapping at the same step)."""
    layers = [{**entry, "window": entry["window"] - entry.get(KEEP, 0) + keep, KEEP: keep}
              if isinstance(entry, dict) and entry.get("kind") == "ring" else entry for entry in cfg.get("layers", [])]
    if keep == 0:
        layers = [{name: value for name, value in entry.items() if name != KEEP} if isinstance(entry, dict) else entry
                  for entry in layers]
    return {**cfg, "layers": layers}


def widened(cfg: JsonConfig, narrowest: int) -> JsonConfig:
    """The twin of an op configuration with its widths raised to `narrowest` (min_head_dim=N): head_dim
    N at least, and a value width of its own kept apart (MLA: v_head_dim N + 1 where it was wider)."""
    head: int = cfg["head_dim"]
    value: int = cfg.get("v_head_dim", head)
    new_head = max(head, narrowest)
    new_value = new_head if value == head else max(value, narrowest)
    if value != head and new_value == new_head:
        new_value += 1
    layers = [{**entry, "head_dim": new_head} if isinstance(entry, dict) and "head_dim" in entry else entry
              for entry in cfg.get("layers", [])]
    return {**cfg, "head_dim": new_head, "v_head_dim": new_value, "layers": layers}


# The layouts a relaxation may be declared for (SCOPE-DECLARE): the op faces; `unbounded` the contiguous one only
# (a cell cache's capacity is its free cells, which admission needs: declaring it away would only silence the
# refusal of a zero capacity).
OP_LAYOUTS = ("op-contiguous", "op-cell")
RELAXATION_LAYOUTS: dict[str, tuple[str, ...]] = {name: OP_LAYOUTS for name in RELAXATIONS}
RELAXATION_LAYOUTS[UNBOUNDED] = RELAXATION_LAYOUTS[NO_LENGTH] = ("op-contiguous",)   # no-length: used() is contiguous
RELAXATION_LAYOUTS[REQUIRES] = ("op-cell", "cell-recompute")   # the faces with the cell verbs (SCOPE-REQUIRES)
# a serving engine's KV manager trusts its scheduler as model code trusts itself (SCOPE-TRUSTED-ARGS)
RELAXATION_LAYOUTS[TRUSTED_ARGS] = (*OP_LAYOUTS, "paged")


def check_layout(scope: Scope, layout: str) -> None:
    """SCOPE-DECLARE: raise ScopeError when the scope declares a relaxation its layout cannot declare."""
    declared = scope.relaxations() | (frozenset({USER_CONFIG}) if scope.user_config else frozenset())
    wrong = sorted(name for name in declared if layout not in RELAXATION_LAYOUTS[name])
    if wrong:
        allowed = "; ".join(f"{name}: {', '.join(RELAXATION_LAYOUTS[name])}" for name in wrong)
        raise ScopeError(f"SCOPE-DECLARE: the {layout} layout cannot declare {', '.join(wrong)} (declared for: "
                         f"{allowed})"[:300])


def in_version(configs: Iterable[JsonConfig], scope: Scope) -> tuple[list[JsonConfig], list[str]]:
    """The configurations of the scope's spec version (Scope.speaks), in order, and a note for those left out
    (empty when none is): they are never sent, so a cache written before a feature existed is not judged on it."""
    configs = list(configs)
    kept = [cfg for cfg in configs if scope.speaks(cfg)]
    if len(kept) == len(configs):
        return kept, []
    later = sorted(frozenset().union(*map(_needs_any, configs)) - features_of(scope.version))
    return kept, [f"scope: {len(configs) - len(kept)} configurations of a later spec version than the target's "
                  f"(spec={scope.version}{': ' + ', '.join(later) if later else ''}) not sent: a feature added "
                  f"later is opt-in ({SPEC}=<N>, or name it)"]


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
                              "configs_driven": len(inside), "configs_outside": len(outside),
                              "spec_version": scope.version}
    if scope.max_seqs is not None:
        report["max_seqs"] = scope.max_seqs
    if scope.relaxations():
        report["relaxations"] = [name for name in scope.names() if name.split("=")[0] in RELAXATIONS]
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
    if report.get("relaxations"):
        lines.append(f"scope: relaxations declared ({', '.join(report['relaxations'])}): what they relax is not "
                     "owed (SPEC.md section 6.1)")
    for name, described in left["families"].items():
        lines.append(f"scope: configuration family {name} not exercised: {'; '.join(described)}")
    if left["rules"]:
        lines.append(f"scope: rules exercised only outside the scope: {', '.join(left['rules'])}")
    if left["bug_classes"]:
        lines.append(f"scope: bug classes exercised only outside the scope: {', '.join(left['bug_classes'])}")
    return lines
