"""A state saved and loaded on the op face (OP-STATE; SPEC.md part 5): the model, the reference's format and its
refusals byte by byte, the wire's base64, the suite's save and load steps, and the stand-ins of
spec/conformance/zoo/op_state.py, each found with a short program."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcache import KVCacheError
from kvcache import _op_state
from kvcache.op import CacheConfig, ContiguousReferenceCache, LayerPolicy
from kvcache_spec import op_model
from kvcache_spec.conformance import scope as scopes, wire
from kvcache_spec.conformance.op.persist import load, save
from kvcache_spec.conformance.op.programs import CONTIGUOUS_CONFIGS, forward, op_config, trim
from kvcache_spec.conformance.suite import CONFORMING, replay, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget, parse_target
from kvcache_spec.conformance.zoo import op_state
from kvcache_spec.conformance.zoo.op_state import FOUND_AS
from tests.test_op_trim_sinks import _steps   # contiguous steps on every layer, the last one's attends
from tests.standin_found import assert_found_short

REFERENCE = "python:kvcache_spec.conformance.op.targets:contiguous"
STANDINS = "python:kvcache_spec.conformance.zoo.op_state:{}"


# --- the model -----------------------------------------------------------------------------------------------

def _model(*layers: dict[str, Any], capacity: int = 20, **more: Any) -> op_model.OpModel:
    made = op_model.make_config({"capacity": capacity, "n_layers": len(layers), "n_kv_heads": 1, "head_dim": 1,
                                 "batch_size": 1, "layers": list(layers), **more}, op_model.CONTIGUOUS)
    assert isinstance(made, op_model.OpConfig)
    return op_model.OpModel(made)


def test_the_model_loads_a_state_whole_and_answers_as_the_saved_model() -> None:
    """OP-STATE: a state loaded replaces everything - the tokens held and the floors that decide which trims are
    owed - into a fresh model or one that moved on."""
    ring = {"kind": "ring", "window": 3}
    saved = _model(ring, {"kind": "flat", "window": 0}, max_write=2)
    _steps(saved, 2, 2, 2)
    state = saved.state()
    for target in (_model(ring, {"kind": "flat", "window": 0}, max_write=2), saved.snapshot()):
        _steps(target, 1, 1)
        assert target.load_state(state) is None
        assert target.held == saved.held and target.floors == saved.floors and target.step is None
        assert [target.trim_answer(n) for n in range(7)] == [saved.trim_answer(n) for n in range(7)]
        assert _steps(target, 1) == _steps(saved.snapshot(), 1)


def test_the_model_leaves_an_open_step_out_of_a_state_and_open() -> None:
    m = _model({"kind": "flat", "window": 0}, {"kind": "flat", "window": 0})
    _steps(m, 2)
    shapes = op_model.Shapes((1, 1, 1, 1), (1, 1, 1, 1), (1, 1))
    m.fetch(0, shapes, [2], [999])
    state = m.state()
    assert m.step is not None and m.used(0) == 3 and m.used(1) == 2   # the step stays open
    assert state.held.step is None and len(state.held.held[0]) == 2    # the state holds what its abandonment leaves


@pytest.mark.parametrize("form", sorted(op_model.STATE_FORMS))
def test_the_model_refuses_each_broken_form_and_changes_nothing(form: str) -> None:
    m = _model({"kind": "ring", "window": 2})
    _steps(m, 1, 1, 1)
    before = m.snapshot()
    saved = m.state()
    state = op_model.SavedState(saved.cfg, saved.held, form)
    if form == "foreign-config":   # a state of another config is whole, and refused for its config
        state = _model({"kind": "ring", "window": 2}, capacity=21).state()
    rejected = m.load_state(state)
    assert rejected is not None and rejected.rule == "OP-STATE" and form in rejected.case
    assert m.held == before.held and m.floors == before.floors


# --- the reference ---------------------------------------------------------------------------------------------

def _config(capacity: int, *policies: LayerPolicy, **fields: Any) -> CacheConfig:
    return CacheConfig(n_layers=len(policies), n_kv_heads=2, head_dim=2, capacity=capacity, layers=list(policies),
                       **fields)


CONFIGS = {
    "flat and a ring kept as a ring": _config(16, LayerPolicy.flat(), LayerPolicy.ring(3), max_write=2),
    "sinks": _config(16, LayerPolicy.ring(4, keep=1)),
    "a chunk layer": _config(16, LayerPolicy.chunked(3), LayerPolicy.flat()),
    "a recording ring": _config(16, LayerPolicy.ring(3), max_write=2, record_past=True),
    "batch rows and MLA": _config(16, LayerPolicy.flat(), batch_size=2, v_head_dim=3),
}


def _fetch(cache: ContiguousReferenceCache, layer: int, first: int, q: int, tag: int) -> list[np.ndarray]:
    """One layer's update_and_fetch of q tokens at `first`: K and V of every row distinct (tagged)."""
    config = cache.config
    assert config.v_head_dim is not None
    k = np.arange(config.batch_size * config.n_kv_heads * q * config.head_dim, dtype=np.float32) \
        .reshape(config.batch_size, config.n_kv_heads, q, config.head_dim) + 1000 * tag
    v = np.arange(config.batch_size * config.n_kv_heads * q * config.v_head_dim, dtype=np.float32) \
        .reshape(config.batch_size, config.n_kv_heads, q, config.v_head_dim) - 1000 * tag
    k_hist, v_hist, spec = cache.update_and_fetch(layer, k, v, np.arange(first, first + q).reshape(-1, 1))
    mask = np.asarray(spec.mask) if spec.mask is not None else np.array([spec.kind.name == "NONE"])
    return [np.asarray(k_hist), np.asarray(v_hist), mask]


def _go_on(cache: ContiguousReferenceCache, tag: int) -> list[Any]:
    """Everything a caller sees past a state: two decodes, every trim's answer, one more decode."""
    seen: list[Any] = []
    for step in range(2):
        start = cache.used(0)
        seen += [_fetch(cache, layer, start, 1, tag + step) for layer in range(cache.config.n_layers)]
    for n in range(cache.used(0) + 1):
        probe = ContiguousReferenceCache(cache.config)
        probe.load_state(cache.state())
        try:
            probe.trim(n)
            seen.append(("served", n, probe.used(0)))
        except KVCacheError as refused:
            seen.append((type(refused).__name__, n))
    start = cache.used(0)
    seen += [_fetch(cache, layer, start, 1, tag + 9) for layer in range(cache.config.n_layers)]
    return seen


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        all(np.array_equal(x, y) for x, y in zip(p, q)) if isinstance(p, list) else p == q for p, q in zip(a, b))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_round_trip_in_memory_and_through_a_file_answers_as_the_original(name: str, tmp_path: Path) -> None:
    """OP-STATE: saved after steps past a ring's window, loaded into a fresh cache (bytes in memory, or a file
    read back) and into a live one that moved on: every later answer, and every trim's, is the original's."""
    config = CONFIGS[name]
    original = ContiguousReferenceCache(config)
    for step, q in enumerate((2, 1, 2, 1)):
        start = original.used(0)
        for layer in range(config.n_layers):
            _fetch(original, layer, start, q, step)
    data = original.state()
    (tmp_path / "state.bin").write_bytes(data)
    fresh, from_file, live = (ContiguousReferenceCache(config) for _ in range(3))
    fresh.load_state(data)
    from_file.load_state((tmp_path / "state.bin").read_bytes())
    _fetch(live, 0, 0, 1, 50)   # a live cache with a step open on layer 0
    live.load_state(data)
    expected = _go_on(original, 100)
    for loaded in (fresh, from_file, live):
        assert loaded.state() == data
        assert _same(_go_on(loaded, 100), expected)


def _held_cache() -> tuple[ContiguousReferenceCache, bytes]:
    cache = ContiguousReferenceCache(CONFIGS["flat and a ring kept as a ring"])
    for first in (0, 2, 4):
        for layer in (0, 1):
            _fetch(cache, layer, first, 2, first)
    return cache, cache.state()


def test_every_truncation_and_every_flipped_byte_is_refused_and_changes_nothing() -> None:
    """OP-STATE: a state cut at any length, or with any one bit of any byte flipped, is refused naming the rule
    and `data`, and the live cache - a step open on one layer - is as it was."""
    cache, data = _held_cache()
    _fetch(cache, 0, 6, 1, 60)   # a step open: a refused load keeps it open
    before = cache._state()
    broken = [data[:cut] for cut in range(len(data))] + \
        [data[:i] + bytes([data[i] ^ (1 << bit)]) + data[i + 1:] for i in range(len(data)) for bit in (0, 7)]
    for state in broken:
        with pytest.raises(ValueError) as refused:
            cache.load_state(state)
        assert isinstance(refused.value, KVCacheError) and (refused.value.rule, refused.value.argument) == \
            ("OP-STATE", "data")
    assert cache._state() == before
    assert [np.asarray(a).tolist() for a in _fetch(cache, 1, 6, 1, 60)[:1]]   # the open step completes


def test_the_refusals_name_what_is_wrong() -> None:
    cache, data = _held_cache()
    other = ContiguousReferenceCache(_config(16, LayerPolicy.flat(), LayerPolicy.ring(4), max_write=2)).state()
    later = _op_state.encode(cache.config, _op_state.decode(cache.config, cache._depth, 2, data), version=3)  # type: ignore[arg-type]
    messages = {}
    for name, state in {"truncated": data[:-5], "flipped": data[:-40] + bytes([data[-40] ^ 4]) + data[-39:],
                        "foreign": other, "version": later, "not a state": b"GGUF" + data[4:],
                        "longer": data + b"\0"}.items():
        with pytest.raises(KVCacheError) as refused:
            cache.load_state(state)
        messages[name] = str(refused.value)
    assert "is truncated" in messages["truncated"] and "checksum" in messages["flipped"]
    assert "another config" in messages["foreign"] and "layers" in messages["foreign"]
    assert "another state format version" in messages["version"] and "version=3" in messages["version"]
    assert "magic" in messages["not a state"] and "past the state's end" in messages["longer"]
    for value in ("state", bytearray(b"x") * 0, None, 1):
        with pytest.raises(KVCacheError) as refused:
            cache.load_state(value)   # type: ignore[arg-type]
        assert refused.value.rule == "OP-STATE"


def test_a_checksummed_state_that_holds_what_the_layout_cannot_is_refused() -> None:
    """A hand-made state with a valid checksum is still checked against its config: a length past the capacity,
    retained marks above the length, fewer rows than the length on a flat layer."""
    cache, data = _held_cache()
    held = _op_state.decode(cache.config, cache._depth, 2, data)
    assert isinstance(held, _op_state.Held)
    for wrong in (_op_state.Held(17, held.retained, held.k, held.v),
                  _op_state.Held(held.length, (held.length + 1,) * 2, held.k, held.v),
                  _op_state.Held(held.length, held.retained, (held.k[0][:, :, :2],) + held.k[1:], held.v)):
        with pytest.raises(KVCacheError, match="OP-STATE"):
            cache.load_state(_op_state.encode(cache.config, wrong))


def test_a_state_saved_mid_step_leaves_the_step_out_and_open() -> None:
    cache, _ = _held_cache()
    _fetch(cache, 0, 6, 1, 60)
    data = cache.state()
    assert cache.used(0) == 7 and cache.used(1) == 6   # still open
    fresh = ContiguousReferenceCache(cache.config)
    fresh.load_state(data)
    assert fresh.used(0) == fresh.used(1) == 6


def test_torch_tensors_round_trip_alike() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra of the test run)")
    config = CONFIGS["flat and a ring kept as a ring"]
    with_numpy, with_torch = ContiguousReferenceCache(config), ContiguousReferenceCache(config)
    for first in (0, 2, 4):
        for layer in (0, 1):
            k = np.full((1, 2, 2, 2), first, np.float32)
            with_numpy.update_and_fetch(layer, k, k, np.array([[first], [first + 1]]))
            with_torch.update_and_fetch(layer, torch.from_numpy(k), torch.from_numpy(k),
                                        torch.tensor([[first], [first + 1]]))
    assert with_numpy.state() == with_torch.state()


# --- the wire -------------------------------------------------------------------------------------------------

def test_a_state_crosses_the_wire_as_standard_base64() -> None:
    _, data = _held_cache()
    text = wire.state_to_wire(data)
    assert isinstance(text, str) and wire.state_from_wire(text, "data") == data
    assert wire.args_to_wire({"data": data}) == {"data": text}
    for bad in (text[:-1], 7, None, text[:-1] + "!", " " + text, "\u00e9"):
        with pytest.raises(wire.WireError):
            wire.state_from_wire(bad, "data")


# --- the suite ------------------------------------------------------------------------------------------------

def test_the_state_feature_is_spec_3_and_op_contiguous_only() -> None:
    assert scopes.version_of("state") == 3 and "state" in scopes.LAYOUT_FEATURES["op-contiguous"]
    assert "state" not in scopes.LAYOUT_FEATURES["op-cell"]


ONE_RING = op_config(8, (3,))
ROUND_TRIP = forward(ONE_RING, 2) + [save(), load(fresh=True)] + forward(ONE_RING, 1) * 2


def test_the_reference_serves_state_programs_in_process_and_over_the_wire() -> None:
    programs = [ROUND_TRIP, forward(ONE_RING, 1) * 3 + [save()] + forward(ONE_RING, 1) + [load(), trim(2)]
                + forward(ONE_RING, 1)] + [forward(ONE_RING, 1) * 2 + [save(), load(form)] + forward(ONE_RING, 1)
                                           for form in ("truncated", "flipped", "foreign-config")]
    isolated = parse_target(REFERENCE, isolate=True)
    try:
        for program in programs:
            assert replay(REFERENCE, ONE_RING, program) is None
            assert replay(isolated, ONE_RING, program) is None
        found = replay(parse_target(STANDINS.format("accepts_corrupted"), isolate=True), ONE_RING, programs[3])
        assert found is not None and (found["class"], found["rule"]) == ("lenient", "OP-STATE")
    finally:
        isolated.close()


def spec_2_loses_a_row(cfg: Any) -> Any:
    """The row-losing stand-in written against spec 2: it names no `state`, so it is sent no state step."""
    return op_state.loses_a_row(cfg)


spec_2_loses_a_row.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
spec_2_loses_a_row.kvcache_scope = ("spec=2",)   # type: ignore[attr-defined]


def test_a_target_without_the_feature_is_judged_as_before() -> None:
    """SCOPE-VERSION: the same program finds the round trip that loses a row when the target declares spec 3,
    and nothing when it declares spec 2 (its state steps are left out)."""
    found = replay(STANDINS.format("loses_a_row"), ONE_RING, ROUND_TRIP)
    assert found is not None and (found["class"], found["rule"]) == ("wrong", "OP-ATTEND")
    assert replay(f"python:{__name__}:spec_2_loses_a_row", ONE_RING, ROUND_TRIP) is None


def test_every_contiguous_config_has_state_programs() -> None:
    from kvcache_spec.conformance.op.persist import state_programs
    for cfg in CONTIGUOUS_CONFIGS:
        names = [name for name, _ in state_programs(cfg)]
        assert {"a state loaded into a fresh cache", "a flipped state refused by the live cache",
                "a foreign-config state refused by a fresh cache"} <= set(names)


def _report(spec: str, profile: str = "quick") -> dict[str, Any]:
    return report_json(run_suite(PythonTarget(spec), profile), True, False)


@pytest.mark.slow   # the reference's quick run, ~30 s (CI's conformance job runs it at pre-merge)
def test_the_reference_is_conforming_strict_with_state_in_scope() -> None:
    report = _report(REFERENCE)
    assert report["verdict"] == CONFORMING and report["coverage"]["complete"], report["semantic"]["findings"][:1]
    assert "OP-STATE" in report["coverage"]["rules"]["exercised"] and "state" in report["scope"]["features"]


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name != "loses_a_row" else name
                                  for name in sorted(FOUND_AS)])
def test_each_state_standin_is_found_with_a_short_program_that_replays(name: str) -> None:
    """OP-STATE: each stand-in is found as FOUND_AS says, with a program of at most 4 steps, replayed the same;
    the reference serves that program with no finding."""
    assert_found_short(STANDINS.format(name), FOUND_AS[name], REFERENCE)


# --- the exhaustive checker ---------------------------------------------------------------------------------


@pytest.mark.slow   # depth-4 runs, as the other checker tests
def test_the_exhaustive_checker_passes_the_reference_and_finds_every_state_standin() -> None:
    """--state: every program to depth 4 on one ring of 2, with saves and loads: the reference passes, each
    stand-in is found as FOUND_AS says within 4 steps."""
    from kvcache_spec.conformance.op import checker as op_checker
    passed = op_checker.check(PythonTarget(REFERENCE), 4, op_checker.STATE_CONFIG)
    assert not passed.findings and passed.states > 100, passed.summary()
    for name, key in FOUND_AS.items():
        found = op_checker.check(PythonTarget(STANDINS.format(name)), 4, op_checker.STATE_CONFIG).findings
        assert key in found and len(found[key][1]) <= 4, (name, {k: len(v[1]) for k, v in found.items()})


class _TrimOnly:
    """A contiguous op cache with trim but no state verbs (what a spec-3 declaration may still come with)."""

    def trim(self, n: int) -> None:
        """Never called: the scope is only probed."""


def trim_only(cfg: Any) -> _TrimOnly:
    return _TrimOnly()


trim_only.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
trim_only.kvcache_scope = ("spec=3",)   # type: ignore[attr-defined]


def test_a_python_cache_without_state_methods_is_not_judged_on_state() -> None:
    """As one without trim is not judged on trim: the scope the run judges by leaves `state` out, saying why."""
    from kvcache_spec.conformance.suite.plan import without_missing_verbs
    target = PythonTarget(f"python:{__name__}:trim_only")
    judged = without_missing_verbs(target, target.scope, CONTIGUOUS_CONFIGS)
    assert "state" in target.scope.features and "state" not in judged.features and "trim" in judged.features
    assert "no state and load_state methods" in judged.source
    reference = PythonTarget(REFERENCE)
    assert "state" in without_missing_verbs(reference, reference.scope, CONTIGUOUS_CONFIGS).features


# --- states meet the batch verbs (found by the deep profile's random programs, where the verbs meet) ------------------

def _one_layer(kind: str, capacity: int, batch: int, **layer: Any) -> dict[str, Any]:
    return {"capacity": capacity, "n_layers": 1, "initial_capacity": 512, "max_write": None, "n_kv_heads": 1,
            "head_dim": 1, "v_head_dim": 1, "batch_size": batch, "sizing": "dynamic",
            "layers": [{"kind": kind, "window": layer.pop("window", 0), "n_kv_heads": 1, "head_dim": 1, **layer}]}


def forward_step(position: int) -> dict[str, Any]:
    return {"op": "fetch", "layer": 0, "positions": [position]}


STATES_MEET_ROWS = {
    # a state holds each row's pads: an extend of padded rows, the row extracted, saved and loaded afresh (the
    # reference's format 1 lost the pads: the loaded row's query attended its pad)
    "pads of an extended row": (_one_layer("ring", 2, 1, window=5, keep=4),
                                [forward_step(0), {"op": "extend", "batch": 1, "pads": [1]}, {"op": "extract", "row": 1},
                                 save(), load(fresh=True), forward_step(1)]),
    # a state holds what each row holds after a reorder (the model once restored the tokens, not the rows' labels)
    "rows reordered before the save": (_one_layer("flat", 2, 2), [forward_step(0), {"op": "reorder", "rows": [0, 0]},
                                                                 save(), load(fresh=True), forward_step(1)]),
    "rows reordered after the save": (_one_layer("flat", 2, 1), [{"op": "repeat", "times": 2}, forward_step(0), save(),
                                                                {"op": "reorder", "rows": [0, 0]}, load(),
                                                                forward_step(1)]),
    # a fresh cache is made with the batch size the live cache has now: a state of two rows loads into it ...
    "a state of a repeated batch loaded afresh": (_one_layer("flat", 1, 1), [{"op": "repeat", "times": 2}, save(),
                                                                            load(fresh=True)]),
    # ... and one of another batch size is another config's, refused
    "a state of two rows loaded into a cache of one": (_one_layer("flat", 1, 2), [save(), {"op": "select", "rows": [0]},
                                                                                 load(fresh=True)]),
    # a swap brings back the cache of another capacity a refused extend was built with: a fresh cache is of its config
    "a state of the other capacity's cache loaded afresh": (_one_layer("flat", 1, 1), [
        {"op": "extend", "batch": 1, "form": "foreign-config"}, {"op": "swap"}, save(), load(fresh=True)]),
}


@pytest.mark.parametrize("name", sorted(STATES_MEET_ROWS))
def test_a_state_meets_the_batch_verbs(name: str) -> None:
    """OP-STATE with OP-PAD and OP-ROWS: the reference serves each program as the model does (no finding)."""
    cfg, program = STATES_MEET_ROWS[name]
    assert replay(REFERENCE, cfg, program) is None


def test_a_padded_caches_state_keeps_its_pads() -> None:
    """OP-STATE, OP-PAD: the pads are the state's - a fresh cache loaded with a padded cache's state masks alike."""
    config = CacheConfig(n_layers=1, n_kv_heads=1, head_dim=1, capacity=4, batch_size=2)
    saved, fresh = ContiguousReferenceCache(config), ContiguousReferenceCache(config)
    saved.pad([1, 0])
    k = np.zeros((2, 1, 2, 1), np.float32)
    saved.update_and_fetch(0, k, k, np.array([[0], [1]]))
    fresh.load_state(saved.state())
    assert fresh.pads() == (1, 0)
    answers = [c.update_and_fetch(0, k[:, :, :1], k[:, :, :1], np.array([[2]]))[2].mask.tolist()
               for c in (saved, fresh)]
    assert answers[0] == answers[1]
