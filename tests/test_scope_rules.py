"""The scope rules of SPEC.md section 6.1 (SCOPE-DECLARE, SCOPE-TWINS and the six relaxations) as the suite keeps
them, the table that states them held to the code, and the two sentences of section 5.3 that had two readings
(CELL-SHIFT checks after the move; CELL-RECOMPUTE leaves the windows to the target's own recompute)."""

from __future__ import annotations

import re
import sys
import types
from typing import Any

import pytest

from kvcache_spec import op_model as om
from kvcache_spec.conformance import scope as scopes
from kvcache_spec.conformance.cell import recompute
from kvcache_spec.conformance.cli import main
from kvcache_spec.conformance.coverage import RELAXATION_RULES, clause_scope, in_scope
from kvcache_spec.conformance.malform import sendable
from kvcache_spec.conformance.targets import PythonTarget, TargetError
from kvcache_spec.specdoc import SPEC_PATH

STANDINS = "python:tests.recompute_standins:"


def _factory_module(name: str, layout: str, declared: list[str]) -> str:
    """A python: target spec whose factory declares `declared` for `layout` (never built)."""
    def make(cfg: dict[str, Any]) -> Any:
        raise AssertionError("never built")
    make.kvcache_layout = layout   # type: ignore[attr-defined]
    make.kvcache_scope = declared   # type: ignore[attr-defined]
    module = types.ModuleType(name)
    module.make = make   # type: ignore[attr-defined]
    sys.modules[name] = module
    return f"python:{name}:make"


# --- SCOPE-DECLARE --------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout, declared", [("op-cell", ["unbounded"]), ("sequence", ["trusted-args"]),
                                              ("cell", ["lazy-shapes"]), ("cell-recompute", ["lossy=0.25"]),
                                              ("cell", ["min_head_dim=4"])])
def test_SCOPE_DECLARE_a_relaxation_its_layout_cannot_declare_is_refused_before_the_run(layout: str,
                                                                                        declared: list[str]) -> None:
    """Before the rule the suite took `unbounded` from a cell cache and stopped judging the refusal of a zero
    capacity; a relaxation on a layout without malformed calls or sizes to relax relaxed nothing, silently."""
    parsed = scopes.parse(declared, "test")
    with pytest.raises(scopes.ScopeError, match="SCOPE-DECLARE"):
        scopes.check_layout(parsed, layout)
    name = f"scope_declare_{layout.replace('-', '_')}"
    try:
        with pytest.raises(TargetError, match="SCOPE-DECLARE"):
            PythonTarget(_factory_module(name, layout, declared))
    finally:
        del sys.modules[name]


def test_SCOPE_DECLARE_the_op_layouts_declare_their_relaxations_and_an_override_is_checked_too(
        capsys: pytest.CaptureFixture[str]) -> None:
    for layout in ("op-contiguous", "op-cell"):
        scopes.check_layout(scopes.parse(["all", "trusted-args", "lazy-shapes", "lossy=0.25", "min_head_dim=2",
                                          "user-config=capacity"], "test"), layout)
    scopes.check_layout(scopes.parse(["unbounded"], "test"), "op-contiguous")
    # --scope overrides the declaration: run_suite checks it against the layout it drives (exit 2, one line)
    assert main(["--target", "python:kvcache_spec.conformance.op.targets:cell", "--scope", "unbounded"]) == 2
    assert "SCOPE-DECLARE" in capsys.readouterr().err


# --- SCOPE-TWINS and SCOPE-MIN-HEAD-DIM ---------------------------------------------------------------------

def test_SCOPE_TWINS_keep_an_MLA_value_width_apart_and_SCOPE_MIN_HEAD_DIM_drives_only_wide_enough_twins() -> None:
    scope = scopes.parse(["all", "min_head_dim=32"], "test")
    mla = {"head_dim": 32, "v_head_dim": 16, "layers": [{"kind": "flat", "window": 0}]}
    assert scope.missing(mla) == {"min_head_dim"}
    twin = scopes.with_twins([mla], scope)[1]
    assert (twin["head_dim"], twin["v_head_dim"]) == (32, 33) and scope.covers(twin) and "mla" in scopes.needs(twin)
    wide_key = scopes.widened({"head_dim": 40, "v_head_dim": 8}, 32)
    assert (wide_key["head_dim"], wide_key["v_head_dim"]) == (40, 32)   # max(v, N) differs from 40: no + 1
    assert scopes.widened({"head_dim": 8, "v_head_dim": 8}, 32)["v_head_dim"] == 32   # one width stays one


# --- the relaxations -----------------------------------------------------------------------------------------

def test_SCOPE_LAZY_SHAPES_a_later_update_of_other_sizes_is_sent_and_its_refusal_owed() -> None:
    """Only a layer's first update since creation or reset is spared a malformed shape: a later one whose sizes
    differ from the first's is sent, and its refusal stays owed (OP-ARGS) unless trusted-args is declared too."""
    width = {"clause": "op.update_and_fetch.k.width", "variant": "1"}
    program = [{"op": "fetch", "layer": 0, **width}, {"op": "fetch", "layer": 0}, {"op": "fetch", "layer": 0, **width}]
    assert sendable(program, frozenset({"lazy-shapes"})) == program[1:]
    lazy = frozenset({"lazy-shapes"})
    rules = in_scope(True, frozenset(), "op-contiguous", scopes.FULL.features, lazy)
    assert rules["OP-ARGS"] == "" and clause_scope("op-contiguous", rules, frozenset(), scopes.FULL.features,
                                                   lazy)["op.update_and_fetch.k.width"] == ""
    assert sendable(program, lazy | {"trusted-args"}) == [program[1]]


def test_trusted_args_unbounded_and_lossy_owe_what_the_table_says() -> None:
    both = frozenset({"trusted-args", "unbounded"})
    rules = in_scope(True, frozenset(), "op-contiguous", scopes.features_of(scopes.CURRENT_VERSION), both)
    assert rules["OP-ARGS"] and not rules["OP-POS"] and not rules["OP-MAX-WRITE"]   # SCOPE-TRUSTED-ARGS
    assert not rules["OP-TRIM"]   # SCOPE-TRUSTED-ARGS: a trim of a valid n stays owed (or optional, judged by data)
    assert rules["OP-CAP"]        # SCOPE-UNBOUNDED: no capacity, no OP-CAP
    # SCOPE-LOSSY: a tolerance is a float strictly between 0 and 0.5
    for bad in ("0", "0.5", "nan"):
        with pytest.raises(scopes.ScopeError):
            scopes.parse([f"lossy={bad}"], "test")


def test_SCOPE_USER_CONFIG_needs_trusted_args() -> None:
    with pytest.raises(scopes.ScopeError, match="trusted-args"):
        scopes.parse(["user-config=window"], "test")
    assert scopes.parse(["trusted-args", "user-config=window"], "test").user_config == {"window"}


def test_the_scope_table_has_a_row_per_relaxation_with_the_layouts_the_code_accepts() -> None:
    """SPEC.md 6.1's one table: each relaxation's row names the layouts check_layout accepts it on."""
    document = SPEC_PATH.read_text()
    section = document[document.index("### 6.1 "):document.index(". SCOPE-BORDER\n")]
    rows = {cells[1].strip("` ").split("=")[0]: cells[2].strip() for cells in
            (line.split("|") for line in section.splitlines() if line.startswith("| `"))}
    spelled = {"op": ("op-contiguous", "op-cell"), "op, paged": ("op-contiguous", "op-cell", "paged"),
               "op, with `trusted-args`": ("op-contiguous", "op-cell"),
               "op-contiguous": ("op-contiguous",), "cell": ("cell",), "op-cell, cell-recompute": ("op-cell", "cell-recompute")}
    for name, layouts in scopes.RELAXATION_LAYOUTS.items():
        assert spelled[rows[name]] == layouts, name
    assert set(RELAXATION_RULES) <= set(rows)
    assert {row for row in rows} >= {"max_seqs", "keep", "min_head_dim"}
    assert re.search(r"\| `user-config=K\+\.\.` \|", section)


# --- section 5.3: CELL-SHIFT and CELL-RECOMPUTE, one reading each ----------------------------------------------

def test_CELL_SHIFT_a_collision_is_checked_after_the_move() -> None:
    """A position a moved token vacates may be taken by another moved token; only a moved token landing on one
    the move left in place is refused."""
    table = om.OpModel(om.OpConfig(om.CELL, 1, (0,), 1, 1, 1, 8, 1))
    table.held = {0: {10: 0, 11: 1, 12: 2}}
    assert table.seq_add(0, 1, None, 1) is None and table.held == {0: {10: 0, 11: 2, 12: 3}}
    before = {seq: dict(tokens) for seq, tokens in table.held.items()}
    refused = table.seq_add(0, 0, 3, 1)   # 0 -> 1 and 2 -> 3, where the token left in place is
    assert refused is not None and refused.rule == "CELL-SHIFT" and table.held == before


def test_CELL_RECOMPUTE_leaves_the_window_to_the_targets_own_recompute() -> None:
    """On a sliding layer the decode must attend, within its window, what the recompute does: a decode that drops
    the window while its recompute keeps it is found; a target with no window in either computation is judged by
    its own model, and conforms (the rule compares two computations, it does not decide the window)."""
    sliding = recompute.recompute_config(8, 2)
    program = [recompute.decode(0), recompute.decode(0), recompute.decode(0), recompute.decode(0)]
    found = recompute.run_program(PythonTarget(STANDINS + "IgnoresWindow"), sliding, program)
    assert found.finding is not None and found.finding.rule == "CELL-RECOMPUTE"
    alike = recompute.run_program(PythonTarget(STANDINS + "IgnoresWindowEverywhere"), sliding, program)
    assert alike.finding is None and "CELL-RECOMPUTE" in alike.exercised
