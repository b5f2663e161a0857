"""OP-ROWS' extend and extract on the op engine: a second cache, the side cache, held beside the live one.

A target with the `merge` feature holds the side cache through four harness verbs (PROTOCOL.md, "Op-face
targets"; a python: target keeps it on its objects, targets.PythonTarget): `aside()` makes the live cache the side
cache (none live until the next create), `swap()` exchanges them, `extend()` is the live cache's extend(side) (the
side cache left as it is), `extract(row)` the live cache's extract(row), which becomes the side cache.

A program's `extend` step (programs.extend) builds the other cache: `aside`, `create` with the program's config
but `batch` rows (padded by `pads`), then every accepted update_and_fetch and trim of the live cache since its
creation replayed on it - the same positions and step lengths, fresh token numbers, so its rows hold other data -
then `swap` and `extend`. The model does the same on a second OpModel and extends the live one by it
(op_model.OpModel.extend). Each replayed answer is judged as any other. The form "foreign-config" builds the other
cache with one more capacity, "short" replays one step fewer: both refused, nothing changed (OP-ATOMIC); a target
declaring `unbounded` has no capacity (SCOPE-UNBOUNDED), so the first is not judged there (a skipped note). Past an
accepted extend every answer is judged with the appended rows as the model labels them, so appended rows that lost
their pads or hold this cache's history are found at the next read.

A program's `extract` step calls extract(row) and `swap`: the program goes on with the extracted cache (the model's
extract), the original kept beside, unchanged; a later `swap` step brings it back and the reads that follow judge
it. A wrong answer or a refused call on a cache just brought back, or just extended, before its first read is
served, is charged to OP-ROWS (`charged`): what changed it is the merge.

Sent only to a contiguous target declaring `merge` (scope.py); for another the steps are left out of the program
up front (programs.sent_contiguous) and by the engine (a skipped note). An extend past MAX_BATCH rows, of a target
without `batch`, or after a quantize or a state loaded (the history the engine replays is then not the cache's) is
not judged: the program ends there, said in the skipped notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional

from ... import op_model
from .. import scope as scopes
from ..engine import NOT_SENT, OVER_STRICT, WRONG, Finding, Step
from ..malform import case_of, id_value
from .programs import MAX_BATCH, MERGE, MERGE_OPS, pad

if TYPE_CHECKING:
    from .engine import OpEngine

RULE = "OP-ROWS"
# What this process's op engines merged, served as the spec says: extends and extracts accepted, and those refused
# (a foreign config, another length, a malformed row) - read by the tests, as engine.CHECKED is by whoever runs
MERGED = {"extend": 0, "extract": 0, "refused": 0}
__all__ = ["MERGE", "MERGED", "MERGE_OPS", "Side", "Track", "charged", "merge_step", "sent"]


@dataclass
class Track:
    """What a cache was sent since its creation that the engine replays on another one: the served calls of each
    committed step (a trim a group of its own), the calls of the step still open, and whether that is all that
    made it (False past a quantize or a state loaded)."""

    groups: list[list[Step]] = field(default_factory=list)
    open: list[Step] = field(default_factory=list)
    known: bool = True

    def fetched(self, layer: int, positions: list[Any], continuing: bool, committed: bool) -> None:
        """An update_and_fetch served: a step that begins drops the calls of one left open before it (abandoned)."""
        self.open = (self.open if continuing else []) + [{"op": "fetch", "layer": layer, "positions": list(positions)}]
        if committed:
            self.groups.append(self.open)
            self.open = []

    def trimmed(self, n: int) -> None:
        self.open = []   # a trim abandons an open step first
        self.groups.append([{"op": "trim", "n": n}])

    def reset(self) -> None:
        self.groups, self.open, self.known = [], [], True

    def committed(self) -> "Track":
        """The track of a copy without the open step (an extract's)."""
        return Track([list(group) for group in self.groups], [], self.known)


@dataclass
class Side:
    """The cache beside the live one: the model's, what the engine sent it, and whether an extract left it there
    (a read on it once brought back judges that the extract left it unchanged)."""

    model: op_model.OpModel
    track: Track
    extracted_from: bool = False


def sent(engine: "OpEngine") -> bool:
    """Whether merge steps go to this target: a contiguous one with the feature (a skipped note if not)."""
    if MERGE in engine.scope_features() and engine.kind == op_model.CONTIGUOUS:
        return True
    engine.result.skipped.add(f"scope: extend, extract and swap steps not sent: the target's scope leaves out "
                              f"'{MERGE}' ({scopes.OP_FEATURES[MERGE]})")
    return False


def merge_step(engine: "OpEngine", step: Step) -> Optional[Step]:
    """Run an extend, extract or swap step; NOT_SENT when the target is not judged on it."""
    if not sent(engine):
        return NOT_SENT
    op = step["op"]
    if op == "swap":
        return _swap(engine, step)
    if engine.model.bits is not None or not engine.track.known:
        engine.result.skipped.add("harness: programs past an extend or extract after a quantize or a state loaded "
                                  "not judged (the engine replays no such history)")
        return None
    concrete: Step = dict(step)
    engine.current = concrete
    try:
        return _extract(engine, step, concrete) if op == "extract" else _extend(engine, step, concrete)
    finally:
        engine.current = concrete   # a replayed call's finding is the extend step's


def _swap(engine: "OpEngine", step: Step) -> Step:
    side = engine.side
    if side is None:   # a program cut short of the step that set a cache beside
        return NOT_SENT
    _harness_call(engine, "swap")
    engine.side = Side(engine.model, engine.track)
    engine.model, engine.track, engine.mcfg = side.model, side.track, side.model.cfg
    engine.merged = "the cache an extract left beside, brought back: extract leaves its cache unchanged" \
        if side.extracted_from else None
    engine.observe("after swap()", RULE)
    return dict(step)


def _harness_call(engine: "OpEngine", method: str) -> None:
    got = engine._call(method, {}, RULE)
    if not got.ok:
        raise engine._fail(OVER_STRICT, RULE, f"{method}() refused (a verb of the side cache): {got.error}")


def _extract(engine: "OpEngine", step: Step, concrete: Step) -> Optional[Step]:
    case = case_of(step)
    row = id_value(case.variant, engine.mcfg.batch_size) if case is not None and case.clause.call == "extract" \
        else step.get("row")
    concrete["row"] = row
    args = {"row": row}
    pending = engine.model.step   # the extracted cache has no open step: a cache of per-layer histories has one here
    if pending is not None and pending.served and engine._excused("steps", "an extract in the middle of a step"):
        return None
    engine.before_call = engine.model.snapshot()
    out = engine.model.extract(row)
    engine.result.exercised.add(RULE)
    if isinstance(out, op_model.Rejected):
        if scopes.TRUSTED_ARGS in engine.relaxed:
            engine.result.skipped.add("scope: extract steps with a malformed row not sent: the target's scope "
                                      f"declares '{scopes.TRUSTED_ARGS}'")
            return NOT_SENT
        engine._refused("extract", args, out, concrete)
        MERGED["refused"] += 1
        return concrete
    engine._accepted("extract", args, RULE)   # the original observed: unchanged
    _harness_call(engine, "swap")
    engine.side = Side(engine.model, engine.track, extracted_from=True)
    engine.model, engine.track, engine.mcfg = out, engine.track.committed(), out.cfg
    engine.merged = None
    engine.observe(f"after extract({row}) and swap() (the extracted cache live)", RULE)
    MERGED["extract"] += 1
    return concrete


def _extend(engine: "OpEngine", step: Step, concrete: Step) -> Optional[Step]:
    n, pads, form = step.get("batch", 1), step.get("pads"), step.get("form", op_model.WHOLE)
    if type(n) is not int or n < 1:
        return NOT_SENT
    skipped = engine.result.skipped
    if engine.mcfg.batch_size + n > MAX_BATCH:   # past what the labels name: not judged (a stated bound)
        skipped.add(f"harness: programs past a batch of more than {MAX_BATCH} rows not judged")
        return None
    if form == "foreign-config" and scopes.UNBOUNDED in engine.relaxed:   # capacity a hint: nothing to refuse by
        skipped.add("scope: an extend by a cache of another capacity not judged: the target's scope declares "
                    f"'{scopes.UNBOUNDED}' (SCOPE-UNBOUNDED: no capacity, the config's a hint)")
        return None
    if "batch" not in engine.scope_features():
        skipped.add("scope: programs past an extend not judged: the target's scope leaves out 'batch' "
                    f"({scopes.OP_FEATURES['batch']})")
        return None
    pending = engine.model.step
    if pending is not None and pending.served and engine._excused("steps", "an extend in the middle of a step"):
        return None
    other_cfg = {**engine.cfg, "batch_size": n,
                 **({"capacity": engine.cfg["capacity"] + 1} if form == "foreign-config" else {})}
    made = op_model.make_config(other_cfg, engine.kind)
    if not isinstance(made, op_model.OpConfig) or engine.declared_scope().missing(other_cfg):
        skipped.add("scope: programs past an extend whose other cache lies outside the scope not judged")
        return None
    if scopes.UNBOUNDED in engine.relaxed:
        made = replace(made, bounded=False)
    groups = engine.track.groups[:-1] if form == "short" else engine.track.groups
    live, track = engine.model, engine.track
    _harness_call(engine, "aside")
    full = engine.cfg
    engine.cfg = other_cfg
    try:
        created = engine._create(RULE)
    finally:
        engine.cfg = full
    if not created.ok:
        raise engine._fail(OVER_STRICT, RULE, f"create refused the config of the cache to extend with: "
                                              f"{created.error}")
    engine.model, engine.mcfg, engine.track = op_model.OpModel(made), made, Track()
    engine.observe("after create (the cache to extend with)", RULE)
    if pads is not None and not _sent_on(engine, pad(pads)):
        return None
    for group in groups:
        for call in group:
            if not _sent_on(engine, dict(call)):
                return None
    other, other_track = engine.model, engine.track
    engine.model, engine.mcfg, engine.track = live, live.cfg, track
    _harness_call(engine, "swap")
    engine.side = Side(other, other_track)
    engine.observe("after swap() (the cache extended live again)", RULE)
    engine.before_call = engine.model.snapshot()
    rejected = engine.model.extend(other)
    engine.result.exercised.add(RULE)
    if rejected is not None:
        engine._refused("extend", {}, rejected, concrete)
        MERGED["refused"] += 1
        return concrete
    engine.mcfg = engine.model.cfg
    engine.track.open = []   # the open step abandoned
    engine.merged = "the cache just extended: extend appends other's rows as they are"
    engine._accepted("extend", {}, RULE)
    MERGED["extend"] += 1
    return concrete


def _sent_on(engine: "OpEngine", call: Step) -> bool:
    """One call of the other cache's making (its pad, a replayed step), judged as any: False when the program is
    judged no further there (the target's scope excuses the call)."""
    done = engine.run_step(call)
    return done is not None and done is not NOT_SENT


def charged(engine: "OpEngine", finding: Finding) -> Finding:
    """A wrong answer or a refused valid call on a cache just extended, or just brought back beside an extract, before
    its first read is served: the merge changed it (OP-ROWS), whatever rule the read's check named."""
    if engine.merged is None or finding.kind not in (WRONG, OVER_STRICT) or finding.rule in (RULE, "OP-PAD",
                                                                                             "OP-ATOMIC"):
        return finding
    return replace(finding, rule=RULE, message=f"{finding.message} - on {engine.merged} (OP-ROWS)")
