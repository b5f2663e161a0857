"""The layouts the suite drives: what differs between a sequence cache and a cell cache, as data.

The suite, the reports, coverage, shrinking, the CLI and the protocol are shared; a `Layout` names
the few parts that are layout specific: the configurations, the invalid configurations a target must
refuse, the edge and random programs, and the engine that runs one program (the cell engine inherits
the sequence engine's grading). A target says which layout it implements: a python: factory's
`kvcache_layout` attribute, a cmd: target's hello (spec/PROTOCOL.md); `--layout` overrides both.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import cell_programs, op_programs, programs
from .cell_engine import run_cell_program
from .configs import BAD_CONFIGS, SUITE_CONFIGS, JsonConfig
from .engine import RunResult, Step, run_program
from .targets import Target, TargetCrash, TargetError

RunProgram = Callable[..., RunResult]


@dataclass(frozen=True)
class Layout:
    name: str
    configs: tuple[JsonConfig, ...]
    bad_configs: Callable[[bool], list[JsonConfig]]                # validates_configs -> invalid configs
    edge_programs: Callable[[JsonConfig], list[tuple[str, list[Step]]]]
    random_program: Callable[[JsonConfig, random.Random, int], list[Step]]
    run_program: RunProgram


def _bad_sequence_configs(validates_configs: bool) -> list[JsonConfig]:
    return [bad for _, bad, _ in BAD_CONFIGS] if validates_configs else []


SEQUENCE = Layout("sequence", SUITE_CONFIGS, _bad_sequence_configs, programs.edge_programs,
                  programs.random_program, run_program)
CELL = Layout("cell", cell_programs.CELL_CONFIGS, cell_programs.bad_cell_configs,
              cell_programs.edge_cell_programs, cell_programs.random_cell_program, run_cell_program)

def _op_runner(kind: str) -> RunProgram:
    """The op engine reads tensors with numpy, which the base install does not need: imported on first use."""
    def run(target: Target, cfg: JsonConfig, steps: list[Step], exact: bool = False, **extra: Any) -> RunResult:
        try:
            from . import op_engine
        except ImportError as error:
            raise TargetError(f"the op face's engine needs numpy (pip install 'kvcache-spec[numpy]'): {error}") from None
        return op_engine.run_op_program(target, cfg, steps, exact, extra.get("scope"), extra.get("row_budget"), kind)
    return run


# The op face (`update_and_fetch`, spec/op_model.py): one layout per cache kind of upstream's reference.
OP_CONTIGUOUS = Layout("op-contiguous", op_programs.CONTIGUOUS_CONFIGS, op_programs.bad_contiguous_configs,
                       op_programs.edge_contiguous_programs, op_programs.random_contiguous_program,
                       _op_runner("contiguous"))
OP_CELL = Layout("op-cell", op_programs.CELL_CONFIGS, op_programs.bad_cell_configs, op_programs.edge_cell_programs,
                 op_programs.random_cell_program, _op_runner("cell"))
LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (SEQUENCE, CELL, OP_CONTIGUOUS, OP_CELL)}


def of(target: Target, override: Optional[str] = None) -> Layout:
    """The layout a run drives: the override (--layout), else the target's declared one."""
    return LAYOUTS[override or target.layout]


def run_any(target: Target, cfg: JsonConfig, steps: list[Step], exact: bool = False, **extra: Any) -> RunResult:
    """One program on a target, with the engine of the target's layout (a cmd: target is started
    first: its hello says the layout)."""
    try:
        target.declared_scope()
    except TargetCrash:
        pass   # the engine's create starts it again and reports the crash as a finding
    return of(target).run_program(target, cfg, steps, exact, **extra)
