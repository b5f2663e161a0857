"""Consequences: past a lenient or over-strict step, the program goes on with that step applied.

A lenient step is a call the spec rejects that the target served; the model cannot follow it (it has
no answer for a state the spec never enters). Ending the program there would grade only the entry:
upstream's cell cache lets `seq_rm` run between `declare_step` and `place_step`, the removed id still
gets a cell, and `seq_new()` hands the id out again owning that cell - a cross-sequence leak that a
lenient CELL-FORWARD finding alone does not show. So the harness keeps driving the target and judges
only what must hold *whatever the caller did*: the safety properties below, checked on the target's
own answers and on the harness's data-level pools (every CellStep is still executed). A broken one
is a **wrong** finding under the rule it protects, naming the step that led there (`Finding.after`).

How the rest of the program is driven: arguments resolve against the target's own answers (its
`live()`, `next_pos`, `free_cells()`; a sequence cache's length), not the model's; every answer is
accepted as it is. In the cell layout writers are tracked by *incarnation*: every id the target hands
out (seq_new, seq_clone) starts a new one, so an id handed out again is another sequence; a fork may
read what its source's lineage wrote (the cut is not judged here - that is CELL-FORK's lockstep). In
the sequence layout the harness keeps its own truth - the content last written at each position by
the steps the target accepted, a gap where its length moved past what was written - and executes
every plan on the target's pools against it; bare commits are not replayed (their forged plans come
from the model). A consequence counts only when the program without its entry step shows no wrong
answer or crash (otherwise it is a defect of its own, reported by the lockstep). Stated in SPEC.md,
section 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from .. import cell_model as cm
from .. import model, op_model
from .cell_engine import CellEngine, resolve_positions, step_from_json
from .engine import CRASH, WRONG, Engine, Finding, Step, Stop, _show, _well_formed, json_plan
from .malform import POSITIONS, case_of, malformed_positions
from .op_engine import OpEngine, _row, allowed_rows, as_array
from .op_engine import _show as _show_op
from .targets import Outcome, TargetCrash


@dataclass(frozen=True)
class Safety:
    id: str
    rule: str         # the rule of the spec it protects (a broken one is a wrong finding of this rule)
    statement: str
    why: str


SAFETY: tuple[Safety, ...] = (
    Safety("SAFE-ISOLATION", "CELL-DATA-SOUND",
           "(Cell layout) A query token attends only cells the harness saw written, by its own sequence (this "
           "incarnation "
           "of its id) or a sequence it was forked from, at positions not after its own.",
           "Attending another sequence's cell is the leak every other CELL- rule exists to prevent."),
    Safety("SAFE-NEW-EMPTY", "CELL-ID-REUSE",
           "(Cell layout) A sequence id just handed out by seq_new() owns no cell: seq_len 0, next_pos 0.",
           "An id handed out again with a cell of its previous holder gives that holder's keys to a stranger."),
    Safety("SAFE-NO-STRAY", "CELL-ID-REUSE",
           "(Cell layout) Every occupied cell is owned by a live sequence: capacity - free_cells() <= the sum of "
           "seq_len "
           "over live(), and nothing is occupied once no sequence is live.",
           "An occupied cell no live sequence owns is lost to every sequence, or owned by an id that is "
           "not live and will be handed out again with it."),
    Safety("SAFE-RANGE", "CELL-OWNERS",
           "(Cell layout) Counts and positions stay in range: live() holds distinct ids in [0, max_seqs); "
           "free_cells(), "
           "used_end() and each seq_len in [0, capacity]; each next_pos in [0, INT_MAX].",
           "A runner continues from next_pos and seq_len: an overflowed next_pos (a position INT_MAX "
           "accepted) sends the next token to a negative position."),
    Safety("SAFE-READS", "DATA-SOUND",
           "(Sequence layout) Every row a plan reads holds the content last written at its position by the steps "
           "the target accepted; a position no step wrote (a gap, a length moved by a commit) is never read.",
           "A read of a row never written, or overwritten, is attention over garbage, whatever the caller asked."),
    Safety("SAFE-LENGTH", "LEN-BOUNDS",
           "(Sequence layout) length() stays in [0, capacity].",
           "A runner sizes its next step from the length."),
    Safety("SAFE-OP-ISOLATION", "OP-ATTEND",
           "(Op face) A query attends only rows holding one token's K and V, written for this batch row and head "
           "by an update_and_fetch naming this layer, of the query's own sequence or one it was forked from "
           "(seq_cp), at a position not after the query's.",
           "Attention over another sequence's keys, another layer's or a later position's is a leak or garbage, "
           "whatever the caller did."),
    Safety("SAFE-OP-KEEP", "OP-ATTEND",
           "(Op face, cell cache) A forward never lowers the seq_len of a sequence with no token in it.",
           "A sequence's tokens are its own: a write of other sequences that takes one of its cells makes its "
           "queries miss context it holds."),
    Safety("SAFE-STEP-SHAPE", "CELL-STEP-SHAPE",
           "(Cell layout) A CellStep has one cell per declared token, distinct, inside [0, read_len), "
           "read_len <= capacity, "
           "and length x read_len mask bytes of 0 or 1.",
           "The backend indexes the mask and gathers the cells without checks."),
)
BY_ID = {safety.id: safety for safety in SAFETY}

Written = tuple[int, int, int]   # what the harness wrote in a cell: (position, content, incarnation)


class Consequences:
    """Drives the rest of a program past the entry step of `engine`, judging only SAFETY. The layouts'
    drivers say what the entry did (`after_entry`), how a step runs (`run_step`) and what is judged at
    the end (`check_table`)."""

    atomic_rule = "ATOMIC"   # the rule a call of the drive is made under (a crash there names it)

    def __init__(self, engine: Union[Engine, OpEngine], entry: Finding) -> None:
        self.engine: Union[Engine, OpEngine] = engine
        self.entry = entry
        self.call = engine.judged   # the entry's call and its answer
        method = self.call[0] if self.call else "create"
        self.after = f"{entry.kind} {entry.rule} in {method}"   # the kind of entry: part of a cause
        self.entry_text = f"{entry.kind} {entry.rule} step {entry.step_index}, {self._entry_call()}"
        self.steps: list[Step] = list(engine.result.steps)
        self.entry_at = len(self.steps) - 1   # the entry's index in the concrete steps (the last the lockstep ran)

    def _entry_call(self) -> str:
        return f"{self.call[0]}({_show(self.call[1])})" if self.call is not None else "create"

    # --- the verdicts ------------------------------------------------------------------------------------
    def _broken(self, safety: str, message: str, rule: str = "") -> Stop:
        return Stop(Finding(WRONG, rule or BY_ID[safety].rule, f"{safety} broken after the {self.entry_text}: "
                                                               f"{message}", self.engine.index, after=self.after,
                            after_index=self.entry_at, safety=safety))

    def _ask(self, method: str, args: dict[str, Any]) -> Outcome:
        """One call of the drive. Its answer is judged by the SAFE- properties only (not by the lockstep's
        answer types: past a lenient step, a length of True is a value to range-check, not a protocol
        break); a crash is still a crash, naming the entry."""
        self.engine.result.calls += 1
        try:
            return self.engine.target.call(method, args)
        except TargetCrash as crash:
            raise Stop(Finding(CRASH, self.atomic_rule, f"after the {self.entry_text}: {method}({_show(args)}): "
                                                        f"{crash}", self.engine.index, after=self.after,
                               after_index=self.entry_at)) from None

    def _int(self, method: str, args: dict[str, Any]) -> Optional[int]:
        got = self._ask(method, args)
        return got.value if got.ok and type(got.value) is int else None

    # --- the drive -----------------------------------------------------------------------------------
    def drive(self, rest: list[tuple[int, Step]]) -> None:
        """Apply the entry's own effect, then each later step; set the engine's consequence on a breach."""
        engine = self.engine
        try:
            self.after_entry()
            for engine.index, step in rest:
                self.run_step(step)
            engine.index = rest[-1][0] if rest else engine.index
            self.check_table("at the end of the program")
        except Stop as stop:
            engine.result.consequence = stop.finding
            engine.result.consequence_steps = self.steps
        except (TypeError, ValueError, KeyError, IndexError) as error:
            # answers of a shape the driver cannot follow (the lockstep already reported the entry):
            # said in the report, never a silent pass
            engine.result.skipped.add(f"consequences past a {self.after} step not followed to the end: "
                                      f"{type(error).__name__}: {error}")

    def after_entry(self) -> None:
        raise NotImplementedError

    def run_step(self, step: Step) -> None:
        raise NotImplementedError

    def check_table(self, context: str) -> None:
        raise NotImplementedError


class CellConsequences(Consequences):
    """The cell layout's driver: incarnations, the harness's cell pools, the table's answers."""

    atomic_rule = "CELL-ATOMIC"

    def __init__(self, engine: CellEngine, entry: Finding) -> None:
        super().__init__(engine, entry)
        self.engine: CellEngine = engine
        c = engine.ccfg
        self.capacity, self.max_seqs, self.n_layers = c.capacity, c.max_seqs, len(c.layers)
        forward = engine.cs.forward
        self.declared: Optional[list[Any]] = list(forward.seq_ids) if forward is not None else None
        # the open forward's placement: positions, cells, content ids
        self.placed: Optional[tuple[list[Any], list[int], list[int]]] = (
            (list(forward.positions), list(forward.cells), list(forward.contents))
            if forward is not None and forward.positions is not None and forward.cells is not None
            and forward.contents is not None else None)
        self.served: set[int] = set(forward.served) if forward is not None else set()
        # the harness's pools: what it wrote in each cell of each layer, with the writer's incarnation
        self.pools: list[list[Optional[Written]]] = [
            [None if held is None else (held[0], held[1], engine.writer.get(held[1], -1)) for held in pool]
            for pool in engine.cell_pools]
        self.next_content = max(engine.writer, default=-1) + 1

    def live(self) -> list[int]:
        got = self._ask("live", {})
        return [v for v in got.value if type(v) is int] if got.ok and isinstance(got.value, list) else []

    def after_entry(self) -> None:
        """What the entry call itself did, as far as its answer tells: an id handed out starts an
        incarnation, a declaration opens a forward, a CellStep is executed; then the table is judged."""
        if self.call is None:
            return
        method, args, answer = self.call
        if answer.ok and method in ("seq_new", "seq_clone") and type(answer.value) is int:
            self.handed_out(method, answer.value, args)
        elif answer.ok and method == "declare_step" and answer.value is True and isinstance(args["seq_ids"], list):
            self.declared, self.placed, self.served = list(args["seq_ids"]), None, set()
        elif method == "place_step":
            self.placed_step(args["layer"], args["positions"], answer)
        elif answer.ok and method == "clear":
            self.declared, self.placed, self.served = None, None, set()
        if method in ("seq_new", "seq_clone", "declare_step", "seq_rm", "clear"):
            self.check_table(f"after {method}({_show(args)})")

    def run_step(self, step: Step) -> None:
        op = step["op"]
        if op in ("forward", "declare", "place"):
            {"forward": self.forward, "declare": self.declare_op, "place": self.place_op}[op](step)
            return
        args = self.arguments(step)
        self.steps.append({"op": op, **args})
        got = self._ask(op, args)
        if op in ("seq_new", "seq_clone") and got.ok and type(got.value) is int:
            self.handed_out(op, got.value, args)
        if op == "clear" and got.ok:
            self.declared, self.placed, self.served = None, None, set()
        if op in ("seq_new", "seq_clone", "seq_rm", "clear"):
            self.check_table(f"after {op}({_show(args)})")

    def arguments(self, step: Step) -> dict[str, Any]:
        op = step["op"]
        if op == "seq_clone":
            src = self.seq(step["src"])
            return {"src": src, "upto": self.pos(step.get("upto"), src)}
        if op == "seq_rm":
            seq_id = self.seq(step["seq_id"])
            return {"seq_id": seq_id, "p0": self.pos(step["p0"], seq_id), "p1": self.pos(step.get("p1"), seq_id)}
        if op in ("seq_len", "next_pos"):
            return {"seq_id": self.seq(step["seq_id"])}
        if op == "can_extend":
            n = step["n"]
            return {"n": (self._int("free_cells", {}) or 0) + n["free"] if isinstance(n, dict) else n}
        return {}

    def handed_out(self, op: str, seq_id: int, args: dict[str, Any]) -> None:
        """A new incarnation for the id; SAFE-NEW-EMPTY for seq_new."""
        engine = self.engine
        engine.new_incarnation(seq_id, args.get("src") if op == "seq_clone" else None)
        if op == "seq_new":
            for query in ("seq_len", "next_pos"):
                held = self._int(query, {"seq_id": seq_id})
                if held not in (None, 0):
                    raise self._broken("SAFE-NEW-EMPTY", f"seq_new() handed out {seq_id}, and {query}({seq_id}) "
                                                         f"is {held}: the new sequence owns what another wrote")

    # --- argument resolution against the target's own answers ------------------------------------------
    def seq(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        ids = sorted(set(self.live()))
        if "live" in value:
            return ids[value["live"] % len(ids)] if ids else 0
        if "dead" in value:
            return next((i for i in range(self.max_seqs) if i not in ids), self.max_seqs) + value["dead"]
        return value

    def newest(self, seq_id: Any) -> int:
        """One past the sequence's newest position, as the target says (0 when it cannot say)."""
        got = self._int("next_pos", {"seq_id": seq_id}) if type(seq_id) is int else None
        return got if got is not None and got >= 0 else 0

    def pos(self, value: Any, seq_id: Any) -> Any:
        if not isinstance(value, dict):
            return value
        if "next" in value:
            return self.newest(seq_id) + value["next"]
        if "back" in value:
            return max(0, self.newest(seq_id) - value["back"])
        return value

    def positions(self, seq_ids: list[Any], specs: Any) -> Any:
        return resolve_positions(seq_ids, specs, self.pos)

    def layer(self, value: Any) -> Any:
        return self.n_layers + value["n"] if isinstance(value, dict) and "n" in value else value

    # --- a forward ---------------------------------------------------------------------------------------
    def forward(self, step: Step) -> None:
        seqs = [self.seq(v) for v in step["seqs"]]
        positions = self.positions(seqs, step.get("positions"))
        layers = list(range(self.n_layers))
        if step.get("order") == "reverse":
            layers.reverse()
        layers = layers[:step["stop"]] if "stop" in step else layers
        self.steps.append({"op": "forward", "seqs": seqs, "positions": positions,
                           **{k: step[k] for k in ("order", "stop") if k in step}})
        if self.declare(seqs):
            for layer in layers:
                self.place(layer, positions)

    def declare_op(self, step: Step) -> None:
        seqs = step["seqs"]
        seq_ids = [self.seq(v) for v in seqs] if isinstance(seqs, list) else seqs
        self.steps.append({"op": "declare", "seqs": seq_ids})
        self.declare(seq_ids)

    def place_op(self, step: Step) -> None:
        specs = step.get("positions", "open")
        if specs == "open":
            positions = self.placed[0] if self.placed is not None else self.positions(self.declared or [], None)
        else:
            positions = self.positions(self.declared or [], specs)
        layer = self.layer(step.get("layer", 0))
        self.steps.append({"op": "place", "layer": layer, "positions": positions})
        self.place(layer, positions)

    def declare(self, seq_ids: Any) -> bool:
        got = self._ask("declare_step", {"seq_ids": seq_ids})
        if got.ok and got.value is True:
            self.declared, self.placed, self.served = list(seq_ids), None, set()
            return True
        return False

    def place(self, layer: Any, positions: Any) -> None:
        """place_step; a CellStep it answers is executed on the harness's pools, then SAFE-* judged."""
        self.placed_step(layer, positions, self._ask("place_step", {"layer": layer, "positions": positions}))

    def placed_step(self, layer: Any, positions: Any, got: Outcome) -> None:
        if not got.ok or not isinstance(got.value, dict):
            return
        shown = f"place_step({layer}, {positions})"
        step = self.step_shape(shown, got.value, positions)
        if type(layer) is not int or not 0 <= layer < self.n_layers:
            raise self._broken("SAFE-STEP-SHAPE", f"{shown} answered a CellStep for a layer that does not exist")
        seq_ids = self.declared or [None] * step.length
        if self.placed is None:
            contents = list(range(self.next_content, self.next_content + step.length))
            self.next_content += step.length
            self.placed = (list(positions) if isinstance(positions, (list, tuple)) else [], list(step.cells), contents)
        self.write(layer, step, seq_ids)
        self.read(shown, layer, step, seq_ids, self.placed[0])
        self.served.add(layer)
        if len(self.served) == self.n_layers:
            self.declared, self.placed, self.served = None, None, set()
        self.check_table(f"after {shown}")

    def step_shape(self, shown: str, value: Any, positions: Any) -> cm.CellStep:
        step = step_from_json(value)
        if isinstance(step, str):
            raise self._broken("SAFE-STEP-SHAPE", f"{shown}: {step}")
        # one cell per declared token (per position when the harness saw no declaration)
        tokens = len(self.declared) if self.declared is not None else \
            len(positions) if isinstance(positions, list) else -1
        cells, n = step.cells, step.read_len
        if (step.length != tokens or len(cells) != tokens or len(set(cells)) != len(cells)
                or not 0 <= n <= self.capacity or any(not 0 <= c < n for c in cells)
                or len(step.mask_bits) != step.length * n or any(b not in (0, 1) for b in step.mask_bits)):
            raise self._broken("SAFE-STEP-SHAPE", f"{shown}: length {step.length}, read_len {n}, cells {cells}, "
                                                  f"{len(step.mask_bits)} mask bytes for {tokens} tokens")
        return step

    def write(self, layer: int, step: cm.CellStep, seq_ids: list[Any]) -> None:
        """Each token's content (drawn at the forward's first layer) in its cell of this layer's pool."""
        assert self.placed is not None
        positions, _, contents = self.placed
        for i, cell in enumerate(step.cells):
            position = positions[i] if i < len(positions) and type(positions[i]) is int else -1
            incarnation = self.engine.incarnation.get(seq_ids[i], -1) if i < len(seq_ids) else -1
            self.pools[layer][cell] = (position, contents[i] if i < len(contents) else -1, incarnation)

    def read(self, shown: str, layer: int, step: cm.CellStep, seq_ids: list[Any], positions: list[Any]) -> None:
        """SAFE-ISOLATION on every mask bit of the step."""
        engine = self.engine
        for i in range(step.length):
            incarnation = engine.incarnation.get(seq_ids[i], -1) if i < len(seq_ids) else -1
            lineage = engine.lineage.get(incarnation, frozenset())
            q = positions[i] if i < len(positions) else None
            for j in range(step.read_len):
                if not step.attends(i, j):
                    continue
                held = self.pools[layer][j]
                seq = seq_ids[i] if i < len(seq_ids) else None
                if held is None:
                    raise self._broken("SAFE-ISOLATION", f"{shown}: token {i} (seq {seq}) attends cell {j}, "
                                                         f"which nothing was written to")
                if held[2] not in lineage:
                    raise self._broken("SAFE-ISOLATION", f"{shown}: token {i} (seq {seq}, position {q}) attends "
                                                         f"cell {j}, written at position {held[0]} by "
                                                         f"{self.writer_name(held[2])}: another sequence's cell")
                if type(q) is int and held[0] > q:
                    raise self._broken("SAFE-ISOLATION", f"{shown}: token {i} (seq {seq}, position {q}) attends "
                                                         f"cell {j}, written at the later position {held[0]}")

    def writer_name(self, incarnation: int) -> str:
        holder = self.engine.holder.get(incarnation)
        if holder is None:
            return "no declared sequence"
        return f"sequence {holder}" if self.engine.incarnation.get(holder) == incarnation else \
            f"an earlier holder of id {holder}"

    # --- the table -------------------------------------------------------------------------------------
    def check_table(self, context: str) -> None:
        """SAFE-RANGE and SAFE-NO-STRAY on the target's own answers."""
        live = self.live()
        if len(set(live)) != len(live) or any(not 0 <= i < self.max_seqs for i in live):
            raise self._broken("SAFE-RANGE", f"{context}: live() is {live}")
        counts: dict[str, Optional[int]] = {"free_cells": self._int("free_cells", {}),
                                            "used_end": self._int("used_end", {})}
        for name, value in counts.items():
            if value is not None and not 0 <= value <= self.capacity:
                raise self._broken("SAFE-RANGE", f"{context}: {name}() is {value}, outside [0, {self.capacity}]")
        owned = 0
        for seq_id in live:
            length = self._int("seq_len", {"seq_id": seq_id})
            nxt = self._int("next_pos", {"seq_id": seq_id})
            if length is not None and not 0 <= length <= self.capacity:
                raise self._broken("SAFE-RANGE", f"{context}: seq_len({seq_id}) is {length}, outside "
                                                 f"[0, {self.capacity}]")
            if nxt is not None and not 0 <= nxt <= cm.MAX_POSITION + 1:
                raise self._broken("SAFE-RANGE", f"{context}: next_pos({seq_id}) is {nxt}, outside "
                                                 f"[0, {cm.MAX_POSITION + 1}] (INT_MAX)")
            owned += length or 0
        free = counts["free_cells"]
        if free is not None and self.capacity - free > owned:
            raise self._broken("SAFE-NO-STRAY", f"{context}: {self.capacity - free} cell(s) occupied "
                                                f"(free_cells() {free} of {self.capacity}) but the live sequences "
                                                f"{live} own {owned}: a cell held by an id that is not live")


GAP = -2   # the content of a position no step wrote: no row ever holds it, so a read of it is never sound
FRESH = 10**9   # tags of the drive's own steps start here, above every tag of the lockstep's


class SequenceConsequences(Consequences):
    """The sequence layout's driver: the harness's truth (the content last written at each position, as
    the steps the target accepted wrote it), the target's own pools, and its length."""

    def __init__(self, engine: Engine, entry: Finding, entry_step: Step) -> None:
        super().__init__(engine, entry)
        self.engine: Engine = engine
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


class OpConsequences(Consequences):
    """The op face's driver. The harness's own record, read off what the target accepted: each token
    (uid) with the sequence that wrote it and its position, and the tokens each sequence may attend (its
    own, and its fork sources' at the fork). Every answer's rows are read from their labels
    (op_engine.Labels), so a row names its token, layer, batch row and head exactly."""

    atomic_rule = "OP-ATOMIC"

    def __init__(self, engine: OpEngine, entry: Finding) -> None:
        super().__init__(engine, entry)
        self.engine: OpEngine = engine
        self.cell = engine.kind == op_model.CELL
        m = engine.model
        self.writer: dict[int, int] = {}          # uid -> the sequence that wrote it
        self.position: dict[int, Any] = {}        # uid -> its position, as written
        self.readable: dict[int, set[int]] = {}   # sequence -> the uids it may attend
        for seq, tokens in m.held.items():
            self.readable.setdefault(seq, set()).update(tokens)
            for uid, pos in tokens.items():
                self.writer.setdefault(uid, seq)
                self.position[uid] = pos
        step = m.step
        self.declared: list[Any] = list(step.seqs) if step is not None else list(engine.declared)
        self.step_positions: Optional[list[Any]] = None   # the step in progress: its positions, uids, layers
        self.step_uids: list[int] = []
        self.served: set[int] = set()
        if step is not None and step.positions is not None:
            self.step_positions, self.step_uids, self.served = list(step.positions), list(step.uids), set(step.served)
            if step.served:
                self.wrote(list(step.seqs), list(step.positions), list(step.uids))
        self.lens: dict[int, int] = {seq: m.seq_len(seq) for seq in m.seqs_in_play()} if self.cell else {}
        # a target whose scope leaves out `positions` does not read them: no position of its is judged
        self.judge_positions = "positions" in engine.scope_features()

    def _entry_call(self) -> str:
        return f"{self.call[0]}({_show_op(self.call[1])})" if self.call is not None else "create"

    # --- the record ----------------------------------------------------------------------------------
    def wrote(self, seqs: list[Any], positions: list[Any], uids: list[int]) -> None:
        for seq, pos, uid in zip(seqs, positions, uids):
            self.writer[uid], self.position[uid] = seq, pos
            self.readable.setdefault(seq, set()).add(uid)

    def seqs_of(self, q: int) -> list[Any]:
        return list(self.declared) if self.cell else [0] * q

    # --- the entry and the rest ----------------------------------------------------------------------
    def after_entry(self) -> None:
        """What the entry did: a forward wrote its tokens (its answer judged too, when it named a layer),
        a declaration opened a step, a fork shared its source's tokens."""
        if self.call is None:
            return
        method, args, answer = self.call
        if method == "update_and_fetch" and self.engine.fetched is not None:
            positions, uids = self.engine.fetched
            self.served_fetch(args["layer_id"], positions, uids, answer)
        else:
            self.verb(method, args, answer)

    def run_step(self, step: Step) -> None:
        op = step["op"]
        if op == "fetch":
            self.fetch(step)
            return
        method, args = {"begin": ("begin_step", {"seq_ids": step.get("seqs")}),
                        "cp": ("seq_cp", {"src": step.get("src"), "dst": step.get("dst"), "upto": step.get("upto")}),
                        "rm": ("seq_rm", {"seq": step.get("seq"), "p0": step.get("p0"), "p1": step.get("p1")}),
                        "reset": ("reset", {})}[op]
        self.steps.append(dict(step))
        self.verb(method, args, self._ask(method, args))

    def verb(self, method: str, args: dict[str, Any], answer: Outcome) -> None:
        if answer.ok and answer.value is not False:
            if method == "begin_step" and isinstance(args["seq_ids"], list):
                self.declared, self.step_positions, self.served = list(args["seq_ids"]), None, set()
            elif method == "seq_cp":
                self.readable.setdefault(args["dst"], set()).update(self.readable.get(args["src"], set()))
            elif method == "reset":
                self.readable, self.declared, self.step_positions, self.served = {}, [], None, set()
        self.lens = self.seq_lens()

    def fetch(self, step: Step) -> None:
        engine, layer = self.engine, step.get("layer")
        # the step's own positions; else a cell step has a token per declared owner, a contiguous one n
        q = len(step["positions"]) if "positions" in step else len(self.declared) if self.cell else int(step.get("n", 1))
        positions = list(step["positions"]) if "positions" in step else self.next_positions(layer, q)
        case = case_of(step)
        if case is not None and case.clause.kind == POSITIONS and positions and "positions" not in step:
            newest = positions[0] - 1 if not self.cell else -1
            positions = malformed_positions(case.variant, positions + [positions[-1] + 1], newest) or positions
            q = len(positions)
        continuing = self.step_positions is not None and layer not in self.served and positions == self.step_positions
        if continuing:
            uids = list(self.step_uids)
        else:
            shapes = engine.shapes(q, case)
            uids = engine.fresh_uids(max([q] + [s[-2] for s in (shapes.k, shapes.v) if len(s) >= 2]))
            self.step_positions, self.step_uids, self.served = positions, uids, set()
        args, _ = engine.arguments(layer, positions, uids, case)
        concrete: Step = {"op": "fetch", "layer": layer, "positions": positions, **(case.tag() if case else {})}
        self.steps.append(concrete)
        self.served_fetch(layer, positions, uids[:q], self._ask("update_and_fetch", args))

    def next_positions(self, layer: Any, q: int) -> list[int]:
        """Positions for a step that names none: the cell cache's next of each declared sequence (by the
        record), the contiguous cache's used length (its own answer)."""
        if not self.cell:
            start = self._int("used", {"layer_id": layer})
            return list(range(start or 0, (start or 0) + q))
        newest = {seq: max((p for u in self.readable.get(seq, set()) if type(p := self.position.get(u)) is int),
                           default=-1) for seq in set(self.declared)}
        out = []
        for seq in self.declared:
            newest[seq] += 1
            out.append(newest[seq])
        return out

    def served_fetch(self, layer: Any, positions: list[Any], uids: list[int], answer: Outcome) -> None:
        """An update_and_fetch answered: its tokens are written; SAFE-OP-ISOLATION on its rows (when it
        named a layer), SAFE-OP-KEEP on the sequences it has no token of."""
        if not answer.ok:
            self.lens = self.seq_lens()
            return
        seqs = self.seqs_of(len(uids))
        self.wrote(seqs, positions, uids)
        if type(layer) is int and 0 <= layer < self.engine.mcfg.n_layers:
            self.served.add(layer)
            self.isolation(layer, seqs, positions, answer.value)
        before, self.lens = self.lens, self.seq_lens()
        for seq, was in before.items():
            now = self.lens.get(seq)
            if seq not in seqs and now is not None and now < was:
                raise self._broken("SAFE-OP-KEEP", f"the forward of sequences {seqs} at positions {positions} on "
                                                   f"layer {layer} lowered seq_len({seq}) from {was} to {now}")

    def seq_lens(self) -> dict[int, int]:
        if not self.cell:
            return {}
        seqs = sorted({s for s in self.readable if type(s) is int} | {s for s in self.declared if type(s) is int})
        lens = {seq: self._int("seq_len", {"seq": seq}) for seq in seqs}
        return {seq: n for seq, n in lens.items() if n is not None}

    def isolation(self, layer: int, seqs: list[Any], positions: list[Any], value: Any) -> None:
        engine = self.engine
        k_value, v_value, spec = value   # a shape the driver cannot follow ends the drive, said in the report
        k_hist, v_hist = as_array(k_value), as_array(v_value)
        q = len(positions)
        allowed = allowed_rows(spec, q, k_hist.shape[2])
        if isinstance(allowed, str):
            raise ValueError(allowed)
        for b in range(k_hist.shape[0]):
            for h in range(k_hist.shape[1]):
                k_uids = engine.labels.uid_of(k_hist[b, h], layer, b, h, 0)
                v_uids = engine.labels.uid_of(v_hist[b, h], layer, b, h, 1)
                for i in range(q):
                    for row in np.flatnonzero(allowed[i]):
                        uid = int(k_uids[row])
                        where = f"query {i} (sequence {seqs[i]}, position {positions[i]}, batch {b}, head {h}) " \
                                f"on layer {layer} attends row {row}"
                        if uid < 0 or v_uids[row] != uid:
                            raise self._broken("SAFE-OP-ISOLATION", f"{where}, whose K {_row(k_hist[b, h, row])} / "
                                                                    f"V {_row(v_hist[b, h, row])} are not one token's "
                                                                    "written for this layer, batch row and head")
                        if uid not in self.readable.get(seqs[i], set()):
                            whose = f"of sequence {self.writer[uid]}" if uid in self.writer else \
                                "which no call the target accepted wrote"
                            raise self._broken("SAFE-OP-ISOLATION", f"{where}: token {uid}, {whose}; sequence "
                                                                    f"{seqs[i]} neither wrote it nor was forked from "
                                                                    "its writer")
                        pos, own = self.position.get(uid), positions[i]
                        if self.judge_positions and type(pos) is int and type(own) is int and pos > own:
                            raise self._broken("SAFE-OP-ISOLATION", f"{where}: token {uid} at position {pos}, "
                                                                    "after the query's")

    def check_table(self, context: str) -> None:
        """Nothing more at the end: every answer was judged as it came."""
