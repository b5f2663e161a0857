"""The argument contract of every face, as data: one clause per argument property a caller can break.

Each clause names the rule it belongs to (spec/rules.py), the faces (conformance layouts) whose calls
take the argument, the call and the argument, and the *kind* of property - which decides the
malformations the conformance suite derives from it (spec/conformance/malform.py):

- DIM: one dimension of a tensor argument (or of k and v together: `argument` "k, v") has a size
  (`size`: a config field, or q_len); broken by 0, 1, n-1, n+1 and `other` (the size another argument
  or dimension has: the MLA mix-up);
- TENSOR: a tensor argument's element type and rank; broken by another dtype and another rank;
- ID: an int (bool is not) in [0, n) (`size` names n); broken by -1, n, a bool, a float, a huge value;
- INT: an int (bool is not) with a lower bound (`low`, a literal or another argument) and maybe an upper
  (`size`, inclusive: a literal, another argument, or a config field - then the clause binds only the
  configs that set it); broken by one below, a bool, a float, one above (or a huge value);
- POSITIONS: a list of positions; broken by a repeat, descending order, a position the sequence already
  holds, a gap (only where the clause forbids gaps), a negative and the int32 limit;
- LIST: a non-empty list; broken by an empty list and by what is not a list.
- CONFIG: a configuration key the target is created with (`call` "create"), by type (a bool, a float, a
  string, null where it is not allowed), range (0, a negative), enumeration (an unknown value) and its
  relation to the other keys (a policy count, a flat layer with a window); each clause lists its own
  variants, and the suite's invalid configurations are derived from them (malform.config_cases).

The clause text says, in the SPEC's words, what holds; the id is `FACE.call.argument[.property]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

DIM, TENSOR, ID, INT, POSITIONS, LIST, CONFIG = "dim", "tensor", "id", "int", "positions", "list", "config"
OP_FACES = ("op-contiguous", "op-cell")
OP_CELL, OP_CONTIGUOUS, SEQUENCE, CELL = ("op-cell",), ("op-contiguous",), ("sequence",), ("cell",)


@dataclass(frozen=True)
class Clause:
    id: str
    rule: str                  # the rule of spec/rules.py the clause is part of
    faces: tuple[str, ...]     # the conformance layouts whose calls take the argument
    call: str
    argument: str
    kind: str
    text: str
    size: str = ""             # DIM: the config field (or q_len); ID: n; INT: the inclusive upper bound
    axis: int = -1             # DIM: the dimension
    other: str = ""            # DIM: the size another argument has here (a config field)
    low: str = "0"             # INT: the lower bound (a literal or another argument's name)
    variants: tuple[str, ...] = ()   # the malformations of this clause, when not the kind's all
    feature: str = ""          # the scope feature (scope.py) a target needs to be judged on the clause


def _op_dims(argument: str, sizes: tuple[str, ...], others: tuple[str, ...]) -> tuple[Clause, ...]:
    names = ("batch", "heads", "q_len", "width") if argument != "position" else ("q_len", "cols")
    shape = "[B, Hkv, q_len, D]" if argument == "k" else "[B, Hkv, q_len, Dv]" if argument == "v" else "[q_len, 1]"
    return tuple(Clause(f"op.update_and_fetch.{argument}.{name}", "OP-ARGS", OP_FACES, "update_and_fetch", argument,
                        DIM, f"{argument} is {shape}: dimension {axis} is {size}", size, axis, other,
                        feature="positions" if argument == "position" else "")
                 for axis, (name, size, other) in enumerate(zip(names, sizes, others)))


CLAUSES: tuple[Clause, ...] = (
    # --- the op face (SPEC.md part 5): update_and_fetch(layer_id, k, v, position)
    *_op_dims("k", ("batch_size", "n_kv_heads", "q_len", "head_dim"), ("n_kv_heads", "batch_size", "", "v_head_dim")),
    *_op_dims("v", ("batch_size", "n_kv_heads", "q_len", "v_head_dim"), ("n_kv_heads", "batch_size", "", "head_dim")),
    *_op_dims("position", ("q_len", "1"), ("", "q_len")),
    # K and V together: they agree with each other and not with the config or the step (a runner passing the
    # wrong pair: one token's K and V over a step's positions, a batch of one in a batch-B cache)
    # (on the token axis it is position that disagrees with them: a contiguous cache may leave position unread)
    *(Clause(f"op.update_and_fetch.kv.{name}", "OP-ARGS", OP_FACES, "update_and_fetch", "k, v", DIM,
             f"k and v agree on dimension {axis} and still must be {size}, as position and the config say", size, axis,
             feature="positions" if name == "q_len" else "")
      for axis, (name, size) in enumerate((("batch", "batch_size"), ("heads", "n_kv_heads"), ("q_len", "q_len")))),
    Clause("op.update_and_fetch.q_len", "OP-ARGS", OP_FACES, "update_and_fetch", "k, v, position", DIM,
           "q_len >= 1, equal across k, v and position", "q_len", 2, variants=("0",)),
    Clause("op.update_and_fetch.q_len.max_write", "OP-MAX-WRITE", OP_CONTIGUOUS, "update_and_fetch", "k, v, position",
           INT, "with max_write set and a ring layer, q_len <= max_write on every layer", "max_write", low="1",
           variants=("above",), feature="max_write"),
    Clause("op.update_and_fetch.k.tensor", "OP-ARGS", OP_FACES, "update_and_fetch", "k", TENSOR,
           "k is a floating-point tensor of 4 dimensions"),
    Clause("op.update_and_fetch.v.tensor", "OP-ARGS", OP_FACES, "update_and_fetch", "v", TENSOR,
           "v is a floating-point tensor of 4 dimensions"),
    Clause("op.update_and_fetch.position.tensor", "OP-ARGS", OP_FACES, "update_and_fetch", "position", TENSOR,
           "position is an integer tensor of 2 dimensions", feature="positions"),
    Clause("op.update_and_fetch.layer_id", "OP-ARGS", OP_FACES, "update_and_fetch", "layer_id", ID,
           "layer_id is an int (not bool) in [0, n_layers)", "n_layers"),
    Clause("op.update_and_fetch.position.range", "OP-POS", OP_FACES, "update_and_fetch", "position", POSITIONS,
           "every position is an int in [0, 2**31 - 2]", variants=("negative", "int32"), feature="positions"),
    Clause("op.update_and_fetch.position.order", "OP-POS", OP_CELL, "update_and_fetch", "position", POSITIONS,
           "within a step one sequence's positions strictly increase, each newer than every position it holds",
           variants=("repeat", "descending", "held"), feature="positions"),
    Clause("op.update_and_fetch.position.continue", "OP-POS", OP_CONTIGUOUS, "update_and_fetch", "position",
           POSITIONS, "the step's positions continue the layer's history with no gap",
           variants=("repeat", "descending", "held", "gap"), feature="positions"),
    Clause("op.trim.n", "OP-TRIM", OP_CONTIGUOUS, "trim", "n", INT, "trim's n is an int (not bool) in [0, held]",
           "held", feature="trim"),
    # OP-PAD, OP-ROWS: the batch verbs' arguments (a list's own length and repeats are the programs' cases)
    Clause("op.pad.left_padding", "OP-PAD", OP_CONTIGUOUS, "pad", "left_padding", INT,
           "pad's counts are ints (not bool) in [0, capacity]", "capacity", feature="pad"),
    Clause("op.select.rows", "OP-ROWS", OP_CONTIGUOUS, "select", "rows", LIST, "select(rows): a non-empty list",
           feature="select"),
    Clause("op.select.rows.id", "OP-ROWS", OP_CONTIGUOUS, "select", "rows", ID,
           "select's rows are ints (not bool) in [0, batch_size)", "batch_size", feature="select"),
    Clause("op.reorder.rows.id", "OP-ROWS", OP_CONTIGUOUS, "reorder", "rows", ID,
           "reorder's rows are ints (not bool) in [0, batch_size)", "batch_size", feature="batch-verbs"),
    Clause("op.repeat.times", "OP-ROWS", OP_CONTIGUOUS, "repeat", "times", INT, "repeat's times is an int (not "
           "bool) >= 1", low="1", feature="batch-verbs"),
    # OP-ROWS: extract(row), one row out as a cache of its own (extend's other is the programs' case: its forms)
    Clause("op.extract.row", "OP-ROWS", OP_CONTIGUOUS, "extract", "row", ID,
           "extract's row is an int (not bool) in [0, batch_size)", "batch_size", feature="merge"),
    # OP-QUANTIZE: quantize(bits) (a second quantize is the programs' case, not an argument's)
    Clause("op.quantize.bits", "OP-QUANTIZE", OP_CONTIGUOUS, "quantize", "bits", INT,
           "quantize's bits is an int (not bool) in [2, 8]", "8", low="2", feature="quantize"),
    Clause("op.begin_step.seq_ids", "OP-STEP", OP_CELL, "begin_step", "seq_ids", LIST,
           "begin_step(seq_ids): a non-empty list"),
    Clause("op.begin_step.seq_ids.id", "OP-STEP", OP_CELL, "begin_step", "seq_ids", ID,
           "begin_step's ids are ints in [0, 63)", "63"),
    Clause("op.seq_cp.src_id", "OP-FORK", OP_CELL, "seq_cp", "src_id", ID, "seq_cp's src_id is an int in [0, 63)",
           "63"),
    Clause("op.seq_cp.dst_id", "OP-FORK", OP_CELL, "seq_cp", "dst_id", ID, "seq_cp's dst_id is an int in [0, 63)",
           "63"),
    Clause("op.seq_cp.upto", "OP-FORK", OP_CELL, "seq_cp", "upto", INT, "seq_cp's upto is None or an int >= 0"),
    Clause("op.seq_rm.seq_id", "OP-RM", OP_CELL, "seq_rm", "seq_id", ID, "seq_rm's seq_id is an int in [0, 63)",
           "63"),
    Clause("op.seq_rm.p0", "OP-RM", OP_CELL, "seq_rm", "p0", INT, "seq_rm's p0 is an int >= 0"),
    Clause("op.seq_rm.p1", "OP-RM", OP_CELL, "seq_rm", "p1", INT, "seq_rm's p1 is None or an int >= p0", low="p0"),
    # --- the op faces' configurations (SPEC.md part 5, OP-CONFIG): create(config), per key; each refused (OP-CONFIG)
    *(Clause(f"op.create.{key}", "OP-CONFIG", OP_FACES, "create", key, CONFIG, f"{key} is an int >= 1 (not bool)",
             variants=("0", "negative", "bool", "float", "string", "null"))
      for key in ("capacity", "n_layers", "n_kv_heads", "head_dim", "batch_size")),
    # v_head_dim absent means head_dim; null is left to the target (a Python API's None default means the same)
    Clause("op.create.v_head_dim", "OP-CONFIG", OP_FACES, "create", "v_head_dim", CONFIG,
           "v_head_dim is an int >= 1 (not bool), head_dim when absent",
           variants=("0", "negative", "bool", "float", "string")),
    Clause("op.create.max_write", "OP-CONFIG", OP_FACES, "create", "max_write", CONFIG,
           "max_write is null or an int >= 1 (not bool)", variants=("0", "negative", "bool", "float", "string")),
    # (no clause for `sizing` or `initial_capacity`: a target may ignore them: spec/PROTOCOL.md, "Op-face targets")
    Clause("op.create.layers", "OP-CONFIG", OP_FACES, "create", "layers", CONFIG,
           "layers is a list of one policy, or of one per layer (n_layers)", variants=("count", "empty", "not a list")),
    Clause("op.create.layers.kind", "OP-CONFIG", OP_FACES, "create", "layers", CONFIG,
           'a layer policy\'s kind is "flat" or "ring"', variants=("unknown", "null", "bool")),
    Clause("op.create.layers.window", "OP-CONFIG", OP_FACES, "create", "layers", CONFIG,
           "a layer policy's window is an int: 0 for a flat layer, >= 1 for a ring",
           variants=("flat with a window", "ring window 0", "negative", "bool", "float", "string", "null")),
    Clause("op.create.batch_size.cell", "OP-BATCH", OP_CELL, "create", "batch_size", CONFIG,
           "a cell cache has batch_size 1", variants=("n+1",)),
    # --- the sequence face (SPEC.md sections 2.3-2.7): plan, can_extend, rewind, depth, retained_from
    Clause("sequence.plan.layer", "LAYER-RANGE", SEQUENCE, "plan", "layer", ID,
           "plan takes 0 <= layer < n_layers, an int (ARG-INT)", "n_layers"),
    Clause("sequence.plan.position", "ARG-RANGE", SEQUENCE, "plan", "position", INT,
           "position is an int in [0, INT_MAX]", "INT_MAX"),
    Clause("sequence.plan.position.append", "STEP-APPEND", SEQUENCE, "plan", "position", POSITIONS,
           "position == length (a new step) or the open step's", variants=("gap", "held")),
    Clause("sequence.plan.T", "STEP-T", SEQUENCE, "plan", "T", INT, "a step has T >= 1 new tokens, an int",
           "INT_MAX", low="1"),
    Clause("sequence.plan.T.max_write", "STEP-T-MAX", SEQUENCE, "plan", "T", INT,
           "T <= max_write of every ring layer", "limit", low="1", variants=("above",)),
    Clause("sequence.can_extend.n", "ARG-RANGE", SEQUENCE, "can_extend", "n", INT, "n is an int in [0, INT_MAX]",
           "INT_MAX"),
    Clause("sequence.rewind.new_len", "ARG-RANGE", SEQUENCE, "rewind", "new_len", INT,
           "new_len is an int in [0, INT_MAX]", "INT_MAX"),
    Clause("sequence.rewind.new_len.grow", "REWIND-GROW", SEQUENCE, "rewind", "new_len", INT,
           "rewind(new_len) with new_len > length is refused", "length", variants=("above",)),
    Clause("sequence.depth.layer", "LAYER-RANGE", SEQUENCE, "depth", "layer", ID,
           "depth takes 0 <= layer < n_layers", "n_layers"),
    Clause("sequence.retained_from.layer", "LAYER-RANGE", SEQUENCE, "retained_from", "layer", ID,
           "retained_from takes 0 <= layer < n_layers", "n_layers"),
    # --- the cell face (SPEC.md part 4): seq ids, ranges, declare_step, place_step
    *(Clause(f"cell.{call}.{argument}", "CELL-SEQ-ID", CELL, call, argument, ID,
             f"{call}'s {argument} is an int in [0, max_seqs)", "max_seqs")
      for call, argument in (("seq_len", "seq_id"), ("next_pos", "seq_id"), ("seq_rm", "seq_id"),
                             ("seq_clone", "src"), ("declare_step", "seq_ids"))),
    Clause("cell.declare_step.seq_ids.list", "CELL-DECLARE", CELL, "declare_step", "seq_ids", LIST,
           "declare_step takes a non-empty list or tuple"),
    Clause("cell.seq_clone.upto", "CELL-FORK", CELL, "seq_clone", "upto", INT,
           "upto is None or an int in [0, INT_MAX]", "INT_MAX"),
    Clause("cell.seq_rm.p0", "CELL-RM", CELL, "seq_rm", "p0", INT, "p0 is an int in [0, INT_MAX]", "INT_MAX"),
    Clause("cell.seq_rm.p1", "CELL-RM", CELL, "seq_rm", "p1", INT, "p1 is None or an int with p0 <= p1 <= INT_MAX",
           "INT_MAX", low="p0"),
    Clause("cell.can_extend.n", "CELL-USED-END", CELL, "can_extend", "n", INT, "n is an int in [0, INT_MAX]",
           "INT_MAX"),
    Clause("cell.place_step.layer", "LAYER-RANGE", CELL, "place_step", "layer", ID,
           "place_step takes 0 <= layer < n_layers", "n_layers"),
    Clause("cell.place_step.positions", "CELL-POS", CELL, "place_step", "positions", POSITIONS,
           "one int in [0, INT_MAX - 1] per token, each newer than its sequence holds and than its earlier tokens",
           variants=("repeat", "descending", "held", "negative", "int32", "not a list")),
)

BY_ID: dict[str, Clause] = {clause.id: clause for clause in CLAUSES}
assert len(BY_ID) == len(CLAUSES), "clause ids are unique"

# The malformations each kind of clause is broken by, in the order they are tried.
VARIANTS: dict[str, tuple[str, ...]] = {
    DIM: ("0", "1", "n-1", "n+1", "other"),
    TENSOR: ("dtype", "rank"),
    ID: ("-1", "n", "bool", "float", "huge"),
    INT: ("below", "bool", "float", "above"),
    POSITIONS: ("repeat", "gap", "descending", "held", "negative", "int32"),
    LIST: ("empty", "not a list"),
    CONFIG: (),   # each configuration clause lists its own
}


def variants(clause: Clause) -> tuple[str, ...]:
    return clause.variants or VARIANTS[clause.kind]


def of_face(face: str) -> tuple[Clause, ...]:
    return tuple(clause for clause in CLAUSES if face in clause.faces)


def clause_rule(clause_id: str) -> Optional[str]:
    clause = BY_ID.get(clause_id)
    return clause.rule if clause is not None else None
