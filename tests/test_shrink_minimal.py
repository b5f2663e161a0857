"""Issue 35: a counterexample is minimal in its configuration as well as its steps.

Each stand-in (tests/op_standin.py) shows its defect first on one of the suite's configurations, larger
than it needs; the reported counterexample must be one no single dimension of which can be made smaller:
checked here by this file's own enumeration of the smaller values (not the shrinker's), each replayed.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from kvcache_spec import op_model
from kvcache_spec.conformance.op.programs import CONTIGUOUS_CONFIGS, op_config
from kvcache_spec.conformance.suite import replay, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget

STANDIN = "python:tests.op_standin:{}"
# the stand-in, its finding, and the minimal configuration's sizes and step lengths that show it
MINIMAL = {
    # the three: a window one row too wide (capacity 2, 2 tokens), a reset keeping flat rows
    # (one layer), an unenforced max_write (the smallest step past it)
    "contiguous_ring_one_too_wide": (("wrong", "OP-ATTEND"), {"capacity": 2, "n_layers": 1, "window": 1}, [2]),
    "contiguous_reset_keeps_flat_rows": (("wrong", "OP-ATTEND"), {"capacity": 1, "n_layers": 1, "window": 0},
                                         [1, 0, 1]),
    "contiguous_ignores_max_write": (("lenient", "OP-MAX-WRITE"), {"capacity": 2, "max_write": 1, "window": 1}, [2]),
    # two the issue does not name: batch rows (batch 2, nothing else), a V width (head_dim 1, v_head_dim 2)
    "contiguous_swaps_batch_rows": (("wrong", "OP-ATTEND"), {"batch_size": 2, "capacity": 1, "n_kv_heads": 1}, [1]),
    "contiguous_keeps_v_as_wide_as_k": (("wrong", "OP-ATTEND"), {"head_dim": 1, "v_head_dim": 2, "capacity": 1},
                                        [1]),
}


def _valid(cfg: dict[str, Any]) -> bool:
    return isinstance(op_model.make_config(cfg, op_model.CONTIGUOUS), op_model.OpConfig)


def smaller_configs(cfg: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every valid configuration with one dimension at one smaller value."""
    layers = cfg["layers"]
    for drop in range(len(layers)) if len(layers) > 1 else []:
        yield "a layer fewer", {**cfg, "layers": layers[:drop] + layers[drop + 1:], "n_layers": len(layers) - 1}
    if len(layers) == 1:
        for n in range(1, cfg["n_layers"]):
            yield f"n_layers {n}", {**cfg, "n_layers": n}
    for i, entry in enumerate(layers):
        for w in range(0, entry["window"]):
            kind = "ring" if w else "flat"
            yield f"layer {i} window {w}", {**cfg, "layers": [*layers[:i], {**entry, "kind": kind, "window": w},
                                                              *layers[i + 1:]]}
    if cfg.get("max_write") is not None:
        for m in [None, *range(1, cfg["max_write"])]:
            yield f"max_write {m}", {**cfg, "max_write": m}
    for name in ("capacity", "batch_size", "n_kv_heads", "head_dim", "v_head_dim"):
        for value in range(1, cfg[name]):
            changed = {**cfg, name: value}
            if name in ("n_kv_heads", "head_dim"):
                changed["layers"] = [{**entry, name: value} for entry in layers]
            yield f"{name} {value}", changed


def smaller_programs(steps: list[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The program with one step removed, and with one step (all its calls) a token shorter."""
    for i in range(len(steps)):
        yield f"without step {i}", steps[:i] + steps[i + 1:]
    i = 0
    while i < len(steps):
        j = i
        positions = steps[i].get("positions")
        while j + 1 < len(steps) and positions is not None and steps[j + 1].get("positions") == positions:
            j += 1
        if positions and len(positions) > 1:
            yield f"step {i} a token shorter", [{**s, "positions": s["positions"][:-1]} if i <= k <= j else s
                                                for k, s in enumerate(steps)]
        i = j + 1


@pytest.mark.parametrize("name", sorted(MINIMAL))
def test_a_counterexample_is_minimal_in_every_dimension(name: str) -> None:
    key, sizes, lengths = MINIMAL[name]
    spec = STANDIN.format(name)
    report = report_json(run_suite(PythonTarget(spec), "quick"), True, False)
    found = [f for f in report["semantic"]["findings"] if (f["class"], f["rule"]) == key]
    assert found, [(f["class"], f["rule"]) for f in report["semantic"]["findings"]]
    finding = min(found, key=lambda f: len(f["steps"]))
    cfg, steps = finding["config"], finding["steps"]
    windows = [entry["window"] for entry in cfg["layers"]]
    got = {name: (windows[0] if name == "window" else cfg[name]) for name in sizes}
    assert got == sizes and [len(s.get("positions", [])) for s in steps] == lengths, (cfg, steps)
    assert not finding.get("note"), finding["note"]   # the shrink finished: no budget note
    again = replay(spec, cfg, steps)
    assert again is not None and (again["class"], again["rule"]) == key
    for what, smaller in smaller_configs(cfg):
        if _valid(smaller):
            shown = replay(spec, smaller, steps)
            assert shown is None or (shown["class"], shown["rule"]) != key, f"{what} shows it too"
    for what, program in smaller_programs(steps):
        if program:
            shown = replay(spec, cfg, program)
            assert shown is None or (shown["class"], shown["rule"]) != key, f"{what} shows it too"


SIZES = ("capacity", "n_layers", "batch_size", "n_kv_heads", "head_dim", "v_head_dim")


@pytest.mark.parametrize("cfg", [*CONTIGUOUS_CONFIGS, op_config(4, (0,), v_head_dim=1), op_config(4, (2,), v_head_dim=3),
                                 op_config(6, (3, 0), head_dim=3, v_head_dim=2, max_write=2)])
def test_a_simpler_configuration_is_no_larger_in_any_size(cfg: dict[str, Any]) -> None:
    """The shrinker's moves on a configuration are well-founded: none raises a size, so no two moves undo each
    other (v_head_dim raised to head_dim, then lowered again, spent whole shrink budgets on upstream's caches)."""
    from kvcache_spec.conformance.suite.shrink import _simpler_configs

    for simpler in _simpler_configs(cfg):
        raised = [key for key in SIZES if key in cfg and simpler[key] > cfg[key]]
        windows = [entry.get("window", 0) for entry in simpler["layers"]]
        assert not raised and len(simpler["layers"]) <= len(cfg["layers"]), (raised, simpler)
        assert len(windows) < len(cfg["layers"]) or all(
            w <= entry.get("window", 0) for w, entry in zip(windows, cfg["layers"])), simpler
