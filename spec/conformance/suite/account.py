"""Accounting: what a program's run adds to the suite's result - counts, coverage, the crash streak -
and the counterexamples kept per cause (`Reported`, `cause`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import layouts
from .. import scope as scopes
from ..configs import JsonConfig, describe
from ..coverage import family, shortfall
from ..engine import CRASH, Finding, RunResult, Step, failing_classes
from ..targets import Target
from .plan import CONFORMING, INCOMPLETE, NOT_CONFORMING, SAME_CRASH_IN_A_ROW, Options, Profile

_ALONE = ("does not reproduce alone in a fresh process: it depends on earlier programs run in the same "
          "target process (the steps are those of the program that crashed, up to the crash)")


@dataclass
class Reported:
    finding: Finding
    config: JsonConfig
    steps: list[Step]
    hits: int = 1
    note: str = ""      # e.g. the crash did not reproduce alone in a fresh process
    shrunk: bool = True  # False: kept past the shrink cap, as found (plan.UNSHRUNK)
    found_after: dict[str, float] = field(default_factory=dict)   # seconds, cpu_seconds, programs: when kept
    # --baseline: found on a program that passed in the baseline run, or none of its causes (kept, and shrunk, apart
    # from the known causes: a new defect never folds into one)
    new: bool = False

    def cause(self) -> tuple[Any, ...]:
        return cause(self.finding, self.config, self.steps)

    def same_cause(self, other: "Reported") -> bool:
        """One cause: equal `cause`s, or the very same words - the same message, after the same step,
        through a single rewind or a chain alike - on another configuration family (a shrink that could
        not flatten the layers must not print one cause twice)."""
        if self.new != other.new:   # --baseline: a program that newly fails is kept apart from the known causes
            return False
        return self.cause() == other.cause() or (
            _group(self.finding) == _group(other.finding) and self.finding.message == other.finding.message
            and self.finding.after == other.finding.after and _rewind_kind(self.steps) == _rewind_kind(other.steps))


def program_key(config: JsonConfig, steps: list[Step]) -> str:
    """A counterexample's program as JSON: the same in a report and in a run (--baseline's known programs)."""
    return json.dumps([config, steps], sort_keys=True, default=str)


def cause_key(cause_: tuple[Any, ...]) -> str:
    """A cause as a report's JSON holds it ("cause_key"): what --baseline compares two runs' causes by."""
    return json.dumps(cause_, default=str)


def _op_kind(step: Step) -> str:
    """A step's kind for `cause`: a full step and a bare plan fail alike (on the plan); T=1 is a decode."""
    op = str(step.get("op"))
    if "case" in step:   # an op-face step: what the refused call broke (op/engine.py, _case)
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
    multi-token step; a plan is not a can_extend), a single rewind versus a chain of rewinds (for a crash
    only when it crashed in a rewind), and for a
    consequence the kind of step that led there and the safety property broken. Everything else (values, lengths, max_write, the steps that lead there) is the same cause seen
    through another program. The finding's detail tells defects apart at one call (the invalid value class a
    config was accepted with, tokens attended beyond the spec's or missed)."""
    kinds = [_op_kind(step) for step in steps]
    how = how_it_crashed(finding) if finding.kind == CRASH else (finding.rule,)
    # a crash is its signal in its method: rewinds before it tell causes apart only when it crashes in one
    crashed_elsewhere = finding.kind == CRASH and not (steps and steps[-1].get("op") == "rewind")
    return (_group(finding), how, family(cfg).split(",")[0], kinds[-1] if kinds else "create",
            "" if crashed_elsewhere else _rewind_kind(steps), finding.after, finding.safety, finding.detail)


def _rewind_kind(steps: list[Step]) -> str:
    """A single rewind (or none) versus a chain of rewinds: two causes (docs/conformance.md promises both)."""
    return "rewind chain" if sum(1 for step in steps if step.get("op") == "rewind") > 1 else ""


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
    failing_programs: set[int] = field(default_factory=set)   # the numbers of the programs that showed a finding
    # and each one's configuration and program as planned (in memory only: --against runs them on another target)
    failing_steps: dict[int, tuple[JsonConfig, list[Step]]] = field(default_factory=dict)

    def classes(self) -> set[str]:
        return {kind for kind, _ in self.findings}

    def incomplete(self) -> list[str]:
        """Why the run exercised less than its profile promised (empty: full coverage)."""
        reasons = [self.aborted] if self.aborted else []
        return reasons + shortfall(self.planned, self.programs, set(self.configs), self.created, self.scope,
                                   self.exercised, self.clauses)

    def verdict(self, strict: bool = False, exact_layout: bool = False) -> str:
        if self.classes() & failing_classes(strict) or (exact_layout and self.layout):
            return NOT_CONFORMING
        return INCOMPLETE if self.incomplete() else CONFORMING

    def conforming(self, strict: bool = False, exact_layout: bool = False) -> bool:
        return self.verdict(strict, exact_layout) == CONFORMING


class Accounting:
    """One run of the suite: the target, what the profile allows, and the result being filled in; one
    program judged, and what its run adds. The phases build on it: shrink.py (a finding, shrunk and
    kept) and drive.py (the programs, in order)."""

    def __init__(self, target: Target, plan: Profile, result: SuiteResult, scope: scopes.Scope,
                 drive: layouts.Layout, options: Options, started: float, safety_seconds: float) -> None:
        self.target, self.plan, self.result, self.scope, self.drive = target, plan, result, scope, drive
        self.options = options
        self.started = started
        self.cpu_started = time.process_time()   # this process's CPU only (not a cmd: target's)
        self.safety = self.started + safety_seconds
        self.rows_used = 0
        self.causes_seen: dict[tuple[Any, ...], Reported] = {}   # a cause before shrinking -> the cause kept for it
        self.last_crash: Optional[tuple[str, str]] = None   # how the last program crashed (None: it did not)
        self.same_crash_in_a_row = 0
        self.program_number = -1   # the program being run, numbered in the run's order (the same for a seed)
        self.planned_program: tuple[JsonConfig, list[Step]] = ({}, [])   # and its configuration and steps

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

    # --- the counterexamples kept per cause ---------------------------------------------------------
    def kept_like(self, finding: Finding) -> list[Reported]:
        """The counterexamples kept in this finding's group: its (class, rule), or every crash."""
        return [r for rs in self.result.causes.values() for r in rs if _group(r.finding) == _group(finding)]

    def newly_failing(self) -> bool:
        """--baseline: whether the program being run passed in the baseline run (its findings are new)."""
        known = self.options.known_failing
        return known is not None and self.program_number not in known

    def is_new(self, reported: Reported) -> bool:
        """--baseline: a cause found on a program that passed there, or none of the baseline's causes."""
        return self.options.known_failing is not None and (
            self.newly_failing() or cause_key(reported.cause()) not in self.options.known_causes)

    def keep(self, finding: Finding, cfg: JsonConfig, steps: list[Step], note: str = "",
             shrunk: bool = True) -> Reported:
        """The finding kept as a cause of its own, or counted under the same cause kept before (which
        then shows the shorter program, with its own words and label); the cause it is kept as."""
        reported = Reported(finding, cfg, steps, note=note, shrunk=shrunk)
        reported.new = self.is_new(reported)
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
