"""The cell model as a target: answers every protocol call from `spec/cell_model.py` (canonical
placement). Used to generate the cell layout's golden vectors (the expected answers are the model's)."""

from __future__ import annotations

from typing import Any

from ... import cell_model, model
from ..configs import JsonConfig
from ..targets import ModelAsTarget, Outcome, cell_step_to_json
from .engine import model_answer, to_cell_model


class CellModelTarget(ModelAsTarget):
    """The cell model as a target (spec/cell_model.py, canonical placement): the cell vectors' answers."""

    name = "cell model"
    layout = "cell"
    optional: frozenset[str] = frozenset()

    def configured(self, cfg: JsonConfig) -> Any:
        return to_cell_model(cfg)

    def initial(self, made: Any) -> Any:
        return cell_model.initial(made)

    def call(self, method: str, args: dict[str, Any]) -> Outcome:
        got = model_answer(self.cfg, self.state, method, args)
        if isinstance(got, model.Rejected):
            return Outcome(False, error=f"[{got.rule}] {got.argument}")
        answer, self.state = got
        return Outcome(True, cell_step_to_json(answer) if method == "place_step" else answer)
