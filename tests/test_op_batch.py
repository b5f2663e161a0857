"""Rows of a batch that differ and the batch verbs on the op face (OP-PAD, OP-ROWS; SPEC.md part 5): the model
rule by rule, the reference's contracts and refusals (numpy; torch where it is installed), the scope features
`pad` and `batch-verbs`, the suite on the reference (CONFORMING, strict), each stand-in of
spec/conformance/zoo/op_batch.py found with a short program, and the exhaustive checker."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcache import KVCacheError
from kvcache._op_types import mask_of
from kvcache.op import CacheConfig, ContiguousReferenceCache, LayerPolicy
from kvcache_spec import op_model
from kvcache_spec.conformance import scope as scopes
from kvcache_spec.conformance.op import checker as op_checker
from kvcache_spec.conformance.op.engine import OpEngine
from kvcache_spec.conformance.op.programs import BATCH_OPS, CONTIGUOUS_CONFIGS, batch_programs
from kvcache_spec.conformance.suite import CONFORMING, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget
from kvcache_spec.conformance.zoo.op_batch import FOUND_AS
from tests.standin_found import assert_found_short

FLAT = {"kind": "flat", "window": 0}
RING2 = {"kind": "ring", "window": 2}


def _model(batch: int, *layers: dict[str, Any], kind: str = op_model.CONTIGUOUS) -> op_model.OpModel:
    cfg = op_model.make_config({"capacity": 12, "n_layers": len(layers), "n_kv_heads": 1, "head_dim": 1,
                                "batch_size": batch, "layers": list(layers)}, kind)
    assert isinstance(cfg, op_model.OpConfig)
    return op_model.OpModel(cfg)


def _step(model: op_model.OpModel, q: int) -> list[Any]:
    """One step of q tokens on every layer; per layer, each batch row's attended labels."""
    held = len(model.held.get(0, {}))
    positions = list(range(held, held + q))
    uids = [1000 + p for p in positions]
    out = []
    for layer in range(model.cfg.n_layers):
        shapes = op_model.Shapes((model.cfg.batch_size, 1, q, 1), (model.cfg.batch_size, 1, q, 1), (q, 1))
        attends = model.fetch(layer, shapes, positions, uids)
        assert not isinstance(attends, op_model.Rejected)
        out.append(model.row_attends(attends, positions))
    return out


# --- the model ------------------------------------------------------------------------------------------

def test_OP_PAD_the_model_never_lets_a_real_query_attend_a_pad() -> None:
    model = _model(2, FLAT, RING2)
    assert model.pad([2, 0]) is None
    flat, ring = _step(model, 3)
    assert flat[0] == [None, None, [(1002, 0)]]   # row 0: positions 0 and 1 are pads, not judged
    assert flat[1] == [[(1000, 1)], [(1000, 1), (1001, 1)], [(1000, 1), (1001, 1), (1002, 1)]]
    assert ring[0][2] == [(1002, 0)] and ring[1][2] == [(1001, 1), (1002, 1)]
    flat, _ = _step(model, 1)
    assert flat[0] == [[(1002, 0), (1003, 0)]]


def test_OP_PAD_the_model_refuses_bad_padding_and_changes_nothing() -> None:
    model = _model(2, FLAT)
    for bad, case in (([1], "length"), ((1, 0), "length"), ([True, 0], "pad type"), ([0.0, 0], "pad type"),
                      ([-1, 0], "pad range"), ([13, 0], "pad range")):
        rejected = model.pad(bad)
        assert isinstance(rejected, op_model.Rejected) and (rejected.rule, rejected.case) == ("OP-PAD", case)
        assert model.pads == [0, 0]
    _step(model, 1)
    assert getattr(model.pad([0, 0]), "case", None) == "not empty"
    cell = _model(1, FLAT, kind=op_model.CELL)
    assert getattr(cell.pad([0]), "rule", None) == "OP-PAD"


def test_OP_ROWS_the_model_moves_each_rows_history_and_pads() -> None:
    model = _model(2, FLAT)
    model.pad([1, 0])
    _step(model, 2)
    assert model.reorder([1, 1]) is None and model.pads == [0, 0]
    (flat,) = _step(model, 1)
    assert flat == [[[(1000, 1), (1001, 1), (1002, 0)]], [[(1000, 1), (1001, 1), (1002, 1)]]]
    assert model.select([1, 0]) is None and model.repeat(2) is None and model.cfg.batch_size == 4
    one = model.extract(2)
    assert isinstance(one, op_model.OpModel) and one.cfg.batch_size == 1 and model.cfg.batch_size == 4
    (flat,) = _step(one, 1)
    assert flat == [[[(1000, 1), (1001, 1), (1002, 0), (1003, 0)]]]
    other = _model(1, FLAT)
    other.pad([3])
    for _ in range(4):
        _step(other, 1)
    assert one.extend(other) is None and one.cfg.batch_size == 2 and one.pads == [0, 3]
    (flat,) = _step(one, 1)
    assert flat[1] == [[(1003, 0), (1004, 1)]]   # other's own token (its uid), no pad, then its row's own


@pytest.mark.parametrize("verb, args, case", [
    ("select", [], "empty"), ("select", [2], "row range"), ("select", [-1], "row range"),
    ("select", [True], "row type"), ("select", [0.0], "row type"), ("select", [0, 0], "repeat"),
    ("select", (0,), "empty"), ("reorder", [0], "length"), ("reorder", [0, 1, 1], "length"),
    ("reorder", [0, 2], "row range"), ("repeat", 0, "times"), ("repeat", True, "times"), ("repeat", 2.0, "times"),
])
def test_OP_ROWS_the_model_refuses_bad_rows_and_changes_nothing(verb: str, args: Any, case: str) -> None:
    model = _model(2, FLAT)
    _step(model, 1)
    before = model.snapshot()
    rejected = getattr(model, verb)(args)
    assert isinstance(rejected, op_model.Rejected) and (rejected.rule, rejected.case) == ("OP-ROWS", case)
    assert (model.held, model.pads, model.row_labels, model.cfg) == (before.held, before.pads, before.row_labels,
                                                                     before.cfg)


# --- the reference --------------------------------------------------------------------------------------

def _cache(batch: int, *policies: LayerPolicy, **fields: Any) -> ContiguousReferenceCache:
    return ContiguousReferenceCache(CacheConfig(n_layers=len(policies), n_kv_heads=1, head_dim=1, capacity=12,
                                                batch_size=batch, layers=list(policies), **fields))


def _tags(cache: ContiguousReferenceCache, positions: list[int], base: float = 0.0) -> list[Any]:
    """One step on every layer: K of (row b, position p) is base + 100 b + p; per layer, per row, per query the
    K tags it attends (a pad query's own row only)."""
    b = cache.config.batch_size
    k = (base + 100 * np.arange(b)[:, None] + np.array(positions)[None, :]).astype(np.float32).reshape(b, 1, -1, 1)
    out = []
    for layer in range(cache.config.n_layers):
        k_hist, v_hist, spec = cache.update_and_fetch(layer, k, k + 0.5, np.array(positions).reshape(-1, 1))
        assert (v_hist == k_hist + 0.5).all()
        mask = mask_of(spec, len(positions), k_hist.shape[2], b)
        rows = mask if mask.ndim == 3 else np.broadcast_to(mask, (b,) + mask.shape)
        out.append([[sorted(float(x) for x in k_hist[r, 0, seen, 0]) for seen in rows[r]] for r in range(b)])
    return out


def test_OP_PAD_the_reference_masks_each_rows_pads_on_every_layer() -> None:
    cache = _cache(2, LayerPolicy.flat(), LayerPolicy.ring(2), max_write=3)
    cache.pad([2, 0])
    flat, ring = _tags(cache, [0, 1, 2])
    assert flat[0] == [[0.0], [1.0], [2.0]] and flat[1][2] == [100.0, 101.0, 102.0]
    flat, ring = _tags(cache, [3])
    assert flat[0] == [[2.0, 3.0]] and ring[0] == [[2.0, 3.0]] and ring[1] == [[102.0, 103.0]]
    cache.reset()
    assert cache.pads() == (0, 0)


def test_OP_PAD_the_reference_refuses_bad_padding_and_changes_nothing() -> None:
    cache = _cache(2, LayerPolicy.flat())
    for bad, kind in (([1], ValueError), (5, TypeError), ([True, 0], TypeError), ([0.5, 0], TypeError),
                      ([-1, 0], ValueError), ([13, 0], ValueError)):
        before = cache._state()
        with pytest.raises(kind) as caught:
            cache.pad(bad)
        assert isinstance(caught.value, KVCacheError) and caught.value.rule == "OP-PAD"
        assert cache._state() == before
    _tags(cache, [0])
    with pytest.raises(KVCacheError, match="OP-PAD"):
        cache.pad([0, 0])


def test_OP_ROWS_the_reference_moves_rows_with_their_pads_on_every_layer() -> None:
    cache = _cache(3, LayerPolicy.flat(), LayerPolicy.ring(2), max_write=1)
    cache.pad([1, 0, 2])
    _tags(cache, [0, 1, 2][:1])
    _tags(cache, [1]), _tags(cache, [2])
    cache.reorder([2, 0, 0])
    assert cache.pads() == (2, 1, 1)
    flat, ring = _tags(cache, [3], base=1000)
    assert flat[0] == [[202.0, 1003.0]] and flat[1] == [[1.0, 2.0, 1103.0]] and ring[2] == [[2.0, 1203.0]]
    cache.select([2, 0])
    cache.repeat(2)
    assert cache.config.batch_size == 4 and cache.pads() == (1, 1, 2, 2)
    one = cache.extract(2)
    assert one.config.batch_size == 1 and one.pads() == (2,) and cache.config.batch_size == 4
    (flat, _) = _tags(one, [4], base=2000)
    assert flat[0] == [[202.0, 1003.0, 2004.0]]
    other = _cache(1, LayerPolicy.flat(), LayerPolicy.ring(2), max_write=1)
    for p in range(5):
        _tags(other, [p], base=5000)
    one.extend(other)
    flat, ring = _tags(one, [5], base=3000)
    assert flat[1] == [[3105.0, 5000.0, 5001.0, 5002.0, 5003.0, 5004.0]] and ring[0] == [[2004.0, 3005.0]]


@pytest.mark.parametrize("verb, args", [
    ("select", []), ("select", [3]), ("select", [-1]), ("select", [True]), ("select", [1.0]), ("select", [0, 0]),
    ("select", 1), ("reorder", [0, 1]), ("reorder", [0, 1, 3]), ("repeat", 0), ("repeat", True), ("repeat", 2.0),
    ("extract", 3), ("extract", -1), ("extract", False), ("extend", "cache"),
])
def test_OP_ROWS_the_reference_refuses_bad_arguments_and_changes_nothing(verb: str, args: Any) -> None:
    cache = _cache(3, LayerPolicy.flat())
    _tags(cache, [0])
    before = cache._state()
    with pytest.raises((TypeError, ValueError)) as caught:
        getattr(cache, verb)(args)
    assert isinstance(caught.value, KVCacheError) and caught.value.rule == "OP-ROWS"
    assert cache._state() == before


def test_OP_ROWS_extend_refuses_another_config_or_length() -> None:
    cache = _cache(2, LayerPolicy.flat())
    _tags(cache, [0])
    shorter, wider = _cache(1, LayerPolicy.flat()), _cache(1, LayerPolicy.ring(2))
    _tags(wider, [0])
    for other in (shorter, wider, cache):
        before = cache._state()
        with pytest.raises(KVCacheError, match="OP-ROWS"):
            cache.extend(other)
        assert cache._state() == before


def test_OP_ROWS_torch_tensors_move_alike() -> None:
    torch = pytest.importorskip("torch")
    cache = _cache(2, LayerPolicy.flat())
    cache.pad([1, 0])
    k = torch.tensor([[0.0, 1.0], [10.0, 11.0]]).reshape(2, 1, 2, 1)
    _, _, spec = cache.update_and_fetch(0, k, k, torch.tensor([[0], [1]]))
    assert isinstance(spec.mask, torch.Tensor) and spec.mask.shape == (2, 2, 2)
    cache.reorder([0, 0])
    k_hist, _, spec = cache.update_and_fetch(0, k[:, :, :1] + 2, k[:, :, :1] + 2, torch.tensor([[2]]))
    assert isinstance(k_hist, torch.Tensor) and k_hist[:, 0, :, 0].tolist() == [[0.0, 1.0, 2.0], [0.0, 1.0, 12.0]]
    assert spec.mask.tolist() == [[False, True, True]]   # both rows now row 0, pads alike: one mask for both


# --- the suite: programs, scope, stand-ins ---------------------------------------------------------------

REFERENCE = "python:kvcache_spec.conformance.op.targets:contiguous"
STANDINS = "python:kvcache_spec.conformance.zoo.op_batch:{}"
BATCH_CONFIG = next(cfg for cfg in CONTIGUOUS_CONFIGS if cfg["batch_size"] == 3)


def _run(spec: str, program: list[Any], scope: Any = None) -> Any:
    return OpEngine(PythonTarget(spec), BATCH_CONFIG, op_model.CONTIGUOUS, scope).run(program)


def test_OP_ROWS_the_reference_serves_every_batch_program() -> None:
    programs = batch_programs(BATCH_CONFIG)
    assert len(programs) >= 15
    for name, program in programs:
        result = _run(REFERENCE, program)
        assert result.finding is None, (name, result.finding)
        assert {"OP-PAD", "OP-ROWS"} & result.exercised or name.startswith("malformed"), name


def test_OP_PAD_a_target_of_spec_3_is_sent_no_batch_verb() -> None:
    """A target that leaves `pad` and `batch-verbs` out is judged as before them: the verbs are left out of its
    programs (said in its skipped notes), so a stand-in that ignores padding passes them."""
    spec3 = scopes.parse(["spec=3"], "test")
    assert not {"pad", "batch-verbs"} & spec3.features
    for name, program in batch_programs(BATCH_CONFIG):
        result = _run(STANDINS.format("padding_ignored"), program, spec3)
        assert result.finding is None, (name, result.finding)
        assert all(step["op"] not in BATCH_OPS for step in result.steps)
    assert any("pad steps not sent" in note for note in result.skipped) or \
        any("select steps not sent" in note for note in result.skipped)


def _report(spec: str) -> dict[str, Any]:
    return report_json(run_suite(PythonTarget(spec), "quick"), True, False)


@pytest.mark.slow   # the reference's quick run, ~25 s (CI's conformance job runs it at pre-merge)
def test_the_reference_is_conforming_strict_with_pad_and_batch_verbs_in_scope() -> None:
    report = _report(REFERENCE)
    assert report["verdict"] == CONFORMING and report["coverage"]["complete"], report["semantic"]["findings"][:1]
    assert {"OP-PAD", "OP-ROWS", "OP-BATCH"} <= set(report["coverage"]["rules"]["exercised"])
    assert {"pad", "batch-verbs"} <= set(report["scope"]["features"]) and report["scope"]["full"]


# (class, rule) each stand-in is found as (FOUND_AS); its shortest program has at most 4 steps
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name != "reorder_drops_padding"
                                  else name for name in sorted(FOUND_AS)])
def test_each_batch_standin_is_found_with_a_short_program_that_replays(name: str) -> None:
    """OP-PAD, OP-ROWS: each stand-in is found as FOUND_AS says, with a program of at most 4 steps, replayed the
    same; the reference serves that program with no finding."""
    assert_found_short(STANDINS.format(name), FOUND_AS[name], REFERENCE)


# --- the exhaustive checker ---------------------------------------------------------------------------------


@pytest.mark.slow   # ~10 s a target
def test_the_exhaustive_checker_finds_a_reorder_that_drops_a_rows_padding() -> None:
    """--batch: every program to depth 4 on two batch rows over one flat layer: the reference passes; a reorder
    that leaves the pads at their old indices, and one that moves K but not V, are found within 4 steps."""
    config = op_checker.EXTRA_CONFIGS["batch"]
    passed = op_checker.check(PythonTarget(REFERENCE), 4, config)
    assert not passed.findings and passed.states > 500, passed.summary()
    for name, rules in (("reorder_drops_padding", {"OP-ROWS", "OP-PAD"}), ("reorder_k_only", {"OP-ATTEND"})):
        found = op_checker.check(PythonTarget(STANDINS.format(name)), 4, config)
        assert {rule for _, rule in found.findings} == rules, found.summary()
        for _, steps in found.findings.values():
            assert len(steps) <= 4 and any(step["op"] in ("reorder", "repeat", "select") for step in steps)
