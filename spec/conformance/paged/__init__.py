"""The paged layout (a serving engine's block pool with prefix caching, spec/paged_model.py): its engine, the
harness acting as the model runner; its programs and consequences; registered in ../layouts.py by `LAYOUTS`."""

from __future__ import annotations

from typing import Any, Optional

from ..configs import JsonConfig
from ..engine import RunResult, Step
from ..layouts import Layout
from . import programs
from .consequences import drive_on
from .engine import PagedEngine


def run_program(target: Any, cfg: JsonConfig, program: list[Step], exact: bool = False,
                scope: Any = None, row_budget: Optional[int] = None) -> RunResult:
    """One paged program on a target, driven on past a lenient or over-strict step."""
    return PagedEngine(target, cfg, exact, scope=scope, row_budget=row_budget, drive=drive_on).run(program)


LAYOUTS = (Layout("paged", programs.PAGED_CONFIGS, programs.bad_paged_configs, programs.edge_paged_programs,
                  programs.random_paged_program, run_program),)
