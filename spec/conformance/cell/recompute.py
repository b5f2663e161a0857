"""The cell layout seen only through its outputs: the layout `cell-recompute` (SPEC.md section 5.3).

A runtime such as llama.cpp keeps a cell cache but shows no K/V: a decode of a batch (each token with its
sequence id and position) answers one output vector per token. Which rows each token attends is the op
face's cell table (`op_model.OpModel` of kind cell: caller-chosen ids, `seq_cp` onto an empty destination,
`seq_rm`, positions newer than the sequence holds, admission by free cells). What the output must be is
CELL-RECOMPUTE: the same target recomputes the token from nothing over exactly the rows the spec says it
attends (`cell_model.recompute_rows`), and the two outputs must agree to a float tolerance. The recompute
is the oracle, so a finding is a difference the target makes between two ways of computing one thing.

The target's calls (targets.FACE_METHODS["cell-recompute"]), positionally:
- `decode(seq_ids, positions, tokens)`: a list of one output vector (a list of floats) per token, or a
  refusal (False or None: no free cells, nothing changed; an exception: a caller error);
- `recompute(tokens, positions)`: the output of the last token after decoding all of them as one sequence
  into a fresh state (positions strictly increasing, maybe with gaps); a refusal leaves the check undecided;
- `seq_cp(src, dst, upto)`, `seq_rm(seq, p0, p1)`: True when served (OP-FORK, OP-RM);
- `next_pos(seq)`: one past the newest position seq holds, 0 when none (CELL-OWNERS); `clear()`;
- with the scope feature `seq-state` (CELL-STATE): `seq_save(seq, file)`, seq's state as base64 text (through a
  file when `file`), and `seq_load(seq, data, file)`, True when seq now holds exactly the saved tokens; a
  refusal for a state cut short or changed in a byte, nothing changed.

Programs are JSON steps: {"op": "decode", "seqs": [...], "positions": [...]?} (positions default to each
sequence's next, token by token; {"next": d} is next + d, {"back": k} next - k), {"op": "cp", "src", "dst",
"upto"}, {"op": "rm", "seq", "p0", "p1"}, {"op": "next_pos", "seq"}, {"op": "clear"}, {"op": "save", "seq",
"file"}, {"op": "load", "seq", "form"} (the last state saved, whole or broken: STATE_FORMS). Tokens are the
engine's: token(uid) of a fresh uid per token written, in [0, VOCAB).

Checked tokens per decode are bounded by counts (every token of a decode of at most CHECK_ALL tokens, else
the first one and each sequence's last), never by clocks. A recompute is asked once per distinct row set.
"""

from __future__ import annotations

import base64
import random
from typing import Any, Optional

from ... import cell_model as cm
from ... import model
from ... import op_model as om
from ..configs import JsonConfig, config, layer
from ..malform import broken_state   # a saved state broken without knowing its format (OP-STATE too)
from ..consequences import Consequences
from ..engine import LENIENT, NOT_SENT, WRONG, Accepted, Drive, Engine, Finding, Refused, RunResult, Step, Stop, \
    Verdict, _same, _show
from ..preconditions import broken, not_sent_note
from ..scope import Scope

VOCAB = 32          # tokens are ints in [0, VOCAB): a target's vocabulary holds at least these
CHECK_ALL = 4       # a decode of at most this many tokens has every output checked
GAPS = "position-gaps"   # the scope feature: a decode at a position past next_pos (a gap)
RULES = {"decode": "CELL-RECOMPUTE", "seq_cp": "OP-FORK", "seq_rm": "OP-RM", "next_pos": "CELL-OWNERS",
         "clear": "CELL-CLEAR", "recompute": "CELL-RECOMPUTE", "seq_keep": "CELL-KEEP", "seq_add": "CELL-SHIFT",
         "seq_save": "CELL-STATE", "seq_load": "CELL-STATE"}
ANSWER_TYPES: dict[str, tuple[type, ...]] = {"decode": (list, bool),   # False: refused
                                             "recompute": (list,), "seq_cp": (bool,), "seq_rm": (bool,),
                                             "seq_keep": (bool,), "seq_add": (bool,), "next_pos": (int,),
                                             "seq_save": (str,), "seq_load": (bool,)}
STATE = "seq-state"   # the scope feature of seq_save / seq_load (spec 5): without it those steps are not sent
WHOLE, STATE_FORMS = "whole", ("truncated", "flipped")   # the broken forms the suite makes of a target's bytes
SHIFTED = (-1,)   # the written_over of a row a seq_add moved: no rows below it can be its oracle's (uids >= 0)


def token_of(uid: int) -> int:
    """The token the engine writes as its uid-th token: varied, so two rows rarely look alike."""
    return (uid * 7 + 3) % VOCAB


class Unjudged(Exception):
    """The program reached a step only a scope feature the target leaves out defines."""


# --- configurations and programs -------------------------------------------------------------------------

def recompute_config(capacity: int, *windows: int) -> JsonConfig:
    """A JSON config: one layer per window (0 = flat); the op face's shape fields at 1 (outputs only)."""
    layers = [layer("ring" if w else "flat", w) for w in windows]
    return {**config(capacity, layers, len(layers)), "n_kv_heads": 1, "head_dim": 1, "v_head_dim": 1,
            "batch_size": 1}


# Capacities are multiples of 256, the ones llama.cpp builds exactly (it pads n_ctx). LONG holds a prefill of
# LONG_PREFILL tokens, longer than a 256-cell sliding cache (llama.cpp's smallest), so a runtime whose sliding
# layer keeps fewer cells than its dense one has forgotten the oldest positions when the long programs rewind.
LONG, LONG_PREFILL = 512, 300
CONFIGS: tuple[JsonConfig, ...] = (
    recompute_config(256, 0),           # one flat layer
    recompute_config(256, 3),           # one sliding layer
    recompute_config(256, 0, 0),        # two flat layers
    recompute_config(256, 3, 0),        # a sliding layer beside a dense one
    recompute_config(LONG, 4, 0),       # ... and a sliding cache smaller than the dense one
)


def bad_configs(validates_configs: bool) -> list[JsonConfig]:
    """Configs the spec rejects (OP-CONFIG, OP-BATCH): a target gets JSON configs, so it validates them."""
    base = recompute_config(8, 0)
    return [{**base, "capacity": 0}, {**base, "n_layers": 0}, {**base, "layers": [layer("ring", 0)]},
            {**base, "layers": [layer("flat", 2)]}, {**base, "n_layers": True}, {**base, "batch_size": 2}]


def decode(*seqs: Any, positions: Optional[list[Any]] = None) -> Step:
    return {"op": "decode", "seqs": list(seqs), **({"positions": positions} if positions is not None else {})}


def cp(src: Any, dst: Any, upto: Any = None) -> Step:
    return {"op": "cp", "src": src, "dst": dst, "upto": upto}


def rm(seq: Any, p0: Any = 0, p1: Any = None) -> Step:
    return {"op": "rm", "seq": seq, "p0": p0, "p1": p1}


def keep(seq: Any) -> Step:
    return {"op": "keep", "seq": seq}


def add(seq: Any, p0: Any, p1: Any, delta: Any) -> Step:
    return {"op": "add", "seq": seq, "p0": p0, "p1": p1, "delta": delta}


CLEAR: Step = {"op": "clear"}


def save(seq: Any, file: bool = False) -> Step:
    """CELL-STATE: seq_save(seq, file); the state is kept for the program's later loads (the last one saved)."""
    return {"op": "save", "seq": seq, "file": file}


def load(seq: Any, form: str = WHOLE) -> Step:
    """CELL-STATE: seq_load of the last state saved, whole or broken (STATE_FORMS), into seq (through a file
    when it was saved through one)."""
    return {"op": "load", "seq": seq, "form": form}


def edge_programs(cfg: JsonConfig) -> list[tuple[str, list[Step]]]:
    cap = cfg["capacity"]
    out: list[tuple[str, list[Step]]] = [
        ("prompt then decodes", [decode(0, 0, 0), decode(0), decode(0)]),
        ("two sequences in one decode", [decode(0, 0, 1, 1), decode(0, 1), decode(1)]),
        ("fork then both decode", [decode(0, 0, 0), cp(0, 1), decode(1), decode(0), decode(0, 1)]),
        ("fork a prefix", [decode(0, 0, 0), cp(0, 1, 2), decode(1), decode(1, 0)]),
        ("remove a shared cell from one sequence", [decode(0, 0, 0), cp(0, 1), rm(0, 1), decode(0), decode(1)]),
        ("drop a shared prefix's first owner", [decode(0, 0), cp(0, 1), rm(0), decode(1), decode(0)]),
        ("truncate then continue", [decode(0, 0, 0, 0), rm(0, 2), decode(0), decode(0)]),
        ("remove the middle, continue", [decode(0, 0, 0, 0, 0), rm(0, 1, 3), decode(0), decode(0)]),
        ("evict the oldest", [decode(0, 0, 0), rm(0, 0, 1), decode(0)]),
        ("fill, one more, free one", [decode(*[0] * cap), decode(0), rm(0, cap - 1), decode(0)]),
        ("clear", [decode(0, 0), CLEAR, decode(0), decode(1)]),
        ("fork onto a live sequence", [decode(0, 0), decode(1, 1), cp(0, 1), decode(1)]),
        ("fork onto itself", [decode(0), cp(0, 0), decode(0)]),
        ("a position re-placed", [decode(0, 0), decode(0, positions=[{"back": 1}]), decode(0)]),
        ("a position with a gap", [decode(0), decode(0, positions=[{"next": 2}]), decode(0)]),
        ("an empty decode", [decode(0), decode(), decode(0)]),
        ("a negative position", [decode(0, positions=[-1]), decode(0)]),
        ("rm p1 below p0", [decode(0, 0, 0), rm(0, 2, 1), decode(0)]),
        ("cp upto negative", [decode(0, 0), cp(0, 1, -1), decode(1)]),
        ("decode an id out of range", [decode(0), decode(om.MAX_SEQS), decode(0)]),
        # CELL-KEEP and CELL-SHIFT: llama.cpp's seq_keep and seq_add
        ("keep one sequence", [decode(0, 0), cp(0, 1), decode(1), decode(2, 2), keep(1), decode(1), decode(0),
                               decode(2)]),
        ("keep a sequence holding nothing", [decode(0), keep(1), decode(0), decode(1)]),
        ("context shift", [decode(0, 0, 0, 0, 0, 0), rm(0, 1, 3), add(0, 3, None, -2), decode(0), decode(0)]),
        ("shift forward, then continue", [decode(0, 0, 0), add(0, 1, None, 4), decode(0), decode(0)]),
        ("shift a shared prefix for one sequence", [decode(0, 0, 0), cp(0, 1), add(1, 0, None, 5), decode(1),
                                                    decode(0)]),
        ("shift onto a held position", [decode(0, 0, 0, 0), add(0, 2, None, -1), decode(0)]),
        ("shift below position 0", [decode(0, 0, 0), add(0, 0, None, -1), decode(0)]),
        ("shift p1 below p0", [decode(0, 0, 0), add(0, 2, 1, 1), decode(0)]),
    ]
    if cfg == CONFIGS[0]:   # ids out of range in each verb, once (-1 is "any sequence" to llama.cpp; a runtime
        for bad in (om.MAX_SEQS, 300, -1, -2):   # that aborts on one is a crash: one program each, already minimal)
            out += [(f"rm id {bad}", [rm(bad)]), (f"cp src {bad}", [cp(bad, 1)]), (f"cp dst {bad}", [cp(0, bad)]),
                    (f"keep id {bad}", [keep(bad)]), (f"add id {bad}", [add(bad, 0, None, 1)])]
    if cap >= LONG_PREFILL + 8 and any(entry["kind"] == "ring" for entry in cfg["layers"]):
        prefill = [decode(*[0] * 60) for _ in range(LONG_PREFILL // 60)]
        out += [("long prefill, rewind far", prefill + [rm(0, 40), decode(0), decode(0)]),
                ("long prefill, rewind near", prefill + [rm(0, LONG_PREFILL - 3), decode(0)])]
    return out


def state_programs(cfg: JsonConfig) -> list[tuple[str, list[Step]]]:
    """CELL-STATE's edges (run after every other edge program: spec 5's): a sequence saved, then restored into
    itself after it went on (a rollback), into another sequence (cleared first, or live), after a clear, the
    state of a fork and of an empty sequence, through a file too; a restored sequence rewound; each broken form
    refused by a live destination and by an empty one. Every later decode is judged (CELL-RECOMPUTE)."""
    prefix = [decode(0, 0, 0, 0, 0, 0)]   # longer than the sliding configs' windows (3 and 4)
    out = [("a sequence restored into itself after it went on", prefix + [save(0), decode(0), decode(0), load(0),
                                                                            decode(0), decode(0)]),
           ("a sequence restored into another, cleared", prefix + [save(0), rm(1), load(1), decode(1), decode(0)]),
           ("a sequence restored after a clear", prefix + [save(0), CLEAR, load(0), decode(0), decode(0)]),
           ("a sequence restored over a live one", prefix + [decode(1, 1), save(0), load(1), decode(1)]),
           ("a fork's state restored", prefix + [cp(0, 1), decode(1), save(1), rm(1), load(2), decode(2), decode(0)]),
           ("an empty sequence's state restored over a live one", prefix + [save(3), load(0), decode(0)]),
           ("a restored sequence rewound", prefix + [save(0), rm(0), load(0), rm(0, 2), decode(0)]),
           ("a state file restored into itself", prefix + [save(0, True), decode(0), load(0), decode(0)]),
           ("a state file restored into another", prefix + [save(0, True), load(1), decode(1), decode(0)])]
    for form in STATE_FORMS:
        for file in (False, True):
            how = " (a file)" if file else ""
            out += [(f"a {form} state{how} refused by a live sequence", prefix + [save(0, file), decode(0),
                                                                                  load(0, form), decode(0)]),
                    (f"a {form} state{how} refused by an empty sequence", prefix + [save(0, file), load(1, form),
                                                                                    decode(1), decode(0)])]
    return out


def sent(program: list[Step], scope: Scope) -> list[Step]:
    """The program as a target of this scope is sent it: without save and load steps when it leaves out
    `seq-state` (left out up front, so a finding's step index and its shrinking count the program as run)."""
    return program if STATE in scope.features else [step for step in program if step.get("op") not in ("save", "load")]


def random_program(cfg: JsonConfig, rng: random.Random, size: int) -> list[Step]:
    program: list[Step] = []
    while len(program) < size:
        roll = rng.random()
        if roll < 0.55:
            program.append(decode(*[rng.randrange(3) for _ in range(rng.choice([1, 1, 2, 3]))]))
        elif roll < 0.7:
            program.append(cp(rng.randrange(3), rng.randrange(3), rng.choice([None, None, 0, 1, 2, 4])))
        elif roll < 0.85:
            program.append(rm(rng.randrange(3), rng.choice([0, 0, 1, 2]), rng.choice([None, None, 1, 3])))
        elif roll < 0.88:
            program.append(CLEAR)
        elif roll < 0.9:
            program.append(keep(rng.randrange(3)) if rng.random() < 0.4 else
                           add(rng.randrange(3), rng.choice([0, 1, 2]), rng.choice([None, 3]), rng.choice([-2, -1, 1, 3])))
        else:
            program.append(decode(rng.randrange(3), positions=[{"next": rng.choice([1, 2])}]))
    return program


# --- the engine ------------------------------------------------------------------------------------------

class RecomputeEngine(Engine):
    """One program on a cell target seen through its outputs; a fresh cache per program."""

    answer_types = ANSWER_TYPES

    def __init__(self, target: Any, cfg: JsonConfig, exact: bool = False, light: bool = False,
                 scope: Any = None, row_budget: Optional[int] = None, drive: Optional[Drive] = None) -> None:
        super().__init__(target, cfg, exact, light, scope, row_budget, drive)
        made = om.make_config(dict(cfg), om.CELL)
        if isinstance(made, om.Rejected):
            self.rejected_config = model.Rejected(made.rule, made.why)
            made = om.OpConfig(om.CELL, 1, (0,), 1, 1, 1, 1, 1)
        self.ocfg = made
        self.table = om.OpModel(made)
        self.next_table = self.table
        self.uids = 0
        self.tokens: dict[int, int] = {}                      # uid -> token
        self.written_over: dict[int, tuple[int, ...]] = {}    # uid -> the uids below it in its sequence then
        self.recomputed: dict[tuple[tuple[int, ...], tuple[int, ...]], Any] = {}
        # CELL-STATE: the last state saved - its bytes, whether through a file, and the (uid, position) rows it holds
        self.saved: Optional[tuple[bytes, bool, list[tuple[int, int]]]] = None
        self.restored: dict[int, int] = {}   # the uids a load being judged gives the saved rows: saved uid -> new
        # a finding past a load names it (its detail): the restore is then the cause to look at, kept apart from one
        # the same call shows without a state restored (suite/account.py keys causes by their detail)
        self.past_load = ""
        self.named: set[int] = set()   # the sequences a save or load step named

    # --- the model --------------------------------------------------------------------------------------
    def entries(self, table: om.OpModel, seq: int) -> list[cm.Entry]:
        return [(pos, self.tokens[uid], uid) for uid, pos in table.held.get(seq, {}).items()]

    def verdict(self, method: str, args: dict[str, Any]) -> Verdict:
        rule = RULES[method]
        table = self.table.snapshot()
        self.next_table = table
        if method == "clear":
            table.reset()
            return Accepted(None, rule)
        if method == "next_pos":
            seq = args["seq"]
            if not om._is_int(seq) or not 0 <= seq < om.MAX_SEQS:
                return model.Rejected("OP-STEP", "seq")
            return Accepted(max(table.held.get(seq, {}).values(), default=-1) + 1, rule)
        if method in ("seq_save", "seq_load"):
            return self._state_verdict(table, method, args)
        if method == "seq_keep":
            rejected = table.seq_keep(args["seq"])
        elif method == "seq_add":
            rejected = table.seq_add(args["seq"], args["p0"], args["p1"], args["delta"])
        elif method == "seq_cp":
            rejected = table.seq_cp(args["src"], args["dst"], args["upto"])
        elif method == "seq_rm":
            rejected = table.seq_rm(args["seq"], args["p0"], args["p1"])
        else:
            rejected = self._decode(table, args)
        if rejected is not None:
            return Refused(rejected.rule) if rejected.rule == "OP-CAP" else model.Rejected(rejected.rule, rejected.why)
        return Accepted(True, rule)

    def _state_verdict(self, table: om.OpModel, method: str, args: dict[str, Any]) -> Verdict:
        """CELL-STATE on the model: a save changes nothing; a whole load makes seq hold exactly the saved rows (new
        cells: fresh uids, the saved rows' tokens), a broken one is refused."""
        seq = args["seq"]
        if not om._is_int(seq) or not 0 <= seq < om.MAX_SEQS:
            return model.Rejected("CELL-STATE", "seq")
        if method == "seq_save":
            return Accepted(True, "CELL-STATE")
        assert self.saved is not None
        data, _, rows = self.saved
        if args["data"] != base64.b64encode(data).decode():
            return model.Rejected("CELL-STATE", "data")
        rejected = table.seq_load(seq, rows, self.uids)
        if rejected is not None:
            return Refused(rejected.rule)   # OP-CAP: the seq id was checked above
        self.restored = {uid: self.uids + i for i, (uid, _) in enumerate(rows)}
        return Accepted(True, "CELL-STATE")

    def _decode(self, table: om.OpModel, args: dict[str, Any]) -> Optional[om.Rejected]:
        """The decode on the model: a step declared and served on every layer (the op face's cell verbs)."""
        seqs, positions = args["seq_ids"], args["positions"]
        rejected = table.begin_step(seqs)
        if rejected is not None:
            return rejected
        if not isinstance(positions, list) or len(positions) != len(seqs):
            return om.Rejected("OP-STEP", f"{positions!r}: not one position per token")
        q = len(seqs)
        shapes = om.Shapes((1, 1, q, 1), (1, 1, q, 1), (q, 1))
        uids = list(range(self.uids, self.uids + q))
        for layer_id in range(self.ocfg.n_layers):
            served = table.fetch(layer_id, shapes, positions, uids)
            if isinstance(served, om.Rejected):
                return served
        return None

    # --- observation ------------------------------------------------------------------------------------
    def in_play(self) -> list[int]:
        """The sequences observed after each call: those the model holds, 0, and those a state step named (a refused
        load that left tokens in an empty destination is seen at once)."""
        return sorted(set(self.table.held) | {0} | self.named)

    def observe(self, context: str, rule: str, lenient_rule: Optional[str] = None, retained: bool = True) -> None:
        """next_pos of every sequence in play against the model; after a rejected call a difference is
        lenient (it served part of the call)."""
        rule = {"ATOMIC": "OP-ATOMIC", "LEN-BOUNDS": "CELL-OWNERS"}.get(rule, rule)
        for seq in self.in_play():
            want = max(self.table.held.get(seq, {}).values(), default=-1) + 1
            got = self._call("next_pos", {"seq": seq}, rule)
            if not got.ok or not _same(got.value, want):
                seen = got.value if got.ok else got.error
                raise self._fail(LENIENT if lenient_rule else WRONG, lenient_rule or rule,
                                 f"{context}: next_pos({seq}) is {seen!r}, the spec says {want}")

    def after_create(self) -> None:
        self.observe("after create", "CELL-CLEAR")

    # --- arguments -------------------------------------------------------------------------------------
    def position(self, spec: Any, seq: Any, newest: dict[Any, int]) -> Any:
        if not isinstance(spec, dict):
            return spec
        nxt = newest[seq] + 1 if seq in newest else \
            max(self.table.held.get(seq, {}).values(), default=-1) + 1 if om._is_int(seq) else 0
        return nxt + spec["next"] if "next" in spec else max(0, nxt - spec.get("back", 0))

    def positions(self, seqs: list[Any], specs: Optional[list[Any]]) -> tuple[list[Any], bool]:
        """One position per token, and whether any lies past its sequence's next position (a gap)."""
        newest: dict[Any, int] = {}
        out, gap = [], False
        for seq, spec in zip(seqs, specs if specs is not None else [{"next": 0}] * len(seqs)):
            value = self.position(spec, seq, newest)
            if om._is_int(value) and value > self.position({"next": 0}, seq, newest):
                gap = True
            if om._is_int(value):
                newest[seq] = value
            out.append(value)
        return out, gap

    # --- the program --------------------------------------------------------------------------------------
    def run(self, program: list[Step]) -> RunResult:
        try:
            return super().run(program)
        except Unjudged:
            return self.result

    def _fail(self, kind: str, rule: str, message: str, detail: str = "") -> Stop:
        return super()._fail(kind, rule, message, detail or self.past_load)

    def show(self, args: dict[str, Any]) -> str:
        """A call's arguments, a state's base64 text shortened to its length."""
        return _show({name: f"<{len(value)} chars>" if name == "data" and isinstance(value, str) else value
                      for name, value in args.items()})

    def run_step(self, step: Step) -> Optional[Step]:
        op = step["op"]
        if op == "decode":
            return self.decode(step)
        if op in ("save", "load"):
            return self.state_step(step)
        names = {"cp": ("src", "dst", "upto"), "rm": ("seq", "p0", "p1"), "next_pos": ("seq",), "clear": (),
                 "keep": ("seq",), "add": ("seq", "p0", "p1", "delta")}[op]
        args: dict[str, Any] = {name: step.get(name) for name in names}
        method = str({"cp": "seq_cp", "rm": "seq_rm", "keep": "seq_keep", "add": "seq_add"}.get(op, op))
        if self.kept_back(method, args):
            return NOT_SENT
        self.result.steps.append(dict(step))
        verdict, outcome = self.checked(method, args)
        if isinstance(verdict, Accepted):
            if method == "next_pos" and not _same(outcome.value, verdict.value):
                raise self._fail(WRONG, verdict.rule, f"next_pos({args['seq']}) is {outcome.value!r}, "
                                                      f"the spec says {verdict.value}")
            if method == "seq_add":   # a moved row's upper-layer K/V hold its old position: no oracle with layers
                seq = args["seq"]
                for uid, pos in self.next_table.held.get(seq, {}).items():
                    if self.table.held.get(seq, {}).get(uid) != pos:
                        self.written_over[uid] = SHIFTED
            self.table = self.next_table
            self.observe(f"after {method}({', '.join(map(repr, args.values()))})", verdict.rule)
        return self.result.steps.pop()

    def decode(self, step: Step) -> Optional[Step]:
        seqs = list(step["seqs"])
        positions, gap = self.positions(seqs, step.get("positions"))
        if gap and GAPS not in (self.scope or self.target.scope).features:
            self.result.skipped.add(f"a decode past a sequence's next position (a gap) needs the scope feature "
                                    f"{GAPS!r}: the program ends there unjudged")
            raise Unjudged()
        if self.kept_back("decode", {"seq_ids": seqs, "positions": positions}):
            return NOT_SENT
        tokens = [token_of(self.uids + i) for i in range(len(seqs))]
        concrete: Step = {"op": "decode", "seqs": seqs, "positions": positions}
        self.result.steps.append(concrete)
        args = {"seq_ids": seqs, "positions": positions, "tokens": tokens}
        verdict, outcome = self.checked("decode", args)
        if isinstance(verdict, Accepted):
            below = {seq: [uid for _, _, uid in sorted(self.entries(self.table, seq))] for seq in set(seqs)}
            for i, (seq, uid) in enumerate(zip(seqs, range(self.uids, self.uids + len(seqs)))):
                self.tokens[uid] = tokens[i]
                self.written_over[uid] = tuple(below[seq])
                below[seq].append(uid)
            self.uids += len(seqs)
            self.table = self.next_table
            self.check_outputs(seqs, positions, outcome.value)
            self.observe(f"after decode({seqs}, {positions})", "CELL-OWNERS")
        return self.result.steps.pop()

    def state_step(self, step: Step) -> Optional[Step]:
        """A save or load step (CELL-STATE); NOT_SENT when the scope leaves out seq-state or a load has nothing
        to load (a shrunk program without its save)."""
        if STATE not in (self.scope or self.target.scope).features:
            self.result.skipped.add(f"scope: seq_save and seq_load not sent: the target's scope leaves out "
                                    f"'{STATE}'")
            return NOT_SENT
        if step["op"] == "load" and self.saved is None:
            return NOT_SENT
        seq: Any = step.get("seq")
        if om._is_int(seq) and 0 <= seq < om.MAX_SEQS:
            self.named.add(seq)
        self.result.steps.append(dict(step))
        if step["op"] == "save":
            args: dict[str, Any] = {"seq": seq, "file": bool(step.get("file"))}
            verdict, outcome = self.checked("seq_save", args)
            if isinstance(verdict, Accepted):
                try:
                    data = base64.b64decode(outcome.value, validate=True)
                except (ValueError, TypeError):
                    raise self._fail(WRONG, "CELL-STATE", f"seq_save({seq!r}) answered {str(outcome.value)[:60]!r}: "
                                                          "not a state's bytes in base64") from None
                rows = sorted(self.table.held.get(seq, {}).items(), key=lambda row: row[1])
                self.saved = (data, args["file"], rows)
                self.observe(f"after seq_save({seq!r})", "CELL-STATE")   # saving changes nothing
            return self.result.steps.pop()
        assert self.saved is not None
        data, file, rows = self.saved
        form = step.get("form", WHOLE)
        args = {"seq": seq, "data": base64.b64encode(broken_state(data, form)).decode(), "file": file}
        self.result.steps[-1] = {**step, "case": form}   # a broken form is a cause of its own (suite/account.py)
        verdict, outcome = self.checked("seq_load", args)
        self.past_load = "after a state restored" if isinstance(verdict, Accepted) else f"after a {form} state refused"
        if isinstance(verdict, Accepted):
            for uid, new in self.restored.items():   # the saved rows' K/V, in new cells: alike but for their uids
                self.tokens[new] = self.tokens[uid]
                self.written_over[new] = tuple(self.restored.get(below, below) for below in self.written_over[uid])
            self.uids += len(self.restored)
            self.table = self.next_table
            self.observe(f"after seq_load({seq!r}, <{form} state>)", "CELL-STATE")
        return self.result.steps.pop()

    def kept_back(self, method: str, args: dict[str, Any]) -> bool:
        """Whether the call breaks a precondition the target's scope requires (SPEC.md 6.1): then it is not
        sent, the model does not follow it either (the spec refuses it, or - a partial copy - it is left out
        of the program), and the report says so."""
        name = broken((self.scope or self.target.declared_scope()).requires, method, args, self.table.held)
        if name is not None:
            self.result.skipped.add(not_sent_note(name))
        return name is not None

    # --- CELL-RECOMPUTE --------------------------------------------------------------------------------
    def check_outputs(self, seqs: list[int], positions: list[int], outputs: Any) -> None:
        shown = f"decode({seqs}, {positions})"
        if not isinstance(outputs, list) or len(outputs) != len(seqs) or not all(isinstance(row, list) and row and all(
                type(x) in (int, float) for x in row) for row in outputs):
            raise self._fail(WRONG, "CELL-RECOMPUTE", f"{shown}: not one output vector (a list of numbers) per "
                                                      f"token: {str(outputs)[:160]}")
        checked = range(len(seqs)) if len(seqs) <= CHECK_ALL else \
            sorted({0} | {max(i for i, s in enumerate(seqs) if s == seq) for seq in set(seqs)})
        for i in checked:
            rows = cm.recompute_rows(self.entries(self.table, seqs[i]), positions[i])
            if not cm.recompute_decidable(self.ocfg.n_layers, rows, self.written_over):
                self.result.skipped.add("a token whose rows were not all written over the rows now below them "
                                        "(a removal or fork under them since) is not checked with more than one "
                                        "layer: its recompute is not its oracle")
                continue
            want = self.recompute(rows)
            if want is None:
                continue
            if not cm.outputs_agree(outputs[i], want):
                worst = max(abs(g - w) for g, w in zip(outputs[i], want)) if len(outputs[i]) == len(want) else None
                raise self._fail(WRONG, "CELL-RECOMPUTE", f"{shown}: token {i} (seq {seqs[i]}, position "
                                                          f"{positions[i]}) answers an output that differs from "
                                                          f"its recompute over the spec's rows at positions "
                                                          f"{_spans([p for p, _, _ in rows])} (max difference "
                                                          f"{worst if worst is None else round(worst, 4)})")
            self._exercise_recompute()

    def recompute(self, rows: tuple[cm.Entry, ...]) -> Optional[list[float]]:
        """The target's own recompute of the last row over `rows` (cached per row set); None when refused."""
        key = (tuple(t for _, t, _ in rows), tuple(p for p, _, _ in rows))
        if key not in self.recomputed:
            got = self._call("recompute", {"tokens": list(key[0]), "positions": list(key[1])}, "CELL-RECOMPUTE")
            ok = got.ok and isinstance(got.value, list) and got.value and \
                all(type(x) in (int, float) for x in got.value)
            if not ok:
                self.result.skipped.add(f"the target refused a recompute ({(got.error or repr(got.value))[:80]}): "
                                        f"those tokens are not checked")
            self.recomputed[key] = got.value if ok else None
        value: Optional[list[float]] = self.recomputed[key]
        return value

    def _exercise_recompute(self) -> None:
        self.result.exercised.add("CELL-RECOMPUTE")


def _spans(positions: list[int]) -> str:
    """Positions as runs: [0, 1, 2, 5] -> '0-2, 5'."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs) or "none"


# --- past a lenient fork onto a live destination ----------------------------------------------------------

class RecomputeConsequences(Consequences):
    """Past a served seq_cp onto a destination that holds tokens (lenient OP-FORK): the destination's next
    token must attend one history, whichever the target chose - its own rows kept, or the copy's. An output
    that is neither recompute attends two rows at some position: the merge OP-FORK exists to prevent."""

    atomic_rule = "OP-ATOMIC"

    def after_entry(self) -> None:
        engine = self.engine
        assert isinstance(engine, RecomputeEngine)
        if self.call is None or self.call[0] != "seq_cp" or not self.call[2].ok:
            return
        src, dst, upto = (self.call[1][k] for k in ("src", "dst", "upto"))
        if not all(om._is_int(x) and 0 <= x < om.MAX_SEQS for x in (src, dst)) or src == dst:
            return
        own = engine.entries(engine.table, dst)
        copy = [e for e in engine.entries(engine.table, src) if upto is None or e[0] < upto]
        if not own or not copy:
            return
        nxt = self._int("next_pos", {"seq": dst})
        if nxt is None or nxt <= max(e[0] for e in own + copy):
            return
        histories = [tuple(sorted(rows)) for rows in (own, copy)]
        if not all(cm.recompute_decidable(engine.ocfg.n_layers, rows, engine.written_over) for rows in histories):
            return   # with more than one layer a recompute over rows written over others is no oracle (CELL-RECOMPUTE)
        token = token_of(engine.uids)
        engine.uids += 1
        self.steps.append({"op": "decode", "seqs": [dst], "positions": [nxt]})
        got = self._ask("decode", {"seq_ids": [dst], "positions": [nxt], "tokens": [token]})
        if not got.ok or not isinstance(got.value, list) or len(got.value) != 1:
            return
        candidates = [engine.recompute(rows + ((nxt, token, -1),)) for rows in histories]
        if any(want is None for want in candidates):
            return
        if not any(cm.outputs_agree(got.value[0], want) for want in candidates if want is not None):
            raise self._broken("SAFE-ONE-HISTORY", f"decode([{dst}], [{nxt}]) answers an output that is neither its "
                                                   f"recompute over seq {dst}'s own rows (positions "
                                                   f"{_spans(sorted(p for p, _, _ in own))}) nor over the copy of seq "
                                                   f"{src}'s (positions {_spans(sorted(p for p, _, _ in copy))}): it "
                                                   f"attends two rows at one position")

    def run_step(self, step: Step) -> None:
        """The probe right after the entry is the whole drive: past it the model's table no longer says what
        any row is."""

    def check_table(self, context: str) -> None:
        """Nothing more is judged (see run_step)."""


def drive_on(engine: Any, program: list[Step], entry: Finding) -> None:
    """The engine's drive past a lenient or over-strict entry (engine.Drive)."""
    RecomputeConsequences(engine, entry).drive([])


def run_program(target: Any, cfg: JsonConfig, program: list[Step], exact: bool = False,
                scope: Any = None, row_budget: Optional[int] = None) -> RunResult:
    """One program on a cell target seen through its outputs, driven past a lenient fork."""
    return RecomputeEngine(target, cfg, exact, scope=scope, row_budget=row_budget, drive=drive_on).run(program)


__all__ = ["CONFIGS", "RecomputeEngine", "Stop", "bad_configs", "edge_programs", "random_program", "run_program",
           "sent", "state_programs"]
