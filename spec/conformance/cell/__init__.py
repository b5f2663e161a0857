"""The cell layout (the multi-sequence cell cache, spec/cell_model.py): its engine, programs,
consequences, the cell model as a target and the golden vectors; registered in ../layouts.py by
`LAYOUTS`."""

from __future__ import annotations

from typing import Any, Optional

from ..configs import JsonConfig
from ..engine import RunResult, Step
from ..layouts import Golden, Layout
from . import programs, recompute
from .consequences import drive_on
from .engine import CellEngine


def run_program(target: Any, cfg: JsonConfig, program: list[Step], exact: bool = False,
                scope: Any = None, row_budget: Optional[int] = None) -> RunResult:
    """One cell program on a target, driven on past a lenient or over-strict step."""
    return CellEngine(target, cfg, exact, scope=scope, row_budget=row_budget, drive=drive_on).run(program)


def _golden() -> Golden:
    from . import vectors   # the vectors' cases are read only by `kvcache vectors` and --save-findings
    return vectors.GOLDEN


LAYOUTS = (Layout("cell", programs.CELL_CONFIGS, programs.bad_cell_configs, programs.edge_cell_programs,
                  programs.random_cell_program, run_program, _golden),
           # the cell layout seen only through its outputs (SPEC.md 5.3): llama.cpp's face
           Layout("cell-recompute", recompute.CONFIGS, recompute.bad_configs, recompute.edge_programs,
                  recompute.random_program, recompute.run_program,
                  later_edge_programs=recompute.state_programs,   # CELL-STATE's (spec 5), after the others
                  sent=recompute.sent))
