"""A contiguous op cache quantized mid-generation (OP-QUANTIZE; SPEC.md part 5): the model, the reference's quantizer
and its bound, its refusals, the suite's quantize steps (in process and over the wire, left out for a target without
the feature or declaring lossy) and the stand-ins of spec/conformance/zoo/op_quantize.py, each found with a short
program."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcache import KVCacheError
from kvcache._op_quantize import codes_of, quantized, within_bound
from kvcache.op import CacheConfig, ContiguousReferenceCache, LayerPolicy
from kvcache_spec import op_model
from kvcache_spec.conformance import scope as scopes
from kvcache_spec.conformance.op.programs import CONTIGUOUS_CONFIGS, forward, op_config
from kvcache_spec.conformance.op.quantize import quantize, quantize_programs, readable_bits
from kvcache_spec.conformance.suite import CONFORMING, replay, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget, parse_target
from kvcache_spec.conformance.zoo import op_quantize
from kvcache_spec.conformance.zoo.op_quantize import FOUND_AS
from tests.standin_found import assert_found_short

REFERENCE = "python:kvcache_spec.conformance.op.targets:contiguous"
STANDINS = "python:kvcache_spec.conformance.zoo.op_quantize:{}"
BAD_BITS = (True, False, 4.0, 1, 9, -1, None, "4")


# --- the model -----------------------------------------------------------------------------------------------

def _model(capacity: int = 8, n_layers: int = 2) -> op_model.OpModel:
    made = op_model.make_config({"capacity": capacity, "n_layers": n_layers, "n_kv_heads": 1, "head_dim": 2,
                                 "batch_size": 1, "layers": [{"kind": "flat", "window": 0}] * n_layers},
                                op_model.CONTIGUOUS)
    assert isinstance(made, op_model.OpConfig)
    return op_model.OpModel(made)


def _fill(m: op_model.OpModel, n: int) -> None:
    shapes = op_model.Shapes((1, 1, n, 2), (1, 1, n, 2), (n, 1))
    held = len(m.held.get(0, {}))
    for layer in range(m.cfg.n_layers):
        m.fetch(layer, shapes, list(range(held, held + n)), list(range(held, held + n)))


@pytest.mark.parametrize("bits", BAD_BITS)
def test_the_model_refuses_bad_bits_and_changes_nothing(bits: Any) -> None:
    m = _model()
    _fill(m, 2)
    before = m.snapshot()
    rejected = m.quantize(bits)
    assert rejected is not None and rejected.rule == "OP-QUANTIZE"
    assert m.held == before.held and m.bits is None


def test_the_model_keeps_positions_abandons_an_open_step_and_stays_quantized() -> None:
    m = _model()
    _fill(m, 2)
    m.fetch(0, op_model.Shapes((1, 1, 1, 2), (1, 1, 1, 2), (1, 1)), [2], [99])   # a step open on layer 0
    assert m.quantize(4) is None
    assert m.bits == 4 and m.step is None and [m.used(layer) for layer in range(2)] == [2, 2] and m.abandoned == 1
    assert m.quantize(8) is not None and m.bits == 4   # a second quantize refused
    m.reset()
    assert m.bits == 4 and m.snapshot().bits == 4


def test_the_bound_is_half_a_step_over_the_row() -> None:
    assert op_model.quantize_bound(2, 10, 16) == 1.0
    assert op_model.quantize_bound(8, 0, 255) == 0.5
    assert [readable_bits(2, width) for width in (2, 3, 4, 8, 255, 256)] == [2, 2, 3, 4, 8, None]


# --- the reference -------------------------------------------------------------------------------------------

def _cache(head_dim: int = 8, capacity: int = 16, *policies: LayerPolicy, batch: int = 1) -> ContiguousReferenceCache:
    layers = list(policies) or [LayerPolicy.flat(), LayerPolicy.ring(3)]
    return ContiguousReferenceCache(CacheConfig(n_layers=len(layers), n_kv_heads=2, head_dim=head_dim,
                                                capacity=capacity, layers=layers, batch_size=batch))


def _rows(rng: np.random.Generator, q: int, width: int = 8, batch: int = 1) -> np.ndarray:
    return (rng.normal(size=(batch, 2, q, width)) * rng.uniform(0.1, 100)).astype(np.float32)


@pytest.mark.parametrize("bits", list(op_model.QUANTIZE_BITS))
def test_the_quantizer_is_within_the_bound_for_any_row(bits: int) -> None:
    rng = np.random.default_rng(bits)
    for width in (1, 2, 3, 8, 64, 65):
        x = _rows(rng, 5, width)
        x[0, 0, 0] = 7.0   # a constant row: exact
        held = quantized(x, bits)
        codes, _, _ = codes_of(x, bits)
        assert within_bound(x, held, bits) and held.dtype == np.float32
        assert codes.max() <= (1 << bits) - 1 and (held[0, 0, 0] == 7.0).all()
    assert not within_bound(np.array([[0.0, 1.0, 2.0, 3.0]]), np.array([[0.0, 1.0, 2.0, 2.0]]), 8)


def _fetch(cache: ContiguousReferenceCache, rows: np.ndarray, first: int) -> list[np.ndarray]:
    positions = np.arange(first, first + rows.shape[2]).reshape(-1, 1)
    return [np.asarray(cache.update_and_fetch(layer, rows, -rows, positions)[0])
            for layer in range(cache.config.n_layers)]


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_every_row_held_and_written_later_reads_back_within_the_bound(bits: int) -> None:
    """OP-QUANTIZE: quantized after a prefill of 3 and decodes past the ring's window, every row read (on the flat and
    the ring layer) is within the bound of what was written; the lengths and masks are an exact cache's."""
    rng = np.random.default_rng(0)
    quantized_cache, exact = _cache(), _cache()
    written = [_rows(rng, 3)]
    for cache in (quantized_cache, exact):
        _fetch(cache, written[0], 0)
    quantized_cache.quantize(bits)
    for first in range(3, 8):
        written.append(_rows(rng, 1))
        answers = [cache.update_and_fetch(layer, written[-1], -written[-1], np.array([[first]]))
                   for cache in (quantized_cache, exact) for layer in range(2)]
        for (got, _, spec), (want, _, want_spec) in zip(answers[:2], answers[2:]):
            assert within_bound(np.asarray(want), np.asarray(got), bits)
            assert spec.kind == want_spec.kind and np.array_equal(np.asarray(spec.mask), np.asarray(want_spec.mask))
        assert [quantized_cache.used(layer) for layer in range(2)] == [first + 1] * 2


def _error(call: Any) -> str:
    try:
        call()
    except KVCacheError as error:
        return f"{type(error).__name__} {error.rule} {error.argument}"
    return "no error"


@pytest.mark.parametrize("bits", BAD_BITS)
def test_the_reference_refuses_bad_bits_naming_the_rule_and_changes_nothing(bits: Any) -> None:
    cache = _cache()
    _fetch(cache, _rows(np.random.default_rng(1), 3), 0)
    before = cache._state()
    assert _error(lambda: cache.quantize(bits)).endswith("OP-QUANTIZE bits")
    assert cache._state() == before


def test_a_second_quantize_is_refused_and_a_reset_keeps_the_cache_quantized() -> None:
    cache = _cache()
    cache.quantize(8)
    before = cache._state()
    assert _error(lambda: cache.quantize(4)) == "StepError OP-QUANTIZE bits" and cache._state() == before
    cache.reset()
    row = np.array([0, 1, 2, 3, 4, 5, 6, 10], np.float32).reshape(1, 1, 1, 8).repeat(2, axis=1)
    got = _fetch(cache, row, 0)[0]
    assert not np.array_equal(got, row) and within_bound(row, got, 8)


def test_a_quantize_mid_step_abandons_the_step() -> None:
    cache = _cache()
    rows = _rows(np.random.default_rng(2), 2)
    _fetch(cache, rows, 0)
    cache.update_and_fetch(0, rows[:, :, :1], rows[:, :, :1], np.array([[2]]))
    cache.quantize(4)
    assert [cache.used(layer) for layer in range(2)] == [2, 2]


def test_batch_rows_keep_their_own_rows_through_a_quantize() -> None:
    cache = _cache(4, 8, LayerPolicy.flat(), batch=2)
    rows = _rows(np.random.default_rng(3), 3, 4, batch=2)
    _fetch(cache, rows, 0)
    cache.quantize(6)
    cache.reorder([1, 0])
    got = _fetch(cache, rows[:, :, :1], 3)[0]
    assert within_bound(rows[::-1], got[:, :, :3], 6)


# --- the suite -----------------------------------------------------------------------------------------------

def test_every_contiguous_config_has_quantize_programs_the_reference_serves() -> None:
    for cfg in CONTIGUOUS_CONFIGS:
        programs = dict(quantize_programs(cfg))
        assert {"quantized after a prefill, then decodes", "a second quantize refused",
                "malformed op.quantize.bits bool", "malformed op.quantize.bits float"} <= set(programs)
    for cfg in CONTIGUOUS_CONFIGS[:4]:
        for name, program in quantize_programs(cfg):
            assert replay(REFERENCE, cfg, program) is None, name


ONE_FLAT = op_config(8, (0,), n_layers=2)
CONVERTED = forward(ONE_FLAT, 3) + [quantize()] + forward(ONE_FLAT, 1) * 2


def test_the_reference_serves_a_quantize_over_the_wire() -> None:
    isolated = parse_target(REFERENCE, isolate=True)
    try:
        assert replay(isolated, ONE_FLAT, CONVERTED) is None
        assert replay(isolated, ONE_FLAT, forward(ONE_FLAT, 1) + [quantize(), quantize(8)] + forward(ONE_FLAT, 1)) \
            is None
    finally:
        isolated.close()
    found = replay(parse_target(STANDINS.format("coarse_steps"), isolate=True), ONE_FLAT, CONVERTED)
    assert found is not None and (found["class"], found["rule"]) == ("wrong", "OP-QUANTIZE")


def spec_3_drops_a_row(cfg: Any) -> Any:
    """The row-dropping stand-in written against spec 3: it names no `quantize`, so it is sent no quantize step."""
    return op_quantize.drops_a_row(cfg)


spec_3_drops_a_row.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
spec_3_drops_a_row.kvcache_scope = ("spec=3",)   # type: ignore[attr-defined]


def lossy_drops_a_row(cfg: Any) -> Any:
    """The same declaring lossy=0.25: its rows are read within its own tolerance, so it is sent no quantize."""
    return op_quantize.drops_a_row(cfg)


lossy_drops_a_row.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
lossy_drops_a_row.kvcache_scope = (f"spec={scopes.CURRENT_VERSION}", "lossy=0.25")   # type: ignore[attr-defined]


def test_a_target_without_the_feature_or_lossy_is_sent_no_quantize() -> None:
    found = replay(STANDINS.format("drops_a_row"), ONE_FLAT, CONVERTED)
    assert found is not None and (found["class"], found["rule"]) == ("wrong", "OP-QUANTIZE")
    assert replay(f"python:{__name__}:spec_3_drops_a_row", ONE_FLAT, CONVERTED) is None
    assert replay(f"python:{__name__}:lossy_drops_a_row", ONE_FLAT, CONVERTED) is None


def test_the_quantize_feature_is_spec_4_and_op_contiguous_only() -> None:
    assert scopes.version_of("quantize") == 4 and "quantize" not in scopes.features_of(3)
    assert "quantize" in scopes.LAYOUT_FEATURES["op-contiguous"]
    assert all("quantize" not in features for layout, features in scopes.LAYOUT_FEATURES.items()
               if layout != "op-contiguous")


def _report(spec: str, profile: str = "quick") -> dict[str, Any]:
    return report_json(run_suite(PythonTarget(spec), profile), True, False)


@pytest.mark.slow   # the reference's quick run, ~30 s (CI's conformance job runs it at pre-merge)
def test_the_reference_is_conforming_strict_with_quantize_in_scope() -> None:
    report = _report(REFERENCE)
    assert report["verdict"] == CONFORMING and report["coverage"]["complete"], report["semantic"]["findings"][:1]
    assert "OP-QUANTIZE" in report["coverage"]["rules"]["exercised"] and "quantize" in report["scope"]["features"]


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name != "bits_truthy" else name
                                  for name in sorted(FOUND_AS)])
def test_each_quantize_standin_is_found_with_a_short_program_that_replays(name: str) -> None:
    """OP-QUANTIZE: each stand-in is found as FOUND_AS says, with a program of at most 4 steps, replayed the same;
    the reference serves that program with no finding."""
    assert_found_short(STANDINS.format(name), FOUND_AS[name], REFERENCE)


# --- the exhaustive checker ---------------------------------------------------------------------------------


@pytest.mark.slow   # depth-4 runs, as the other checker tests (~20 s each)
def test_the_exhaustive_checker_passes_the_reference_and_finds_every_quantize_standin() -> None:
    """--quantize: every program to depth 4 over one ring of 2 with rows of 3, with quantizes of 2 and 8 bits and each
    malformed bits: the reference passes (476 states, 3105 programs), each stand-in is found as FOUND_AS says within 4
    steps."""
    from kvcache_spec.conformance.op import checker as op_checker
    passed = op_checker.check(PythonTarget(REFERENCE), 4, op_checker.QUANTIZE_CONFIG)
    assert not passed.findings and passed.states > 100, passed.summary()
    for name, key in FOUND_AS.items():
        found = op_checker.check(PythonTarget(STANDINS.format(name)), 4, op_checker.QUANTIZE_CONFIG).findings
        assert key in found and len(found[key][1]) <= 4, (name, {k: len(v[1]) for k, v in found.items()})
