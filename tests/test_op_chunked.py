"""Chunk layers and recording on the op face (OP-CHUNK, OP-RECORD; SPEC.md part 5): the model rule by rule, the
reference's contracts and refusals (numpy; torch where it is installed), the scope features `chunk` and `recording`
(spec version 3), the suite on the reference (CONFORMING, strict), each stand-in of
spec/conformance/zoo/op_chunk.py found with a short program that replays, and the exhaustive checker."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcache import KVCacheError
from kvcache._op_types import mask_of
from kvcache.op import CacheConfig, CellReferenceCache, ContiguousReferenceCache, LayerKind, LayerPolicy
from kvcache_spec import op_model
from kvcache_spec.conformance import layouts, scope as scopes
from kvcache_spec.conformance.op import checker as op_checker
from kvcache_spec.conformance.op.programs import BAD_CHUNK_CONFIGS, CONTIGUOUS_CONFIGS, edge_contiguous_programs, \
    op_config
from kvcache_spec.conformance.suite import CONFORMING, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget
from kvcache_spec.conformance.zoo.op_chunk import FOUND_AS
from tests.test_op_trim_sinks import _steps   # contiguous steps on every layer, the last one's attends
from tests.standin_found import assert_found_short

REFERENCE = "python:kvcache_spec.conformance.op.targets:contiguous"
STANDINS = "python:kvcache_spec.conformance.zoo.op_chunk:{}"
CHUNK3 = {"kind": "chunk", "window": 0, "chunk": 3}
FLAT = {"kind": "flat", "window": 0}
RING3 = {"kind": "ring", "window": 3}

# --- the model ------------------------------------------------------------------------------------------


def _model(*layers: dict[str, Any], kind: str = op_model.CONTIGUOUS, **more: Any) -> Any:
    return op_model.make_config({"capacity": 30, "n_layers": len(layers), "n_kv_heads": 1, "head_dim": 1,
                                 "batch_size": 1, "layers": list(layers), **more}, kind)


def test_OP_CHUNK_a_query_attends_its_own_chunk_within_a_step_and_across_steps() -> None:
    """OP-CHUNK: the query at p attends c * floor(p / c) .. p, the step's own earlier tokens included; a step
    across a boundary splits its queries between two chunks; chunk 1 attends itself alone."""
    m = op_model.OpModel(_model(CHUNK3, FLAT, {**CHUNK3, "chunk": 1}))
    chunked, flat, single = _steps(m, 2, 3)   # the last step: positions 2, 3, 4
    assert chunked == [[0, 1, 2], [3], [3, 4]] and flat == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]]
    assert single == [[2], [3], [4]]
    assert _steps(m, 2)[0] == [[3, 4, 5], [6]]


@pytest.mark.parametrize("entry", [{**CHUNK3, "chunk": 0}, {**CHUNK3, "chunk": -1}, {**CHUNK3, "chunk": True},
                                   {**CHUNK3, "chunk": 3.0}, {"kind": "chunk", "window": 0},
                                   {**FLAT, "chunk": 2}, {**RING3, "chunk": 2}])
def test_OP_CHUNK_a_chunk_below_one_or_on_another_kind_is_refused(entry: dict[str, Any]) -> None:
    """OP-CONFIG, OP-CHUNK: a chunk of 0 holds no query; a chunk not an int, a chunk layer without one, a chunk on
    a flat or a ring layer; the cell cache has no chunk layers; a chunk layer with a window is no policy."""
    made = _model(entry)
    assert isinstance(made, op_model.Rejected) and (made.rule, made.case) == ("OP-CONFIG", "chunk")
    assert isinstance(_model({**CHUNK3, "window": 2}), op_model.Rejected)
    assert isinstance(_model(CHUNK3, kind=op_model.CELL), op_model.Rejected)
    assert isinstance(_model(CHUNK3), op_model.OpConfig)


def test_OP_CHUNK_a_trim_is_owed_while_the_next_querys_chunk_is_held() -> None:
    """OP-CHUNK, OP-TRIM: a step begun at s lets a cache of the least size drop what lies below s's chunk; a trim
    back into that chunk is owed, one across its start optional; a trim lowers the floor (min(F, L - n))."""
    m = op_model.OpModel(_model(CHUNK3, FLAT))
    _steps(m, 4, 1, 1)   # the last step began at 5: chunk 3
    assert m.floors == [3, 0] and [m.trim_answer(n) for n in range(7)] == ["owed"] * 4 + ["optional"] * 3
    assert m.trim(4) is None and m.floors == [2, 0]   # served (the target's choice), the floor at the new length
    assert _steps(m, 1)[0] == [[0, 1, 2]]              # the query at 2 reads its whole chunk again


def test_OP_RECORD_a_recording_ring_keeps_its_past_until_a_trim() -> None:
    """OP-RECORD: a step moves no recording ring's floor, so every trim is owed until the first; a trim cuts the
    ring to the w - k - 1 positions the next query reads; a trim no lower than it left stays owed."""
    recording = op_model.OpModel(_model(RING3, FLAT, record_past=True))
    plain = op_model.OpModel(_model(RING3, FLAT))
    for m in (recording, plain):
        _steps(m, 2, 2, 2)
    assert recording.floors == [0, 0] and {recording.trim_answer(n) for n in range(7)} == {"owed"}
    assert plain.floors == [4, 0] and plain.trim_answer(1) == "optional"
    assert recording.trim(2) is None and recording.floors == [2, 0] and recording.unrecorded == [4, 0]
    _steps(recording, 1, 1, 1)   # L = 7
    assert [recording.trim_answer(n) for n in range(5)] == ["owed"] * 4 + ["optional"]
    assert _model(RING3, record_past=1).case == "record_past" and _model(RING3, record_past="yes").case == "record_past"
    assert _model(RING3, kind=op_model.CELL, record_past=True).case == "record_past"


# --- the reference --------------------------------------------------------------------------------------


def _fetch(cache: Any, layer: int, positions: list[int]) -> list[list[int]]:
    k = np.array(positions, np.float32).reshape(1, 1, -1, 1)
    k_hist, _, spec = cache.update_and_fetch(layer, k, k, np.array(positions).reshape(-1, 1))
    rows = k_hist[0, 0, :, 0]
    return [sorted(int(x) for x in rows[seen]) for seen in mask_of(spec, len(positions), len(rows))]


def test_the_reference_agrees_with_the_model_on_chunks_and_recording_trims() -> None:
    """OP-CHUNK, OP-RECORD: the reference's answers are the model's through steps across boundaries and trims of
    every size, and it serves every trim the model owes (it keeps a chunk layer's and a recording ring's whole
    history, max_write set or not)."""
    for layers, more in (((CHUNK3, FLAT), {}), ((RING3,), {"record_past": True, "max_write": 2})):
        for n in range(7):
            mcfg = _model(*layers, **more)
            model = op_model.OpModel(mcfg)
            policies = [LayerPolicy.chunked(3) if e["kind"] == "chunk" else LayerPolicy.ring(3) if e["kind"] == "ring"
                        else LayerPolicy.flat() for e in layers]
            cache = ContiguousReferenceCache(CacheConfig(len(layers), 1, 1, 30, layers=policies, **more))
            for q in (2, 2, 2, 1):
                start = model.used(0)
                answers = _steps(model, q)
                assert [_fetch(cache, layer, list(range(start, start + q))) for layer in range(len(layers))] == answers
            # recording: every trim of the 7 tokens is owed; the chunk layer's last step began at 6, in chunk 6..8
            owed = bool(more) or 7 - n >= 6
            assert model.trim_answer(n) == ("owed" if owed else "optional")
            model.trim(n)
            cache.trim(n)
            assert [_fetch(cache, layer, [7 - n]) for layer in range(len(layers))] == _steps(model, 1)


@pytest.mark.parametrize("make", [lambda: LayerPolicy.chunked(0), lambda: LayerPolicy.chunked(True),
                                  lambda: LayerPolicy(LayerKind.FLAT, 0, 0, 2), lambda: LayerPolicy(LayerKind.CHUNK, 3),
                                  lambda: LayerPolicy(LayerKind.CHUNK, 0, 0, 0)])
def test_the_reference_refuses_a_bad_chunk_typed(make: Any) -> None:
    with pytest.raises(KVCacheError, match="OP-CONFIG"):
        make()


def test_the_reference_refuses_record_past_not_a_bool_and_the_cell_cache_both() -> None:
    for value in (1, "yes", None):
        with pytest.raises(KVCacheError, match="OP-CONFIG.*record_past"):
            CacheConfig(1, 1, 1, 4, record_past=value)
    for config in (CacheConfig(1, 1, 1, 4, layers=(LayerPolicy.chunked(2),)), CacheConfig(1, 1, 1, 4, record_past=True)):
        with pytest.raises(KVCacheError, match="OP-CONFIG"):
            CellReferenceCache(config)


def test_torch_in_torch_out_on_a_chunk_layer_and_a_recording_ring() -> None:
    """The same answers with torch tensors (skipped where torch is not installed: an optional extra)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra of the test run)")
    config = CacheConfig(2, 1, 1, 12, layers=(LayerPolicy.chunked(2), LayerPolicy.ring(2)), max_write=2, record_past=True)
    by_numpy, by_torch = ContiguousReferenceCache(config), ContiguousReferenceCache(config)
    for start, q in ((0, 2), (2, 2), (4, 1)):
        positions = np.arange(start, start + q).reshape(-1, 1)
        k = np.arange(start, start + q, dtype=np.float32).reshape(1, 1, -1, 1)
        for layer in (0, 1):
            expected = by_numpy.update_and_fetch(layer, k, k, positions)
            got = by_torch.update_and_fetch(layer, torch.from_numpy(k), torch.from_numpy(k), torch.from_numpy(positions))
            assert np.array_equal(got[0].numpy(), expected[0]) and got[2].kind is expected[2].kind
            if got[2].mask is not None:
                assert isinstance(got[2].mask, torch.Tensor) and np.array_equal(got[2].mask.numpy(), expected[2].mask)
    by_numpy.trim(4), by_torch.trim(4)
    assert by_numpy.used(1) == by_torch.used(1) == 1


# --- the scope features -----------------------------------------------------------------------------------


def test_chunk_and_recording_are_spec_3_features_of_the_contiguous_op_layout() -> None:
    """Scope features `chunk` and `recording` (SCOPE-VERSION): a chunk layer or a chunk key needs `chunk`, a
    record_past key (any value) `recording`; spec 3 added both, so a spec-2 target is never sent such a config,
    and the reference (spec 3) declares them."""
    assert scopes.needs(op_config(8, (0, 0), chunks=(3, 0))) == {"flat", "chunk"}
    assert scopes.needs(op_config(8, (3,), record_past=True)) == {"ring", "recording"}
    assert scopes.needs({**op_config(8, (0,)), "record_past": "yes"}) == {"flat", "recording"}
    assert scopes.version_of("chunk") == scopes.version_of("recording") == 3
    spec2 = scopes.parse(["spec=2"], "test")
    assert not spec2.speaks(op_config(8, (0, 0), chunks=(3, 0))) and not spec2.speaks(op_config(8, (3,), record_past=True))
    assert scopes.parse(["spec=3"], "test").speaks(op_config(8, (0, 0), chunks=(3, 0)))
    assert {"chunk", "recording"} <= scopes.LAYOUT_FEATURES["op-contiguous"] and \
        not {"chunk", "recording"} & scopes.LAYOUT_FEATURES["op-cell"]
    assert {"chunk", "recording"} <= PythonTarget(REFERENCE).scope.features


def test_the_reference_serves_every_edge_program_of_the_chunk_and_recording_configs() -> None:
    """The suite's chunk and recording configurations, each edge program (trims across a boundary, a recording
    trim back to the last one's length): the reference has no finding; every bad chunk config is refused."""
    target = PythonTarget(REFERENCE)
    chunked = [cfg for cfg in CONTIGUOUS_CONFIGS if "chunk" in scopes.needs(cfg) or "recording" in scopes.needs(cfg)]
    assert len(chunked) == 6
    names = set()
    for cfg in chunked:
        for name, program in edge_contiguous_programs(cfg):
            names.add(name)
            result = layouts.run_any(target, cfg, program)
            assert result.finding is None, (cfg, name, result.finding)
    assert {"decodes past a chunk boundary, trim 4", "recording: decodes, trim, decodes, trim back"} <= names
    for name, cfg in BAD_CHUNK_CONFIGS:
        assert layouts.run_any(target, cfg, []).finding is None, name


# --- the suite ---------------------------------------------------------------------------------------------


def _report(spec: str, profile: str = "quick", strict: bool = True) -> dict[str, Any]:
    return report_json(run_suite(PythonTarget(spec), profile), strict, False)


@pytest.mark.slow   # the reference's quick run, ~25 s (CI's conformance job runs it at pre-merge)
def test_the_reference_is_conforming_strict_with_chunk_and_recording_in_scope() -> None:
    report = _report(REFERENCE)
    assert report["verdict"] == CONFORMING and report["coverage"]["complete"], report["semantic"]["findings"][:1]
    assert {"OP-CHUNK", "OP-RECORD", "OP-TRIM"} <= set(report["coverage"]["rules"]["exercised"])
    assert {"chunk", "recording"} <= set(report["scope"]["features"]) and report["scope"]["full"]


# (class, rule) each stand-in is found as (FOUND_AS); its shortest program has at most 4 steps
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name != "chunk_start_kept_after_trim"
                                  else name for name in sorted(FOUND_AS)])
def test_each_chunk_and_recording_standin_is_found_with_a_short_program_that_replays(name: str) -> None:
    """OP-CHUNK, OP-RECORD: each stand-in is found as FOUND_AS says, with a program of at most 4 steps, replayed
    the same; the reference serves that program with no finding."""
    assert_found_short(STANDINS.format(name), FOUND_AS[name], REFERENCE)


# --- the exhaustive checker ---------------------------------------------------------------------------------


CHECKED_STANDINS = {   # what the checker's small configs reach within 4 steps (one layer each, no max_write)
    "chunk": {"chunk_as_window": ("wrong", "OP-ATTEND"), "chunk_start_kept_after_trim": ("wrong", "OP-ATTEND")},
    "record": {"recording_loses_past": ("wrong", "OP-ATTEND")},
}


@pytest.mark.slow   # depth-4 runs, as the other checker tests
@pytest.mark.parametrize("which", sorted(CHECKED_STANDINS))
def test_the_exhaustive_checker_passes_the_reference_and_finds_the_standins(which: str) -> None:
    """--chunk, --record: every program to depth 4 on one chunk(2) layer or one recording ring(2): the reference
    passes, the stand-ins that lose rows are found within 4 steps."""
    config = op_checker.EXTRA_CONFIGS[which]
    passed = op_checker.check(PythonTarget(REFERENCE), 4, config)
    assert not passed.findings and passed.states > 20, passed.summary()
    for name, key in CHECKED_STANDINS[which].items():
        found = op_checker.check(PythonTarget(STANDINS.format(name)), 4, config).findings
        assert key in found and len(found[key][1]) <= 4, (name, {k: len(v[1]) for k, v in found.items()})
