"""spec/SPEC.md stays true: its examples run, its rules are rules.py's; spec/CONTRACTS.md is the generated listing."""

from __future__ import annotations

import doctest
import re
import subprocess
import sys
from pathlib import Path

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
    4's (the cell layout), part 5's (the op face, then the cell cache seen through its outputs), section
    6.1's (conformance scope) and part 7's (the paged layout), numbered on from one part to the next."""
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
    """Parts 2 (sequence), 4 (cells), 5 (the op face) and 7 (the paged layout) each carry examples the doctest run
    executes."""
    for begin, end in (("\n## 2. ", "\n## 3. "), ("\n## 4. ", "\n## 5. "), ("\n## 5. ", "\n## 6. "),
                       ("\n## 7. ", "\n## 8. ")):
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


# --- nothing lost, every reference resolves -------------------------------------------------------------

# Counted on SPEC.md before its second pass (commit aaa14e5, 2,129 lines): 76 '#### N. ID' rule sections and
# 319 executed statements (`>>> ` lines of the pycon blocks, continuation lines not counted). A shorter
# document may say things once instead of three times; it may not drop a rule or an executed example.
RULE_SECTIONS_BEFORE = 76
EXECUTED_STATEMENTS_BEFORE = 319
REPO = specdoc.SPEC_PATH.parent.parent


def executed_statements(document: str) -> int:
    """The `>>> ` statements of the document's pycon blocks (what the doctest run executes)."""
    blocks = re.findall(r"^```pycon\n(.*?)^```", document, flags=re.MULTILINE | re.DOTALL)
    return sum(line.startswith(">>> ") for block in blocks for line in block.splitlines())


def test_no_rule_and_no_executed_example_is_lost(document: str) -> None:
    assert len(_rule_sections(document)) >= RULE_SECTIONS_BEFORE
    assert executed_statements(document) >= EXECUTED_STATEMENTS_BEFORE
    assert executed_statements("```pycon\n>>> a = 1\n... \n>>> a\n1\n\n```\n>>> outside\n") == 2


def spec_sections(document: str) -> set[str]:
    """The numbers SPEC.md's parts and sections are cited by: '6' for '## 6. ...', '6.1' for '### 6.1 ...'."""
    return set(re.findall(r"^## (\d+)\. ", document, re.M)) | set(re.findall(r"^### (\d+\.\d+) ", document, re.M))


def spec_anchors(document: str) -> set[str]:
    """GitHub's anchors of SPEC.md's headings: lower case, punctuation dropped, spaces to '-'."""
    return {re.sub(r"[^a-z0-9 _-]", "", title.strip().lower()).replace(" ", "-")
            for title in re.findall(r"^#{1,4} (.*)$", document, re.M)}


# A reference to SPEC.md by number: "SPEC.md 6.1", "SPEC.md section 5.3", "`spec/SPEC.md` section 6.1", "SPEC
# part 5", "SPEC.md sections 2.3-2.7"; inside SPEC.md itself "section 5.3" and "part 6" mean its own.
_BY_NUMBER = re.compile(r"SPEC(?:\.md)?`?,?\s+(?:(?:sections?|parts?)\s+)?(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?")
_OWN = re.compile(r"\b(?:[Ss]ections?|[Pp]arts?)\s+(\d+(?:\.\d+)?)(?:(?:\s*-\s*|, | and | or )(\d+(?:\.\d+)?))?")
_ANCHOR = re.compile(r"SPEC\.md#([A-Za-z0-9_-]+)")


def referring_files() -> list[str]:
    """The repository's code and pages that may cite SPEC.md (the tool's own environments left out)."""
    patterns = ("README.md", "ARCHITECTURE.md", "pyproject.toml", "docs/*.md", "spec/*.md", "spec/**/*.py",
                "kvcache/**/*.py", "proofs/**/*.py", "tests/*.py", "spec/cpp/**/*.hpp", "spec/cpp/**/*.cpp", ".ci/*")
    return sorted({str(path.relative_to(REPO)) for pattern in patterns for path in REPO.glob(pattern)
                   if path.is_file() and path.name != "test_specdoc.py"})   # its own demonstrations are not references


def dangling_references(name: str, text: str, document: str) -> list[str]:
    """The SPEC.md references in `text` that name no heading of `document`."""
    flat = re.sub(r"\s*\n\s*(?:#+|//+|\*|>)?\s*", " ", text)   # a reference may wrap onto a comment line
    numbers = spec_sections(document)
    found = [match.groups() for match in _BY_NUMBER.finditer(flat)]
    if name == "spec/SPEC.md":
        found += [match.groups() for match in _OWN.finditer(flat)]
    out = [f"{name}: section {number}" for pair in found for number in pair if number and number not in numbers]
    out += [f"{name}: #{anchor}" for anchor in _ANCHOR.findall(text) if anchor not in spec_anchors(document)]
    if name == "spec/SPEC.md":
        out += [f"{name}: #{anchor}" for anchor in re.findall(r"\]\(#([A-Za-z0-9_-]+)\)", text)
                if anchor not in spec_anchors(document)]
    return out


def test_every_reference_to_a_spec_section_resolves(document: str) -> None:
    dangling = [problem for name in referring_files()
                for problem in dangling_references(name, (REPO / name).read_text(errors="replace"), document)]
    assert dangling == []


def test_a_dangling_reference_is_found(document: str) -> None:
    """The check above can fail: a section, an own part and an anchor that do not exist are each named."""
    assert dangling_references("spec/arguments.py", "# (SPEC section 8.5)\n# SPEC.md\n# part 5", document) == \
        ["spec/arguments.py: section 8.5"]
    assert dangling_references("spec/SPEC.md", "see section 9.4 and [x](#no-such-part)", document) == \
        ["spec/SPEC.md: section 9.4", "spec/SPEC.md: #no-such-part"]
    assert dangling_references("README.md", "[scope](spec/SPEC.md#29-conformance-scope)", document) == \
        ["README.md: #29-conformance-scope"]


def test_user_pages_name_no_issue_numbers() -> None:
    """A user cannot look up this project's issue tracker: its pages say what a thing is, not which issue made it
    (an upstream issue, '#29045', is a link a user can follow and stays)."""
    # README.md and docs/ sit beside tests/ (in the checkout, and where CI copies them to test the installed wheel);
    # SPEC.md and PROTOCOL.md beside the package's own modules, wherever it is installed
    beside_tests = Path(__file__).resolve().parent.parent
    pages = [beside_tests / "README.md", *sorted((beside_tests / "docs").glob("*.md")),
             *sorted(specdoc.SPEC_PATH.parent.glob("*.md"))]
    named = [f"{page.name}: {match.group(0)}" for page in pages
             for match in re.finditer(r"\b[Ii]ssues? \d+", page.read_text())]
    assert len(pages) > 10 and named == []


def test_the_spec_is_at_most_2016_lines(document: str) -> None:
    """Each fact said once keeps the document readable in one sitting: 2,129 lines before its second pass, then at
    most 1,700. The cap rose five times: by 18 for OP-PAD and OP-ROWS (29 lines, 11 made up nearby), for a new
    layout: part 7 (the paged layout: its objects, ground truth, policy and 15 rules with their examples) takes
    214 lines; 1,718 + 214 + about 20 lines of headroom is 1,953; by the 29 lines OP-STATE's section adds
    (its rule, why, and its executed example of a state saved, loaded and refused): 1,982; by the 18 lines
    OP-QUANTIZE's section adds (its rule, why, and its executed example of rows quantized and bits refused): 2,000;
    and by 16 for CELL-STATE (its rule, why, a face row, a scope word and its executed example of a restore and the
    broken forms the suite sends, 19 lines, the rest made up in it): 2,016."""
    assert len(document.splitlines()) <= 2016


def test_the_index_lists_every_rule_under_its_section(document: str) -> None:
    """Part 8: each rule id once, in the row of the section whose heading it sits under."""
    index = document[document.index("\n## 8. Index of rules"):]
    listed = {rule_id: number for number, ids in re.findall(r"^\| \[(\d+\.\d+) [^]]*\]\(#[^)]*\) \| (.*) \|$", index, re.M)
              for rule_id in ids.split(", ")}
    where: dict[str, str] = {}
    section = ""
    for line in document[:document.index("\n## 8. Index of rules")].splitlines():
        heading = re.match(r"^### (\d+\.\d+) ", line)
        section = heading.group(1) if heading else section
        rule = re.match(r"^#### \d+\. ([A-Z][A-Z0-9-]*)$", line)
        if rule:
            where[rule.group(1)] = section
    assert listed == where and set(listed) == {rule.id for rule in RULES}
