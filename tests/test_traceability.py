"""Traceability, enforced: every rule is cited by the model, checked by the reference and tested.

The matrix is `kvcache_spec.trace.build_matrix` over the real sources. The second half shows that the
check can fail: the same builder, fed a rules table with an extra rule or sources with a citation
removed, reports the gap. (This file is left out of the matrix's test column: its demonstrations
would otherwise count as citations.)
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from kvcache_spec import trace
from kvcache_spec.rules import RULES, Rule

# The tests are not installed: they are found from this file, whether the package under test is a
# checkout or an installed wheel (the model, kvcache and the vectors are read from the packages).
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def sources() -> trace.Sources:
    return trace.load_sources(TESTS)


@pytest.fixture(scope="module")
def matrix(sources: trace.Sources) -> trace.Matrix:
    return trace.build_matrix(RULES, sources)


def _column_gaps(matrix: trace.Matrix, column: str) -> list[str]:
    return [gap for gap in matrix.gaps() if gap.endswith(trace._COLUMN_TEXT[column])]


# --- the real matrix ---------------------------------------------------------------------------------

def test_every_rule_is_cited_by_the_model_or_exempt(matrix: trace.Matrix) -> None:
    gaps = _column_gaps(matrix, "model")
    assert not gaps, "\n".join(gaps)


def test_every_rule_is_checked_by_the_reference_or_exempt(matrix: trace.Matrix) -> None:
    gaps = _column_gaps(matrix, "kvcache")
    assert not gaps, "\n".join(gaps)


def test_every_rule_is_cited_by_a_test_or_vector(matrix: trace.Matrix) -> None:
    gaps = _column_gaps(matrix, "tests")
    assert not gaps, "\n".join(gaps)


def test_every_contract_cites_a_rule(matrix: trace.Matrix) -> None:
    gaps = [gap for gap in matrix.gaps() if gap.startswith("contract ")]
    assert not gaps, "\n".join(gaps)


def test_exemptions_are_justified_and_none_is_stale(matrix: trace.Matrix) -> None:
    assert [gap for gap in matrix.gaps() if "exemption" in gap] == []
    assert all(len(reason.split()) >= 8 for reason in trace.EXEMPTIONS.values()), "say why, in a sentence"


def test_nothing_else_is_a_gap(matrix: trace.Matrix) -> None:
    assert not matrix.gaps(), "\n".join(matrix.gaps())


@pytest.mark.slow
def test_trace_command_exit_code_follows_the_gaps(matrix: trace.Matrix, capsys: pytest.CaptureFixture[str]) -> None:
    assert trace.main(["--tests", str(TESTS)]) == (1 if matrix.gaps() else 0)
    out = capsys.readouterr().out
    assert all(rule.id in out for rule in RULES)
    assert trace.main(["--bogus"]) == 2
    assert trace.main(["--tests", str(TESTS / "no-such-folder")]) == 2


def test_the_sources_are_read_from_the_imported_packages(sources: trace.Sources) -> None:
    """What the matrix reads is what is imported (a wheel's files when installed), shown by source-tree path."""
    import kvcache
    import kvcache_spec.cell_model
    import kvcache_spec.model
    import kvcache_spec.op_model
    import kvcache_spec.paged_model

    assert sources.model == {"spec/model.py": Path(kvcache_spec.model.__file__).read_text(),
                             "spec/cell_model.py": Path(kvcache_spec.cell_model.__file__).read_text(),
                             "spec/op_model.py": Path(kvcache_spec.op_model.__file__).read_text(),
                             "spec/paged_model.py": Path(kvcache_spec.paged_model.__file__).read_text()}
    assert sources.kvcache["kvcache/__init__.py"] == Path(kvcache.__file__).read_text()
    assert "spec/vectors/kvcache_vectors.json" in sources.vectors
    assert "tests/test_rules.py" in sources.tests and sources.tests_checked


def test_without_tests_the_command_cannot_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """No tests folder found (an installed package, run elsewhere): the test column is not judged, the
    output says INCOMPLETE, and the exit code is 2 - never 0."""
    monkeypatch.setattr(trace, "default_tests_dir", lambda: None)
    monkeypatch.chdir(tmp_path)
    assert trace.main(["--gaps"]) == 2
    out = capsys.readouterr().out
    assert "the test column is not checked" in out and "INCOMPLETE" in out


# --- the check can fail ------------------------------------------------------------------------------

@pytest.mark.slow
def test_an_extra_rule_is_a_gap_in_every_column(sources: trace.Sources) -> None:
    fake = Rule("FAKE-RULE", "A rule nothing cites.", "To show the matrix notices.")
    gaps = trace.build_matrix(RULES + (fake,), sources).gaps()
    for column in trace.COLUMNS:
        assert f"FAKE-RULE: not cited by the {trace._COLUMN_TEXT[column]}" in gaps


def _remove(text: str, rule_id: str) -> str:
    return trace.citation_pattern(rule_id).sub("REMOVED", text)


def _without_contract(sources: trace.Sources, rule_id: str) -> trace.Sources:
    """The sources as they would be if the reference lost every contract and check citing rule_id."""
    stripped = copy.copy(sources)
    stripped.contracts = [trace.Contract(c.where, c.description, tuple(r for r in c.rule_ids if r != rule_id))
                          for c in sources.contracts]
    stripped.kvcache = {path: _remove(text, rule_id) for path, text in sources.kvcache.items()}
    return stripped


def _without_tests(sources: trace.Sources, rule_id: str) -> trace.Sources:
    stripped = copy.copy(sources)
    stripped.tests = {path: _remove(text, rule_id) for path, text in sources.tests.items()}
    stripped.vectors = {path: [] for path in sources.vectors}
    return stripped


def _traced_rule(matrix: trace.Matrix, column: str) -> str:
    """A rule the real sources trace in `column` (so removing its citation must open a gap)."""
    return next(row.rule.id for row in matrix.rows if row.has(column) and (row.rule.id, column) not in matrix.exemptions)


@pytest.mark.slow
def test_a_rule_losing_its_contract_is_a_gap(sources: trace.Sources, matrix: trace.Matrix) -> None:
    # a rule some contract cites alone: stripping it leaves that contract citing nothing
    rule_id = next(row.rule.id for row in matrix.rows
                   if any(contract.rule_ids == (row.rule.id,) for contract in sources.contracts))
    gap = f"{rule_id}: not cited by the {trace._COLUMN_TEXT['kvcache']}"
    assert gap not in matrix.gaps()
    stripped = trace.build_matrix(RULES, _without_contract(sources, rule_id))
    assert gap in stripped.gaps()
    # and each contract that loses its only id is itself a gap
    assert len(stripped.uncited_contracts) > len(matrix.uncited_contracts)


@pytest.mark.slow
def test_a_rule_losing_its_tests_is_a_gap(sources: trace.Sources, matrix: trace.Matrix) -> None:
    rule_id = _traced_rule(matrix, "tests")
    gap = f"{rule_id}: not cited by the {trace._COLUMN_TEXT['tests']}"
    assert gap not in matrix.gaps()
    assert gap in trace.build_matrix(RULES, _without_tests(sources, rule_id)).gaps()


@pytest.mark.slow
def test_a_rule_losing_its_model_citation_is_a_gap(sources: trace.Sources, matrix: trace.Matrix) -> None:
    rule_id = _traced_rule(matrix, "model")
    stripped = copy.copy(sources)
    stripped.model = {path: _remove(text, rule_id) for path, text in sources.model.items()}
    assert f"{rule_id}: not cited by the {trace._COLUMN_TEXT['model']}" in trace.build_matrix(RULES, stripped).gaps()


@pytest.mark.slow
def test_a_stale_or_unjustified_exemption_is_a_gap(sources: trace.Sources, matrix: trace.Matrix) -> None:
    rule_id = _traced_rule(matrix, "model")
    exemptions = dict(trace.EXEMPTIONS)
    exemptions[(rule_id, "model")] = "cited anyway"
    exemptions[("NO-SUCH-RULE", "model")] = "a reason"
    exemptions[(next(iter(trace.EXEMPTIONS))[0], "tests")] = " "
    gaps = trace.build_matrix(RULES, sources, exemptions).gaps()
    assert any(g.startswith(f"{rule_id}: exempt from the model column") for g in gaps)
    assert "exemption (NO-SUCH-RULE, model) names no rule or no column" in gaps
    assert any(g.endswith("gives no reason") for g in gaps)


# --- what counts as a citation -----------------------------------------------------------------------

def test_citation_tokens() -> None:
    def cites(rule_id: str, text: str) -> bool:
        return bool(trace.citation_pattern(rule_id).search(text))

    assert cites("STEP-T", "STEP-T: T >= 1") and cites("STEP-T", "def test_STEP_T_rejects_zero():")
    assert not cites("STEP-T", "STEP-T-MAX: T <= max_write") and not cites("STEP-T", "test_STEP_T_MAX_x")
    assert not cites("CLEAR", "cache.clear()") and not cites("DEPTH", "def depth(self)")
    assert cites("ARG-INT", '"ARG-INT"') and not cites("ARG-INT", "XARG-INT")


def test_no_rule_id_is_a_token_of_another() -> None:
    """Each id is found only in its own name, so one rule's citation never counts for another."""
    for rule in RULES:
        for other in RULES:
            if other is not rule:
                for form in (other.id, other.id.replace("-", "_")):
                    assert not trace.citation_pattern(rule.id).search(form), (rule.id, other.id)


def test_test_module_docstrings_are_not_citations() -> None:
    text = '"""Tests of ADMIT."""\n\nTABLE = ["CLEAR"]\n\ndef test_x():\n    """STEP-APPEND: a gap."""\n'
    found = trace.test_citations("tests/test_x.py", text, RULES)
    assert "ADMIT" not in found
    assert found["CLEAR"] == ["tests/test_x.py (module level)"]
    assert found["STEP-APPEND"] == ["tests/test_x.py::test_x"]


def test_vectors_cite_by_exact_flag() -> None:
    found = trace.vector_citations("spec/vectors/x.json", {"cases": [{"flags": ["ADMIT", "ADMITTED"]}]}, RULES)
    assert found == {"ADMIT": ["spec/vectors/x.json (1)"]}


def test_wycheproof_vectors_cite_by_test_flags_only() -> None:
    """A file's notes (every flag's meaning) and notCovered (rules it does not test) are not citations."""
    data = {"notes": {"ADMIT": "...", "CLEAR": "..."}, "notCovered": {"THREADS": "not observable"},
            "testGroups": [{"tests": [{"flags": ["ADMIT"]}, {"flags": ["ADMIT", "STEP-T"]}]}]}
    found = trace.vector_citations("v.json", data, RULES)
    assert found == {"ADMIT": ["v.json (2 tests)"], "STEP-T": ["v.json (1 tests)"]}
    assert trace.vector_citations("schema.json", {"$schema": "x", "enum": ["ADMIT"]}, RULES) == {}


def test_rule_ids_are_plain_tokens() -> None:
    assert all(re.fullmatch(r"[A-Z][A-Z0-9]*(-[A-Z0-9]+)*", rule.id) for rule in RULES)
