"""Generate spec/CONTRACTS.md, the contract listing, from the icontract decorators of `kvcache`, so it cannot drift.

The listing is every precondition, postcondition and class invariant of every class and function the
core modules of `kvcache` define (the optional `kvcache.backends` are not part of the reference). It is
read from icontract's own bookkeeping - `icontract._checkers.find_checker(function)` with its
`__preconditions__` / `__postconditions__`, and a class's `__invariants__` - never from a hand-kept
list. Whether a contract survives `python -O` is measured too, by collecting again in a child
interpreter started with `python -O`.

    python -m kvcache_spec.specdoc            # rewrite the marked section of spec/CONTRACTS.md
    python -m kvcache_spec.specdoc --check    # exit 1 when the committed section differs

The behavioural spec, spec/SPEC.md, links to that page and holds no generated text (SPEC_PATH is where its
executed examples are read from).

Exit codes: 0 in sync (or rewritten), 1 differs, 2 usage or environment error.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import pathlib
import pkgutil
import re
import subprocess
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Iterator, Optional, Sequence

import icontract._checkers

import kvcache

from .rules import BY_ID

SPEC_PATH = pathlib.Path(__file__).with_name("SPEC.md")
CONTRACTS_PATH = pathlib.Path(__file__).with_name("CONTRACTS.md")
BEGIN = "<!-- contracts:begin -->"
END = "<!-- contracts:end -->"

# A description cites its rules first: "ID: text", "ID, ID: text" or just "ID" / "ID, ID".
_CITATION = re.compile(r"^([A-Z][A-Z0-9-]*(?:, [A-Z][A-Z0-9-]*)*)(?::\s*(.*))?$", re.DOTALL)

KIND_ORDER = {"invariant": 0, "pre": 1, "post": 2}


@dataclass(frozen=True)
class ContractEntry:
    """One contract of one class or function of `kvcache`."""

    module: str               # e.g. "kvcache._cache"
    owner: str                # e.g. "SequenceCache.plan", "SequenceCache" (invariants), "wrap_runs"
    kind: str                 # "invariant", "pre" or "post"
    description: Optional[str]
    condition: str            # the condition's source text
    typed_error: bool         # raises a caller-facing error (error=...) instead of icontract's ViolationError

    @property
    def rule_ids(self) -> tuple[str, ...]:
        """The rule ids the description cites first; () when it cites none (a traceability gap)."""
        return cited_rules(self.description)

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Identifies the contract across interpreters (for the `python -O` comparison)."""
        return (self.module, self.owner, self.kind, self.description or self.condition)


def cited_rules(description: Optional[str]) -> tuple[str, ...]:
    """The known rule ids at the head of a contract description."""
    if not description:
        return ()
    match = _CITATION.match(description)
    if not match:
        return ()
    ids = tuple(match.group(1).split(", "))
    return ids if all(rule_id in BY_ID for rule_id in ids) else ()


# --- reading the conditions' source --------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _lambdas_by_line(path: str) -> dict[int, list[tuple[ast.Lambda, str]]]:
    """Every lambda passed as a contract's condition (first argument or condition=), by line."""
    source = pathlib.Path(path).read_text()
    found: dict[int, list[tuple[ast.Lambda, str]]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        candidates = list(node.args[:1]) + [kw.value for kw in node.keywords if kw.arg == "condition"]
        for candidate in candidates:
            if isinstance(candidate, ast.Lambda):
                body = ast.get_source_segment(source, candidate.body) or ""
                found.setdefault(candidate.lineno, []).append((candidate, " ".join(body.split())))
    return found


def condition_text(condition: Callable[..., Any]) -> str:
    """The source of a condition: a lambda's body, or a named function's name."""
    code = getattr(condition, "__code__", None)
    if code is None or condition.__name__ != "<lambda>":
        return f"{getattr(condition, '__name__', repr(condition))}(...)"
    try:
        path = inspect.getsourcefile(condition)
    except TypeError:
        path = None
    if path is None:
        return "<lambda>"
    arguments = list(code.co_varnames[:code.co_argcount])
    for node, text in _lambdas_by_line(path).get(code.co_firstlineno, []):
        if [arg.arg for arg in node.args.args] == arguments:
            return text
    return "<lambda>"


# --- collecting ----------------------------------------------------------------------------------

def core_modules() -> list[ModuleType]:
    """The modules of the reference implementation, in name order (optional backends excluded)."""
    names = sorted(info.name for info in pkgutil.iter_modules(kvcache.__path__) if not info.ispkg)
    return [kvcache] + [importlib.import_module(f"kvcache.{name}") for name in names]


def _entries(module: ModuleType, owner: str, kind: str, contracts: Sequence[Any]) -> Iterator[ContractEntry]:
    for contract in contracts:
        yield ContractEntry(module.__name__, owner, kind, contract.description,
                            condition_text(contract.condition), contract.error is not None)


def _function_entries(module: ModuleType, owner: str, function: Any) -> Iterator[ContractEntry]:
    checker = icontract._checkers.find_checker(function)
    if checker is None:
        return
    # icontract keeps preconditions as groups (one per class in the inheritance chain, weakened by OR).
    for group in getattr(checker, "__preconditions__", []):
        yield from _entries(module, owner, "pre", group)
    yield from _entries(module, owner, "post", getattr(checker, "__postconditions__", []))


def _signature(function: Any) -> str:
    try:
        parameters = [name for name in inspect.signature(function).parameters if name != "self"]
    except (TypeError, ValueError):
        return ""
    return "(" + ", ".join(parameters) + ")"


def collect_contracts() -> list[ContractEntry]:
    """Every contract of the reference, in module, then definition, then evaluation order."""
    entries: list[ContractEntry] = []
    for module in core_modules():
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(value):
                entries += _entries(module, name, "invariant", value.__dict__.get("__invariants__", []))
                for attribute, member in vars(value).items():
                    function = getattr(member, "__func__", member)  # unwrap static/class methods
                    # an inherited method an invariant re-wrapped here is listed once, under the class defining it
                    if inspect.isfunction(function) and function.__qualname__.split(".")[0] == name:
                        entries += _function_entries(module, f"{name}.{attribute}", function)
            elif inspect.isfunction(value):
                entries += _function_entries(module, name, value)
    return entries


def signatures() -> dict[str, str]:
    """owner -> "(arguments)" for every function with contracts (shown in the listing's headings)."""
    shown: dict[str, str] = {}
    for module in core_modules():
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(value):
                for attribute, member in vars(value).items():
                    function = getattr(member, "__func__", member)
                    if inspect.isfunction(function):
                        shown[f"{name}.{attribute}"] = _signature(function)
            elif inspect.isfunction(value):
                shown[name] = _signature(value)
    return shown


def _keys_under_o() -> set[tuple[str, str, str, str]]:
    """Collect again in a child interpreter started with `python -O`: the contracts that survive it."""
    code = ("import json; from kvcache_spec.specdoc import collect_contracts; "
            "print(json.dumps([list(e.key) for e in collect_contracts()]))")
    result = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True)
    return {(m, o, k, d) for m, o, k, d in json.loads(result.stdout)}


def collect_both_modes() -> tuple[list[ContractEntry], set[tuple[str, str, str, str]]]:
    """(every contract with assertions on, the keys of those still present under `python -O`).

    Only valid with assertions on (`generate` re-runs itself without -O otherwise).
    """
    if not __debug__:
        raise RuntimeError("postconditions and invariants are off under -O: collect without -O")
    return collect_contracts(), _keys_under_o()


# --- rendering -----------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_listing(entries: Sequence[ContractEntry], kept_under_o: set[tuple[str, str, str, str]],
                   shown_signatures: dict[str, str]) -> str:
    """The generated markdown between the markers (without the markers)."""
    lines = [
        "<!-- generated by `python -m kvcache_spec.specdoc` from the icontract decorators; do not edit -->",
        "",
        f"{len(entries)} contracts, {sum(e.key in kept_under_o for e in entries)} of them kept under `python -O`. "
        "Preconditions are listed in the order icontract evaluates them; *typed* means a violation raises "
        "a `KVCacheError` naming the rule and the argument (a caller error), otherwise icontract's "
        "`ViolationError` (a bug in the implementation).",
    ]
    current: Optional[tuple[str, str]] = None
    for entry in sorted(entries, key=lambda e: (e.module, _owner_rank(entries, e), KIND_ORDER[e.kind])):
        heading = (entry.module, entry.owner)
        if heading != current:
            current = heading
            path = entry.module.replace(".", "/") + ".py"
            title = entry.owner + ("" if entry.kind == "invariant" else shown_signatures.get(entry.owner, ""))
            what = "class invariants" if entry.kind == "invariant" else "method" if "." in entry.owner else "function"
            lines += ["", f"#### `{title}` ({what}, `{path}`)", "",
                      "| kind | rules | description | condition | error | under -O |",
                      "|---|---|---|---|---|---|"]
        rules = ", ".join(entry.rule_ids) or "**none**"
        text = entry.description or "**(no description)**"
        match = _CITATION.match(entry.description or "")
        if match and entry.rule_ids:
            text = match.group(2) or "-"
        kept = "kept" if entry.key in kept_under_o else "off"
        lines.append(f"| {entry.kind} | {rules} | {_cell(text)} | `{_cell(entry.condition)}` | "
                     f"{'typed' if entry.typed_error else 'violation'} | {kept} |")
    return "\n".join(lines) + "\n"


def _owner_rank(entries: Sequence[ContractEntry], entry: ContractEntry) -> int:
    """Owners keep their definition order (the order collect_contracts found them)."""
    owners: list[tuple[str, str]] = []
    for other in entries:
        if (other.module, other.owner) not in owners:
            owners.append((other.module, other.owner))
    return owners.index((entry.module, entry.owner))


def generate() -> str:
    """The listing. Under `python -O` the contracts this process sees are incomplete, so a child
    interpreter with assertions on renders it."""
    if not __debug__:
        code = "import sys; from kvcache_spec.specdoc import generate; sys.stdout.write(generate())"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    entries, kept = collect_both_modes()
    return render_listing(entries, kept, signatures())


def replace_section(document: str, listing: str) -> str:
    """`document` with the text between the markers replaced by `listing`."""
    begin, end = document.find(BEGIN), document.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"CONTRACTS.md has no {BEGIN} ... {END} section")
    return document[:begin + len(BEGIN)] + "\n" + listing + document[end:]


def committed_section(document: str) -> str:
    begin, end = document.find(BEGIN), document.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"CONTRACTS.md has no {BEGIN} ... {END} section")
    return document[begin + len(BEGIN):end].lstrip("\n")


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--check"]):
        print("usage: python -m kvcache_spec.specdoc [--check]", file=sys.stderr)
        return 2
    try:
        listing = generate()
        document = CONTRACTS_PATH.read_text()
        committed = committed_section(document)
    except (OSError, ValueError, RuntimeError, subprocess.CalledProcessError) as error:
        print(f"specdoc: {error}", file=sys.stderr)
        return 2
    if args == ["--check"]:
        if committed != listing:
            print("specdoc: the contract listing in spec/CONTRACTS.md is out of date; "
                  "run `python -m kvcache_spec.specdoc`", file=sys.stderr)
            return 1
        print("specdoc: the contract listing in spec/CONTRACTS.md is up to date")
        return 0
    CONTRACTS_PATH.write_text(replace_section(document, listing))
    print(f"specdoc: wrote the contract listing into {CONTRACTS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
