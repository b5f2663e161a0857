"""The op-face engine: runs a program on an `update_and_fetch` target and on the op model, in lockstep.

Each step's K and V are *labelled*: every element written for (token uid, layer, batch row, head, dim)
is an exactly representable float32 integer that names all five, and K differs from V (for a target
declaring `lossy=<tol>`, each row a code of small integers naming all but the dim: `Labels`). So what a
query attends is read off the answer exactly, not within a tolerance: for each query i of the step,
each batch row and head, the rows its AttendSpec lets it attend (OP-MASK), then the labels found in
k_hist and v_hist there. That multiset of tokens must be the model's (OP-ATTEND), each row's K and V
must be one token's, written on this layer, for this batch row and head.

Grading is the sequence engine's, on the engine core's call and failure path (../engine.py): a refused
call the spec serves is over-strict, an accepted call the spec refuses is lenient, a wrong answer or an
observation that disagrees is wrong, a target that dies is a crash. After every call the engine observes what the face lets a caller see
(contiguous: used(layer) of every layer; cell: seq_len of every sequence in play and free_cells), so
a refusal that changed state is caught where it happens (OP-ATOMIC), not steps later.

A target whose declared scope leaves out `positions`, `steps` or `declarations` (scope.py) is not
judged on a step whose refusal or effect only those features define: the program ends there unjudged,
and the run says so in its skipped notes.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Optional

import numpy as np

from ... import op_model
from ...rules import RULES
from .. import scope as scopes
from ..configs import JsonConfig, describe
from ..engine import CRASH, LENIENT, NOT_SENT, OVER_STRICT, WRONG, Caller, Drive, Finding, RunResult, Step, Stop
from ..malform import (CLAUSE_PREFIX, DIM, INT, POSITIONS, TENSOR, Case, case_of, config_case, dim_value,
                       int_value, malformed_positions, sendable, sizes_of)
from ..preconditions import broken, not_sent_note
from ..targets import Outcome, Target
from ..wire import Unreadable
from . import pictures
from .answers import Labels, allowed_rows, as_array, mask_kind, refusal_text, row_text, show_args
from .persist import STATE_OPS, state_sent, state_step, take_foreign_state
from .quantize import QUANTIZE, quantize_step
from . import merge
from .merge import MERGE_OPS, merge_step
from .programs import BATCH_FEATURES, BATCH_OPS, MAX_BATCH, batch_value, trim_n, well_formed_step

RULE_WORD = re.compile(r"(?<![A-Z0-9-])[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+(?![A-Z0-9-])")   # a rule id in a text
OP_RULES = frozenset(rule.id for rule in RULES if rule.id.startswith("OP-"))
# The calls the engine makes to observe, not to act: never the entry of a consequence.
OBSERVATIONS = ("used", "seq_len", "free_cells")
# What this process's op engines checked: queries (one per query token, batch row and head of an answer).
# A measure for throughput (docs/upstream-findings.md), read by whoever runs the suite.
CHECKED = {"queries": 0, "answers": 0}
# The words a consequence names K and V of different lengths by (consequences.py): what a refused call left
# behind is charged to it (`OpEngine._recharge`).
KV_LENGTHS = "K and V of different lengths"


# a batch verb -> (the scope feature it needs, its rule, the name of its argument)
_BATCH_VERBS = {op: (BATCH_FEATURES[op], rule, name) for op, rule, name in (
    ("pad", "OP-PAD", "left_padding"), ("repeat", "OP-ROWS", "times"), ("select", "OP-ROWS", "rows"),
    ("reorder", "OP-ROWS", "rows"))}


class OpEngine(Caller):
    """One program on one op-face target; a fresh cache per program."""

    def __init__(self, target: Target, cfg: JsonConfig, kind: str, scope: Optional[scopes.Scope] = None,
                 nested: bool = False, drive: Optional[Drive] = None) -> None:
        super().__init__(target, cfg, scope, drive)
        self.kind, self.nested = kind, nested
        self.program: list[Step] = []
        made = op_model.make_config(cfg, kind)
        self.rejected_config = made if isinstance(made, op_model.Rejected) else None
        self.mcfg = made if isinstance(made, op_model.OpConfig) else \
            op_model.OpConfig(kind, 1, (0,), 1, 1, 1, 1, 1)
        self.relaxed = self.declared_scope().relaxations()   # the scope's relaxations (SPEC.md 6.1)
        if scopes.UNBOUNDED in self.relaxed and kind == op_model.CONTIGUOUS:
            self.mcfg = replace(self.mcfg, bounded=False)
        self.model = op_model.OpModel(self.mcfg)
        # OP-ROWS: repeat grows the batch, so a target with the batch verbs gets labels for MAX_BATCH rows
        self.labels = Labels(replace(self.mcfg, batch_size=max(self.mcfg.batch_size, MAX_BATCH))
                             if {"batch-verbs", merge.MERGE} & self.scope_features() else self.mcfg,
                             self.declared_scope().lossy)
        self.rejudging = False   # a run that re-judges a consequence (`_recharged`): not re-judged again
        self.index = -1
        self.next_uid = 0
        self.refused_at: Optional[int] = None   # the step of the last refused call
        self.refusals: list[int] = []           # the steps of every call the target refused, as the spec does
        self.current: Optional[Step] = None     # the step running, with its concrete arguments
        self.declared: tuple[int, ...] = ()     # the owners of the last accepted begin_step
        # `judged` is the last call that is not an observation; with the last update_and_fetch's positions
        # and token uids: past a lenient or over-strict step, the entry of its consequences (consequences.py)
        self.fetched: Optional[tuple[list[Any], list[int]]] = None
        self.exact_fit_refused = False   # the last valid call refused exactly filled the capacity
        self.before_call: Optional[op_model.OpModel] = None   # the model before the last call it served
        self.written: dict[int, Any] = {}   # uid -> the position it was written at (a served fetch): the pictures' labels
        # OP-STATE (persist.py): the last state saved, and a foreign config's, each its bytes with the model's state
        self.saved: Optional[tuple[bytes, op_model.SavedState]] = None
        self.foreign_state: Optional[tuple[bytes, op_model.SavedState]] = None
        self.quantized_uids: set[int] = set()   # OP-QUANTIZE (quantize.py): the tokens held when it was quantized
        # OP-ROWS' extend and extract (merge.py): what the live cache was sent (replayed on a cache to extend it
        # with), the cache beside it, and what a merge just changed (a finding before its first read is the merge's)
        self.track = merge.Track()
        self.side: Optional[merge.Side] = None
        self.merged: Optional[str] = None

    # --- helpers -----------------------------------------------------------------------------------
    def show(self, args: dict[str, Any]) -> str:
        return show_args(args)

    def declared_scope(self) -> scopes.Scope:
        """The scope the run judges by: the override (--scope), else the target's declaration."""
        return self.scope or self.target.scope

    def scope_features(self) -> frozenset[str]:
        return self.declared_scope().features

    def _create(self, rule: str) -> Outcome:
        """Create the cache. A target declaring `lazy-shapes` gets the config without the sizes it learns
        from its first update (SPEC.md 6.1): what a library's own config holds."""
        if scopes.LAZY_SHAPES not in self.relaxed:
            return super()._create(rule)
        full = self.cfg
        self.cfg = scopes.without_sizes(full)
        try:
            return super()._create(rule)
        finally:
            self.cfg = full

    def _not_owed(self) -> str:
        """Why creating this configuration is not judged under the declared relaxations ('' when it is): an
        invalid config whose fault is only a size a lazy-shapes target never gets, or only the capacity an
        unbounded one may ignore; a valid one outside the scope by its sizes alone, which a lazy-shapes
        target cannot tell at creation (SCOPE-BORDER); under `trusted-args` any invalid config (model code
        creates the cache from a config the library built: OP-CONFIG's refusals are not owed, SPEC.md 6.1) but
        one the user reaches by the keys the scope's `user-config` names (a change of them alone makes it valid)."""
        lazy, unbounded = scopes.LAZY_SHAPES in self.relaxed, scopes.UNBOUNDED in self.relaxed
        if self.rejected_config is not None and scopes.TRUSTED_ARGS in self.relaxed and not self._user_reached():
            return f"invalid configurations not sent: the scope declares '{scopes.TRUSTED_ARGS}'"
        if self.rejected_config is not None and (lazy or unbounded):
            mended = {**self.cfg, **({key: 1 for key in scopes.SIZE_KEYS if key in self.cfg} if lazy else {}),
                      **({"capacity": 1} if unbounded else {})}
            if isinstance(op_model.make_config(mended, self.kind), op_model.OpConfig):
                return (f"config validation of {self.rejected_config.why} not judged: the scope declares "
                        f"{'lazy-shapes' if lazy else 'unbounded'}")
        outside = self.declared_scope().missing(self.cfg)
        if self.rejected_config is None and lazy and outside and outside <= scopes.SIZE_FEATURES:
            return (f"{scopes.BORDER_RULE} of configurations outside the scope by their sizes alone "
                    f"({', '.join(sorted(outside))}) not judged: a lazy-shapes target gets no sizes at creation")
        return ""

    def _user_reached(self) -> bool:
        """Whether the invalid config is one the target's user reaches: a change of the `user-config` keys alone
        makes it valid (a ring window of 4 under make_prompt_cache's keep 4 is max_kv_size=4, a user's flag)."""
        keys = self.declared_scope().user_config
        return bool(keys) and any(isinstance(op_model.make_config(variant, self.kind), op_model.OpConfig)
                                  for variant in scopes.user_variants(self.cfg, keys))

    def _call(self, method: str, args: dict[str, Any], rule: str) -> Outcome:
        outcome = super()._call(method, args, rule)
        if method not in OBSERVATIONS:
            self.judged = (method, args, outcome)
        return outcome

    # --- creation ----------------------------------------------------------------------------------
    def start(self) -> bool:
        """Create the cache; False when the program has nothing more to run (a config refused as it must be,
        or one the declared relaxations do not judge)."""
        not_owed = self._not_owed()
        if not_owed:
            self.result.skipped.add(f"scope: {not_owed}")
            return False
        if self.rejected_config is None:
            take_foreign_state(self)   # OP-STATE: another config's state, before this cache replaces its cache
        created = self._create("OP-CONFIG")
        if self.rejected_config is not None:
            rule = self.rejected_config.rule
            self.result.exercised.add(rule)
            case_rule = {"keep": "OP-SINKS", "chunk": "OP-CHUNK", "record_past": "OP-RECORD"}
            if self.rejected_config.case in case_rule:
                self.result.exercised.add(case_rule[self.rejected_config.case])
            case = config_case("op-" + self.kind, self.cfg)   # the configuration clause it breaks
            if case is not None:   # sent: the clause is broken (coverage counts it, refused or accepted)
                self.result.exercised |= {CLAUSE_PREFIX + case.clause.id, CLAUSE_PREFIX + case.name}
            if created.ok:
                raise self._fail(LENIENT, rule, f"create accepted a config the spec rejects ({rule}: "
                                                f"{self.rejected_config.why}" + (f"; {case.name}" if case else "") + ")",
                                 case.name if case else self.rejected_config.case or self.rejected_config.why)
            return False
        self.outside = (self.scope or self.target.scope).missing(self.cfg)
        if self.outside and not created.ok:
            self.outside = frozenset()
            return False
        if not created.ok:
            raise self._fail(OVER_STRICT, "OP-CONFIG", f"create refused a valid config: {created.error}")
        self.result.created = True
        self.result.exercised.add("OP-CONFIG")
        self.observe("after create", "OP-CONFIG")
        return True

    # --- observations ------------------------------------------------------------------------------
    def observe(self, when: str, rule: str) -> None:
        """What the face lets a caller see must be the model's: used(layer) / seq_len, free_cells."""
        if self.kind == op_model.CONTIGUOUS and scopes.NO_LENGTH in self.relaxed:
            self.result.skipped.add(f"scope: used(layer) not observed: the scope declares '{scopes.NO_LENGTH}' "
                                    "(judged by the answers)")
            return
        if self.kind == op_model.CONTIGUOUS:
            for layer in range(self.mcfg.n_layers):
                got = self._call("used", {"layer_id": layer}, rule)
                want = self.model.used(layer)
                if not got.ok or not _is_count(got.value) or got.value != want:
                    raise self._fail(WRONG, rule, f"{when}: used({layer}) is "
                                                  f"{got.value if got.ok else got.error!r}, the model holds {want}")
            return
        for seq in self.model.seqs_in_play():
            got = self._call("seq_len", {"seq": seq}, rule)
            want = self.model.seq_len(seq)
            if not got.ok or not _is_count(got.value) or got.value != want:
                raise self._fail(WRONG, rule, f"{when}: seq_len({seq}) is {got.value if got.ok else got.error!r}, "
                                              f"sequence {seq} holds {want} tokens")
        got = self._call("free_cells", {}, rule)
        want = self.model.free_cells()
        if not got.ok or not _is_count(got.value) or got.value != want:
            raise self._fail(WRONG, rule, f"{when}: free_cells() is {got.value if got.ok else got.error!r}, "
                                          f"{want} cells are free")

    # --- the program -------------------------------------------------------------------------------
    def run(self, program: list[Step]) -> RunResult:
        program = list(sendable(program, self.relaxed))   # the suite's own programs come filtered already
        # batch verbs a target without their feature is never sent leave the program up front, not only when reached:
        # the drive past a finding and the blame's reruns then see the same program (step indexes agree)
        program = [step for step in program if step.get("op") not in BATCH_OPS or self._batch_verb_sent(step["op"])]
        program = [step for step in program if step.get("op") != QUANTIZE or self._quantize_sent()]   # alike
        program = [step for step in program if step.get("op") not in MERGE_OPS or merge.sent(self)]   # alike
        program = [step for step in program if step.get("op") not in STATE_OPS or state_sent(self)]   # alike
        self.program = program
        try:
            if self.start():
                self.index = 0
                while self.index < len(program):
                    concrete = self.run_step(program[self.index])
                    if concrete is None:   # a step outside the declared scope: the rest is not judged
                        self.result.unjudged = f"step {self.index}"
                        break
                    if concrete is NOT_SENT:   # a verb of a feature outside the scope (trim): left out of the
                        del program[self.index]   # program itself, so a step index is its place in what was sent
                        continue
                    self.result.steps.append(concrete)
                    self.index += 1
        except _Unjudged:
            self.result.unjudged = f"step {self.index}"
        except Stop as stop:
            entry = stop.finding
            if self.current is not None and entry.step_index == len(self.result.steps):
                self.result.steps.append(self.current)   # the failing step, concrete
            # the drive first: _after_refusal's second run creates the target's cache afresh
            # the consequences' record has no batch rows that differ: a program whose batch verbs the target is sent
            # is not driven past its finding (a target without the features is sent none: its drive leaves them out)
            batch = bool({"pad", "select", "batch-verbs"} & self.scope_features()) and \
                any(step.get("op") in BATCH_OPS for step in program)
            if batch and entry.kind in (LENIENT, OVER_STRICT):
                self.result.skipped.add("consequences: a program with batch verbs is not driven past its finding")
            quantized = any(step.get("op") == QUANTIZE for step in program)   # the record reads labels exactly
            if quantized and entry.kind in (LENIENT, OVER_STRICT):
                self.result.skipped.add("consequences: a program with quantize is not driven past its finding")
            merged = any(step.get("op") in MERGE_OPS for step in program)   # a second cache the record has not
            if merged and entry.kind in (LENIENT, OVER_STRICT):
                self.result.skipped.add("consequences: a program with extend or extract is not driven past its finding")
            batch = batch or quantized or merged
            if entry.kind in (LENIENT, OVER_STRICT) and entry.step_index >= 0 and not self.nested \
                    and not self.outside and entry.step_index == len(self.result.steps) - 1 and not batch:
                self.drive_on(program, entry)
                self._recharge(program, entry)
            self.result.finding = merge.charged(self, self._after_refusal(self.capacity_refusal(entry)))
        if self.outside:
            self.result.finding = self.border_finding(self.result.finding, len(program))
        return self.result

    # --- charging a consequence to the step that causes it -------------------------------------------
    def _recharge(self, program: list[Step], entry: Finding) -> None:
        """A consequence past `entry` (the drive's) is charged to the step that causes it, not to the entry
        by default: K and V of different lengths that a refused call before the entry left are that call's
        (wrong OP-ATOMIC), and a break that goes away once every later malformed step is made well-formed
        is the later step's (the rerun without the entry reports it, past that step). Each is judged on the
        program up to the consequence's step."""
        consequence = self.result.consequence
        if consequence is None or self.rejudging:
            return
        upto = program[:consequence.step_index + 1]
        if KV_LENGTHS in consequence.message:
            for refused in reversed([r for r in self.refusals if r < entry.step_index]):
                again = self._rejudge(upto[:refused] + upto[refused + 1:], entry.step_index - 1)
                if again is None or KV_LENGTHS not in again.message or again.step_index != consequence.step_index - 1:
                    self.result.consequence = Finding(
                        WRONG, "OP-ATOMIC", f"the refused call of step {refused} left K and V of different lengths, "
                        f"seen past the {entry.kind} {entry.rule} step {entry.step_index}: {consequence.message}",
                        consequence.step_index)
                    return
        rest = upto[entry.step_index + 1:]
        mended = [well_formed_step(step, self.mcfg.n_layers) for step in rest]
        if mended == rest:
            return
        again = self._rejudge(upto[:entry.step_index + 1] + [step for step in mended if step is not None],
                              entry.step_index)
        if again is not None and (again.rule, again.safety) == (consequence.rule, consequence.safety):
            return
        self.result.skipped.add(f"consequences past a {consequence.after} step: a break that goes away once every "
                                f"later malformed step is made well-formed is not charged to it (the later step's "
                                f"own run reports it)")
        self.result.consequence, self.result.consequence_steps = None, []

    def _rejudge(self, program: list[Step], entry_index: int) -> Optional[Finding]:
        """The consequence of `program` past its step `entry_index` (a second run, on a fresh cache, that
        charges nothing further); None when that step is no lenient or over-strict entry there, or nothing
        past it breaks."""
        engine = OpEngine(self.target, self.cfg, self.kind, self.scope, drive=self.drive)
        engine.rejudging = True
        again = engine.run(program)
        self.result.calls += again.calls
        if again.finding is None or again.finding.step_index != entry_index:
            return None
        return again.consequence

    def _after_refusal(self, finding: Finding) -> Finding:
        """OP-ATOMIC: a finding on a call served after refused ones is the refusals' doing when the same program
        without them is served as the spec says (a second run, on a fresh cache): without the last refused step,
        else without every refused step before the finding (two refusals may each have changed the cache)."""
        refused = self.refused_at
        if refused is None or self.nested or finding.kind not in (WRONG, OVER_STRICT) or \
                finding.step_index <= refused:
            return finding
        earlier = [index for index in self.refusals if index < finding.step_index]
        for removed in ([refused],) + ((earlier,) if len(earlier) > 1 else ()):
            if self._served_without(set(removed), finding.step_index):
                which = f"call of step {removed[0]}" if len(removed) == 1 else \
                    f"calls of steps {', '.join(map(str, removed))}"
                return Finding(finding.kind, "OP-ATOMIC", f"{finding.message} - and without the refused {which} "
                                                          "this call is served as the spec says: that refusal "
                                                          "changed the cache", finding.step_index)
        return finding

    def _served_without(self, removed: set[int], end: int) -> bool:
        """Whether the program up to step `end`, without the refused steps `removed`, is served as the spec says,
        with the same calls after the first of them (positions and token numbers, as `fetch` keeps them: a refused
        call uses up none) - evidence that the refusals changed state."""
        without = [step for index, step in enumerate(self.program[:end + 1]) if index not in removed]
        again = OpEngine(self.target, self.cfg, self.kind, self.scope, nested=True).run(without)
        self.result.calls += again.calls
        if again.finding is not None:
            return False
        first = min(removed)
        after = [_sent(step) for index, step in enumerate(self.result.steps[:end + 1])
                 if index > first and index not in removed]
        return after == [_sent(step) for step in again.steps[first:]]

    def border_finding(self, finding: Optional[Finding], end: int) -> Finding:
        head = (f"create({describe(self.cfg)}) needs {', '.join(sorted(self.outside))}, outside the declared scope, "
                f"and the target accepted it")
        if finding is None:
            return Finding(LENIENT, scopes.BORDER_RULE, f"{head}; it answered as the spec on {end} steps", end)
        if finding.kind == CRASH:
            return Finding(CRASH, scopes.BORDER_RULE, f"{head}, then: {finding.message}", finding.step_index)
        return Finding(WRONG, scopes.BORDER_RULE, f"{head}, and serves it another way: {finding.kind} "
                                                  f"{finding.rule}: {finding.message}", finding.step_index)

    def _excused(self, feature: str, what: str) -> bool:
        if feature and feature not in self.scope_features():
            self.result.skipped.add(f"scope: programs past {what} not judged: the target's scope leaves out "
                                    f"{feature!r} ({scopes.OP_FEATURES[feature]})")
            return True
        return False

    def run_step(self, step: Step) -> Optional[Step]:
        op = step["op"]
        self.current = dict(step)
        case = case_of(step)   # a malformed value written in the step (an id, an int, a list) is always one
        self.malformed = case if case is not None and case.clause.kind not in (DIM, TENSOR, POSITIONS) else None
        if op == "fetch":
            return self.fetch(step)
        if op == "reset":
            self.model.reset()
            self.track.reset()
            self._accepted("reset", {}, "OP-STEP")
            return dict(step)
        if op == "trim":
            return self.trim(step)
        if op in BATCH_OPS:
            return self.batch_verb(step)
        if op in STATE_OPS:
            return state_step(self, step)
        if op == QUANTIZE:
            return quantize_step(self, step)
        if op in MERGE_OPS:
            return merge_step(self, step)
        verdicts = {"begin": ("begin_step", {"seq_ids": step.get("seqs")}, "OP-STEP"),
                    "cp": ("seq_cp", {"src": step.get("src"), "dst": step.get("dst"), "upto": step.get("upto")},
                           "OP-FORK"),
                    "rm": ("seq_rm", {"seq": step.get("seq"), "p0": step.get("p0"), "p1": step.get("p1")}, "OP-RM")}
        method, args, rule = verdicts[op]
        required = self.declared_scope().requires   # a documented precondition the call breaks: not sent (SPEC.md 6.1)
        kept_back = broken(required, method, args, self.model.held) if self.mcfg.kind == op_model.CELL else None
        if kept_back is not None:
            self.result.skipped.add(not_sent_note(kept_back))
            return NOT_SENT
        before = self.model.abandoned
        self.before_call = self.model.snapshot()
        if op == "begin":
            rejected = self.model.begin_step(args["seq_ids"])
            if rejected is None:
                self.declared = tuple(args["seq_ids"] or ())
        elif op == "cp":
            rejected = self.model.seq_cp(args["src"], args["dst"], args["upto"])
        else:
            rejected = self.model.seq_rm(args["seq"], args["p0"], args["p1"])
        if rejected is not None:
            self._refused(method, args, rejected, dict(step))
            return dict(step)
        self._accepted(method, args, "OP-STEP" if self.model.abandoned != before else rule)
        return dict(step)

    def _accepted(self, method: str, args: dict[str, Any], rule: str) -> None:
        """A call the spec serves: the target must serve it, then its observations must be the model's."""
        got = self._call(method, args, rule)
        if not got.ok or got.value is False:
            self._over_strict(method, args, rule, got)
        self.observe(f"after {method}({show_args(args)})", rule)

    def _over_strict(self, method: str, args: dict[str, Any], rule: str, got: Outcome) -> None:
        raise self._fail(OVER_STRICT, self.refused_by(method, args, rule, got),
                         f"{method}({show_args(args)}) refused a call the spec serves: {got.error}")

    def refused_by(self, method: str, args: dict[str, Any], rule: str, got: Outcome) -> str:
        """The rule a refusal of a valid call is classed by (docs/conformance.md, op-face targets): the OP- rule its error names, else
        the call's own. A call that exactly fills the capacity (the model has applied it) may be OP-CAP's
        refusal: `capacity_refusal` decides, once the drive past it is done."""
        named: Optional[str] = next((str(word) for word in RULE_WORD.findall(str(got.error or ""))
                                     if word in OP_RULES), None)
        model = self.model
        if method == "begin_step" and isinstance(args["seq_ids"], list):
            exact = len(args["seq_ids"]) == model.free_cells()
        elif method == "update_and_fetch" and type(args["layer_id"]) is int:
            exact = model.used(args["layer_id"]) == self.mcfg.capacity if self.kind == op_model.CONTIGUOUS \
                else model.free_cells() == 0
        else:
            exact = False
        self.exact_fit_refused = named is None and exact
        return named or rule

    def capacity_refusal(self, entry: Finding) -> Finding:
        """An exact fit refused is OP-CAP's refusal when the same steps, on the same config with one cell more,
        are served as the spec says (a second run, on a fresh cache: after the drive, which needs this one)."""
        if not self.exact_fit_refused or self.nested or entry.kind != OVER_STRICT:
            return entry
        roomier = {**self.cfg, "capacity": self.mcfg.capacity + 1}
        again = OpEngine(self.target, roomier, self.kind, self.scope, nested=True).run(list(self.result.steps))
        self.result.calls += again.calls
        if again.finding is not None:
            return entry
        consequence = self.result.consequence
        if consequence is not None:   # its words name the entry: the entry's class and rule
            old, new = f"{entry.kind} {entry.rule}", f"{entry.kind} OP-CAP"
            self.result.consequence = replace(consequence, after=consequence.after.replace(old, new, 1),
                                              message=consequence.message.replace(old, new, 1))
        return replace(entry, rule="OP-CAP", message=entry.message + " - served with one cell more: the "
                                                                     "refusal is the capacity's")

    def _refused(self, method: str, args: dict[str, Any], rejected: op_model.Rejected, concrete: Step) -> None:
        """A call the spec refuses: the target must refuse it and change nothing."""
        concrete["case"] = _case(rejected)
        self.current = concrete
        # a refusal only a feature outside the scope defines: the target's own semantics take over here,
        # and the model cannot follow them, so the rest of the program is not judged (accepted or refused)
        if self._excused(rejected.feature, f"a refusal only the {rejected.feature!r} feature defines"):
            raise _Unjudged()
        got = self._call(method, args, rejected.rule)
        if got.ok and got.value is not False:
            raise self._fail(LENIENT, rejected.rule, f"{method}({show_args(args)}) accepted a call the spec refuses "
                                                     f"({rejected.rule}: {rejected.why})")
        self.refused_at = self.index
        self.refusals.append(self.index)
        # what the target found wrong, in its words: an OP-ATOMIC finding's cause is the target's reason
        # to refuse (the V width it could not take), which need not be the spec's (a re-placed position)
        concrete["refused_with"] = refusal_text(got.error)
        self.result.exercised.add("OP-ATOMIC")
        self.observe(f"after the refused {method}({show_args(args)}) (the target: {concrete['refused_with']})",
                     "OP-ATOMIC")

    def trim(self, step: Step) -> Optional[Step]:
        """trim(n) (OP-TRIM), sent only to a target whose scope has the `trim` feature: for another the
        step is left out of the program (it means nothing to that target), said in the skipped notes."""
        if "trim" not in self.scope_features() or self.kind != op_model.CONTIGUOUS:
            self.result.skipped.add(f"scope: trim steps not sent: the target's scope leaves out 'trim' "
                                    f"({scopes.OP_FEATURES['trim']})")
            return NOT_SENT
        pending = self.model.step
        if pending is not None and pending.served and self._excused("steps", "a trim in the middle of a step"):
            return None   # a cache of per-layer histories has no step to abandon: its layers differ here
        case = case_of(step)
        held = len(self.model.held.get(0, {}))
        n = trim_n(step, held)   # a well-formed draw's n, at most what is held
        if case is not None and case.clause.call == "trim":   # a malformed n, resolved against the tokens held
            n = int_value(case.clause, case.variant, above=held + 1)
        args = {"n": n}
        concrete: Step = {**{key: value for key, value in step.items() if key != "most"}, "n": n}
        self.current = concrete
        before = self.model.abandoned
        self.before_call = self.model.snapshot()
        owed = self.model.trim_owed(n)
        rejected = self.model.trim(n)   # refused only for its n: what a ring may have dropped makes it optional
        if rejected is not None and scopes.TRUSTED_ARGS in self.relaxed:   # an n no model code passes: not sent
            self.result.skipped.add("scope: trims of an n outside [0, held] not sent: the target's scope declares "
                                    f"'{scopes.TRUSTED_ARGS}'")
            return NOT_SENT
        if rejected is not None:
            self._refused("trim", args, rejected, concrete)
            return concrete
        if self.model.abandoned != before and self._excused("steps", "a step abandoned partway"):
            return None
        if not owed:   # the target's choice (a ring may have dropped rows): the lockstep follows what it did
            return self._optional_trim(args, concrete)
        recorded = self._owed_by_recording()
        self._accepted("trim", args, "OP-STEP" if self.model.abandoned != before else
                       "OP-RECORD" if recorded else "OP-TRIM")
        self.track.trimmed(n)
        self.result.exercised.add("OP-TRIM")
        if recorded:
            self.result.exercised.add("OP-RECORD")
        return concrete

    def _batch_verb_sent(self, op: str) -> bool:
        """Whether a batch verb goes to this target: only with its feature in the scope (a skipped note if not)."""
        feature = _BATCH_VERBS.get(op, _BATCH_VERBS["select"])[0]
        if feature in self.scope_features() and self.kind == op_model.CONTIGUOUS:
            return True
        self.result.skipped.add(f"scope: {op} steps not sent: the target's scope leaves out '{feature}' "
                                f"({scopes.OP_FEATURES[feature]})")
        return False

    def _quantize_sent(self) -> bool:
        """Whether quantize goes to this target (OP-QUANTIZE): a contiguous one with the feature (a skipped note if
        not), not declaring `lossy=<tol>` (its rows are read within its own tolerance already)."""
        if "quantize" in self.scope_features() and self.kind == op_model.CONTIGUOUS and \
                self.declared_scope().lossy is None:
            return True
        self.result.skipped.add("scope: quantize steps not sent: the target's scope leaves out 'quantize' "
                                f"({scopes.OP_FEATURES['quantize']}), or it declares '{scopes.LOSSY}'")
        return False

    def after_quantize(self, rule: str, missing: Any = ()) -> str:
        """OP-QUANTIZE: a row not one token's once the cache is quantized, or a token missing that it held when it
        was quantized, is the conversion's; else `rule`."""
        if self.model.bits is None:
            return rule
        return "OP-QUANTIZE" if missing is None or set(missing) & self.quantized_uids else rule

    def batch_verb(self, step: Step) -> Optional[Step]:
        """pad (OP-PAD) and select, reorder, repeat (OP-ROWS), sent only to a target whose scope has the `pad` /
        `select` / `batch-verbs` feature: for another the step is left out of the program, said in the skipped notes."""
        op = step["op"]
        feature, rule, name = _BATCH_VERBS.get(op, _BATCH_VERBS["select"])
        if not self._batch_verb_sent(op):
            return NOT_SENT
        pending = self.model.step
        if pending is not None and pending.served and self._excused("steps", f"a {op} in the middle of a step"):
            return None
        args = {name: batch_value(self.cfg, step, self.mcfg.batch_size)}
        concrete: Step = {**step, name: args[name]}
        self.current = concrete
        before = self.model.abandoned
        self.before_call = self.model.snapshot()
        rejected = getattr(self.model, op)(args[name])
        if rejected is not None and rejected.case != "not empty" and scopes.TRUSTED_ARGS in self.relaxed:
            self.result.skipped.add(f"scope: {op} steps with a malformed argument not sent: the target's scope "
                                    f"declares '{scopes.TRUSTED_ARGS}'")
            return NOT_SENT
        if rejected is not None:
            self._refused(op, args, rejected, concrete)
            return concrete
        if self.model.cfg.batch_size > MAX_BATCH:   # past what the labels name: not judged (a stated bound)
            self.model = self.before_call
            self.result.skipped.add(f"harness: programs past a batch of more than {MAX_BATCH} rows not judged")
            return None
        self.mcfg = self.model.cfg   # select and repeat change the batch's size
        self._accepted(op, args, "OP-STEP" if self.model.abandoned != before else rule)
        self.result.exercised.add(rule)
        return concrete

    def _owed_by_recording(self) -> bool:
        """OP-RECORD: the trim just judged owed is so only because the config records its past: before it, a ring
        of the least size that did not record may have dropped a row (its floor above its sinks)."""
        before, cfg = self.before_call, self.mcfg
        return before is not None and cfg.record_past and any(
            cfg.windows[layer] and floor > cfg.keep(layer) for layer, floor in enumerate(before.unrecorded))

    def _optional_trim(self, args: dict[str, Any], concrete: Step) -> Step:
        """OP-TRIM: a trim after a ring layer may have dropped rows, the target's choice. Served, the model has
        applied it and every later answer is judged by its rows (a cache that lost a row the next query attends
        answers wrong there); refused, the model goes back to the state before it, and the target must have
        changed nothing (OP-ATOMIC)."""
        got = self._call("trim", args, "OP-TRIM")
        self.result.exercised.add("OP-TRIM")
        if got.ok and got.value is not False:
            self.observe(f"after trim({show_args(args)})", "OP-TRIM")
            self.track.trimmed(args["n"])
            return concrete
        assert self.before_call is not None
        self.model = self.before_call.snapshot()
        concrete["refused_with"] = refusal_text(got.error)
        self.refused_at = self.index
        self.refusals.append(self.index)
        self.result.exercised.add("OP-ATOMIC")
        self.observe(f"after the refused trim({show_args(args)}) (optional: the target: {concrete['refused_with']})",
                     "OP-ATOMIC")
        return concrete

    # --- update_and_fetch --------------------------------------------------------------------------
    def _positions(self, step: Step) -> list[Any]:
        if "positions" in step:
            return list(step["positions"])
        model, layer = self.model, step.get("layer")
        pending = model.step
        if self.kind == op_model.CONTIGUOUS:
            if pending is not None and pending.positions is not None and layer not in pending.served \
                    and len(pending.positions) == step.get("n", 1):
                return list(pending.positions)
            held = len(model.held.get(0, {}))
            return list(range(held, held + int(step.get("n", 1))))
        if pending is not None and pending.positions is not None:
            return list(pending.positions)
        # the open declaration's owners; with none open (dropped by a verb), the last one's: the step then
        # means what a target that kept the declaration would serve
        seqs = pending.seqs if pending is not None else self.declared
        if not seqs:
            return list(range(int(step.get("n", 1))))
        newest = {seq: max(model.held.get(seq, {}).values(), default=-1) for seq in set(seqs)}
        out = []
        for seq in seqs:
            newest[seq] += 1
            out.append(newest[seq])
        return out

    def fetch(self, step: Step) -> Optional[Step]:
        layer = step.get("layer")
        case = case_of(step)
        positions = self._positions(step)
        if case is not None and case.clause.kind == POSITIONS and "positions" not in step:   # else they are concrete
            broken = malformed_positions(case.variant, positions + [positions[-1] + 1] if positions else [0, 1],
                                         self._newest_held())
            positions = broken if broken is not None else positions
            self.malformed = case if broken is not None else None
        elif case is not None and case.clause.kind == POSITIONS:
            self.malformed = case
        elif case is not None and case.clause.kind == INT:   # OP-MAX-WRITE: the step's length (a shrunk one may fit)
            bound = self.mcfg.max_write
            self.malformed = case if bound is not None and len(positions) > bound else None
        if case is not None and case.q_len != 1:   # the length it was sent at (a shrunk step is shorter)
            case = replace(case, q_len=len(positions))
        concrete: Step = {"op": "fetch", "layer": layer, "positions": positions, **(case.tag() if case else {})}
        self.current = concrete
        pending = self.model.step
        q = len(positions)
        continuing = pending is not None and pending.positions is not None and layer not in pending.served and \
            (self.kind == op_model.CELL or len(pending.uids) == q)
        shapes = self.shapes(q, case)
        first_uid = self.next_uid
        uids = list(pending.uids) if continuing and pending is not None else \
            self.fresh_uids(max([q] + [s[-2] for s in (shapes.k, shapes.v) if len(s) >= 2]))
        args, shapes = self.arguments(layer, positions, uids, case)
        self.fetched = (list(positions), uids[:q])
        before = self.model.abandoned
        self.before_call = self.model.snapshot()
        verdict = self.model.fetch(layer, shapes, positions, uids[:q])
        if isinstance(verdict, op_model.Rejected):
            self._refused("update_and_fetch", args, verdict, concrete)
            # refused (a call the target served is a lenient entry: its tokens are written): it uses up no token
            # number, so the program without it labels every later token alike, and a run without it
            # (OP-ATOMIC, `_after_refusal`) sends exactly the same calls after it
            self.next_uid = first_uid
            return concrete
        if self.model.abandoned != before and self._excused("steps", "a step abandoned partway"):
            return None
        self.written.update(zip(uids[:q], positions))
        got = self._call("update_and_fetch", args, "OP-ATTEND")
        if not got.ok and self._window_step(layer, q):
            return None   # the target's declared bound: the rest of the program is not judged
        if not got.ok:
            self._over_strict("update_and_fetch", args, "OP-ATTEND", got)
        assert type(layer) is int   # the model served it (OP-ARGS)
        self.check_answer(got.value, layer, verdict)
        self.observe(f"after update_and_fetch(layer {layer}, positions {positions})", "OP-STEP")
        self.track.fetched(layer, positions, continuing, self.model.step is None)
        self.merged = None   # the first read past a merge served as the spec says
        return concrete

    def _window_step(self, layer: Any, q: int) -> bool:
        """Whether a refused step is one the scope's `window-steps` lets the target refuse (SPEC.md 6.1, SCOPE-WINDOW-STEPS): longer
        than the window of the ring layer it is sent to. The step then stands served on some layers and refused on
        this one, which the spec does not describe, so the program is judged no further (a note says so)."""
        window = self.mcfg.windows[layer] if type(layer) is int and 0 <= layer < self.mcfg.n_layers else 0
        if scopes.WINDOW_STEPS not in self.relaxed or not window or q <= window:
            return False
        self.result.skipped.add(f"scope: programs past a step longer than a ring layer's window, refused there, "
                                f"not judged: the scope declares '{scopes.WINDOW_STEPS}'")
        return True

    def _newest_held(self) -> int:
        """The newest position the step's (first) sequence holds: a contiguous cache's last row."""
        if self.kind == op_model.CONTIGUOUS:
            return len(self.model.held.get(0, {})) - 1
        pending = self.model.step
        seqs = pending.seqs if pending is not None else self.declared
        return max(self.model.held.get(seqs[0], {}).values(), default=-1) if seqs else -1

    def fresh_uids(self, width: int) -> list[int]:
        """Token numbers for a step of `width` token rows that begins here."""
        self.next_uid += width
        return list(range(self.next_uid - width, self.next_uid))

    def shapes(self, q: int, case: Optional[Case]) -> op_model.Shapes:
        """The shapes (and element kinds) of a step of q tokens, malformed as a DIM or TENSOR case says;
        `self.malformed` is the case when it is a malformation in this config."""
        cfg = self.mcfg
        dims = {"k": [cfg.batch_size, cfg.n_kv_heads, q, cfg.head_dim],
                "v": [cfg.batch_size, cfg.n_kv_heads, q, cfg.v_head_dim], "position": [q, 1]}
        kinds = {"k": "f", "v": "f", "position": "i"}
        if case is not None and case.clause.kind in (DIM, TENSOR):
            sizes = sizes_of({"batch_size": cfg.batch_size, "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
                              "v_head_dim": cfg.v_head_dim}, q)
            clause, broken = case.clause, False
            if clause.kind == DIM:
                value = dim_value(clause, case.variant, sizes)
                if value is not None:
                    if clause.argument == "k, v, position":   # q_len on every argument's token axis
                        dims["k"][2] = dims["v"][2] = dims["position"][0] = value
                    elif clause.argument == "k, v":   # k and v agree, not with position or the config
                        dims["k"][clause.axis] = dims["v"][clause.axis] = value
                    else:
                        dims[clause.argument][clause.axis] = value
                    broken = True
            elif case.variant == "dtype":
                kinds[clause.argument] = "f" if clause.argument == "position" else "i"
                broken = True
            elif case.variant == "rank":   # k, v without the batch dimension; position [q_len]
                dims[clause.argument] = dims[clause.argument][1:] if clause.argument != "position" else [q]
                broken = True
            self.malformed = case if broken else None
        return op_model.Shapes(tuple(dims["k"]), tuple(dims["v"]), tuple(dims["position"]),
                               (kinds["k"], kinds["v"], kinds["position"]))

    def arguments(self, layer: Any, positions: list[Any], uids: list[int],
                  case: Optional[Case]) -> tuple[dict[str, Any], op_model.Shapes]:
        """update_and_fetch's arguments for the step's tokens `uids` at `positions`: K and V labelled
        (uid -1 pads a row past them), malformed as the case says; and their shapes, for the model."""
        cfg = self.mcfg
        q = len(positions)
        shapes = self.shapes(q, case)
        layer_label = layer if type(layer) is int and 0 <= layer < cfg.n_layers else cfg.n_layers
        tensors = {}
        for name, shape, is_v in (("k", shapes.k, 0), ("v", shapes.v, 1)):
            full = shape if len(shape) == 4 else (1,) + shape   # a rank case drops the batch dimension
            values = self.labels.array(uids, layer_label, full, is_v)
            tensors[name] = values if len(shape) == 4 else values[0]
        pos_values = [p if type(p) is int else 0 for p in positions]
        rows = shapes.position[0] if shapes.position else 0
        column = np.array([pos_values[i] if i < q else max(pos_values, default=-1) + 1 + i - q for i in range(rows)],
                          dtype=np.int64)
        position = np.repeat(column.reshape(-1, 1), shapes.position[1], axis=1) if len(shapes.position) == 2 \
            else column
        kinds = shapes.kinds
        if kinds[0] != "f":
            tensors["k"] = tensors["k"].astype(np.int32)
        if kinds[1] != "f":
            tensors["v"] = tensors["v"].astype(np.int32)
        if kinds[2] != "i":
            position = position.astype(np.float32)
        return {"layer_id": layer, "k": tensors["k"], "v": tensors["v"], "position": position}, shapes

    def check_answer(self, value: Any, layer: int, attends: list[list[int]]) -> None:
        """OP-HIST, OP-MASK, OP-ATTEND on one update_and_fetch answer."""
        cfg = self.mcfg
        if isinstance(value, Unreadable):   # a served Python target's answer that had no wire form
            raise self._fail(WRONG, "OP-HIST", f"update_and_fetch answered what has no wire form: {value.why}")
        try:
            k_value, v_value, spec = value
        except (TypeError, ValueError):
            raise self._fail(WRONG, "OP-HIST", f"update_and_fetch answered {type(value).__name__}, "
                                               "not (k_hist, v_hist, spec)") from None
        k_hist, v_hist = as_array(k_value), as_array(v_value)
        q = len(attends)
        rows = k_hist.shape[2] if k_hist.ndim == 4 else -1
        want_k = (cfg.batch_size, cfg.n_kv_heads, rows, cfg.head_dim)
        want_v = (cfg.batch_size, cfg.n_kv_heads, rows, cfg.v_head_dim)
        if k_hist.shape != want_k or v_hist.shape != want_v or k_hist.dtype != np.float32 or \
                v_hist.dtype != np.float32:
            raise self._fail(WRONG, "OP-HIST", f"k_hist {list(k_hist.shape)} {k_hist.dtype}, v_hist "
                                               f"{list(v_hist.shape)} {v_hist.dtype}: not [B, Hkv, rows, D] / "
                                               f"[B, Hkv, rows, Dv] float32 = {list(want_k)} / {list(want_v)}")
        self.result.exercised.add("OP-HIST")
        allowed = allowed_rows(spec, q, rows, cfg.batch_size)
        if isinstance(allowed, str):
            raise self._fail(WRONG, "OP-MASK", allowed)
        self.result.exercised.add("OP-MASK")
        model = self.model
        if any(model.pads) or model.rows_moved:   # rows of the batch differ (OP-PAD, OP-ROWS)
            self._check_rows(k_hist, v_hist, layer, attends, allowed)
        elif allowed.ndim == 3 and not (allowed == allowed[:1]).all():
            raise self._fail(WRONG, "OP-ATTEND", "the batch rows' masks differ, but no row has pads and no row moved")
        else:
            self._check_shared(k_hist, v_hist, layer, attends, allowed[0] if allowed.ndim == 3 else allowed)
        self.result.exercised.add("OP-ATTEND")
        if cfg.keep(layer):
            self.result.exercised.add("OP-SINKS")
        if cfg.chunk(layer):
            self.result.exercised.add("OP-CHUNK")
        CHECKED["queries"] += q * cfg.batch_size * cfg.n_kv_heads
        CHECKED["answers"] += 1
        if cfg.batch_size > 1:
            self.result.exercised.add("OP-BATCH")   # batch rows kept apart

    def _check_rows(self, k_hist: np.ndarray, v_hist: np.ndarray, layer: int, attends: list[list[int]],
                    allowed: np.ndarray) -> None:
        """OP-PAD, OP-ROWS: each batch row's queries attend the tokens its own history holds - each labelled with
        the batch row it was written for - and none of its pads; a pad query is not judged."""
        cfg, model = self.mcfg, self.model
        assert self.fetched is not None
        want_rows = model.row_attends(attends, self.fetched[0])
        held = {**model.held.get(0, {}), **self.written}
        for b in range(cfg.batch_size):
            for h in range(cfg.n_kv_heads):
                k_labels = self.labels.labels_of(k_hist[b, h], layer, h, 0)
                v_labels = self.labels.labels_of(v_hist[b, h], layer, h, 1)
                for i, want in enumerate(want_rows[b]):
                    if want is None:
                        continue
                    seen = np.flatnonzero(allowed[b, i] if allowed.ndim == 3 else allowed[i])
                    if any(k_labels[row] is None or v_labels[row] != k_labels[row] for row in seen):
                        raise self._fail(WRONG, "OP-ATTEND", f"query {i} (batch {b}, head {h}) attends a row whose K "
                                                             "and V are not one token's, written on layer "
                                                             f"{layer}", "a row not one token's")
                    got = sorted(label for label in (k_labels[row] for row in seen) if label is not None)
                    if got != sorted(want):
                        padded = [label for label in got if label not in want and
                                  held.get(label[0], model.pads[b]) < model.pads[b]]
                        rule = "OP-PAD" if padded else "OP-ROWS" if model.rows_moved else "OP-ATTEND"
                        raise self._fail(WRONG, rule, f"query {i} (batch {b}, head {h}) attends {got}, the spec says "
                                                      f"{sorted(want)} ((token, batch row it was written for))",
                                         "a pad attended" if padded else "a row's history not its own")
        self.result.exercised.add("OP-PAD" if any(model.pads) else "OP-ROWS")

    def _check_shared(self, k_hist: np.ndarray, v_hist: np.ndarray, layer: int, attends: list[list[int]],
                      allowed: np.ndarray) -> None:
        """OP-ATTEND: every batch row's queries attend the tokens written for that row, the same for every row."""
        cfg = self.mcfg
        q = len(attends)
        for b in range(cfg.batch_size):
            for h in range(cfg.n_kv_heads):
                k_uids = self.labels.uid_of(k_hist[b, h], layer, b, h, 0)
                v_uids = self.labels.uid_of(v_hist[b, h], layer, b, h, 1)
                for i in range(q):
                    seen = np.flatnonzero(allowed[i])
                    for row in seen:
                        if k_uids[row] < 0 or v_uids[row] != k_uids[row]:
                            raise self._pictured(self._fail(
                                WRONG, self.after_quantize("OP-ATTEND", None),
                                f"query {i} (batch {b}, head {h}) attends row {row}, whose K "
                                                    f"{row_text(k_hist[b, h, row])} / V {row_text(v_hist[b, h, row])} "
                                                    f"are not one token's, written on layer {layer} for this batch "
                                                    "row and head", "a row not one token's"),
                                layer, b, h, i, attends, k_uids, v_uids, allowed)
                    got = sorted(int(u) for u in k_uids[seen])
                    if got != attends[i]:
                        raise self._pictured(self._fail(
                            WRONG, self.after_quantize("OP-ATTEND", set(attends[i]) - set(got)),
                            f"query {i} (batch {b}, head {h}) attends tokens {got}, the spec says "
                                                f"{attends[i]} (token numbers in the order written)",
                            attend_detail(got, attends[i])),
                                             layer, b, h, i, attends, k_uids, v_uids, allowed)

    def token_owners(self, uid: int) -> list[int]:
        """The sequences holding token `uid` now (the model's; the step in progress counts its own tokens)."""
        owners = {seq for seq, tokens in self.model.held.items() if uid in tokens}
        step = self.model.step
        if step is not None and uid in step.uids:
            owners.add(step.seqs[step.uids.index(uid)])
        return sorted(owners)

    def _pictured(self, stop: Stop, layer: int, b: int, h: int, failing: int, attends: list[list[int]],
                  k_uids: np.ndarray, v_uids: np.ndarray, allowed: np.ndarray) -> Stop:
        """A wrong answer's finding with its picture: the attend grid at (layer, b, h), and a cell cache's rows."""
        positions = self.fetched[0] if self.fetched else []
        seqs = [self.declared[i] if self.kind == op_model.CELL and i < len(self.declared) else 0 if self.kind != op_model.CELL
                else None for i in range(len(positions))]
        stop.finding.picture = {"attend": pictures.attend_picture(
            layer, b, h, list(zip(positions, seqs)), attends, k_uids, v_uids, allowed, self.written.get,
            self.token_owners, failing, self.kind == op_model.CELL)}
        if self.kind == op_model.CELL:
            stop.finding.picture["cells"] = pictures.cells_picture(k_uids, v_uids, self.written.get, self.token_owners)
        return stop




class _Unjudged(Exception):
    """The target's declared scope excuses this step: the program ends here unjudged."""


def _sent(step: Step) -> Step:
    """A concrete step as the calls it sends (what a target's refusal wrote into it aside)."""
    return {key: value for key, value in step.items() if key not in ("refused_with",)}


def _case(rejected: op_model.Rejected) -> str:
    """A short name for what a refused call broke (the suite's causes tell findings apart by it)."""
    if rejected.case:
        return f"{rejected.rule} {rejected.case}"
    why = rejected.why
    for word in ("re-placed", "not an int in", "differ", "declared", "twice", "no step", "src == dst",
                 "holds", "continue", "is not None or", "shape", "q_len", "not [", "free cells", "capacity"):
        if word in why:
            return f"{rejected.rule} {word}"
    return rejected.rule


def attend_detail(got: list[int], want: list[int]) -> str:
    """How an answer's attended tokens differ from the spec's (a cause's detail): a window one too wide attends a
    token the spec does not, a ring that drops too early misses one - two defects, not one."""
    extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
    if extra and missing:
        return "attends tokens the spec does not and misses some it does"
    if extra:
        return "attends tokens the spec does not"
    return "misses tokens the spec attends" if missing else "attends a token twice"


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0
