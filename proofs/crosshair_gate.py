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
import fnmatch
import importlib
import importlib.util
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from kvcache_spec._extras import missing_line

# The gate in three parts: the obligations and their scope, the engines, and here the report and the
# command. The names of the other two stay importable from here (the gate's callers and tests use them).
from .crosshair_engines import (BUDGET_PROBLEM, CONDITION_CPU_SAFETY, CONFIRMED, COUNTEREXAMPLE, DEFAULT_MAX_ITERATIONS,
                                ERROR, NOT_RUN, PRE_UNSAT, SMT_RLIMIT, UNKNOWN, ConditionResult, _run_tasks)
from .crosshair_engines import _kill_the_group_when_orphaned, _run_on_ray  # noqa: F401 - re-exported
from .crosshair_obligations import (CACHE_CONDITION_TIMEOUT, CELL_CACHE_SCOPES, DEFAULT_PACKAGE, DEFAULT_SEQUENCE_CACHE,
                                    SEQUENCE_CACHE_SCOPES, Exclusion, Obligation, _exclusion_for, covers_for,
                                    frame_violations, inventory, scope_for)
from .crosshair_obligations import CELL_OUT_OF_FULL, FAST_CACHE_TARGETS, FAST_CELL_TARGETS, RULE_COVER, SCOPE  # noqa: F401


#: The gate's exit code per verdict (2 is an environment error: CrossHair or Z3 missing).
EXIT_CODES = {"PASS": 0, "FAIL": 1, "INCOMPLETE": 3}

DEFAULT_BUDGET_SECONDS = 60.0  # wall clock for the whole gate: a safety net (the work bounds follow)


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
