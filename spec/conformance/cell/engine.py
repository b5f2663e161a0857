"""The cell layout's engine: the engine core (../engine.py) with the cell model's verbs and checks.

`CellEngine` inherits the core's whole grading machinery - the
finding classes (`Engine.checked`: wrong, crash, lenient, over-strict), the answer-type check, the
coverage events, creation and SCOPE-BORDER, the program loop - and replaces only what is layout
specific: the model's verdict of a call (`spec/cell_model.py`), what is observed after a call (the
queries of the cell table), the backend (every CellStep a target returns is executed on a data-level
pool of our own per layer by `cell_model.execute_step`, so a wrong mask is a CELL-DATA-SOUND finding
whatever cells the target chose), and the program ops (spec/PROTOCOL.md, "Cell programs").

Arguments may be relative so that a shrunk program still means what it meant: a seq id {"live": k}
is the k-th live id (modulo their number), {"dead": 0} the lowest id that is not live, {"max_seqs": d} max_seqs + d; a position
{"next": d} is the sequence's next position + d (token by token inside one step); {"back": k} is
max(0, next position - k); can_extend's {"free": d} is free_cells() + d; a layer {"n": d} is
n_layers + d. Exact layout conformance (CELL-LAYOUT-CANON) is recorded separately, as for sequences.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from ... import cell_model as cm
from ... import model
from ..configs import JsonConfig, to_model
from ..engine import LENIENT, WRONG, Accepted, Drive, Engine, Refused, Step, Stop, Verdict, _same, _show
from ..targets import Outcome

# The rule a wrong answer (or a refusal) of each method breaks, and the answer's JSON type.
CELL_RULES: dict[str, str] = {
    "seq_new": "CELL-NEW", "seq_clone": "CELL-FORK", "seq_rm": "CELL-RM", "declare_step": "CELL-DECLARE",
    "place_step": "CELL-PLACE", "seq_len": "CELL-OWNERS", "next_pos": "CELL-OWNERS", "live": "CELL-OWNERS",
    "free_cells": "CELL-USED-END", "used_end": "CELL-USED-END", "can_extend": "CELL-USED-END",
    "capacity": "CELL-USED-END", "clear": "CELL-CLEAR", "faces": "FACES",
}
CELL_ANSWER_TYPES: dict[str, tuple[type, ...]] = {
    "seq_new": (int,), "seq_clone": (int,), "seq_rm": (bool,), "declare_step": (bool,), "place_step": (dict,),
    "seq_len": (int,), "next_pos": (int,), "live": (list,), "free_cells": (int,), "used_end": (int,),
    "can_extend": (bool,), "capacity": (int,), "faces": (dict,),
}
VERBS = ("seq_new", "seq_clone", "seq_rm", "seq_len", "next_pos", "can_extend", "free_cells", "used_end",
         "live", "capacity", "faces", "clear")


def to_cell_model(cfg: JsonConfig) -> Union[cm.CellConfig, model.Rejected]:
    """The cell model's reading of a JSON config: the sequence fields plus `max_seqs`."""
    base = to_model(cfg)
    if isinstance(base, model.Rejected):
        return base
    max_seqs = cfg.get("max_seqs", cm.MAX_SEQS)
    if not model._is_int(max_seqs) or not 1 <= max_seqs <= cm.MAX_SEQS:
        return model.Rejected("CELL-MAX-SEQS", "max_seqs")
    return cm.CellConfig(base, max_seqs)


def resolve_positions(seq_ids: list[Any], specs: Any, pos: Callable[[Any, Any], Any]) -> Any:
    """One position per token: specs (default {"next": 0} each) resolved token by token - a later token
    of a sequence continues from the earlier one; `pos(spec, seq_id)` resolves the first."""
    if not isinstance(specs, (list, type(None))):
        return specs
    specs = specs if specs is not None else [{"next": 0}] * len(seq_ids)
    newest: dict[Any, int] = {}
    out: list[Any] = []
    for i, spec in enumerate(specs):
        seq_id = seq_ids[i] if i < len(seq_ids) else None
        if isinstance(spec, dict) and seq_id in newest and "next" in spec:
            value: Any = newest[seq_id] + 1 + spec["next"]
        else:
            value = pos(spec, seq_id)
        if model._is_int(value):
            newest[seq_id] = value
        out.append(value)
    return out


def step_from_json(value: Any) -> Union[cm.CellStep, str]:
    """A target's CellStep JSON ({"length", "read_len", "cells", "mask_bits"}) as the model's CellStep,
    or what is wrong with its shape (CELL-STEP-SHAPE)."""
    if not isinstance(value, dict) or "unreadable" in value:
        return f"not a CellStep: {value!r}"[:200]
    length, read_len, cells, bits = (value.get(k) for k in ("length", "read_len", "cells", "mask_bits"))
    if type(length) is not int or type(read_len) is not int or not isinstance(cells, list) \
            or not isinstance(bits, list) or not all(type(x) is int for x in cells + bits):
        return f"CellStep fields of the wrong types: {value!r}"[:200]
    if any(not 0 <= b <= 255 for b in bits):
        return f"mask_bits values outside a byte: {sorted(set(bits))[:6]}"
    return cm.CellStep(length, read_len, tuple(cells), bytes(bits))


def model_answer(c: cm.CellConfig, s: cm.CellState, method: str,
                 args: dict[str, Any]) -> Union[model.Rejected, tuple[Any, cm.CellState]]:
    """The cell model's answer to one protocol call (its JSON answer for the queries, the model's
    CellStep for place_step) and the state after it, or the rejection."""
    if method == "clear":
        return None, cm.clear(c, s)
    queries: dict[str, Any] = {"capacity": lambda: c.capacity, "faces": lambda: {"same_object": True},
                               "live": lambda: sorted(cm.live(s)), "free_cells": lambda: cm.free_cells(c, s),
                               "used_end": lambda: cm.used_end(s)}
    if method in queries:
        return queries[method](), s
    if method in ("seq_len", "next_pos", "can_extend"):
        answer = getattr(cm, method)(c, s, *args.values())
        return answer if isinstance(answer, model.Rejected) else (answer, s)
    if method not in CELL_RULES:
        raise ValueError(f"unknown cell method {method}")
    result: Union[model.Rejected, tuple[Any, cm.CellState]] = getattr(cm, method)(c, s, *args.values())
    return result


class CellEngine(Engine):
    """One cell program on one target; a fresh cache per program."""

    answer_types = CELL_ANSWER_TYPES

    def __init__(self, target: Any, cfg: JsonConfig, exact: bool = False, light: bool = False,
                 scope: Any = None, row_budget: Optional[int] = None, drive: Optional[Drive] = None) -> None:
        super().__init__(target, cfg, exact, light, scope, row_budget, drive)
        ccfg = to_cell_model(cfg)   # the sequence fields' rejection first, then max_seqs'
        if isinstance(ccfg, model.Rejected):
            self.rejected_config = ccfg
            base = to_model(cfg)
            ccfg = cm.CellConfig(base if isinstance(base, model.Config) else
                                 model.Config(1, (model.Layer(model.FLAT, 0, None),)), 1)
        self.ccfg = ccfg
        self.cs = cm.initial(ccfg)
        self.next_state = self.cs             # the model's state after the call `verdict` judged
        self.cell_pools: list[cm.Pool] = [(None,) * ccfg.capacity for _ in ccfg.layers]
        self.ever_live: set[int] = set()
        # Who wrote what, for the consequences of a lenient step (consequences.py): every id handed out
        # starts an incarnation; a fork's lineage holds its source's; each content id has its writer.
        self.incarnation: dict[int, int] = {}          # id -> its current incarnation
        self.holder: dict[int, int] = {}               # incarnation -> id
        self.lineage: dict[int, frozenset[int]] = {}   # incarnation -> the incarnations it may read
        self.writer: dict[int, int] = {}               # content id -> incarnation

    def _fail(self, kind: str, rule: str, message: str, detail: str = "") -> Stop:
        """A finding with the model's cells as the failing step found them (its picture, drawn by the HTML
        report): the position and content each cell holds, and its owners."""
        stop = super()._fail(kind, rule, message, detail)
        stop.finding.picture = {"cells": {"layout": "cell", "cells": [
            {"cell": cell, "position": None if held is None else held[0], "token": None if held is None else held[1],
             "owners": sorted(cm.owners(self.cs, cell))} for cell, held in enumerate(self.cs.written)]}}
        return stop

    def new_incarnation(self, seq_id: int, src: Any = None) -> None:
        """`seq_id` was handed out (by seq_new, or by seq_clone of `src`): another sequence from now on."""
        number = len(self.holder)
        source = self.lineage.get(self.incarnation.get(src, -1), frozenset()) if src is not None else frozenset()
        self.incarnation[seq_id], self.holder[number] = number, seq_id
        self.lineage[number] = source | {number}

    def _check_type(self, method: str, args: dict[str, Any], outcome: Outcome, rule: str) -> None:
        """A mistyped answer breaks the rule of the method that gave it (seq_len answering "0" is
        CELL-OWNERS), not the rule of the step being checked when the harness asked."""
        super()._check_type(method, args, outcome, CELL_RULES.get(method, rule))

    # --- the model's verdicts ----------------------------------------------------------------------
    def verdict(self, method: str, args: dict[str, Any]) -> Verdict:
        rule = CELL_RULES[method]
        got = model_answer(self.ccfg, self.cs, method, args)
        if isinstance(got, model.Rejected):
            return got
        answer, self.next_state = got
        if answer is None and method in ("seq_new", "seq_clone") or answer is False and method == "declare_step":
            return Refused(rule)
        return Accepted(answer, rule)

    # --- observation -------------------------------------------------------------------------------
    def observe(self, context: str, rule: str, lenient_rule: Optional[str] = None, retained: bool = True) -> None:
        """Compare the table's queries with the model: live(), free_cells(), used_end() (while the
        layout is canonical: another placement has another extent), and seq_len / next_pos of each
        live id. A difference after a rejected call is lenient (it partly accepted the call)."""
        rule = {"ATOMIC": "CELL-ATOMIC", "LEN-BOUNDS": "CELL-OWNERS"}.get(rule, rule)
        c, s = self.ccfg, self.cs
        expected: list[tuple[str, dict[str, Any], Any]] = [("free_cells", {}, cm.free_cells(c, s))]
        if "live" in self.target.optional:   # else the live set shows through seq_new, seq_len, declare_step
            expected.insert(0, ("live", {}, sorted(cm.live(s))))
        if not self.result.layout:
            expected.append(("used_end", {}, cm.used_end(s)))
        if not self.light:
            for seq_id in sorted(cm.live(s)):
                expected += [("seq_len", {"seq_id": seq_id}, cm.seq_len(c, s, seq_id)),
                             ("next_pos", {"seq_id": seq_id}, cm.next_pos(c, s, seq_id))]
        for method, args, want in expected:
            got = self._call(method, args, rule)
            if not got.ok or not _same(got.value, want):
                kind = LENIENT if lenient_rule else WRONG
                seen = got.value if got.ok else got.error
                raise self._fail(kind, lenient_rule or rule, f"{context}: {method}({_show(args)}) is {seen!r}, "
                                                             f"the spec says {want!r}")

    def open_step_kept(self, context: str) -> None:
        """CELL-ATOMIC for an open forward is seen by the next place_step of the program."""

    # --- creation ----------------------------------------------------------------------------------
    def after_create(self) -> None:
        if self.light:
            return
        _, capacity = self.checked("capacity", {})
        if not _same(capacity.value, self.ccfg.capacity):
            raise self._fail(WRONG, "CELL-USED-END", f"capacity() is {capacity.value!r}, not {self.ccfg.capacity}")
        _, faces = self.checked("faces", {})
        if faces.value != {"same_object": True}:
            raise self._fail(WRONG, "FACES", f"as_batch_control() and as_cell_stepper() are not one object: "
                                             f"{faces.value}")
        self.observe("after create", "CELL-CLEAR")

    # --- argument resolution -----------------------------------------------------------------------
    def seq(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        ids = sorted(cm.live(self.cs))
        if "live" in value:
            return ids[value["live"] % len(ids)] if ids else 0
        if "dead" in value:
            return next((i for i in range(self.ccfg.max_seqs) if i not in ids), self.ccfg.max_seqs) + value["dead"]
        if "max_seqs" in value:
            return self.ccfg.max_seqs + value["max_seqs"]
        return value

    def pos(self, value: Any, seq_id: Any) -> Any:
        """{"next": d}, {"back": k} relative to the sequence's next position (0 for a dead id)."""
        if not isinstance(value, dict):
            return value
        past = cm.history(self.cs, seq_id) if model._is_int(seq_id) else None
        nxt = past[-1][0] + 1 if past else 0
        if "next" in value:
            return nxt + value["next"]
        if "back" in value:
            return max(0, nxt - value["back"])
        return value

    def positions(self, seq_ids: list[Any], specs: Any) -> Any:
        return resolve_positions(seq_ids, specs, self.pos)

    def layer(self, value: Any) -> Any:
        return len(self.ccfg.layers) + value["n"] if isinstance(value, dict) and "n" in value else value

    # --- the program ---------------------------------------------------------------------------------
    def run_step(self, step: Step) -> Optional[Step]:
        op = step["op"]
        if op == "forward":
            return self.forward(step)
        if op == "declare":
            seqs = step["seqs"]
            args = {"seq_ids": [self.seq(v) for v in seqs] if isinstance(seqs, list) else seqs}
            return self.verb("declare_step", args)
        if op == "place":
            return self.place_op(step)
        args = {}
        if op == "seq_clone":
            src = self.seq(step["src"])
            args = {"src": src, "upto": self.pos(step.get("upto"), src)}
        elif op == "seq_rm":
            seq_id = self.seq(step["seq_id"])
            args = {"seq_id": seq_id, "p0": self.pos(step["p0"], seq_id), "p1": self.pos(step.get("p1"), seq_id)}
        elif op in ("seq_len", "next_pos"):
            args = {"seq_id": self.seq(step["seq_id"])}
        elif op == "can_extend":
            n = step["n"]
            args = {"n": cm.free_cells(self.ccfg, self.cs) + n["free"] if isinstance(n, dict) else n}
        elif op not in VERBS:
            raise ValueError(f"unknown cell step op {op!r}")
        elif op == "live" and "live" not in self.target.optional:
            self.result.skipped.add("live() absent: the live ids are checked through seq_new, seq_len, next_pos "
                                    "and declare_step only")
            return None
        return self.verb(op, args)

    def verb(self, method: str, args: dict[str, Any]) -> Step:
        """One checked call; the model follows an accepted one, then the table is observed."""
        concrete = {"op": {"declare_step": "declare"}.get(method, method), **args}
        if method == "declare_step":
            concrete = {"op": "declare", "seqs": args["seq_ids"]}
        self.result.steps.append(concrete)
        live_before = cm.live(self.cs)
        verdict, outcome = self.checked(method, args)
        if isinstance(verdict, Accepted):
            if method not in ("clear", "declare_step") and not _same(outcome.value, verdict.value):
                raise self._fail(WRONG, verdict.rule, f"{method}({_show(args)}) is {outcome.value!r}, "
                                                      f"the spec says {verdict.value!r}")
            self.cs = self.next_state
            if method in ("seq_new", "seq_clone") and verdict.value is not None:
                self.new_incarnation(verdict.value, args.get("src"))
            if method in ("seq_new", "seq_clone") and verdict.value in self.ever_live - live_before:
                self.result.exercised.add("CELL-ID-REUSE")   # a reused id: the observations below check it
            self.ever_live |= cm.live(self.cs)
            if method == "clear":
                self.cell_pools = [(None,) * self.ccfg.capacity for _ in self.ccfg.layers]
            if method in ("seq_new", "seq_clone", "seq_rm", "clear"):
                self.observe(f"after {method}({_show(args)})", verdict.rule)
        return self.result.steps.pop()

    def place(self, layer: Any, positions: Any) -> None:
        """One checked place_step; an accepted one's CellStep is executed on the layer's pool."""
        args = {"layer": layer, "positions": positions}
        before = self.cs
        verdict, outcome = self.checked("place_step", args)
        if not isinstance(verdict, Accepted):
            return
        after = self.next_state
        forward = before.forward
        assert forward is not None
        if forward.positions is None:
            forward = cm.placement(self.ccfg, before, positions).forward
            assert forward is not None
        shown = f"place_step({layer}, {positions})"
        got = step_from_json(outcome.value)
        if isinstance(got, str):
            raise self._fail(WRONG, "CELL-STEP-SHAPE", f"{shown}: {got}")
        self.cell_pools[layer], problems = cm.execute_step(self.ccfg, after, forward, layer, self.cell_pools[layer], got)
        if problems:
            rule = problems[0].split(":", 1)[0]
            raise self._fail(WRONG, rule, f"executing {shown}'s CellStep {cm.mask_rows(got)} (cells {got.cells}): "
                                          + "; ".join(problems[:3]))
        self._exercise("cell step executed")
        assert forward.contents is not None
        for seq_id, content in zip(forward.seq_ids, forward.contents):
            self.writer[content] = self.incarnation.get(seq_id, -1)
        if got != verdict.value:
            self._layout(f"{shown} is cells {got.cells} mask {cm.mask_rows(got)}, canonical "
                         f"cells {verdict.value.cells} mask {cm.mask_rows(verdict.value)}")
        self.cs = after

    def forward(self, step: Step) -> Optional[Step]:
        """declare_step, then place_step on the layers (in order, reversed, or the first `stop` only)."""
        seqs = [self.seq(v) for v in step["seqs"]]
        positions = self.positions(seqs, step.get("positions"))
        concrete: Step = {"op": "forward", "seqs": seqs, "positions": positions}
        layers = list(range(len(self.ccfg.layers)))
        if step.get("order") == "reverse":
            layers.reverse()
            concrete["order"] = "reverse"
        if "stop" in step:
            layers = layers[:step["stop"]]
            concrete["stop"] = step["stop"]
        self.result.steps.append(concrete)
        verdict, _ = self.checked("declare_step", {"seq_ids": seqs})
        if isinstance(verdict, Accepted):
            self.cs = self.next_state
            for layer in layers:
                self.place(layer, positions)
        return self.result.steps.pop()

    def place_op(self, step: Step) -> Optional[Step]:
        """A bare place_step: positions "open" are the open forward's (placed or not yet)."""
        forward = self.cs.forward
        specs = step.get("positions", "open")
        if specs == "open":
            positions: Any = list(forward.positions) if forward and forward.positions is not None else \
                self.positions(list(forward.seq_ids) if forward else [], None)
        else:
            positions = self.positions(list(forward.seq_ids) if forward else [], specs)
        layer = self.layer(step.get("layer", 0))
        concrete = {"op": "place", "layer": layer, "positions": positions}
        self.result.steps.append(concrete)
        self.place(layer, positions)
        return self.result.steps.pop()
