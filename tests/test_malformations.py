"""Every argument clause's malformations (spec/arguments.py, derived by conformance/malform.py) are found:
on a stand-in that is the reference except that it accepts every malformed value of that clause's argument
(tests/lenient_standin.py), the suite's edge programs report a finding whose program breaks the clause."""

from __future__ import annotations

import pytest

from kvcache_spec.arguments import BY_ID, CLAUSES, CONFIG, of_face
from kvcache_spec.conformance import malform, suite
from kvcache_spec.conformance.targets import PythonTarget

# The edge programs only (every clause is broken there), once per configuration of the layout.
EDGES = suite.Profile(0, 1, 200, 600.0, 8, 1 << 23)


# One argument clause per face runs by default (the default run's time, README);
# every clause with -m slow (about 5 minutes on the busy machine).
DEFAULT = {"op.seq_rm.p1", "sequence.plan.layer", "cell.place_step.positions"}   # configurations: the slow stage


@pytest.mark.parametrize("clause", [pytest.param(clause.id, marks=() if clause.id in DEFAULT else pytest.mark.slow)
                                    for clause in CLAUSES])
def test_the_suite_finds_a_target_that_accepts_a_clauses_malformations(clause: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(suite.PROFILES, "edges", EDGES)
    target = PythonTarget(f"python:tests.lenient_standin:{clause}")
    try:
        result = suite.run_suite(target, "edges")
    finally:
        target.close()
    kept = [r for rs in result.causes.values() for r in rs]
    if BY_ID[clause].kind == CONFIG:   # an invalid configuration accepted: lenient at create, naming its case
        breaking = [r for r in kept if (r.finding.kind, r.finding.rule) == ("lenient", BY_ID[clause].rule)
                    and f"; {clause} " in r.finding.message]
        # an accepted invalid configuration was sent all the same: coverage counts its case as broken
        assert malform.CLAUSE_PREFIX + clause in result.exercised, sorted(result.exercised)[:20]
    else:   # a step tagged with the clause; or, for a rule no other clause has (OP-MAX-WRITE), a lenient finding
        # of that rule - another program (a trim edge's long prefill) may have shown the cause first, untagged
        only = [c.id for c in CLAUSES if c.rule == BY_ID[clause].rule] == [clause]
        breaking = [r for r in kept if any(step.get("clause") == clause for step in r.steps)
                    or (only and (r.finding.kind, r.finding.rule) == ("lenient", BY_ID[clause].rule))]
    assert breaking, (clause, [(r.finding.kind, r.finding.rule, r.steps[-1:]) for r in kept])
    assert result.verdict(strict=True) == suite.NOT_CONFORMING


def test_every_face_has_clauses_and_every_clause_derives_cases() -> None:
    for face in ("sequence", "cell", "op-contiguous", "op-cell"):
        assert of_face(face)
        derived = {case.clause.id for case in malform.cases(face, {"batch_size": 2, "n_kv_heads": 2, "head_dim": 2,
                                                                   "v_head_dim": 3, "max_write": 2,
                                                                   "layers": [{"kind": "ring", "window": 3}]})}
        derived |= {case.clause.id for case, _ in malform.config_cases(face)}
        assert derived == {clause.id for clause in of_face(face)}, face


MAX_WRITE = "op.update_and_fetch.q_len.max_write"


def test_the_max_write_clause_binds_only_a_config_whose_steps_max_write_bounds() -> None:
    """OP-MAX-WRITE bounds a step only with max_write set and a ring layer: elsewhere it has no case."""
    ring, flat = {"kind": "ring", "window": 3}, {"kind": "flat", "window": 0}
    for layers, max_write, bound in (([ring, flat], 2, True), ([ring], None, False), ([flat], 2, False)):
        found = [case.variant for case in malform.cases("op-contiguous", {"layers": layers, "max_write": max_write})
                 if case.clause.id == MAX_WRITE]
        assert found == (["above"] if bound else []), (layers, max_write)


# --- issue 35: malformations at the sizes that matter, alone and together --------------------------------

def test_the_token_axis_is_broken_in_a_step_of_several_tokens_and_k_and_v_together() -> None:
    """A 1 and an n-1 on the token axis are malformations only in a step longer than one: derived there too;
    K and V that agree with each other (and not with position or the config) are cases of their own."""
    cfg = {"batch_size": 2, "n_kv_heads": 1, "head_dim": 2, "v_head_dim": 2, "layers": [{"kind": "flat", "window": 0}]}
    names = {case.name for case in malform.cases("op-contiguous", cfg)}
    assert {f"op.update_and_fetch.v.q_len 1 at q_len {malform.MULTI_TOKEN}",
            f"op.update_and_fetch.k.q_len n-1 at q_len {malform.MULTI_TOKEN}",
            f"op.update_and_fetch.kv.q_len 1 at q_len {malform.MULTI_TOKEN}",
            "op.update_and_fetch.kv.batch 1", "op.update_and_fetch.kv.heads n+1"} <= names
    assert len(names) == len(malform.cases("op-contiguous", cfg))   # each case once


@pytest.mark.parametrize("name", ["contiguous_broadcasts_v", "contiguous_broadcasts_one_token",
                                  "contiguous_broadcasts_batch"])
def test_a_cache_that_broadcasts_k_or_v_is_not_conforming_at_quick(name: str) -> None:
    """As ExecuTorch 1.5.1 does: V of one token over K of n, K and V of one token over n positions, K and V of
    batch 1 over batch B - each served is lenient OP-ARGS (tests/op_standin.py)."""
    target = PythonTarget(f"python:tests.op_standin:{name}")
    result = suite.run_suite(target, "quick")
    assert result.verdict(strict=True) == suite.NOT_CONFORMING
    assert ("lenient", "OP-ARGS") in result.findings, sorted(result.findings)


@pytest.mark.slow   # 2-7 s: the slow stage (the default run's time, README); its rule keeps a fast test beside it
def test_coverage_counts_each_case_not_each_clause() -> None:
    """The reference breaks every case in scope; a clause counts once each of its cases was broken."""
    result = suite.run_suite(PythonTarget("python:kvcache_spec.conformance.op.targets:contiguous"), "quick")
    keys = set(result.clauses)
    assert f"op.update_and_fetch.v.q_len 1 at q_len {malform.MULTI_TOKEN}" in keys
    assert len(keys) > len({key.split(" ")[0] for key in keys})   # more cases than clauses
    assert all(malform.CLAUSE_PREFIX + key in result.exercised for key, why in result.clauses.items() if not why)
