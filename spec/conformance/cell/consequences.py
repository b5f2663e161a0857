"""The cell layout's consequences: past a lenient or over-strict step, the program goes on with that
step applied and only the safety properties (../consequences.py, SAFETY) are judged. Writers are
tracked by *incarnation*: every id the target hands out (seq_new, seq_clone) starts a new one, so an
id handed out again is another sequence; a fork may read what its source's lineage wrote."""

from __future__ import annotations

from typing import Any, Optional

from ... import cell_model as cm
from ..consequences import Consequences
from ..engine import Finding, Step, _show
from ..targets import Outcome
from .engine import CellEngine, resolve_positions, step_from_json

Written = tuple[int, int, int]   # what the harness wrote in a cell: (position, content, incarnation)


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
        # the entry was inside a forward (open in the model, or the entry declares or places): the drive
        # goes on to the forward's end and then hands out new ids (finish)
        self.in_forward = forward is not None or (self.call is not None and self.call[0] in ("declare_step",
                                                                                           "place_step"))
        # the live ids as far as the harness knows them, for a target without live() (upstream's live set
        # is private): the model's at the entry, every id handed out since, less one a removal emptied
        self.known_live: set[int] = set(cm.live(engine.cs))
        self.named = self.known_live | {s for s in self.declared or [] if type(s) is int}   # every id the drive met
        # the harness's pools: what it wrote in each cell of each layer, with the writer's incarnation
        self.pools: list[list[Optional[Written]]] = [
            [None if held is None else (held[0], held[1], engine.writer.get(held[1], -1)) for held in pool]
            for pool in engine.cell_pools]
        self.next_content = max(engine.writer, default=-1) + 1

    def live(self) -> list[int]:
        if "live" not in self.engine.target.optional:
            return sorted(self.known_live)
        got = self._ask("live", {})
        return [v for v in got.value if type(v) is int] if got.ok and isinstance(got.value, list) else []

    def removed(self, args: dict[str, Any], answer: Outcome) -> None:
        """A removal served (answered True; False is a refusal, which changes nothing): an id left owning
        nothing is no longer live (CELL-RM), as far as the harness knows."""
        seq_id = args["seq_id"]
        if answer.ok and answer.value is True and type(seq_id) is int and self._int("seq_len", {"seq_id": seq_id}) == 0:
            self.known_live.discard(seq_id)

    def finish(self) -> None:
        """Past a step served inside a forward, the program goes on as a runner would: the forward's layers
        not yet served are placed (for the ids it declared, a removed one too), then new ids are handed out,
        one per id the program named and one more - each judged by SAFETY (a removed id handed out again
        owning the cell its forward placed: SAFE-NEW-EMPTY, SAFE-NO-STRAY)."""
        if not self.in_forward:
            return
        if self.declared is not None:
            positions = self.placed[0] if self.placed is not None else self.positions(self.declared, None)
            for layer in range(self.n_layers):
                if layer not in self.served and self.declared is not None:
                    self.steps.append({"op": "place", "layer": layer, "positions": positions})
                    self.place(layer, positions)
        for _ in range(len(self.named) + 1):
            self.steps.append({"op": "seq_new"})
            got = self._ask("seq_new", {})
            if not got.ok or type(got.value) is not int:
                break
            self.handed_out("seq_new", got.value, {})
            self.check_table("after seq_new()")

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
            self.named |= {s for s in args["seq_ids"] if type(s) is int}
        elif method == "place_step":
            self.placed_step(args["layer"], args["positions"], answer)
        elif answer.ok and method == "clear":
            self.declared, self.placed, self.served, self.known_live = None, None, set(), set()
        elif method == "seq_rm":
            self.removed(args, answer)
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
            self.declared, self.placed, self.served, self.known_live = None, None, set(), set()
        if op == "seq_rm":
            self.removed(args, got)
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
        self.known_live.add(seq_id)
        self.named.add(seq_id)
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
            self.named |= {s for s in seq_ids if type(s) is int}
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
            if not step.attends(i, step.cells[i]):
                raise self._broken("SAFE-SELF", f"{shown}: token {i} does not attend its own cell {step.cells[i]}")
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
            known = "" if "live" in self.engine.target.optional else \
                " (live as the harness saw ids handed out and emptied: the target has no live())"
            raise self._broken("SAFE-NO-STRAY", f"{context}: {self.capacity - free} cell(s) occupied "
                                                f"(free_cells() {free} of {self.capacity}) but the live sequences "
                                                f"{live}{known} own {owned}: a cell held by an id that is not live")


def drive_on(engine: Any, program: list[Step], entry: Finding) -> None:
    """The engine's drive past a lenient or over-strict entry (engine.Drive)."""
    CellConsequences(engine, entry).drive(Consequences.rest(program, entry))
