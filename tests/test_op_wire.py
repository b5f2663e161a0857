"""The op face on the protocol (spec/PROTOCOL.md, "Op-face targets"; wire.py): tensors cross exactly,
a malformed answer is a crash that says what is wrong, and an op target judged out of process gets the
verdict and the findings it gets in process."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcache_spec.conformance import cli, layouts
from kvcache_spec.conformance import wire as op_wire
from kvcache_spec.conformance import scope as scopes
from kvcache_spec.conformance.engine import CRASH
from kvcache_spec.conformance.op.programs import op_config
from kvcache_spec.conformance.serve import Server
from kvcache_spec.conformance.suite import CONFORMING, NOT_CONFORMING, report_json, run_suite
from kvcache_spec.conformance.targets import SubprocessTarget, parse_target

STANDIN = "python:tests.op_standin:{}"


# --- tensors ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(1, 2, 3, 2) * 1001,
    np.array([[3], [4], [5]], dtype=np.int64),
    np.array([[True, False, True]]),
    np.zeros((1, 1, 0, 4), dtype=np.float32),
    np.array([2.0**-24, 16777216.0], dtype=np.float32),
])
def test_a_tensor_crosses_exactly_with_its_dtype_and_shape(array: np.ndarray) -> None:
    wire = json.loads(json.dumps(op_wire.to_wire(array)))
    back = op_wire.from_wire(wire, "k")
    assert back.dtype == array.dtype and back.shape == array.shape and np.array_equal(back, array)


def _tensor(dtype: str, shape: Any, data: Any) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data": data}


@pytest.mark.parametrize("value, says", [
    ([1.0, 2.0], "not a tensor object"),
    (_tensor("bfloat16", [1], [1.0]), 'dtype "bfloat16"'),
    (_tensor("float32", [2, -1], []), "not a list of non-negative integers"),
    (_tensor("float32", [True], [1.0]), "not a list of non-negative integers"),
    (_tensor("float32", [2, 2], [1.0, 2.0, 3.0]), "3 elements; shape [2, 2] needs a flat list of 4"),
    (_tensor("float32", [2], [[1.0], [2.0]]), "not a number"),
    (_tensor("float32", [1 << 20, 2], []), "more than"),
    (_tensor("float32", [1], [True]), "holds true (a boolean), not a number"),
    (_tensor("float32", [1], ["1"]), "not a number"),
    (_tensor("float32", [2], [1.0, 16777217]), "16777217 at element 1, which float32 does not hold exactly"),
    (_tensor("float32", [1], [0.1]), "does not hold exactly"),
    (_tensor("float32", [1], [float("nan")]), "JSON has no NaN"),
    (_tensor("float32", [1], [10**400]), "too large"),
    (_tensor("int64", [1], [1.0]), "not an integer in int64's range"),
    (_tensor("int64", [1], [1 << 63]), "not an integer in int64's range"),
    (_tensor("int64", [1], [False]), "not an integer"),
    (_tensor("bool", [2], [1, 0]), "holds 1, not true or false"),
])
def test_a_malformed_tensor_is_refused_naming_what_and_why(value: Any, says: str) -> None:
    with pytest.raises(op_wire.WireError) as refused:
        op_wire.from_wire(value, "k_hist")
    assert str(refused.value).startswith("k_hist") and says in str(refused.value)


def test_an_answer_crosses_as_k_v_and_a_mask_semantic() -> None:
    class Kind:
        name = "EXPLICIT"

    class Spec:
        kind, mask = Kind(), np.array([[True, False]])

    k, v = np.ones((1, 1, 2, 2), np.float32), np.full((1, 1, 2, 3), 2, np.float32)
    answer = op_wire.answer_from_wire(json.loads(json.dumps(op_wire.answer_to_wire((k, v, Spec())))))
    assert not isinstance(answer, op_wire.Unreadable)
    k_back, v_back, spec = answer
    assert np.array_equal(k_back, k) and np.array_equal(v_back, v) and spec.kind == "EXPLICIT"
    assert spec.mask is not None and spec.mask.tolist() == [[True, False]]
    assert op_wire.answer_from_wire({"unreadable": "why"}) == op_wire.Unreadable("why")
    for wrong in ([], {"k_hist": None}, {"attend": {"kind": 1}}):
        with pytest.raises(op_wire.WireError):
            op_wire.answer_from_wire(wrong)


def test_the_server_refuses_a_malformed_tensor_argument_as_a_protocol_error() -> None:
    server = Server(STANDIN.format("contiguous"))
    config = {"n_layers": 1, "n_kv_heads": 1, "head_dim": 1, "v_head_dim": 1, "batch_size": 1, "capacity": 4,
              "sizing": "dynamic", "layers": [{"kind": "flat", "window": 0}]}
    assert server.handle({"id": 1, "method": "create", "params": {"config": config}}) == {"id": 1, "result": None}
    k = _tensor("float32", [1, 1, 1, 1], [1.0])
    bad = server.handle({"id": 2, "method": "update_and_fetch",
                         "params": {"layer_id": 0, "k": k, "v": _tensor("float32", [1, 1, 1, 1], []),
                                    "position": _tensor("int64", [1, 1], [0])}})
    assert bad is not None and bad["error"]["kind"] == "protocol" and bad["error"]["message"].startswith("v: data")
    good = server.handle({"id": 3, "method": "update_and_fetch",
                          "params": {"layer_id": 0, "k": k, "v": k, "position": _tensor("int64", [1, 1], [0])}})
    assert good is not None and good["result"]["k_hist"] == k   # the refused call changed nothing
    assert server.handle({"id": 4, "method": "reset", "params": {}}) == {"id": 4, "result": None}
    assert server.handle({"id": 5, "method": "used", "params": {"layer_id": 0}}) == {"id": 5, "result": 0}


# --- the suite out of process -------------------------------------------------------------------------

def _findings(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(f["class"], f["rule"], json.dumps(f["steps"])) for f in report["semantic"]["findings"]]


@pytest.mark.slow   # about a fifth of the default run's time: each runs the quick profile twice; the wire's verdicts stay in the fast tests below
@pytest.mark.parametrize("name", ["cell", "contiguous", "cell_replaces", "cell_keeps_stopped_step",
                                  "contiguous_causal_always", "cell_window_off_by_one"])
def test_an_op_target_out_of_process_gets_the_verdict_and_findings_it_gets_in_process(name: str) -> None:
    reports = []
    for isolate in (False, True):
        target = parse_target(STANDIN.format(name), isolate=isolate)
        try:
            reports.append(report_json(run_suite(target, "quick", seed=0), True, False))
        finally:
            target.close()
    inside, outside = reports
    assert outside["verdict"] == inside["verdict"] == (CONFORMING if name in ("cell", "contiguous") else NOT_CONFORMING)
    assert _findings(outside) == _findings(inside)
    assert outside["coverage"]["rules"] == inside["coverage"]["rules"]


def _hostile(defect: str) -> dict[str, Any]:
    target = SubprocessTarget(f"cmd:{sys.executable} -m tests.op_wire_hostile {defect}", timeout=5.0)
    try:
        return report_json(run_suite(target, "quick", seed=0), True, False)
    finally:
        target.close()


@pytest.mark.parametrize("defect, says", [
    ("inexact", "which float32 does not hold exactly"),
    ("bool-number", "holds true (a boolean), not a number"),
    ("short", "k_hist: data is"),
    ("mask-ints", "attend.mask: bool data holds 1, not true or false"),
    ("not-an-object", "update_and_fetch answered a list"),
])
def test_an_answer_that_is_not_a_tensor_on_the_wire_is_a_protocol_crash(defect: str, says: str) -> None:
    # one program, not the suite: a crash restarts the target for every program (~12 s a suite)
    target = SubprocessTarget(f"cmd:{sys.executable} -m tests.op_wire_hostile {defect}", timeout=5.0)
    try:
        run = layouts.run_any(target, op_config(4), [{"op": "fetch", "layer": 0, "positions": [0, 1]}])
    finally:
        target.close()
    assert run.finding is not None and run.finding.kind == CRASH, run.finding
    assert "): protocol: " in run.finding.message and says in run.finding.message, run.finding


@pytest.mark.parametrize("defect, rule, says", [
    ("float64", "OP-HIST", "float64"),
    ("swap-rows", "OP-ATTEND", "are not one token's"),
    ("unreadable", "OP-HIST", "no wire form: a tuple of two"),
])
def test_a_well_formed_wrong_answer_is_judged_not_crashed(defect: str, rule: str, says: str) -> None:
    report = _hostile(defect)
    assert report["verdict"] == NOT_CONFORMING
    assert not [f for f in report["semantic"]["findings"] if f["class"] == "crash"], _findings(report)
    found = [f for f in report["semantic"]["findings"] if (f["class"], f["rule"]) == ("wrong", rule)]
    assert found and says in found[0]["message"], _findings(report)


# --- a partial op scope is said, in process and on the wire ---------------------------------------------

def test_an_op_scope_without_positions_is_partial_in_the_report_and_in_the_hello(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An op target that leaves out `positions` must not read as the whole spec: the report's scope is
    not full, the verdict line says "within the scope", and the served hello carries the scope. (Before,
    `full` looked at the sequence features only: such a target's report said full, and --isolate lost
    the scope, judging it on positions it had declared it does not read.)"""
    partial = scopes.parse(["flat", "ring", "mla", "steps"], "test")
    assert not partial.full_for("op-contiguous")
    sequence_whole = scopes.parse(["flat", "ring", "max_write"], "test")
    assert sequence_whole.full_for("sequence") and sequence_whole.full_for("cell")
    assert not sequence_whole.full_for("op-contiguous")
    assert scopes.parse(["flat", "ring", "max_write", "batch", "mla", "positions", "steps", "trim", "sinks"],
                        "test").full_for("op-contiguous")
    assert scopes.parse(["flat", "ring", "max_write", "batch", "mla", "positions", "steps"], "test").full_for(
        "op-contiguous")   # the whole of spec 1, which had no trim and no sinks (scope.SPEC_VERSIONS)
    assert not scopes.parse(["flat", "ring", "max_write", "batch", "mla", "positions", "steps", "spec=2"],
                            "test").full_for("op-contiguous")   # spec 2 without its additive features trim and sinks
    assert not scopes.parse(["flat", "ring", "max_write", "mla", "positions", "steps"], "test").full_for(
        "op-contiguous")   # batch 1 only is a partial scope too
    assert not scopes.parse(["flat", "ring", "mla", "positions", "steps"], "test").full_for("op-cell")
    assert all(scopes.FULL.full_for(layout) for layout in scopes.LAYOUT_FEATURES)

    spec = "python:tests.op_wire_hostile:contiguous_without_positions"
    assert cli.main(["--target", spec, "--strict", "--json", str(tmp_path / "report.json")]) == 0
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict == "  CONFORMING (strict) within the scope flat,ring,max_write,batch,mla,steps,trim,sinks only", \
        verdict
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["scope"]["full"] is False
    # OP-POS is not owed (only `positions` defines it: it was INCOMPLETE before), and no sequence
    # golden vector's bug class is claimed as left out for an op target
    assert "'positions'" in report["coverage"]["rules"]["out_of_scope"]["OP-POS"]
    assert report["scope"]["unexercised"] == {"families": {}, "rules": [], "bug_classes": []}
    server = Server(spec)
    hello = server.handle({"id": 1, "method": "hello", "params": {"versions": [1]}})
    assert hello is not None and hello["result"]["scope"] == ["flat", "ring", "max_write", "batch", "mla", "steps",
                                                              "trim", "sinks"]


def test_the_exhaustive_op_checker_takes_a_cmd_target(capsys: pytest.CaptureFixture[str]) -> None:
    """The checker drives a target over the protocol as it drives one in process: the same shortest program."""
    from kvcache_spec.conformance.op import checker as op_checker

    served = f"cmd:{sys.executable} -m kvcache_spec.conformance.serve " + STANDIN.format("cell_window_off_by_one")
    assert op_checker.main(["--target", served, "--depth", "3"]) == 1
    over_the_wire = json.loads(capsys.readouterr().out)
    in_process = op_checker.check(parse_target(STANDIN.format("cell_window_off_by_one")), 3).summary()
    assert over_the_wire["findings"] == in_process["findings"] != []
    assert (over_the_wire["states"], over_the_wire["programs"]) == (in_process["states"], in_process["programs"])
    assert op_checker.main(["--target", "cmd:/nonexistent/op-server"]) == 2
    assert "cannot start" in capsys.readouterr().err
