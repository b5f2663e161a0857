"""The sequence layout's engine: a program runs on a target and on `spec/model.py`, in lockstep.

The harness plays the backend: every plan a step op gets is executed on a data-level pool of that
layer (`model.execute`), so a wrong plan shows up as a corrupt read (DATA-SOUND), whatever layout
the target uses. The grading (the finding classes, creation, SCOPE-BORDER, the program loop) is the
engine core's (../engine.py). Exact layout conformance (the canonical runs, LAYOUT-CANON, DEPTH) is
recorded separately and does not stop the program.

Program steps (see spec/PROTOCOL.md, "Programs"): step, plan, commit, rewind, clear, can_extend,
depth, retained_from, length, capacity, faces. Arguments may be relative ({"rel": d} is length + d,
{"back": k} is max(0, length - k), {"room": d} is capacity - length + d, {"open": d} the open step's
position / T + d, {"limit": d} the step limit + d, {"n": d} is n_layers + d) so that a shrunk
program still means what it meant; `RunResult.steps` holds the concrete (resolved) steps.

Semantic conformance accepts any sound layout inside depth(layer). Rewind answers are the model's
(REWIND-SOUND on the canonical layout), except that a target whose layout already diverged may
accept a rewind the canonical layout refuses when every next step would read only sound rows of its
own pools (a ring with more rows retains more): that is recorded as a layout divergence.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from ... import model
from .. import scope as scopes
from ..configs import JsonConfig, to_model
from ..engine import (LENIENT, OVER_STRICT, WRONG, Accepted, Drive, Engine, Refused, Step, Verdict, _is_refusal, _same,
                      _show)
from ..targets import Target

# The exact JSON type of each method's answer besides null (bool is not an int here, as in ARG-INT).
ANSWER_TYPES: dict[str, tuple[type, ...]] = {
    "can_extend": (bool,), "rewind": (bool,), "capacity": (int,), "length": (int,), "depth": (int,),
    "retained_from": (int,), "faces": (dict,),
}


def plan_json(plan: model.Plan) -> dict[str, Any]:
    return {"write": [list(run) for run in plan.write], "read": [list(run) for run in plan.read],
            "read_base_pos": plan.read_base_pos}


def json_plan(value: Any) -> Any:
    """A JSON plan as a model Plan when it has the shape of one; anything else as it is."""
    try:
        return model.Plan(tuple((int(s), int(n)) for s, n in value["write"]),
                          tuple((int(s), int(n)) for s, n in value["read"]), value["read_base_pos"])
    except (KeyError, TypeError, ValueError):
        return value


def _well_formed(value: Any) -> Optional[str]:
    """PLAN-SHAPE on a target's plan JSON: None when fine, else what is wrong."""
    if not isinstance(value, dict) or "unreadable" in value:
        return f"not a plan: {value!r}"[:200]
    for name in ("write", "read"):
        runs = value.get(name)
        if not isinstance(runs, list) or not 1 <= len(runs) <= 2:
            return f"{name} has {len(runs) if isinstance(runs, list) else runs!r} runs, not 1 or 2"
        for run in runs:
            if not (isinstance(run, list) and len(run) == 2 and all(type(x) is int for x in run)
                    and run[0] >= 0 and run[1] >= 1):
                return f"{name} run {run!r} is not (start >= 0, len >= 1)"
    base = value.get("read_base_pos")
    if type(base) is not int or base < 0:
        return f"read_base_pos {base!r} is not an int >= 0"
    return None


class SequenceEngine(Engine):
    """One sequence program on one target; a fresh cache per program."""

    answer_types = ANSWER_TYPES

    def __init__(self, target: Target, cfg: JsonConfig, exact: bool = False, light: bool = False,
                 scope: Optional[scopes.Scope] = None, row_budget: Optional[int] = None,
                 drive: Optional[Drive] = None) -> None:
        # light: retained marks only after rewinds, clears and at the end; no length check after each plan
        super().__init__(target, cfg, exact, light, scope, row_budget, drive)
        mcfg = to_model(cfg)
        self.rejected_config = mcfg if isinstance(mcfg, model.Rejected) else None
        if isinstance(mcfg, model.Rejected):   # only create is checked: it must be rejected
            mcfg = model.Config(1, (model.Layer(model.FLAT, 0, None),))
        self.mcfg = mcfg
        self.n_layers = len(mcfg.layers)
        self.ms = model.initial(mcfg)
        self.pools: list[tuple[Optional[model.Row], ...]] = []
        self.history: list[model.Plan] = []          # every canonical plan of an executed step
        self.open_plans: dict[int, tuple[Any, model.Plan]] = {}   # layer -> (target plan, model plan)
        # CFG-DEDUP is exercised by plans on a layer whose policy another layer shares
        self.shared = [mcfg.layers.count(one) > 1 for one in mcfg.layers]

    def brief(self, value: Any) -> str:
        if isinstance(value, model.Plan):
            return str(plan_json(value))
        if isinstance(value, model.State):
            return f"length {value.length}"
        return repr(value)

    @property
    def length(self) -> int:
        return self.ms.length

    # --- the model's verdicts ----------------------------------------------------------------------
    def _plan_rule(self, position: int, T: int) -> str:
        """The rule a refusal of this (valid) plan call breaks."""
        if self.ms.open_step == (position, T) and position != self.length:
            return "STEP-APPEND"
        if position + T == self.mcfg.capacity:
            return "ADMIT"
        if T == model.step_limit(self.mcfg) and T > 1:
            return "STEP-T-MAX"
        return "STEP-APPEND"

    def verdict(self, method: str, args: dict[str, Any]) -> Verdict:
        cfg, ms = self.mcfg, self.ms
        if method == "plan":
            got = model.plan(cfg, ms, args["layer"], args["position"], args["T"])
            if isinstance(got, model.Rejected):
                return got
            if got is None:
                return Refused("ADMIT")
            return Accepted(got, self._plan_rule(args["position"], args["T"]))
        if method == "commit":
            got_state = model.commit(cfg, ms, json_plan(args["plan"]))
            if isinstance(got_state, model.Rejected):
                return got_state
            return Accepted(got_state, "COMMIT-ADVANCE")
        if method == "rewind":
            got_rewind = model.rewind(cfg, ms, args["new_len"])
            if isinstance(got_rewind, model.Rejected):
                return got_rewind
            ok, state = got_rewind
            if not ok:
                return Refused("REWIND-GROW" if args["new_len"] > ms.length else "REWIND-SOUND")
            return Accepted(state, "REWIND-SOUND")
        if method == "can_extend":
            got_bool = model.can_extend(cfg, ms, args["n"])
            return got_bool if isinstance(got_bool, model.Rejected) else Accepted(got_bool, "ADMIT")
        if method in ("depth", "retained_from"):
            got_int = (model.depth(cfg, args["layer"]) if method == "depth"
                       else model.retained_from(cfg, ms, args["layer"]))
            return got_int if isinstance(got_int, model.Rejected) else \
                Accepted(got_int, "DEPTH" if method == "depth" else "RETAINED")
        if method == "clear":
            return Accepted(model.clear(cfg, ms), "CLEAR")
        if method == "length":
            return Accepted(ms.length, "LEN-BOUNDS")
        if method == "capacity":
            return Accepted(cfg.capacity, "ADMIT")
        if method == "faces":
            return Accepted({"same_object": True}, "FACES")
        raise ValueError(f"unknown method {method}")


    def accepted_anyway(self, method: str, args: dict[str, Any], rule: str, shown: str) -> Optional[Verdict]:
        """A rewind the canonical layout refuses, accepted by a target whose layout already diverged."""
        if rule == "REWIND-SOUND" and self.result.layout:
            rewound = self.sound_on_own_layout(args["new_len"])
            if rewound is not None:
                self._layout(f"{shown} accepted: refused on the canonical layout, sound on the target's")
                return Accepted(rewound, rule)
        return None


    def sound_on_own_layout(self, new_len: int) -> Optional[model.State]:
        """A non-canonical target accepted a rewind the canonical layout refuses: it is right when
        every admissible next step, on every layer, reads only sound rows of the target's own pools
        (plans are pure, so asking for them changes nothing). The rewound state, or None."""
        state = replace(self.ms, length=new_len, open_step=None, open_tag=None, truth=self.ms.truth[:new_len])
        limit = model.step_limit(self.mcfg)
        top = self.mcfg.capacity - new_len if limit is None else min(limit, self.mcfg.capacity - new_len)
        for T in range(1, top + 1):
            truth = model.step_truth(state, new_len, T)
            for layer in range(self.n_layers):
                got = self._call("plan", {"layer": layer, "position": new_len, "T": T}, "REWIND-SOUND")
                if _is_refusal(got) or _well_formed(got.value):
                    return None
                _, problems = model.execute(self.pools[layer], truth, new_len, T, json_plan(got.value))
                if problems:
                    return None
        return state

    def open_step_kept(self, context: str) -> None:
        """ATOMIC: a rejected or refused call leaves the open step open (it may still be planned)."""
        if self.ms.open_step is None or self.ms.open_step[0] == self.ms.length:
            return
        position, T = self.ms.open_step
        got = self._call("plan", {"layer": 0, "position": position, "T": T}, "ATOMIC")
        if _is_refusal(got):
            raise self._fail(WRONG, "ATOMIC", f"after {context}, the open step ({position}, {T}) can no longer "
                                              f"be planned: {got.error or got.value!r}")

    def observe(self, context: str, rule: str, lenient_rule: Optional[str] = None, retained: bool = True) -> None:
        """Compare the target's length (length(), or can_extend probes) and retained marks with the model.

        Retained marks are compared only between complete steps (`retained`): in the middle of a
        per-layer-committed step some layers have not written their rows yet (PROTO-COMMIT).
        """
        capacity, length = self.mcfg.capacity, self.ms.length
        if "length" in self.target.optional:
            got = self._call("length", {}, rule)
            seen = got.value if got.ok else got.error
        else:
            self.result.skipped.add("length() absent: the length is observed through can_extend probes")
            room = capacity - length
            fits = self._call("can_extend", {"n": room}, rule)
            over = self._call("can_extend", {"n": room + 1}, rule)
            seen = length if (fits.ok and fits.value is True and over.ok and over.value is False) else \
                f"not {length} (can_extend({room}) -> {fits.value if fits.ok else fits.error}, " \
                f"can_extend({room + 1}) -> {over.value if over.ok else over.error})"
        if seen != length or type(seen) is not int:
            if "length" in self.target.optional and not lenient_rule:
                room = capacity - length
                fits = self._call("can_extend", {"n": room}, rule)
                over = self._call("can_extend", {"n": room + 1}, rule)
                if fits.ok and fits.value is True and over.ok and over.value is False:
                    raise self._fail(WRONG, "LEN-BOUNDS", f"{context}: length() answers {seen!r} while "
                                                          f"can_extend agrees with the spec's length {length}")
            kind = LENIENT if lenient_rule else WRONG
            raise self._fail(kind, lenient_rule or rule, f"{context}: length is {seen!r}, the spec says {length}")
        if not retained or (self.light and rule not in ("REWIND-SOUND", "CLEAR", "LEN-BOUNDS")):
            return
        if "retained_from" not in self.target.optional:
            self.result.skipped.add("retained_from() absent: RETAINED not checked")
            return
        for layer in range(self.n_layers):
            got = self._call("retained_from", {"layer": layer}, "RETAINED")
            expected = self._retained(layer)
            if not got.ok or got.value != expected or type(got.value) is not int:
                raise self._fail(WRONG, "RETAINED", f"{context}: retained_from({layer}) is "
                                                    f"{got.value if got.ok else got.error!r}, "
                                                    f"the layer holds [{expected}, {length}) intact")
            canonical = model.retained_from(self.mcfg, self.ms, layer)
            if self.exact and canonical != expected:
                self._layout(f"retained_from({layer}) {expected} differs from the canonical {canonical}")

    def _retained(self, layer: int) -> int:
        """RETAINED on the target's own pool: the oldest p with [p, length) intact (any layout)."""
        held = {row for row in self.pools[layer] if row is not None}
        oldest = self.ms.length
        while oldest > 0 and (oldest - 1, self.ms.truth[oldest - 1]) in held:
            oldest -= 1
        return oldest

    def check_plan(self, layer: int, position: int, T: int, verdict: Accepted, value: Any) -> model.Plan:
        """A returned plan: shape, coverage and read base (semantic), runs (exact layout)."""
        problem = _well_formed(value)
        if problem:
            raise self._fail(WRONG, "PLAN-SHAPE", f"plan({layer}, {position}, {T}): {problem}")
        got: model.Plan = json_plan(value)
        canonical: model.Plan = verdict.value
        written = sum(n for _, n in got.write)
        if written != T:
            raise self._fail(WRONG, "PLAN-WRITE", f"plan({layer}, {position}, {T}) writes {written} rows: {value}")
        if got.read_base_pos != canonical.read_base_pos:
            raise self._fail(WRONG, "PLAN-READ", f"plan({layer}, {position}, {T}) reads from position "
                                                 f"{got.read_base_pos}, the spec says {canonical.read_base_pos}")
        end = got.read_base_pos + sum(n for _, n in got.read)
        if end != position + T:
            raise self._fail(WRONG, "PLAN-READ", f"plan({layer}, {position}, {T}) reads up to {end}, "
                                                 f"not {position + T}: {value}")
        rows = len(self.pools[layer])
        if any(start + n > rows for start, n in got.write + got.read):
            raise self._fail(WRONG, "PLAN-SHAPE", f"plan({layer}, {position}, {T}) uses a row past depth "
                                                  f"{rows}: {value}")
        if self.exact and got != canonical:
            self._layout(f"plan({layer}, {position}, {T}) is {value}, canonical {plan_json(canonical)}")
        self._exercise("plan checked")
        if self.shared[layer]:
            self._exercise("plan on a shared policy")
        return got

    def execute(self, layer: int, position: int, T: int, got: model.Plan) -> None:
        """Play the backend for one layer: write then read on the target's pool; every read must be sound."""
        truth = model.step_truth(self.ms, position, T)
        self._rows(len(self.pools[layer]))
        self.pools[layer], problems = model.execute(self.pools[layer], truth, position, T, got)
        if problems:
            rule = problems[0].split(":", 1)[0]
            raise self._fail(WRONG, rule, f"executing layer {layer}'s plan for step ({position}, {T}) "
                                          f"{plan_json(got)}: " + "; ".join(problems[:3]))
        self._exercise("plan executed")
        self.ms, _ = model.run_layer(self.mcfg, self.ms, layer, position, T)

    # --- argument resolution -----------------------------------------------------------------------
    def resolve(self, value: Any, what: str) -> Any:
        if not isinstance(value, dict):
            return value
        open_step = self.ms.open_step
        limit = model.step_limit(self.mcfg)
        if "rel" in value:
            return self.length + value["rel"]
        if "back" in value:
            return max(0, self.length - value["back"])
        if "room" in value:
            return self.mcfg.capacity - self.length + value["room"]
        if "n" in value:
            return self.n_layers + value["n"]
        if "limit" in value:
            return (self.mcfg.capacity if limit is None else limit) + value["limit"]
        if "open" in value:
            if what == "T":
                return (open_step[1] if open_step else 1) + value["open"]
            return (open_step[0] if open_step else max(0, self.length - 1)) + value["open"]
        return value

    def after_create(self) -> None:
        """The checks of a freshly created (valid) cache: capacity, depths and pools, faces, length."""
        if not self.light:
            _, capacity = self.checked("capacity", {})
            if not _same(capacity.value, self.mcfg.capacity):
                raise self._fail(WRONG, "ADMIT", f"capacity() is {capacity.value!r}, not {self.mcfg.capacity}")
        for layer in range(self.n_layers):
            depth = model.depth(self.mcfg, layer)
            assert isinstance(depth, int)
            if "depth" in self.target.optional and not self.light:
                got = self._call("depth", {"layer": layer}, "DEPTH")
                if not got.ok or type(got.value) is not int or not 1 <= got.value <= 1 << 24:
                    raise self._fail(WRONG, "DEPTH", f"depth({layer}) is {got.value if got.ok else got.error!r}")
                if got.value != depth and self.exact:
                    self._layout(f"depth({layer}) is {got.value}, canonical {depth}")
                depth = got.value
            else:
                self.result.skipped.add("depth() absent: DEPTH not checked; pools sized by the canonical depth")
            self._rows(depth)
            self.pools.append((None,) * depth)
        if self.light:
            return
        verdict, outcome = self.checked("faces", {})
        if outcome.value != {"same_object": True}:
            raise self._fail(WRONG, "FACES", f"as_control() and as_planner() are not one object: {outcome.value}")
        self.observe("after create", "LEN-BOUNDS")

    def _concrete_guess(self, step: Step) -> Step:
        return {key: self.resolve(value, key) if key not in ("op", "plan") else value for key, value in step.items()}

    def run_step(self, step: Step) -> Optional[Step]:
        op = step["op"]
        if op == "step":
            return self.full_step(step)
        if op == "plan":
            args = {name: self.resolve(step[name], name) for name in ("layer", "position", "T")}
            concrete = {"op": "plan", **args}
            self.result.steps.append(concrete)   # recorded first: a Stop inside must keep it
            verdict, outcome = self.checked("plan", args)
            if isinstance(verdict, Accepted):
                self.check_plan(args["layer"], args["position"], args["T"], verdict, outcome.value)
                self.observe(f"after plan({_show(args)})", "PLAN-PURE")
            self.result.steps.pop()
            return concrete
        if op == "commit":
            return self.commit_step(step)
        if op in ("rewind", "can_extend", "depth", "retained_from"):
            name = {"rewind": "new_len", "can_extend": "n"}.get(op, "layer")
            if op in ("depth", "retained_from") and op not in self.target.optional:
                self.result.skipped.add(f"{op}() absent: its argument checks skipped")
                return None
            args = {name: self.resolve(step[name], name)}
            self.result.steps.append({"op": op, **args})
            verdict, outcome = self.checked(op, args)
            if isinstance(verdict, Accepted):
                if op == "rewind":
                    self.ms = verdict.value
                    self.open_plans = {}
                    self.observe(f"after rewind({args[name]})", "REWIND-SOUND")
                elif op == "can_extend" and not _same(outcome.value, verdict.value):
                    raise self._fail(WRONG, "ADMIT", f"can_extend({args[name]!r}) is {outcome.value!r} "
                                                     f"at length {self.length}, the spec says {verdict.value}")
                elif op == "depth" and self.exact and outcome.value != verdict.value:
                    self._layout(f"depth({args[name]}) is {outcome.value}, canonical {verdict.value}")
            return self.result.steps.pop()
        if op == "clear":
            self.result.steps.append({"op": "clear"})
            verdict, _ = self.checked("clear", {})
            assert isinstance(verdict, Accepted)
            self.ms, self.open_plans = verdict.value, {}
            self.observe("after clear()", "CLEAR")
            return self.result.steps.pop()
        if op in ("length", "capacity", "faces"):
            if op == "length" and "length" not in self.target.optional:
                self.result.skipped.add("length() absent: the length is observed through can_extend probes")
                return None
            verdict, outcome = self.checked(op, {})
            assert isinstance(verdict, Accepted)
            if not _same(outcome.value, verdict.value):
                rule = verdict.rule
                raise self._fail(WRONG, rule, f"{op}() is {outcome.value!r}, the spec says {verdict.value!r}")
            return {"op": op}
        raise ValueError(f"unknown step op {op!r}")

    def full_step(self, step: Step) -> Optional[Step]:
        """Plan every layer, execute each plan on its pool, commit once or per layer (PROTO-COMMIT kept)."""
        position = self.resolve(step.get("position", {"rel": 0}), "position")
        T = self.resolve(step["T"], "T")
        pattern = step.get("commit", "once")
        commit_layer = min(step.get("commit_layer", self.n_layers - 1), self.n_layers - 1)
        concrete: Step = {"op": "step", "position": position, "T": T, "commit": pattern}
        if pattern == "once":
            concrete["commit_layer"] = commit_layer
        if step.get("recommit"):
            concrete["recommit"] = True
        self.result.steps.append(concrete)
        plans: list[tuple[Any, model.Plan]] = []
        for layer in range(self.n_layers):
            args = {"layer": layer, "position": position, "T": T}
            verdict, outcome = self.checked("plan", args)
            if not isinstance(verdict, Accepted):
                continue   # refused or rejected on every layer alike: nothing to execute
            got = self.check_plan(layer, position, T, verdict, outcome.value)
            if "length" in self.target.optional and not self.light:
                self.observe(f"after plan({layer}, {position}, {T})", "PLAN-PURE", retained=False)
            self.execute(layer, position, T, got)
            plans.append((outcome.value, verdict.value))
            if pattern == "per-layer":
                self.commit_pair(outcome.value, verdict.value, retained=layer == self.n_layers - 1)
        if plans and pattern == "once":
            self.commit_pair(*plans[commit_layer])
        if plans and step.get("recommit"):
            self.commit_pair(*plans[0])
        if plans:
            self.open_plans = dict(enumerate(plans))
            self.history.extend(model_plan for _, model_plan in plans)
        return self.result.steps.pop()

    def commit_pair(self, target_plan: Any, model_plan: model.Plan, retained: bool = True) -> None:
        """commit: the target gets its own plan, the model its canonical plan for the same layer and step."""
        verdict = self.verdict("commit", {"plan": plan_json(model_plan)})
        outcome = self._call("commit", {"plan": target_plan}, verdict.rule)
        shown = f"commit({target_plan})"
        if not isinstance(verdict, Accepted):
            raise AssertionError(f"the harness committed a plan the model rejects: {verdict}")
        if not outcome.ok:
            raise self._fail(OVER_STRICT, verdict.rule, f"{shown} is valid but the target raised: {outcome.error}")
        self.ms = verdict.value
        self.observe(f"after {shown}", "COMMIT-ADVANCE", retained=retained)

    def commit_step(self, step: Step) -> Optional[Step]:
        """A bare commit: a forged, stale, malformed or non-plan value, or the open step again."""
        spec = step["plan"]
        forge = spec.get("forge") if isinstance(spec, dict) else None
        if forge == "open":
            layer = min(spec.get("layer", 0), self.n_layers - 1)
            if layer not in self.open_plans:
                return None
            target_plan, model_plan = self.open_plans[layer]
            self.result.steps.append({"op": "commit", "plan": {"forge": "open", "layer": layer}})
            self.commit_pair(target_plan, model_plan)
            return self.result.steps.pop()
        value = self.forge(forge) if forge else spec
        if value is None:
            return None
        verdict = self.verdict("commit", {"plan": value})
        if isinstance(verdict, Accepted) and verdict.value is not self.ms:
            return None   # a new step committed without executing it would break PROTO-COMMIT: not a test
        concrete = {"op": "commit", "plan": value}
        self.result.steps.append(concrete)
        verdict, outcome = self.checked("commit", {"plan": value})
        if isinstance(verdict, Accepted):
            self.ms = verdict.value
            self.observe(f"after commit({value})", verdict.rule)
        return self.result.steps.pop()

    def forge(self, kind: str) -> Any:
        """A plan the spec rejects, built from the model's plans (never the target's)."""
        ms, cfg = self.ms, self.mcfg
        if kind == "stale":
            for old in reversed(self.history):
                if isinstance(model.commit(cfg, ms, old), model.Rejected):
                    return plan_json(old)
            return None
        if kind == "not-a-plan":
            return "not a plan"
        if kind in ROW_FORGERIES:
            return self.forge_rows(kind)
        if ms.length + 1 > cfg.capacity:
            return None
        fresh = model.canonical_plan(cfg.layers[0], ms.length, 1)
        if kind == "shift-base":
            return plan_json(replace(fresh, read_base_pos=fresh.read_base_pos + 1))
        if kind == "extra-row":
            (start, n), *rest = fresh.write
            return plan_json(replace(fresh, write=((start, n + 1), *rest)))
        if kind == "empty":
            return {"write": [], "read": [list(r) for r in fresh.read], "read_base_pos": fresh.read_base_pos}
        if kind == "three-runs":
            return {"write": [list(fresh.write[0])] * 3, "read": [list(r) for r in fresh.read],
                    "read_base_pos": fresh.read_base_pos}
        if kind == "future":
            if ms.length + 2 > cfg.capacity:
                return None
            return plan_json(model.canonical_plan(cfg.layers[0], ms.length + 1, 1))
        raise ValueError(f"unknown forge kind {kind!r}")

    def forge_rows(self, kind: str) -> Any:
        """A next-step plan with the step's span - sum(write lens) = T, read_base_pos + sum(read lens)
        = position + T, position = length - and other rows: runs shifted by a row, a run split in two,
        or another policy's layout that no layer of this cache has. A commit that checks only a plan's
        arithmetic takes it for the step's own (COMMIT-ISSUED). None when no such plan exists here."""
        ms, cfg = self.ms, self.mcfg
        limit = model.step_limit(cfg)
        T = min(2, cfg.capacity - ms.length, 2 if limit is None else limit)
        if T < 1:
            return None
        candidates: list[Optional[model.Plan]] = []
        if kind == "other-layout":
            present = set(cfg.layers)
            others = [model.Layer(model.FLAT, 0, None)] + [model.Layer(model.RING, w, m)
                                                           for w in range(1, 5) for m in range(1, 5)]
            candidates = [model.canonical_plan(layer, ms.length, 1) for layer in others if layer not in present]
        for layer in dict.fromkeys(cfg.layers) if kind != "other-layout" else ():
            fresh = model.canonical_plan(layer, ms.length, T)
            rows = model.depth_of(cfg, layer)
            if kind == "shift-write":
                moved = _shifted(fresh.write, rows)
                candidates.append(None if moved is None else replace(fresh, write=moved))
            elif kind == "shift-read":
                moved = _shifted(fresh.read, rows)
                candidates.append(None if moved is None else replace(fresh, read=moved))
            elif kind == "split-write":
                moved = _split(fresh.write)
                candidates.append(None if moved is None else replace(fresh, write=moved))
            else:
                moved = _split(fresh.read)
                candidates.append(None if moved is None else replace(fresh, read=moved))
        for plan in candidates:
            if plan is not None and isinstance(model.commit(cfg, ms, plan), model.Rejected):
                return plan_json(plan)
        return None


# Forged plans that keep the step's (position, T) and move its rows (Engine.forge_rows).
ROW_FORGERIES = ("shift-write", "shift-read", "split-write", "split-read", "other-layout")


def _shifted(runs: model.Runs, rows: int) -> Optional[model.Runs]:
    """Every run one row later (or earlier, when later leaves the pool): the same lengths, other rows."""
    for delta in (1, -1):
        moved = tuple((start + delta, n) for start, n in runs)
        if all(0 <= start and start + n <= rows for start, n in moved):
            return moved
    return None


def _split(runs: model.Runs) -> Optional[model.Runs]:
    """A single run of two rows or more split in two: the same rows, listed differently."""
    if len(runs) != 1 or runs[0][1] < 2:
        return None
    start, n = runs[0]
    return ((start, 1), (start + 1, n - 1))

