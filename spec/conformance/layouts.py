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
from .targets import FACE_METHODS, OPTIONAL_METHODS, PythonTarget, Target, TargetCrash, TargetError

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


# The methods that tell each layout's objects apart, named in the hint.
SIGNATURE = {"sequence": ("plan", "commit"), "cell": ("declare_step", "place_step"),
             "op-contiguous": ("update_and_fetch", "used"), "op-cell": ("update_and_fetch", "begin_step")}


def _faces(cache: Any) -> list[str]:
    """The layouts whose every method (but the optional ones) `cache` has."""
    return [name for name, methods in FACE_METHODS.items()
            if all(callable(getattr(cache, method, None)) for method in methods
                   if method not in OPTIONAL_METHODS and method != "faces")]


def layout_hint(target: Target) -> Optional[str]:
    """One line for a python: target whose factory builds, for the layout just run, no object with that
    layout's methods, but for another layout one with that layout's: it is judged as the wrong layout (a
    factory without `kvcache_layout` runs the sequence suite). None when nothing says so, or for a target
    out of process (its hello declares its layout). The factory is called once per layout, with the
    layout's first configuration."""
    if not isinstance(target, PythonTarget):
        return None
    built: dict[str, list[str]] = {}
    for name, layout in LAYOUTS.items():
        probe = PythonTarget(target.name)
        probe.layout = name
        try:
            built[name] = _faces(probe.cache) if probe.create(layout.configs[0]).ok else []
        except TargetCrash:   # a BaseException out of the factory: no object, no hint from it
            built[name] = []
    if target.layout in built[target.layout]:
        return None
    others = [name for name in LAYOUTS if name != target.layout and name in built[name]]
    if not others:
        return None
    return (f"it builds {others[0]} caches ({', '.join(SIGNATURE[others[0]])}), not {target.layout} ones: "
            f"kvcache_layout = \"{others[0]}\" on the factory")


def add_layout_hint(report: dict[str, Any], interrupted: str, target: Target) -> None:
    """The report's `hint` (layout_hint), looked for when the run is not CONFORMING and ran to its end."""
    hint = None if report["conforming"] or interrupted else layout_hint(target)
    if hint:
        report["hint"] = hint
