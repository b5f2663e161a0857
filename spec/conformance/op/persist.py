"""OP-STATE on the op engine: a state saved at a point of a program, loaded into a fresh cache or the live one.

A program's `save` step calls the target's `state()` and keeps its bytes with the model's state then; a `load`
step sends them to `load_state(data)` - whole, or broken as the rule says a load must refuse (op_model's
STATE_FORMS): cut short by a byte, a byte flipped, or the state of a cache of another config (its capacity one
more), taken before the program's cache is created (a target holds one cache at a time). `fresh` loads into a
cache created afresh, else into the live one. Either way every later answer is judged against the model's
saved state (OP-ATTEND, OP-TRIM's owed trims): the loaded cache must answer as the saved one would.

The state's bytes are the target's own: the suite cannot write another version of a format it does not know,
so "another version's" state is refused by the reference's own tests (tests/test_op_persist.py) and SPEC.md's
example, not sent here. Sent only to a contiguous target declaring the `state` feature (scope.py); for another
the steps are left out of the program, said in the skipped notes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ... import op_model
from .. import scope as scopes
from ..engine import NOT_SENT, OVER_STRICT, WRONG, Step
from ..malform import broken_state   # a saved state broken without knowing its format (CELL-STATE too)
from .programs import STATE as FEATURE, STATE_OPS   # the feature and the two steps, named where programs are

if TYPE_CHECKING:
    from .engine import OpEngine

__all__ = ["FEATURE", "LOAD", "SAVE", "SENT_FORMS", "STATE_OPS", "load", "save", "state_programs", "state_sent",
           "state_step", "take_foreign_state"]

SAVE, LOAD = STATE_OPS
SENT_FORMS = ("truncated", "flipped", "foreign-config")   # the broken forms the suite can make of a target's bytes


def save() -> Step:
    """OP-STATE: state(), its bytes kept for the program's later loads."""
    return {"op": SAVE}


def load(form: str = op_model.WHOLE, fresh: bool = False) -> Step:
    """OP-STATE: load_state of the last state saved, in `form`, into a cache created afresh or the live one."""
    return {"op": LOAD, "form": form, "fresh": fresh}


def foreign_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Another config a state may come from: the same with one token more capacity (the least difference)."""
    return {**cfg, "capacity": cfg["capacity"] + 1}


def take_foreign_state(engine: "OpEngine") -> None:
    """Before the program's cache exists: the state of an empty cache of a foreign config, for the program's
    foreign-config loads (none taken when it has none, or that cache cannot be made)."""
    if not any(step.get("op") == LOAD and step.get("form") == "foreign-config" for step in engine.program) or \
            FEATURE not in engine.scope_features() or engine.kind != op_model.CONTIGUOUS or \
            engine.declared_scope().missing(engine.cfg):
        return
    other = foreign_config(engine.cfg)
    made = op_model.make_config(other, engine.kind)
    if not isinstance(made, op_model.OpConfig):
        return
    full = engine.cfg
    engine.cfg = other
    try:
        created = engine._create("OP-STATE")
    finally:
        engine.cfg = full
    if not created.ok:
        return
    got = engine._call("state", {}, "OP-STATE")
    if got.ok and isinstance(got.value, (bytes, bytearray)):
        engine.foreign_state = (bytes(got.value), op_model.OpModel(made).state())


def state_step(engine: "OpEngine", step: Step) -> Optional[Step]:
    """Run a save or load step (OP-STATE); NOT_SENT when the target's scope leaves the feature out, or a load
    has nothing to load (a shrunk program without its save)."""
    if not state_sent(engine):
        return NOT_SENT
    return _save(engine, step) if step["op"] == SAVE else _load(engine, step)


def state_sent(engine: "OpEngine") -> bool:
    """Whether save and load steps go to this target: a contiguous one with the feature (a skipped note if not)."""
    if FEATURE in engine.scope_features() and engine.kind == op_model.CONTIGUOUS:
        return True
    engine.result.skipped.add(f"scope: state steps not sent: the target's scope leaves out '{FEATURE}' "
                              f"({scopes.OP_FEATURES[FEATURE]})")
    return False


def _save(engine: "OpEngine", step: Step) -> Optional[Step]:
    pending = engine.model.step
    if pending is not None and pending.served and engine._excused("steps", "a state taken mid-step"):
        return None   # a cache of per-layer histories has no step to leave out: its layers differ here
    engine.before_call = engine.model.snapshot()
    got = engine._call("state", {}, "OP-STATE")
    if not got.ok:
        raise engine._fail(OVER_STRICT, "OP-STATE", f"state() refused: {got.error}")
    if not isinstance(got.value, (bytes, bytearray)):
        raise engine._fail(WRONG, "OP-STATE", f"state() answered {type(got.value).__name__}, not bytes")
    engine.saved = (bytes(got.value), engine.model.state())
    engine.observe("after state()", "OP-STATE")   # taking a state changes nothing, an open step stays open
    return dict(step)


def _load(engine: "OpEngine", step: Step) -> Optional[Step]:
    form, fresh = step.get("form", op_model.WHOLE), bool(step.get("fresh"))
    source = engine.foreign_state if form == "foreign-config" else engine.saved
    if source is None:
        return NOT_SENT
    data, saved = source
    concrete: Step = dict(step)
    engine.current = concrete
    if fresh:   # a cache created afresh, of the config the live cache has now (select, repeat, extend and extract
        full = engine.cfg   # change its batch size; a swap may bring back a cache of another capacity): empty
        engine.cfg = {**full, "batch_size": engine.mcfg.batch_size, "capacity": engine.mcfg.capacity}
        try:
            created = engine._create("OP-STATE")
        finally:
            engine.cfg = full
        if not created.ok:
            raise engine._fail(OVER_STRICT, "OP-CONFIG", f"create refused the config it took before: {created.error}")
        engine.model = op_model.OpModel(engine.mcfg)
        engine.observe("after create", "OP-STATE")
    args = {"data": broken_state(data, form)}
    engine.before_call = engine.model.snapshot()
    rejected = engine.model.load_state(saved if form == "foreign-config" else
                                       op_model.SavedState(saved.cfg, saved.held, form))
    engine.result.exercised.add("OP-STATE")
    if rejected is not None:
        engine._refused("load_state", args, rejected, concrete)
        return concrete
    engine._accepted("load_state", args, "OP-STATE")
    engine.track.known = False   # what it holds now is the state's: no history an extend replays (merge.py)
    return concrete



def state_programs(cfg: dict[str, Any]) -> list[tuple[str, list[Step]]]:
    """OP-STATE's edges on a contiguous config: a state saved past a ring's window and loaded into a fresh cache,
    into the live one after more steps (a rollback), an empty cache's, one saved mid-step, a trim after a load
    (owed or not as for the saved cache); each broken form refused by the live cache (mid-step too) and by a
    fresh one, every later answer judged."""
    from .programs import fetch, forward, trim_most

    layers = cfg["n_layers"]
    window = max([entry["window"] for entry in cfg["layers"] if entry["kind"] == "ring"], default=1)
    before = forward(cfg, 1) * max(1, min(cfg["capacity"] - 3, window + 1))
    out = [("a state loaded into a fresh cache", before + [save(), load(fresh=True)] + forward(cfg, 1) * 2),
           ("a state loaded into the live cache after more steps", before + [save()] + forward(cfg, 1) * 2
            + [load()] + forward(cfg, 1) * 2),
           ("an empty cache's state loaded", [save()] + forward(cfg, 1) + [load()] + forward(cfg, 1)),
           ("a trim after a state loaded", before + [save(), load(fresh=True), trim_most(2)] + forward(cfg, 1))]
    if layers > 1:
        out += [("a state saved mid-step", forward(cfg, 1) + [fetch(0), save(), load(fresh=True)] + forward(cfg, 1)),
                ("a broken state refused mid-step", forward(cfg, 1) + [save(), fetch(0), load("flipped")]
                 + [fetch(layer) for layer in range(1, layers)] + forward(cfg, 1))]
    for form in SENT_FORMS:
        out += [(f"a {form} state refused by the live cache", before + [save()] + forward(cfg, 1) + [load(form)]
                 + forward(cfg, 1)),
                (f"a {form} state refused by a fresh cache", before + [save(), load(form, fresh=True)]
                 + forward(cfg, 1))]
    return out
