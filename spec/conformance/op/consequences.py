"""The op face's consequences: past a lenient or over-strict step, the program goes on with that step
applied and only the safety properties (../consequences.py, SAFETY) are judged, on the labels of every
answer's rows (answers.Labels)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ... import op_model
from .. import scope as scopes
from ..consequences import UNACCEPTED_TOKEN, Consequences
from ..engine import OVER_STRICT, Finding, Step, Stop
from ..malform import POSITIONS, case_of, int_value, malformed_positions
from ..targets import Outcome
from .answers import allowed_rows, as_array, row_text, show_args
from .engine import KV_LENGTHS, OpEngine
from .persist import STATE_OPS
from .pictures import attend_picture
from .programs import BATCH_OPS, QUANTIZE, trim_n


class OpConsequences(Consequences):
    """The op face's driver. The harness's own record, read off what the target accepted: each token
    (uid) with the sequence that wrote it and its position, and the tokens each sequence may attend (its
    own, and its fork sources' at the fork). Every answer's rows are read from their labels
    (answers.Labels), so a row names its token, layer, batch row and head exactly."""

    atomic_rule = "OP-ATOMIC"

    def __init__(self, engine: OpEngine, entry: Finding) -> None:
        super().__init__(engine, entry)
        self.engine: OpEngine = engine
        self.cell = engine.kind == op_model.CELL
        # past a refusal of a call the model served, the target is where the model was before that call
        m = engine.before_call if entry.kind == OVER_STRICT and engine.before_call is not None else engine.model
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
        # SAFE-OP-COMPLETE: the tokens each sequence is owed - every layer served them in well-formed calls
        # the target accepted, and nothing it accepted removed them since - and whether the step in progress
        # is well-formed so far
        self.owed: dict[Any, set[int]] = {seq: set(tokens) for seq, tokens in m.held.items()}
        self.step_clean = True
        # a target whose scope leaves out `positions` does not read them: no position of its is judged
        self.judge_positions = "positions" in engine.scope_features()

    def _entry_call(self) -> str:
        return f"{self.call[0]}({show_args(self.call[1])})" if self.call is not None else "create"

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
            continued = self.step_positions == list(positions) and list(self.step_uids) == list(uids)
            if answer.ok and not continued:   # the entry began a step of its own: the next layers continue it
                self.step_positions, self.step_uids, self.served, self.step_clean = list(positions), list(uids), set(), True
            self.served_fetch(args["layer_id"], positions, uids, answer, _one_token_each(args, len(positions)),
                              _well_formed(self.engine, args, len(positions)))
        else:
            self.verb(method, args, answer)

    def run_step(self, step: Step) -> None:
        op = step["op"]
        if op == "fetch":
            self.fetch(step)
            return
        if op == "trim":
            self.trim(step)
            return
        if op in BATCH_OPS:   # sent to no target driven here (OpEngine.run: only one without the batch features)
            return
        if op == QUANTIZE:   # OP-QUANTIZE: sent to no target driven here (OpEngine.run drives no such program)
            raise ValueError("a quantize: the record reads every row exactly")
        if op in STATE_OPS:   # OP-STATE: the record cannot see into a state (said in the report, never a pass)
            raise ValueError("a state saved or loaded: the record does not follow a cache's state across a load")
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
            elif method == "trim":
                self.trimmed(args["n"])
            self.owed_after_verb(method, args)
        self.lens = self.seq_lens()

    def trim(self, step: Step) -> None:
        """trim(n), as the lockstep sends it (a target without the `trim` feature is sent none); a malformed
        n is the lockstep's too (one more than the record holds)."""
        if "trim" not in self.engine.scope_features():
            return
        n = trim_n(step, len(self.committed()))
        case = case_of(step)
        if case is not None and case.clause.call == "trim":
            n = int_value(case.clause, case.variant, above=len(self.committed()) + 1)
        args = {"n": n}
        self.steps.append({**{key: value for key, value in step.items() if key != "most"}, "n": n})
        self.verb("trim", args, self._ask("trim", args))

    def committed(self) -> set[int]:
        """The tokens the record holds past an open step (a contiguous cache's whole steps)."""
        open_step = self.step_positions is not None and len(self.served) < self.engine.mcfg.n_layers
        pending = set(self.step_uids) if open_step else set()   # a step every layer served is held
        return {uid for uid in self.readable.get(0, set()) if uid not in pending}

    def trimmed(self, n: Any) -> None:
        """An accepted trim (OP-TRIM): the newest n tokens of the whole steps are gone; a query attending one
        of them later attends a token no sequence holds (SAFE-OP-ISOLATION). What is certainly gone only,
        whatever the caller did: past a step served partway nothing is (a cache of per-layer histories drops
        each layer's own newest n, which differ there), nor past a trim of no count the record can read
        (negative, not an int) - what the target did then shows in its later answers."""
        partway = self.step_positions is not None and 0 < len(self.served) < self.engine.mcfg.n_layers
        whole = self.committed()
        # SAFE-OP-COMPLETE: what the trim certainly kept, the positions below L - n (a cache of per-layer
        # histories trimmed partway keeps them too); past a count it cannot read, nothing
        self.kept_below = len(whole) - n if type(n) is int and n >= 0 else 0
        # and no more than the target says every layer holds (trims partway leave the record's count stale)
        used = [self._int("used", {"layer_id": layer}) for layer in range(self.engine.mcfg.n_layers)]
        self.kept_below = min([self.kept_below] + [count for count in used if count is not None])
        if type(n) is int and n >= 0 and not partway:
            end = len(whole) - n
            gone = {uid for uid in whole if type(pos := self.position.get(uid)) is int and pos >= end}
            self.readable[0] = self.readable.get(0, set()) - gone
        # no later call continues a step the trim came after: its tokens may be gone from the layers it reached
        self.step_positions, self.step_uids, self.served, self.step_clean = None, [], set(), True

    def owed_after_verb(self, method: str, args: dict[str, Any]) -> None:
        """SAFE-OP-COMPLETE's record past an accepted verb: a fork owes dst what src is owed below upto, a
        removal owes nothing in its range, a reset nothing at all; a verb whose arguments the harness cannot
        read (a malformed one the target accepted) leaves its sequences owed nothing."""
        if method == "reset":
            self.owed = {}
            return
        if method == "trim":   # owed still: what the trim certainly kept (trimmed)
            self.owed[0] = {uid for uid in self.owed.get(0, set()) if _before(self.position.get(uid), self.kept_below)}
            return
        ints = [args.get(name) for name in ("seq", "p0", "src", "dst") if name in args]
        bounds = [args.get(name) for name in ("p1", "upto") if name in args]
        if not all(type(value) is int and value >= 0 for value in ints) or \
                not all(value is None or type(value) is int for value in bounds):
            for name in ("seq", "src", "dst"):
                self.owed.pop(args.get(name), None)
            return
        if method == "seq_cp":
            upto = args["upto"]
            self.owed[args["dst"]] = {uid for uid in self.owed.get(args["src"], set())
                                      if upto is None or _before(self.position.get(uid), upto)}
        elif method == "seq_rm":
            p0, p1 = args["p0"], args["p1"]
            self.owed[args["seq"]] = {uid for uid in self.owed.get(args["seq"], set())
                                      if not (type(pos := self.position.get(uid)) is int and pos >= p0
                                              and (p1 is None or pos < p1))}

    def fetch(self, step: Step) -> None:
        engine, layer = self.engine, step.get("layer")
        # the step's own positions; else a cell step has a token per declared owner, a contiguous one n
        q = len(step["positions"]) if "positions" in step else len(self.declared) if self.cell else int(step.get("n", 1))
        positions = list(step["positions"]) if "positions" in step else self.next_positions(layer, q)
        case = case_of(step)
        if case is not None and case.clause.kind == POSITIONS and positions and "positions" not in step:
            newest = positions[0] - 1 if not self.cell else -1   # as the lockstep breaks them
            positions = malformed_positions(case.variant, positions + [positions[-1] + 1], newest) or positions
            q = len(positions)
        continuing = self.step_positions is not None and layer not in self.served and positions == self.step_positions
        before = (engine.next_uid, self.step_positions, self.step_uids, self.served, self.step_clean)
        if continuing:
            uids = list(self.step_uids)
        else:
            shapes = engine.shapes(q, case)
            uids = engine.fresh_uids(max([q] + [s[-2] for s in (shapes.k, shapes.v) if len(s) >= 2]))
            self.step_positions, self.step_uids, self.served, self.step_clean = positions, uids, set(), True
        args, _ = engine.arguments(layer, positions, uids, case)
        concrete: Step = {"op": "fetch", "layer": layer, "positions": positions, **(case.tag() if case else {})}
        self.steps.append(concrete)
        answer = self._ask("update_and_fetch", args)
        if not answer.ok and not continuing:   # a refused call began no step and used up no token number
            engine.next_uid, self.step_positions, self.step_uids, self.served, self.step_clean = before
        self.served_fetch(layer, positions, uids[:q], answer, _one_token_each(args, q), _well_formed(engine, args, q))

    def finish(self) -> None:
        """Past a step served on some layers only: its other layers are served, as the runner's forward
        would, each answer judged by SAFETY."""
        if self.step_positions is None or not self.served:
            return
        for layer in range(self.engine.mcfg.n_layers):
            if layer not in self.served:
                self.fetch({"op": "fetch", "layer": layer, "positions": list(self.step_positions)})

    def next_positions(self, layer: Any, q: int) -> list[int]:
        """Positions for a step that names none: the cell cache's next of each declared sequence (by the
        record), the contiguous cache's used length (its own answer)."""
        if not self.cell:
            start = self._int("used", {"layer_id": layer})
            if start is None and scopes.NO_LENGTH in self.engine.relaxed:   # no length of its own: the record's
                start = len(self.committed())
            return list(range(start or 0, (start or 0) + q))
        newest = {seq: max((p for u in self.readable.get(seq, set()) if type(p := self.position.get(u)) is int),
                           default=-1) for seq in set(self.declared)}
        out = []
        for seq in self.declared:
            newest[seq] += 1
            out.append(newest[seq])
        return out

    def served_fetch(self, layer: Any, positions: list[Any], uids: list[int], answer: Outcome,
                     judged: bool = True, well_formed: bool = False) -> None:
        """An update_and_fetch answered: its tokens are written; SAFE-OP-ISOLATION and SAFE-OP-COMPLETE on
        its rows (when it named a layer and its queries are its positions' tokens: `judged`), SAFE-OP-KEEP on
        the sequences it has no token of."""
        if not answer.ok:
            self.lens = self.seq_lens()
            return
        seqs = self.seqs_of(len(uids))
        self.wrote(seqs, positions, uids)
        self.step_clean = self.step_clean and well_formed
        if type(layer) is int and 0 <= layer < self.engine.mcfg.n_layers:
            self.served.add(layer)
            if judged:
                self.isolation(layer, seqs, positions, uids, answer.value, well_formed)
            if len(self.served) == self.engine.mcfg.n_layers and self.step_clean:
                for seq, uid in zip(seqs, uids):   # the step is on every layer: owed from now on
                    self.owed.setdefault(seq, set()).add(uid)
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

    def isolation(self, layer: int, seqs: list[Any], positions: list[Any], uids: list[int], value: Any,
                  well_formed: bool = False) -> None:
        engine = self.engine
        k_value, v_value, spec = value   # a shape the driver cannot follow ends the drive, said in the report
        k_hist, v_hist = as_array(k_value), as_array(v_value)
        q = len(positions)
        allowed = allowed_rows(spec, q, k_hist.shape[2])
        if isinstance(allowed, str):
            raise ValueError(allowed)
        if v_hist.ndim == k_hist.ndim == 4 and v_hist.shape[2] != k_hist.shape[2] and allowed.any():
            raise self._broken("SAFE-OP-ISOLATION", f"update_and_fetch on layer {layer} answered {KV_LENGTHS}: "
                                                    f"k_hist {k_hist.shape[2]} rows, v_hist {v_hist.shape[2]}: an "
                                                    "attended row's K has no V, or V another token's")
        for b in range(k_hist.shape[0]):
            for h in range(k_hist.shape[1]):
                k_uids = engine.labels.uid_of(k_hist[b, h], layer, b, h, 0)
                v_uids = engine.labels.uid_of(v_hist[b, h], layer, b, h, 1)

                def pictured(i: int, stop: Stop) -> Stop:   # this (b, h)'s grid drawn into the finding
                    return self._pictured(stop, layer, b, h, i, seqs, positions, k_uids, v_uids, allowed)

                for i in range(q):
                    # a query at a position OP-POS allows (not -1, a free-cell marker upstream) sees itself
                    placed = type(positions[i]) is int and 0 <= positions[i] <= op_model.MAX_POSITION
                    if placed and i < len(uids) and uids[i] not in {int(u) for u in k_uids[allowed[i]]}:
                        raise pictured(i, self._broken("SAFE-OP-SELF", f"query {i} (sequence {seqs[i]}, position {positions[i]}, "
                                                           f"batch {b}, head {h}) on layer {layer} does not attend "
                                                           f"its own token {uids[i]}, written by this very call"))
                    for row in np.flatnonzero(allowed[i]):
                        uid = int(k_uids[row])
                        where = f"query {i} (sequence {seqs[i]}, position {positions[i]}, batch {b}, head {h}) " \
                                f"on layer {layer} attends row {row}"
                        if uid < 0 or row >= len(v_uids) or v_uids[row] != uid:   # V may have fewer rows than K
                            v_row = row_text(v_hist[b, h, row]) if row < len(v_uids) else "(no row)"
                            raise pictured(i, self._broken("SAFE-OP-ISOLATION", f"{where}, whose K {row_text(k_hist[b, h, row])} / "
                                                                    f"V {v_row} are not one token's "
                                                                    "written for this layer, batch row and head"))
                        if uid not in self.readable.get(seqs[i], set()):
                            if self.writer.get(uid) == seqs[i]:   # its own token, given up since (a contiguous
                                # cache's trim, a cell cache's seq_rm or reset): "neither wrote it" would be false
                                raise pictured(i, self._broken("SAFE-OP-ISOLATION", f"{where}: token {uid}, which "
                                                                           f"sequence {seqs[i]} wrote and no longer "
                                                                           "holds (a trim, removal or reset the "
                                                                           "target accepted dropped it)"))
                            whose = f"of sequence {self.writer[uid]}" if uid in self.writer else \
                                UNACCEPTED_TOKEN
                            raise pictured(i, self._broken("SAFE-OP-ISOLATION", f"{where}: token {uid}, {whose}; sequence "
                                                                    f"{seqs[i]} neither wrote it nor was forked from "
                                                                    "its writer"))
                        pos, own = self.position.get(uid), positions[i]
                        if self.judge_positions and type(pos) is int and type(own) is int and pos > own:
                            raise pictured(i, self._broken("SAFE-OP-ISOLATION", f"{where}: token {uid} at position {pos}, "
                                                                    "after the query's"))
                    if placed and i < len(uids):
                        attended = {int(u) for u in k_uids[allowed[i]]}
                        for uid in self.owed_to(layer, seqs, positions, uids if well_formed else [], i):
                            if uid not in attended:
                                raise pictured(i, self._broken("SAFE-OP-COMPLETE", f"query {i} (sequence {seqs[i]}, position "
                                                                       f"{positions[i]}, batch {b}, head {h}) on "
                                                                       f"layer {layer} does not attend token {uid} "
                                                                       f"at position {self.position.get(uid)}: the "
                                                                       "target accepted it, nothing removed it, and "
                                                                       "it lies in the query's span"))

    def _pictured(self, stop: Stop, layer: int, b: int, h: int, failing: int, seqs: list[Any], positions: list[Any],
                  k_uids: np.ndarray, v_uids: np.ndarray, allowed: np.ndarray) -> Stop:
        """A broken property's finding with its attend grid at (layer, b, h): against the tokens each query may
        attend past the entry - its sequence's (written by it or forked to it), not after its position where positions
        are judged (SAFE-OP-ISOLATION); the tokens it is owed (SAFE-OP-COMPLETE) are among them."""
        def may_attend(i: int) -> list[int]:
            own = positions[i]
            return sorted(uid for uid in self.readable.get(seqs[i], set())
                          if not (self.judge_positions and type(own) is int and type(self.position.get(uid)) is int
                                  and self.position[uid] > own))
        allowed_tokens: list[Optional[list[int]]] = [may_attend(i) for i in range(len(positions))]
        stop.finding.picture = {"attend": attend_picture(
            layer, b, h, list(zip(positions, seqs)), allowed_tokens, k_uids, v_uids, allowed, self.position.get,
            lambda uid: sorted(seq for seq, held in self.readable.items() if uid in held), failing, self.cell,
            "safety")}
        return stop

    def owed_to(self, layer: int, seqs: list[Any], positions: list[Any], uids: list[int], i: int) -> list[int]:
        """SAFE-OP-COMPLETE: the tokens query i of a call must attend on `layer`, whatever came before - its
        sequence's owed tokens and the call's own tokens up to it, at positions OP-POS allows in its span (not
        after it, inside its window). Two such tokens at one position owe neither (a re-placed position the
        target accepted: which one it keeps is not the harness's to say). Positions a target's scope does not read
        (no `positions`) are not judged, but on a flat layer every earlier token is in the span."""
        seq, own, window = seqs[i], positions[i], self.engine.mcfg.windows[layer]
        keep = self.engine.mcfg.keep(layer)   # OP-SINKS: the first keep positions are in every span
        if not self.judge_positions and window:
            return []
        mine = [uid for j, uid in enumerate(uids[:i + 1]) if seqs[j] == seq]
        candidates = sorted(self.owed.get(seq, set()) | set(mine))
        at: dict[Any, int] = {}
        for uid in candidates:
            at[self.position.get(uid)] = at.get(self.position.get(uid), 0) + 1
        out = []
        for uid in candidates:
            pos = self.position.get(uid)
            if type(pos) is not int or not 0 <= pos <= op_model.MAX_POSITION or at[pos] > 1:
                continue   # a position OP-POS refuses (-1, a free-cell marker upstream) is no span's
            if not self.judge_positions or (pos <= own and (window == 0 or pos > own - (window - keep) or pos < keep)):
                out.append(uid)
        return out

    def check_table(self, context: str) -> None:
        """Nothing more at the end: every answer was judged as it came."""


def drive_on(engine: Any, program: list[Step], entry: Finding) -> None:
    """The engine's drive past a lenient or over-strict entry (engine.Drive)."""
    OpConsequences(engine, entry).drive(Consequences.rest(program, entry))


def _before(pos: Any, upto: int) -> bool:
    return type(pos) is int and pos < upto


def _well_formed(engine: OpEngine, args: dict[str, Any], q: int) -> bool:
    """Whether an update_and_fetch call is well-formed in its layer, K and V: a layer id in range, K and V of
    the config's shapes and q tokens, float32 (its tokens are then owed to later queries: SAFE-OP-COMPLETE)."""
    cfg = engine.mcfg
    k, v = as_array(args["k"]), as_array(args["v"])
    layer = args["layer_id"]
    return type(layer) is int and 0 <= layer < cfg.n_layers and k.dtype == np.float32 and v.dtype == np.float32 \
        and k.shape == (cfg.batch_size, cfg.n_kv_heads, q, cfg.head_dim) \
        and v.shape == (cfg.batch_size, cfg.n_kv_heads, q, cfg.v_head_dim)


def _one_token_each(args: dict[str, Any], q: int) -> bool:
    """Whether an update_and_fetch call's K carries one token per position (rank 4, q_len q). A malformed
    q_len or rank does not: its queries cannot be told apart, so none is judged (they had been judged as
    the positions' tokens, a false SAFE-OP-SELF on a call of no token)."""
    shape = as_array(args["k"]).shape
    return len(shape) == 4 and shape[2] == q
