"""`kvcache trace`: the traceability matrix rule -> model, contracts/checks, tests, vectors.

A rule is traced when
- the model (`spec/model.py` for the sequence cache, `spec/cell_model.py` for the cell layout) cites it, or the rule is out of the model's scope by a listed,
  justified exemption (`EXEMPTIONS`);
- the reference (`kvcache/`) checks it: a contract description (read from icontract, see
  `specdoc.collect_contracts`) or a typed error / check raised with the rule id as a literal, or the
  rule cannot be checked by the cache at all, again by a listed, justified exemption;
- at least one test (`tests/test_*.py`, inside a test function or module-level code, not the
  module docstring) or one golden vector (`spec/vectors/*.json`) cites it.
And every contract of the reference cites a rule id.

A citation is the rule id written exactly, in upper case, as a whole token: `STEP-APPEND` in text, or
`STEP_APPEND` in an identifier (`test_STEP_APPEND_gap`). Lower-case words ("clear", "depth") are not
citations: they are too common to mean a rule.

    kvcache trace            # print the matrix; exit 1 when a rule or a contract is untraced
    kvcache trace --gaps     # print only the gaps
    kvcache trace --tests DIR   # the test files to read (default: see below)

Where the sources come from: the model, the reference and the vectors are read through the installed
packages (`kvcache_spec.model.__file__`, `kvcache`'s folder, `kvcache_spec`'s `vectors/`), so the
command works from a wheel as from a checkout. Tests are not installed: they are read from `--tests
DIR`, else from the `tests/` folder of the checkout the package was imported from (an editable
install), else from `./tests`. Without any, the test column is not checked: the command says so and
exits 2 (it cannot judge), never 0. Paths are shown as in the source tree (spec/model.py, kvcache/...).

The matrix is built by pure functions over text and data (`build_matrix`), so a test can show that a
rule losing its contract or its test turns into a gap.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import pathlib
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from .rules import DECLARATION_RULES, RULES, Rule


MODEL_MODULES = ("model", "cell_model", "op_model", "paged_model")  # the executable model, one module per layout or face
COLUMNS = ("model", "kvcache", "tests")

# Rules a column cannot cite, each with the reason. These are part of the spec's claims: the matrix
# prints them, and the traceability test fails when an exemption becomes stale (the column cites the
# rule after all) or has no reason.
EXEMPTIONS: dict[tuple[str, str], str] = {
    ("OP-MASK", "model"):
        "How an answer encodes what each query attends (the AttendSpec's kinds and mask shape): the op model "
        "says which tokens each query attends (OP-ATTEND), and the engine reads the answer's mask by this rule "
        "(spec/conformance/op/engine.py, check_answer).",
    ("OP-HIST", "model"):
        "The shape and dtype of the returned history, not what it holds: the model has no rows, only tokens; "
        "the engine checks the shapes (spec/conformance/op/engine.py, check_answer).",
    ("PROTO-COMMIT", "model"):
        "A consumer obligation. The model decides rewinds by simulating the next step on its pools "
        "(next_step_sound), which include rows an uncommitted step wrote, so the model is sound without "
        "it; the obligation is what lets the reference's closed-form rewind floor (which cannot see "
        "uncommitted rows) agree with the model.",
    ("FACES", "model"):
        "API shape, not behaviour: the model is functions over one state value, so the runner's and the "
        "backend's view are the same state by construction.",
    ("REG-KEYS", "model"):
        "The builder registry is process-global plumbing outside the single-sequence state machine the "
        "model describes.",
    ("REG-KEYS", "kvcache"):
        "A structural property (the key is the tuple (backend_id, kind), kvcache/_registry.py), not a "
        "per-call condition a contract could state; tests check the collision and the uniqueness.",
    ("REG-SESSION", "model"):
        "The session is registry plumbing (install on entry, erase on exit), outside the state machine "
        "the model describes.",
    ("THREADS", "model"):
        "Concurrency: the model is sequential by construction; the rule states which objects may be "
        "shared across threads.",
    ("THREADS", "kvcache"):
        "Thread safety is a property of locks (kvcache/_registry.py) and a documented absence of them "
        "(SequenceCache), not a condition a contract can check; tests exercise the registries from "
        "several threads.",
    ("SCOPE-BORDER", "model"):
        "The model implements the whole spec: it has no scope to leave. The rule binds implementations "
        "that declare a partial one, and the conformance engine checks it (spec/conformance/scope.py).",
    ("SCOPE-BORDER", "kvcache"):
        "The reference implements every feature (flat, ring, max_write), so no configuration is outside "
        "its scope; tests/test_scope.py checks the border on partial-scope targets.",
    ("CELL-RECOMPUTE", "kvcache"):
        "A rule of a cache seen only through its outputs (SPEC.md 5.3): the reference exposes its K/V and masks and "
        "computes no output, so there is nothing for it to recompute; the conformance engine checks the rule "
        "(spec/conformance/cell/recompute.py) and tests/test_cell_recompute.py checks the engine on stand-ins.",
    ("CELL-KEEP", "kvcache"):
        "A verb of llama.cpp's face only (SPEC.md 5.3): the reference's cell cache has seq_rm for it; the op model "
        "states it (op_model.OpModel.seq_keep) and the recompute engine checks targets by it.",
    ("CELL-SHIFT", "kvcache"):
        "A verb of llama.cpp's face only (SPEC.md 5.3): the reference keeps a position per cell and shifts none; the "
        "op model states it (op_model.OpModel.seq_add) and the recompute engine checks targets by it.",
    ("CELL-STATE", "kvcache"):
        "A verb of llama.cpp's face only (SPEC.md 5.3): the reference's cell cache saves no sequence alone (its op "
        "face saves the whole cache, OP-STATE); the op model states the restore (op_model.OpModel.seq_load) and the "
        "recompute engine checks targets by it, tests/test_cell_recompute.py on stand-ins.",
}
# The declaration rules (SPEC.md section 6.1) say what the suite sends a target that declares a scope item and
# what it owes: they bind the suite, not a cache, so neither the model nor the reference has anything to cite.
EXEMPTIONS.update({(rule_id, column): reason for rule_id in DECLARATION_RULES for column, reason in (
    ("model", "A declaration rule: it binds the conformance suite (what it sends a target declaring it, and what "
              "that target owes), spec/conformance/scope.py; the model implements the whole spec and declares nothing."),
    ("kvcache", "A declaration rule: the reference implements the whole spec and declares nothing; tests/"
                "test_scope_rules.py checks the suite keeps it."))})


def citation_pattern(rule_id: str) -> re.Pattern[str]:
    """The rule id as a whole upper-case token, with `-` or `_` between its parts.

    `STEP-T` does not match inside `STEP-T-MAX` or `STEP_T_MAX`, but does in `test_STEP_T_rejects_0`;
    `CLEAR` does not match inside `CELL-CLEAR`.
    """
    parts = [re.escape(part) for part in rule_id.split("-")]
    # Not preceded by a letter or digit, nor by an upper-case id part and a separator: `DATA-SOUND` is
    # not cited by `CELL-DATA-SOUND` / `test_CELL_DATA_SOUND` (it still is by `test_DATA_SOUND_x`).
    return re.compile(r"(?<![A-Za-z0-9])(?<![A-Z0-9][-_])" + "[-_]".join(parts) + r"(?![A-Z0-9]|[-_][A-Z0-9])")


def cited_ids(text: str, rules: Sequence[Rule]) -> set[str]:
    return {rule.id for rule in rules if citation_pattern(rule.id).search(text)}


# --- the sources the matrix is built from ----------------------------------------------------------

@dataclass(frozen=True)
class Contract:
    """A contract of the reference, as the matrix needs it."""

    where: str                 # "SequenceCache.plan (pre)"
    description: Optional[str]
    rule_ids: tuple[str, ...]
    condition: str = ""        # its source, to find it when it has no description


@dataclass
class Sources:
    """Everything the matrix reads. Paths are shown relative to the repository root."""

    model: Mapping[str, str]          # model path -> source text
    contracts: Sequence[Contract]
    kvcache: Mapping[str, str]        # kvcache source path -> text (typed errors and checks)
    tests: Mapping[str, str]          # test path -> source text
    vectors: Mapping[str, Any]        # vector path -> parsed JSON
    notes: list[str] = field(default_factory=list)  # e.g. "spec/vectors/ does not exist yet"
    tests_checked: bool = True        # False: no test folder was found, the test column is not judged


def package_dir(name: str) -> pathlib.Path:
    """The folder an installed (or checked-out) package is imported from."""
    module = importlib.import_module(name)
    return pathlib.Path(module.__file__ or "").resolve().parent


def default_tests_dir() -> Optional[pathlib.Path]:
    """The checkout's tests/ when the package is imported from a checkout, else ./tests, else None."""
    for candidate in (package_dir("kvcache_spec").parent / "tests", pathlib.Path.cwd() / "tests"):
        if any(candidate.glob("test_*.py")):
            return candidate
    return None


def load_sources(tests_dir: Optional[pathlib.Path] = None) -> Sources:
    """The matrix's sources: model, reference and vectors from the installed packages, tests from
    `tests_dir` (default: `default_tests_dir()`)."""
    from . import specdoc  # imports kvcache; kept out of module import so `--help` stays cheap

    spec_dir, kvcache_dir = package_dir("kvcache_spec"), package_dir("kvcache")
    contracts = [Contract(f"{entry.module}.{entry.owner} ({entry.kind})", entry.description, entry.rule_ids,
                          entry.condition) for entry in specdoc.collect_contracts()]
    notes: list[str] = []
    vectors: dict[str, Any] = {}
    vectors_dir = spec_dir / "vectors"
    if not vectors_dir.is_dir():
        notes.append("spec/vectors/ does not exist: no vector cites any rule")
    else:
        for path in sorted(vectors_dir.glob("*.json")):
            vectors[f"spec/vectors/{path.name}"] = json.loads(path.read_text())
        if not vectors:
            notes.append("spec/vectors/ holds no *.json file")
    tests_dir = tests_dir or default_tests_dir()
    tests: dict[str, str] = {}
    if tests_dir is None:
        notes.append("no tests/ folder found (tests are not installed with the package): the test column is "
                     "not checked; pass --tests DIR")
    else:
        tests = {f"tests/{path.name}": path.read_text() for path in sorted(tests_dir.glob("test_*.py"))
                 if path.name != "test_traceability.py"}  # its own demonstrations are not citations
    return Sources(
        model={f"spec/{name}.py": pathlib.Path(importlib.import_module(f"kvcache_spec.{name}").__file__ or "").read_text()
               for name in MODEL_MODULES},
        contracts=contracts,
        kvcache={f"kvcache/{path.relative_to(kvcache_dir).as_posix()}": path.read_text()
                 for path in sorted(kvcache_dir.rglob("*.py"))},
        tests=tests, vectors=vectors, notes=notes, tests_checked=tests_dir is not None)


# --- finding citations -----------------------------------------------------------------------------

def model_citations(path: str, text: str, rules: Sequence[Rule]) -> dict[str, list[str]]:
    """rule id -> "model.py:function" places; citations outside any definition count as the module."""
    found: dict[str, list[str]] = {}
    tree = ast.parse(text)
    name = pathlib.Path(path).name
    covered: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            segment = ast.get_source_segment(text, node) or ""
            for rule_id in cited_ids(segment, rules):
                found.setdefault(rule_id, []).append(f"{name}:{node.name}")
                covered.add(rule_id)
    for rule_id in cited_ids(text, rules) - covered:
        found.setdefault(rule_id, []).append(f"{name} (module)")
    return found


def check_citations(path: str, text: str, rules: Sequence[Rule]) -> dict[str, list[str]]:
    """rule id -> places in the reference that raise or check with the id as a string literal."""
    ids = {rule.id for rule in rules}
    found: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ids:
            place = f"{path}:{node.lineno}"
            if place not in found.get(node.value, []):
                found.setdefault(node.value, []).append(place)
    return found


def _test_units(path: str, text: str) -> list[tuple[str, str]]:
    """(label, source) of each test function (with its decorators and enclosing class header) and of
    the module-level code that is not the docstring (tables the tests are parametrized with)."""
    tree = ast.parse(text)
    units: list[tuple[str, str]] = []
    module_code: list[str] = []

    def segment(node: ast.AST) -> str:
        return ast.get_source_segment(text, node) or ""

    def function_source(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
        return "\n".join([segment(d) for d in node.decorator_list] + [segment(node)])

    for index, node in enumerate(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name.startswith("test"):
                units.append((f"{path}::{node.name}", function_source(node)))
            else:
                module_code.append(segment(node))  # helpers the tests call
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            header = node.name + "\n" + (ast.get_docstring(node) or "")
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and member.name.startswith("test"):
                    units.append((f"{path}::{node.name}::{member.name}", header + "\n" + function_source(member)))
        elif index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the module docstring says what the file is about; it tests nothing
        else:
            module_code.append(segment(node))
    units.append((f"{path} (module level)", "\n".join(module_code)))
    return units


def test_citations(path: str, text: str, rules: Sequence[Rule]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for label, source in _test_units(path, text):
        for rule_id in cited_ids(source, rules):
            found.setdefault(rule_id, []).append(label)
    return found


def _strings(data: Any) -> Iterable[str]:
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield str(key)
            yield from _strings(value)
    elif isinstance(data, list):
        for item in data:
            yield from _strings(item)


def vector_citations(path: str, data: Any, rules: Sequence[Rule]) -> dict[str, list[str]]:
    """rule id -> ["path (n tests)"]: a vector cites a rule by a flag equal to its id.

    Wycheproof-style files (`testGroups[].tests[].flags`) count the tests flagged with the id; the
    file's `notes` (what each flag means) and `notCovered` (rules the vectors do not test) are not
    citations. A file of another shape counts every string equal to an id outside those two keys;
    a JSON Schema (`$schema`) describes vectors and cites nothing.
    """
    ids = {rule.id for rule in rules}
    counts: dict[str, int] = {}
    if isinstance(data, dict) and "$schema" in data:
        return {}
    if isinstance(data, dict) and isinstance(data.get("testGroups"), list):
        for group in data["testGroups"]:
            for test in group.get("tests", []) if isinstance(group, dict) else []:
                for flag in set(test.get("flags", [])) if isinstance(test, dict) else set():
                    if flag in ids:
                        counts[flag] = counts.get(flag, 0) + 1
        return {rule_id: [f"{path} ({count} tests)"] for rule_id, count in counts.items()}
    if isinstance(data, dict):
        data = {key: value for key, value in data.items() if key not in ("notes", "notCovered")}
    for text in _strings(data):
        if text in ids:
            counts[text] = counts.get(text, 0) + 1
    return {rule_id: [f"{path} ({count})"] for rule_id, count in counts.items()}


# --- the matrix --------------------------------------------------------------------------------------

@dataclass
class Row:
    rule: Rule
    model: list[str] = field(default_factory=list)
    contracts: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)
    vectors: list[str] = field(default_factory=list)

    def has(self, column: str) -> bool:
        if column == "model":
            return bool(self.model)
        if column == "kvcache":
            return bool(self.contracts or self.checks)
        return bool(self.tests or self.vectors)


@dataclass
class Matrix:
    rows: list[Row]
    uncited_contracts: list[Contract]
    exemptions: Mapping[tuple[str, str], str]
    notes: list[str]
    tests_checked: bool = True

    def gaps(self) -> list[str]:
        """Every traceability failure, one sentence each; empty when everything is traced (a column
        that could not be read, `tests_checked` False, is not judged: the command then exits 2)."""
        problems: list[str] = []
        known = {row.rule.id for row in self.rows}
        for row in self.rows:
            for column in COLUMNS:
                exempt = (row.rule.id, column) in self.exemptions
                if column == "tests" and not self.tests_checked:
                    continue
                if not row.has(column) and not exempt:
                    problems.append(f"{row.rule.id}: not cited by the {_COLUMN_TEXT[column]}")
                elif row.has(column) and exempt:
                    problems.append(f"{row.rule.id}: exempt from the {column} column but cited there "
                                    f"(remove the stale exemption)")
        for (rule_id, column), reason in self.exemptions.items():
            if rule_id not in known or column not in COLUMNS:
                problems.append(f"exemption ({rule_id}, {column}) names no rule or no column")
            elif not reason.strip():
                problems.append(f"exemption ({rule_id}, {column}) gives no reason")
        for contract in self.uncited_contracts:
            problems.append(f"contract {contract.where} {contract.description or '(no description)'!r} "
                            f"[{contract.condition}] cites no rule id")
        return problems


_COLUMN_TEXT = {"model": "model (spec/model.py, spec/cell_model.py, spec/op_model.py, spec/paged_model.py)",
                "kvcache": "reference (a contract or a typed error/check in kvcache/)",
                "tests": "tests (tests/test_*.py) or vectors (spec/vectors/*.json)"}


def build_matrix(rules: Sequence[Rule], sources: Sources,
                 exemptions: Mapping[tuple[str, str], str] = EXEMPTIONS) -> Matrix:
    rows = {rule.id: Row(rule) for rule in rules}

    def merge(column: str, found: Mapping[str, list[str]]) -> None:
        for rule_id, places in found.items():
            if rule_id in rows:
                getattr(rows[rule_id], column).extend(places)

    for path, text in sources.model.items():
        merge("model", model_citations(path, text, rules))
    for contract in sources.contracts:
        for rule_id in contract.rule_ids:
            if rule_id in rows:
                rows[rule_id].contracts.append(contract.where)
    for path, text in sources.kvcache.items():
        merge("checks", check_citations(path, text, rules))
    for path, text in sources.tests.items():
        merge("tests", test_citations(path, text, rules))
    for path, data in sources.vectors.items():
        merge("vectors", vector_citations(path, data, rules))
    uncited = [contract for contract in sources.contracts if not contract.rule_ids]
    return Matrix(list(rows.values()), uncited, exemptions, list(sources.notes), sources.tests_checked)


# --- printing ----------------------------------------------------------------------------------------

def _summary(places: list[str], limit: int = 3) -> str:
    if not places:
        return "-"
    unique = list(dict.fromkeys(places))
    shown = ", ".join(unique[:limit])
    return shown + (f" (+{len(unique) - limit})" if len(unique) > limit else "")


def render(matrix: Matrix, gaps_only: bool = False) -> str:
    lines: list[str] = []
    if not gaps_only:
        for row in matrix.rows:
            lines.append(row.rule.id)
            cells = [("model", _summary(row.model)),
                     ("contracts", _summary(row.contracts)),
                     ("checks", _summary(row.checks)),
                     ("tests", _summary(row.tests)),
                     ("vectors", _summary(row.vectors))]
            for column in COLUMNS:
                if (row.rule.id, column) in matrix.exemptions:
                    cells.append((f"exempt ({column})", matrix.exemptions[(row.rule.id, column)]))
            lines += [f"    {name:<18} {text}" for name, text in cells]
        lines.append("")
    for note in matrix.notes:
        lines.append(f"note: {note}")
    gaps = matrix.gaps()
    judged = [c for c in COLUMNS if c != "tests" or matrix.tests_checked]
    traced = sum(all(row.has(c) or (row.rule.id, c) in matrix.exemptions for c in judged) for row in matrix.rows)
    lines.append(f"{traced}/{len(matrix.rows)} rules traced, {len(matrix.exemptions)} exemptions, "
                 f"{len(matrix.uncited_contracts)} contracts without a rule id, {len(gaps)} gaps"
                 + ("" if matrix.tests_checked else " (INCOMPLETE: the test column was not checked)"))
    lines += [f"GAP {gap}" for gap in gaps]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache trace", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--gaps", action="store_true", help="print only the gaps")
    parser.add_argument("--tests", metavar="DIR", type=pathlib.Path,
                        help="the folder of tests/test_*.py (default: the checkout's tests/, else ./tests)")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:
        return 0 if exit_.code == 0 else 2
    if args.tests is not None and not args.tests.is_dir():
        print(f"kvcache trace: --tests {args.tests} is not a folder", file=sys.stderr)
        return 2
    try:
        matrix = build_matrix(RULES, load_sources(args.tests))
    except (OSError, SyntaxError, ValueError) as error:
        print(f"kvcache trace: cannot read the sources ({error})", file=sys.stderr)
        return 2
    print(render(matrix, gaps_only=args.gaps))
    if matrix.gaps():
        return 1
    return 0 if matrix.tests_checked else 2


if __name__ == "__main__":
    sys.exit(main())
