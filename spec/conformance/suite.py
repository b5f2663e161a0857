"""The suite: edge and random programs over the suite's configs, findings shrunk and reported."""

from __future__ import annotations

import json
import random
import textwrap
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Union

from ..rules import BY_ID
from . import layouts
from . import scope as scopes
from .configs import JsonConfig, describe
from .coverage import clause_scope, clauses_summary, family, in_scope, shortfall
from .coverage import summary as rules_summary
from .engine import CRASH, LENIENT, OVER_STRICT, WRONG, Finding, RunResult, Step
from .programs import shrink
from .targets import HarnessInterrupted, SubprocessTarget, Target, TargetCrash, parse_target, safety_alarm

REPORT_FORMAT = "kvcache-conformance-report/2"
CONFORMING, NOT_CONFORMING, INCOMPLETE = "CONFORMING", "NOT CONFORMING", "INCOMPLETE"


@dataclass(frozen=True)
class Profile:
    """The work a profile promises, as counts; `safety_seconds` only stops a run gone wrong (INCOMPLETE).

    Each request is bounded by the per-request timeout (cmd: targets), each run by these counts."""

    random_programs: int
    largest: int                 # steps of the largest random program
    shrink_budget: int           # programs run to shrink one finding
    safety_seconds: float        # wall-clock safety net: hitting it makes the run INCOMPLETE
    restart_cap: int             # target restarts after crashes and hangs before the run stops
    row_budget: int              # the harness's own work on its pools (rows allocated and copied)


PROFILES: dict[str, Profile] = {
    # The reference needs 22 thousand pool rows in quick, 112 thousand in pre-merge: the row budgets
    # leave a margin of several hundred, and stop a target announcing millions of rows per layer.
    "quick": Profile(150, 24, 300, 600.0, 24, 1 << 23),
    "pre-merge": Profile(1500, 40, 600, 3600.0, 64, 1 << 26),
    "deep": Profile(15000, 60, 2000, 6 * 3600.0, 256, 1 << 29),
}
# No cap hides a cause: every distinct cause is kept (the JSON report lists all). The caps bound work only:
MAX_SHRINKS = 64        # findings shrunk per (class, rule), or of all crashes; past it a new cause is kept unshrunk
MAX_CRASHES = 5         # distinct crashes shrunk (each costs fresh processes); past it one is kept unshrunk
MAX_CAUSES = 3          # causes printed in full per (class, rule) in the summary; --all-causes prints every one
UNSHRUNK = ("not shrunk: the shrink cap of its class and rule (MAX_SHRINKS, MAX_CRASHES in suite.py) was reached; "
            "the steps are the whole program up to the finding")
CRASH_SHRINK_BUDGET = 12
# Programs in a row that crash the same way (how, and in which method) before the run stops. The
# programs interleave configurations and kinds of steps, so a streak this long means the target crashes
# that way whatever it is given: the rest would repeat it, each hang at the cost of a timeout (a target
# that hung on every plan took 532 s to reach its verdict in pre-merge, 65 timeouts to the restart cap).
SAME_CRASH_IN_A_ROW = 8


_ALONE = ("does not reproduce alone in a fresh process: it depends on earlier programs run in the same "
          "target process (the steps are those of the program that crashed, up to the crash)")


@dataclass
class Reported:
    finding: Finding
    config: JsonConfig
    steps: list[Step]
    hits: int = 1
    note: str = ""      # e.g. the crash did not reproduce alone in a fresh process
    shrunk: bool = True  # False: kept past the shrink cap, as found (UNSHRUNK)
    found_after: dict[str, float] = field(default_factory=dict)   # seconds, cpu_seconds, programs: when kept

    def cause(self) -> tuple[Any, ...]:
        return cause(self.finding, self.config, self.steps)

    def same_cause(self, other: "Reported") -> bool:
        """One cause: equal `cause`s, or the very same words - the same message, after the same step,
        through a single rewind or a chain alike - on another configuration family (a shrink that could
        not flatten the layers must not print one cause twice)."""
        return self.cause() == other.cause() or (
            _group(self.finding) == _group(other.finding) and self.finding.message == other.finding.message
            and self.finding.after == other.finding.after and _rewind_kind(self.steps) == _rewind_kind(other.steps))


def _op_kind(step: Step) -> str:
    """A step's kind for `cause`: a full step and a bare plan fail alike (on the plan); T=1 is a decode."""
    op = str(step.get("op"))
    if "case" in step:   # an op-face step: what the refused call broke (op_engine._case)
        return f"{op} {step['case']}"
    if op in ("step", "plan"):
        T = step.get("T")
        return f"plan T={T!r}" if type(T) is not int or T < 1 else f"plan T={'1' if T == 1 else '>1'}"
    return op


def _crash_kind(message: str) -> str:
    for kind in ("killed by SIG", "hung", "closed its stdout", "exited", "exit code", "protocol", "exit(",
                 "raised"):
        at = message.find(kind)
        if at >= 0:
            return message[at:at + 20].split(")")[0].split(";")[0] if kind == "killed by SIG" else kind
    return "crash"


def _group(finding: Finding) -> tuple[str, ...]:
    """Counterexamples are kept per (class, rule); crashes form one group whatever the rule of the call
    that crashed (a hang on every plan is one crash, not one per rule a plan could break)."""
    return (CRASH,) if finding.kind == CRASH else finding.key()


def how_it_crashed(finding: Finding) -> tuple[str, str]:
    """A crash's kind (its signal, a hang, a protocol break, ...) and the call it crashed in."""
    return _crash_kind(finding.message), finding.message.split("(", 1)[0]


def cause(finding: Finding, cfg: JsonConfig, steps: list[Step]) -> tuple[Any, ...]:
    """Two shrunk counterexamples are the same cause when these are equal: the group (class and rule;
    for a crash, how it crashed - its signal, a hang, a protocol break - and the method it crashed in),
    the layer kinds of the configuration (the shrinker first tries every layer flat, so a defect that
    shows there is not a ring defect), the failing operation (a decode step, T = 1, is not a
    multi-token step; a plan is not a can_extend), a single rewind versus a chain of rewinds, and for a
    consequence the kind of step that led there and the safety property broken. Everything else (values, lengths, max_write, the steps that lead there) is the same cause seen
    through another program."""
    kinds = [_op_kind(step) for step in steps]
    how = how_it_crashed(finding) if finding.kind == CRASH else (finding.rule,)
    return (_group(finding), how, family(cfg).split(",")[0], kinds[-1] if kinds else "create",
            _rewind_kind(steps), finding.after, finding.safety)


def _rewind_kind(steps: list[Step]) -> str:
    """A single rewind (or none) versus a chain of rewinds: two causes (the README promises both)."""
    return "rewind chain" if sum(1 for step in steps if step.get("op") == "rewind") > 1 else ""


def _last_rewind_only(program: list[Step]) -> Optional[list[Step]]:
    """The program without its rewinds but the last one; None when it has no chain to drop."""
    rewinds = [index for index, step in enumerate(program) if step.get("op") == "rewind"]
    if len(rewinds) < 2:
        return None
    return [step for index, step in enumerate(program) if index not in rewinds[:-1]]


@dataclass
class SuiteResult:
    target: str
    profile: str
    seed: int
    findings: dict[tuple[str, str], Reported] = field(default_factory=dict)   # the first cause per (class, rule)
    causes: dict[tuple[str, str], list[Reported]] = field(default_factory=dict)   # every cause kept
    layout: list[dict[str, Any]] = field(default_factory=list)
    skipped: set[str] = field(default_factory=set)
    programs: int = 0
    planned: int = 0
    calls: int = 0
    seconds: float = 0.0
    first_counterexample: Optional[float] = None
    first_counterexample_programs: Optional[int] = None
    requests_per_second: Optional[float] = None
    aborted: str = ""                                    # why the run stopped before its planned work
    interrupted: str = ""                                # the signal that stopped the harness
    restarts: int = 0
    continued: int = 0                                   # programs run again past a lenient / over-strict step
    configs: dict[str, JsonConfig] = field(default_factory=dict)   # planned valid configurations by name
    created: set[str] = field(default_factory=set)
    families: set[str] = field(default_factory=set)
    exercised: set[str] = field(default_factory=set)
    scope: dict[str, str] = field(default_factory=dict)   # rule -> '' in scope, or why it is not
    clauses: dict[str, str] = field(default_factory=dict)   # argument clause -> '' in scope, or why it is not
    declared: dict[str, Any] = field(default_factory=dict)   # scope.summary: the declared features, what was left out
    shrinks: dict[tuple[str, ...], int] = field(default_factory=dict)

    def classes(self) -> set[str]:
        return {kind for kind, _ in self.findings}

    def incomplete(self) -> list[str]:
        """Why the run exercised less than its profile promised (empty: full coverage)."""
        reasons = [self.aborted] if self.aborted else []
        return reasons + shortfall(self.planned, self.programs, set(self.configs), self.created, self.scope,
                                   self.exercised, self.clauses)

    def verdict(self, strict: bool = False, exact_layout: bool = False) -> str:
        failing = {WRONG, CRASH} | ({LENIENT, OVER_STRICT} if strict else set())
        if self.classes() & failing or (exact_layout and self.layout):
            return NOT_CONFORMING
        return INCOMPLETE if self.incomplete() else CONFORMING

    def conforming(self, strict: bool = False, exact_layout: bool = False) -> bool:
        return self.verdict(strict, exact_layout) == CONFORMING


def replay(target: Union[str, Target], config: JsonConfig, steps: list[Step],
           exact: bool = False) -> Optional[dict[str, Any]]:
    """Run one step list on a target; the finding as a dict, or None when the target conforms on it. Past
    a lenient or over-strict step, the wrong consequence it led to (with "after") is the finding."""
    owned = isinstance(target, str)
    chosen = parse_target(target) if isinstance(target, str) else target
    try:
        result = layouts.run_any(chosen, config, steps, exact)
    finally:
        if owned:
            chosen.close()
    # past a lenient step, what it led to (a wrong consequence) is the finding these steps show
    f = result.consequence or result.finding
    if f is None:
        return None
    return {"class": f.kind, "rule": f.rule, "message": f.message, "step_index": f.step_index,
            **({"after": f.after} if f.after else {})}


def _interleaved(configs: tuple[JsonConfig, ...], layout: layouts.Layout) -> list[tuple[JsonConfig, list[Step]]]:
    """Every edge program of every configuration once, on a diagonal: in round r, configuration c runs
    its program number (r + c) mod K. The first programs already touch every configuration (and
    family), so a run stopped early has still exercised each of them; and programs next to each other
    differ in configuration and in kind, so programs that crash alike in a row (SAME_CRASH_IN_A_ROW)
    are different programs, not one kind of program that happens to come first everywhere."""
    per = [layout.edge_programs(cfg) for cfg in configs]
    kinds = max(len(p) for p in per)
    return [(cfg, programs[(r + c) % kinds][1]) for r in range(kinds)
            for c, (cfg, programs) in enumerate(zip(configs, per)) if (r + c) % kinds < len(programs)]


def run_suite(target: Target, profile: str = "quick", seed: int = 0,
              configs: Optional[tuple[JsonConfig, ...]] = None, deadline: Optional[float] = None,
              stop_after_first: bool = False, crash_shrink_budget: int = CRASH_SHRINK_BUDGET,
              edges: bool = True, restart_cap: Optional[int] = None,
              scope: Optional[scopes.Scope] = None, layout: Optional[str] = None,
              continue_past_lenient: bool = True) -> SuiteResult:
    """Edge programs for every config inside the scope, then random ones, then the border (configs
    outside the scope must be refused, SCOPE-BORDER), then invalid configs; findings shrunk and kept
    per cause. A crash or a hang does not end the run: the target restarts (up to the restart cap).

    scope: overrides the target's declared scope (the CLI's --scope).
    layout: overrides the target's declared layout (the CLI's --layout); configs default to the layout's.
    continue_past_lenient: past the step of a lenient or over-strict finding, grade what it leads to (the
    safety properties of consequences.py, the step applied) and run the program again without the step,
    so the steps after it are checked too (False only to show what that finds).

    deadline: the wall-clock safety net in seconds (default: the profile's); hitting it is INCOMPLETE.
    The harness's own SIGTERM/SIGINT/SIGHUP (`stop_on_signals`) ends the run INCOMPLETE, with the partial
    result returned.
    """
    plan = PROFILES[profile]
    started = time.monotonic()
    options = _Options(stop_after_first, crash_shrink_budget, continue_past_lenient,
                       plan.restart_cap if restart_cap is None else restart_cap)
    scope = scope or declared_scope(target)
    drive = layouts.of(target, layout)   # known once a cmd: target's hello is read (declared_scope)
    target.layout = drive.name
    run = _SuiteRun(target, plan, SuiteResult(target.name, profile, seed), scope, drive, options,
                    started, plan.safety_seconds if deadline is None else deadline)
    # a fixed max_seqs: the twins of the configs outside it by their max_seqs alone are driven
    return run.everything(scopes.with_twins(configs or drive.configs, scope), random.Random(seed), edges)


@dataclass(frozen=True)
class _Options:
    stop_after_first: bool
    crash_shrink_budget: int
    continue_past_lenient: bool
    restart_cap: int


class _SuiteRun:
    """One run of the suite: the target, what the profile allows, and the result being filled in."""

    def __init__(self, target: Target, plan: Profile, result: SuiteResult, scope: scopes.Scope,
                 drive: layouts.Layout, options: _Options, started: float, safety_seconds: float) -> None:
        self.target, self.plan, self.result, self.scope, self.drive = target, plan, result, scope, drive
        self.options = options
        self.started = started
        self.cpu_started = time.process_time()   # this process's CPU only (not a cmd: target's)
        self.safety = self.started + safety_seconds
        self.rows_used = 0
        self.causes_seen: dict[tuple[Any, ...], Reported] = {}   # a cause before shrinking -> the cause kept for it
        self.last_crash: Optional[tuple[str, str]] = None   # how the last program crashed (None: it did not)
        self.same_crash_in_a_row = 0

    # --- running one program -------------------------------------------------------------------------
    def run_checked(self, cfg: JsonConfig, program: list[Step], fresh: bool, consequence: bool = False) -> RunResult:
        """One program, judged exactly, in a fresh target process when `fresh`; seen through its
        consequence (the finding past its lenient step) when `consequence`."""
        if fresh:
            self.target.fresh()
        run = self.drive.run_program(self.target, cfg, program, exact=True, scope=self.scope)
        return run.as_consequence() if consequence else run

    def check(self, cfg: JsonConfig, program: list[Step], fresh: bool) -> Optional[Finding]:
        return self.run_checked(cfg, program, fresh).finding

    def stopped(self) -> bool:
        result = self.result
        if result.aborted:
            return True
        if self.options.stop_after_first and result.findings:
            result.aborted = "stopped after the first finding (stop_after_first)"
        if time.monotonic() > self.safety:
            result.aborted = (f"the wall-clock safety net ({self.safety - self.started:.0f} s) stopped the run: "
                              f"the target answers too slowly for the profile's program count")
        return bool(result.aborted)

    def one(self, cfg: JsonConfig, program: list[Step]) -> None:
        """Run one program; past a lenient or over-strict finding, run it again without that step.

        The model cannot follow a call the spec rejects but the target served (or one it refused that the
        spec serves), so the lockstep ends at such a finding. What the step itself leads to is graded by
        the engine's drive past it (consequences.py, kept by `one_run`); the steps after it would still
        go unchecked, and a wrong answer there would hide behind the lenient one. Dropping the step (as
        the shrinker does: arguments are relative) checks the rest; each continuation is one step
        shorter, so at most len(program) of them run, and a continuation counts in `continued`, not in
        `programs`."""
        finding = self.one_run(cfg, program, counted=True)
        while (self.options.continue_past_lenient and finding is not None
               and finding.kind in (LENIENT, OVER_STRICT)
               and 0 <= finding.step_index < len(program) - 1 and not self.stopped()):
            program = program[:finding.step_index] + program[finding.step_index + 1:]
            self.result.continued += 1
            finding = self.one_run(cfg, program, counted=False)

    def one_run(self, cfg: JsonConfig, program: list[Step], counted: bool) -> Optional[Finding]:
        run = self.drive.run_program(self.target, cfg, program, exact=True, scope=self.scope,
                                     row_budget=self.plan.row_budget - self.rows_used)
        self.account(cfg, run, counted)
        finding = run.finding
        self.count_crash_streak(finding)
        if finding is None:
            return None
        self.found(finding, cfg, program, run)
        if run.consequence is not None and self.options.continue_past_lenient and not self.stopped():
            self.found(run.consequence, cfg, program, run.as_consequence(), consequence=True)
        return finding

    def account(self, cfg: JsonConfig, run: RunResult, counted: bool) -> None:
        """What a program's run adds to the result's counts and coverage."""
        result = self.result
        self.rows_used += run.pool_rows
        result.programs += 1 if counted else 0
        result.calls += run.calls
        result.skipped |= run.skipped
        result.exercised |= run.exercised
        if run.created:
            result.created.add(describe(cfg))
            result.families.add(family(cfg))
        if run.over_budget:
            result.aborted = (f"the harness's work budget ({self.plan.row_budget} pool rows) ran out: the "
                              f"target's depth makes each program too big to check")
        if run.layout and len(result.layout) < 5:
            result.layout.append({"config": cfg, "divergences": run.layout})

    def count_crash_streak(self, finding: Optional[Finding]) -> None:
        """SAME_CRASH_IN_A_ROW: programs in a row that crashed the same way stop the run."""
        how = how_it_crashed(finding) if finding is not None and finding.kind == CRASH else None
        self.same_crash_in_a_row = (self.same_crash_in_a_row + 1 if how is not None and how == self.last_crash
                                    else int(how is not None))
        self.last_crash = how
        if how is not None and self.same_crash_in_a_row >= SAME_CRASH_IN_A_ROW and not self.result.aborted:
            self.result.aborted = (f"the target crashed the same way ({how[0]} in {how[1]}) in "
                                   f"{self.same_crash_in_a_row} programs in a row: the programs left would "
                                   f"only repeat it")

    # --- a finding: shrunk, kept per cause -----------------------------------------------------------
    def kept_like(self, finding: Finding) -> list[Reported]:
        """The counterexamples kept in this finding's group: its (class, rule), or every crash."""
        return [r for rs in self.result.causes.values() for r in rs if _group(r.finding) == _group(finding)]

    def keep(self, finding: Finding, cfg: JsonConfig, steps: list[Step], note: str = "",
             shrunk: bool = True) -> Reported:
        """The finding kept as a cause of its own, or counted under the same cause kept before (which
        then shows the shorter program, with its own words and label); the cause it is kept as."""
        reported = Reported(finding, cfg, steps, note=note, shrunk=shrunk)
        same = next((r for r in self.kept_like(finding) if r.same_cause(reported)), None)
        if same is not None:
            same.hits += 1
            if len(reported.steps) < len(same.steps):   # the shorter program shows it best, with its own words
                same.finding, same.config, same.steps, same.note = finding, cfg, steps, note
                same.shrunk = shrunk
            return same
        reported.found_after = {"seconds": round(time.monotonic() - self.started, 4),
                                "cpu_seconds": round(time.process_time() - self.cpu_started, 4),
                                "programs": self.result.programs}
        self.result.causes.setdefault(finding.key(), []).append(reported)
        self.result.findings.setdefault(finding.key(), reported)
        return reported

    def found(self, finding: Finding, cfg: JsonConfig, program: list[Step], run: RunResult,
              consequence: bool = False) -> None:
        """A program's finding (or the consequence of its lenient step): counted, then kept - shrunk
        first, unless its cause is most likely kept."""
        result = self.result
        if result.first_counterexample is None:
            result.first_counterexample = time.monotonic() - self.started
            result.first_counterexample_programs = result.programs
        crash = finding.kind == CRASH
        if crash:
            result.restarts += 1
            if result.restarts > self.options.restart_cap:
                result.aborted = (f"the restart cap ({self.options.restart_cap}) was hit: the target crashed "
                                  f"or hung {result.restarts} times")
        if not program or finding.step_index < 0:   # an invalid config, or a crash while creating: no steps
            self.keep_without_steps(finding, cfg)
            return
        kept = self.kept_like(finding)
        if not crash:
            program, run = self.single_if_alone(finding, cfg, program, run, consequence)
        # The cause as far as it is known before shrinking, from the whole run: its last operation,
        # and a single rewind or a chain (the last step alone cannot tell them apart: a single unsound
        # rewind was folded into the chain finding that way).
        quick_cause = cause(finding, cfg, run.steps)
        group = _group(finding)
        if kept and quick_cause in self.causes_seen:
            self.causes_seen[quick_cause].hits += 1   # most likely a cause already kept: not worth another shrink
            return
        if kept and (crash and len(kept) >= MAX_CRASHES or result.shrinks.get(group, 0) >= MAX_SHRINKS):
            # past the shrink cap a new cause is still kept, as found and marked: no cap hides a cause
            self.causes_seen[quick_cause] = self.keep(finding, cfg, run.steps, UNSHRUNK, shrunk=False)
            return
        result.shrinks[group] = result.shrinks.get(group, 0) + 1
        small_cfg, final, note = self.shrunk(finding, cfg, program, run, consequence)
        if not crash and final.finding is not None:   # a chain the shrink kept: is its last rewind enough?
            alone, tried = self.single_if_alone(final.finding, small_cfg, final.steps, final, consequence)
            if tried is not final:
                small_cfg, final, note = self.shrunk(final.finding, small_cfg, alone, tried, consequence)
        reported = final.finding or finding
        if consequence and not self.caused_by_its_entry(reported, small_cfg, final.steps):
            return
        # The quick cause is skipped from now on - unless it was a chain that shrank to a single
        # rewind: that says nothing yet about the chains.
        kept_as = self.keep(reported, small_cfg, final.steps, note)
        if _rewind_kind(final.steps) == _rewind_kind(run.steps):
            self.causes_seen[quick_cause] = kept_as

    def caused_by_its_entry(self, consequence: Finding, cfg: JsonConfig, steps: list[Step]) -> bool:
        """A consequence is the entry step's when the program without that step shows no wrong answer
        or crash: otherwise it is a defect of its own, which that program's lockstep reports (an
        unsound rewind after an over-strict one is the rewind's finding, not the refusal's)."""
        if not 0 <= consequence.after_index < len(steps):
            return True
        without = steps[:consequence.after_index] + steps[consequence.after_index + 1:]
        again = self.run_checked(cfg, without, fresh=consequence.kind == CRASH)
        return again.finding is None or again.finding.kind not in (WRONG, CRASH)

    def single_if_alone(self, finding: Finding, cfg: JsonConfig, program: list[Step], run: RunResult,
                        consequence: bool = False) -> tuple[list[Step], RunResult]:
        """A program with a chain of rewinds whose finding its last rewind alone reproduces (the same
        class, rule and failing operation) is a single-rewind program: that one is shrunk instead."""
        alone = _last_rewind_only(program[:finding.step_index + 1])
        if alone is None:
            return program, run
        tried = self.run_checked(cfg, alone, fresh=False, consequence=consequence)
        if (tried.finding is None or tried.finding.key() != finding.key() or not tried.steps
                or _op_kind(tried.steps[-1]) != _op_kind(run.steps[-1])):
            return program, run
        return alone, tried

    def keep_without_steps(self, finding: Finding, cfg: JsonConfig) -> None:
        """A finding at creation; a new crash there is tried again alone, in a fresh process."""
        note = ""
        if finding.kind == CRASH and not any(r.cause() == cause(finding, cfg, []) for r in self.kept_like(finding)):
            again = self.check(cfg, [], fresh=True)
            if again is None or again.kind != CRASH:
                note = _ALONE
            else:
                finding = again
        self.keep(finding, cfg, [], note)

    def shrunk(self, finding: Finding, cfg: JsonConfig, program: list[Step], run: RunResult,
               consequence: bool = False) -> tuple[JsonConfig, RunResult, str]:
        """The finding's minimal program: its config, its final run, and a note on how it reproduces.

        A crash is shrunk on a small budget (each hang costs a timeout), every candidate in a fresh
        process: a crash that needs earlier programs in the same process is no minimal reproduction.
        Any crash of the same kind counts while shrinking; the reported rule is the final run's.
        A candidate must fail at the same kind of operation (`_op_kind`: a decode step is not a
        multi-token step): otherwise the shrinker slips from this cause to another defect the program
        also reaches, that cause is reported twice, and this one never (measured: with the edge
        programs in another order, one of many_defects' two PLAN-READ causes was lost that way)."""
        crash = finding.kind == CRASH
        failing_op = _op_kind(run.steps[-1]) if run.steps else "create"
        rewinds = _rewind_kind(run.steps)   # likewise kept: a chain must not slip to a single rewind

        def candidate(c: JsonConfig, p: list[Step]) -> Optional[Finding]:
            tried = self.run_checked(c, p, fresh=crash, consequence=consequence)
            got = tried.finding
            if (got is None or not tried.steps or _op_kind(tried.steps[-1]) != failing_op
                    or _rewind_kind(tried.steps) != rewinds or got.safety != finding.safety):
                return None
            if crash and got.kind == CRASH and _crash_kind(got.message) == _crash_kind(finding.message):
                return replace(got, rule=finding.rule)
            return got

        budget = min(self.plan.shrink_budget, self.options.crash_shrink_budget) if crash else self.plan.shrink_budget
        small_cfg, small = shrink(cfg, program, finding, candidate, budget=budget)
        if not crash:
            final = self.run_checked(small_cfg, small, fresh=False, consequence=consequence)
            if final.finding is None or final.finding.key() != finding.key():   # flaky: keep the original
                return cfg, run, ""
            return small_cfg, final, ""
        # the shrunk crash, alone in a fresh process
        final = self.run_checked(small_cfg, small, fresh=True, consequence=consequence)
        if final.finding is not None and final.finding.kind == CRASH:
            return small_cfg, final, ""
        final = self.run_checked(cfg, program, fresh=True, consequence=consequence)
        if final.finding is not None and final.finding.kind == CRASH:
            return cfg, final, "the shrunk steps do not crash alone; the whole program does, in a fresh process"
        return cfg, run, _ALONE

    # --- the whole run ---------------------------------------------------------------------------------
    def everything(self, configs: tuple[JsonConfig, ...], rng: random.Random, edges: bool) -> SuiteResult:
        """The edge programs, the random programs, the border, the invalid configurations."""
        result, target, drive, plan = self.result, self.target, self.drive, self.plan
        requests_before = target.requests if isinstance(target, SubprocessTarget) else 0
        result.declared = scopes.summary(self.scope, configs, drive.name)
        result.skipped |= set(scopes.notes(result.declared))
        configs, outside = (tuple(part) for part in scopes.split(configs, self.scope))
        if not configs:   # a verdict on nothing would be vacuous
            result.aborted = (f"no suite configuration lies inside the scope [{self.scope}] ({self.scope.source}): "
                              f"nothing to check")
            return result
        work = _interleaved(configs, drive) if edges else []
        randoms = [rng.choice(configs) for _ in range(plan.random_programs)]
        bad_configs = drive.bad_configs(target.validates_configs)
        result.planned = len(work) + len(randoms) + len(bad_configs)
        result.configs = {describe(cfg): cfg for cfg in configs}
        if not target.validates_configs:
            result.skipped.add("config validation: a python: target gets a kvcache.CacheConfig, "
                               "which validates itself")
        try:
            with safety_alarm(self.safety - time.monotonic()):
                for cfg, program in work + [(cfg, drive.random_program(cfg, rng, rng.randint(3, plan.largest)))
                                            for cfg in randoms]:
                    if self.stopped():
                        break
                    self.one(cfg, program)
                border(outside, result, self.stopped, self.one, lambda cfg: self.check(cfg, [], False), drive)
                # Config validation last: each invalid configuration must be refused at create.
                for bad_cfg in bad_configs:
                    if self.stopped():
                        break
                    self.one(bad_cfg, [])
        except HarnessInterrupted as stop:
            if stop.signal_name == "SIGALRM":
                result.aborted = (f"the wall-clock safety net ({self.safety - self.started:.0f} s) stopped the run "
                                  f"inside a call of the target (a hang? run a python: target with --isolate)")
            else:
                result.interrupted = stop.signal_name
                result.aborted = f"the harness was interrupted by {stop.signal_name}"
            target.kill()
        finally:
            result.seconds = time.monotonic() - self.started
            result.scope = in_scope(target.validates_configs, target.optional, drive.name, self.scope.features)
            _scope_coverage(result, outside)
            # the edge programs break every clause; a run without them is judged on its rules only
            result.clauses = clause_scope(drive.name, result.scope, target.optional, self.scope.features) if edges \
                else {}
            if isinstance(target, SubprocessTarget) and result.seconds > 0:
                result.requests_per_second = (target.requests - requests_before) / result.seconds
        return result


def declared_scope(target: Target) -> scopes.Scope:
    """The target's declared scope (the whole spec when its handshake fails)."""
    try:
        return target.declared_scope()
    except TargetCrash:
        # No scope was declared: the whole spec is assumed. Each create restarts the target, so its
        # handshake crash is reported as a crash at create, and the restart cap bounds the run.
        return scopes.Scope(scopes.FULL.features, source="the handshake failed: the whole spec assumed")


def border(outside: tuple[JsonConfig, ...], result: SuiteResult, stopped: Callable[[], bool],
           one: Callable[[JsonConfig, list[Step]], None],
           refused: Callable[[JsonConfig], Optional[Finding]], layout: layouts.Layout = layouts.SEQUENCE) -> None:
    """SCOPE-BORDER: each suite config outside the scope must be refused at creation. One that is
    accepted is probed with the edge programs until the target is seen serving it another way
    (wrong); accepted but never seen wrong stays lenient."""
    wrong = (WRONG, scopes.BORDER_RULE)
    for cfg in outside:
        if stopped() or wrong in result.findings:
            break
        if refused(cfg) is None:
            result.exercised.add(scopes.BORDER_RULE)
            continue   # refused at creation, as it must be
        one(cfg, [])   # accepted (or died on it): recorded
        result.exercised.add(scopes.BORDER_RULE)
        for _, program in layout.edge_programs(cfg):
            if stopped() or wrong in result.findings:
                break
            one(cfg, program)
    if wrong in result.findings:   # the same acceptance, now shown to be wrong: one finding, not two
        result.findings.pop((LENIENT, scopes.BORDER_RULE), None)
        result.causes.pop((LENIENT, scopes.BORDER_RULE), None)


def _scope_coverage(result: SuiteResult, outside: tuple[JsonConfig, ...]) -> None:
    """The declared scope narrows the rules a run must exercise: the rules only configurations outside
    it exercise, and SCOPE-BORDER itself when nothing lies outside (the whole spec is declared)."""
    if not outside and not result.scope.get(scopes.BORDER_RULE):
        result.scope[scopes.BORDER_RULE] = "the declared scope is the whole spec: no configuration lies outside it"
    why = f"outside the declared scope [{','.join(result.declared.get('features', []))}]"
    for rule in result.declared.get("unexercised", {}).get("rules", []):
        if rule in result.scope and not result.scope[rule]:
            result.scope[rule] = why


# --- reports ---------------------------------------------------------------------------------------

def wrap(text: str, width: int, first: str = "", indent: str = "") -> list[str]:
    """Lines of at most `width` characters (the first after `first`, the others after `indent`) where
    the text has spaces: never cut inside a word (a longer word gets a line of its own)."""
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [first]


def pytest_text(target: str, reported: Reported, number: int = 1) -> str:
    """A test to paste into the target's repository: replays the minimal step list."""
    f = reported.finding
    name = f"{f.kind}_{f.rule}".lower().replace("-", "_") + (f"_{number}" if number > 1 else "")
    statement = BY_ID[f.rule].statement if f.rule in BY_ID else ""
    message = "".join(line + "\n" for line in wrap(f.message.replace("\n", " "), 100, "    # ", "    # "))
    return (f'def test_kvcache_conformance_{name}() -> None:\n'
            f'    """{f.kind} {f.rule}: {statement}"""\n'
            f'{message}'
            f'    # config {describe(reported.config)}\n'
            f'    from kvcache_spec.conformance import replay\n'
            f'    config = {reported.config!r}\n'
            f'    steps = {reported.steps!r}\n'
            f'    finding = replay({target!r}, config, steps)\n'
            f'    assert finding is None, finding\n')


def label(reported: Reported) -> str:
    """A cause's name, from the program that shows it (after shrinking, when it was shrunk): its class and
    rule, the call it fails at (with what the spec finds wrong in it) and the configuration's family."""
    f, steps = reported.finding, reported.steps
    at = _op_kind(steps[-1]) if steps else "create"
    refused = next((step["refused_with"] for step in reversed(steps) if "refused_with" in step), None)
    if f.rule == "OP-ATOMIC" and refused:   # the cause is what the target refused the call for
        at += f", which the target refused with {refused!r}"
    mla = " (v_head_dim != head_dim)" if reported.config.get("v_head_dim", reported.config.get("head_dim")) != \
        reported.config.get("head_dim") else ""
    after = f", after {f.after}" if f.after else ""
    return f"{f.kind} {f.rule}{after}: at {at}; {family(reported.config)}{mla}"


def coverage_json(result: SuiteResult) -> dict[str, Any]:
    """What the run exercised: the evidence behind its verdict."""
    return {"complete": not result.incomplete(), "incomplete": result.incomplete(),
            "programs": {"planned": result.planned, "run": result.programs, "continued": result.continued},
            "configurations": {"planned": len(result.configs), "created": len(result.created),
                               "never_created": sorted(set(result.configs) - result.created)},
            "families": {"planned": sorted({family(cfg) for cfg in result.configs.values()}),
                         "exercised": sorted(result.families)},
            "rules": rules_summary(result.scope, result.exercised),
            "clauses": clauses_summary(result.clauses, result.exercised),
            "restarts": result.restarts, "interrupted": result.interrupted or None}


def report_json(result: SuiteResult, strict: bool, exact_layout: bool) -> dict[str, Any]:
    findings: list[dict[str, Any]] = []
    for kept in result.causes.values():
        for number, r in enumerate(kept, 1):
            findings.append({"class": r.finding.kind, "rule": r.finding.rule, "cause": number,
                             "causes_of_rule": len(kept), "label": label(r), "shrunk": r.shrunk,
                             "statement": BY_ID[r.finding.rule].statement if r.finding.rule in BY_ID else "",
                             "message": r.finding.message, "config": r.config, "config_name": describe(r.config),
                             "steps": r.steps, "programs_hit": r.hits, "note": r.note, "after": r.finding.after,
                             **({"safety": r.finding.safety} if r.finding.safety else {}),
                             "found_after": r.found_after,
                             "pytest": pytest_text(result.target, r, number)})
    order = {WRONG: 0, CRASH: 1, LENIENT: 2, OVER_STRICT: 3}
    findings.sort(key=lambda f: (order[f["class"]], f["rule"], f["cause"]))
    verdict = result.verdict(strict, exact_layout)
    return {
        "format": REPORT_FORMAT, "target": result.target, "profile": result.profile, "seed": result.seed,
        "strict": strict, "exact_layout": exact_layout,
        "verdict": verdict, "conforming": verdict == CONFORMING,
        "semantic": {"conforming": not (result.classes() & {WRONG, CRASH}) and not result.incomplete(),
                     "findings": findings},
        "layout": {"canonical": not result.layout, "divergences": result.layout},
        "coverage": coverage_json(result),
        "aborted": result.aborted,
        "scope": result.declared,
        "skipped": sorted(result.skipped),
        "stats": {"programs": result.programs, "calls": result.calls, "seconds": round(result.seconds, 3),
                  "first_counterexample_seconds": None if result.first_counterexample is None
                  else round(result.first_counterexample, 4),
                  "first_counterexample_programs": result.first_counterexample_programs,
                  "requests_per_second": None if result.requests_per_second is None
                  else round(result.requests_per_second)},
    }


def report_junit(report: dict[str, Any]) -> str:
    suite = ET.Element("testsuite", name="kvcache-conformance", tests="0", failures="0", skipped="0")
    tests = failures = skipped = 0
    by_class: dict[str, list[dict[str, Any]]] = {kind: [] for kind in (WRONG, CRASH, LENIENT, OVER_STRICT)}
    for finding in report["semantic"]["findings"]:
        by_class[finding["class"]].append(finding)
    fails_run = {WRONG, CRASH} | ({LENIENT, OVER_STRICT} if report["strict"] else set())
    for kind, found in by_class.items():
        tests += 1
        case = ET.SubElement(suite, "testcase", classname="kvcache.conformance.semantic", name=kind)
        if found and kind in fails_run:
            failures += 1
            failure = ET.SubElement(case, "failure", message=f"{len(found)} {kind} finding(s)")
            failure.text = "\n\n".join(f"[{f['rule']}] {f['message']}\nsteps: {json.dumps(f['steps'])}"
                                       for f in found)
        elif found:
            out = ET.SubElement(case, "system-out")
            out.text = "\n".join(f"[{f['rule']}] {f['message']}" for f in found)
    tests += 1
    case = ET.SubElement(suite, "testcase", classname="kvcache.conformance.layout", name="canonical")
    if report["layout"]["divergences"]:
        if report["exact_layout"]:
            failures += 1
            ET.SubElement(case, "failure", message="layout is not canonical").text = \
                json.dumps(report["layout"]["divergences"], indent=1)
        else:
            ET.SubElement(case, "system-out").text = json.dumps(report["layout"]["divergences"])
    coverage = report["coverage"]
    tests += 1
    case = ET.SubElement(suite, "testcase", classname="kvcache.conformance.coverage", name="complete")
    ET.SubElement(case, "system-out").text = json.dumps(
        {k: coverage[k] for k in ("programs", "configurations", "families", "rules", "restarts")})
    if coverage["incomplete"]:
        failures += 1
        ET.SubElement(case, "failure", message="INCOMPLETE: " + "; ".join(coverage["incomplete"])[:500]).text = \
            "\n".join(coverage["incomplete"])
    for note in report["skipped"]:
        tests += 1
        skipped += 1
        ET.SubElement(ET.SubElement(suite, "testcase", classname="kvcache.conformance.skipped", name=note),
                      "skipped", message=note)
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    return ET.tostring(suite, encoding="unicode")
