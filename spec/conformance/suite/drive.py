"""The drive: the programs of a run in order - edge programs interleaved over the configurations,
random ones, the border (SCOPE-BORDER), the invalid configurations - each judged by the layout's
engine, continued past a lenient or over-strict step; and `run_suite` / `replay`, the suite's entry."""

from __future__ import annotations

import random
import time
from typing import Any, Callable, Optional, Union

from .. import layouts
from .. import scope as scopes
from ..configs import JsonConfig, describe
from ..coverage import clause_scope, in_scope
from ..engine import LENIENT, OVER_STRICT, WRONG, Finding, Step
from ..malform import sendable
from ..targets import HarnessInterrupted, SubprocessTarget, Target, parse_target, safety_alarm
from .account import SuiteResult, program_key
from .plan import CRASH_SHRINK_BUDGET, PROFILES, Options, declared_scope, interleaved, without_missing_verbs
from .shrink import Shrinking


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


def run_suite(target: Target, profile: str = "quick", seed: int = 0,
              configs: Optional[tuple[JsonConfig, ...]] = None, deadline: Optional[float] = None,
              stop_after_first: bool = False, crash_shrink_budget: int = CRASH_SHRINK_BUDGET,
              edges: bool = True, restart_cap: Optional[int] = None,
              scope: Optional[scopes.Scope] = None, layout: Optional[str] = None,
              continue_past_lenient: bool = True, baseline: Optional[dict[str, Any]] = None) -> SuiteResult:
    """Edge programs for every config inside the scope, then random ones, then the border (configs
    outside the scope must be refused, SCOPE-BORDER), then invalid configs; findings shrunk and kept
    per cause. A crash or a hang does not end the run: the target restarts (up to the restart cap).

    scope: overrides the target's declared scope (the CLI's --scope).
    layout: overrides the target's declared layout (the CLI's --layout); configs default to the layout's.
    continue_past_lenient: past the step of a lenient or over-strict finding, grade what it leads to (the
    safety properties of consequences.py, the step applied) and run the program again without the step,
    so the steps after it are checked too (False only to show what that finds).

    baseline: an earlier run's JSON report of the same target, profile and seed (`known_baseline`): the programs
    that passed there and fail here are new, and their findings are kept and shrunk apart from the known causes.
    deadline: the wall-clock safety net in seconds (default: the profile's); hitting it is INCOMPLETE.
    The harness's own SIGTERM/SIGINT/SIGHUP (`stop_on_signals`) ends the run INCOMPLETE, with the partial
    result returned.
    """
    plan = PROFILES[profile]
    started = time.monotonic()
    options = Options(stop_after_first, crash_shrink_budget, continue_past_lenient,
                      plan.restart_cap if restart_cap is None else restart_cap, *known_baseline(baseline))
    scope = scope or declared_scope(target)
    drive = layouts.of(target, layout)   # known once a cmd: target's hello is read (declared_scope)
    target.layout = drive.name
    scopes.check_layout(scope, drive.name)   # SCOPE-DECLARE: an override (--scope, --layout) is checked here
    scope = without_missing_verbs(target, scope, configs or drive.configs)
    run = SuiteRun(target, plan, SuiteResult(target.name, profile, seed), scope, drive, options,
                   started, plan.safety_seconds if deadline is None else deadline)
    # a fixed max_seqs: the twins of the configs outside it by their max_seqs alone are driven
    return run.everything(scopes.with_twins(configs or drive.configs, scope), random.Random(seed), edges)


def known_baseline(baseline: Optional[dict[str, Any]]) -> tuple[Optional[frozenset[int]], frozenset[str], frozenset[str]]:
    """A baseline report's failing program numbers, its causes and their programs (None, nothing: no baseline)."""
    if baseline is None:
        return None, frozenset(), frozenset()
    findings = baseline["semantic"]["findings"]
    return (frozenset(int(number) for number in baseline.get("failing_programs", [])),
            frozenset(str(f.get("cause_key")) for f in findings),
            frozenset(program_key(f["config"], f["steps"]) for f in findings))


class SuiteRun(Shrinking):
    """The programs of one run, in order."""

    def one(self, cfg: JsonConfig, program: list[Step]) -> None:
        """Run one program; past a lenient or over-strict finding, run it again without that step.

        The model cannot follow a call the spec rejects but the target served (or one it refused that the
        spec serves), so the lockstep ends at such a finding. What the step itself leads to is graded by
        the engine's drive past it (consequences.py, kept by `one_run`); the steps after it would still
        go unchecked, and a wrong answer there would hide behind the lenient one. Dropping the step (as
        the shrinker does: arguments are relative) checks the rest; each continuation is one step
        shorter, so at most len(program) of them run, and a continuation counts in `continued`, not in
        `programs`. A target declaring `trusted-args` or `lazy-shapes` is sent the program without the calls
        those relaxations leave out (malform.sendable)."""
        program = sendable(program, self.scope.relaxations())
        if self.drive.sent is not None:
            program = self.drive.sent(program, self.scope)
        self.program_number += 1
        self.planned_program = (cfg, program)
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

    def everything(self, configs: tuple[JsonConfig, ...], rng: random.Random, edges: bool) -> SuiteResult:
        """The edge programs, the random programs, the border, the invalid configurations."""
        result, target, drive, plan = self.result, self.target, self.drive, self.plan
        requests_before = target.requests if isinstance(target, SubprocessTarget) else 0
        configs_spoken, later = scopes.in_version(configs, self.scope)   # a later version's configs: never sent
        configs = tuple(configs_spoken)
        result.declared = scopes.summary(self.scope, configs, drive.name)
        result.skipped |= set(scopes.notes(result.declared)) | set(later)
        configs, outside = (tuple(part) for part in scopes.split(configs, self.scope))
        if not configs:   # a verdict on nothing would be vacuous
            result.aborted = (f"no suite configuration lies inside the scope [{self.scope}] ({self.scope.source}): "
                              f"nothing to check")
            return result
        work = interleaved(configs, drive) if edges else []
        randoms = [rng.choice(configs) for _ in range(plan.random_programs)]
        bad_configs, later = scopes.in_version(drive.bad_configs(target.validates_configs), self.scope)
        result.skipped |= {note.replace("configurations", "invalid configurations", 1) for note in later}
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
                if not self.stopped():
                    self.fold_padded_causes()
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
            relaxed = self.scope.relaxations()
            result.scope = in_scope(target.validates_configs, target.optional, drive.name, self.scope.features, relaxed)
            _scope_coverage(result, outside)
            # the edge programs break every clause; a run without them is judged on its rules only
            result.clauses = clause_scope(drive.name, result.scope, target.optional, self.scope.features,
                                          relaxed, configs, self.scope.user_config) if edges else {}
            if isinstance(target, SubprocessTarget) and result.seconds > 0:
                result.requests_per_second = (target.requests - requests_before) / result.seconds
        return result


def border(outside: tuple[JsonConfig, ...], result: SuiteResult, stopped: Callable[[], bool],
           one: Callable[[JsonConfig, list[Step]], None],
           refused: Callable[[JsonConfig], Optional[Finding]], layout: Optional[layouts.Layout] = None) -> None:
    """SCOPE-BORDER: each suite config outside the scope must be refused at creation. One that is
    accepted is probed with the edge programs until the target is seen serving it another way
    (wrong); accepted but never seen wrong stays lenient."""
    wrong = (WRONG, scopes.BORDER_RULE)
    layout = layout or layouts.get("sequence")
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
