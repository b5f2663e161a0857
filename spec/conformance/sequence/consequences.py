"""The sequence layout's consequences: past a lenient or over-strict step, the program goes on with that
step applied and only the safety properties (../consequences.py, SAFETY) are judged. The harness keeps
its own truth - the content last written at each position by the steps the target accepted, a gap where
its length moved past what was written - and executes every plan on the target's pools against it; bare
commits are not replayed (their forged plans come from the model)."""

from __future__ import annotations

from typing import Any, Optional

from ... import model
from ..consequences import Consequences
from ..engine import Finding, Step, _show
from .engine import SequenceEngine, _well_formed, json_plan


GAP = -2   # the content of a position no step wrote: no row ever holds it, so a read of it is never sound
FRESH = 10**9   # tags of the drive's own steps start here, above every tag of the lockstep's


class SequenceConsequences(Consequences):
    """The sequence layout's driver: the harness's truth (the content last written at each position, as
    the steps the target accepted wrote it), the target's own pools, and its length."""

    def __init__(self, engine: SequenceEngine, entry: Finding, entry_step: Step) -> None:
        super().__init__(engine, entry)
        self.engine: SequenceEngine = engine
        self.entry_step = entry_step
        self.capacity = engine.mcfg.capacity
        self.truth: list[int] = list(engine.ms.truth[:engine.ms.length])
        self.pools = list(engine.pools)
        self.next_tag = FRESH
        self.open_step: Optional[tuple[int, int]] = engine.ms.open_step

    def length(self) -> int:
        """The target's length (length(), when it has one), else the harness's own view of it."""
        if "length" in self.engine.target.optional:
            got = self._int("length", {})
            if got is not None:
                return got
        return len(self.truth)

    def sync(self, context: str) -> None:
        """SAFE-LENGTH; the truth follows the target's length: positions past what was written are gaps."""
        length = self.length()
        if not 0 <= length <= self.capacity:
            raise self._broken("SAFE-LENGTH", f"{context}: length() is {length}, outside [0, {self.capacity}]")
        self.truth = (self.truth + [GAP] * length)[:length]

    def check_table(self, context: str) -> None:
        self.sync(context)

    def after_entry(self) -> None:
        """A full step whose plan on some layer was the entry goes on from that layer, as a backend would
        (executed, committed); any other entry is followed through the length it left."""
        step, call = self.entry_step, self.call
        if step.get("op") == "step" and call is not None and call[0] == "plan":
            args = call[1]
            if type(args["layer"]) is int and 0 <= args["layer"] < self.engine.n_layers:
                self.full_step(step, record=False, position=args["position"], T=args["T"], first_layer=args["layer"])
                return
        self.sync(f"after {self._entry_call()}")

    def resolve(self, value: Any, what: str) -> Any:
        """Relative arguments against the target's length (engine.resolve's meanings)."""
        if not isinstance(value, dict):
            return value
        engine = self.engine
        limit = model.step_limit(engine.mcfg)
        if "rel" in value:
            return self.length() + value["rel"]
        if "back" in value:
            return max(0, self.length() - value["back"])
        if "room" in value:
            return self.capacity - self.length() + value["room"]
        if "n" in value:
            return engine.n_layers + value["n"]
        if "limit" in value:
            return (self.capacity if limit is None else limit) + value["limit"]
        if "open" in value:
            if what == "T":
                return (self.open_step[1] if self.open_step else 1) + value["open"]
            return (self.open_step[0] if self.open_step else max(0, self.length() - 1)) + value["open"]
        return value

    def run_step(self, step: Step) -> None:
        op = step["op"]
        if op == "step":
            self.full_step(step)
        elif op in ("plan", "rewind", "can_extend", "depth", "retained_from"):
            names = {"plan": ("layer", "position", "T"), "rewind": ("new_len",), "can_extend": ("n",)}
            args = {name: self.resolve(step[name], name) for name in names.get(op, ("layer",))}
            if op in ("depth", "retained_from") and op not in self.engine.target.optional:
                return
            self.steps.append({"op": op, **args})
            got = self._ask(op, args)
            if op == "rewind" and got.ok and got.value is True:
                self.open_step = None
                self.sync(f"after rewind({_show(args)})")
        elif op == "clear":
            self.steps.append({"op": "clear"})
            if self._ask("clear", {}).ok:
                self.truth, self.open_step = [], None
            self.sync("after clear()")
        elif op in ("length", "capacity", "faces") and (op != "length" or "length" in self.engine.target.optional):
            self.steps.append({"op": op})
            self._ask(op, {})
        # a bare commit is not replayed: its forged plans are built from the model's state, which the
        # drive no longer follows

    def full_step(self, step: Step, record: bool = True, position: Any = None, T: Any = None,
                  first_layer: int = 0) -> None:
        """Plan the layers (from `first_layer`: the entry's step goes on where the lockstep stopped),
        execute each plan the target answers on its pool (SAFE-READS), commit as the step says."""
        engine = self.engine
        position = self.resolve(step.get("position", {"rel": 0}), "position") if position is None else position
        T = self.resolve(step["T"], "T") if T is None else T
        pattern = step.get("commit", "once")
        commit_layer = min(step.get("commit_layer", engine.n_layers - 1), engine.n_layers - 1)
        if record:
            self.steps.append({"op": "step", "position": position, "T": T, "commit": pattern,
                               **({"commit_layer": commit_layer} if pattern == "once" else {}),
                               **({"recommit": True} if step.get("recommit") else {})})
        if type(position) is not int or type(T) is not int or not 0 <= position <= self.capacity or not 0 <= T:
            return
        if first_layer:   # the lockstep wrote the earlier layers with the model's tag for this step
            tag = engine.ms.open_tag if engine.ms.open_step == (position, T) else engine.ms.next_tag
            tags = [tag if tag is not None else self.fresh()] * T
        else:
            tags = [self.fresh() for _ in range(T)]
        truth = (self.truth + [GAP] * position)[:position] + tags
        plans: dict[int, Any] = {}
        for layer in range(first_layer, engine.n_layers):
            got = self._ask("plan", {"layer": layer, "position": position, "T": T})
            if not got.ok or got.value is None or got.value is False or _well_formed(got.value) is not None:
                continue   # refused, or no plan a backend could run
            self.execute(layer, position, T, truth, got.value)
            plans[layer] = got.value
            if pattern == "per-layer":
                self.commit(got.value, truth)
        if pattern == "once" and commit_layer in plans:
            self.commit(plans[commit_layer], truth)
        if plans and step.get("recommit"):
            self.commit(plans[min(plans)], truth)
        self.open_step = (position, T)
        self.sync(f"after the step ({position}, {T})")

    def fresh(self) -> int:
        self.next_tag += 1
        return self.next_tag

    def execute(self, layer: int, position: int, T: int, truth: list[int], value: Any) -> None:
        plan = json_plan(value)
        self.pools[layer], problems = model.execute(self.pools[layer], tuple(truth), position, T, plan)
        if problems:
            raise self._broken("SAFE-READS", f"executing layer {layer}'s plan for the step ({position}, {T}) "
                                             f"{value}: " + "; ".join(problems[:3]), problems[0].split(":", 1)[0])

    def commit(self, value: Any, truth: list[int]) -> None:
        if self._ask("commit", {"plan": value}).ok:
            self.truth = list(truth)


def drive_on(engine: Any, program: list[Step], entry: Finding) -> None:
    """The engine's drive past a lenient or over-strict entry (engine.Drive)."""
    SequenceConsequences(engine, entry, program[entry.step_index]).drive(Consequences.rest(program, entry))
