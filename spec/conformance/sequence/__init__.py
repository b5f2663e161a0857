"""The sequence layout (ExecuTorch's SequenceCache, spec/model.py): its engine, programs, consequences,
the model as a target and the golden vectors; registered in ../layouts.py by `LAYOUTS`."""

from __future__ import annotations

from typing import Optional

from .. import scope as scopes
from ..configs import BAD_CONFIGS, SUITE_CONFIGS, JsonConfig
from ..engine import RunResult, Step
from ..layouts import Golden, Layout
from ..targets import Target
from . import programs
from .consequences import drive_on
from .engine import SequenceEngine


def run_program(target: Target, cfg: JsonConfig, program: list[Step], exact: bool = False,
                scope: Optional[scopes.Scope] = None, row_budget: Optional[int] = None) -> RunResult:
    """One sequence program on a target, driven on past a lenient or over-strict step."""
    return SequenceEngine(target, cfg, exact, scope=scope, row_budget=row_budget, drive=drive_on).run(program)


def _bad_configs(validates_configs: bool) -> list[JsonConfig]:
    return [bad for _, bad, _ in BAD_CONFIGS] if validates_configs else []


def _golden() -> Golden:
    from . import vectors   # the vectors' cases are read only by `kvcache vectors` and --save-findings
    return vectors.GOLDEN


LAYOUTS = (Layout("sequence", SUITE_CONFIGS, _bad_configs, programs.edge_programs, programs.random_program,
                  run_program, _golden),)
