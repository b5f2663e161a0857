"""The model as a target: answers every protocol call from `spec/model.py` (canonical layout).

Used to generate the golden vectors (the expected answers are the model's, never the reference's)
and as a sanity target for the engine. PROTO-COMMIT is assumed: a committed new step has been
executed on every layer, so the model's pools are written when the step is committed.
"""

from __future__ import annotations

from typing import Any

from ... import model
from ..configs import JsonConfig, to_model
from ..targets import ModelAsTarget, Outcome
from .engine import json_plan, plan_json


class ModelTarget(ModelAsTarget):
    name = "model"

    def configured(self, cfg: JsonConfig) -> Any:
        return to_model(cfg)

    def initial(self, made: Any) -> Any:
        return model.initial(made)

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
