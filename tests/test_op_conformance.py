"""The op face: its model (spec/op_model.py) rule by rule, and the suite judging op-face targets.

The targets are tests/op_standin.py's numpy stand-in (written apart from the model) and its broken
variants; the released upstream is judged in tests/test_upstream_op.py (it needs torch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcache_spec import op_model
from kvcache_spec.conformance import layouts, scope as scopes
from kvcache_spec.conformance.cli import main as conformance_main
from kvcache_spec.conformance.op.engine import Labels
from kvcache_spec.conformance.op.programs import CELL_CONFIGS, CONTIGUOUS_CONFIGS, op_config
from kvcache_spec.conformance.suite import CONFORMING, NOT_CONFORMING, replay, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget, SubprocessTarget, parse_target

STANDIN = "python:tests.op_standin:{}"


def _cfg(kind: str = op_model.CELL, **extra: Any) -> op_model.OpConfig:
    made = op_model.make_config({**op_config(8, (0,), n_layers=2), **extra}, kind)
    assert isinstance(made, op_model.OpConfig)
    return made


def _shapes(cfg: op_model.OpConfig, q: int, dv: int = 0) -> op_model.Shapes:
    return op_model.Shapes((cfg.batch_size, cfg.n_kv_heads, q, cfg.head_dim),
                           (cfg.batch_size, cfg.n_kv_heads, q, dv or cfg.v_head_dim), (q, 1))


def _forward(m: op_model.OpModel, seqs: list[int], positions: list[int], first_uid: int) -> list[Any]:
    """A cell step on every layer: the attends of each layer."""
    assert m.begin_step(seqs) is None
    uids = list(range(first_uid, first_uid + len(seqs)))
    return [m.fetch(layer, _shapes(m.cfg, len(seqs)), positions, uids) for layer in range(m.cfg.n_layers)]


# --- the model, rule by rule ------------------------------------------------------------------------

def test_OP_ATTEND_a_query_attends_its_own_sequence_inside_its_window() -> None:
    """OP-ATTEND: own sequence only, positions <= the query's, and on a ring only the newest w."""
    m = op_model.OpModel(_cfg(layers=[{"kind": "flat", "window": 0}, {"kind": "ring", "window": 2}]))
    flat, ring = _forward(m, [0, 0, 1], [0, 1, 0], 0)
    assert flat == [[0], [0, 1], [2]] and ring == [[0], [0, 1], [2]]
    flat, ring = _forward(m, [0], [2], 3)
    assert flat == [[0, 1, 3]] and ring == [[1, 3]]


def test_OP_ATTEND_a_fork_shares_and_a_removal_drops() -> None:
    """OP-ATTEND, OP-FORK, OP-RM: dst attends src's prefix below upto; removing from src keeps dst's."""
    m = op_model.OpModel(_cfg())
    _forward(m, [0, 0, 0], [0, 1, 2], 0)
    assert m.seq_cp(0, 1, 2) is None and m.seq_rm(0) is None
    assert _forward(m, [1], [2], 3)[0] == [[0, 1, 3]] and m.seq_len(0) == 0 and m.free_cells() == 5


def test_OP_MASK_and_OP_HIST_are_read_by_the_engine_from_labels() -> None:
    """OP-MASK, OP-HIST: labels name (uid, layer, batch, head, dim, K or V) exactly, in float32."""
    labels = Labels(_cfg(kind=op_model.CONTIGUOUS, batch_size=2, n_kv_heads=2))
    k = labels.array([5, 9], 1, (2, 2, 2, 2), 0)
    v = labels.array([5, 9], 1, (2, 2, 2, 2), 1)
    assert k.dtype == np.float32 and not np.array_equal(k, v) and len(np.unique(k)) == k.size
    assert labels.uid_of(k[1, 0], 1, 1, 0, 0).tolist() == [5, 9]
    assert labels.uid_of(k[1, 0], 0, 1, 0, 0).tolist() == [-1, -1]     # another layer's rows are not these
    assert labels.uid_of(v[1, 0], 1, 1, 0, 0).tolist() == [-1, -1]     # V is not K


def test_OP_ARGS_shapes_layer_ids_and_empty_steps_are_refused() -> None:
    """OP-ARGS: k/v/position shapes, layer_id an int in range (not bool), q_len >= 1."""
    cfg = _cfg(kind=op_model.CONTIGUOUS, v_head_dim=3)
    m = op_model.OpModel(cfg)
    for layer in (2, -1, True):
        assert isinstance(m.fetch(layer, _shapes(cfg, 1), [0], [0]), op_model.Rejected)
    assert m.fetch(0, _shapes(cfg, 1, dv=2), [0], [0]) == op_model.Rejected(
        "OP-ARGS", "k [1, 1, 1, 2] / v [1, 1, 1, 2] are not [1, 1, 1, 2] / [1, 1, 1, 3]", case="v width")
    assert isinstance(m.fetch(0, _shapes(cfg, 0), [], []), op_model.Rejected)
    assert m.fetch(0, _shapes(cfg, 1), [0], [0]) == [[0]]   # MLA: a value width of its own is served


def test_OP_POS_replaced_older_negative_and_huge_positions_are_refused() -> None:
    """OP-POS: re-placed, out of order, -1 (the free marker) and past 2**31 - 2 are refused."""
    m = op_model.OpModel(_cfg())
    _forward(m, [0, 0], [0, 1], 0)
    for seqs, positions in (([0], [1]), ([0, 0], [3, 2]), ([1], [-1]), ([1], [2**31 - 1])):
        assert m.begin_step(seqs) is None
        refused = m.fetch(0, _shapes(m.cfg, len(seqs)), positions, [9] * len(seqs))
        assert isinstance(refused, op_model.Rejected) and refused.rule == "OP-POS", refused
    c = op_model.OpModel(_cfg(kind=op_model.CONTIGUOUS))
    refused = c.fetch(0, _shapes(c.cfg, 1), [1], [0])    # a gap: the contiguous row is its position
    assert isinstance(refused, op_model.Rejected) and refused.feature == "positions"


def test_OP_STEP_a_stopped_step_leaves_nothing() -> None:
    """OP-STEP: a step not every layer served is abandoned by a verb or a new declaration."""
    m = op_model.OpModel(_cfg())
    assert m.begin_step([0, 0]) is None and m.fetch(0, _shapes(m.cfg, 2), [0, 1], [0, 1]) == [[0], [0, 1]]
    assert m.seq_len(0) == 2 and m.seq_cp(0, 1, None) is None
    assert m.seq_len(0) == 0 and m.seq_len(1) == 0 and m.free_cells() == 8
    refused = m.fetch(1, _shapes(m.cfg, 2), [0, 1], [0, 1])
    assert isinstance(refused, op_model.Rejected) and refused.rule == "OP-STEP"
    assert m.begin_step([0]) is None and m.fetch(0, _shapes(m.cfg, 1), [0], [5]) == [[5]]
    refused = m.fetch(0, _shapes(m.cfg, 1), [0], [5])   # served twice
    assert isinstance(refused, op_model.Rejected) and refused.rule == "OP-STEP"
    # a declaration no layer has used is dropped by a verb too (the `declarations` scope feature)
    assert m.begin_step([1]) is None and m.seq_rm(0) is None
    refused = m.fetch(0, _shapes(m.cfg, 1), [0], [6])
    assert isinstance(refused, op_model.Rejected) and refused.feature == "declarations"


def test_OP_FORK_needs_an_empty_destination_other_than_the_source() -> None:
    """OP-FORK: src == dst, a live dst, a negative upto are refused."""
    m = op_model.OpModel(_cfg())
    _forward(m, [0, 1], [0, 0], 0)
    assert [r.rule for r in (m.seq_cp(0, 0, None), m.seq_cp(0, 1, None), m.seq_cp(0, 2, -1)) if r] == ["OP-FORK"] * 3


def test_OP_RM_ranges_are_checked_and_shared_tokens_stay() -> None:
    """OP-RM: p0 >= 0 and p1 >= p0; removing from one owner keeps the other's."""
    m = op_model.OpModel(_cfg())
    _forward(m, [0, 0], [0, 1], 0)
    assert m.seq_rm(0, -1, None) is not None and m.seq_rm(0, 2, 1) is not None
    assert m.seq_cp(0, 1, None) is None and m.seq_rm(0, 1, None) is None
    assert (m.seq_len(0), m.seq_len(1), m.free_cells()) == (1, 2, 6)


def test_OP_CAP_capacity_is_refused_before_anything_changes() -> None:
    """OP-CAP: contiguous held + q_len <= capacity; cell begin_step <= free cells."""
    c = op_model.OpModel(_cfg(kind=op_model.CONTIGUOUS, capacity=2, n_layers=1))
    refused = c.fetch(0, _shapes(c.cfg, 3), [0, 1, 2], [0, 1, 2])
    assert isinstance(refused, op_model.Rejected) and refused.rule == "OP-CAP" and c.used(0) == 0
    m = op_model.OpModel(_cfg(capacity=2))
    refused_step = m.begin_step([0, 0, 0])
    assert refused_step is not None and refused_step.rule == "OP-CAP"


def test_OP_BATCH_and_OP_CONFIG() -> None:
    """OP-BATCH, OP-CONFIG: a cell cache needs batch 1; sizes are ints >= 1; policies are valid."""
    assert op_model.make_config({**op_config(4), "batch_size": 2}, op_model.CELL) == \
        op_model.Rejected("OP-BATCH", "a cell cache needs batch_size 1")
    assert isinstance(op_model.make_config({**op_config(4), "batch_size": 2}, op_model.CONTIGUOUS), op_model.OpConfig)
    for change in ({"capacity": 0}, {"n_layers": True}, {"n_kv_heads": 0}, {"layers": [{"kind": "ring", "window": 0}]}):
        made = op_model.make_config({**op_config(4), **change}, op_model.CONTIGUOUS)
        assert isinstance(made, op_model.Rejected) and made.rule == "OP-CONFIG"


def test_OP_ATOMIC_a_refused_call_changes_nothing_in_the_model() -> None:
    """OP-ATOMIC: a refused declaration keeps the pending step; a refused fetch keeps the declaration."""
    m = op_model.OpModel(_cfg())
    assert m.begin_step([0, 0]) is None
    assert isinstance(m.fetch(0, _shapes(m.cfg, 3), [0, 1, 2], [0, 1, 2]), op_model.Rejected)
    assert m.fetch(0, _shapes(m.cfg, 2), [0, 1], [0, 1]) == [[0], [0, 1]]


# --- the suite on op-face targets -------------------------------------------------------------------

def _report(spec: str, **options: Any) -> dict[str, Any]:
    return report_json(run_suite(PythonTarget(spec), "quick", **options), True, False)


@pytest.mark.parametrize("name", ["cell", "contiguous"])
def test_the_standin_is_conforming_strict_with_full_coverage(name: str) -> None:
    report = _report(STANDIN.format(name))
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:1]
    rules = report["coverage"]["rules"]
    assert not rules["not_exercised"] and {"OP-ATTEND", "OP-ATOMIC", "OP-POS"} <= set(rules["exercised"])
    assert all(rule.startswith("OP-") or rule == "SCOPE-BORDER" for rule in rules["exercised"])


BROKEN = {"cell_replaces": ("lenient", "OP-POS"), "cell_keeps_stopped_step": ("wrong", "OP-STEP"),
          "contiguous_causal_always": ("wrong", "OP-MASK"), "cell_window_off_by_one": ("wrong", "OP-ATTEND"),
          # consequences (consequences.py): the harm a lenient step does, past it
          "cell_minus_one_is_free": ("wrong", "OP-ATTEND"), "contiguous_bool_layer": ("wrong", "OP-ATTEND")}
# the safety property each consequence breaks, and the lenient step it follows
CONSEQUENCES = {"cell_minus_one_is_free": ("SAFE-OP-KEEP", "lenient OP-POS in update_and_fetch"),
                "contiguous_bool_layer": ("SAFE-OP-ISOLATION", "lenient OP-ARGS in update_and_fetch")}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_standin_is_caught_with_a_minimal_program_that_replays(name: str) -> None:
    spec = STANDIN.format(name)
    report = _report(spec)
    assert report["verdict"] == NOT_CONFORMING
    found = [f for f in report["semantic"]["findings"] if (f["class"], f["rule"]) == BROKEN[name]]
    assert found, [(f["class"], f["rule"]) for f in report["semantic"]["findings"]]
    first = min(found, key=lambda f: len(f["steps"]))
    assert len(first["steps"]) <= 6, first["steps"]
    json.dumps(first)   # the steps are JSON
    again = replay(spec, first["config"], first["steps"])
    assert again is not None and (again["class"], again["rule"]) == BROKEN[name]
    assert again["message"] == first["message"]   # the words belong to the steps shown
    if name in CONSEQUENCES:
        assert (first.get("safety"), first["after"]) == CONSEQUENCES[name], first
        assert first["message"].startswith(f"{CONSEQUENCES[name][0]} broken after the lenient")
    else:
        assert not first["after"]
    correct = STANDIN.format("cell" if name.startswith("cell") else "contiguous")
    assert replay(correct, first["config"], first["steps"]) is None


def test_a_scope_without_positions_is_not_judged_on_positions() -> None:
    """SCOPE-BORDER for programs: a contiguous target that does not read positions is not judged on them."""
    spec = STANDIN.format("contiguous")
    program = [{"op": "fetch", "layer": 0, "positions": [5]}]
    target = PythonTarget(spec)
    target.scope = scopes.parse(["flat", "ring", "max_write", "mla", "steps"], "test")

    # a cache that places at its used length whatever the position: lenient in the full scope,
    # unjudged in a scope without `positions`
    lax_target = PythonTarget(spec)
    inner = lax_target.factory

    def lax(cfg: dict[str, Any]) -> Any:
        cache = inner(cfg)
        original = cache.update_and_fetch

        def fetch(layer_id: Any, k: Any, v: Any, position: Any) -> Any:
            held = cache.used(layer_id)
            return original(layer_id, k, v, np.arange(held, held + np.shape(position)[0]).reshape(-1, 1))
        cache.update_and_fetch = fetch
        return cache
    lax_target.factory = lax
    assert layouts.run_any(lax_target, op_config(4), program).finding.key() == ("lenient", "OP-POS")   # type: ignore[union-attr]
    lax_target.scope = target.scope
    unjudged = layouts.run_any(lax_target, op_config(4), program)
    assert unjudged.finding is None and any("positions" in note for note in unjudged.skipped)


def test_a_trim_left_out_by_the_scope_leaves_no_gap_in_a_findings_program() -> None:
    """A trim step sent to no target without `trim` is left out of the program itself: the finding's step index is
    its place in what was sent, its program ends with the failing call, and replaying that program shows it
    (upstream's contiguous cache has no trim; its causes past a trim once lost their failing step)."""
    target = PythonTarget("python:tests.lenient_standin:op.update_and_fetch.v.q_len")
    target.scope = scopes.parse(["flat", "ring", "max_write", "batch", "mla", "positions", "steps"], "test")
    fetch = {"op": "fetch", "layer": 0, "n": 1, "clause": "op.update_and_fetch.v.q_len", "variant": "0"}
    result = layouts.run_any(target, op_config(1), [{"op": "trim", "n": 0}, fetch])
    assert result.finding is not None and result.finding.key() == ("lenient", "OP-ARGS"), result.finding
    assert result.finding.step_index == 0 and [step["op"] for step in result.steps] == ["fetch"], result.steps
    assert any("'trim'" in note for note in result.skipped)
    again = layouts.run_any(target, op_config(1), result.steps)
    assert again.finding is not None and again.finding.message == result.finding.message


def test_an_mla_config_is_outside_a_scope_without_mla() -> None:
    assert scopes.needs(op_config(4, v_head_dim=3)) == {"flat", "mla"}
    assert not scopes.parse(["flat"], "test").covers(op_config(4, v_head_dim=3))


def test_the_cli_judges_an_op_target_with_json_and_junit(tmp_path: Path) -> None:
    out, junit = tmp_path / "r.json", tmp_path / "r.xml"
    code = conformance_main(["--target", STANDIN.format("cell_replaces"), "--strict", "--json", str(out),
                             "--junit", str(junit), "--save-findings", str(tmp_path / "saved")])
    report = json.loads(out.read_text())
    assert code == 1 and report["verdict"] == NOT_CONFORMING and "OP-POS" in junit.read_text()
    assert any("--save-findings" in note for note in report["skipped"])
    assert not (tmp_path / "saved").exists()   # nothing saved: no empty directory left behind (issue 35)
    assert report["layout"]["applies"] is False   # no canonical layout on the op face
    isolated = parse_target(STANDIN.format("cell"), isolate=True)   # served over the protocol (test_op_wire.py)
    try:
        isolated.declared_scope()
        assert isinstance(isolated, SubprocessTarget) and isolated.layout == "op-cell"
    finally:
        isolated.close()


def test_the_op_configs_are_valid_and_their_layouts_registered() -> None:
    for kind, configs in ((op_model.CONTIGUOUS, CONTIGUOUS_CONFIGS), (op_model.CELL, CELL_CONFIGS)):
        assert all(isinstance(op_model.make_config(cfg, kind), op_model.OpConfig) for cfg in configs)
    assert {"op-contiguous", "op-cell"} <= set(layouts.registry())


def test_the_op_target_contract_names_every_config_key_the_suite_sends() -> None:
    """docs/target-contract.md's op target contract and PROTOCOL.md's op-face section say what each key of an
    op config means (or that a target may ignore it): every key the suite's op configs and their layer entries
    carry, the invalid ones included. A key added to the configs without a word in both fails here."""
    from pathlib import Path

    from kvcache_spec import specdoc
    from kvcache_spec.conformance.op.programs import BAD_OP_CONFIGS

    page = (Path(__file__).resolve().parent.parent / "docs" / "target-contract.md").read_text()
    contract = page[page.index("\n### The op target contract"):page.index("\n## Plans, commits")]
    protocol = specdoc.SPEC_PATH.with_name("PROTOCOL.md").read_text()
    protocol = protocol[protocol.index("\n## Op-face targets"):protocol.index("\n## Example session")]
    configs = [*CONTIGUOUS_CONFIGS, *CELL_CONFIGS, *(cfg for _, cfg in BAD_OP_CONFIGS)]
    keys = {key for cfg in configs for key in cfg} | {key for cfg in configs if isinstance(cfg["layers"], list)
                                                      for entry in cfg["layers"] for key in entry}
    assert {"capacity", "layers", "sizing", "initial_capacity", "max_write", "v_head_dim"} <= keys
    for key in sorted(keys):
        named = (f"`{key}`", f'"{key}"')   # as a name, or as a JSON key
        assert any(name in contract for name in named), f"the op target contract does not say what the op config's {key!r} means"
        assert any(name in protocol for name in named), f"PROTOCOL.md does not name the op config's {key!r}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cell", "contiguous"])
def test_the_project_op_reference_is_conforming_strict(name: str) -> None:
    """kvcache.op (the project's reference of the op face) passes the whole op-face suite, strict."""
    report = _report(f"python:kvcache_spec.conformance.op.targets:{name}")
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:1]
    assert not report["coverage"]["incomplete"]


# --- the exhaustive checker ---------------------------------------------------------------------------

@pytest.mark.slow   # the exhaustive checker to depth 4 (about 50 s on a busy machine); the engine's own tests stay fast
def test_the_exhaustive_checker_passes_the_standin_and_finds_each_broken_one_shortest() -> None:
    """OP-ATTEND, OP-STEP over every program of the alphabet up to depth 4 (deduplicated by the model's state
    with what it let go)."""
    from kvcache_spec.conformance.op.checker import check
    clean = check(PythonTarget(STANDIN.format("cell")), 4)
    assert not clean.findings and clean.states > 1000 and clean.programs > clean.states
    expected = {"cell_keeps_stopped_step": (("wrong", "OP-STEP"), 3), "cell_window_off_by_one": (("wrong", "OP-ATTEND"), 2)}
    for name, (key, length) in expected.items():
        found = check(PythonTarget(STANDIN.format(name)), 4).findings
        assert key in found and len(found[key][1]) == length, (name, found)
    assert not check(PythonTarget(STANDIN.format("contiguous")), 5).findings


@pytest.mark.slow
def test_the_exhaustive_checker_finds_a_replaced_position_at_depth_5() -> None:
    from kvcache_spec.conformance.op.checker import check
    found = check(PythonTarget(STANDIN.format("cell_replaces")), 5).findings
    assert ("lenient", "OP-POS") in found and len(found[("lenient", "OP-POS")][1]) == 5, found


@pytest.mark.parametrize("name, key, depth", [
    # a whole step on both layers, a reset, a step: 4 calls (its rows are kept only once the step is whole)
    ("contiguous_reset_keeps_flat_rows", ("wrong", "OP-ATTEND"), 4),
    # the refused call, then a call that shows its row
    ("contiguous_keeps_refused_rows", ("wrong", "OP-ATOMIC"), 2)])
def test_the_exhaustive_checker_goes_on_after_a_reset_and_after_a_refusal(name: str, key: Any, depth: int) -> None:
    """Issue 35: deduplicating by the model's state alone never ran a program past a reset or a refused call
    (the model is back where it was; the target need not be). Each is found at the smallest depth that shows
    it, with a program of that length, and not one step earlier."""
    from kvcache_spec.conformance.op.checker import check
    target = PythonTarget(STANDIN.format(name))
    found = check(target, depth).findings
    assert key in found and len(found[key][1]) == depth, found
    assert not check(target, depth - 1).findings


# --- issue 26: a newcomer's two mutants fail without --strict, each with the rule that names it ---------

def test_a_reset_that_forgets_the_length_fails_without_strict() -> None:
    """reset() that keeps the old length: position 0 after it refused (over-strict), the old length served
    (lenient OP-POS), and past that step a ring query attends nothing, not even its own token: wrong
    OP-ATTEND by SAFE-OP-SELF, whatever came before. Over-strict and wrong both fail a run without --strict."""
    spec = STANDIN.format("contiguous_reset_keeps_length")
    result = run_suite(PythonTarget(spec), "quick", seed=0)
    assert ("over-strict", "OP-ATTEND") in result.findings
    assert result.verdict() == NOT_CONFORMING   # the over-strict refusal alone fails it
    # the lenient OP-POS and the wrong answer past it: quick's derived positions do not present the old length
    # after a reset at seed 0 (pre-merge's do, in 5 steps); the replay below shows both
    ring = op_config(1, (1,))
    steps = [{"op": "fetch", "layer": 0, "positions": [0]}, {"op": "reset"},
             {"op": "fetch", "layer": 0, "positions": [1], "case": "OP-POS continue"}]
    again = replay(spec, ring, steps)
    assert again is not None and (again["class"], again["rule"], again["after"]) == (
        "wrong", "OP-ATTEND", "lenient OP-POS in update_and_fetch"), again
    assert again["message"].startswith("SAFE-OP-SELF broken") and "does not attend its own token" in again["message"]
    assert replay(STANDIN.format("contiguous"), ring, steps[:2] + [{"op": "fetch", "layer": 0}]) is None


@pytest.mark.slow   # 2-7 s: the slow stage (the default run's time, README); its rule keeps a fast test beside it
def test_a_refused_exact_fit_is_over_strict_OP_CAP_and_fails_without_strict(capsys: pytest.CaptureFixture[str]) -> None:
    """A capacity check off by one refuses a step that exactly fills the capacity: the refusal is classed
    by the bound it sits on (OP-CAP, not the call's own OP-ATTEND), and fails the run without --strict."""
    spec = STANDIN.format("contiguous_refuses_exact_fit")
    assert conformance_main(["--target", spec]) == 1
    out = capsys.readouterr().out
    assert "over-strict OP-CAP" in out and out.rstrip().endswith("NOT CONFORMING")
    result = run_suite(PythonTarget(spec), "quick", seed=0)
    assert set(result.findings) == {("over-strict", "OP-CAP")}
    kept = result.findings[("over-strict", "OP-CAP")]
    assert replay(spec, kept.config, kept.steps) is not None
    assert replay(STANDIN.format("contiguous"), kept.config, kept.steps) is None


def test_a_refusal_naming_an_op_rule_is_classed_by_it() -> None:
    """The rule a target's refusal names is the rule it is classed by (the reference's errors name theirs)."""
    from kvcache_spec.conformance.op.engine import OpEngine
    from kvcache_spec.conformance.targets import Outcome

    engine = OpEngine(PythonTarget(STANDIN.format("contiguous")), op_config(8, (0,)), op_model.CONTIGUOUS)
    assert engine.refused_by("update_and_fetch", {"layer_id": 0}, "OP-ATTEND",
                             Outcome(False, None, "ValueError: OP-POS: a gap at 3")) == "OP-POS"
    assert engine.refused_by("update_and_fetch", {"layer_id": 0}, "OP-ATTEND",
                             Outcome(False, None, "ValueError: CELL-POS is not an op rule")) == "OP-ATTEND"


def test_a_call_of_no_token_served_is_lenient_with_no_consequence() -> None:
    """A step malformed to q_len 0 carries no token, so it has no query: served, it is lenient OP-ARGS and
    nothing more. The consequence drive had judged it as its step's positions' tokens: a query that 'does
    not attend its own token' (a false SAFE-OP-SELF, seen on upstream's contiguous cache)."""
    spec = STANDIN.format("contiguous_serves_empty_step")
    steps = [{"op": "fetch", "layer": 0, "positions": [0]},
             {"op": "fetch", "layer": 0, "positions": [1], "clause": "op.update_and_fetch.q_len", "variant": "0",
              "case": "OP-ARGS q_len 0"}]
    again = replay(spec, op_config(2), steps)
    assert again is not None and (again["class"], again["rule"]) == ("lenient", "OP-ARGS"), again
    assert replay(STANDIN.format("contiguous"), op_config(2), steps) is None   # refused by the correct stand-in
