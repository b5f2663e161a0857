"""A finding is charged to the call that explains it (issue 41.1). A cache that keeps no positions refuses a lone
token at position 0 on layer 0 (over-strict, changing nothing), and a layer's first write at a later position - a
call outside its declared scope - answers rows of no token whatever came before. The break that call shows past
the refusal is not the refusal's: without it the program reaches that call outside the scope, so the program is
unjudged from there (said in the skipped notes), never a SAFE-OP-ISOLATION finding after the over-strict step."""

from __future__ import annotations

from kvcache_spec.conformance import layouts
from kvcache_spec.conformance.suite import report_json, run_suite
from kvcache_spec.conformance.targets import parse_target

TARGET = "python:tests.op_standin:contiguous_positionless_warmup"


def test_a_refusal_is_not_charged_with_an_unjudged_calls_answer() -> None:
    target = parse_target(TARGET)
    flat = tuple(cfg for cfg in layouts.get("op-contiguous").configs
                 if all(entry["kind"] == "flat" for entry in cfg["layers"]))
    try:
        report = report_json(run_suite(target, "quick", configs=flat), True, False)
    finally:
        target.close()
    labels = [finding["label"] for finding in report["semantic"]["findings"]]
    assert labels == ["over-strict OP-ATTEND: at fetch; flat"], labels   # the refusal itself is still found
    assert any("unjudged from that call" in note for note in report["skipped"]), report["skipped"]


def test_the_break_is_the_out_of_scope_calls_alone() -> None:
    """The program the suite used to report: its last call, without the refused one, is outside the scope."""
    target = parse_target(TARGET)
    cfg = next(cfg for cfg in layouts.get("op-contiguous").configs if cfg["n_layers"] == 2
               and all(entry["kind"] == "flat" for entry in cfg["layers"]))
    steps = [{"op": "fetch", "layer": 0, "positions": [0]}, {"op": "fetch", "layer": 1, "positions": [0]},
             {"op": "fetch", "layer": 0, "positions": [0, 1]}, {"op": "fetch", "layer": 1, "positions": [1]}]
    try:
        past = layouts.run_any(target, cfg, steps, True)
        alone = layouts.run_any(target, cfg, [{"op": "fetch", "layer": 1, "positions": [1]}], True)
    finally:
        target.close()
    assert past.finding is not None and past.finding.kind == "over-strict"
    assert past.consequence is not None and past.consequence.safety == "SAFE-OP-ISOLATION"   # what the drive sees
    assert alone.finding is None and alone.unjudged == "step 0"   # the call alone: outside the scope, unjudged
