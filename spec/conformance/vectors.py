"""Golden vectors (Wycheproof style), generated from the models: `kvcache vectors [--check]`.

spec/vectors/kvcache_vectors.json (the sequence layout) and cell_vectors.json (the cell layout) hold
groups per config; each test has an id, a comment, flags (the rule ids it exercises and the real-world
bug classes it targets) and a result (valid / invalid / acceptable), and lists protocol calls
(spec/PROTOCOL.md) with the expected answers. The calls are what the layout's conformance engine sends
while it plays the backend, answered by the model (a `Recorder` of the layout's model as a target): so
a replayer in any language needs no model, only a loop over calls. The cases are the layouts' own
(sequence/vectors.py, cell/vectors.py, through the registry); the document, its schema, the replay
and the findings-as-vectors are shared, here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

from .. import model
from ..rules import BY_ID, DECLARATION_RULES, RULES
from . import layouts
from . import scope as scopes
from .configs import JsonConfig, describe
from .engine import Step
from .targets import OPTIONAL_METHODS, ModelAsTarget, Outcome, Target, TargetCrash

FORMAT_VERSION = 1
VECTORS_DIR = Path(__file__).resolve().parent.parent / "vectors"
VECTORS_FILE = "kvcache_vectors.json"
CELL_VECTORS_FILE = "cell_vectors.json"
SCHEMA_FILE = "schema.json"

# Rules no call on a cache's faces can observe, and why.
NOT_COVERED: dict[str, str] = {
    "ET-MAP": "the ExecuTorch Error/Result adapter (kvcache.et) is a language binding, not a face method",
    "REG-KEYS": "the builder registry is process-global API, not part of one cache's faces",
    "REG-SESSION": "the cache registry session is process-global API, not part of one cache's faces",
    "THREADS": "thread safety is not observable through a sequential call list",
    **{rule_id: "a declaration rule: it binds the conformance suite, not a call of the target"
       for rule_id in DECLARATION_RULES},
    # The op face's calls carry K/V tensors, which this JSON form does not (spec/PROTOCOL.md, "Op-face
    # targets"): the op-contiguous and op-cell layouts of the suite check these rules instead.
    **{rule.id: "an op-face rule: its calls carry tensors; the op-face conformance layouts check it"
       for rule in RULES if rule.id.startswith("OP-")},
    # A cell cache seen through its outputs (SPEC.md 5.3): its answers are the target's own output vectors and
    # recomputes, so no golden answer exists; the cell-recompute layout of the suite checks these rules.
    **{rule_id: "a rule of the cell layout seen through its outputs: its answers are the target's own output "
                "vectors, with no golden value; the cell-recompute conformance layout checks it"
       for rule_id in ("CELL-RECOMPUTE", "CELL-KEEP", "CELL-SHIFT", "CELL-STATE")},
    # The paged layout (SPEC.md part 7) is judged by the values in the slots its tables map and by counts from
    # them; block ids are the target's own, so a golden answer would pin a policy: its layout checks it.
    **{rule.id: "a rule of the paged layout: its answers are the target's own block ids, with no golden value; "
                "the paged conformance layout judges the data they map to"
       for rule in RULES if rule.id.startswith("PAGED-")},
}


class Recorder(Target):
    """Records every call the engine makes, with the model's answer as the expectation. A layout's
    recorder (its vectors.py) gives the model and says which answers are refusals."""

    name = "model (recording)"

    def __init__(self, model_target: ModelAsTarget) -> None:
        self.model = model_target
        self.layout = model_target.layout
        self.calls: list[dict[str, Any]] = []

    def create(self, cfg: JsonConfig) -> Outcome:
        self.calls = []
        return self.model.create(cfg)

    def before(self) -> int:
        """What a refusal's rule depends on before the call (the sequence's length), else 0."""
        return 0

    def refusal(self, method: str, args: dict[str, Any], value: Any, before: int) -> Optional[str]:
        """The rule of a refusal answer (null / false where the spec refuses), None for a result."""
        raise NotImplementedError

    def call(self, method: str, args: dict[str, Any]) -> Outcome:
        before = self.before()
        outcome = self.model.call(method, args)
        refused = self.refusal(method, args, outcome.value, before) if outcome.ok else None
        if not outcome.ok:
            expect: dict[str, Any] = {"rejected": outcome.error[1:outcome.error.index("]")]}
        elif refused:
            expect = {"refused": refused}
        else:
            expect = {"result": outcome.value}
        self.calls.append({"method": method, "params": args, "expect": expect, "_length": before})
        return outcome



def _result(calls: list[dict[str, Any]]) -> str:
    if any("rejected" in call["expect"] for call in calls):
        return "invalid"
    if any("refused" in call["expect"] for call in calls):
        return "acceptable"
    return "valid"



class _Numbered:
    """Tests numbered in order (tcId), their calls without the recorder's private fields."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, comment: str, calls: list[dict[str, Any]], flags: list[str]) -> dict[str, Any]:
        self.count += 1
        return {"tcId": self.count, "comment": comment, "flags": flags, "result": _result(calls),
                "calls": [{k: v for k, v in call.items() if not k.startswith("_")} for call in calls]}


def _elsewhere(covered: list[str], other: str) -> dict[str, str]:
    """The rules this file's tests do not flag (the other layout's), each pointing to the file that
    covers it (tests/test_vectors.py checks that it does)."""
    return {rule.id: f"{other} covers it" for rule in RULES if rule.id not in covered and rule.id not in NOT_COVERED}




def _document(algorithm: str, header: list[str], groups: list[dict[str, Any]], count: int,
              bug_classes: dict[str, str], other_file: str) -> dict[str, Any]:
    """A vectors document: the notes of every flag used, and the rules covered by the other file."""
    covered = sorted({flag for group in groups for t in group["tests"] for flag in t["flags"]})
    return {
        "algorithm": algorithm,
        "schema": SCHEMA_FILE,
        "formatVersion": FORMAT_VERSION,
        "generatorVersion": "kvcache_spec.conformance.vectors/1",
        "numberOfTests": count,
        "header": header,
        "notes": {**{rule: BY_ID[rule].statement for rule in covered if rule in BY_ID},
                  **{flag: text for flag, text in bug_classes.items()},
                  **{flag: text for flag, text in scopes.FLAG_NOTES.items() if flag in covered}},
        "notCovered": {**NOT_COVERED, **_elsewhere(covered, other_file)},
        "testGroups": groups,
    }




def render(document: dict[str, Any]) -> str:
    """Stable text: one call per line keeps diffs readable and the file small."""
    lines = ["{"]
    head = {k: v for k, v in document.items() if k != "testGroups"}
    for key, value in head.items():
        lines.append(f" {json.dumps(key)}: {json.dumps(value, sort_keys=True)},")
    lines.append(' "testGroups": [')
    for g_index, group in enumerate(document["testGroups"]):
        lines.append(f'  {{"config": {json.dumps(group["config"], sort_keys=True)}, '
                     f'"configName": {json.dumps(group["configName"])}, "tests": [')
        for t_index, t in enumerate(group["tests"]):
            meta = {k: v for k, v in t.items() if k != "calls"}
            lines.append("   " + json.dumps(meta)[:-1] + ', "calls": [')
            calls = [f"    {json.dumps(call, sort_keys=True)}" for call in t["calls"]]
            lines.append(",\n".join(calls))
            lines.append("   ]}" + ("," if t_index + 1 < len(group["tests"]) else ""))
        lines.append("  ]}" + ("," if g_index + 1 < len(document["testGroups"]) else ""))
    lines.append(" ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "kvcache_vectors.schema.json",
    "title": "kvcache golden vectors",
    "description": "Wycheproof-style vectors for kvcache sequence caches. A test is replayed on a fresh cache "
                   "created from its group's config (or, when the group config is null, by its own first call, "
                   "`create`). Calls are spec/PROTOCOL.md requests. Expectations: {result: v} - the call is "
                   "served and answers exactly v (plans are exact canonical runs); {refused: rule} - the call "
                   "is well formed but must not be served: plan answers null / rewind answers false, or an error "
                   "(kind rejected); {rejected: rule} - a caller error: an error (kind rejected), or null / false, "
                   "and the calls after it check the state is unchanged. Test result: valid - every call is served "
                   "as expected; invalid - the test contains caller errors that must be rejected; acceptable - "
                   "the test contains refusals, which an implementation may signal as a refusal value or as an "
                   "error. Calls to optional methods (length, depth, retained_from) are skipped for targets "
                   "without them. Scope (SCOPE-BORDER): a test flagged NEEDS-FLAT / NEEDS-RING / "
                   "NEEDS-MAX-WRITE needs that feature and is skipped by a target whose declared scope leaves "
                   "it out; a test flagged WITHOUT-FLAT / WITHOUT-RING / WITHOUT-MAX-WRITE checks that a target "
                   "whose scope leaves that feature out refuses a config needing it, and is skipped by every "
                   "other target.",
    "type": "object",
    "required": ["algorithm", "schema", "formatVersion", "numberOfTests", "notes", "testGroups"],
    "properties": {
        "algorithm": {"enum": ["kvcache-sequence-cache", "kvcache-cell-cache"]},
        "schema": {"type": "string"},
        "formatVersion": {"const": FORMAT_VERSION},
        "generatorVersion": {"type": "string"},
        "numberOfTests": {"type": "integer", "minimum": 1},
        "header": {"type": "array", "items": {"type": "string"}},
        "notes": {"type": "object", "additionalProperties": {"type": "string"},
                  "description": "every flag used by a test: a rule id of spec/rules.py or a bug class"},
        "notCovered": {"type": "object", "additionalProperties": {"type": "string"},
                       "description": "rule ids no face call can observe, with the reason"},
        "testGroups": {"type": "array", "items": {
            "type": "object", "required": ["config", "tests"],
            "properties": {
                "config": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/config"}]},
                "configName": {"type": "string"},
                "tests": {"type": "array", "items": {"$ref": "#/$defs/test"}}}}},
    },
    "$defs": {
        "config": {"type": "object", "required": ["capacity", "n_layers", "layers"],
                   "properties": {"capacity": {}, "n_layers": {}, "layers": {"type": "array"},
                                  "initial_capacity": {}, "max_write": {}, "max_seqs": {}}},
        "test": {"type": "object", "required": ["tcId", "comment", "flags", "result", "calls"],
                 "properties": {"tcId": {"type": "integer"}, "comment": {"type": "string"},
                                "flags": {"type": "array", "items": {"type": "string"}},
                                "result": {"enum": ["valid", "invalid", "acceptable"]},
                                "calls": {"type": "array", "items": {"$ref": "#/$defs/call"}}}},
        "call": {"type": "object", "required": ["method", "params", "expect"],
                 "properties": {"method": {"enum": ["create", "can_extend", "capacity", "length", "rewind", "clear",
                                                    "plan", "commit", "depth", "retained_from", "faces",
                                                    "declare_step", "place_step", "seq_new", "seq_clone", "seq_rm",
                                                    "seq_len", "next_pos", "free_cells", "used_end", "live"]},
                                "params": {"type": "object"},
                                "expect": {"oneOf": [
                                    {"type": "object", "required": ["result"], "additionalProperties": False,
                                     "properties": {"result": {}}},
                                    {"type": "object", "required": ["refused"], "additionalProperties": False,
                                     "properties": {"refused": {"type": "string"}}},
                                    {"type": "object", "required": ["rejected"], "additionalProperties": False,
                                     "properties": {"rejected": {"type": "string"}}}]}}},
    },
}


# --- replay (any target) ---------------------------------------------------------------------------

def _same(a: Any, b: Any) -> bool:
    """JSON equality with bool distinct from int."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def replay_vectors(target: Target, document: Optional[dict[str, Any]] = None) -> tuple[int, list[str], int]:
    """Replay every test inside the target's declared scope (NEEDS-/WITHOUT- flags);
    (tests passed, failure messages, tests skipped as outside the scope)."""
    scope = target.declared_scope()   # a cmd: target's hello also says its layout
    document = document or json.loads((VECTORS_DIR / (CELL_VECTORS_FILE if target.layout == "cell"
                                                      else VECTORS_FILE)).read_text())
    passed, failures, skipped = 0, [], 0
    for group in document["testGroups"]:
        for t in group["tests"]:
            if not scopes.applies(t["flags"], scope, group["config"]):
                skipped += 1
                continue
            problem = _replay_test(target, group["config"], t["calls"])
            if problem:
                failures.append(f"tcId {t['tcId']} ({t['comment']}): {problem}")
            else:
                passed += 1
    return passed, failures, skipped


def _replay_test(target: Target, cfg: Optional[JsonConfig], calls: list[dict[str, Any]]) -> Optional[str]:
    if cfg is not None and not target.create(cfg).ok:
        return "create refused the group's config"
    for index, call in enumerate(calls):
        method, expect = call["method"], call["expect"]
        if method in OPTIONAL_METHODS and method not in target.optional:
            continue
        got = target.create(call["params"]["config"]) if method == "create" else target.call(method, call["params"])
        served = got.ok and got.value is not None and got.value is not False
        if "result" in expect:
            if not got.ok or not _same(got.value, expect["result"]):
                return f"call {index} {method}({call['params']}): expected {expect['result']!r}, " \
                       f"got {got.value if got.ok else got.error!r}"
        elif served and method not in ("commit", "clear", "create"):
            return f"call {index} {method}({call['params']}): must not be served ({expect}), got {got.value!r}"
        elif got.ok and method == "create":
            return f"call {index} create: an invalid config was accepted ({expect})"
    return None


# --- findings as vectors (`kvcache conformance --save-findings DIR`) ---------------------------------

FINDINGS_GENERATOR = "kvcache_spec.conformance.findings/1"


def _record(cfg: JsonConfig, steps: list[Step], optional: frozenset[str],
            golden: layouts.Golden) -> tuple[list[dict[str, Any]], set[str]]:
    """The calls the engine of the layout sends for `steps` on a target with these optional methods,
    answered by the model: the same calls (length() or can_extend probes alike) the finding was seen
    through; and the rules the run exercised (a cell test's flags)."""
    recorder = golden.recorder()
    recorder.optional = optional
    run = golden.record(recorder, cfg, steps)
    return recorder.calls, run.exercised



def finding_document(finding: Any, cfg: JsonConfig, steps: list[Step], optional: frozenset[str],
                     scope: scopes.Scope, target: str, layout: str = "sequence") -> dict[str, Any]:
    """One finding as a golden-vector file with one test: the target's own driver replays it
    (`./my_target --vectors FILE`) and fails where the suite saw the finding."""
    golden = _golden(layout)
    made = golden.configured(cfg)
    group_cfg: Optional[JsonConfig] = cfg
    if finding.rule == scopes.BORDER_RULE:   # it must refuse the config at all
        group_cfg = None
        calls = [{"method": "create", "params": {"config": cfg}, "expect": {"rejected": scopes.BORDER_RULE}}]
        flags = [scopes.BORDER_RULE] + [scopes.WITHOUT[name] for name in sorted(scope.missing(cfg))]
    elif isinstance(made, model.Rejected):   # a config finding: it must refuse the config
        group_cfg = None
        calls = [{"method": "create", "params": {"config": cfg}, "expect": {"rejected": made.rule}}]
        flags = [made.rule]
    else:
        calls, exercised = _record(cfg, steps, optional, golden)
        extra = [finding.rule] if finding.rule in BY_ID else []
        flags = golden.flags(calls, exercised, cfg, extra)
    comment = f"{finding.kind} {finding.rule}: {finding.message}"
    flags = sorted(set(flags))
    clean = [{k: v for k, v in call.items() if not k.startswith("_")} for call in calls]
    return {
        "algorithm": f"kvcache-{layout}-cache", "schema": SCHEMA_FILE, "formatVersion": FORMAT_VERSION,
        "generatorVersion": FINDINGS_GENERATOR, "numberOfTests": 1,
        "header": [f"A finding of `kvcache conformance` on {target}, as a golden-vector file: replay it with "
                   "the target's own driver (./my_target --vectors THIS_FILE); it fails until the finding is "
                   "fixed. The expected answers are the model's."],
        "notes": {flag: BY_ID[flag].statement if flag in BY_ID else scopes.FLAG_NOTES.get(flag, "")
                  for flag in flags},
        "finding": {"class": finding.kind, "rule": finding.rule, "message": finding.message, "target": target},
        "testGroups": [{"config": group_cfg, "configName": describe(cfg) if group_cfg else "a config to refuse",
                        "tests": [{"tcId": 1, "comment": comment[:500], "flags": flags, "result": _result(calls),
                                   "calls": clean}]}],
    }


def vector_files() -> list[str]:
    """The golden vectors' files, in report order (the layouts that have them)."""
    return [golden.file for golden in layouts.goldens()]


def _golden(layout: str) -> layouts.Golden:
    golden = layouts.get(layout).golden
    if golden is None:
        raise ValueError(f"the {layout} layout has no golden vectors")
    return golden()



def save_findings(found: list[tuple[Any, JsonConfig, list[Step]]], directory: Path, target: Target,
                  scope: scopes.Scope) -> list[dict[str, Any]]:
    """Write each (finding, config, steps) as DIR/NN-CLASS-RULE.json and replay it on `target` to
    say whether it reproduces there; the list of what was written."""
    directory.mkdir(parents=True, exist_ok=True)
    saved = []
    for index, (finding, cfg, steps) in enumerate(found, 1):
        document = finding_document(finding, cfg, steps, target.optional, scope, target.name, target.layout)
        path = directory / f"{index:02d}-{finding.kind}-{finding.rule}.json".lower()
        path.write_text(render(document))
        group = document["testGroups"][0]
        if not scopes.applies(group["tests"][0]["flags"], target.scope, group["config"]):   # as its replayer does
            saved.append({"path": str(path), "class": finding.kind, "rule": finding.rule, "reproduces": False,
                          "replay": f"skipped: outside the scope the target declares [{target.scope}]"})
            continue
        try:
            problem = _replay_test(target, group["config"], group["tests"][0]["calls"])
        except TargetCrash as crash:
            problem = f"crash: {crash}"
        saved.append({"path": str(path), "class": finding.kind, "rule": finding.rule,
                      "reproduces": problem is not None, "replay": problem or "passed: it does not reproduce"})
    return saved


# --- the command -----------------------------------------------------------------------------------

def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache vectors", description="Regenerate or check the golden vectors.")
    parser.add_argument("--check", action="store_true", help="compare the committed vectors with the model")
    parser.add_argument("--out", default=str(VECTORS_DIR), help="directory (default: spec/vectors)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return 0 if exit_.code == 0 else 2
    out = Path(args.out)
    if not args.check:   # a bad --out is a usage error before any work
        try:
            out.mkdir(parents=True, exist_ok=True)
            if not os.access(out, os.W_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as error:
            print(f"kvcache vectors: --out {args.out}: cannot be written: {error.strerror or error}",
                  file=sys.stderr)
            return 2
    files = {golden.file: golden.build for golden in layouts.goldens()}   # file -> its builder
    wanted = {**{name: render(builder()) for name, builder in files.items()},
              SCHEMA_FILE: json.dumps(SCHEMA, indent=1) + "\n"}
    if args.check:
        stale = [name for name, text in wanted.items()
                 if not (out / name).exists() or (out / name).read_text() != text]
        if stale:
            for name in stale:
                print(f"kvcache vectors: {out / name} drifted from the model: {_drift(out / name, wanted[name])}",
                      file=sys.stderr)
            print("kvcache vectors: run `kvcache vectors` and commit", file=sys.stderr)
            return 1
        print(f"kvcache vectors: {', '.join(str(out / name) for name in files)} match the models")
        return 0
    try:
        for name, text in wanted.items():
            (out / name).write_text(text)
    except OSError as error:
        print(f"kvcache vectors: --out {args.out}: cannot be written: {error.strerror or error}", file=sys.stderr)
        return 2
    print(f"kvcache vectors: wrote {', '.join(str(out / name) for name in files)} and {out / SCHEMA_FILE}")
    return 0


def _drift(path: Path, wanted: str) -> str:
    """Which case drifted: the first test (tcId and comment) whose text differs, or what else differs."""
    if not path.exists():
        return "the file is missing"
    try:
        have = json.loads(path.read_text())
        want = json.loads(wanted)
    except ValueError as error:
        return f"it is not valid JSON ({error})"
    if not isinstance(have, dict) or "testGroups" not in want:
        return "it differs (not a vectors document)" if "testGroups" in want else "it differs from the schema"
    tests = {t.get("tcId"): t for g in have.get("testGroups", []) for t in g.get("tests", [])
             if isinstance(t, dict)}
    for group in want["testGroups"]:
        for test in group["tests"]:
            got = tests.get(test["tcId"])
            if got != test:
                return (f"tcId {test['tcId']} ({test['comment']!r}, config {group['configName']}) "
                        + ("is missing" if got is None else "differs"))
    extra = sorted(set(tests) - {t["tcId"] for g in want["testGroups"] for t in g["tests"]}, key=str)
    if extra:
        return f"tcId {extra[0]} is not generated by the model"
    return "the header differs (" + ", ".join(k for k in want if k != "testGroups" and have.get(k) != want[k]) + ")"
