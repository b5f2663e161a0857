"""The CrossHair gate's obligations (crosshair_gate.py): every icontract condition of a package, found by
walking its modules, and the scope - what CrossHair does not analyse, and what covers each such
obligation instead (RULE_COVER, SCOPE; the cell cache's and SequenceCache's scopes by depth)."""

from __future__ import annotations

import ast
import fnmatch
import importlib
import importlib.util
import inspect
import linecache
import pkgutil
import re
import textwrap
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

from kvcache_spec.rules import RULES as _RULES

DEFAULT_PACKAGE = "kvcache"


# --- the inventory ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Obligation:
    """One contract check: a postcondition of `target`, or an invariant at method `target`."""

    target: str      # dotted: module.function or module.Class.method
    line: int        # the condition's line (its lambda's first line), CrossHair's key too
    kind: str        # "post", "invariant", or "crosshair" (a check CrossHair adds itself)
    text: str        # the description, or the condition's source line

    @property
    def key(self) -> tuple[str, int]:
        return (self.target, self.line)


def _condition_text(condition: Callable[..., Any], description: Optional[str]) -> str:
    if description:
        return description
    code = getattr(condition, "__code__", None)
    if code is None:
        return repr(condition)
    return linecache.getline(code.co_filename, code.co_firstlineno).strip()


def _line_of(condition: Callable[..., Any]) -> int:
    code = getattr(condition, "__code__", None)
    return code.co_firstlineno if code is not None else 0


def _unwrap_chain(value: Any) -> Iterable[Any]:
    seen = 0
    while value is not None and seen < 20:
        yield value
        value = getattr(value, "__wrapped__", None)
        seen += 1


def _postconditions(function: Any) -> list[Any]:
    """icontract's postconditions of `function` (empty when none, e.g. under python -O)."""
    from icontract import _checkers  # icontract's own lookup, the one it uses for inheritance

    checker = _checkers.find_checker(function)
    return list(getattr(checker, "__postconditions__", []) or []) if checker is not None else []


def _invariant_wrapped(value: Any) -> bool:
    return any(getattr(layer, "__is_invariant_check__", False) for layer in _unwrap_chain(value))


def _modules_of(package: str) -> list[types.ModuleType]:
    root = importlib.import_module(package)
    modules = [root]
    for info in pkgutil.walk_packages(getattr(root, "__path__", []), prefix=package + "."):
        modules.append(importlib.import_module(info.name))
    return modules


def inventory(package: str = DEFAULT_PACKAGE) -> list[Obligation]:
    """Every postcondition and every (invariant, wrapped method) pair icontract enforces in `package`."""
    obligations: list[Obligation] = []
    for module in _modules_of(package):
        for name, member in sorted(vars(module).items()):
            if getattr(member, "__module__", None) != module.__name__:
                continue  # imported, inventoried where it is defined
            if inspect.isfunction(member):
                for contract in _postconditions(member):
                    obligations.append(Obligation(f"{module.__name__}.{name}", _line_of(contract.condition), "post",
                                                  _condition_text(contract.condition, contract.description)))
            elif inspect.isclass(member):
                obligations.extend(_class_obligations(module.__name__, member))
    return sorted(set(obligations), key=lambda o: (o.target, o.line))


def _class_obligations(module_name: str, cls: type) -> list[Obligation]:
    owner = f"{module_name}.{cls.__qualname__}"
    found: list[Obligation] = []
    for name, value in vars(cls).items():
        function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if inspect.isfunction(function):
            for contract in _postconditions(function):
                found.append(Obligation(f"{owner}.{name}", _line_of(contract.condition), "post",
                                        _condition_text(contract.condition, contract.description)))
    invariants = list(getattr(cls, "__invariants__", []) or [])
    if invariants:
        for name in dir(cls):
            if _invariant_wrapped(inspect.getattr_static(cls, name)):
                for invariant in invariants:
                    found.append(Obligation(f"{owner}.{name}", _line_of(invariant.condition), "invariant",
                                            _condition_text(invariant.condition, invariant.description)))
    return found


# --- the scope: what CrossHair does not analyse, and what covers it -----------------------------------

@dataclass(frozen=True)
class Exclusion:
    """Obligations matching `pattern` (fnmatch on the target) and `kinds` are not sent to CrossHair."""

    pattern: str
    kinds: frozenset[str]
    reason: str
    covered_by: tuple[str, ...]
    read_only: bool = False  # the gate checks (AST) that the matched methods assign no attribute
    spare_posts_of: tuple[str, ...] = ()  # fnmatch patterns of targets whose postconditions stay in scope


# Rule id (as cited in a contract's description) -> what proves it when CrossHair cannot.
# Z3 names are proofs of kvcache_proofs.z3_induction (a test checks they exist); "crosshair:X" a target
# this gate confirms; "model checker" is kvcache_proofs.model_checker, which runs the implementation,
# contracts enabled, over every state of small configurations; "tests:F" a test file that calls the
# contracted code with its contracts enabled (evidence, not proof).
RULE_COVER: dict[str, tuple[str, ...]] = {
    "LEN-BOUNDS": ("z3:inv-initial", "z3:inv-commit", "z3:inv-rewind", "z3:inv-clear", "model checker"),
    "RETAINED": ("z3:inv-initial", "z3:inv-commit", "z3:inv-rewind", "z3:inv-clear",
                 "crosshair:RingPolicy.retained_after_write", "crosshair:FlatPolicy.retained_after_write",
                 "crosshair:retained_after_rewind", "model checker"),
    "STEP-APPEND": ("model checker",),
    "PLAN-PURE": ("model checker",),
    "ADMIT": ("model checker",),
    "PLAN-WRITE": ("z3:plan-in-depth", "crosshair:RingPolicy.plan", "crosshair:FlatPolicy.plan", "model checker"),
    "PLAN-READ": ("z3:plan-in-depth", "crosshair:RingPolicy.plan", "crosshair:FlatPolicy.plan", "model checker"),
    "PLAN-SHAPE": ("z3:plan-in-depth", "z3:wrap-runs", "crosshair:wrap_runs", "model checker"),
    "DEPTH": ("z3:plan-in-depth", "crosshair:RingPolicy.depth", "crosshair:FlatPolicy.depth", "model checker"),
    "ATOMIC": ("model checker",),
    "REWIND-GROW": ("model checker",),
    "REWIND-SOUND": ("z3:rewind-safe", "z3:rewind-rule-exact", "z3:rewind-to-length-and-zero", "model checker"),
    "COMMIT-ADVANCE": ("z3:inv-commit", "model checker"),
    "CLEAR": ("z3:inv-clear", "model checker"),
    "CFG-LAYERS": ("model checker",),
    "CFG-DEDUP": ("model checker",),
    "FACES": ("model checker",),
    # Contracts on the adapters around the cache, run (contracts enabled) by these test files:
    "ET-MAP": ("tests:tests/test_rules.py", "tests:tests/test_upstream.py"),
    "REG-SESSION": ("tests:tests/test_registry.py", "tests:tests/test_upstream.py"),
}

_ESTABLISHED = "crosshair: RingPolicy.__init__ establishes the invariant (confirmed rows above)"
SCOPE: tuple[Exclusion, ...] = (
    Exclusion(
        "*.__delattr__", frozenset({"invariant"}),
        "icontract re-checks the invariants after `del obj.attr`; SequenceCache and RingPolicy define __delattr__ "
        "to refuse (AttributeError before any change), and CrossHair does not analyse __delattr__ (measured: "
        "'Targets found, but contain no checkable functions')",
        ("frame check: __delattr__ assigns no attribute", "tests:tests/test_bad_input.py"), read_only=True),
    Exclusion(
        "kvcache.et.*", frozenset({"post", "crosshair"}),
        "the argument is an abstract face (SequencePlanner / SequenceControl): CrossHair would have to invent "
        "every implementation of it - 'Not confirmed' (8 s); and the contract is about mapping the face's typed "
        "precondition errors, which CrossHair replaces with its own precondition enforcement",
        ("per rule, see RULE_COVER",)),
    Exclusion(
        "kvcache._registry.CacheSession.*", frozenset({"post", "invariant", "crosshair"}),
        "a process-global registry behind a lock, holding an abstract CacheBase: 'Not confirmed' (8 s)",
        ("per rule, see RULE_COVER",)),
    Exclusion(
        "kvcache._policies.RingPolicy.__eq__", frozenset({"invariant"}),
        "`other: object` ranges over every type: CrossHair reports 'Not confirmed' (5 s)",
        ("frame check: __eq__ assigns no attribute", _ESTABLISHED), read_only=True),
    Exclusion(
        "kvcache._policies.RingPolicy.__ne__", frozenset({"invariant"}),
        "object.__ne__ calls __eq__, whose `other: object` ranges over every type: 'Not confirmed' (8 s)",
        ("frame check: __eq__ assigns no attribute", _ESTABLISHED), read_only=True),
    Exclusion(
        "kvcache._policies.RingPolicy.__hash__", frozenset({"invariant"}),
        "hashing a tuple realises the symbolic ints: 'Not confirmed' (5 s)",
        ("frame check: __hash__ assigns no attribute", _ESTABLISHED), read_only=True),
    Exclusion(
        "kvcache._policies.RingPolicy.__str__", frozenset({"invariant"}),
        "object.__str__ calls __repr__, whose f-string realises the symbolic ints: 'Not confirmed' (5 s)",
        ("frame check: __repr__ assigns no attribute", _ESTABLISHED), read_only=True),
    Exclusion(
        "kvcache._op_*", frozenset({"post", "invariant", "crosshair"}),
        "the op face (kvcache.op) takes numpy arrays and torch tensors, which CrossHair does not model "
        "symbolically; its integer bookkeeping is SequenceCache's and CellCache's, analysed above",
        ("tests:tests/test_op_reference.py", "tests:tests/test_op_bad_input.py", "tests:tests/test_op_torch.py")),
    Exclusion(
        "kvcache.reference_cache.*", frozenset({"post", "invariant", "crosshair"}),
        "the drop-in under upstream's op: the op face's caches (kvcache._op_*, above) answering in upstream's "
        "AttendSpec class; it takes numpy arrays and torch tensors, which CrossHair does not model symbolically",
        ("tests:tests/test_dropin.py", "tests:tests/test_op_reference.py", "tests:tests/test_op_bad_input.py")),
)


# --- the paged layout (kvcache._paged_*, issue 43): its scope entries, in their own block ----------------
# The block arithmetic (kvcache._paged_blocks: blocks_for, first_needed_block, most_hit_blocks) is pure int
# arithmetic and stays in every scope. The cache and its pool are left out: their state is an OrderedDict free
# queue, per-group dicts keyed by PrefixKey objects (sha256 digests and token tuples) and lists of block tables,
# which CrossHair would have to invent symbolically whole. What covers their postconditions and the pool's
# invariants instead, per rule: the exhaustive paged checker (every state of small pools to a depth bound, the
# contracts on), the lockstep machine against the model and the reference's own tests (contracts on).
_PAGED_COVER = ("tests:tests/test_paged_checker.py", "tests:tests/test_paged_lockstep.py",
                "tests:tests/test_paged_reference.py")
RULE_COVER.update({rule.id: _PAGED_COVER for rule in _RULES if rule.id.startswith("PAGED-")})
_PAGED_WHY = ("symbolic state out of CrossHair's reach: an OrderedDict free queue and dicts keyed by PrefixKey "
              "(sha256 digests over token tuples); checked instead over every state of small pools and in lockstep "
              "with the model, the contracts on")
SCOPE = (   # first: `*.__delattr__` above would otherwise take the pool's invariants at object.__delattr__
    Exclusion("kvcache._paged_cache.*", frozenset({"post", "invariant", "crosshair"}), _PAGED_WHY,
              ("per rule, see RULE_COVER",)),
    Exclusion("kvcache._paged_pool.*", frozenset({"post", "invariant", "crosshair"}), _PAGED_WHY,
              ("per rule, see RULE_COVER",)),
) + SCOPE


# --- the cell layout (kvcache._cells, issue 12): its scope entries, in their own block ------------------
# CellCache is analysed from a symbolic state too (`_crosshair_plugin.make_cell_cache`: concrete owner
# tables of two sequence ids, symbolic capacity, window, positions and books; the invariants assumed on
# entry). What a cell scope leaves out is covered per rule by the model checker's cell layout (every
# reachable state of small configurations, the contracts enabled) and the tests that run it contracts on.
_CELL_COVER = ("model checker", "tests:tests/test_cell_stateful.py", "tests:tests/test_cell_cache.py")
RULE_COVER.update({rule.id: _CELL_COVER for rule in _RULES if rule.id.startswith("CELL-")})

#: How much of CellCache the gate analyses (as SEQUENCE_CACHE_SCOPES; None: the same as sequence_cache):
#: "full" every obligation (the deep profile), "fast" the postconditions of FAST_CELL_TARGETS, "none".
CELL_CACHE_SCOPES = ("none", "fast", "full")
FAST_CELL_TARGETS: tuple[str, ...] = ("free_cells",)
#: CellCache methods the full cell scope leaves out, and why (measured with the deep profile's bounds: 20000
#: paths and 60 s of CPU per condition; `--analyse-cell METHOD` analyses one of them anyway, to measure it).
#: Each is unknown because a symbolic argument is realised or iterated: every value or length is a path.
CELL_OUT_OF_FULL: dict[str, str] = {
    "__init__": "unknown: 4236 paths, then the 60 s CPU safety net (its first CELL-OWNERS invariant, and CrossHair's "
                "own no-exception check: 4319 paths; 10-13 s of CPU per condition at 1000 paths before): "
                "`[0] * max_seqs` realises the symbolic max_seqs, 64 values for each configuration the creator makes",
    "declare_step": "unknown: 2074 paths, then the 60 s CPU safety net (its CELL-DECLARE postcondition): seq_ids is "
                    "a sequence of any type and length, and the search spends its paths on the ones CELL-DECLARE and "
                    "CELL-SEQ-ID reject (its precondition checks every id: each length is a path; 26 of the first 60 "
                    "paths)",
    "place_step": "unknown: 1988 paths, then the 60 s CPU safety net (its first CELL-STEP-SHAPE postcondition): "
                  "positions is a sequence of any type and length, and CELL-POS checks every position before the "
                  "length (the documented order of errors), so the rejected ones are a path each (115 of the "
                  "first 150 paths)",
}
#: Measured into the full scope, method by method, twice each with identical verdicts and paths
#: (proofs/MEASUREMENTS.md, "CellCache"):
#: seq_new (90 paths, <= 1.2 s of CPU per condition), seq_len (<= 441, 7.7 s), next_pos (<= 447, 6.2 s),
#: seq_clone (<= 630, 9.4 s), seq_rm (<= 752, 12.6 s).


def _is_cell_target(target: str, package: str) -> bool:
    return target.startswith(f"{package}._cells.CellCache.")


def cell_scope_for(cell_cache: str, package: str = "kvcache",
                   analyse: Iterable[str] = ()) -> tuple[Exclusion, ...]:
    """What `cell_cache` (CELL_CACHE_SCOPES) leaves out of CellCache, with its cover per rule. `analyse`
    names methods of CELL_OUT_OF_FULL the full scope analyses anyway (to measure them: a wider scope,
    never a weaker gate)."""
    if cell_cache not in CELL_CACHE_SCOPES:
        raise ValueError(f"cell_cache must be one of {CELL_CACHE_SCOPES}, not {cell_cache!r}")
    unknown = sorted(set(analyse) - set(CELL_OUT_OF_FULL))
    if unknown:
        raise ValueError(f"not in CELL_OUT_OF_FULL: {', '.join(unknown)} (choose among {', '.join(CELL_OUT_OF_FULL)})")
    if analyse and cell_cache != "full":
        raise ValueError("analysing a method of CELL_OUT_OF_FULL needs cell_cache 'full'")
    if cell_cache == "full":
        return tuple(Exclusion(f"{package}._cells.CellCache.{name}", frozenset({"post", "invariant", "crosshair"}),
                               why, ("per rule, see RULE_COVER",)) for name, why in CELL_OUT_OF_FULL.items()
                     if name not in analyse)
    spared = tuple(f"{package}._cells.CellCache.{name}" for name in FAST_CELL_TARGETS) if cell_cache == "fast" else ()
    return (Exclusion(
        f"{package}._cells.CellCache.*", frozenset({"post", "invariant", "crosshair"}),
        "analysed from a symbolic cell state only with --cell-cache full (the deep profile)"
        + (f"; here only the postconditions of {', '.join(FAST_CELL_TARGETS)}" if spared else ""),
        ("per rule, see RULE_COVER",), spare_posts_of=spared),)


# --- SequenceCache: analysed from a symbolic state (kvcache_proofs._crosshair_plugin) --------------------

#: How much of SequenceCache the gate analyses: "full" every obligation (the deep profile), "fast" the
#: postconditions of FAST_CACHE_TARGETS (about a second of CPU; the default, so pre-merge), "none" nothing.
SEQUENCE_CACHE_SCOPES = ("none", "fast", "full")
DEFAULT_SEQUENCE_CACHE = "fast"
FAST_CACHE_TARGETS = ("can_extend", "clear", "retained_from")
#: Targets whose conditions are analysed once per layer shape of the plugin, each in its own worker:
#: they are the expensive ones (ring arithmetic with a symbolic ring size), and a split runs in parallel.
SPLIT_CACHE_TARGETS = ("plan", "rewind", "commit")
#: CPU seconds per condition (per shape for the split targets) for SequenceCache; also its per-path
#: timeout: one path through RingPolicy.plan with a symbolic ring size can take several seconds. 60 s
#: covers every target of the full scope (rewind, the slowest, takes ~16 s per condition and shape);
#: the 240 s runs that measured plan and commit are in the docstring.
CACHE_CONDITION_TIMEOUT = 60.0


def _is_cache_target(target: str, package: str) -> bool:
    return target.startswith(f"{package}._cache.SequenceCache.")


def scope_for(sequence_cache: str = DEFAULT_SEQUENCE_CACHE, package: str = DEFAULT_PACKAGE,
              cell_cache: Optional[str] = None, analyse_cell: Iterable[str] = ()) -> tuple[Exclusion, ...]:
    """The gate's scope: SCOPE, plus what `sequence_cache` (SEQUENCE_CACHE_SCOPES) leaves out of SequenceCache
    and what `cell_cache` (CELL_CACHE_SCOPES; None: the same as sequence_cache) leaves out of CellCache
    (less the methods of CELL_OUT_OF_FULL named in `analyse_cell`, see cell_scope_for)."""
    cells = cell_scope_for(sequence_cache if cell_cache is None else cell_cache, package, analyse_cell)
    if sequence_cache not in SEQUENCE_CACHE_SCOPES:
        raise ValueError(f"sequence_cache must be one of {SEQUENCE_CACHE_SCOPES}, not {sequence_cache!r}")
    cache = f"{package}._cache.SequenceCache"
    commit = Exclusion(
        f"{cache}.commit", frozenset({"post", "invariant", "crosshair"}),
        "COMMIT-ISSUED admits only a plan equal to the cache's own plan of the step, whose ring rows are "
        "position mod (window + max_write - 1) with a symbolic ring size: a nonlinear equality the solver "
        "does not decide. Measured on one ring: 'Not confirmed' at 400 s CPU with a plan of free fields, and at "
        "200 s with a plan drawn from the cache's own policy (the flat shape confirms in 9 s)",
        ("per rule, see RULE_COVER",))
    plan = Exclusion(
        f"{cache}.plan", frozenset({"post", "invariant", "crosshair"}),
        "the ring's rows are position mod (window + max_write - 1) with a symbolic ring size, and on the ring "
        "shapes the verdicts depend on the run: in each of three full-scope runs at 240 s CPU per condition and "
        "shape, one or two of its 9 conditions ended 'Not confirmed', a different one each time (the flat shape "
        "always confirms); a verdict that depends on the run is no gate",
        ("per rule, see RULE_COVER",))
    if sequence_cache == "full":
        return (commit, plan) + cells + SCOPE
    ring_plan = Exclusion(
        f"{package}._policies.RingPolicy.plan", frozenset({"post", "invariant", "crosshair"}),
        "confirmed in the deep profile (--sequence-cache full), left out of the quicker scopes for its cost: "
        "22 paths but 2-2.6 s of CPU per condition, 6 conditions, about a quarter of what pre-merge may "
        "spend on two busy cores",
        ("z3:plan-in-depth", "z3:wrap-runs", "crosshair:wrap_runs", "model checker",
         "crosshair in the deep profile"))
    spared = tuple(f"{cache}.{name}" for name in FAST_CACHE_TARGETS) if sequence_cache == "fast" else ()
    rest = Exclusion(
        f"{cache}.*", frozenset({"post", "invariant", "crosshair"}),
        "analysed from a symbolic state only with --sequence-cache full (the deep profile: minutes of CPU)"
        + (f"; here only the postconditions of {', '.join(FAST_CACHE_TARGETS)}" if spared else ""),
        ("per rule, see RULE_COVER",), spare_posts_of=spared)
    return (commit, plan, rest, ring_plan) + cells + SCOPE


def covers_for(obligation: Obligation, exclusion: Exclusion) -> tuple[str, ...]:
    """What covers an excluded obligation: the exclusion's list, or per rule id for SequenceCache."""
    if exclusion.covered_by != ("per rule, see RULE_COVER",):
        return exclusion.covered_by
    # A rule id counts where it stands as a whole token: ATOMIC is not cited by a text naming PAGED-ATOMIC.
    rules = [rule for rule in RULE_COVER if re.search(rf"(?<![A-Z0-9-]){re.escape(rule)}(?![A-Z0-9-])", obligation.text)]
    return tuple(dict.fromkeys(cover for rule in rules for cover in RULE_COVER[rule]))  # () is a gate problem


def _exclusion_for(obligation: Obligation, scope: Sequence[Exclusion]) -> Optional[Exclusion]:
    for exclusion in scope:
        if obligation.kind in exclusion.kinds and fnmatch.fnmatchcase(obligation.target, exclusion.pattern):
            if obligation.kind == "post" and any(fnmatch.fnmatchcase(obligation.target, spared)
                                                 for spared in exclusion.spare_posts_of):
                continue
            return exclusion
    return None


def _resolve(target: str) -> Any:
    """The object a dotted target names (module attribute path)."""
    parts = target.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            obj = inspect.getattr_static(obj, part)
        return obj
    raise ImportError(target)


# object's default methods that only call another method of the instance.
_OBJECT_DELEGATES = {"__str__": "__repr__", "__ne__": "__eq__"}


def frame_violations(target: str) -> list[str]:
    """Assignments to attributes (or setattr/delattr calls) in the method `target`; [] if read-only.

    object.__str__ and object.__ne__ are judged by the method they call (__repr__, __eq__). A method whose source cannot
    be read is reported as a violation: a frame check that cannot look is no check.
    """
    owner_name, method = target.rsplit(".", 1)
    owner = _resolve(owner_name)
    function = inspect.unwrap(inspect.getattr_static(owner, method))  # under icontract's invariant wrapper
    delegate = _OBJECT_DELEGATES.get(method)
    if delegate is not None and function is getattr(object, method):
        method = delegate
        function = inspect.unwrap(inspect.getattr_static(owner, method))
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError) as error:
        return [f"{target}: source unavailable ({error})"]
    problems: list[str] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            if name in ("setattr", "delattr", "__setattr__", "__delattr__"):
                problems.append(f"{owner_name}.{method}: calls {name} (line {node.lineno})")
        problems += [f"{owner_name}.{method}: assigns an attribute (line {t.lineno})"
                     for t in targets if isinstance(t, (ast.Attribute, ast.Subscript))]
    return problems
