"""Golden vectors (Wycheproof style), generated from the model: `kvcache vectors [--check]`.

spec/vectors/kvcache_vectors.json holds groups per config; each test has an id, a comment, flags
(the rule ids it exercises and the real-world bug classes it targets) and a result (valid / invalid
/ acceptable), and lists protocol calls (spec/PROTOCOL.md) with the expected answers. The calls are
what the conformance engine sends while it plays the backend, answered by the model
(`ModelTarget`): so a replayer in any language needs no model, only a loop over calls.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional, Union

from .. import model
from ..rules import BY_ID, RULES
from . import scope as scopes
from .configs import BAD_CONFIGS, SUITE_CONFIGS, JsonConfig, config, describe, layer, to_model
from .cell_engine import CellEngine, to_cell_model
from .cell_programs import CELL_CONFIGS, bad_cell_configs, edge_cell_programs
from .malform import CLAUSE_PREFIX
from .engine import ROW_FORGERIES, Engine, Step
from .modeltarget import CellModelTarget, ModelTarget
from .programs import BAD_CALLS, edge_programs, plan, step
from .targets import OPTIONAL_METHODS, Outcome, Target, TargetCrash

FORMAT_VERSION = 1
VECTORS_DIR = Path(__file__).resolve().parent.parent / "vectors"
VECTORS_FILE = "kvcache_vectors.json"
SCHEMA_FILE = "schema.json"

# Real-world bug classes (reference/upstream-api.md) and upstream's own gaps, as flags.
BUG_CLASSES: dict[str, str] = {
    "BUG-WINDOW-EDGE": "sliding-window updates going wrong when the length reaches exactly the window",
    "BUG-RING-START-AFTER-PREFILL": "ring start computed from past_length % window after a short prefill",
    "BUG-LENGTH-FROM-SLIDING-LAYER": "the model's length read from a sliding layer instead of the whole model",
    "BUG-DRAFT-BURST-READ-LENGTH": "read length disagreeing with the advertised mask during draft bursts",
    "BUG-ROLLBACK-AFTER-WRAP": "rollback unsupported or silently ignored after a ring wraps",
    "BUG-WINDOW-OFF-BY-ONE": "windows of w vs w+1 keys between attention kernels",
    "BUG-RING-SIZED-TO-WINDOW": "a sliding-window cache sized exactly to the window breaking speculative rollback",
    "BUG-MULTI-TOKEN-NO-EVICT": "multi-token steps never evicting",
    "BUG-GROUP-WINDOW-ON-FULL-LAYER": "a group's window applied to full-attention layers",
    "BUG-REUSE-LARGEST-WINDOW": "a reuse check using the largest window instead of the most restrictive",
    "BUG-PREFILL-LONGER-THAN-WINDOW": "prefill longer than the window producing nonsense",
    "BUG-CHUNKED-PREFILL-OVER-ATTEND": "chunked prefill over-attending on sliding layers",
    "BUG-EXACT-CAPACITY-REFUSED": "an input of exactly the capacity refused",
    "UPSTREAM-UNSOUND-FLOOR": "upstream's rewind floor max(0, L - w) accepts unsound rewinds when max_write < window",
    "UPSTREAM-STRICT-FLOOR": "upstream's rewind floor refuses sound rewinds when max_write > window",
    "UPSTREAM-FLOOR-CHAINS": "upstream's rewind floor ignores chains of rewinds",
    "UPSTREAM-NO-APPEND-CHECK": "upstream's plan does not check position against the length (gaps, overlaps)",
    "UPSTREAM-T-ZERO": "upstream's plan does not check T > 0",
    "UPSTREAM-DEPTH-UNCHECKED": "upstream's depth(layer) indexed without a bounds check",
    "UPSTREAM-LAYERS-SIZE": "upstream does not check the size of layers against n_layers",
    "UPSTREAM-TESTS": "the numbers of upstream's own unit tests",
}

# Rules no call on a cache's faces can observe, and why.
NOT_COVERED: dict[str, str] = {
    "ET-MAP": "the ExecuTorch Error/Result adapter (kvcache.et) is a language binding, not a face method",
    "REG-KEYS": "the builder registry is process-global API, not part of one cache's faces",
    "REG-SESSION": "the cache registry session is process-global API, not part of one cache's faces",
    "THREADS": "thread safety is not observable through a sequential call list",
    # The op face's calls carry K/V tensors, which this JSON form does not (spec/PROTOCOL.md, "Op-face
    # targets"): the op-contiguous and op-cell layouts of the suite check these rules instead.
    **{rule.id: "an op-face rule: its calls carry tensors; the op-face conformance layouts check it"
       for rule in RULES if rule.id.startswith("OP-")},
}


class Recorder(Target):
    """Records every call the engine makes, with the model's answer as the expectation."""

    name = "model (recording)"

    def __init__(self, layout: str = "sequence") -> None:
        self.layout = layout
        self.model: Union[ModelTarget, CellModelTarget] = CellModelTarget() if layout == "cell" else ModelTarget()
        self.calls: list[dict[str, Any]] = []

    def create(self, cfg: JsonConfig) -> Outcome:
        self.calls = []
        return self.model.create(cfg)

    def refusal(self, method: str, args: dict[str, Any], value: Any, before: int) -> Optional[str]:
        """The rule of a refusal answer (null / false where the spec refuses), None for a result."""
        if self.layout == "cell":
            refused = {("seq_new", None): "CELL-NEW", ("seq_clone", None): "CELL-FORK",
                       ("declare_step", False): "CELL-DECLARE"}
            return refused.get((method, value)) if value is None or value is False else None
        if method == "plan" and value is None:
            return "ADMIT"
        if method == "rewind" and value is False:
            return "REWIND-GROW" if args["new_len"] > before else "REWIND-SOUND"
        return None

    def call(self, method: str, args: dict[str, Any]) -> Outcome:
        before = self.model.state.length if self.layout == "sequence" else 0
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


def _flags(calls: list[dict[str, Any]], cfg: JsonConfig, extra: list[str]) -> list[str]:
    flags: set[str] = set(extra)
    for index, call in enumerate(calls):
        method, expect, params = call["method"], call["expect"], call["params"]
        nxt = calls[index + 1]["method"] if index + 1 < len(calls) else ""
        if "rejected" in expect:
            flags |= {expect["rejected"], "ATOMIC"}
        elif "refused" in expect:
            flags |= {expect["refused"], "ATOMIC"}
        elif method == "plan":
            flags |= {"PLAN-SHAPE", "PLAN-WRITE", "PLAN-READ", "LAYOUT-CANON", "DATA-SOUND", "STEP-APPEND"}
            if params["position"] + params["T"] == cfg["capacity"]:
                flags |= {"ADMIT"}
            if params["position"] < call["_length"]:
                flags |= {"PROTO-COMMIT"}
            if nxt == "length":
                flags |= {"PLAN-PURE"}
        else:
            flags |= {"commit": {"COMMIT-ADVANCE", "COMMIT-ISSUED"}, "rewind": {"REWIND-SOUND"},
                      "can_extend": {"ADMIT"}, "length": {"LEN-BOUNDS"}, "depth": {"DEPTH"},
                      "retained_from": {"RETAINED"}, "clear": {"CLEAR"}, "faces": {"FACES"},
                      "capacity": {"ADMIT"}, "create": set()}[method]
    if cfg["n_layers"] > 1:
        flags.add("CFG-DEDUP")
    flags.update(scopes.needs_flags(cfg))
    return sorted(flags)


def _result(calls: list[dict[str, Any]]) -> str:
    if any("rejected" in call["expect"] for call in calls):
        return "invalid"
    if any("refused" in call["expect"] for call in calls):
        return "acceptable"
    return "valid"


# --- the cases -------------------------------------------------------------------------------------

Case = tuple[str, list[Step], list[str]]   # comment, program, extra flags

RING4 = config(20, [layer("ring", 4)])
RING4_M2 = config(20, [layer("ring", 4)], max_write=2)
RING3_M6 = config(24, [layer("ring", 3)], max_write=6)
FLAT8 = config(8, [layer("flat")])
MIXED = config(16, [layer("flat"), layer("ring", 4)])
WINDOWS = config(20, [layer("ring", 2), layer("ring", 5), layer("flat")], max_write=3)


def targeted_cases() -> dict[str, list[Case]]:
    """Hand-picked programs per config name: each rule's edges and each bug class."""
    def rewind(new_len: Any) -> Step:
        return {"op": "rewind", "new_len": new_len}

    length, depth0 = {"op": "length"}, {"op": "depth", "layer": 0}
    cases: dict[str, list[Case]] = {}

    def add(cfg: JsonConfig, comment: str, program: list[Step], *flags: str) -> None:
        cases.setdefault(json.dumps(cfg), []).append((comment, program, list(flags)))

    up_flat = config(8, [layer("flat")])
    add(up_flat, "upstream flat: plan(0,0,4) writes [(0,4)] reads [(0,4)]; then 4 then 5 rows read",
        [step(4), plan(0, {"rel": 0}, 1)], "UPSTREAM-TESTS")
    add(config(2, [layer("flat")]), "upstream flat capacity 2: can_extend(2); fill; can_extend(1) false; plan refused",
        [{"op": "can_extend", "n": 2}, step(2), {"op": "can_extend", "n": 1}, plan(0, {"rel": 0}, 1)],
        "UPSTREAM-TESTS", "BUG-EXACT-CAPACITY-REFUSED")
    add(up_flat, "upstream flat: after (0,0,5): rewind(0) true, rewind(1) false, clear, can_extend(8)",
        [step(5), rewind(0), rewind(1), {"op": "clear"}, {"op": "can_extend", "n": 8}], "UPSTREAM-TESTS")
    add(config(100, [layer("ring", 4)]), "upstream ring(4): plan(0,0,4); layout of (7,1) is write [(0,1)] "
        "read [(4,3),(0,1)] base 4; a 5-token step is rejected",
        [step(4), step(3), plan(0, {"rel": 0}, 1), plan(0, {"rel": 0}, 5)], "UPSTREAM-TESTS")
    add(config(100, [layer("ring", 4)], max_write=8), "upstream ring(4) max_write 8: plan(8,8) writes "
        "[(8,3),(0,5)] reads [(5,6),(0,5)] base 5; plan(20,1) writes [(9,1)] reads [(6,4)] base 17",
        [step(8), step(8, "per-layer"), step(4), step(1)], "UPSTREAM-TESTS", "BUG-DRAFT-BURST-READ-LENGTH")
    add(config(100, [layer("flat"), layer("ring", 4)]), "upstream mixed: both layers at (0,3), commit once; "
        "can_extend(97) true, can_extend(98) false",
        [step(3), {"op": "can_extend", "n": 97}, {"op": "can_extend", "n": 98}], "UPSTREAM-TESTS")
    add(config(100, [layer("flat"), layer("ring", 4)]), "upstream mixed advanced to 10 in steps of 2: "
        "rewind(5) false, rewind(6) true, rewind(11) false",
        [step(2)] * 5 + [rewind(5), rewind(6), rewind(11)], "UPSTREAM-TESTS", "BUG-ROLLBACK-AFTER-WRAP")
    add(RING4, "decode up to exactly the window, then past it: the read window slides at L == w",
        [step(1)] * 6 + [length], "BUG-WINDOW-EDGE")
    add(RING4, "short prefill then decode: slots are position mod (w + m - 1), not (L - prefill) % w",
        [step(3)] + [step(1)] * 8, "BUG-RING-START-AFTER-PREFILL")
    add(MIXED, "the length is the whole model's, not a sliding layer's", [step(4)] * 3 +
        [length, {"op": "can_extend", "n": 4}, {"op": "can_extend", "n": 5}], "BUG-LENGTH-FROM-SLIDING-LAYER")
    add(RING3_M6, "a draft burst of T = max_write reads [position - w + 1, position + T)",
        [step(4), step(6), step(6, "per-layer")], "BUG-DRAFT-BURST-READ-LENGTH")
    add(RING4, "rollback after the ring wraps: sound rewinds succeed, unsound ones are refused",
        [step(4)] * 3 + [rewind(9), step(1), rewind(8), rewind(7), rewind(0)], "BUG-ROLLBACK-AFTER-WRAP")
    add(RING4, "a token sees w keys, itself included: plan at 10 reads 4 rows from 7",
        [step(4), step(4), step(2), plan(0, {"rel": 0}, 1)], "BUG-WINDOW-OFF-BY-ONE")
    add(RING4, "the ring has w + m - 1 rows, so a rewind after a burst of m stays sound",
        [depth0] + [step(4)] * 3 + [rewind(9), step(4)], "BUG-RING-SIZED-TO-WINDOW")
    add(RING4, "a multi-token step writes all T rows and wraps", [step(4), step(4), step(4)],
        "BUG-MULTI-TOKEN-NO-EVICT")
    add(MIXED, "the flat layer keeps full history next to a ring (its own policy, its own depth)",
        [{"op": "depth", "layer": 0}, {"op": "depth", "layer": 1}] + [step(4)] * 3,
        "BUG-GROUP-WINDOW-ON-FULL-LAYER")
    add(WINDOWS, "rewinds are limited by the most restrictive layer, not the largest window",
        [step(3)] * 5 + [rewind({"back": k}) for k in range(1, 12)], "BUG-REUSE-LARGEST-WINDOW")
    add(RING3_M6, "a prefill longer than the window (T = 6 > w = 3) reads all of it",
        [step(6), step(6)], "BUG-PREFILL-LONGER-THAN-WINDOW")
    add(RING3_M6, "chunked prefill: each chunk reads only its tokens' windows",
        [step(6), step(6), step(6), step(6)], "BUG-CHUNKED-PREFILL-OVER-ATTEND")
    add(FLAT8, "an input of exactly the capacity is admitted", [step(8), plan(0, {"rel": 0}, 1)],
        "BUG-EXACT-CAPACITY-REFUSED")
    add(config(7, [layer("ring", 4)]), "exactly the capacity on a ring whose capacity is its size",
        [step(4), step(3), {"op": "can_extend", "n": 0}], "BUG-EXACT-CAPACITY-REFUSED")
    add(RING4_M2, "max_write < window: upstream's floor L - w would accept rewind(6) at 10; it is unsound",
        [step(2)] * 5 + [rewind(6), rewind(7)], "UPSTREAM-UNSOUND-FLOOR")
    add(RING3_M6, "max_write > window: rewind(6) at 12 is sound though upstream's floor L - w refuses it",
        [step(6), step(6), rewind(6)], "UPSTREAM-STRICT-FLOOR")
    add(config(8, [layer("ring", 4)]), "a chain of rewinds: 8 -> 7 -> 4 are sound, then 3 is not",
        [step(4), step(4), rewind(7), rewind(4), rewind(3)], "UPSTREAM-FLOOR-CHAINS")
    add(FLAT8, "gaps and overlaps are rejected", [step(2), plan(0, 3, 1), plan(0, 1, 1), plan(0, 0, 1)],
        "UPSTREAM-NO-APPEND-CHECK")
    add(FLAT8, "T = 0 and T < 0 are rejected", [plan(0, 0, 0), plan(0, 0, -1)], "UPSTREAM-T-ZERO")
    add(MIXED, "depth and retained_from check the layer", [{"op": "depth", "layer": 2},
                                                            {"op": "depth", "layer": -1},
                                                            {"op": "retained_from", "layer": 2}],
        "UPSTREAM-DEPTH-UNCHECKED")
    add(MIXED, "per-layer commit (MLX): each layer plans the open step after layer 0 committed it",
        [step(3, "per-layer"), step(4, "per-layer"), {"op": "commit", "plan": {"forge": "open", "layer": 1}}])
    add(RING4, "plan is pure: the same plan twice, the length unchanged", [plan(0, 0, 2), plan(0, 0, 2), length])
    add(RING4, "the open step may be planned again but not with another T",
        [step(2), plan(0, 0, 2), plan(0, 0, 3), plan(0, 0, 1)])
    add(MIXED, "a step longer than the ring's max_write is rejected on the flat layer too",
        [plan(0, 0, 5), plan(1, 0, 5), plan(0, 0, 4)])
    add(FLAT8, "clear forgets everything: a stale plan is rejected afterwards",
        [step(3), {"op": "clear"}, {"op": "commit", "plan": {"forge": "stale"}}, length, step(1)])
    add(FLAT8, "commit takes only plans of the current step", [step(2)] + [
        {"op": "commit", "plan": {"forge": kind}} for kind in
        ("stale", "shift-base", "extra-row", "empty", "three-runs", "future", "not-a-plan")])
    for cfg in (FLAT8, RING4, MIXED):
        add(cfg, "commit compares the rows, not only the span: the next step's plan with its runs shifted, "
            "split, or from another policy's layout is rejected", [step(3)] + [
                {"op": "commit", "plan": {"forge": kind}} for kind in ROW_FORGERIES] + [length, step(2)])
    return cases




# Valid configs a target whose scope leaves out a feature must refuse (SCOPE-BORDER): (feature, what, config).
BORDER_CONFIGS: tuple[tuple[str, str, JsonConfig], ...] = (
    ("flat", "a flat layer", config(8, [layer("flat")])),
    ("ring", "a ring layer", config(20, [layer("ring", 4)])),
    ("ring", "a ring layer next to a flat one", config(16, [layer("flat"), layer("ring", 4)])),
    ("max_write", "a config that sets max_write", config(8, [layer("flat")], max_write=2)),
)


# Edge programs the vectors leave to the suite (long, and the targeted cases cover their edges).
LONG_EDGE_PROGRAMS = {"one token at a time, per-layer commit", "wrap-around with mixed step sizes",
                      "rewind one token after every step", "bad calls in the middle of a step", "clear and reuse"}

BAD_CALL_PROGRAMS = {"bad calls on an empty cache", "bad calls at the capacity"}   # for a few configs only


def _run_case(cfg: JsonConfig, program: list[Step]) -> list[dict[str, Any]]:
    recorder = Recorder()
    run = Engine(recorder, cfg, exact=True, light=True).run(program)
    assert run.finding is None, f"the model disagrees with itself: {run.finding}"
    return recorder.calls


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


def build() -> dict[str, Any]:
    """The whole vectors document, deterministically."""
    groups: list[dict[str, Any]] = []
    test = _Numbered()

    targeted = targeted_cases()
    bad_call_configs = {json.dumps(c) for c in (FLAT8, RING4_M2, MIXED)}
    configs = list(SUITE_CONFIGS) + [json.loads(key) for key in targeted if json.loads(key) not in SUITE_CONFIGS]
    for cfg in configs:
        tests = []
        for comment, program, extra in targeted.get(json.dumps(cfg), []):
            calls = _run_case(cfg, program)
            tests.append(test(comment, calls, _flags(calls, cfg, extra)))
        if cfg in SUITE_CONFIGS:
            for name, program in edge_programs(cfg):
                if name in LONG_EDGE_PROGRAMS or (name in BAD_CALL_PROGRAMS
                                                  and json.dumps(cfg) not in bad_call_configs):
                    continue
                calls = _run_case(cfg, program)
                tests.append(test(name, calls, _flags(calls, cfg, [])))
        if json.dumps(cfg) in bad_call_configs:
            for name, bad in BAD_CALLS:
                calls = _run_case(cfg, [step(1, "per-layer"), step(1), bad])
                tests.append(test(f"{name}, with an open step", calls, _flags(calls, cfg, [])))
        groups.append({"config": cfg, "configName": describe(cfg), "tests": tests})
    bad_tests = []
    for comment, bad_cfg, flag in BAD_CONFIGS:
        made = to_model(bad_cfg)
        assert isinstance(made, model.Rejected), comment
        call = {"method": "create", "params": {"config": bad_cfg}, "expect": {"rejected": made.rule}}
        bad_tests.append(test(f"invalid config: {comment}", [call], sorted({made.rule, flag})))
    for feature, comment, border_cfg in BORDER_CONFIGS:
        call = {"method": "create", "params": {"config": border_cfg}, "expect": {"rejected": scopes.BORDER_RULE}}
        bad_tests.append(test(f"a target without {feature} refuses {comment}", [call],
                              [scopes.BORDER_RULE, scopes.WITHOUT[feature]]))
    groups.append({"config": None, "configName": "invalid configs (each test creates its own)",
                   "tests": bad_tests})
    header = ["Generated from spec/model.py by `kvcache vectors`; do not edit by hand.",
              "Each test: create the group's config (a fresh cache), then send each call "
              "(spec/PROTOCOL.md) and grade the answer by its expectation (see schema.json).",
              "Plans are exact: these vectors test the canonical layout (LAYOUT-CANON)."]
    return _document("kvcache-sequence-cache", header, groups, test.count, BUG_CLASSES, CELL_VECTORS_FILE)


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


# --- the cell layout's vectors ----------------------------------------------------------------------

CELL_VECTORS_FILE = "cell_vectors.json"
# Every suite configuration: the seventh (16 cells, 64 ids, three layers) is the only one a cell cache with
# upstream's fixed 64 ids (scope max_seqs=64) can replay.
CELL_VECTOR_CONFIGS = CELL_CONFIGS


def _cell_flags(calls: list[dict[str, Any]], exercised: set[str], cfg: JsonConfig, extra: list[str]) -> list[str]:
    """A cell test's flags: the rules its run exercised, those its rejections name, the scope's needs."""
    rejected = {call["expect"]["rejected"] for call in calls if "rejected" in call["expect"]}
    rules = {rule for rule in exercised if not rule.startswith(CLAUSE_PREFIX)}   # flags name rules, not clauses
    return sorted(rules | rejected | set(extra) | set(scopes.needs_flags(cfg)))


def build_cells() -> dict[str, Any]:
    """The cell layout's vectors document: the cell edge programs on the suite's cell configs, as the
    cell engine sends them (light), answered by the cell model (canonical placement), then the
    configurations a cell cache must refuse. Flags: the rules each test exercises."""
    test = _Numbered()
    groups: list[dict[str, Any]] = []
    for cfg in CELL_VECTOR_CONFIGS:
        tests = []
        for name, program in edge_cell_programs(cfg):
            recorder = Recorder("cell")
            run = CellEngine(recorder, cfg, exact=True, light=True).run(program)
            assert run.finding is None and not run.layout, f"the cell model disagrees with itself: {run.finding}"
            tests.append(test(name, recorder.calls, _cell_flags(recorder.calls, run.exercised, cfg, [])))
        groups.append({"config": cfg, "configName": describe(cfg), "tests": tests})
    bad_tests = []
    for bad_cfg in bad_cell_configs(True):
        made = to_cell_model(bad_cfg)
        assert isinstance(made, model.Rejected), bad_cfg
        call = {"method": "create", "params": {"config": bad_cfg}, "expect": {"rejected": made.rule}}
        bad_tests.append(test(f"invalid cell config: {describe(bad_cfg)}",
                              [call], [made.rule]))
    groups.append({"config": None, "configName": "invalid configs (each test creates its own)", "tests": bad_tests})
    header = ["Generated from spec/cell_model.py by `kvcache vectors`; do not edit by hand.",
              "Each test: create the group's config (a fresh cell cache), then send each call "
              "(spec/PROTOCOL.md, \"Cell methods\") and grade the answer by its expectation (see schema.json).",
              "CellSteps are exact: these vectors test the canonical placement (CELL-LAYOUT-CANON)."]
    return _document("kvcache-cell-cache", header, groups, test.count, {}, VECTORS_FILE)


VECTOR_FILES: dict[str, Any] = {VECTORS_FILE: build, CELL_VECTORS_FILE: build_cells}   # file -> its builder


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
            layout: str = "sequence") -> tuple[list[dict[str, Any]], set[str]]:
    """The calls the engine of the layout sends for `steps` on a target with these optional methods,
    answered by the model: the same calls (length() or can_extend probes alike) the finding was seen
    through; and the rules the run exercised (a cell test's flags)."""
    recorder = Recorder(layout)
    recorder.optional = optional
    run = (CellEngine if layout == "cell" else Engine)(recorder, cfg, exact=True).run(steps)
    return recorder.calls, run.exercised


def finding_document(finding: Any, cfg: JsonConfig, steps: list[Step], optional: frozenset[str],
                     scope: scopes.Scope, target: str, layout: str = "sequence") -> dict[str, Any]:
    """One finding as a golden-vector file with one test: the target's own driver replays it
    (`./my_target --vectors FILE`) and fails where the suite saw the finding."""
    made = to_cell_model(cfg) if layout == "cell" else to_model(cfg)
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
        calls, exercised = _record(cfg, steps, optional, layout)
        extra = [finding.rule] if finding.rule in BY_ID else []
        flags = _flags(calls, cfg, extra) if layout == "sequence" else _cell_flags(calls, exercised, cfg, extra)
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
    wanted = {**{name: render(builder()) for name, builder in VECTOR_FILES.items()},
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
        print(f"kvcache vectors: {', '.join(str(out / name) for name in VECTOR_FILES)} match the models")
        return 0
    try:
        for name, text in wanted.items():
            (out / name).write_text(text)
    except OSError as error:
        print(f"kvcache vectors: --out {args.out}: cannot be written: {error.strerror or error}", file=sys.stderr)
        return 2
    print(f"kvcache vectors: wrote {', '.join(str(out / name) for name in VECTOR_FILES)} and {out / SCHEMA_FILE}")
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
