"""The model as a target: answers every protocol call from `spec/model.py` (canonical layout).

Used to generate the golden vectors (the expected answers are the model's, never the reference's)
and as a sanity target for the engine. PROTO-COMMIT is assumed: a committed new step has been
executed on every layer, so the model's pools are written when the step is committed.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import cell_model, model
from .configs import JsonConfig, to_model
from .cell_engine import model_answer, to_cell_model
from .engine import json_plan, plan_json
from .targets import Outcome, Target, cell_step_to_json


class ModelTarget(Target):
    name = "model"

    def __init__(self) -> None:
        self.cfg: Any = None
        self.state: Any = None

    def create(self, cfg: JsonConfig) -> Outcome:
        made = self.configured(cfg)
        if isinstance(made, model.Rejected):
            return Outcome(False, error=f"[{made.rule}] {made.argument}")
        self.cfg, self.state = made, self.initial(made)
        return Outcome(True)

    # the model's configuration and initial state (the cell model target replaces both)
    configured: Callable[[JsonConfig], Any] = staticmethod(to_model)
    initial: Callable[[Any], Any] = staticmethod(model.initial)

    def call(self, method: str, args: dict[str, Any]) -> Outcome:
        cfg, state = self.cfg, self.state
        got: Any
        if method == "plan":
            got = model.plan(cfg, state, args["layer"], args["position"], args["T"])
            got = plan_json(got) if isinstance(got, model.Plan) else got
        elif method == "commit":
            got = model.commit(cfg, state, json_plan(args["plan"]))
            if isinstance(got, model.State):
                if got is not state:   # a new step: every layer executed it (PROTO-COMMIT)
                    position, T = got.open_step or (0, 0)
                    for layer in range(len(cfg.layers)):
                        got, _ = model.run_layer(cfg, got, layer, position, T)
                self.state, got = got, None
        elif method == "rewind":
            got = model.rewind(cfg, state, args["new_len"])
            if isinstance(got, tuple):
                ok, self.state = got
                got = ok
        elif method == "clear":
            self.state, got = model.clear(cfg, state), None
        elif method == "can_extend":
            got = model.can_extend(cfg, state, args["n"])
        elif method == "depth":
            got = model.depth(cfg, args["layer"])
        elif method == "retained_from":
            got = model.retained_from(cfg, state, args["layer"])
        elif method == "length":
            got = state.length
        elif method == "capacity":
            got = cfg.capacity
        elif method == "faces":
            got = {"same_object": True}
        else:
            return Outcome(False, error=f"unknown method {method}")
        if isinstance(got, model.Rejected):
            return Outcome(False, error=f"[{got.rule}] {got.argument}")
        return Outcome(True, got)


class CellModelTarget(ModelTarget):
    """The cell model as a target (spec/cell_model.py, canonical placement): the cell vectors' answers."""

    name = "cell model"
    layout = "cell"
    optional: frozenset[str] = frozenset()

    configured = staticmethod(to_cell_model)
    initial = staticmethod(cell_model.initial)

    def call(self, method: str, args: dict[str, Any]) -> Outcome:
        got = model_answer(self.cfg, self.state, method, args)
        if isinstance(got, model.Rejected):
            return Outcome(False, error=f"[{got.rule}] {got.argument}")
        answer, self.state = got
        return Outcome(True, cell_step_to_json(answer) if method == "place_step" else answer)
