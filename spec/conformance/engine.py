"""The engine core: what every layout's engine shares - the finding classes, the call and failure
path, the lockstep's grading of one call, creation and SCOPE-BORDER, and the program loop.

A layout's engine (sequence/engine.py, cell/engine.py, op/engine.py) runs a program (a list of JSON
steps) on a target and on its model, in lockstep. Every answer is compared with the model's. The first
disagreement is a `Finding`:

- wrong: a wrong answer or a corrupt read on a call the spec accepts or refuses;
- crash: the target died, hung, or broke the protocol;
- lenient: the target accepted a call the spec rejects (a caller error);
- over-strict: the target refused or raised on a call the spec accepts.

A call the spec rejects counts as rejected when the target raises / answers an error, or returns
None / False, provided its observable state is unchanged. Exact layout conformance is recorded
separately and does not stop the program. Past a lenient or over-strict step, the layout's
consequences (consequences.py) drive the rest of the program; the engine is handed that drive by
whoever builds it (the layout's `run_program`), so an engine never imports its consequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Union

from .. import model
from . import scope as scopes
from .configs import JsonConfig, describe
from .coverage import EVENTS
from .malform import CLAUSE_PREFIX, Case, case_of
from .targets import Outcome, Target, TargetCrash

WRONG, CRASH, LENIENT, OVER_STRICT = "wrong", "crash", "lenient", "over-strict"
CLASSES = (WRONG, CRASH, LENIENT, OVER_STRICT)


def failing_classes(strict: bool) -> frozenset[str]:
    """The finding classes that fail a run (SPEC.md part 6). A wrong answer, a crash and a valid call
    refused (over-strict: a runner making that call crashes on the refusal) always; a caller error served
    (lenient: many implementations are lenient on purpose) only under --strict."""
    return frozenset({WRONG, CRASH, OVER_STRICT} | ({LENIENT} if strict else set()))

Step = dict[str, Any]
# run_step's answer for a step the target's declared scope keeps back (a precondition it requires, SPEC.md
# 6.1, SCOPE-REQUIRES): never sent, and left out of the program as run
NOT_SENT: Step = {"op": "not sent"}

# What the model says a call does: rejected (a caller error), refused (None / False), or a value.
Verdict = Union[model.Rejected, "Refused", "Accepted"]



@dataclass(frozen=True)
class Refused:
    rule: str


@dataclass(frozen=True)
class Accepted:
    value: Any
    rule: str   # the rule a refusal of this call would break


@dataclass
class Finding:
    kind: str
    rule: str
    message: str
    step_index: int
    # A consequence (consequences.py): the lenient or over-strict step that led here, as
    # "<class> <rule> in <method>", and that step's index in the concrete steps; "" for a finding of
    # the lockstep itself.
    after: str = ""
    after_index: int = -1
    # and the safety property it broke (consequences.SAFETY): two properties broken under one rule
    # after the same kind of step are two causes
    safety: str = ""
    # What a report draws of the failing step (spec/conformance/pictures.py): the attend grid of a wrong answer
    # ("attend"), the cells and their owners ("cells"); JSON values only. Not part of the cause.
    picture: dict[str, Any] = field(default_factory=dict, compare=False)
    # what tells two defects of one class and rule apart at the same call (part of a cause, suite/account.py):
    # the invalid value class a config was accepted with ("op.create.capacity bool"), whether an answer
    # attends tokens the spec does not or misses some it does; "" when the rule's words say it all
    detail: str = ""

    def key(self) -> tuple[str, str]:
        return (self.kind, self.rule)


@dataclass
class RunResult:
    finding: Optional[Finding]
    steps: list[Step]                       # the concrete steps run (up to the failing one)
    calls: int = 0
    layout: list[str] = field(default_factory=list)   # exact-layout divergences (first few)
    skipped: set[str] = field(default_factory=set)
    exercised: set[str] = field(default_factory=set)   # rules some answered call or checked answer could break
    created: bool = False                               # the target created the (valid) configuration
    pool_rows: int = 0                                  # the harness's own work: pool rows allocated and copied
    over_budget: bool = False                           # stopped: pool_rows passed the row budget
    # Past a lenient or over-strict `finding`, the program driven on with that step applied: the first
    # broken safety property (consequences.py), and the concrete steps up to it.
    consequence: Optional[Finding] = None
    consequence_steps: list[Step] = field(default_factory=list)
    # where the program stopped unjudged: a step outside the declared scope, whose meaning only the features the
    # target left out define ("" when every step was judged or a finding ended it)
    unjudged: str = ""

    def as_consequence(self) -> "RunResult":
        """This run seen through its consequence: the consequence as the finding, with its steps."""
        return replace(self, finding=self.consequence, steps=self.consequence_steps)




class ConfigRejected(Exception):
    """The target rejected a config the spec rejects: nothing more to run."""


class OverBudget(Exception):
    """The target's pools (its depth) need more harness work than the run's row budget allows."""


def value_class(value: Any) -> str:
    """An invalid value's class, as the causes of accepted invalid configurations are told apart by: a bool is
    not an int, zero not a negative."""
    if isinstance(value, bool) or not isinstance(value, int):
        return type(value).__name__
    return "0" if value == 0 else "negative" if value < 0 else "int"


def invalid_value_class(cfg: JsonConfig, argument: str) -> str:
    """The value class of a rejected config's faulty `argument`: the key's own value, else each layer's."""
    if argument in cfg:
        return f"{argument} {value_class(cfg[argument])}"
    layers = cfg.get("layers")
    found = sorted({value_class(entry[argument]) for entry in layers if isinstance(entry, dict) and argument in entry}) \
        if isinstance(layers, list) else []
    return f"{argument} {','.join(found) or 'absent'}"


class Stop(Exception):
    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.message)
        self.finding = finding


# Past a lenient or over-strict entry, the layout's consequences drive the rest of the program:
# drive(engine, program, entry) sets `engine.result.consequence` on a broken safety property.
Drive = Callable[[Any, list[Step], Finding], None]


def _is_refusal(outcome: Outcome) -> bool:
    return not outcome.ok or outcome.value is None or outcome.value is False


class Caller:
    """The call and failure path of every layout's engine: one call to the target (a crash is a
    finding naming the call), the answer's exact JSON type, the failure at the current step, and
    the drive past a lenient or over-strict entry."""

    answer_types: dict[str, tuple[type, ...]] = {}   # the exact JSON type of each method's answer besides null

    def __init__(self, target: Target, cfg: JsonConfig, scope: Optional[scopes.Scope] = None,
                 drive: Optional[Drive] = None) -> None:
        self.target, self.cfg, self.scope, self.drive = target, cfg, scope, drive
        self.result = RunResult(None, [])
        self.index = 0
        # SCOPE-BORDER: the features a valid config needs beyond the scope (known once the target is started)
        self.outside: frozenset[str] = frozenset()
        # the call judged last, with its answer: a lenient or over-strict finding's entry call
        self.judged: Optional[tuple[str, dict[str, Any], Outcome]] = None
        self.malformed: Optional[Case] = None   # the argument clause the step running breaks (malform.py)

    def _fail(self, kind: str, rule: str, message: str, detail: str = "") -> Stop:
        return Stop(Finding(kind, rule, message, self.index, detail=detail))

    def show(self, args: dict[str, Any]) -> str:
        """A call's arguments as a finding's message shows them."""
        return _show(args)

    def _call(self, method: str, args: dict[str, Any], rule: str) -> Outcome:
        self.result.calls += 1
        try:
            outcome = self.target.call(method, args)
        except TargetCrash as crash:
            raise self._fail(CRASH, rule, f"{method}({self.show(args)}): {crash}") from None
        self._check_type(method, args, outcome, rule)
        self.result.exercised.add(rule)
        if self.malformed is not None and method == self.malformed.clause.call:   # the target answered it
            self.result.exercised.add(CLAUSE_PREFIX + self.malformed.clause.id)
            self.result.exercised.add(CLAUSE_PREFIX + self.malformed.name)   # coverage counts each case
        return outcome

    def _check_type(self, method: str, args: dict[str, Any], outcome: Outcome, rule: str) -> None:
        """Answers have exact JSON types: can_extend answering 1 is a broken protocol, not a yes."""
        expected = self.answer_types.get(method)
        # null is a refusal value (graded by the engine: over-strict where the spec serves the call)
        if expected is None or not outcome.ok or outcome.value is None or type(outcome.value) in expected:
            return
        wanted = {bool: "a boolean", int: "an integer", dict: "an object", list: "an array"}[expected[0]]
        raise self._fail(CRASH, rule, f"{method}({self.show(args)}): protocol: answered {outcome.value!r} "
                                      f"({_json_type(outcome.value)}), not {wanted} or null")

    def _create(self, rule: str) -> Outcome:
        """The target creates its cache from the config; a crash is a finding under `rule`."""
        self.result.calls += 1
        try:
            return self.target.create(self.cfg)
        except TargetCrash as crash:
            raise self._fail(CRASH, rule, f"create({describe(self.cfg)}): {crash}") from None

    def drive_on(self, program: list[Step], entry: Finding) -> None:
        """Past a lenient or over-strict step, drive the rest of the program with that step applied and
        judge only the safety properties (consequences.py); a broken one is `result.consequence`."""
        if self.drive is not None:
            self.drive(self, program, entry)


class Engine(Caller):
    """One program on one target of a layout with a lockstep model; a fresh cache per program. The
    layout's engine (sequence/engine.py, cell/engine.py) gives the model's verdicts, what is observed
    after a call, the checks of a fresh cache and the program ops; the grading is this one."""

    def __init__(self, target: Target, cfg: JsonConfig, exact: bool = False, light: bool = False,
                 scope: Optional[scopes.Scope] = None, row_budget: Optional[int] = None,
                 drive: Optional[Drive] = None) -> None:
        super().__init__(target, cfg, scope, drive)
        self.exact = exact
        self.rejected_config: Optional[model.Rejected] = None   # the layout's model rejects the config
        # light: fewer observation calls (the layout's engine says which). The golden vectors use it to stay small.
        self.light = light
        self.row_budget = row_budget

    # --- helpers ---------------------------------------------------------------------------------
    def _exercise(self, event: str) -> None:
        self.result.exercised.update(EVENTS[event])

    def _rows(self, count: int) -> None:
        self.result.pool_rows += count
        if self.row_budget is not None and self.result.pool_rows > self.row_budget:
            raise OverBudget()

    def _layout(self, message: str) -> None:
        if len(self.result.layout) < 5:
            self.result.layout.append(f"step {self.index}: {message}")

    def brief(self, value: Any) -> str:
        """The model's answer as an over-strict finding names it."""
        return repr(value)

    # --- what the layout's engine gives -------------------------------------------------------------
    def verdict(self, method: str, args: dict[str, Any]) -> Verdict:
        raise NotImplementedError

    def observe(self, context: str, rule: str, lenient_rule: Optional[str] = None, retained: bool = True) -> None:
        raise NotImplementedError

    def open_step_kept(self, context: str) -> None:
        """ATOMIC: a rejected or refused call leaves an open step open (layouts with one check it)."""

    def accepted_anyway(self, method: str, args: dict[str, Any], rule: str, shown: str) -> Optional[Verdict]:
        """A call the spec refuses that the target served and that is right on the target's own layout:
        the verdict to go on with, or None (a wrong finding)."""
        return None

    def after_create(self) -> None:
        raise NotImplementedError

    def run_step(self, step: Step) -> Optional[Step]:
        raise NotImplementedError

    def _concrete_guess(self, step: Step) -> Step:
        return dict(step)

    # --- one checked call --------------------------------------------------------------------------
    def checked(self, method: str, args: dict[str, Any]) -> tuple[Verdict, Outcome]:
        """Call the target, compare with the model; raise Stop on a finding. Does not advance the model."""
        verdict = self.verdict(method, args)
        rule = verdict.rule
        outcome = self._call(method, args, rule)
        self.judged = (method, args, outcome)
        shown = f"{method}({self.show(args)})"   # a layout may shorten what it shows (a state's bytes)
        if isinstance(verdict, model.Rejected):
            if not _is_refusal(outcome):
                raise self._fail(LENIENT, rule, f"{shown} is a caller error ({rule}, {verdict.argument}) "
                                                f"but the target accepted it: {outcome.value!r}")
            self.observe(f"after the rejected {shown}", "ATOMIC", lenient_rule=rule)
            self.open_step_kept(f"the rejected {shown}")
        elif isinstance(verdict, Refused):
            if not _is_refusal(outcome):
                anyway = self.accepted_anyway(method, args, rule, shown)
                if anyway is not None:
                    return anyway, outcome
                raise self._fail(WRONG, rule, f"{shown} must be refused ({rule}) but the target "
                                              f"answered {outcome.value!r}{self._chain_before(method, args)}")
            self.observe(f"after the refused {shown}", "ATOMIC")
            self.open_step_kept(f"the refused {shown}")
        elif method not in ("commit", "clear") and _is_refusal(outcome) and verdict.value is not False:
            answer = outcome.error if not outcome.ok else repr(outcome.value)
            raise self._fail(OVER_STRICT, rule, f"{shown} is valid (the spec answers "
                                                f"{self.brief(verdict.value)}) but the target refused it: {answer}")
        elif not outcome.ok:
            raise self._fail(OVER_STRICT, rule, f"{shown} is valid but the target raised: {outcome.error}")
        return verdict, outcome

    def _chain_before(self, method: str, args: dict[str, Any]) -> str:
        """A rewind right after other rewinds says so: a chain and a single rewind that end in the same call
        are two causes, and must not read as one (the shrinker makes their last calls alike)."""
        steps = self.result.steps
        if steps and steps[-1].get("op") == method and steps[-1].get("new_len") == args.get("new_len"):
            steps = steps[:-1]   # the call itself, already recorded
        chain: list[str] = []
        for step in reversed(steps):
            if step.get("op") != method or method != "rewind":
                break
            chain.append(f"rewind({step.get('new_len')!r})")
        return f", after {', '.join(reversed(chain))}" if chain else ""

    # --- the program ---------------------------------------------------------------------------------
    def _border(self) -> frozenset[str]:
        """The features this (valid) config needs outside the scope: empty when it is inside."""
        if self.rejected_config is not None:
            return frozenset()
        return (self.scope or self.target.scope).missing(self.cfg)

    def start(self) -> None:
        try:
            created = self._create(self.rejected_config.rule if self.rejected_config else "CFG-TYPE")
        finally:
            self.outside = self._border()   # known after create, crashed or not (a crash outside is SCOPE-BORDER's)
        if self.outside and not created.ok:
            self.outside = frozenset()   # refused at the border, as SCOPE-BORDER requires: no finding
            raise ConfigRejected()
        if self.rejected_config is not None:
            rule = self.rejected_config.rule
            self.result.exercised.add(rule)
            if created.ok:
                raise self._fail(LENIENT, rule, f"create accepted a config the spec rejects ({rule}, "
                                                f"{self.rejected_config.argument})",
                                 invalid_value_class(self.cfg, self.rejected_config.argument))
            raise ConfigRejected()
        if not created.ok:
            raise self._fail(OVER_STRICT, "CFG-TYPE", f"create refused a valid config: {created.error}")
        self.result.created = True
        self.result.exercised.add("CFG-TYPE")   # a valid config answered: refusing it would break CFG-TYPE
        self.after_create()

    def run(self, program: list[Step]) -> RunResult:
        sent: list[Step] = []   # the program as sent: a step run_step answers NOT_SENT is left out of it, so a
        rest: list[Step] = list(program)   # step index is its place in what the target was sent
        try:
            self.index = -1   # a finding while creating the cache has no step
            self.start()
            for position, step in enumerate(program):
                self.index = len(sent)
                sent.append(step)
                rest = program[position + 1:]   # the steps not run yet: a drive past a lenient step goes on with them
                self.malformed = case_of(step)
                concrete = self.run_step(step)
                if concrete is NOT_SENT:
                    sent.pop()
                elif concrete is not None:
                    self.result.steps.append({**concrete, **(self.malformed.tag() if self.malformed else {})})
            program = sent
            if self.light:
                self.index = len(program)
                self.observe("at the end", "LEN-BOUNDS")
        except ConfigRejected:
            pass
        except OverBudget:
            self.result.over_budget = True
        except Stop as stop:
            program = sent + rest
            self.result.finding = stop.finding
            if 0 <= stop.finding.step_index == len(self.result.steps) and stop.finding.step_index < len(program):
                self.result.steps.append(self._concrete_guess(program[stop.finding.step_index]))
            if self.malformed is not None and 0 <= stop.finding.step_index == len(self.result.steps) - 1:
                # the failing step names the clause it breaks, as the steps before it do
                self.result.steps[-1] = {**self.result.steps[-1], **self.malformed.tag()}
            if stop.finding.kind in (LENIENT, OVER_STRICT) and stop.finding.step_index >= 0 and not self.light \
                    and not self.outside:
                self.drive_on(program, stop.finding)
        if self.outside:
            self.result.finding = self.border_finding(self.result.finding, len(program))
        return self.result

    def border_finding(self, finding: Optional[Finding], end: int) -> Finding:
        """SCOPE-BORDER: the target accepted a config outside its declared scope. Any disagreement
        with the spec on it is `wrong` (served another way), a crash stays a crash, and no
        disagreement at all is `lenient` (it should refuse the config, or declare the feature)."""
        scope = self.scope or self.target.scope
        head = (f"create({describe(self.cfg)}) needs {', '.join(sorted(self.outside))}, outside the declared "
                f"scope [{scope}] ({scope.source}), and the target accepted it instead of refusing it")
        rule = scopes.BORDER_RULE
        if finding is None:
            return Finding(LENIENT, rule, f"{head}; it answered as the spec on {end} steps: declare the "
                                          f"feature in the scope, or refuse the config", end)
        if finding.kind == CRASH:
            return Finding(CRASH, rule, f"{head}, then: {finding.message}", finding.step_index)
        return Finding(WRONG, rule, f"{head}, and serves it another way: {finding.kind} {finding.rule}: "
                                    f"{finding.message}", finding.step_index)


def _same(got: Any, expected: Any) -> bool:
    """Equal and of the same type: True is not 1 here."""
    return type(got) is type(expected) and got == expected


def _json_type(value: Any) -> str:
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
                       (list, "an array"), (dict, "an object"), (type(None), "null")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _show(args: dict[str, Any]) -> str:
    return ", ".join(repr(v) if not isinstance(v, dict) else "<plan>" for v in args.values())
