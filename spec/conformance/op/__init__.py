"""The op face (`update_and_fetch` -> K/V + AttendSpec, spec/op_model.py): one layout per cache kind of
upstream's reference (op-contiguous, op-cell). Its engine, programs and consequences; the reference as targets
and the helpers a library's adapter is built on (targets.py; the adapters themselves are in ../libraries, which
upstream.py, hf.py and mlxlm.py re-export under their earlier paths); the exhaustive checker (checker.py).
Registered in ../layouts.py by `LAYOUTS`.

The public API for glue around a library's own cache (docs/your-library.md), re-exported here from where it is
defined: `library_target` (targets.py; the shipped adapters in ../libraries are built on it), `layer_policies`,
`refuse_outside_scope`, `attended_rows` with its `without_mask` choices, `explicit_spec` and `LayerLengths`
(glue.py), and `JsonConfig`."""

from __future__ import annotations

from typing import Any

from ..configs import JsonConfig
from ..engine import RunResult, Step
from ..layouts import Layout, RunProgram
from ..targets import Target, TargetError
from . import persist, programs, quantize
from .glue import (EVERY_ROW, LOWER_RIGHT, UPPER_LEFT, LayerLengths, attended_rows, explicit_spec, layer_policies,
                   refuse_outside_scope)
from .targets import library_target

__all__ = ["EVERY_ROW", "LOWER_RIGHT", "UPPER_LEFT", "JsonConfig", "LayerLengths", "attended_rows", "explicit_spec",
           "layer_policies", "library_target", "refuse_outside_scope"]


def _runner(kind: str) -> RunProgram:
    """The op engine reads tensors with numpy, which the base install does not need: imported on first use."""
    def run(target: Target, cfg: JsonConfig, steps: list[Step], exact: bool = False, **extra: Any) -> RunResult:
        try:
            from .consequences import drive_on
            from .engine import OpEngine
        except ImportError as error:
            raise TargetError(f"the op face's engine needs numpy (pip install 'kvcache-spec[numpy]'): {error}") from None
        return OpEngine(target, cfg, kind, extra.get("scope"), drive=drive_on).run(steps)
    return run


LAYOUTS = (Layout("op-contiguous", programs.CONTIGUOUS_CONFIGS, programs.bad_contiguous_configs,
                  programs.edge_contiguous_programs, programs.random_contiguous_program, _runner("contiguous"),
                  later_edge_programs=persist.state_programs,   # OP-STATE's (persist.py), after the others
                  latest_edge_programs=quantize.quantize_programs,   # OP-QUANTIZE's (quantize.py), after those
                  newer_edge_programs=(programs.merge_programs,),   # OP-ROWS' extend and extract (merge.py), last
                  sent=programs.sent_contiguous),
           Layout("op-cell", programs.CELL_CONFIGS, programs.bad_cell_configs, programs.edge_cell_programs,
                  programs.random_cell_program, _runner("cell"), sent=programs.sent_cell))
