"""spec/SPEC.md stays true: its examples run, its rules are rules.py's; spec/CONTRACTS.md is the generated listing."""

from __future__ import annotations

import doctest
import re
import subprocess
import sys

import pytest

from kvcache_spec import specdoc
from kvcache_spec.rules import RULES


@pytest.fixture(scope="module")
def document() -> str:
    return specdoc.SPEC_PATH.read_text()


def test_every_example_in_the_spec_runs() -> None:
    """The numbers in SPEC.md are computed by the model and the reference (DATA-SOUND, REWIND-SOUND...)."""
    result = doctest.testfile(str(specdoc.SPEC_PATH), module_relative=False, optionflags=doctest.REPORT_NDIFF)
    assert result.attempted > 100, "the examples were found"
    assert result.failed == 0


def _rule_sections(document: str) -> list[tuple[str, str, str]]:
    """(number, id, text) of every '#### N. ID' section, in document order: part 2's (the sequence cache), part
    4's (the cell layout), part 5's (the op face, then the cell cache seen through its outputs) and section
    6.1's (conformance scope), numbered on from one part to the next."""
    pieces = re.split(r"^#### (\d+)\. ([A-Z][A-Z0-9-]*)\s*$", document, flags=re.MULTILINE)
    return list(zip(pieces[1::3], pieces[2::3], [text.split("\n## ")[0].split("\n### ")[0] for text in pieces[3::3]]))


def test_rule_sections_are_the_rules_in_order(document: str) -> None:
    sections = _rule_sections(document)
    assert [rule_id for _, rule_id, _ in sections] == [rule.id for rule in RULES]
    assert [number for number, _, _ in sections] == [str(n) for n in range(1, len(RULES) + 1)]


def test_each_rule_section_quotes_its_statement_and_says_why(document: str) -> None:
    for (_, rule_id, text), rule in zip(_rule_sections(document), RULES):
        assert f"> {rule.statement}\n" in text, f"{rule_id}: the statement differs from spec/rules.py"
        assert "Why:" in text, f"{rule_id}: no rationale"


def test_each_statement_is_stated_once(document: str) -> None:
    """Each rule found exactly once: no rule's statement is quoted anywhere but in its own section."""
    for rule in RULES:
        assert document.count(rule.statement) == 1, f"{rule.id}: its statement appears more than once"


def test_the_contents_lists_every_part(document: str) -> None:
    parts = re.findall(r"^## (\d+)\. (.*)$", document, re.M)
    contents = document[document.index("\nContents:"):document.index("\n## 1. ")]
    assert [number for number, _ in parts] == [str(n) for n in range(1, len(parts) + 1)]
    for number, title in parts:
        assert f"[{number}. {title}](#" in " ".join(contents.split()), f"the Contents line misses part {number}"


def test_every_face_has_executed_examples(document: str) -> None:
    """Parts 2 (sequence), 4 (cells) and 5 (the op face) each carry examples the doctest run executes."""
    for begin, end in (("\n## 2. ", "\n## 3. "), ("\n## 4. ", "\n## 5. "), ("\n## 5. ", "\n## 6. ")):
        part = document[document.index(begin):document.index(end)]
        assert part.count("\n>>> ") >= 20, begin


@pytest.fixture(scope="module")
def contracts() -> str:
    return specdoc.CONTRACTS_PATH.read_text()


def test_the_contract_listing_is_the_generated_one(contracts: str) -> None:
    committed = specdoc.committed_section(contracts)
    generated = specdoc.generate()
    assert committed == generated, "run `python -m kvcache_spec.specdoc` to regenerate spec/CONTRACTS.md"


def test_the_spec_holds_no_generated_text_and_links_the_listing(document: str) -> None:
    """The behavioural spec is read alone: the generated listing is its own page, linked from it."""
    assert specdoc.BEGIN not in document and specdoc.END not in document
    assert "](CONTRACTS.md)" in document


def test_the_listing_has_a_row_per_contract(contracts: str) -> None:
    rows = [line for line in specdoc.committed_section(contracts).splitlines()
            if line.startswith("| invariant |") or line.startswith("| pre |") or line.startswith("| post |")]
    assert len(rows) == len(specdoc.collect_contracts()) > 50


def test_preconditions_kept_under_python_O_are_the_typed_ones(contracts: str) -> None:
    """ARG-INT, ARG-RANGE, STEP-T...: input validation stays under -O; postconditions and invariants do not."""
    for line in specdoc.committed_section(contracts).splitlines():
        cells = [cell.strip() for cell in line.split(" | ")]
        if line.startswith("| pre |"):
            assert (cells[-2] == "typed") == (cells[-1].rstrip(" |") == "kept"), line
        elif line.startswith("| post |") or line.startswith("| invariant |"):
            assert cells[-1].rstrip(" |") == "off", line


def test_replace_section_round_trips() -> None:
    text = f"intro\n{specdoc.BEGIN}\nold\n{specdoc.END}\nend\n"
    replaced = specdoc.replace_section(text, "new\n")
    assert replaced == f"intro\n{specdoc.BEGIN}\nnew\n{specdoc.END}\nend\n"
    assert specdoc.committed_section(replaced) == "new\n"
    with pytest.raises(ValueError):
        specdoc.replace_section("no markers", "x")


def test_check_command() -> None:
    result = subprocess.run([sys.executable, "-m", "kvcache_spec.specdoc", "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert specdoc.main(["--bogus"]) == 2


def test_descriptions_cite_rules_first() -> None:
    assert specdoc.cited_rules("STEP-T, STEP-T-MAX") == ("STEP-T", "STEP-T-MAX")
    assert specdoc.cited_rules("PLAN-SHAPE: every row") == ("PLAN-SHAPE",)
    assert specdoc.cited_rules("the runs hold exactly count rows") == ()
    assert specdoc.cited_rules("NOT-A-RULE: x") == ()
    assert specdoc.cited_rules(None) == ()
