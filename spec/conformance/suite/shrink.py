"""Shrinking: a finding's minimal program (greedy delta debugging over any layout's steps and config),
and what the suite does with a finding - counted, shrunk unless its cause is most likely kept, kept
per cause.

Shrinking is our own delta debugging rather than Hypothesis: the same shrinker works for in-process
and subprocess targets (no Hypothesis database, no in-process assumption), is deterministic for a seed,
and its output is a plain JSON step list anyone can replay.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any, Callable, Iterator, Optional

from ... import model, op_model, paged_model
from ..configs import JsonConfig, to_model
from ..consequences import UNACCEPTED_TOKEN
from ..engine import CRASH, WRONG, Finding, RunResult, Step
from .account import (_ALONE, Accounting, Reported, _crash_kind, _group, _op_kind, _rewind_kind, cause,
                      program_key)
from .plan import MAX_CRASHES, MAX_SHRINKS, UNSHRUNK

Check = Callable[[JsonConfig, list[Step]], Optional[Finding]]


# Every smaller value of a small int is tried (smallest first): what makes "no single smaller value shows
# it" true. A larger one (a position near 2**31) is tried at a few points only.
SMALL = 64


def _below(value: int, low: int) -> list[int]:
    """The values below `value` down to `low`, smallest first (a few when value is large)."""
    if value - low <= SMALL:
        return list(range(low, value))
    return [v for v in dict.fromkeys([low, low + 1, value // 2, value - 1]) if low <= v < value]


def _smaller_values(value: Any) -> list[Any]:
    """Simpler variants of one argument, simplest first."""
    if isinstance(value, bool) or not isinstance(value, (int, dict, list)):
        return []
    if isinstance(value, list):   # a declaration's owners: one fewer (a shorter step)
        return [value[:i] + value[i + 1:] for i in range(len(value))] if len(value) > 1 else []
    if isinstance(value, int):
        if 0 < value <= SMALL:
            return list(range(0, value))
        return [v for v in dict.fromkeys([0, 1, value // 2, value - 1]) if abs(v) < abs(value)]
    out: list[Any] = []
    for key, inner in value.items():
        if key in ("rel", "back", "room", "open", "limit", "n") and isinstance(inner, int):
            out += [{key: v} for v in _smaller_values(inner)]
    return out


CASE_TAG = ("clause", "variant", "q_len", "case")   # what names a malformation: not an argument to shrink


def _same_step(program: list[Step], index: int) -> range:
    """The op face's one step around `index`: the run of fetches without explicit positions or a case that
    share its length ("n") - a contiguous step is one call per layer, of one length."""
    step = program[index]

    def part(other: Step) -> bool:
        return other.get("op") == "fetch" and "n" in other and "positions" not in other and \
            "clause" not in other and other.get("n") == step.get("n")
    if not part(step):
        return range(index, index)
    first, last = index, index
    while first > 0 and part(program[first - 1]):
        first -= 1
    while last + 1 < len(program) and part(program[last + 1]):
        last += 1
    return range(first, last + 1)


def _shorter_steps(program: list[Step]) -> Iterator[list[Step]]:
    """Every step one length shorter or less, smallest first: a whole op step's calls (every layer) at once,
    then each call's arguments alone (an argument of one call: a sequence plan's T, a rewind's length)."""
    done: set[int] = set()
    for index in range(len(program)):
        group = _same_step(program, index)
        if len(group) > 1 and index not in done:
            done.update(group)
            for n in _below(int(program[index]["n"]), 1):
                yield [{**s, "n": n} if i in group else s for i, s in enumerate(program)]
    for index in range(len(program)):
        for key in [key for key in program[index] if key not in CASE_TAG]:
            for simpler in _smaller_values(program[index][key]):
                candidate = [dict(s) for s in program]
                candidate[index][key] = simpler
                yield candidate


def _drop_steps(program: list[Step], same: Callable[[list[Step]], bool], budget_left: Callable[[], bool]) -> list[Step]:
    """Delta debugging over the steps: chunks, halved down to single steps, until no single step can go."""
    chunk = max(1, len(program) // 2)
    while chunk >= 1 and budget_left():
        start, removed = 0, False
        while start < len(program) and budget_left():
            candidate = program[:start] + program[start + chunk:]
            if candidate and same(candidate):
                program, removed = candidate, True
            else:
                start += chunk
        if not removed:
            chunk //= 2
    return program


def shrink(cfg: JsonConfig, program: list[Step], finding: Finding, check: Check,
           budget: int = 400) -> tuple[JsonConfig, list[Step], bool]:
    """The finding's minimal counterexample: the same class and rule (and, through `check`, the same
    call) on a configuration and program none of whose dimensions can be made smaller.

    In turn, until a whole round changes nothing: drop steps (chunks, then single ones); then each
    dimension of the configuration (`_simpler_configs`: layers, windows, max_write, capacity, batch,
    heads, widths - every smaller value, smallest first); then each step's length and arguments
    (`_shorter_steps`). A round that changed nothing tried every single step removed and every single
    smaller value: the result is minimal in each of them. The third value says whether the budget let
    that last round finish (else the result is only smaller).
    """
    want = finding.key(), _served_as(finding), finding.detail
    runs = 0

    def same(c: JsonConfig, p: list[Step]) -> bool:
        nonlocal runs
        runs += 1
        got = check(c, p)
        return got is not None and (got.key(), _served_as(got), got.detail) == want

    def budget_left() -> bool:
        return runs < budget

    program = program[:finding.step_index + 1]
    changed = True
    while changed and budget_left():
        changed = False
        shorter = _drop_steps(program, lambda p: same(cfg, p), budget_left)
        changed, program = len(shorter) < len(program), shorter
        for simpler_cfg in _simpler_configs(cfg):
            if not budget_left():
                break
            if same(simpler_cfg, program):
                cfg, changed = simpler_cfg, True
                break
        if changed:
            continue
        for candidate in _shorter_steps(program):
            if not budget_left():
                break
            if same(cfg, candidate):
                program, changed = candidate, True
                break
    return cfg, program, not changed and budget_left()


SERVED_AS = re.compile(r"serves it another way: (\S+ \S+):")


def _served_as(finding: Finding) -> str:
    """A SCOPE-BORDER finding's own finding (engine.border_finding: "serves it another way: wrong PLAN-READ:"):
    part of what the shrink keeps, so a smaller config does not trade the way it is served for another."""
    found = SERVED_AS.search(finding.message)
    return found.group(1) if found else ""


def _with_layers(cfg: JsonConfig, layers: list[dict[str, Any]], n_layers: Optional[int] = None) -> JsonConfig:
    return {**cfg, "layers": layers, "n_layers": len(layers) if n_layers is None else n_layers}


def _simpler_configs(cfg: JsonConfig) -> list[JsonConfig]:
    """Every configuration one dimension smaller, the plainest first: fewer layers, a ring as a flat layer,
    a narrower window, no max_write or a smaller one, less capacity, batch, heads, widths - each dimension
    at every smaller value, smallest first. Only configurations the spec accepts."""
    if "groups" in cfg:
        return _simpler_paged_configs(cfg)
    out: list[JsonConfig] = []
    layers = cfg["layers"]
    n_layers = cfg["n_layers"]
    if len(layers) > 1:
        out += [_with_layers(cfg, layers[:drop] + layers[drop + 1:]) for drop in range(len(layers))]
    elif isinstance(n_layers, int):
        out += [{**cfg, "n_layers": n} for n in _below(n_layers, 1)]
    # the simplest family that still fails: a defect that shows on flat layers is not a ring defect
    flat = [{**entry, "kind": "flat", "window": 0} for entry in layers]
    if any(entry.get("kind") == "ring" for entry in layers):
        out.append({**cfg, "layers": flat, "max_write": None})
    for index, entry in enumerate(layers):
        if entry.get("kind") == "ring" and isinstance(entry.get("window"), int):
            out.append({**cfg, "layers": [*layers[:index], flat[index], *layers[index + 1:]]})
            out += [{**cfg, "layers": [*layers[:index], {**entry, "window": w}, *layers[index + 1:]]}
                    for w in _below(entry["window"], 1)]
    max_write = cfg.get("max_write")
    if isinstance(max_write, int):
        out += [{**cfg, "max_write": None}] + [{**cfg, "max_write": m} for m in _below(max_write, 1)]
    if "sizing" in cfg and cfg["sizing"] != "dynamic":
        out.append({**cfg, "sizing": "dynamic"})
    out += [{**cfg, "capacity": c} for c in _below(cfg["capacity"], 1)]
    # an op-face config's own sizes (op/programs.py, op_config; the layer entries repeat heads and head_dim)
    # a value width of its own, made the keys' - only downwards: raising v_head_dim to head_dim would let the next
    # round lower it again, a cycle that spends the budget (the narrower head_dim below makes that config instead)
    if _is_size(cfg.get("v_head_dim")) and _is_size(cfg.get("head_dim")) and cfg["v_head_dim"] > cfg["head_dim"]:
        out.append({**cfg, "v_head_dim": cfg["head_dim"]})
    for name in ("batch_size", "n_kv_heads", "head_dim", "v_head_dim"):
        value = cfg.get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        for smaller in _below(value, 1):
            changed = {**cfg, name: smaller}
            if name == "head_dim" and cfg.get("v_head_dim") == value:   # an MLA mix-up stays one
                changed["v_head_dim"] = smaller
            if name in ("n_kv_heads", "head_dim"):
                changed["layers"] = [{**entry, name: smaller} for entry in layers]
            out.append(changed)
    return [c for c in out if _valid(c)]


def _simpler_paged_configs(cfg: JsonConfig) -> list[JsonConfig]:
    """A paged configuration one dimension smaller (paged/programs.py): fewer groups, a window group as a full
    one, a narrower window, no prefix caching, fewer blocks, smaller blocks. Not max_model_len: a program's
    prompts bound it from below, so most smaller values only turn its admissions into caller errors (runs the
    budget spends on the requests, tokens and blocks instead)."""
    groups = cfg["groups"]
    out: list[JsonConfig] = [{**cfg, "groups": groups[:drop] + groups[drop + 1:]} for drop in range(len(groups))]
    for index, entry in enumerate(groups):
        if isinstance(entry, dict) and entry.get("kind") == "window" and isinstance(entry.get("window"), int):
            out.append({**cfg, "groups": [*groups[:index], {"kind": "full"}, *groups[index + 1:]]})
            out += [{**cfg, "groups": [*groups[:index], {**entry, "window": w}, *groups[index + 1:]]}
                    for w in _below(entry["window"], 1)]
    if cfg.get("prefix_caching") is True:
        out.append({**cfg, "prefix_caching": False})
    for name in ("num_blocks", "block_size"):
        if _is_size(cfg.get(name)):
            out += [{**cfg, name: value} for value in _below(cfg[name], 1)]
    return [c for c in out if isinstance(paged_model.configured(c), paged_model.PagedConfig)]


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _valid(cfg: JsonConfig) -> bool:
    """A configuration the spec accepts: an op config by the op model (either layout: a shrunk config's
    batch never grows), another by the sequence model."""
    if "batch_size" in cfg:
        return isinstance(op_model.make_config(cfg, op_model.CONTIGUOUS), op_model.OpConfig)
    return isinstance(to_model(cfg), model.Config)


def _one_step_shorter(steps: list[Step]) -> Iterator[list[Step]]:
    """The program without one of its steps before the last (the failing one), each in turn."""
    for i in range(len(steps) - 1):
        yield steps[:i] + steps[i + 1:]


def _last_rewind_only(program: list[Step]) -> Optional[list[Step]]:
    """The program without its rewinds but the last one; None when it has no chain to drop."""
    rewinds = [index for index, step in enumerate(program) if step.get("op") == "rewind"]
    if len(rewinds) < 2:
        return None
    return [step for index, step in enumerate(program) if index not in rewinds[:-1]]



BUDGET_HIT = ("shrunk until the shrink budget ran out (the profile's shrink_budget, suite/plan.py): smaller, "
              "but a smaller value of some dimension or a step removed may still show it")


class Shrinking(Accounting):
    """A program's finding (or the consequence of its lenient step): counted, then kept - shrunk
    first, unless its cause is most likely kept."""

    def found(self, finding: Finding, cfg: JsonConfig, program: list[Step], run: RunResult,
              consequence: bool = False) -> None:
        """A program's finding (or the consequence of its lenient step): counted, then kept - shrunk
        first, unless its cause is most likely kept."""
        result = self.result
        result.failing_programs.add(self.program_number)
        result.failing_steps.setdefault(self.program_number, self.planned_program)
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
        # a program that newly fails (--baseline) is its own cause until shrunk: never skipped as a known one
        quick_cause = (self.newly_failing(), *cause(finding, cfg, run.steps))
        group = _group(finding)
        if kept and quick_cause in self.causes_seen:
            self.causes_seen[quick_cause].hits += 1   # most likely a cause already kept: not worth another shrink
            return
        if kept and (crash and len(kept) >= MAX_CRASHES or result.shrinks.get(group, 0) >= MAX_SHRINKS):
            # past the shrink cap a new cause is still kept, as found and marked: no cap hides a cause
            self.causes_seen[quick_cause] = self.keep(finding, cfg, run.steps, UNSHRUNK, shrunk=False)
            return
        if consequence and not crash and self.blame(finding, cfg, run.steps) == "unjudged":
            self.unjudged_past(finding)   # a call outside the scope explains it: nothing to shrink
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

    def fold_padded_causes(self) -> None:
        """No cause is reported whose program, one step shorter, shows another cause kept of its class (any
        rule) at the same failing call: it is that cause through a padded program (a step irrelevant to the
        defect, which only renamed it), and is folded into it (its hits added). Never into another class:
        a wrong finding must not vanish behind a lenient one a shorter program shows. The shrinker cannot
        see this (it keeps the class and rule it shrinks), and a cause found before the one it folds into
        could not be folded when it was kept: so once, at the end of the run, for every kept cause but
        crashes (a crash replays only in a fresh process)."""
        causes = self.result.causes
        for reported in [r for kept in causes.values() for r in kept if r.finding.kind != CRASH]:
            others = [r for kept in causes.values() for r in kept
                      if r is not reported and r.finding.kind == reported.finding.kind]
            last = _op_kind(reported.steps[-1]) if reported.steps else "create"
            into = next((other for shorter in _one_step_shorter(reported.steps)
                         for seen in self.findings_of(reported.config, shorter, reported.new)
                         if seen.steps and _op_kind(seen.steps[-1]) == last   # the same failing call
                         for other in others if other.same_cause(seen)), None)
            if into is None:
                continue
            into.hits += reported.hits
            key = reported.finding.key()
            causes[key].remove(reported)
            if causes[key]:
                self.result.findings[key] = causes[key][0]
            else:
                del causes[key], self.result.findings[key]

    def findings_of(self, cfg: JsonConfig, steps: list[Step], new: bool = False) -> Iterator[Reported]:
        """What a program shows: its lockstep finding, then the consequence of its lenient step (`new`: as the
        findings of a program that newly fails, --baseline)."""
        run = self.run_checked(cfg, steps, fresh=False)
        if run.finding is not None:
            yield Reported(run.finding, cfg, run.steps, new=new)
        if run.consequence is not None:
            yield Reported(run.consequence, cfg, run.consequence_steps, new=new)

    def blame(self, consequence: Finding, cfg: JsonConfig, steps: list[Step]) -> str:
        """Which call explains a consequence: "entry" (its entry step: the program without that step is judged and
        shows no wrong answer or crash), "own" (a wrong answer or a crash the program shows without it: a defect of
        its own, which that program's lockstep reports under its own rule - an unsound rewind after an over-strict
        one is the rewind's finding, not the refusal's) or "unjudged" (without it the program reaches a call outside
        the declared scope: unjudged from there, never a finding - SPEC.md 6.1, that call's meaning is the features
        the target left out). An entry whose removal leaves the same wrong answer at the same call (past the next
        refused or lenient call, which then becomes the entry) explains nothing: the blame moves to that next one,
        down to the last call (a refusal that changed nothing is not charged with the answer of the call after it):
        "later" when that next entry explains it (the run without the first entry reports it, charged there)."""
        moved = False
        while 0 <= consequence.after_index < len(steps):
            without = steps[:consequence.after_index] + steps[consequence.after_index + 1:]
            again = self.run_checked(cfg, without, fresh=consequence.kind == CRASH)
            if again.unjudged:   # a break on a token only the refused entry sent is the entry's, judged or not
                return ("later" if moved else "entry") if UNACCEPTED_TOKEN in consequence.message else "unjudged"
            if again.finding is None:
                break
            if again.finding.kind in (WRONG, CRASH):
                return "own"
            following = again.consequence   # the next entry's: the same break at the same call?
            if following is None or following.safety != consequence.safety or \
                    following.step_index != consequence.step_index - 1:
                break
            consequence, steps, moved = following, again.consequence_steps, True
        return "later" if moved else "entry"

    def caused_by_its_entry(self, consequence: Finding, cfg: JsonConfig, steps: list[Step]) -> bool:
        """A consequence is kept only when its entry explains it (`blame`); one a call outside the declared scope
        explains leaves a skipped note."""
        blamed = self.blame(consequence, cfg, steps)
        if blamed == "unjudged":
            self.unjudged_past(consequence)
        return blamed == "entry"

    def unjudged_past(self, consequence: Finding) -> None:
        self.result.skipped.add(f"consequences: a break past a {consequence.after} step that the program shows "
                                f"without that step too, at a call outside the declared scope, is not charged to "
                                f"it: the program is unjudged from that call")

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

        apart = self.newly_failing() and bool(self.options.known_programs)

        def candidate(c: JsonConfig, p: list[Step]) -> Optional[Finding]:
            tried = self.run_checked(c, p, fresh=crash, consequence=consequence)
            got = tried.finding
            if (got is None or not tried.steps or _op_kind(tried.steps[-1]) != failing_op
                    or _rewind_kind(tried.steps) != rewinds or got.safety != finding.safety):
                return None
            # a newly failing program is shrunk apart from the known causes: never onto one of their programs
            if apart and program_key(c, tried.steps) in self.options.known_programs:
                return None
            # nor a consequence onto a program its entry does not explain (outside the scope without it)
            if consequence and self.blame(got, c, tried.steps) in ("unjudged", "later"):
                return None
            if crash and got.kind == CRASH and _crash_kind(got.message) == _crash_kind(finding.message):
                return replace(got, rule=finding.rule)
            return got

        budget = min(self.plan.shrink_budget, self.options.crash_shrink_budget) if crash else self.plan.shrink_budget
        small_cfg, small, minimal = shrink(cfg, program, finding, candidate, budget=budget)
        if not crash:
            final = self.run_checked(small_cfg, small, fresh=False, consequence=consequence)
            if final.finding is None or final.finding.key() != finding.key():   # flaky: keep the original
                return cfg, run, ""
            return small_cfg, final, "" if minimal else BUDGET_HIT
        # the shrunk crash, alone in a fresh process
        final = self.run_checked(small_cfg, small, fresh=True, consequence=consequence)
        if final.finding is not None and final.finding.kind == CRASH:
            return small_cfg, final, ""
        final = self.run_checked(cfg, program, fresh=True, consequence=consequence)
        if final.finding is not None and final.finding.kind == CRASH:
            return cfg, final, "the shrunk steps do not crash alone; the whole program does, in a fresh process"
        return cfg, run, _ALONE
