"""An exhaustive checker of an op-face target over a small configuration: every program up to a depth.

Where the suite samples programs, this explores them all: breadth first over a small alphabet of
steps (forwards of one or two sequences, a step stopped partway, forks, removals, reset, trims for a
target with the `trim` feature, and the malformed calls of OP-POS, OP-FORK, OP-STEP and OP-TRIM), each
program run on a fresh cache by the op engine (every query's attended tokens checked, every observation
compared with the op model).

What it may skip: a program is not extended when an earlier one (shorter, or as long and first in the
alphabet's order) reached the same op-model state - the same tokens, up to their numbering, the same
step in progress, the same trim floors and positions written past the held ones - *with the same last
thing the model let go*. The model forgets what a reset cleared, what a refused call carried, what an
abandoned step wrote and what a removal dropped; a target need not (it may keep rows across a reset, or
keep a refused call's rows), so the last such event, with the state it happened in (a refusal: the call
alone), is part of the key (`Visit`): every program that continues after a reset, a refusal, an abandoned
step or a removal is run, up to the next such event. Deduplicating by the model's state alone assumed the
target's state is a function of it - the very thing under test. What stays assumed: a target's state is
a function of what it was given and kept since the last thing let go (a defect that needs two of them,
say rows kept across a reset *and* a refused call's, may be reached only through a longer program), not,
say, of how many calls it has served. A depth bound is stated, not hidden: the result says how many
states and programs it checked, and how many states it left unexpanded at the bound.

    python -m kvcache_spec.conformance.op.checker --target python:kvcache_spec.conformance.op.targets:cell
    python -m kvcache_spec.conformance.op.checker --target cmd:./my_op_server      (spec/PROTOCOL.md)
    python -m kvcache_spec.conformance.op.checker --target python:kvcache_spec.conformance.op.targets:contiguous --sinks
    python -m kvcache_spec.conformance.op.checker --target python:kvcache_spec.conformance.op.targets:contiguous --chunk
    python -m kvcache_spec.conformance.op.checker --target python:kvcache_spec.conformance.op.targets:contiguous --batch
    python -m kvcache_spec.conformance.op.checker --target python:kvcache_spec.conformance.op.targets:contiguous --state
    python -m kvcache_spec.conformance.op.checker --target python:kvcache_spec.conformance.op.targets:contiguous --quantize
    python -m kvcache_spec.conformance.op.checker --target python:kvcache_spec.conformance.op.targets:contiguous --merge

With --state (OP-STATE) the alphabet also saves a state and loads it - whole into a fresh cache or the live one,
with a byte flipped, or another config's - and a program's key holds the state saved as well (a later load
brings it back), a load counting as something the model let go.

With --quantize (OP-QUANTIZE) the alphabet also quantizes to 2 and 8 bits and with each malformed bits (True, 2.0, 1,
9), over one ring of 2 with rows of 3: the bits the model holds are part of a program's key.

With --merge (OP-ROWS' extend and extract, merge.py) the alphabet also extends with a row (padded or not, one step
short, of another config), extracts each of two rows and swaps, over one batch row and one ring of 2: the side
cache's state is part of a program's key. Depth 4 (2,942 states, about 25 s) finds an extend that drops the appended
rows' pads or takes this cache's history, an extract that changes the original and an extend of another config.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable, Optional

from ... import op_model
from ..engine import Finding, Step
from ..malform import INT32_LIMIT
from .consequences import drive_on
from .engine import OpEngine
from ..malform import cases
from .persist import LOAD, load, save
from .quantize import quantize
from .programs import RESET, SWAP, at, begin, cp, extend, extract, fetch, op_config, pad, reorder, repeat, rm, select, trim
from ..targets import Target, TargetCrash, TargetError, parse_target

# Small configurations: two layers (so a step can stop partway), a flat and a windowed layer.
CHECK_CONFIGS = {
    "op-cell": op_config(3, (0, 2)),
    "op-contiguous": op_config(3, (0, 2)),
}
# OP-SINKS (--sinks): a ring of 3 keeping 1 sink beside a flat layer; 5 tokens reach past its window part.
SINKS_CONFIG = op_config(5, (3, 0), keep=1)
# OP-CHUNK (--chunk): one chunk layer of 2, a boundary every two tokens; OP-RECORD (--record): one recording
# ring of 2, whose trims stay owed past its window. One layer each, so a trim back across a boundary, or below
# what a ring that did not record would keep, and the query after it fit in 4 steps.
CHUNK_CONFIG = op_config(4, (0,), chunks=(2,))
RECORD_CONFIG = op_config(4, (2,), record_past=True)
# OP-PAD, OP-ROWS (--batch): two batch rows over one flat layer; a pad, a two-token step, a reorder and the
# query after it (a reorder that leaves a row's pads behind) fit in 4 steps.
BATCH_CONFIG = op_config(3, (0,), batch=2)
# OP-STATE (--state): one ring of 2, so a state saved one token in and loaded shows a lost row or ring slot in 4 steps
STATE_CONFIG = op_config(4, (2,))
# OP-QUANTIZE (--quantize): one ring of 2 with rows of 3 (a rounding past the bound shows), one layer, so a step,
# a quantize and the query after it fit in 3 steps
QUANTIZE_CONFIG = op_config(4, (2,), head_dim=3)
# OP-ROWS' extend and extract (--merge): one batch row over a ring of 2, so a step, an extend of a padded row and the
# query after it (appended rows that lost their pads or took this cache's history), or an extract, a swap back and
# a query (an original the extract changed), fit in 3 steps; the ring's wrap in 4
MERGE_CONFIG = op_config(4, (2,))
EXTRA_CONFIGS = {"sinks": SINKS_CONFIG, "chunk": CHUNK_CONFIG, "record": RECORD_CONFIG, "batch": BATCH_CONFIG,
                 "state": STATE_CONFIG, "quantize": QUANTIZE_CONFIG, "merge": MERGE_CONFIG}


def alphabet(kind: str, cfg: dict[str, Any], trims: bool = False, batch: bool = False,
             states: bool = False, quantizes: bool = False, merges: bool = False) -> list[Step]:
    """The steps a program is made of: each layer with next positions, and the calls around them; with
    `trims` (a contiguous target with the `trim` feature) trims of 0, 1 and 2 tokens and a negative one; with
    `batch` (a contiguous target with `pad` and `batch-verbs`, a config of two batch rows) a pad of the first row,
    the rows swapped, the second kept, each repeated, and a negative index; with `states` (the `state` feature,
    --state) a save, and loads whole into a fresh and the live cache, flipped, and another config's; with `merges`
    (the `merge` feature, --merge) an extend of a row with and without a pad, one of another length and one of another
    config, an extract of each of two rows (the second refused on a batch of one), and a swap."""
    if merges:   # OP-ROWS' extend and extract on the side cache (merge.py)
        return alphabet(kind, cfg, trims) + [extend(1), extend(1, [1]), extend(1, form="short"),
                                             extend(1, form="foreign-config"), extract(0), extract(1), SWAP]
    if states:
        return alphabet(kind, cfg, trims) + [save(), load(fresh=True), load(), load("flipped"), load("foreign-config")]
    if quantizes:   # OP-QUANTIZE (--quantize): 2 and 8 bits, and each malformed bits
        return alphabet(kind, cfg, trims) + [quantize(2), quantize(8)] + \
            [quantize(None, **case.tag()) for case in cases("op-contiguous", cfg) if case.clause.call == "quantize"]
    layers = [fetch(layer) for layer in range(cfg["n_layers"])]
    if kind == "op-contiguous" and batch:
        return layers + [fetch(0, 2), RESET, pad([1, 0]), reorder([1, 0]), select([1]), repeat(2), select([-1])]
    if kind == "op-contiguous":
        # with sinks, a chunk layer or recording, a two-token step on every layer (past a window part, across a
        # chunk boundary), then
        whole = any(entry.get("keep") or entry.get("chunk") for entry in cfg["layers"]) or cfg.get("record_past")
        return layers + [fetch(0, 2), at(0, [0]), at(0, [-1]), RESET] + \
            [fetch(layer, 2) for layer in range(1, cfg["n_layers"]) if whole] + \
            ([trim(0), trim(1), trim(2), trim(-1)] if trims else [])
    return layers + [begin(0), begin(1), begin(0, 1), begin(0, 0), begin(0, 0, 0), cp(0, 1), cp(1, 0, 1), rm(0), rm(1, 1),
                     at(0, [0]), at(0, [INT32_LIMIT]), RESET]


def let_go(before: Hashable, before_abandoned: int, engine: OpEngine, step: Step) -> Optional[Hashable]:
    """What the model let go at the program's last step (taken in state `before`), or None: a reset, a
    refused call, an abandoned step, a removal. A target may keep any of them."""
    concrete = engine.result.steps[-1] if engine.result.steps else step
    if "refused_with" in concrete:
        return ("refused", _canonical(concrete))
    if engine.model.abandoned != before_abandoned:
        return ("abandoned", before, _canonical(concrete))
    if step.get("op") in ("reset", "rm", "select", "reorder", LOAD):   # a select or reorder may drop a row
        return (str(step["op"]), before, _canonical(concrete))
    return None


def _canonical(step: Step) -> Hashable:
    return tuple(sorted((key, json.dumps(value, sort_keys=True)) for key, value in step.items()
                        if key not in ("refused_with",)))


def state_key(model: op_model.OpModel, steps: Optional[list[Step]] = None) -> Hashable:
    """The op model's state up to the numbering of tokens: what each sequence holds, and the open step;
    with a program's concrete `steps`, also the positions written past the held ones since the last reset
    (a trim gives them back: a target that kept their rows differs there, so such a state is extended)."""
    owners: dict[int, set[int]] = {}
    positions: dict[int, int] = {}
    for seq, tokens in model.held.items():
        for uid, pos in tokens.items():
            owners.setdefault(uid, set()).add(seq)
            positions[uid] = pos
    held = tuple(sorted((positions[uid], tuple(sorted(seqs))) for uid, seqs in owners.items()))
    step = model.step
    open_step = None if step is None else (step.seqs, step.positions, tuple(sorted(step.served)))
    written = 0
    for concrete in steps or []:
        if concrete["op"] == "reset":
            written = 0
        elif concrete["op"] == "fetch" and "case" not in concrete:
            written = max([written] + [p + 1 for p in concrete.get("positions", []) if type(p) is int])
    # OP-PAD, OP-ROWS: each batch row's pads and what it holds for each token, up to the numbering
    rows = tuple((pad, tuple(sorted((positions.get(uid, -1), positions.get(label[0], label[0]), label[1])
                                    for uid, label in ((uid, model.label(row, uid)) for uid in positions))))
                 for row, pad in enumerate(model.pads))
    # the floors decide which trims are owed (OP-TRIM)
    return held, open_step, tuple(model.floors), written, rows, model.bits   # OP-QUANTIZE: the bits held at


@dataclass
class Visit:
    """A program explored, the op-model state it reached, and the last thing the model let go on the way."""
    program: list[Step]
    state: Hashable
    let_go: frozenset[Hashable]
    abandoned: int   # the model's count of abandoned steps (one more at a step: that step abandoned one)


@dataclass
class CheckResult:
    target: str
    layout: str
    depth: int
    states: int = 0
    programs: int = 0
    unexpanded: int = 0            # states reached at the depth bound, not extended
    # the first (so a shortest) program of each (class, rule) found; a failing program is not extended
    findings: dict[tuple[str, str], tuple[Finding, list[Step]]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"target": self.target, "layout": self.layout, "depth": self.depth, "states": self.states,
                "programs": self.programs, "unexpanded_at_bound": self.unexpanded,
                "verdict": "no finding" if not self.findings else f"{len(self.findings)} kinds of finding",
                "findings": [{"class": f.kind, "rule": f.rule, "message": f.message, "steps": steps}
                             for f, steps in self.findings.values()]}


def check(target: Target, depth: int, cfg: Optional[dict[str, Any]] = None) -> CheckResult:
    """Every program of at most `depth` steps over the alphabet, deduplicated by the op model's state with
    what it let go (the module's docstring). Programs are explored shortest first, so the program kept for
    each (class, rule) is a shortest one over this alphabet."""
    layout = target.layout
    cfg = cfg or CHECK_CONFIGS[layout]
    kind = op_model.CELL if layout == "op-cell" else op_model.CONTIGUOUS
    result = CheckResult(target.name, layout, depth)
    features = target.scope.features
    letters = alphabet(layout, cfg, trims="trim" in features,
                       batch=cfg["batch_size"] > 1 and {"pad", "batch-verbs"} <= features,
                       states="state" in features and cfg is STATE_CONFIG,
                       quantizes="quantize" in features and cfg is QUANTIZE_CONFIG,
                       merges="merge" in features and cfg is MERGE_CONFIG)
    start = OpEngine(target, cfg, kind)
    seen: set[Hashable] = set()
    frontier: deque[Visit] = deque([Visit([], (state_key(start.model), None, None), frozenset(), 0)])
    while frontier:
        prefix = frontier.popleft()
        for letter in letters:
            program = prefix.program + [letter]
            engine = OpEngine(target, cfg, kind, drive=drive_on)
            run = engine.run(program)
            result.programs += 1
            if run.finding is not None:
                result.findings.setdefault(run.finding.key(), (run.finding, run.steps))
                continue
            gone = let_go(prefix.state, prefix.abandoned, engine, letter)
            saved = None if engine.saved is None else state_key(engine.saved[1].held)   # a later load's state
            side = None if engine.side is None else state_key(engine.side.model)   # a later swap's or extend's
            visit = Visit(program, (state_key(engine.model, run.steps), saved, side),
                          frozenset({gone}) if gone is not None else prefix.let_go, engine.model.abandoned)
            if (visit.state, visit.let_go) in seen:
                continue
            seen.add((visit.state, visit.let_go))
            result.states += 1
            if len(program) < depth:
                frontier.append(visit)
            else:
                result.unexpanded += 1
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcache_spec.conformance.op.checker", description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True,
                        help="an op-face target: python:MODULE:FACTORY, or cmd:COMMAND (spec/PROTOCOL.md)")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per request of a cmd: target")
    parser.add_argument("--sinks", action="store_true",
                        help="op-contiguous: check a ring with an attention sink (OP-SINKS) beside a flat layer")
    parser.add_argument("--chunk", action="store_true",
                        help="op-contiguous: check a chunk layer of chunk 2 (OP-CHUNK)")
    parser.add_argument("--record", action="store_true",
                        help="op-contiguous: check a recording ring of 2 (OP-RECORD)")
    parser.add_argument("--batch", action="store_true",
                        help="op-contiguous: check two batch rows with a pad and the batch verbs (OP-PAD, OP-ROWS)")
    parser.add_argument("--state", action="store_true",
                        help="op-contiguous: check states saved and loaded, over one ring of 2 (OP-STATE)")
    parser.add_argument("--quantize", action="store_true",
                        help="op-contiguous: check quantize(bits) mid-generation, over one ring of 2 (OP-QUANTIZE)")
    parser.add_argument("--merge", action="store_true",
                        help="op-contiguous: check extend and extract on a side cache, over one ring of 2 (OP-ROWS)")
    args = parser.parse_args(argv)
    try:
        target = parse_target(args.target, timeout=args.timeout)
        target.declared_scope()   # a cmd: target's hello says its layout
    except (TargetError, TargetCrash) as error:
        print(f"{args.target}: {error}", file=sys.stderr)
        return 2
    try:
        if target.layout not in CHECK_CONFIGS:
            print(f"{args.target}: layout {target.layout!r} is not an op-face layout", file=sys.stderr)
            return 2
        chosen = [EXTRA_CONFIGS[name] for name in EXTRA_CONFIGS if getattr(args, name)]
        if len(chosen) > 1:
            print("--sinks, --chunk, --record, --batch, --state, --quantize and --merge each choose the configuration: "
                  "give one",
                  file=sys.stderr)
            return 2
        result = check(target, args.depth, chosen[0] if chosen and target.layout == "op-contiguous" else None)
    finally:
        target.close()
    print(json.dumps(result.summary(), indent=1))
    return 0 if not result.findings else 1


if __name__ == "__main__":
    sys.exit(main())
