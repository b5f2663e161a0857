"""The CrossHair gate: every icontract obligation in `kvcache` is confirmed over all paths, or the gate fails.

What it checks. An *obligation* is a postcondition of a function or method, or a class invariant at
one method icontract wraps with the invariant check (so an invariant of a class with 15 wrapped
methods is 15 obligations). The gate takes the inventory from icontract itself (what actually runs),
not from CrossHair, so a contract CrossHair does not enumerate still shows up - as a failure, unless
the scope below names it and says what covers it instead.

How it checks. Each in-scope condition of a target (a function or one method) is analysed in a fresh
forked worker with CrossHair's `check` pipeline for `--analysis_kind=icontract` (load the target,
`analyze_any`, analyse that condition), two workers at a time. Targeting methods one by one also
closes a blind spot: when CrossHair analyses a whole class it skips the invariants on `__init__`
(its analyze_class says so), while a method target gets them - and the inventory demands an
(invariant, `__init__`) row, so a CrossHair that skipped them would fail the gate, not pass it.

Why not the CLI. The gate calls that pipeline through CrossHair's API rather than parsing
`crosshair check --report_all` output because the CLI merges
messages by source line (a refuted postcondition is reported only at the line that raised, its
sibling conditions vanish) and its exit code is 0 for "Not confirmed", for "Unable to meet
precondition" and for "Targets found, but contain no checkable functions" (which is what `python -O`
produces: the postconditions and invariants are compiled out). A fresh process per condition also
matters: CrossHair state left by one analysis (e.g. of `__eq__` taking `other: object`) makes later
analyses in the same process end "Unable to meet precondition" (measured), and the CLI on a whole
module is order dependent for that reason; conditions analysed one after another in one process
also get slower (measured). CrossHair itself is imported only in a forked "zygote" and its workers:
importing `crosshair.core_and_libs` patches icontract in the importing process (measured: a
SequenceCache.plan with a gap stops raising), so `run_gate` can be called from any process.

What "confirmed" needs (CrossHair's own account, discussion pschanely/CrossHair#156): the search
exhausted every path (`Confirmed over all paths.`), the code is deterministic, and the callees'
contracts hold. CrossHair enforces a contracted callee's preconditions at the call (a violation is a
counterexample of the caller) but not its postconditions or its class's invariants: it may skip the
callee's body and assume its postconditions ("short-circuiting"), so a callee's false postcondition
is never reported at the caller - measured here: a caller of a function with a false postcondition
is "Confirmed over all paths", and so is a driver function whose SequenceCache.rewind breaks its own
postcondition and invariant on every call. A confirmation is therefore about the target's own
conditions, assuming its callees' postconditions; the gate checks every contracted callee as a
target of its own (all of `kvcache` is inventoried), which makes the confirmations compose (no
recursion here), and it does not use driver functions as evidence for the contracts they call.
Every obligation must reach "confirmed". The verdict (`GateResult.verdict`, exit code): PASS (0) when
all do; FAIL (1) on a counterexample, "Unable to meet precondition", a CrossHair error, an empty
inventory or a gate problem (frame check, missing cover); otherwise INCOMPLETE (3) when some row is
unknown ("Not confirmed": a bound stopped the search) or not run (the wall-clock budget ran out, or
--select left it out). Unknown is never PASS and never reported as a counterexample.

Work bounds decide, clocks are safety nets (the constants after the statuses): at most
`DEFAULT_MAX_ITERATIONS` paths per condition, Z3's deterministic `rlimit` (`SMT_RLIMIT`) per solver
query instead of the wall-clock timeout CrossHair otherwise gives each query, and CPU and wall limits
far above the measured needs. Before these bounds the pre-merge gate flaked under load: one
RingPolicy.plan query missed its 2.2 s wall-clock timeout and the condition ended "Not confirmed"
after 20 s of CPU (issue 11); with the rlimit it is confirmed in 22 paths, identically run after run.

Scope (what is *not* sent to CrossHair, and what covers it instead) is `scope_for(sequence_cache)`:
the table `SCOPE` plus the SequenceCache part; the gate prints it with the results.

SequenceCache is analysed from a symbolic state. CrossHair cannot construct a SequenceCache through
its constructor (a CacheConfig holding a list of LayerConfig objects: every condition ended "Unable
to meet precondition", 10 s each), so `kvcache_proofs._crosshair_plugin` registers a creator
(`crosshair.register_type`) in the workers: a symbolic configuration (capacity, ring windows and
max_write symbolic within the config checks; four layer shapes: flat, ring, flat + ring, ring + ring)
and a symbolic state (length, open step, retained marks) constrained by nothing but the class
invariants, which CrossHair assumes on entry; `__init__` is analysed with a creator of such configs. A confirmed postcondition or invariant therefore holds
from every state the invariants allow, reachable or not: an inductive check. The class invariants as
written suffice for every postcondition (no invariant was strengthened, the creator adds no state
constraint). `plan`, `rewind` and `commit` are analysed once per layer shape (a worker each; the
worst verdict counts, and a shape that did not answer makes the row not-run) with
`cache_condition_timeout` CPU seconds per condition and per path.
How much runs is `sequence_cache`: "full" (every obligation but commit's and plan's; the deep profile),
"fast" (the default, so pre-merge: the postconditions of can_extend, clear and retained_from, about
a second more; RingPolicy.plan is left to "full" for its cost, 6 conditions at 2-2.6 s of CPU each),
"none". What a scope leaves out is listed as out of scope with its rule's cover.

CellCache (issue 12) is analysed from a symbolic cell state too (`_crosshair_plugin.make_cell_cache`: two
ids, a flat and a windowed layer, symbolic capacity, window and positions over four small owner tables,
the forward closed or declared; its docstring says what it does not cover). How much runs is
`cell_cache` (CELL_CACHE_SCOPES, by default the same as `sequence_cache`): "full" every obligation but
__delattr__'s and those of the methods in CELL_OUT_OF_FULL, 251 obligations of 23 methods; "fast" the
postcondition of FAST_CELL_TARGETS (free_cells: 156 paths, 1.5-2.3 s of CPU, the gate's CPU +5.6 s with its
worker and the plugin's registration, measured under load); "none". Measured on the full cell scope:
all 251 confirmed in one run (`--select 'kvcache._cells.CellCache.*'
--workers 1 --max-iterations 20000`: 739 s of CPU, 13.5 min wall under load), at most 752 paths and 10.8 s
of CPU per condition; the 187 of the 18 methods measured first, at most 182 paths and 2.3 s each. seq_new, seq_len, next_pos, seq_clone and seq_rm were first measured
method by method (`--analyse-cell`), twice each with the deep profile's bounds (20000 paths, 60 s of CPU
per condition): every condition confirmed, with the same paths in both runs (at most 752, 12.6 s of CPU).
__init__, declare_step and place_step stay out, unknown (CELL_OUT_OF_FULL says why, with the numbers).
CELL-OWNERS' uniqueness is checked by sorting each sequence's positions, not by hashing them (hashing
realised the symbolic positions: 1000 paths and unknown for free_cells). The cell preconditions' validators
return a deferred error (`kvcache._cells._Fault`), not the error: building it formats the value, which
realised a symbolic seq id, one path per value outside the range (seq_len: 1213 paths, then the 60 s CPU
net, unknown; deferred: 434 paths, 4-6 s). CELL-OWNERS bounds a cell's position by CELL-POS's INT_MAX - 1:
with INT_MAX, the invariants admitted a state no call reaches, from which next_pos returned INT_MAX + 1
(CrossHair's counterexample to "next_pos fits an int").

The code is written so that confirmations are reachable and mean what they say:
- CFG-DEDUP compares policies pairwise instead of hashing them (hashing realises symbolic ints).
- `plan` and `depth` look their policy up with the unchecked `_policy_of` after their own
  preconditions have validated the layer, instead of re-entering the public, contracted `policy()`.
- `policy(layer)` validates its layer, so CrossHair's policy(-2) no longer refutes the invariants.
- `SequenceCache.__delattr__` and `RingPolicy.__delattr__` refuse before any change. CrossHair does
  not analyse `__delattr__` at all ("no checkable functions"), so the invariants icontract re-checks
  there are out of scope, covered by the frame check (the method assigns nothing) and a test.
Out of the full scope: `plan`. On the ring shapes its verdicts depend on the run: in each of three
full-scope runs (240 s CPU per condition and shape) one or two of its 9 conditions ended "Not
confirmed", a different one each time (PLAN-PURE, PLAN-SHAPE, ADMIT, CFG-LAYERS), and the others
were confirmed; the flat shape always confirms. A first-lap
branch in the ring's slot arithmetic (slot = position while position < n_slots) helped PLAN-SHAPE on
two rings but doubled RingPolicy.plan's own cost (9-10 s CPU per condition, beyond the pre-merge
budget), so the code keeps the plain mod. Covered per rule: Z3 plan-in-depth, the model checker.
Always out: `commit`. COMMIT-ISSUED admits only a plan equal to the cache's own plan of the step,
and on a ring that equality involves `position mod (window + max_write - 1)` with a symbolic ring
size. Measured on the ring shape: "Not confirmed" at 400 s CPU with a SeqStepPlan of free fields, and
at 200 s with a plan drawn from the cache's own policy for a symbolic step (the flat shape confirms in
9 s). Covered per rule (Z3 inv-commit, the model checker), like every other exclusion.

Blind spot by design: CrossHair assumes preconditions. Here preconditions are input validation that
raises typed errors (icontract's `error=`), and CrossHair replaces them with its own enforcement, so
the rejection path - the typed error, the unchanged state - is not CrossHair's to confirm; the tests,
the state machine and the model checker drive it (every bad call, state compared before and after).

Other exclusions: `RingPolicy`'s invariants at `__eq__`, `__ne__`, `__hash__`, `__str__` (unbounded
`other: object`, hashing and formatting realise symbolic ints: "Not confirmed" at 5-8 s), covered by
a frame check this gate runs (the methods assign no attribute) plus the confirmed rows that
establish the invariant; the adapters `kvcache.et` (their contract is about mapping the typed errors
of a face they are given, the path CrossHair replaces, see above) and `CacheSession` (a process-global
registry behind a lock), covered per rule (`RULE_COVER`: tests that run them with contracts enabled);
and the op face (`kvcache._op_*`: numpy arrays and torch tensors, which CrossHair does not model; its
integer bookkeeping is SequenceCache's and CellCache's), covered by the tests that run it contracts on.
An excluded obligation whose description cites no rule of `RULE_COVER` is a gate failure: a new
contract cannot fall out of scope silently.

CrossHair's CLI, for the record (0.0.113): `crosshair check --report_all` prints one line per
condition, `FILE:LINE: info: Confirmed over all paths.`, `... info: Not confirmed.`, `... info:
Unable to meet precondition.`, or `FILE:LINE: error: ... when calling f(args)` for a counterexample;
`--report_verbose` adds the source context and a sentence ("I was able to confirm your postcondition
over all paths." / "I wasn't able to find a counterexample." / "I am having trouble finding any
inputs that meet your preconditions."). Exit codes: 0 no counterexample, 1 counterexample(s), 2
other error. `--per_condition_timeout` bounds CPU seconds per condition (and, when set, lifts the
default `--max_uninteresting_iterations` of 5, which would stop a search before it is exhausted);
`--per_path_timeout` defaults to its square root, and each Z3 query gets half the per-path timeout as
wall clock unless CROSSHAIR_SMT_RLIMIT gives it a work limit. `--max_iterations` bounds the paths. The
gate sets the paths and the rlimit as its work bounds, and the timeouts as safety nets.

API: `run_gate(budget_seconds=60.0, ..., sequence_cache="fast", max_iterations=1000) -> GateResult`
(`.verdict`, `.passed`, `.summary()`, `.table()`,
`.rows`, `.excluded`, `.problems`; raises ImportError when CrossHair or Z3 is missing), and
`main(argv)` (exit 0 pass, 1 fail, 2 environment error). Run:
`python -m kvcache_proofs.crosshair_gate [--budget S] [--max-iterations N] [--sequence-cache none|fast|full]`.
Measured on this 2-core machine (default scope "fast", 38 obligations): 6 s wall, 11 s of CPU, quiet;
the most paths any of them needs is 189, the most CPU 2.6 s (proofs/MEASUREMENTS.md: the stress measurement).
The full scope's measurements in this docstring (run-dependent plan verdicts, 650 s of CPU) were
taken before the work bounds, with wall-clock solver timeouts; not re-measured since.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib
import importlib.util
import inspect
import linecache
import multiprocessing
import pkgutil
import re
import sys
import textwrap
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

from kvcache_proofs._processes import default_sigterm, from_wall_clock, to_wall_clock
from kvcache_spec._extras import missing_line

from kvcache_spec.rules import RULES as _RULES

# Statuses of one obligation. Only CONFIRMED passes.
CONFIRMED = "confirmed"
COUNTEREXAMPLE = "counterexample"
UNKNOWN = "unknown"              # CrossHair: "Not confirmed." (paths left unexplored)
PRE_UNSAT = "precondition-unmet"  # CrossHair: "Unable to meet precondition."
ERROR = "error"                  # CrossHair could not analyse (syntax, import, crash)
NOT_RUN = "not-run"              # inventoried but no CrossHair result (budget, or CrossHair skipped it)
#: A gate problem that means "did not finish" (the wall-clock safety net), not "failed".
BUDGET_PROBLEM = "budget exhausted"

#: The gate's exit code per verdict (2 is an environment error: CrossHair or Z3 missing).
EXIT_CODES = {"PASS": 0, "FAIL": 1, "INCOMPLETE": 3}

DEFAULT_PACKAGE = "kvcache"
DEFAULT_BUDGET_SECONDS = 60.0  # wall clock for the whole gate: a safety net (the work bounds follow)

# --- the work bounds (what decides a verdict) and the safety nets (what stops a runaway) -------------
#: Paths CrossHair may explore per condition (per layer shape for SPLIT_CACHE_TARGETS). A condition
#: that has not exhausted its paths by then is unknown, on every machine alike. Measured: the most any
#: condition of the pre-merge scope needs is 189 paths (SequenceCache.retained_from), so 5x room.
DEFAULT_MAX_ITERATIONS = 1000
#: Z3's resource limit per solver query (`rlimit`: a count of solver steps, deterministic), in place of
#: the wall-clock timeout CrossHair otherwise gives each query (half the per-path timeout). That
#: timeout was the flake: under load a RingPolicy.plan query missed its 2.2 s and the condition ended
#: "Not confirmed" after 20 s of CPU; with the wall clock out of the way it is confirmed in 22 paths
#: (2-3 s of CPU). 50 million units are about 7 s of solving here.
SMT_RLIMIT = 50_000_000
#: CPU seconds per condition: a safety net only (the worst in-scope condition takes 2.6 s); a path
#: gets half of it.
CONDITION_CPU_SAFETY = 60.0


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
)


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
    rules = [rule for rule in RULE_COVER if rule in obligation.text]
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


# --- one worker: CrossHair on one target ---------------------------------------------------------------

@dataclass(frozen=True)
class ConditionResult:
    """CrossHair's verdict on one condition of one target (plain data: it crosses a process boundary)."""

    target: str
    line: int
    status: str
    seconds: float   # CPU seconds CrossHair spent (its timeouts are CPU time too)
    detail: str
    condition: str
    paths: int = 0   # paths CrossHair explored (its iterations; bounded by max_iterations)


def _classify(states: Sequence[str]) -> str:
    if not states:
        return UNKNOWN
    if any(s in ("post_fail", "post_err", "exec_err") for s in states):
        return COUNTEREXAMPLE
    if any(s in ("syntax_err", "import_err") for s in states):
        return ERROR
    if "pre_unsat" in states:
        return PRE_UNSAT
    if "cannot_confirm" in states:
        return UNKNOWN
    return CONFIRMED if all(s == "confirmed" for s in states) else UNKNOWN


def analyse_target(target: str, per_condition_timeout: float, per_path_timeout: float,
                   line: Optional[int] = None, known_lines: frozenset[int] = frozenset(),
                   shape: Optional[int] = None, max_iterations: int = 0) -> list[ConditionResult]:
    """What `crosshair check --analysis_kind=icontract --report_all TARGET` decides, one row per condition.

    With `line`, only the condition at that line is analysed; without, every condition whose line
    is not in `known_lines` (the conditions CrossHair adds beyond icontract's inventory). Runs in a
    worker process: it engages CrossHair's audit wall, as `crosshair check` does, and CrossHair
    leaves state behind (conditions analysed one after the other in one process also get slower).
    With `shape`, the SequenceCache creator builds only that layer shape (`_crosshair_plugin.SHAPES`);
    the detail of a verdict other than confirmed names it.

    The work is bounded by counts, the clocks are safety nets (DEFAULT_MAX_ITERATIONS, SMT_RLIMIT): at most
    `max_iterations` paths per condition (0: no bound), and every solver query within `SMT_RLIMIT`
    units of Z3's deterministic resource counter instead of its wall-clock timeout. An unknown verdict
    says which bound stopped it.
    """
    import collections

    import crosshair.statespace
    from crosshair.auditwall import engage_auditwall
    from crosshair.core_and_libs import analyze_any
    from crosshair.fnutil import load_files_or_qualnames
    from crosshair.options import AnalysisKind, AnalysisOptionSet

    shape_name = ""
    if shape is not None:
        from kvcache_proofs import _crosshair_plugin

        _crosshair_plugin.SHAPES = (_crosshair_plugin.SHAPES[shape],)
        shape_name = f"[{'+'.join(_crosshair_plugin.SHAPES[0])}] "
    # CrossHair reads this per solver it creates; the environment variable it is initialised from
    # (CROSSHAIR_SMT_RLIMIT) is read at import, in the zygote, so the gate sets the value itself.
    crosshair.statespace.CROSSHAIR_SMT_RLIMIT = SMT_RLIMIT  # type: ignore[attr-defined]
    stats: collections.Counter[str] = collections.Counter()
    options = AnalysisOptionSet(analysis_kind=[AnalysisKind.icontract], per_condition_timeout=per_condition_timeout,
                                per_path_timeout=per_path_timeout, report_all=True, stats=stats,
                                max_iterations=max_iterations or None)
    try:
        engage_auditwall()
        entities = list(load_files_or_qualnames([target]))
        # Materialise the checkables first, as `crosshair check` does: analysing while the
        # parser's generator is still open gives different (worse) results.
        checkables = [c for entity in entities for c in analyze_any(entity, options)]
    except BaseException as error:  # CrossHair's parser raises whatever icontract raises
        return [ConditionResult(target, 0, ERROR, 0.0, f"{type(error).__name__}: {error}", "")]
    if not checkables:
        return [ConditionResult(target, 0, ERROR, 0.0, "Targets found, but contain no checkable functions "
                                "(contracts compiled out by python -O?)", "")]
    results: list[ConditionResult] = []
    for checkable in checkables:
        inner = getattr(checkable, "checkable", checkable)
        conditions = getattr(inner, "conditions", None)
        post = conditions.post[0] if conditions is not None and conditions.post else None
        at = post.line if post is not None else 0
        if (line is not None and at != line) or (line is None and at in known_lines):
            continue
        source = (post.expr_source or "") if post is not None else ""
        if not source:
            source = "no exception on inputs that meet the preconditions"
        started, paths_before = time.process_time(), stats["num_paths"]
        try:
            messages = list(checkable.analyze())
        except BaseException as error:
            results.append(ConditionResult(target, at, ERROR, time.process_time() - started,
                                           f"{type(error).__name__}: {error}", source))
            continue
        seconds, paths = time.process_time() - started, stats["num_paths"] - paths_before
        states = [m.state.value for m in messages]
        status = _classify(states)
        detail = "; ".join(f"{shape_name}line {m.line}: {m.message}" for m in messages if m.state.value != "confirmed")
        if status == UNKNOWN:
            detail += " " + _why_unknown(paths, seconds, max_iterations, per_condition_timeout)
        results.append(ConditionResult(target, at, status, seconds, detail, source, paths))
    return results


def _why_unknown(paths: int, seconds: float, max_iterations: int, cpu_limit: float) -> str:
    """Which bound stopped an analysis that ended without a verdict."""
    if max_iterations and paths >= max_iterations:
        return f"(stopped by the work bound: {paths} paths, max_iterations {max_iterations})"
    if seconds >= cpu_limit:
        return f"(stopped by the CPU safety net: {seconds:.1f} s, limit {cpu_limit:.0f} s; {paths} paths)"
    return (f"({paths} paths; some path ended without a verdict: the solver's work bound (rlimit {SMT_RLIMIT}) "
            "or the per-path CPU safety net)")


def _warm_up() -> None:
    """Import Z3 and solve once in the parent, so forked workers start warm.

    Never CrossHair: importing `crosshair.core_and_libs` patches icontract in the importing process
    (measured: afterwards a SequenceCache.plan with a gap no longer raises StepError), so only the
    forked workers, which die after one condition, import it.
    """
    import z3  # type: ignore[import-untyped]

    solver = z3.Solver()
    x = z3.Int("x")
    solver.add(x * x == 4, x > 0)
    solver.check()


# --- the gate ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    obligation: Obligation
    status: str
    seconds: float
    detail: str = ""
    paths: int = 0


@dataclass(frozen=True)
class ExcludedRow:
    obligation: Obligation
    reason: str
    covered_by: tuple[str, ...]
    frame_problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class GateResult:
    rows: tuple[Row, ...]                  # in-scope obligations, with CrossHair's verdict
    excluded: tuple[ExcludedRow, ...]      # out of CrossHair's scope, with what covers them
    problems: tuple[str, ...]              # gate-level failures (empty inventory, budget, frame check)
    seconds: float                         # wall clock
    budget_seconds: float
    settings: dict[str, float] = field(default_factory=dict)

    @property
    def confirmed(self) -> int:
        return sum(row.status == CONFIRMED for row in self.rows)

    def count(self, *statuses: str) -> int:
        return sum(row.status in statuses for row in self.rows)

    @property
    def verdict(self) -> str:
        """PASS: every row confirmed. FAIL: a counterexample, an error, an unmeetable precondition or a
        gate problem (frame check, missing cover, empty inventory). INCOMPLETE: nothing failed, but some
        row is unknown or not run (a work bound or a safety net stopped it, or --select left it out):
        not a pass, and never reported as a counterexample."""
        incomplete_problems = [p for p in self.problems if p.startswith(BUDGET_PROBLEM)]
        if (len(incomplete_problems) < len(self.problems) or not self.rows
                or self.count(COUNTEREXAMPLE, ERROR, PRE_UNSAT)):
            return "FAIL"
        if incomplete_problems or self.confirmed < len(self.rows):
            return "INCOMPLETE"
        return "PASS"

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"

    def summary(self) -> dict[str, int]:
        """Rows per outcome, for reports: unknown (no verdict) is counted apart from counterexample."""
        return {"confirmed": self.confirmed, "counterexample": self.count(COUNTEREXAMPLE),
                "unknown": self.count(UNKNOWN, NOT_RUN), "failed otherwise": self.count(ERROR, PRE_UNSAT),
                "rows": len(self.rows)}

    def table(self, verbose: bool = False) -> str:
        width = max([len(f"{r.obligation.target}:{r.obligation.line}") for r in self.rows] + [20])
        lines = [f"CrossHair gate (icontract): {self.confirmed}/{len(self.rows)} obligations confirmed over all "
                 f"paths, {self.count(COUNTEREXAMPLE)} counterexample(s), {self.count(UNKNOWN, NOT_RUN)} unknown, in "
                 f"{self.seconds:.1f} s (work bound {self.settings.get('max_iterations', 0):.0f} paths per condition, "
                 f"solver rlimit {self.settings.get('smt_rlimit', 0):.0f}; safety nets: "
                 f"{self.settings.get('per_condition_timeout', 0):.0f} s CPU per condition, "
                 f"{self.budget_seconds:.0f} s wall for the gate)", ""]
        lines.append(f"{'contract':<{width}}  {'kind':<9}  {'status':<18}  {'cpu s':>6}  {'paths':>5}  condition")
        for row in self.rows:
            o = row.obligation
            lines.append(f"{o.target + ':' + str(o.line):<{width}}  {o.kind:<9}  {row.status:<18}  "
                         f"{row.seconds:6.2f}  {row.paths:5d}  {o.text[:70]}")
            if row.status != CONFIRMED and row.detail:
                lines.append(f"{'':<{width}}    -> {row.detail[:400]}")
        if self.excluded:
            lines += ["", f"Out of CrossHair's scope ({len(self.excluded)} obligations), and what covers them:"]
            by_reason: dict[tuple[str, tuple[str, ...]], list[ExcludedRow]] = {}
            for ex in self.excluded:
                by_reason.setdefault((ex.reason, ex.covered_by), []).append(ex)
            for (reason, covered_by), group in by_reason.items():
                targets = sorted({f"{e.obligation.target}:{e.obligation.line}" for e in group})
                shown = targets if verbose or len(targets) <= 4 else targets[:3] + [f"... {len(targets) - 3} more"]
                lines.append(f"  - {', '.join(shown)}")
                lines.append(f"      why: {reason}")
                lines.append(f"      covered by: {', '.join(covered_by)}")
        if self.problems:
            lines += ["", "Gate problems:"] + [f"  - {p}" for p in self.problems]
        lines += ["", self.verdict]
        return "\n".join(lines)


def _settings(per_condition_timeout: Optional[float]) -> tuple[float, float]:
    """(CPU seconds per condition, CPU seconds per path): safety nets only (the work bounds are DEFAULT_MAX_ITERATIONS, SMT_RLIMIT)."""
    condition = per_condition_timeout if per_condition_timeout is not None else CONDITION_CPU_SAFETY
    return condition, max(condition / 2, min(condition, 1.0))


def run_gate(budget_seconds: float = DEFAULT_BUDGET_SECONDS, *, package: str = DEFAULT_PACKAGE,
             scope: Optional[Sequence[Exclusion]] = None, workers: int = 2,
             per_condition_timeout: Optional[float] = None, select: Optional[str] = None,
             sequence_cache: str = DEFAULT_SEQUENCE_CACHE, cell_cache: Optional[str] = None,
             cache_condition_timeout: float = CACHE_CONDITION_TIMEOUT,
             max_iterations: int = DEFAULT_MAX_ITERATIONS, engine: str = "processes",
             ray_address: Optional[str] = None) -> GateResult:
    """Inventory `package`'s contracts, analyse the in-scope ones with CrossHair, judge them all.

    `budget_seconds` is wall clock for the whole gate: targets still running when it is spent are
    stopped and their obligations reported not-run (the gate is INCOMPLETE). Runs in the current interpreter's
    mode: under `python -O` the inventory is empty and the gate fails. `select` (an fnmatch pattern
    on targets, or on TARGET:LINE) analyses only some obligations, for diagnosis: the others are reported not-run, so a
    selective gate never passes. `scope` defaults to `scope_for(sequence_cache, package)`; SequenceCache's
    conditions get `cache_condition_timeout` CPU seconds each (per path too), per layer shape for the
    SPLIT_CACHE_TARGETS. `max_iterations` bounds the paths per condition (and per shape): the work
    bound that decides; the time limits are safety nets whose expiry ends a row unknown. `engine="ray"`
    fans the analyses out over Ray (at `ray_address`, else a local one) instead of `workers` processes
    here: the same jobs, each in a worker process of its own, a batch per node (`_run_on_ray`).
    """
    started = time.perf_counter()
    if importlib.util.find_spec("crosshair") is None:  # not imported here: see _warm_up
        raise ImportError("crosshair-tool is not installed")
    problems: list[str] = []
    condition_timeout, path_timeout = _settings(per_condition_timeout)
    settings = {"per_condition_timeout": condition_timeout, "per_path_timeout": path_timeout,
                "workers": float(workers), "cache_condition_timeout": cache_condition_timeout,
                "max_iterations": float(max_iterations), "smt_rlimit": float(SMT_RLIMIT)}
    if scope is None:
        scope = scope_for(sequence_cache, package, cell_cache)
    if not __debug__:
        problems.append("running under python -O: icontract compiles postconditions and invariants out, "
                        "so there is nothing to confirm")
    obligations = inventory(package)
    if not obligations:
        problems.append(f"no checkable contracts found in {package!r} (no postconditions or invariants)")
    in_scope = [o for o in obligations if _exclusion_for(o, scope) is None]
    analysed = {o.target for o in in_scope}
    excluded: list[ExcludedRow] = []
    for obligation in obligations:
        exclusion = _exclusion_for(obligation, scope)
        if exclusion is None:
            continue
        frame = tuple(frame_violations(obligation.target)) if exclusion.read_only else ()
        problems += [f"frame check failed: {p}" for p in frame]
        # A CrossHair target cited as a cover counts only when this run analyses it.
        covers = tuple(c for c in covers_for(obligation, exclusion) if _cover_runs(c, analysed))
        if not covers:
            problems.append(f"{obligation.target}:{obligation.line} ({obligation.text!r}) is out of scope and cites "
                            "no rule of RULE_COVER: say what covers it")
        excluded.append(ExcludedRow(obligation, exclusion.reason, covers, frame))

    chosen = [o for o in in_scope if select is None or fnmatch.fnmatchcase(o.target, select)
              or fnmatch.fnmatchcase(f"{o.target}:{o.line}", select)]
    tasks = [(o.target, o.line) for o in chosen]
    inventoried: dict[str, set[int]] = {}
    for obligation in obligations:
        inventoried.setdefault(obligation.target, set()).add(obligation.line)
    results, run_problems = _run_tasks(tasks, condition_timeout, path_timeout, workers,
                                       deadline=started + budget_seconds, package=package,
                                       cache_timeout=cache_condition_timeout, inventoried=inventoried,
                                       max_iterations=max_iterations, engine=engine, ray_address=ray_address)
    problems += run_problems
    by_key = {(r.target, r.line): r for r in results}
    rows: list[Row] = []
    for obligation in in_scope:
        result = by_key.pop(obligation.key, None)
        # A condition analysed per layer shape holds only if every shape answered.
        unanswered = [p for p in run_problems if f" {obligation.target}:{obligation.line} " in p]
        if obligation not in chosen:
            rows.append(Row(obligation, NOT_RUN, 0.0, f"not selected (--select {select})"))
        elif result is None or unanswered:
            rows.append(Row(obligation, NOT_RUN, 0.0, _why_not_run(obligation, results, run_problems)))
        else:
            rows.append(Row(obligation, result.status, result.seconds, result.detail, result.paths))
    for result in by_key.values():
        # Conditions CrossHair checks that icontract's inventory does not list: its own "no exception
        # on valid input" check of functions with preconditions only, or a target-level error.
        rows.append(Row(Obligation(result.target, result.line, "crosshair", result.condition or "(target)"),
                        result.status, result.seconds, result.detail, result.paths))
    rows.sort(key=lambda r: (r.obligation.target, r.obligation.line))
    return GateResult(tuple(rows), tuple(excluded), tuple(problems), time.perf_counter() - started,
                      budget_seconds, settings)


def _cover_runs(cover: str, analysed: set[str]) -> bool:
    """False for a "crosshair:NAME" cover whose target this run does not analyse (any other cover: True)."""
    named = re.fullmatch(r"crosshair:([\w.]+)", cover)
    return named is None or any(target.endswith("." + named.group(1)) for target in analysed)


def _why_not_run(obligation: Obligation, results: Sequence[ConditionResult], run_problems: Sequence[str]) -> str:
    mine = [p for p in run_problems if f" {obligation.target}:{obligation.line} " in p]
    if mine:
        return "; ".join(mine)
    if any(r.target == obligation.target for r in results):
        return "CrossHair did not enumerate this condition for its target (a CrossHair blind spot)"
    return "no CrossHair result for this target"


def _run_tasks(tasks: Sequence[tuple[str, int]], condition_timeout: float, path_timeout: float, workers: int,
               deadline: float, package: str = DEFAULT_PACKAGE, cache_timeout: float = CACHE_CONDITION_TIMEOUT,
               inventoried: Optional[dict[str, set[int]]] = None,
               max_iterations: int = 0, engine: str = "processes",
               ray_address: Optional[str] = None) -> tuple[list[ConditionResult], list[str]]:
    """Analyse each (target, condition line) in its own process, `workers` at a time, until `deadline`;
    plus, per target, one task for the conditions CrossHair adds beyond the inventory (`inventoried`:
    every inventoried line per target, in scope or not). SequenceCache targets are analysed from the
    plugin's symbolic state; SPLIT_CACHE_TARGETS once per layer shape, and the shapes' verdicts merge.

    The processes fork from one "zygote" child that has imported CrossHair once (importing it here
    would patch icontract in this process, see _warm_up); the zygote sends the results back.
    """
    if not tasks:
        return [], []
    known: dict[str, set[int]] = {}
    for target, line in tasks:
        known.setdefault(target, set()).add(line)
    for target in known:  # an excluded condition of an analysed target is no "other" condition
        known[target] |= (inventoried or {}).get(target, set())
    from kvcache_proofs import _crosshair_plugin as plugin  # imports no CrossHair: see its docstring

    def timeouts(target: str) -> tuple[float, float]:
        return (cache_timeout, cache_timeout / 2) if _is_cache_target(target, package) else (condition_timeout, path_timeout)

    def shapes(target: str) -> list[Optional[int]]:
        split = _is_cache_target(target, package) and target.rsplit(".", 1)[1] in SPLIT_CACHE_TARGETS
        return list(range(len(plugin.SHAPES))) if split else [None]

    def weight(target: str) -> int:  # heaviest first, so the tail is short
        if _is_cache_target(target, package):
            return 0 if target.rsplit(".", 1)[1] in SPLIT_CACHE_TARGETS else 2
        return 1 if target.endswith("RingPolicy.plan") else 3

    jobs: list[tuple[str, tuple[Any, ...]]] = []
    for target, line in sorted(tasks, key=lambda t: (weight(t[0]), t)):
        for shape in shapes(target):
            suffix = "" if shape is None else f" [{'+'.join(plugin.SHAPES[shape])}]"
            jobs.append((f"{target}:{line}{suffix}", (target, *timeouts(target), line, frozenset(), shape,
                                                      max_iterations)))
    for target in sorted(known):
        jobs.append((f"{target} (other conditions)",
                     (target, *timeouts(target), None, frozenset(known[target]), None, max_iterations)))
    needs_plugin = any(_is_cache_target(target, package) or _is_cell_target(target, package) for target in known)
    plugin = package if needs_plugin else None
    if engine == "ray":
        results, problems = _run_on_ray(jobs, deadline, plugin, ray_address)
    elif engine == "processes":
        results, problems = _run_in_a_zygote(jobs, workers, deadline, plugin)
    else:
        raise ValueError(f"engine is processes or ray, not {engine!r}")
    return _merge_shapes(list(results)), list(problems)


#: seconds past the deadline for a zygote to stop its workers and answer (it stops them at the deadline)
ZYGOTE_GRACE = 10.0


def _run_in_a_zygote(jobs: Sequence[tuple[str, tuple[Any, ...]]], workers: int, deadline: float,
                     plugin_package: Optional[str], own_group: bool = False) -> tuple[list[ConditionResult], list[str]]:
    """Every job in `_zygote`'s forked workers, `workers` at a time, until `deadline` (perf_counter).
    `own_group`: this process leads a process group of its own (a batch on Ray), which the zygote kills
    if this process dies."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    with default_sigterm():
        zygote = context.Process(target=_zygote, args=(jobs, workers, deadline, sender, plugin_package, own_group),
                                 name="crosshair-gate")
        zygote.start()
        sender.close()
        try:
            if receiver.poll(max(0.0, deadline - time.perf_counter()) + ZYGOTE_GRACE):
                results, problems = receiver.recv()
            else:
                results, problems = [], [f"{BUDGET_PROBLEM}: the CrossHair workers did not answer"]
        except EOFError:
            results, problems = [], [f"the CrossHair zygote died (exit code {zygote.exitcode})"]
        finally:
            if zygote.is_alive():
                zygote.kill()
            zygote.join()
            receiver.close()
    return list(results), list(problems)


def _merge_shapes(results: list[ConditionResult]) -> list[ConditionResult]:
    """One result per (target, line): a condition analysed per layer shape holds if it holds for all."""
    order = [COUNTEREXAMPLE, ERROR, PRE_UNSAT, UNKNOWN, NOT_RUN, CONFIRMED]  # the worst verdict wins
    merged: dict[tuple[str, int], ConditionResult] = {}
    for result in results:
        previous = merged.get((result.target, result.line))
        if previous is None:
            merged[(result.target, result.line)] = result
            continue
        worst = min(previous.status, result.status, key=order.index)
        detail = "; ".join(d for d in (previous.detail, result.detail) if d)
        merged[(result.target, result.line)] = ConditionResult(result.target, result.line, worst,
                                                               previous.seconds + result.seconds, detail,
                                                               previous.condition, previous.paths + result.paths)
    return list(merged.values())


def _run_a_batch(batch: Sequence[tuple[str, tuple[Any, ...]]], workers: int, wall_deadline: float,
                 plugin_package: Optional[str]) -> tuple[list[ConditionResult], list[str]]:
    """A Ray task: `batch` on this node, by the gate's own processes engine in a fresh Python process
    (a zygote imports CrossHair once and forks a worker per job; forking the Ray worker itself, which
    runs Ray's threads, would not be safe). The deadline travels as wall-clock time."""
    import os
    import pickle
    import subprocess

    order = pickle.dumps((list(batch), workers, wall_deadline, plugin_package))
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    wait = max(0.0, wall_deadline - time.time()) + 2 * ZYGOTE_GRACE
    try:
        done = subprocess.run([sys.executable, "-c", "import sys; from kvcache_proofs.crosshair_gate import "
                               "_batch_main; sys.exit(_batch_main())"],
                              input=order, capture_output=True, env=env, timeout=wait, check=False,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return [], [f"{BUDGET_PROBLEM}: the batch of {batch[0][0]} and {len(batch) - 1} more did not answer"]
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines() or ["(nothing on stderr)"]
        return [], [f"the batch of {batch[0][0]} and {len(batch) - 1} more failed (exit code {done.returncode}): "
                    f"{said[-1]}"]
    answer: tuple[list[ConditionResult], list[str]] = pickle.loads(done.stdout)
    return answer


def _kill_the_group_when_orphaned() -> None:
    """When this process's parent dies, SIGKILL its whole process group: a batch (`_run_a_batch` starts
    it in a session of its own) with its zygote and the zygote's workers. So a cancelled Ray task (its
    worker is killed: ray.cancel(force=True)) or a killed gate leaves no analysis running on to the
    deadline; whichever of the batch and the zygote outlives its parent does it (Ray may kill a worker's
    children, not their children)."""
    import os
    import signal
    import threading

    def watch(parent: int = os.getppid()) -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def _batch_main() -> int:
    """The child of `_run_a_batch`: read a batch from stdin, run it, write the answer to stdout (as
    `kvcache_proofs.crosshair_gate`, not `__main__`, so the answer unpickles in the task)."""
    import pickle

    _kill_the_group_when_orphaned()
    jobs, workers, wall_deadline, plugin_package = pickle.loads(sys.stdin.buffer.read())
    deadline = from_wall_clock(wall_deadline, time.perf_counter)
    assert deadline is not None
    answer = _run_in_a_zygote(jobs, workers, deadline, plugin_package, own_group=True)
    sys.stdout.buffer.write(pickle.dumps(answer))
    return 0


def _batches(jobs: Sequence[tuple[str, tuple[Any, ...]]], count: int) -> list[list[tuple[str, tuple[Any, ...]]]]:
    """`jobs` dealt round-robin into at most `count` non-empty batches (neighbouring jobs are of one
    target and alike in cost, so dealing spreads the cost evenly)."""
    dealt: list[list[tuple[str, tuple[Any, ...]]]] = [[] for _ in range(max(1, min(count, len(jobs))))]
    for index, job in enumerate(jobs):
        dealt[index % len(dealt)].append(job)
    return [batch for batch in dealt if batch]


def _run_on_ray(jobs: Sequence[tuple[str, tuple[Any, ...]]], deadline: float, plugin_package: Optional[str],
                address: Optional[str], batches: Optional[int] = None) -> tuple[list[ConditionResult], list[str]]:
    """`_run_in_a_zygote`'s work on Ray: one batch per node of the cluster, each a task holding as many
    CPUs as the smallest node has and running that many CrossHair workers; so CrossHair is imported
    once per node, not once per job (measured on this 2-core machine: with a task per job the quick
    profile's gate ran out of its 60 s net, INCOMPLETE; batched it passes in 12 s). A batch still
    running at `deadline` is reported as the zygote reports it. `batches` (default: one per node) is
    for tests."""
    from kvcache_proofs.ray_engine import cancel_unfinished, connect

    ray = connect(address)
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    cpus = max(1, int(min((node.get("Resources", {}).get("CPU", 1) for node in nodes), default=1)))
    run = ray.remote(_run_a_batch).options(num_cpus=cpus, max_retries=0)  # a batch that died is reported, not rerun
    wall_deadline = to_wall_clock(deadline, time.perf_counter)
    pending = [run.remote(batch, cpus, wall_deadline, plugin_package) for batch in _batches(jobs, batches or len(nodes))]
    results: list[ConditionResult] = []
    problems: list[str] = []
    answered: set[int] = set()
    try:
        for index, handle in enumerate(pending):
            try:
                found, trouble = ray.get(handle, timeout=max(0.0, deadline - time.perf_counter()) + 3 * ZYGOTE_GRACE)
                answered.add(index)
                results.extend(found)
                problems.extend(trouble)
            except ray.exceptions.GetTimeoutError:
                problems.append(f"{BUDGET_PROBLEM}: batch {index + 1} of {len(pending)} did not answer")
            except Exception as error:  # noqa: BLE001 - a worker that died
                problems.append(f"batch {index + 1} of {len(pending)} failed: {type(error).__name__}: {error}")
    finally:
        cancel_unfinished([handle for index, handle in enumerate(pending) if index not in answered])
    return results, problems


def _zygote(jobs: Sequence[tuple[str, tuple[Any, ...]]], workers: int, deadline: float, sender: Any,
            plugin_package: Optional[str] = None, own_group: bool = False) -> None:
    """Import CrossHair once (and register the SequenceCache creator of `plugin_package`), then fork one
    worker per job (`workers` at a time) and report (`own_group`: see `_run_in_a_zygote`)."""
    if own_group:
        _kill_the_group_when_orphaned()
    import crosshair.core_and_libs  # noqa: F401  (the workers inherit it)

    if plugin_package is not None:
        from kvcache_proofs import _crosshair_plugin

        _crosshair_plugin.register(plugin_package)

    _warm_up()
    context = multiprocessing.get_context("fork")
    results: list[ConditionResult] = []
    problems: list[str] = []
    pool = context.Pool(processes=max(1, workers), maxtasksperchild=1)
    overran = True
    try:
        pending = [(name, pool.apply_async(analyse_target, args)) for name, args in jobs]
        for name, handle in pending:
            remaining = deadline - time.perf_counter()
            try:
                results.extend(handle.get(timeout=max(0.0, remaining)))
            except multiprocessing.TimeoutError:
                problems.append(f"{BUDGET_PROBLEM} before {name} finished")
            except Exception as error:  # a worker that died
                problems.append(f"worker for {name} failed: {type(error).__name__}: {error}")
        overran = bool(problems)
    finally:
        if overran:
            pool.terminate()  # SIGTERM to the workers still running
        else:
            pool.close()
        pool.join()
        sender.send((results, problems))
        sender.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache_proofs.crosshair_gate",
                                     description="Fail unless CrossHair confirms every in-scope icontract "
                                                 "obligation of kvcache over all paths.")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_SECONDS,
                        help="wall-clock seconds for the whole gate (a safety net: running out is INCOMPLETE)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-iterations", type=int, default=DEFAULT_MAX_ITERATIONS,
                        help="paths per condition: the work bound (0: none)")
    parser.add_argument("--per-condition-timeout", type=float, default=None,
                        help=f"CPU seconds per condition, a safety net (default {CONDITION_CPU_SAFETY:.0f})")
    parser.add_argument("--package", default=DEFAULT_PACKAGE)
    parser.add_argument("--select", default=None, help="analyse only targets matching this pattern (never passes)")
    parser.add_argument("--sequence-cache", choices=SEQUENCE_CACHE_SCOPES, default=DEFAULT_SEQUENCE_CACHE,
                        help="how much of SequenceCache to analyse from a symbolic state (full: minutes)")
    parser.add_argument("--cell-cache", choices=CELL_CACHE_SCOPES, default=None,
                        help="how much of CellCache to analyse from a symbolic state (default: as --sequence-cache)")
    parser.add_argument("--cache-condition-timeout", type=float, default=CACHE_CONDITION_TIMEOUT,
                        help="CPU seconds per SequenceCache condition (and per layer shape of plan/rewind/commit)")
    parser.add_argument("--analyse-cell", action="append", default=[], metavar="METHOD",
                        help="analyse this CellCache method of CELL_OUT_OF_FULL anyway (with --cell-cache full; "
                             "repeatable): to measure it")
    parser.add_argument("--engine", choices=("processes", "ray"), default="processes",
                        help="where the analyses run: --workers processes here (default), or on Ray, a batch per node "
                             "(pip install 'kvcache-spec[cluster]')")
    parser.add_argument("--ray-address", default=None, help="with --engine ray: a cluster to join (default: a local Ray)")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every out-of-scope obligation")
    args = parser.parse_args(list(argv) if argv is not None else None)
    needs = missing_line("verify", "python -m kvcache_proofs.crosshair_gate")
    if needs:
        print(needs, file=sys.stderr)
        return 2
    try:
        scope = (scope_for(args.sequence_cache, args.package, args.cell_cache, args.analyse_cell)
                 if args.analyse_cell else None)
    except ValueError as error:
        parser.error(str(error))
    try:
        result = run_gate(args.budget, package=args.package, workers=args.workers, scope=scope,
                          per_condition_timeout=args.per_condition_timeout, select=args.select,
                          sequence_cache=args.sequence_cache, cell_cache=args.cell_cache,
                          cache_condition_timeout=args.cache_condition_timeout,
                          max_iterations=args.max_iterations, engine=args.engine, ray_address=args.ray_address)
    except ImportError as error:
        print(f"crosshair gate: cannot import {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # the Ray engine without Ray
        print(f"crosshair gate: {error}", file=sys.stderr)
        return 2
    print(result.table(verbose=args.verbose))
    return EXIT_CODES[result.verdict]


if __name__ == "__main__":
    sys.exit(main())
