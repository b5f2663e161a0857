"""Bad input to the op face (`kvcache.op`): every argument, each refused with a typed error naming the argument
and the rule, the cache left exactly as it was (OP-ATOMIC: a full snapshot, bytes included, before and
after), under `python -O` too."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Callable

import numpy as np
import pytest

from kvcache import KVCacheError
from kvcache.op import AttendSpec, CacheConfig, CacheSizing, CellReferenceCache, ContiguousReferenceCache, \
    LayerKind, LayerPolicy, MaskKind, attend

B, H, D, DV = 2, 2, 3, 2


def kv(q_len: int, *, b: int = B, h: int = H, d: int = D, dv: int = DV, dtype: Any = np.float32) -> tuple[Any, Any]:
    return np.ones((b, h, q_len, d), dtype=dtype), np.ones((b, h, q_len, dv), dtype=dtype)


def col(*positions: int) -> np.ndarray:
    return np.array(positions, dtype=np.int64).reshape(-1, 1)


def contiguous() -> ContiguousReferenceCache:
    """Two layers (flat, ring(2)), B = 2; one full step of 2 tokens, then a step open on layer 0 (position 2)."""
    cache = ContiguousReferenceCache(CacheConfig(n_layers=2, n_kv_heads=H, head_dim=D, capacity=6, batch_size=B,
                                                 layers=(LayerPolicy.flat(), LayerPolicy.ring(2)), v_head_dim=DV))
    for layer in (0, 1):
        cache.update_and_fetch(layer, *kv(2), col(0, 1))
    cache.update_and_fetch(0, *kv(1), col(2))
    return cache


CONTIGUOUS_FETCH: list[tuple[str, tuple[Any, ...], type, str, str]] = [
    # (case, (layer_id, k, v, position), error type, rule, argument)
    ("bool layer", (True, *kv(1), col(2)), TypeError, "OP-ARGS", "layer_id"),
    ("float layer", (1.0, *kv(1), col(2)), TypeError, "OP-ARGS", "layer_id"),
    ("negative layer", (-1, *kv(1), col(2)), IndexError, "OP-ARGS", "layer_id"),
    ("huge layer", (2**64, *kv(1), col(2)), IndexError, "OP-ARGS", "layer_id"),
    ("k a list", (1, [[[[1.0] * D]] * H] * B, kv(1)[1], col(2)), TypeError, "OP-ARGS", "k"),
    ("k of ints", (1, *kv(1, dtype=np.int32), col(2)), TypeError, "OP-ARGS", "k"),
    ("k 3-D", (1, np.ones((H, 1, D), np.float32), kv(1)[1], col(2)), ValueError, "OP-ARGS", "k"),
    ("k wrong batch", (1, *kv(1, b=1), col(2)), ValueError, "OP-ARGS", "k"),
    ("k wrong heads", (1, *kv(1, h=1), col(2)), ValueError, "OP-ARGS", "k"),
    ("k wrong head_dim", (1, *kv(1, d=4), col(2)), ValueError, "OP-ARGS", "k"),
    ("k no token", (1, *kv(0), np.zeros((0, 1), np.int64)), ValueError, "OP-ARGS", "k"),
    ("Dv mismatch", (1, kv(1)[0], kv(1, dv=DV + 1)[1], col(2)), ValueError, "OP-ARGS", "v"),
    ("v other q_len", (1, kv(1)[0], kv(2)[1], col(2)), ValueError, "OP-ARGS", "v"),
    ("position of floats", (1, *kv(1), np.array([[2.0]])), TypeError, "OP-ARGS", "position"),
    ("position a list", (1, *kv(1), [[2]]), TypeError, "OP-ARGS", "position"),
    ("position 1-D", (1, *kv(1), np.array([2])), ValueError, "OP-ARGS", "position"),
    ("position 2 dims", (1, *kv(1), np.array([[2, 0]])), ValueError, "OP-ARGS", "position"),
    ("position other q_len", (1, *kv(1), col(2, 3)), ValueError, "OP-ARGS", "position"),
    ("negative position", (1, *kv(1), col(-1)), ValueError, "OP-POS", "position[0]"),
    ("position 2**31 - 1", (1, *kv(1), col(2**31 - 1)), ValueError, "OP-POS", "position[0]"),
    ("huge position", (1, *kv(1), col(2**62)), ValueError, "OP-POS", "position[0]"),
    ("layer 1 off its step", (1, *kv(1), col(3)), ValueError, "OP-STEP", "position"),
    ("layer 1 step of 2", (1, *kv(2), col(2, 3)), ValueError, "OP-STEP", "position"),
    ("re-placed position", (0, *kv(1), col(1)), ValueError, "OP-POS", "position"),
    ("gap", (0, *kv(1), col(3)), ValueError, "OP-POS", "position"),
    ("not consecutive", (0, *kv(2), col(2, 4)), ValueError, "OP-POS", "position"),
    ("over capacity", (0, *kv(5), col(2, 3, 4, 5, 6)), ValueError, "OP-CAP", "k"),
]


def refused(call: Callable[[], Any], snapshot: Callable[[], Any], error: type, rule: str, argument: str) -> None:
    """OP-ATOMIC: the call raises a typed error (a ValueError or TypeError) naming the rule and the argument,
    and changes nothing."""
    before = snapshot()
    with pytest.raises(error) as raised:
        call()
    assert isinstance(raised.value, KVCacheError) and isinstance(raised.value, (ValueError, TypeError))
    assert (raised.value.rule, raised.value.argument) == (rule, argument), str(raised.value)
    assert snapshot() == before


@pytest.mark.parametrize("case, args, error, rule, argument", CONTIGUOUS_FETCH, ids=[c[0] for c in CONTIGUOUS_FETCH])
def test_contiguous_update_and_fetch_refuses(case: str, args: tuple[Any, ...], error: type, rule: str,
                                             argument: str) -> None:
    cache = contiguous()
    refused(lambda: cache.update_and_fetch(*args), cache._state, error, rule, argument)
    cache.update_and_fetch(1, *kv(1), col(2))   # the open step still completes as it was
    assert (cache.used(0), cache.used(1)) == (3, 3)


def test_contiguous_used_refuses_bad_layers() -> None:
    cache = contiguous()
    for layer, error in ((True, TypeError), (-1, IndexError), (2, IndexError), ("0", TypeError)):
        refused(lambda: cache.used(layer), cache._state, error, "OP-ARGS", "layer_id")


def test_a_step_longer_than_max_write_is_refused_on_kept_rings() -> None:
    cache = ContiguousReferenceCache(CacheConfig(n_layers=1, n_kv_heads=1, head_dim=1, capacity=9,
                                                 layers=(LayerPolicy.ring(2),), max_write=2))
    k, v = np.ones((1, 1, 3, 1), np.float32), np.ones((1, 1, 3, 1), np.float32)
    refused(lambda: cache.update_and_fetch(0, k, v, col(0, 1, 2)), cache._state, ValueError, "OP-MAX-WRITE", "k")


# --- the cell cache ----------------------------------------------------------------------------------------

def cells() -> CellReferenceCache:
    """Two layers (flat, ring(2)), capacity 6: a full step [0, 0, 1] at [0, 1, 0]; then [1] at 1 open on layer 0."""
    cache = CellReferenceCache(CacheConfig(n_layers=2, n_kv_heads=H, head_dim=D, capacity=6,
                                           layers=(LayerPolicy.flat(), LayerPolicy.ring(2)), v_head_dim=DV))
    cache.begin_step([0, 0, 1])
    for layer in (0, 1):
        cache.update_and_fetch(layer, *kv(3, b=1), col(0, 1, 0))
    cache.begin_step([1])
    cache.update_and_fetch(0, *kv(1, b=1), col(1))
    return cache


def one(q_len: int = 1, **shape: int) -> tuple[Any, Any]:
    return kv(q_len, **({"b": 1} | shape))


CELL_CALLS: list[tuple[str, Callable[[CellReferenceCache], Any], type, str, str]] = [
    ("bool layer", lambda c: c.update_and_fetch(False, *one(), col(1)), TypeError, "OP-ARGS", "layer_id"),
    ("layer out of range", lambda c: c.update_and_fetch(2, *one(), col(1)), IndexError, "OP-ARGS", "layer_id"),
    ("batch 2", lambda c: c.update_and_fetch(1, *kv(1), col(1)), ValueError, "OP-ARGS", "k"),
    ("Dv mismatch", lambda c: c.update_and_fetch(1, one()[0], one(dv=1)[1], col(1)), ValueError, "OP-ARGS", "v"),
    ("negative position", lambda c: c.update_and_fetch(1, *one(), col(-1)), ValueError, "OP-POS", "position[0]"),
    ("huge position", lambda c: c.update_and_fetch(1, *one(), col(2**31)), ValueError, "OP-POS", "position[0]"),
    ("layer served twice", lambda c: c.update_and_fetch(0, *one(), col(1)), ValueError, "OP-STEP", "layer_id"),
    ("other positions", lambda c: c.update_and_fetch(1, *one(), col(2)), ValueError, "OP-STEP", "position"),
    ("other q_len", lambda c: c.update_and_fetch(1, *one(2), col(1, 2)), ValueError, "OP-STEP", "position"),
    ("empty step", lambda c: c.begin_step([]), ValueError, "OP-STEP", "seq_ids"),
    ("seq_ids a string", lambda c: c.begin_step("01"), TypeError, "OP-STEP", "seq_ids"),
    ("seq_ids an array", lambda c: c.begin_step(np.array([0])), TypeError, "OP-STEP", "seq_ids"),
    ("bool seq id", lambda c: c.begin_step([0, True]), TypeError, "OP-STEP", "seq_ids[1]"),
    ("seq id 63", lambda c: c.begin_step([63]), ValueError, "OP-STEP", "seq_ids[0]"),
    ("negative seq id", lambda c: c.begin_step([-1]), ValueError, "OP-STEP", "seq_ids[0]"),
    ("more tokens than cells", lambda c: c.begin_step([2] * 7), ValueError, "OP-CAP", "seq_ids"),
    ("fork onto itself", lambda c: c.seq_cp(0, 0), ValueError, "OP-FORK", "dst_id"),
    ("fork onto a live dst", lambda c: c.seq_cp(0, 1), ValueError, "OP-FORK", "dst_id"),
    ("fork from a bool", lambda c: c.seq_cp(True, 5), TypeError, "OP-FORK", "src_id"),
    ("fork onto 63", lambda c: c.seq_cp(0, 63), ValueError, "OP-FORK", "dst_id"),
    ("fork negative upto", lambda c: c.seq_cp(0, 5, -1), ValueError, "OP-FORK", "upto"),
    ("fork bool upto", lambda c: c.seq_cp(0, 5, True), TypeError, "OP-FORK", "upto"),
    ("rm id 63", lambda c: c.seq_rm(63), ValueError, "OP-RM", "seq_id"),
    ("rm negative p0", lambda c: c.seq_rm(0, -1), ValueError, "OP-RM", "p0"),
    ("rm p1 < p0", lambda c: c.seq_rm(0, 3, 2), ValueError, "OP-RM", "p1"),
    ("rm bool p0", lambda c: c.seq_rm(0, True), TypeError, "OP-RM", "p0"),
    ("rm huge p1", lambda c: c.seq_rm(0, 0, 2**31), ValueError, "OP-RM", "p1"),
    ("seq_len 63", lambda c: c.seq_len(63), ValueError, "OP-ARGS", "seq_id"),
    ("seq_len bool", lambda c: c.seq_len(True), TypeError, "OP-ARGS", "seq_id"),
    ("can_extend negative", lambda c: c.can_extend(-1), ValueError, "OP-ARGS", "n"),
    ("can_extend bool", lambda c: c.can_extend(True), TypeError, "OP-ARGS", "n"),
]


@pytest.mark.parametrize("case, call, error, rule, argument", CELL_CALLS, ids=[c[0] for c in CELL_CALLS])
def test_cell_cache_refuses(case: str, call: Callable[[CellReferenceCache], Any], error: type, rule: str,
                            argument: str) -> None:
    cache = cells()
    refused(lambda: call(cache), cache._state, error, rule, argument)
    cache.update_and_fetch(1, *one(), col(1))   # the open step still completes as it was
    assert (cache.seq_len(0), cache.seq_len(1), cache.free_cells()) == (2, 2, 2)


@pytest.mark.parametrize("seq_ids, positions, argument", [
    ([0, 1], [1, 5], "position[0]"),       # 0 holds position 1 already: re-placed
    ([0, 1], [0, 5], "position[0]"),       # older than 0's newest
    ([5, 5], [4, 4], "position[1]"),       # one sequence's positions must increase within the step
    ([5, 5], [4, 3], "position[1]"),
])
def test_cell_positions_must_be_newer(seq_ids: list[int], positions: list[int], argument: str) -> None:
    """OP-POS: a re-placed or older position would give a query two tokens at one position."""
    cache = cells()
    cache.update_and_fetch(1, *one(), col(1))
    cache.begin_step(seq_ids)
    refused(lambda: cache.update_and_fetch(0, *one(2), col(*positions)), cache._state, ValueError, "OP-POS",
            argument)


def test_no_step_declared() -> None:
    cache = cells()
    cache.update_and_fetch(1, *one(), col(1))
    refused(lambda: cache.update_and_fetch(0, *one(), col(2)), cache._state, ValueError, "OP-STEP", "update_and_fetch")


# --- configs and specs -----------------------------------------------------------------------------------

GOOD: dict[str, Any] = dict(n_layers=2, n_kv_heads=1, head_dim=2, capacity=4)


@pytest.mark.parametrize("field, value, error", [
    ("n_layers", 0, ValueError), ("n_layers", True, TypeError), ("n_kv_heads", 0, ValueError),
    ("head_dim", -1, ValueError), ("capacity", 0, ValueError), ("capacity", 2**31, ValueError),
    ("capacity", 4.0, TypeError), ("batch_size", 0, ValueError), ("v_head_dim", 0, ValueError),
    ("v_head_dim", False, TypeError), ("max_write", 0, ValueError), ("max_write", True, TypeError),
    ("sizing", "static", TypeError), ("dtype", np.int32, ValueError), ("dtype", None, ValueError),
    ("dtype", "float8", ValueError), ("layers", (LayerPolicy.flat(),) * 3, ValueError), ("layers", (), ValueError),
    ("layers", LayerPolicy.flat(), TypeError), ("layers", ("flat",), TypeError),
])
def test_config_refuses(field: str, value: Any, error: type) -> None:
    with pytest.raises(error) as raised:
        CacheConfig(**(GOOD | {field: value}))
    assert isinstance(raised.value, KVCacheError) and raised.value.rule == "OP-CONFIG"
    assert raised.value.argument.startswith("CacheConfig." + field), raised.value.argument


def test_policies_specs_and_caches_refuse() -> None:
    for make in (lambda: LayerPolicy.ring(0), lambda: LayerPolicy(LayerKind.FLAT, 1), lambda: LayerPolicy.ring(True),
                 lambda: LayerPolicy("ring", 2)):  # type: ignore[arg-type]
        with pytest.raises((ValueError, TypeError), match="OP-CONFIG"):
            make()
    for kind, mask in ((MaskKind.EXPLICIT, None), (MaskKind.NONE, np.ones((1, 1), bool)),
                       (MaskKind.EXPLICIT, np.ones((1, 1), np.int8)), (MaskKind.EXPLICIT, np.ones(3, bool)),
                       (MaskKind.EXPLICIT, [[True]]), ("none", None)):
        with pytest.raises((ValueError, TypeError), match="OP-MASK"):
            AttendSpec(kind, mask)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="OP-BATCH"):
        CellReferenceCache(CacheConfig(**(GOOD | {"batch_size": 2})))
    for cache_type in (ContiguousReferenceCache, CellReferenceCache):
        with pytest.raises(TypeError, match="OP-CONFIG"):
            cache_type("config")  # type: ignore[arg-type]


def test_a_cache_keeps_its_own_config() -> None:
    """OP-CONFIG: a config tampered with after the cache was built cannot reach the cache."""
    config = CacheConfig(**GOOD, sizing=CacheSizing.STATIC)
    cache = ContiguousReferenceCache(config)
    object.__setattr__(config, "capacity", 100)
    k = np.ones((1, 1, 5, 2), np.float32)
    with pytest.raises(ValueError, match="OP-CAP"):
        cache.update_and_fetch(0, k, k, col(0, 1, 2, 3, 4))


# --- python -O ----------------------------------------------------------------------------------------------

OPTIMIZED_PROBE = """
import numpy as np
from kvcache import KVCacheError
from kvcache.op import CacheConfig, CellReferenceCache, ContiguousReferenceCache, AttendSpec, MaskKind, attend
assert not __debug__
c = ContiguousReferenceCache(CacheConfig(n_layers=1, n_kv_heads=1, head_dim=1, capacity=4))
k = np.ones((1, 1, 1, 1), np.float32)
cells = CellReferenceCache(CacheConfig(n_layers=1, n_kv_heads=1, head_dim=1, capacity=4))
cells.begin_step([0])
cells.update_and_fetch(0, k, k, np.array([[0]]))
calls = [lambda: c.update_and_fetch(True, k, k, np.array([[0]])),
         lambda: c.update_and_fetch(0, k, k, np.array([[1]])),
         lambda: c.update_and_fetch(0, k, k, np.array([[-1]])),
         lambda: cells.seq_cp(0, 0),
         lambda: cells.begin_step([63]),
         lambda: cells.update_and_fetch(0, k, k, np.array([[1]])),
         lambda: attend(k, np.ones((1, 1, 2, 1), np.float32), np.ones((1, 1, 2, 1), np.float32),
                        AttendSpec(MaskKind.CAUSAL))]
for call in calls:
    try:
        call()
    except KVCacheError as error:
        print(error.rule)
    else:
        print("accepted")
"""


def test_input_validation_stays_under_python_O() -> None:
    """The README's promise: preconditions (input validation) stay enabled under -O."""
    result = subprocess.run([sys.executable, "-O", "-c", OPTIMIZED_PROBE], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["OP-ARGS", "OP-POS", "OP-POS", "OP-FORK", "OP-STEP", "OP-STEP", "OP-MASK"]


def test_answers_and_specs_cannot_reach_the_cache() -> None:
    """OP-ATOMIC: the histories and masks returned are the caller's copies; a spec tampered with after it was
    made is judged as it is then (OP-MASK)."""
    cache = ContiguousReferenceCache(CacheConfig(n_layers=1, n_kv_heads=1, head_dim=1, capacity=4,
                                                 layers=(LayerPolicy.ring(1),)))
    k = np.full((1, 1, 2, 1), 7, np.float32)
    k_hist, v_hist, spec = cache.update_and_fetch(0, k, k, col(0, 1))
    before = cache._state()
    k_hist[...] = 0
    v_hist[...] = 0
    spec.mask[...] = True
    assert cache._state() == before
    object.__setattr__(spec, "mask", "everything")
    with pytest.raises(TypeError, match="OP-MASK"):
        attend(np.ones((1, 1, 2, 1), np.float32), k_hist, v_hist, spec)
    object.__setattr__(spec, "kind", "causal")
    with pytest.raises(TypeError, match="OP-MASK"):
        attend(np.ones((1, 1, 2, 1), np.float32), k_hist, v_hist, spec)


def test_attributes_cannot_be_deleted() -> None:
    """OP-ATOMIC: deleting an attribute would break the invariants behind the API's back."""
    for cache in (contiguous(), cells()):
        before = cache._state()
        with pytest.raises(AttributeError):
            del cache._pools
        assert cache._state() == before
