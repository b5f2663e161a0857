"""The drop-in module `kvcache.reference_cache` (docs/dropin.md), with or without torch: upstream's names, the
spec types in use (upstream's when executorch imports, else the project's), `flatten_step`, one mask object
per window in a cell step, and the exceptions' classes - OP-CAP and the forward protocol's state are also
RuntimeError (upstream's convention), malformed arguments ValueError or TypeError, all typed with rule ids.
The peer suite's bookkeeping (tests/upstream_peer.py) is checked here too: it must catch every surprise."""

from __future__ import annotations

import numpy as np
import pytest

import kvcache.op as op
import kvcache.reference_cache as dropin
from kvcache import CapacityError, ForwardError, KVCacheError

from .upstream_peer import PeerRun, deliberate_differences

UPSTREAM_NAMES = ("attend", "AttendSpec", "CacheConfig", "CacheSizing", "CellReferenceCache",
                  "ContiguousReferenceCache", "flatten_step", "LayerKind", "LayerPolicy", "MaskKind", "MAX_SEQS")


def test_the_module_has_upstreams_names_and_the_projects_caches() -> None:
    assert all(hasattr(dropin, name) for name in UPSTREAM_NAMES)
    assert issubclass(dropin.ContiguousReferenceCache, op.ContiguousReferenceCache)
    assert issubclass(dropin.CellReferenceCache, op.CellReferenceCache)
    assert dropin.CacheConfig is op.CacheConfig and dropin.LayerPolicy is op.LayerPolicy
    assert dropin.MAX_SEQS == op.MAX_SEQS == 63
    if not dropin.USING_UPSTREAM_TYPES:
        assert dropin.AttendSpec is op.AttendSpec and dropin.MaskKind is op.MaskKind
    else:
        from executorch.extension.llm.cache import reference_cache as upstream
        assert dropin.AttendSpec is upstream.AttendSpec and dropin.MaskKind is upstream.MaskKind


def _cell(n_layers: int = 3, windows: tuple[int, ...] = (0, 2, 2), capacity: int = 8) -> dropin.CellReferenceCache:
    layers = tuple(op.LayerPolicy.ring(w) if w else op.LayerPolicy.flat() for w in windows)
    return dropin.CellReferenceCache(op.CacheConfig(n_layers, 1, 2, capacity, layers=layers))


def _kv(q_len: int) -> np.ndarray:
    return np.random.default_rng(q_len).random((1, 1, q_len, 2)).astype(np.float32)


def test_cell_layers_sharing_a_window_share_one_mask_while_it_holds_the_decided_values() -> None:
    cache = _cell()
    cache.begin_step([0, 0, 0])
    where = np.array([[0], [1], [2]])
    flat, first, second = (cache.update_and_fetch(layer, _kv(3), _kv(3), where)[2] for layer in range(3))
    assert first.mask is second.mask and flat.mask is not first.mask
    assert first.kind is dropin.MaskKind.EXPLICIT
    assert np.array_equal(op.attend(np.ones((1, 1, 3, 2), np.float32), _kv(3), _kv(3),
                                    op.AttendSpec(op.MaskKind.EXPLICIT, np.asarray(first.mask))),
                          dropin.attend(np.ones((1, 1, 3, 2), np.float32), _kv(3), _kv(3), first))
    cache.begin_step([0])
    layer0 = cache.update_and_fetch(0, _kv(1), _kv(1), np.array([[3]]))[2]
    layer1 = cache.update_and_fetch(1, _kv(1), _kv(1), np.array([[3]]))[2]
    np.asarray(layer1.mask)[0, 0] = True   # the caller changes the shared object in place ...
    layer2 = cache.update_and_fetch(2, _kv(1), _kv(1), np.array([[3]]))[2]
    assert layer2.mask is not layer1.mask   # ... so the next layer gets its own, with the decided values
    assert np.asarray(layer2.mask).tolist() == [[False, False, True, True]]
    assert layer0.mask is not layer1.mask and layer1.mask is not first.mask   # a new step shares nothing old


def test_flatten_step_lays_out_a_step_of_several_sequences() -> None:
    tokens, positions, seq_ids, last = dropin.flatten_step({3: (np.zeros((1, 2, 4)), 5), 0: (np.ones((1, 1, 4)), 0)})
    assert tokens.shape == (1, 3, 4) and tokens[0, 2, 0] == 1
    assert positions.tolist() == [[5], [6], [0]] and positions.dtype == np.int64
    assert seq_ids == [3, 3, 0] and last.tolist() == [1, 2]


@pytest.mark.parametrize("sequences, rule, kind", [
    ({}, "OP-STEP", ValueError),
    ([(np.zeros((1, 1)), 0)], "OP-STEP", TypeError),
    ({63: (np.zeros((1, 1)), 0)}, "OP-STEP", ValueError),
    ({True: (np.zeros((1, 1)), 0)}, "OP-STEP", TypeError),
    ({0: (np.zeros((1, 1)), 2**31 - 2), 1: (np.zeros((1, 1)), 2**31 - 3)}, None, None),
    ({0: (np.zeros((1, 2)), 2**31 - 2)}, "OP-POS", ValueError),
    ({0: (np.zeros((1, 1)), 0.0)}, "OP-POS", TypeError),
    ({0: (np.zeros((1, 0)), 0)}, "OP-ARGS", ValueError),
    ({0: ([[1]], 0)}, "OP-ARGS", TypeError),
    ({0: (np.zeros((1, 1)), -1)}, "OP-POS", ValueError),
    ({0: (np.zeros((1, 1)), 0), 1: (np.zeros((1, 1), np.int64), 0)}, "OP-ARGS", ValueError),
])
def test_flatten_step_refuses_a_malformed_step_with_its_rule(sequences: object, rule: str, kind: type) -> None:
    if rule is None:   # the edge that is still well-formed
        assert dropin.flatten_step(sequences)[1].tolist() == [[2**31 - 2], [2**31 - 3]]   # type: ignore[arg-type]
        return
    with pytest.raises(kind) as refused:
        dropin.flatten_step(sequences)   # type: ignore[arg-type]
    assert isinstance(refused.value, KVCacheError) and refused.value.rule == rule


def test_state_refusals_are_also_runtime_errors_and_malformed_calls_are_not() -> None:
    cache = _cell(n_layers=2, windows=(0, 0), capacity=2)
    with pytest.raises(CapacityError) as full:   # admission: more tokens than free cells
        cache.begin_step([0, 0, 0])
    assert isinstance(full.value, RuntimeError) and isinstance(full.value, ValueError) and full.value.rule == "OP-CAP"
    with pytest.raises(ForwardError) as undeclared:   # protocol state: no step declared
        cache.update_and_fetch(0, _kv(1), _kv(1), np.array([[0]]))
    assert isinstance(undeclared.value, RuntimeError) and undeclared.value.rule == "OP-STEP"
    cache.begin_step([0])
    cache.update_and_fetch(0, _kv(1), _kv(1), np.array([[0]]))
    with pytest.raises(RuntimeError) as twice:   # protocol state: a layer served twice in one step
        cache.update_and_fetch(0, _kv(1), _kv(1), np.array([[0]]))
    assert isinstance(twice.value, ForwardError) and twice.value.rule == "OP-STEP"
    with pytest.raises(ValueError) as malformed:   # a malformed argument is not a RuntimeError
        cache.update_and_fetch(1, _kv(1), _kv(1), np.array([[0], [1]]))
    assert isinstance(malformed.value, KVCacheError) and not isinstance(malformed.value, RuntimeError)
    assert malformed.value.rule == "OP-ARGS"
    contiguous = dropin.ContiguousReferenceCache(op.CacheConfig(1, 1, 2, 2))
    with pytest.raises(CapacityError) as overflow:   # capacity: held + q_len > capacity
        contiguous.update_and_fetch(0, _kv(3), _kv(3), np.array([[0], [1], [2]]))
    assert isinstance(overflow.value, RuntimeError) and overflow.value.rule == "OP-CAP"


def test_the_peer_runner_reports_every_way_the_named_list_can_be_untrue() -> None:
    named = deliberate_differences()
    assert named and all(rule.startswith("OP-") for rule in named.values())
    as_documented = PeerRun({**{name: "AssertionError: x" for name in named}, "A.test_ok": "pass"}, 1.0, 1.0)
    assert as_documented.surprises(named) == []
    first = sorted(named)[0]
    unnamed_failure = PeerRun({**as_documented.outcomes, "A.test_ok": "ValueError: y"}, 1.0, 1.0)
    named_pass = PeerRun({**as_documented.outcomes, first: "pass"}, 1.0, 1.0)
    named_missing = PeerRun({k: v for k, v in as_documented.outcomes.items() if k != first}, 1.0, 1.0)
    skipped = PeerRun({**as_documented.outcomes, "A.test_ok": "skipped: no torch"}, 1.0, 1.0)
    for run in (unnamed_failure, named_pass, named_missing, skipped):
        assert len(run.surprises(named)) == 1, run


@pytest.mark.slow   # about 4 s of CPU each; CI runs it in the slow stage (numpy) and the upstream stage (torch)
@pytest.mark.parametrize("name", ["cell", "contiguous"])
def test_the_dropin_is_conforming_strict_as_it_answers_in_upstreams_types(name: str) -> None:
    """The wrapping (upstream's spec class, one mask per window) keeps every rule of the op face: the drop-in
    passes the whole op-face suite, strict, with torch tensors and upstream's AttendSpec where executorch is
    installed, with numpy and the project's spec where it is not."""
    from kvcache_spec.conformance.suite import CONFORMING, report_json, run_suite
    from kvcache_spec.conformance.targets import PythonTarget

    report = report_json(run_suite(PythonTarget(f"python:tests.dropin_targets:{name}"), "quick"), True, False)
    assert report["verdict"] == CONFORMING, report["semantic"]["findings"][:1]
    assert not report["coverage"]["incomplete"]


@pytest.mark.parametrize("fields", [{"kind": "causal"}, {"kind": "NONE"}, {"kind": None}])
def test_attend_refuses_a_spec_that_means_nothing_with_the_typed_error(fields: dict[str, object]) -> None:
    """Upstream's AttendSpec checks nothing on creation; read by the drop-in's attend, it is validated as the
    project's spec is (OP-MASK)."""
    q = np.ones((1, 1, 2, 2), np.float32)
    with pytest.raises(KVCacheError) as refused:
        dropin.attend(q, _kv(2), _kv(2), dropin.AttendSpec(**fields))
    assert refused.value.rule == "OP-MASK"


def test_attend_reads_a_spec_by_its_meaning() -> None:
    q, k, v = np.ones((1, 2, 2, 2), np.float32), _kv(2), _kv(2) + 1
    band = np.array([[True, False], [True, True]])
    ours = dropin.attend(q, k, v, dropin.AttendSpec(kind=dropin.MaskKind.EXPLICIT, mask=band))
    assert np.array_equal(ours, op.attend(q, k, v, op.AttendSpec(op.MaskKind.CAUSAL)))
    assert np.array_equal(dropin.attend(q, k, v, dropin.AttendSpec(kind=dropin.MaskKind.CAUSAL)), ours)
    assert np.array_equal(dropin.attend(q, k, v, op.AttendSpec(op.MaskKind.NONE)),
                          op.attend(q, k, v, op.AttendSpec(op.MaskKind.NONE)))
