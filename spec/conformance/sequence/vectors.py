"""The sequence layout's golden vectors (spec/vectors/kvcache_vectors.json): targeted cases for the
real-world bug classes, the edge programs on the suite's configs, bad calls, and the configurations a
target must refuse; recorded from the sequence model (../vectors.py shares the document)."""

from __future__ import annotations

import json
from typing import Any, Optional

from ... import model
from .. import scope as scopes
from ..configs import BAD_CONFIGS, SUITE_CONFIGS, JsonConfig, config, describe, layer, to_model
from ..engine import RunResult, Step
from ..layouts import Golden
from ..targets import Target
from ..vectors import CELL_VECTORS_FILE, VECTORS_FILE, Recorder, _document, _Numbered
from .engine import ROW_FORGERIES, SequenceEngine
from .modeltarget import ModelTarget
from .programs import BAD_CALLS, edge_programs, plan, step

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


class SequenceRecorder(Recorder):
    def __init__(self) -> None:
        super().__init__(ModelTarget())

    def before(self) -> int:
        return int(self.model.state.length)

    def refusal(self, method: str, args: dict[str, Any], value: Any, before: int) -> Optional[str]:
        if method == "plan" and value is None:
            return "ADMIT"
        if method == "rewind" and value is False:
            return "REWIND-GROW" if args["new_len"] > before else "REWIND-SOUND"
        return None


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
    recorder = SequenceRecorder()
    run = SequenceEngine(recorder, cfg, exact=True, light=True).run(program)
    assert run.finding is None, f"the model disagrees with itself: {run.finding}"
    return recorder.calls


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


def _record(target: Target, cfg: JsonConfig, steps: list[Step]) -> RunResult:
    return SequenceEngine(target, cfg, exact=True).run(steps)


def _flags_of(calls: list[dict[str, Any]], exercised: set[str], cfg: JsonConfig, extra: list[str]) -> list[str]:
    return _flags(calls, cfg, extra)


GOLDEN = Golden(VECTORS_FILE, build, SequenceRecorder, _record, to_model, _flags_of)
