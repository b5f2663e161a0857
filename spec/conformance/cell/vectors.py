"""The cell layout's golden vectors (spec/vectors/cell_vectors.json): the cell edge programs on the
suite's cell configs and the configurations a cell cache must refuse; recorded from the cell model
(../vectors.py shares the document)."""

from __future__ import annotations

from typing import Any, Optional

from ... import model
from .. import scope as scopes
from ..configs import JsonConfig, describe
from ..engine import RunResult, Step
from ..layouts import Golden
from ..malform import CLAUSE_PREFIX
from ..targets import Target
from ..vectors import CELL_VECTORS_FILE, VECTORS_FILE, Recorder, _document, _Numbered
from .engine import CellEngine, to_cell_model
from .modeltarget import CellModelTarget
from .programs import CELL_CONFIGS, bad_cell_configs, edge_cell_programs

# Every suite configuration: the seventh (16 cells, 64 ids, three layers) is the only one a cell cache with
# upstream's fixed 64 ids (scope max_seqs=64) can replay.
CELL_VECTOR_CONFIGS = CELL_CONFIGS


def _cell_flags(calls: list[dict[str, Any]], exercised: set[str], cfg: JsonConfig, extra: list[str]) -> list[str]:
    """A cell test's flags: the rules its run exercised, those its rejections name, the scope's needs."""
    rejected = {call["expect"]["rejected"] for call in calls if "rejected" in call["expect"]}
    rules = {rule for rule in exercised if not rule.startswith(CLAUSE_PREFIX)}   # flags name rules, not clauses
    return sorted(rules | rejected | set(extra) | set(scopes.needs_flags(cfg)))


def build_cells() -> dict[str, Any]:
    """The cell layout's vectors document: the cell edge programs on the suite's cell configs, as the
    cell engine sends them (light), answered by the cell model (canonical placement), then the
    configurations a cell cache must refuse. Flags: the rules each test exercises."""
    test = _Numbered()
    groups: list[dict[str, Any]] = []
    for cfg in CELL_VECTOR_CONFIGS:
        tests = []
        for name, program in edge_cell_programs(cfg):
            recorder = CellRecorder()
            run = CellEngine(recorder, cfg, exact=True, light=True).run(program)
            assert run.finding is None and not run.layout, f"the cell model disagrees with itself: {run.finding}"
            tests.append(test(name, recorder.calls, _cell_flags(recorder.calls, run.exercised, cfg, [])))
        groups.append({"config": cfg, "configName": describe(cfg), "tests": tests})
    bad_tests = []
    for bad_cfg in bad_cell_configs(True):
        made = to_cell_model(bad_cfg)
        assert isinstance(made, model.Rejected), bad_cfg
        call = {"method": "create", "params": {"config": bad_cfg}, "expect": {"rejected": made.rule}}
        bad_tests.append(test(f"invalid cell config: {describe(bad_cfg)}",
                              [call], [made.rule]))
    groups.append({"config": None, "configName": "invalid configs (each test creates its own)", "tests": bad_tests})
    header = ["Generated from spec/cell_model.py by `kvcache vectors`; do not edit by hand.",
              "Each test: create the group's config (a fresh cell cache), then send each call "
              "(spec/PROTOCOL.md, \"Cell methods\") and grade the answer by its expectation (see schema.json).",
              "CellSteps are exact: these vectors test the canonical placement (CELL-LAYOUT-CANON)."]
    return _document("kvcache-cell-cache", header, groups, test.count, {}, VECTORS_FILE)


class CellRecorder(Recorder):
    def __init__(self) -> None:
        super().__init__(CellModelTarget())

    def refusal(self, method: str, args: dict[str, Any], value: Any, before: int) -> Optional[str]:
        refused = {("seq_new", None): "CELL-NEW", ("seq_clone", None): "CELL-FORK",
                   ("declare_step", False): "CELL-DECLARE"}
        return refused.get((method, value)) if value is None or value is False else None


def _record(target: Target, cfg: JsonConfig, steps: list[Step]) -> RunResult:
    return CellEngine(target, cfg, exact=True).run(steps)


GOLDEN = Golden(CELL_VECTORS_FILE, build_cells, CellRecorder, _record, to_cell_model, _cell_flags)
