"""Op-face programs: the suite's configurations for the two op layouts, edge and random programs.

Programs are JSON step lists (spec/PROTOCOL.md, "Op-face programs"):

- {"op": "fetch", "layer": L, "n": q}: update_and_fetch on layer L with the next positions (the step's
  own when the step already has them, else the sequence's next ones); {"positions": [...]} instead of
  "n" gives them explicitly; "clause" and "variant" (malform.py) break one clause of the argument
  contract (spec/arguments.py): a dimension, a dtype or rank, the positions;
- begin(...), {"op": "cp", "src", "dst", "upto"}, {"op": "rm", "seq", "p0", "p1"}:
  the cell cache's begin_step, seq_cp, seq_rm; {"op": "reset"};
- contiguous: {"op": "trim", "n"}; {"op": "pad", "left_padding"}, {"op": "select" / "reorder", "rows"},
  {"op": "repeat", "times"} (OP-PAD, OP-ROWS: sent only to a target with the `pad` / `batch-verbs` feature);
  {"op": "extend", "batch", "pads", "form"}, {"op": "extract", "row"}, {"op": "swap"} (OP-ROWS on a second
  cache, the side cache: sent only to a target with the `merge` feature; merge.py).

"Next" positions are resolved against the model when the step runs, so a program the shrinker cut
still means a well-formed step where it meant one; `RunResult.steps` holds the concrete positions.
"""

from __future__ import annotations

import random
from typing import Any, Optional

from ...arguments import DIM, ID, INT, LIST, POSITIONS, TENSOR
from ..configs import JsonConfig, config, layer
from ..engine import Step
from ..malform import Case, case_of, cases, config_cases, id_value, int_value, step_bound, tokens_of
from ..scope import Scope


def op_config(capacity: int, windows: tuple[int, ...] = (0,), n_layers: Optional[int] = None, heads: int = 1,
              head_dim: int = 2, v_head_dim: Optional[int] = None, batch: int = 1,
              sizing: str = "dynamic", max_write: Optional[int] = None, keep: int = 0, chunks: tuple[int, ...] = (),
              record_past: Optional[bool] = None) -> JsonConfig:
    """A JSON op config; the layer entries repeat the shape so the shared shrinker can read them. `keep`:
    the sinks of every ring layer (OP-SINKS; said only when not 0); `chunks`: per layer, a chunk layer's chunk
    size where it is not 0 (OP-CHUNK; its window 0); `record_past` said only when given (OP-RECORD)."""
    chunk_of = chunks or (0,) * len(windows)
    layers = [{**layer("chunk" if c else "ring" if w else "flat", w, heads, head_dim),
               **({"keep": keep} if keep and w else {}), **({"chunk": c} if c else {})}
              for w, c in zip(windows, chunk_of)]
    return {**config(capacity, layers, n_layers, max_write=max_write), "n_kv_heads": heads, "head_dim": head_dim,
            "v_head_dim": head_dim if v_head_dim is None else v_head_dim, "batch_size": batch, "sizing": sizing,
            **({"record_past": record_past} if record_past is not None else {})}


CONTIGUOUS_CONFIGS: tuple[JsonConfig, ...] = (
    op_config(8, (0,), n_layers=2),
    op_config(6, (0,), sizing="static"),
    op_config(10, (3, 0)),                                   # a window and a flat layer
    op_config(8, (0,), n_layers=2, heads=2, batch=2),        # batch rows and heads
    op_config(8, (3,), heads=2, batch=2),                    # batch rows and heads in a ring
    op_config(6, (1,), sizing="static"),                     # window 1
    op_config(8, (0,), n_layers=2, v_head_dim=3),            # MLA: a value width of its own
    # OP-MAX-WRITE, the MLX runtime's rings: max_write = the window (its default), below it, above it
    op_config(10, (3, 0), max_write=3),
    op_config(9, (4,), max_write=2, sizing="static"),
    op_config(8, (2, 0), max_write=3),
    # OP-SINKS: a ring with sinks beside a flat layer; sinks with max_write (the ring's floor moves by it)
    op_config(10, (4, 0), keep=1),
    op_config(9, (3,), keep=1, max_write=2, sizing="static"),
    # the field's setups (docs/hf-findings.md, docs/mlxlm-findings.md): sinks as mlx-lm's make_prompt_cache keeps
    # them (keep 4); a window wider than the capacity (transformers' StaticCache with max_cache_len < sliding_window)
    op_config(10, (6,), keep=4),
    op_config(3, (4,), sizing="static"),
    # OP-CHUNK: a chunk of 3 beside a flat layer (llama4's chunked and global layers), a boundary three tokens in;
    # a chunk of 2 beside a ring laid out as a ring; a chunk of 1 (every query attends itself alone)
    op_config(10, (0, 0), chunks=(3, 0)),
    op_config(9, (0, 3), chunks=(2, 0), max_write=2),
    op_config(5, (0,), chunks=(1,), sizing="static"),
    # OP-RECORD: a recording ring beside a flat layer (transformers' sliding layers); one of a ring laid out as
    # a ring but for the recording, with sinks
    op_config(10, (3, 0), record_past=True),
    op_config(9, (3,), max_write=2, record_past=True, sizing="static"),
    op_config(10, (4,), keep=1, record_past=True),
    # OP-PAD, OP-ROWS: three batch rows over a ring laid out as a ring and a flat layer (beams, left padding)
    op_config(8, (2, 0), batch=3, max_write=2),
)
CELL_CONFIGS: tuple[JsonConfig, ...] = (
    op_config(8, (0,), n_layers=2),
    op_config(4, (0,), sizing="static"),
    op_config(12, (0, 2)),                                   # mixed windows
    op_config(10, (3,), heads=2),
    op_config(8, (0,), n_layers=2, v_head_dim=3, sizing="static"),   # MLA
)


# The invalid configurations a target must refuse (OP-CONFIG; OP-BATCH: a cell cache of batch 2), derived
# from the configuration clauses of spec/arguments.py (malform.config_cases), one per clause and variant.
BAD_OP_CONFIGS: tuple[tuple[str, JsonConfig], ...] = tuple((case.name, cfg) for case, cfg in config_cases("op-cell"))


def _bad(name: str, **change: Any) -> tuple[str, JsonConfig]:
    return name, {**op_config(4, (0,)), **change}


# OP-SINKS: keep at or above the window (no position left for the window part), negative, not an int. Sent
# only to a target with `sinks`: for another, every config with a keep lies outside its scope (refused at
# creation, SCOPE-BORDER), and these are among them.
BAD_SINK_CONFIGS: tuple[tuple[str, JsonConfig], ...] = (
    _bad("keep at the window", layers=[{**layer("ring", 2), "keep": 2}]),
    _bad("keep 4 at the window", layers=[{**layer("ring", 4), "keep": 4}]),   # make_prompt_cache(max_kv_size=4)
    _bad("keep above the window", layers=[{**layer("ring", 2), "keep": 3}]),
    _bad("keep -1", layers=[{**layer("ring", 2), "keep": -1}]),
    _bad("keep true", layers=[{**layer("ring", 2), "keep": True}]),
    _bad("a flat layer with a keep", layers=[{**layer("flat"), "keep": 1}]),
)


# OP-CHUNK: a chunk of 0 (no query has a chunk), negative or not an int, a chunk on a flat or a ring layer, a
# chunk layer with a window; OP-RECORD: record_past not a bool. Sent only to a target with `chunk` / `recording`
# (for another they lie outside its scope, like the sinks' above).
BAD_CHUNK_CONFIGS: tuple[tuple[str, JsonConfig], ...] = (
    _bad("chunk 0", layers=[{**layer("chunk"), "chunk": 0}]),
    _bad("chunk -1", layers=[{**layer("chunk"), "chunk": -1}]),
    _bad("chunk true", layers=[{**layer("chunk"), "chunk": True}]),
    _bad("chunk 2.0", layers=[{**layer("chunk"), "chunk": 2.0}]),
    _bad("a chunk layer without a chunk", layers=[layer("chunk")]),
    _bad("a chunk layer with a window", layers=[{**layer("chunk", 2), "chunk": 2}]),
    _bad("a flat layer with a chunk", layers=[{**layer("flat"), "chunk": 2}]),
    _bad("a ring layer with a chunk", layers=[{**layer("ring", 2), "chunk": 2}]),
    _bad("record_past 1", record_past=1),
    _bad("record_past 'yes'", record_past="yes"),
)


def bad_contiguous_configs(validates_configs: bool) -> list[JsonConfig]:
    """The invalid configs a target must refuse (an op target builds its own config from the JSON)."""
    return [cfg for _, cfg in config_cases("op-contiguous")] + [cfg for _, cfg in BAD_SINK_CONFIGS + BAD_CHUNK_CONFIGS]


def bad_cell_configs(validates_configs: bool) -> list[JsonConfig]:
    return [cfg for _, cfg in config_cases("op-cell")]


def fetch(layer_id: Any, n: int = 1, **extra: Any) -> Step:
    return {"op": "fetch", "layer": layer_id, "n": n, **extra}


def at(layer_id: Any, positions: list[Any], **extra: Any) -> Step:
    return {"op": "fetch", "layer": layer_id, "positions": positions, **extra}


def forward(cfg: JsonConfig, n: int) -> list[Step]:
    """Contiguous: one step of n next tokens on every layer."""
    return [fetch(layer_id, n) for layer_id in range(cfg["n_layers"])]


def cforward(cfg: JsonConfig, *seqs: int) -> list[Step]:
    """Cell: declare the owners, then every layer with the next positions."""
    return [{"op": "begin", "seqs": list(seqs)}] + [fetch(layer_id) for layer_id in range(cfg["n_layers"])]


def cp(src: Any, dst: Any, upto: Any = None) -> Step:
    return {"op": "cp", "src": src, "dst": dst, "upto": upto}


def rm(seq: Any, p0: Any = 0, p1: Any = None) -> Step:
    return {"op": "rm", "seq": seq, "p0": p0, "p1": p1}


def begin(*seqs: Any) -> Step:
    return {"op": "begin", "seqs": list(seqs)}


RESET: Step = {"op": "reset"}


# OP-PAD, OP-ROWS: the batch verbs (a target without `pad` / `batch-verbs` is sent none: the engine leaves them out)
BATCH_OPS = ("pad", "select", "reorder", "repeat")
QUANTIZE = "quantize"   # OP-QUANTIZE (quantize.py): sent only to a contiguous cache with the feature of that name
# OP-ROWS' extend and extract on the side cache (merge.py): sent only to a contiguous cache with the `merge` feature
MERGE = "merge"
MERGE_OPS = ("extend", "extract", "swap")
# OP-STATE's save and load (persist.py, which names them too): sent only to a contiguous cache with the `state` feature
STATE, STATE_OPS = "state", ("save", "load")
# the scope feature each batch verb needs (the engine sends none to an op-cell cache)
# (`batch-verbs` includes `select`, scope.INCLUDES: a target declaring it has both)
BATCH_FEATURES = {"pad": "pad", "select": "select", "reorder": "batch-verbs", "repeat": "batch-verbs"}


def sent_contiguous(program: list[Step], scope: Scope) -> list[Step]:
    """The program as a contiguous op cache of this scope is sent it: without the batch verbs whose feature it
    leaves out, without quantize (OP-QUANTIZE) unless it has the feature and declares no `lossy=<tol>`, and without
    merges (`merge`) or saves and loads (`state`) unless it has their feature (the engine would skip them when
    reached, OpEngine._batch_verb_sent, _quantize_sent, merge.sent, persist.state_sent; leaving them out up front
    keeps a finding's step index, its shrinking and --against on the program as run)."""
    features, quantized = scope.features, QUANTIZE in scope.features and scope.lossy is None
    return [step for step in program if (step.get("op") not in BATCH_OPS or BATCH_FEATURES[step["op"]] in features)
            and (step.get("op") != QUANTIZE or quantized) and (step.get("op") not in MERGE_OPS or MERGE in features)
            and (step.get("op") not in STATE_OPS or STATE in features)]


def sent_cell(program: list[Step], scope: Scope) -> list[Step]:
    """The program as an op-cell cache is sent it: no batch verbs, quantize, merges, saves nor loads (the contiguous
    cache's)."""
    return [step for step in program if step.get("op") not in (*BATCH_OPS, QUANTIZE, *MERGE_OPS, *STATE_OPS)]


MAX_BATCH = 8   # the most batch rows a program makes (repeat grows the batch; the labels' radix is sized for it)


def pad(left_padding: Any) -> Step:
    return {"op": "pad", "left_padding": left_padding}


def select(rows: Any) -> Step:
    return {"op": "select", "rows": rows}


def reorder(rows: Any) -> Step:
    return {"op": "reorder", "rows": rows}


def repeat(times: Any) -> Step:
    return {"op": "repeat", "times": times}


def batch_value(cfg: JsonConfig, step: Step, batch: int) -> Any:
    """The argument a batch verb's step sends with `batch` rows: its own, or the value its case (a clause of
    spec/arguments.py) breaks: one row index malformed among valid ones, a list that is empty or none, a
    malformed times, one malformed pad count among zeros."""
    op = step["op"]
    name = "left_padding" if op == "pad" else "times" if op == "repeat" else "rows"
    case = case_of(step)
    if case is None or case.clause.call != op:
        return step.get(name)
    clause, variant = case.clause, case.variant
    if clause.kind == LIST:
        return [] if variant == "empty" else 0
    if clause.kind == ID:
        return [id_value(variant, batch)] + (list(range(1, batch)) if op == "reorder" else [])
    if op == "repeat":
        return int_value(clause, variant)
    return [int_value(clause, variant, above=cfg["capacity"] + 1)] + [0] * (batch - 1)


def batch_programs(cfg: JsonConfig) -> list[tuple[str, list[Step]]]:
    """OP-PAD, OP-ROWS: left-padded prefills, beams started, reordered and selected (a reorder that moves a
    row without its pads is found at the next query), and each bad argument of the verbs."""
    b, cap = cfg["batch_size"], cfg["capacity"]
    if b < 2:
        return []
    pads = [min(2, cap - 2)] + [0] * (b - 1)
    swap = [b - 1 - row for row in range(b)]   # the rows reversed: a row with pads moves
    beams = [1] * b   # every beam continues row 1
    out: list[tuple[str, list[Step]]] = [
        ("left padding: prefill, decode", [pad(pads)] + forward(cfg, 3) + forward(cfg, 1)),
        ("left padding: decodes past the window", [pad(pads)] + forward(cfg, 1) * min(cap, 5)),
        ("left padding, reversed rows", [pad(pads)] + forward(cfg, 3) + [reorder(swap)] + forward(cfg, 1)),
        ("left padding, reorder, select", [pad(pads)] + forward(cfg, 3) + [reorder(beams), select([0])]
         + forward(cfg, 1)),
        ("beams: repeat, reorder, decode", forward(cfg, 2) + [repeat(2), reorder([2 * b - 1 - r for r in range(2 * b)])]
         + forward(cfg, 1)),
        ("select the last row", forward(cfg, 2) + [select([b - 1])] + forward(cfg, 1)),
        ("select mid-step", [fetch(0, 2), select(list(reversed(range(b))))] + forward(cfg, 1)),
        ("padding, reset, no padding", [pad(pads)] + forward(cfg, 2) + [RESET] + forward(cfg, 2)),
    ]
    for name, step in (("select [0, 0]", select([0, 0])), ("reorder of one row too few", reorder(list(range(b - 1)))),
                       ("pad one row too few", pad([0] * (b - 1)))):   # what no clause's case says: a length
        out.append((f"malformed {name}", forward(cfg, 1) * (step["op"] != "pad") + [step] + forward(cfg, 1)))
    for case in cases("op-contiguous", cfg):   # the verbs' argument clauses (spec/arguments.py)
        if case.clause.call in BATCH_OPS:
            out.append((f"malformed {case.name}", forward(cfg, 1) * (case.clause.call != "pad")
                        + malformed_call(cfg, case) + forward(cfg, 1)))
    out.append(("pad after a step", forward(cfg, 1) + [pad(pads)] + forward(cfg, 1)))
    return out


def extend(batch: int = 1, pads: Optional[list[int]] = None, form: str = "whole") -> Step:
    """OP-ROWS: the live cache's extend(other), other a cache of `batch` rows (padded by `pads`) that the engine builds
    beside it and replays the live cache's history on (merge.py); `form` "foreign-config" builds it with one more
    capacity, "short" replays one step fewer: both refused, nothing changed."""
    return {"op": "extend", "batch": batch, **({"pads": pads} if pads is not None else {}),
            **({"form": form} if form != "whole" else {})}


def extract(row: Any) -> Step:
    """OP-ROWS: extract(row) as a cache of its own; the program goes on with it, the original kept beside."""
    return {"op": "extract", "row": row}


SWAP: Step = {"op": "swap"}   # the live cache and the one kept beside exchange (merge.py)


def merge_programs(cfg: JsonConfig) -> list[tuple[str, list[Step]]]:
    """OP-ROWS' extend and extract (feature `merge`): an extend after decodes, each cache with its pads; one of a
    ring past its wrap; one mid-step, after a trim, of an empty cache, then an appended row extracted; an extract of a
    padded row, then decodes, and the original brought back (swap) and read; the refused forms (another config,
    another length) and each malformed row, nothing changed, every later answer judged."""
    b, cap, layers = cfg["batch_size"], cfg["capacity"], cfg["n_layers"]
    n = max(1, min(2, MAX_BATCH - b))
    held = max(1, min(3, cap - 2))   # tokens before a merge, room left for two decodes
    pad_live = [min(1, held - 1)] + [0] * (b - 1)
    pad_other = [min(2, held - 1)] + [0] * (n - 1)
    before = forward(cfg, max(1, held - 1)) + forward(cfg, 1) * (held > 1)   # a prefill, then a decode
    out: list[tuple[str, list[Step]]] = [
        ("extend after decodes, pads on both sides", [pad(pad_live)] + before + [extend(n, pad_other)]
         + forward(cfg, 1) * min(2, cap - held)),
        ("extend, no pads", before + [extend(n)] + forward(cfg, 1)),
        ("extend of an empty cache", [extend(n, pad_other)] + forward(cfg, min(2, cap - 1)) + forward(cfg, 1)),
        ("extend after a trim", before + [trim_most(1), extend(n, pad_other)] + forward(cfg, 1)),
        ("extend, then the appended row extracted", before + [extend(n, pad_other), extract(b)] + forward(cfg, 1)),
        ("extract a padded row, then decode", [pad([0] * (b - 1) + [min(2, held - 1)])] + before + [extract(b - 1)]
         + forward(cfg, 1) * min(2, cap - held)),
        ("extract, swap back, decode", [pad(pad_live)] + before + [extract(b - 1)] + forward(cfg, 1)
         * (cap - held > 1) + [SWAP] + forward(cfg, 1)),
        ("extract of an empty cache, swap back", [extract(0), SWAP] + forward(cfg, 1)),
        ("an extend of another config refused", before + [extend(n, form="foreign-config")] + forward(cfg, 1)),
        ("an extend of another length refused", before + [extend(n, form="short")] + forward(cfg, 1)),
    ]
    rings = [entry["window"] for entry in cfg["layers"] if entry["kind"] == "ring"]
    if rings:   # a ring past its wrap: the other cache's ring wrapped alike, each row its own history
        decodes = max(1, min(cap - 2, max(rings) + 2))
        out += [("extend of a ring past its wrap", forward(cfg, 1) * decodes + [extend(n, pad_other)]
                 + forward(cfg, 1) * min(2, cap - decodes)),
                ("extract of a ring past its wrap, swap back", forward(cfg, 1) * decodes + [extract(0)]
                 + forward(cfg, 1) * (cap - decodes > 1) + [SWAP] + forward(cfg, 1))]
    if layers > 1:   # mid-step: extend abandons the open step; extract leaves it open on the original
        out += [("extend mid-step", forward(cfg, 1) + [fetch(0), extend(n)] + forward(cfg, 1)),
                ("extract mid-step, swap back", forward(cfg, 1) + [fetch(0), extract(0), SWAP]
                 + [fetch(layer_id) for layer_id in range(1, layers)] + forward(cfg, 1))]
    for case in cases("op-contiguous", cfg) if b > 1 else ():   # each malformed row, where rows differ
        if case.clause.call == "extract":
            out.append((f"malformed {case.name}", forward(cfg, 1) + malformed_call(cfg, case) + forward(cfg, 1)))
    return out


def trim(n: Any, **extra: Any) -> Step:
    """Contiguous: trim(n) (OP-TRIM); sent only to a target with the `trim` feature (the engine leaves it out
    of another's program)."""
    return {"op": "trim", "n": n, **extra}


def trim_most(most: int) -> Step:
    """A well-formed trim of up to `most` tokens: n = min(most, held), resolved when the step runs (as a
    fetch's next positions are), so the trim stays one model code makes - a caller never trims more than it
    holds - in every program the shrinker cuts from it. The report's step holds the concrete n."""
    return {"op": "trim", "most": most}


def trim_n(step: Step, held: int) -> Any:
    """The n a trim step sends with `held` tokens held: its `most` form's min(most, held), else its n."""
    return min(int(step["most"]), held) if "most" in step and "n" not in step else step.get("n")


def trim_programs(cfg: JsonConfig) -> list[tuple[str, list[Step]]]:
    """OP-TRIM's edges: a speculative rollback, a trim of 0, of everything, twice, in the middle of a step,
    before and after a ring may have dropped rows (owed, then the target's choice: served, its later answers
    judged), a trim after such a trim, and each malformed n."""
    cap, layers = cfg["capacity"], cfg["n_layers"]
    rings = [entry for entry in cfg["layers"] if entry["kind"] == "ring"]
    out: list[tuple[str, list[Step]]] = [
        ("draft rejected: trim then decode", forward(cfg, min(3, cap)) + [trim(1)] + forward(cfg, 1) * 2),
        ("trim 0", forward(cfg, 2) + [trim(0)] + forward(cfg, 1)),
        ("trim everything", forward(cfg, 2) + [trim(2)] + forward(cfg, 2)),
        ("trim, decode, trim again", forward(cfg, 2) + [trim(1)] + forward(cfg, 1) + [trim(2)] + forward(cfg, 1)),
        ("trim at capacity", forward(cfg, cap) + [trim(1)] + forward(cfg, 1)),
    ]
    if layers > 1:
        out.append(("trim in the middle of a step", forward(cfg, 2) + [fetch(0, 1), trim(1)] + forward(cfg, 1)))
    chunks = [entry["chunk"] for entry in cfg["layers"] if entry["kind"] == "chunk"]
    if chunks:   # OP-CHUNK: decodes past a chunk boundary, then trims back into the chunk and across its start
        size = min(chunks)
        decodes = min(cap - 1, 2 * size + 1)
        for n in sorted({1, size, size + 1, decodes}):
            if n <= decodes:
                out.append((f"decodes past a chunk boundary, trim {n}", forward(cfg, 1) * decodes + [trim(n)]
                            + forward(cfg, 1) * 2))
        out.append(("a step across a chunk boundary, trim into it", forward(cfg, min(cap - 1, size + 1))
                    + [trim_most(1)] + forward(cfg, 1)))
    if rings and cfg.get("record_past"):   # OP-RECORD: a trim no lower than the last one left is owed however far
        # the steps between them went past the window
        steps = max(1, min(cap - 3, max(entry["window"] for entry in rings) + 1))
        out.append(("recording: decodes, trim, decodes, trim back", forward(cfg, 1) * steps + [trim_most(1)]
                    + forward(cfg, 1) * 3 + [trim_most(3)] + forward(cfg, 1)))
    if rings:   # decodes past the window, then trims of each size, and two trims in a row: a ring of the least
        # size gives back up to max_write tokens below its newest step, down to its sinks, or everything
        window = max(entry["window"] for entry in rings)
        decodes = min(cap - 1, window + (cfg.get("max_write") or 1) + 1)
        keep = max(entry.get("keep", 0) for entry in rings)
        sizes = [*range(1, min(decodes, (cfg.get("max_write") or 1) + 2) + 1), decodes - keep, decodes]
        for n in sorted(set(sizes)):
            out.append((f"decodes past the window, trim {n}", forward(cfg, 1) * decodes + [trim(n)]
                        + forward(cfg, 1) * 2))
        out.append(("decodes past the window, trim twice", forward(cfg, 1) * decodes + [trim_most(2), trim_most(1)]
                    + forward(cfg, 1) * 2))
    for case in cases("op-contiguous", cfg):
        if case.clause.call == "trim":
            out.append((f"malformed {case.name}", forward(cfg, 2) + [trim(None, **case.tag())] + forward(cfg, 1)))
    return out


def edge_contiguous_programs(cfg: JsonConfig) -> list[tuple[str, list[Step]]]:
    cap, layers = cfg["capacity"], cfg["n_layers"]
    out: list[tuple[str, list[Step]]] = [
        ("prefill", forward(cfg, 3)),
        ("prefill then decodes", forward(cfg, 2) + forward(cfg, 1) * 3),
        ("chunked prefill", forward(cfg, 2) + forward(cfg, 2)),
        ("decodes past the window", forward(cfg, 1) * min(cap, 6)),
        ("fill to capacity, one more", forward(cfg, cap) + forward(cfg, 1)),
        ("overflowing step", forward(cfg, 1) + forward(cfg, cap)),
        ("reset", forward(cfg, 2) + [RESET] + forward(cfg, 1)),
        ("layers in reverse", [fetch(layer_id, 2) for layer_id in reversed(range(layers))] + forward(cfg, 1)),
    ]
    max_write = cfg.get("max_write")
    if max_write is not None:   # OP-MAX-WRITE: an exact fit is served (one token more is a clause's case below)
        out.append(("a step of exactly max_write", forward(cfg, 1) + forward(cfg, max_write) + forward(cfg, 1)))
    out += trim_programs(cfg)
    out += batch_programs(cfg)
    for case in cases("op-contiguous", cfg):   # one program per malformation (malform.py)
        if case.clause.call in ("trim", *BATCH_OPS, QUANTIZE, *MERGE_OPS):
            continue   # trim_programs', batch_programs', quantize_programs', merge_programs'
        out.append((f"malformed {case.name}", forward(cfg, 1) + malformed_call(cfg, case) + forward(cfg, 1) * 2))
    if layers > 1:
        out += [("stopped step", [fetch(0, 2), fetch(0, 1)] + [fetch(l, 1) for l in range(1, layers)] + forward(cfg, 1)),
                ("layers disagree on q_len", [fetch(0, 1), fetch(1, 2)] + forward(cfg, 1)),
                ("layers disagree on positions", [fetch(0, 1), at(1, [1])] + forward(cfg, 1))]
    return out


def edge_cell_programs(cfg: JsonConfig) -> list[tuple[str, list[Step]]]:
    cap, layers = cfg["capacity"], cfg["n_layers"]
    two = min(2, cap)
    out: list[tuple[str, list[Step]]] = [
        ("prompt", cforward(cfg, *[0] * min(3, cap))),
        ("decodes past a window", cforward(cfg, 0) * min(cap, 5)),
        ("two sequences in one step", cforward(cfg, *[0] * (two - 1), 1) + cforward(cfg, 0) + cforward(cfg, 1)),
        ("fork then both decode", cforward(cfg, *[0] * two) + [cp(0, 1)] + cforward(cfg, 1) + cforward(cfg, 0)),
        ("fork a prefix", cforward(cfg, *[0] * two) + [cp(0, 1, 1)] + cforward(cfg, 1)),
        ("truncate then continue", cforward(cfg, *[0] * two) + [rm(0, 1)] + cforward(cfg, 0)),
        ("drop a shared prefix's first owner", cforward(cfg, *[0] * two) + [cp(0, 1), rm(0)] + cforward(cfg, 1)),
        ("evict the oldest", cforward(cfg, *[0] * two) + [rm(0, 0, 1)] + cforward(cfg, 0)),
        ("fill, then one more", cforward(cfg, *[0] * cap) + cforward(cfg, 0)),
        ("reset", cforward(cfg, *[0] * two) + [RESET] + cforward(cfg, 0)),
        ("fork onto a live sequence", cforward(cfg, 0) + cforward(cfg, 1) + [cp(0, 1)] + cforward(cfg, 1)),
        ("fork onto itself", cforward(cfg, 0) + [cp(0, 0)] + cforward(cfg, 0)),
        ("no declaration", [at(0, [0])] + cforward(cfg, 0)),
        ("a verb between the declaration and its forward", cforward(cfg, 0) + [begin(0), rm(1)]
         + [fetch(l) for l in range(layers)] + cforward(cfg, 0)),
        ("declared count differs", [begin(*[0, 0][:two]), at(0, [0, 1, 2][:two + 1])]
         + [fetch(l) for l in range(layers)] + cforward(cfg, 0)),
    ]
    verbs: dict[str, list[Step]] = {}
    for case in cases("op-cell", cfg):   # a program per malformed forward, one per clause of a verb
        if case.clause.call == "update_and_fetch":
            before = cforward(cfg, 0) if case.variant == "held" else []
            out.append((f"malformed {case.name}", before + malformed_call(cfg, case, cell=True)
                        + [fetch(l) for l in range(layers)] + cforward(cfg, 1) + cforward(cfg, 0)))
        else:
            verbs.setdefault(case.clause.id, []).extend(malformed_call(cfg, case, cell=True))
    out += [(f"malformed {clause}", cforward(cfg, 0) + calls + cforward(cfg, 0)) for clause, calls in verbs.items()]
    if layers > 1:
        out += [("stopped step, then a fork", [begin(*[0, 0][:two]), fetch(0), cp(0, 1)]
                 + [fetch(l) for l in range(1, layers)] + cforward(cfg, 0) + cforward(cfg, 1)),
                ("stopped step, then a new declaration", [begin(0), fetch(0)]
                 + cforward(cfg, 0) + cforward(cfg, 0)),
                ("layer served twice", [begin(0), fetch(0), fetch(0)]
                 + [fetch(l) for l in range(1, layers)] + cforward(cfg, 0)),
                ("layers disagree on positions", [begin(0), at(0, [0]), at(1, [1])]
                 + [fetch(l) for l in range(1, layers)] + cforward(cfg, 0))]
    return out


def random_contiguous_program(cfg: JsonConfig, rng: random.Random, size: int) -> list[Step]:
    layers = cfg["n_layers"]
    program: list[Step] = []
    while len(program) < size:
        roll = rng.random()
        if roll < 0.6:
            program += forward(cfg, rng.choice([1, 1, 2, 3]))
        elif roll < 0.7:
            program.append(fetch(rng.randrange(layers), rng.choice([1, 2])))   # a partial or a repeated layer
        elif roll < 0.75:
            program.append(RESET)
        else:   # trim's cases are with_trims' (drawn apart, so the other draws are what they were)
            program += malformed_call(cfg, rng.choice([case for case in cases("op-contiguous", cfg)
                                                       if case.clause.call not in ("trim", *BATCH_OPS, QUANTIZE,
                                                                                   *MERGE_OPS)]))
    # the side generator's seed: the hash of the Mersenne state's 625 ints, the same in every process (the whole
    # state's hash is not: its last item may be None, whose hash is its address)
    state = hash(rng.getstate()[1])
    side = random.Random(state)
    program = with_merges(cfg, with_batch_verbs(cfg, with_trims(cfg, program, side), side), random.Random(state + 1))
    # states and quantize from a third generator, drawn after the rest: every other step is what it was before
    return with_states_and_quantize(program, random.Random(state + 2))


def with_merges(cfg: JsonConfig, program: list[Step], draws: random.Random) -> list[Step]:
    """OP-ROWS' extend and extract (merge.py): the program with a few merges after its last batch verb (the batch
    size the verbs before meet stays theirs), drawn from `draws`, a generator of their own: an extend of one or two
    rows (padded half the time; one in ten of another config or length), an extract of a row, a swap back after an
    extract. The other steps are what they were, and a target without `merge` is sent none of them."""
    after = max((i + 1 for i, step in enumerate(program) if step.get("op") in BATCH_OPS), default=0)
    batch, beside = cfg["batch_size"], 0   # the live cache's rows; an extract's original's (0: none)
    for step in program[:after]:
        batch = len(step["rows"]) if step.get("op") == "select" and isinstance(step.get("rows"), list) else \
            batch * 2 if step.get("op") == "repeat" and step.get("times") == 2 else batch
    out = program[:after]
    for step in program[after:]:
        out.append(step)
        if draws.random() >= 0.05:
            continue
        roll = draws.random()
        if roll < 0.5 and batch < MAX_BATCH:
            n = draws.choice([1, 1, 2][:MAX_BATCH - batch + 1])
            pads = [draws.randrange(min(3, cfg["capacity"])) for _ in range(n)] if draws.random() < 0.5 else None
            form = draws.choice(["foreign-config", "short"]) if draws.random() < 0.1 else "whole"
            out.append(extend(n, pads, form))
            batch += n if form == "whole" else 0
        elif roll < 0.8 or not beside:
            out.append(extract(draws.randrange(batch)))
            batch, beside = 1, batch
        else:
            out.append(SWAP)
            batch, beside = beside, batch
    return out


def with_states_and_quantize(program: list[Step], side: random.Random) -> list[Step]:
    """OP-STATE, OP-QUANTIZE: the program with a few saved states loaded back later (whole, into the live cache
    or a fresh one; now and then one cut short or with a byte flipped, which must be refused) and, in one program
    in six, a quantize at some step (in one of those, a second one, which must be refused), drawn from `side`, all
    after the program's last extend, extract or swap (merge.py judges no merge past a quantize or a load): a target
    without the features is sent none of them (persist.state_step, programs.sent_contiguous)."""
    from .persist import load, save
    from .quantize import quantize

    after = max((i + 1 for i, step in enumerate(program) if step.get("op") in MERGE_OPS), default=0)
    out: list[Step] = program[:after]
    saved = False
    quantize_at = after + side.randrange(len(program) - after + 1) if side.random() < 1 / 6 else -1
    again = quantize_at >= 0 and side.random() < 1 / 6
    for index, step in enumerate(program[after:], after):
        if index == quantize_at:
            out.append(quantize(side.choice([4, 8])))
        out.append(step)
        roll = side.random()
        if roll < 0.04:
            out.append(save())
            saved = True
        elif saved and roll < 0.08:
            form = side.choice(["whole"] * 4 + ["truncated", "flipped"])
            out.append(load(form, fresh=side.random() < 0.5))
    if again:
        out.append(quantize(side.choice([4, 8])))
    return out


def with_batch_verbs(cfg: JsonConfig, program: list[Step], side: random.Random) -> list[Step]:
    """OP-PAD, OP-ROWS: on a config of two or more batch rows, the program with a pad first (half the time) and a
    few batch verbs between its steps, valid for the batch size they meet (at most MAX_BATCH rows), drawn from
    `side` after the trims: the other steps are what they were, and a target without the features is sent none."""
    b = cfg["batch_size"]
    if b < 2:
        return program
    out: list[Step] = [pad([side.randrange(min(3, cfg["capacity"])) for _ in range(b)])] if side.random() < 0.5 else []
    for step in program:
        out.append(step)
        if side.random() < 0.1:
            roll = side.random()
            if roll < 0.5:
                out.append(reorder([side.randrange(b) for _ in range(b)]))
            elif roll < 0.75 or 2 * b > MAX_BATCH:
                rows = side.sample(range(b), side.randrange(1, b + 1))
                out.append(select(rows))
                b = len(rows)
            else:
                out.append(repeat(2))
                b *= 2
    return out


def with_trims(cfg: JsonConfig, program: list[Step], side: random.Random) -> list[Step]:
    """OP-TRIM: the program with trims between its steps (a few, of up to 3 tokens and never more than held,
    one in five malformed: tagged with its case, so `trusted-args` is sent none), drawn from `side`, a
    generator of their own: the program's other steps are what they were before trim existed, for every
    target (one without `trim` is sent none of them)."""
    malformed = [case for case in cases("op-contiguous", cfg) if case.clause.call == "trim"]
    out: list[Step] = []
    for step in program:
        out.append(step)
        if side.random() < 0.15:
            out.append(trim(None, **side.choice(malformed).tag()) if side.random() < 0.2 else
                       trim_most(side.choice([0, 1, 1, 1, 2, 3])))
    return out


def random_cell_program(cfg: JsonConfig, rng: random.Random, size: int) -> list[Step]:
    layers = cfg["n_layers"]
    program: list[Step] = []
    while len(program) < size:
        roll = rng.random()
        seq = rng.randrange(4)
        if roll < 0.5:
            program += cforward(cfg, *[rng.randrange(3) for _ in range(rng.choice([1, 1, 2, 3]))])
        elif roll < 0.6:
            program.append(cp(rng.randrange(3), rng.randrange(4), rng.choice([None, None, 0, 1, 2, 4])))
        elif roll < 0.7:
            program.append(rm(seq, rng.choice([0, 0, 1, 2]), rng.choice([None, None, 1, 3])))
        elif roll < 0.75:
            program.append(RESET)
        elif roll < 0.85:   # a step stopped partway, or a layer repeated
            program += [begin(seq), fetch(rng.randrange(layers))]
        else:
            program += malformed_call(cfg, rng.choice(cases("op-cell", cfg)), cell=True, seq=seq % 3)
    return program


def malformed_call(cfg: JsonConfig, case: Case, cell: bool = False, seq: int = 0) -> list[Step]:
    """The calls that break a case's clause, tagged with the case: a cell forward's on every layer after
    its declaration (a target that accepts it then holds a whole step of it), a contiguous one's on layer 0
    (the one refused call a later answer can be traced to: OP-ATOMIC), a malformed layer id's once, a
    verb's once. A step one longer than max_write (OP-MAX-WRITE) is tried on every layer, then once more on
    the last: the rule refuses it on every layer, and a refusal changes nothing. Sequence `seq` owns the
    tokens; a fork copies it to seq + 1."""
    clause, variant, tag = case.clause, case.variant, case.tag()
    if clause.call == "trim":   # n resolved when the step runs (its `above` is one more than held)
        return [trim(None, **tag)]
    if clause.call == "update_and_fetch" and clause.kind == INT:   # a step longer than max_write
        bound = step_bound(cfg)
        assert bound is not None, "derived only where max_write bounds a step (malform.cases)"
        n = int_value(clause, variant, above=bound + 1)
        return [fetch(layer_id, n, **tag) for layer_id in [*range(cfg["n_layers"]), cfg["n_layers"] - 1]]
    if clause.call == "update_and_fetch":   # a malformed layer id once; on a cell cache any other on every layer
        layer_ids = [id_value(variant, cfg["n_layers"])] if clause.kind == ID else \
            list(range(cfg["n_layers"])) if cell else [0]
        n = tokens_of(variant) if clause.kind == POSITIONS else case.q_len
        return ([begin(*[seq] * n)] if cell else []) + [fetch(layer_id, n, **tag) for layer_id in layer_ids]
    if clause.call in BATCH_OPS:   # the value is resolved against the batch when the step runs (batch_value)
        return [{"op": clause.call, **tag}]
    if clause.call == QUANTIZE:   # bits resolved when the step runs (quantize.quantize_step)
        return [{"op": QUANTIZE, "bits": None, **tag}]
    if clause.call in MERGE_OPS:   # extract's row resolved against the batch when the step runs (merge.py)
        return [{"op": clause.call, **tag}]
    if clause.kind == LIST:
        return [{"op": "begin", "seqs": [] if variant == "empty" else str(seq), **tag}]
    value = id_value(variant, 63) if clause.kind == ID else None
    if clause.call == "begin_step":
        return [{**begin(value), **tag}]
    if clause.call == "seq_cp":
        if clause.kind == INT:
            return [{**cp(seq, seq + 1, int_value(clause, variant)), **tag}]
        return [{**(cp(value, seq + 1) if clause.argument == "src_id" else cp(seq, value)), **tag}]
    assert clause.call == "seq_rm"
    if clause.argument == "seq_id":
        return [{**rm(value), **tag}]
    if clause.argument == "p0":
        return [{**rm(seq, int_value(clause, variant)), **tag}]
    return [{**rm(seq, 2, int_value(clause, variant, low=2)), **tag}]


def well_formed_step(step: Step, n_layers: int) -> Optional[Step]:
    """A program step with its malformation undone (None: a malformed verb, dropped): a fetch loses its
    case and explicit positions (the next ones are taken), a layer id out of range is taken modulo n_layers
    (a bool as its int), as Python's indexing would."""
    case = case_of(step)
    if case is None:
        return step
    if step.get("op") != "fetch":
        return None
    mended = {key: value for key, value in step.items() if key not in ("clause", "variant", "case", "positions")}
    layer = mended.get("layer")
    if isinstance(layer, int):
        mended["layer"] = int(layer) % n_layers
    elif case.clause.kind == ID:
        return None
    if case.clause.kind in (DIM, TENSOR, INT, POSITIONS):
        mended["n"] = 1 if case.clause.kind == DIM and "q_len" in case.clause.id else int(mended.get("n", 1))
    return mended
