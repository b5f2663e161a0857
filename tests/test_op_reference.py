"""The op face of the reference (`kvcache.op`): which token a query attends, with which K and V, read off
labelled K/V exactly; every expectation is computed here by brute force (not by `kvcache` nor the model).

Labelled K/V: every element written for (token uid, layer, batch row, head, dim) of K or V is a float32
integer that identifies all six, so a history row says which token, layer, row, head and dim it came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcache import KVCacheError
from kvcache_spec import op_model
from kvcache.op import AttendSpec, CacheConfig, CacheSizing, CellReferenceCache, ContiguousReferenceCache, \
    LayerPolicy, MaskKind, attend

MAX_UID, MAX_LAYERS, MAX_B, MAX_H, MAX_D = 4096, 4, 2, 2, 4


def label(uid: int, layer: int, b: int, h: int, d: int, is_v: int) -> float:
    """The exact float32 integer of one element (< 2**24, so exactly representable)."""
    value = ((((uid * MAX_LAYERS + layer) * MAX_B + b) * MAX_H + h) * MAX_D + d) * 2 + is_v + 1
    assert value < 2**24
    return float(value)


def unlabel(value: float) -> tuple[int, int, int, int, int, int]:
    n = int(value)
    assert n == value and n >= 1, value
    n -= 1
    is_v, n = n % 2, n // 2
    d, n = n % MAX_D, n // MAX_D
    h, n = n % MAX_H, n // MAX_H
    b, n = n % MAX_B, n // MAX_B
    layer, uid = n % MAX_LAYERS, n // MAX_LAYERS
    return uid, layer, b, h, d, is_v


def labelled(uids: list[int], layer: int, B: int, H: int, D: int, Dv: int) -> tuple[np.ndarray, np.ndarray]:
    k = np.array([[[[label(u, layer, b, h, d, 0) for d in range(D)] for u in uids] for h in range(H)]
                  for b in range(B)], dtype=np.float32)
    v = np.array([[[[label(u, layer, b, h, d, 1) for d in range(Dv)] for u in uids] for h in range(H)]
                  for b in range(B)], dtype=np.float32)
    return k, v


def column(positions: list[int]) -> np.ndarray:
    return np.array(positions, dtype=np.int64).reshape(-1, 1)


def expand(spec: AttendSpec, q_len: int, rows: int) -> np.ndarray:
    """The mask a spec means, by OP-MASK's words (written here, not taken from kvcache)."""
    if spec.kind is MaskKind.NONE:
        return np.ones((q_len, rows), dtype=bool)
    if spec.kind is MaskKind.CAUSAL:
        assert q_len == rows, "CAUSAL is only meaningful for a square step"
        return np.array([[j <= i for j in range(rows)] for i in range(q_len)])
    mask = np.asarray(spec.mask)
    assert mask.dtype == bool and mask.shape == (q_len, rows)
    return mask


def attended_uids(k_hist: Any, v_hist: Any, spec: AttendSpec, layer: int, B: int, H: int, D: int,
                  Dv: int) -> list[list[list[int]]]:
    """For every batch row and query: the uids of the rows it attends, each row checked element by element
    to be that token's K (and V) of this layer, batch row, head and dim."""
    k_hist, v_hist = np.asarray(k_hist), np.asarray(v_hist)
    rows = k_hist.shape[2]
    assert k_hist.shape == (B, H, rows, D) and v_hist.shape == (B, H, rows, Dv)
    mask = expand(spec, mask_rows(spec, rows), rows)
    result = []
    for b in range(B):
        per_query = []
        for i in range(mask.shape[0]):
            uids = []
            for j in np.flatnonzero(mask[i]):
                uid = unlabel(k_hist[b, 0, j, 0])[0]
                for h in range(H):
                    for d in range(D):
                        assert unlabel(k_hist[b, h, j, d]) == (uid, layer, b, h, d, 0)
                    for d in range(Dv):
                        assert unlabel(v_hist[b, h, j, d]) == (uid, layer, b, h, d, 1)
                uids.append(uid)
            per_query.append(uids)
        result.append(per_query)
    return result


def mask_rows(spec: AttendSpec, rows: int) -> int:
    """q_len as the spec shows it (NONE and CAUSAL do not carry it: the caller's q_len is checked apart)."""
    return np.asarray(spec.mask).shape[0] if spec.kind is MaskKind.EXPLICIT else -1


# --- the contiguous cache, against a brute-force model written here ------------------------------------

@dataclass
class SeqModel:
    """Per layer, the uid at each position the layer holds; the open step (its first position and the layers
    that served it)."""

    n_layers: int
    held: list[list[int]] = field(default_factory=list)
    open_start: Optional[int] = None
    open_served: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.held = [[] for _ in range(self.n_layers)]

    def serve(self, layer: int, uids: list[int]) -> None:
        if self.open_start is not None and layer in self.open_served:   # the next step: abandon the open one
            for tokens in self.held:
                del tokens[self.open_start:]
            self.open_start, self.open_served = None, set()
        if self.open_start is None:
            self.open_start = len(self.held[layer])
        self.held[layer] += uids
        self.open_served.add(layer)
        if len(self.open_served) == self.n_layers:
            self.open_start, self.open_served = None, set()

    def expected(self, layer: int, positions: list[int], window: int) -> list[list[int]]:
        return [[uid for q, uid in enumerate(self.held[layer]) if q <= p and (window == 0 or q > p - window)]
                for p in positions]


def fetch_and_check(cache: Any, model_uids: list[list[int]], layer: int, uids: list[int], positions: list[int],
                    B: int, H: int, D: int, Dv: int) -> None:
    k, v = labelled(uids, layer, B, H, D, Dv)
    k_hist, v_hist, spec = cache.update_and_fetch(layer, k, v, column(positions))
    rows = np.asarray(k_hist).shape[2]
    if spec.kind is not MaskKind.EXPLICIT:
        assert spec.mask is None
    mask = expand(spec, len(uids), rows)
    assert mask.shape == (len(uids), rows)
    got = attended_uids(k_hist, v_hist, AttendSpec(MaskKind.EXPLICIT, mask), layer, B, H, D, Dv)
    for b in range(B):   # every batch row attends exactly the expected tokens, each once, its own row's K/V
        assert [sorted(x) for x in got[b]] == [sorted(x) for x in model_uids], (layer, positions)
        assert all(len(x) == len(set(x)) for x in got[b])


def contiguous_config(layers: tuple[LayerPolicy, ...], capacity: int = 16, *, B: int = 1, H: int = 2, D: int = 3,
                      Dv: int = 2, max_write: Optional[int] = None,
                      sizing: CacheSizing = CacheSizing.DYNAMIC) -> CacheConfig:
    return CacheConfig(n_layers=len(layers), n_kv_heads=H, head_dim=D, capacity=capacity, sizing=sizing,
                       batch_size=B, layers=layers, v_head_dim=Dv, max_write=max_write)


@dataclass
class ContiguousProgram:
    """Steps of (q_len, order of the layers served); a prefix of the order leaves the step unfinished."""

    config: CacheConfig
    steps: list[tuple[int, list[int]]]


@st.composite
def contiguous_programs(draw: st.DrawFn) -> ContiguousProgram:
    n_layers = draw(st.integers(1, 3))
    policies = tuple(draw(st.sampled_from([LayerPolicy.flat(), LayerPolicy.ring(1), LayerPolicy.ring(2),
                                           LayerPolicy.ring(3)])) for _ in range(n_layers))
    max_write = draw(st.sampled_from([None, 1, 2, 3]))
    config = contiguous_config(policies, capacity=draw(st.integers(4, 12)), B=draw(st.integers(1, 2)),
                               max_write=max_write, sizing=draw(st.sampled_from(list(CacheSizing))))
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        q_len = draw(st.integers(1, max_write or 4))
        order = draw(st.permutations(range(n_layers)))
        served = draw(st.integers(1, n_layers)) if draw(st.booleans()) else n_layers
        steps.append((q_len, list(order[:served])))
    return ContiguousProgram(config, steps)


def probe(call: Any, snapshot: Any, rules: set[str]) -> None:
    """OP-ATOMIC: a hostile call between valid ones is refused with one of `rules` and changes nothing."""
    before = snapshot()
    with pytest.raises(KVCacheError) as refused:
        call()
    assert isinstance(refused.value, ValueError) and refused.value.rule in rules, str(refused.value)
    assert snapshot() == before


def run_contiguous(program: ContiguousProgram) -> None:
    config = program.config
    assert config.v_head_dim is not None
    B, H, D, Dv = config.batch_size, config.n_kv_heads, config.head_dim, config.v_head_dim
    cache = ContiguousReferenceCache(config)
    model = SeqModel(config.n_layers)
    uid = 0
    step_uids: list[int] = []
    for q_len, order in program.steps:
        for layer in order:
            if model.open_start is not None and layer not in model.open_served:   # a layer of the open step
                start, uids = model.open_start, step_uids
            else:   # a new step (abandoning the open one when this layer already served it)
                start = model.open_start if model.open_start is not None else len(model.held[layer])
                uids = list(range(uid, uid + q_len))
            positions = list(range(start, start + len(uids)))
            if positions[-1] >= config.capacity:
                before = cache._state()
                with pytest.raises(ValueError) as refused:
                    cache.update_and_fetch(layer, *labelled(uids, layer, B, H, D, Dv), column(positions))
                assert isinstance(refused.value, KVCacheError) and refused.value.rule == "OP-CAP"
                assert cache._state() == before
                return
            for shift in (-1, 1):   # OP-POS, OP-STEP, OP-ATOMIC: a re-placed or gapped step is refused, unchanged
                probe(lambda: cache.update_and_fetch(layer, *labelled(uids, layer, B, H, D, Dv),
                                                     column([p + shift for p in positions])), cache._state,
                      {"OP-POS", "OP-STEP"})
            if uids is not step_uids:
                uid += q_len
                step_uids = uids
            model.serve(layer, uids)
            fetch_and_check(cache, model.expected(layer, positions, config.window(layer)), layer, uids, positions,
                            B, H, D, Dv)
            assert [cache.used(n) for n in range(config.n_layers)] == [len(held) for held in model.held]


@settings(max_examples=80)
@given(contiguous_programs())
def test_contiguous_programs_attend_exactly(program: ContiguousProgram) -> None:
    """OP-ATTEND, OP-STEP, OP-HIST, OP-MASK: random programs (flat, ring and mixed layers; whole or kept rings;
    B 1 or 2; unfinished steps abandoned by the next) keep every query's attended set exact."""
    run_contiguous(program)


def test_contiguous_decode_and_prefill_kinds() -> None:
    """OP-MASK: a fresh full prefill is CAUSAL, an unwindowed decode NONE, a continuation EXPLICIT."""
    cache = ContiguousReferenceCache(contiguous_config((LayerPolicy.flat(),)))
    k, v = labelled([0, 1, 2], 0, 1, 2, 3, 2)
    assert cache.update_and_fetch(0, k, v, column([0, 1, 2]))[2].kind is MaskKind.CAUSAL
    k, v = labelled([3], 0, 1, 2, 3, 2)
    assert cache.update_and_fetch(0, k, v, column([3]))[2].kind is MaskKind.NONE
    k, v = labelled([4, 5], 0, 1, 2, 3, 2)
    spec = cache.update_and_fetch(0, k, v, column([4, 5]))[2]
    assert spec.kind is MaskKind.EXPLICIT
    assert np.asarray(spec.mask).tolist() == [[True] * 5 + [False], [True] * 6]


def test_a_kept_ring_holds_only_its_window() -> None:
    """OP-ATTEND with max_write: a ring layer returns (and keeps) only window + q_len - 1 rows at most."""
    window, max_write = 3, 2
    cache = ContiguousReferenceCache(contiguous_config((LayerPolicy.flat(), LayerPolicy.ring(window)), capacity=40,
                                                       max_write=max_write))
    model = SeqModel(2)
    uid = 0
    for q_len in [2, 1, 2, 2, 1, 1, 2, 2, 2, 1]:
        start = len(model.held[0])
        uids = list(range(uid, uid + q_len))
        uid += q_len
        for layer in (0, 1):
            model.serve(layer, uids)
            positions = list(range(start, start + q_len))
            k, v = labelled(uids, layer, 1, 2, 3, 2)
            k_hist, v_hist, spec = cache.update_and_fetch(layer, k, v, column(positions))
            rows = np.asarray(k_hist).shape[2]
            if layer == 1:
                assert rows == start + q_len - max(0, start - window + 1) <= window + q_len - 1
                assert cache._pools.k[1].shape[2] <= window + max_write - 1   # the byte layer keeps the ring only
            got = attended_uids(k_hist, v_hist, AttendSpec(MaskKind.EXPLICIT, expand(spec, q_len, rows)), layer,
                                1, 2, 3, 2)
            assert [sorted(x) for x in got[0]] == model.expected(layer, positions, (0, window)[layer])


def test_static_and_dynamic_agree() -> None:
    """OP-CAP: STATIC preallocates, DYNAMIC grows; every answer is the same."""
    answers = []
    for sizing in CacheSizing:
        cache = ContiguousReferenceCache(contiguous_config((LayerPolicy.flat(), LayerPolicy.ring(2)), capacity=6,
                                                           sizing=sizing))
        out = []
        for start, q_len in ((0, 3), (3, 1), (4, 2)):
            for layer in (0, 1):
                k, v = labelled(list(range(start, start + q_len)), layer, 1, 2, 3, 2)
                k_hist, v_hist, spec = cache.update_and_fetch(layer, k, v, column(list(range(start, start + q_len))))
                out.append((k_hist.tobytes(), v_hist.tobytes(), spec.kind, None if spec.mask is None
                            else spec.mask.tobytes()))
        with pytest.raises(ValueError, match="OP-CAP"):
            k, v = labelled([6], 0, 1, 2, 3, 2)
            cache.update_and_fetch(0, k, v, column([6]))
        answers.append(out)
    assert answers[0] == answers[1]


def test_contiguous_abandoned_step_rolls_back_every_layer() -> None:
    """OP-STEP: layer 0 served twice begins the next step; the unfinished one leaves every layer."""
    cache = ContiguousReferenceCache(contiguous_config((LayerPolicy.flat(), LayerPolicy.flat())))
    for layer in (0, 1):
        cache.update_and_fetch(layer, *labelled([0, 1], layer, 1, 2, 3, 2), column([0, 1]))
    cache.update_and_fetch(0, *labelled([2], 0, 1, 2, 3, 2), column([2]))
    assert (cache.used(0), cache.used(1)) == (3, 2)
    k_hist, v_hist, spec = cache.update_and_fetch(0, *labelled([9], 0, 1, 2, 3, 2), column([2]))   # a retry
    assert (cache.used(0), cache.used(1)) == (3, 2)
    assert [unlabel(x)[0] for x in np.asarray(k_hist)[0, 0, :, 0]] == [0, 1, 9]
    cache.update_and_fetch(0, *labelled([10], 0, 1, 2, 3, 2), column([2]))
    k_hist, _, _ = cache.update_and_fetch(1, *labelled([10], 1, 1, 2, 3, 2), column([2]))
    assert [unlabel(x)[0] for x in np.asarray(k_hist)[0, 0, :, 0]] == [0, 1, 10]
    cache.reset()
    assert cache.used(0) == cache.used(1) == 0


# --- the cell cache, against a brute-force model written here ------------------------------------------

@dataclass
class CellModel:
    """Per sequence: position -> uid of the token it holds (a fork shares uids); the open step."""

    n_layers: int
    seqs: dict[int, dict[int, int]] = field(default_factory=dict)
    step: Optional[list[tuple[int, int, int]]] = None   # (seq, position, uid) of the placed step
    served: set[int] = field(default_factory=set)

    def abandon(self) -> None:
        if self.step is not None:
            for s, p, _ in self.step:
                del self.seqs[s][p]
        self.step, self.served = None, set()

    def held(self, s: int) -> dict[int, int]:
        return self.seqs.get(s, {})


@st.composite
def cell_programs(draw: st.DrawFn) -> tuple[CacheConfig, list[tuple[Any, ...]]]:
    n_layers = draw(st.integers(1, 3))
    policies = tuple(draw(st.sampled_from([LayerPolicy.flat(), LayerPolicy.ring(1), LayerPolicy.ring(2),
                                           LayerPolicy.ring(4)])) for _ in range(n_layers))
    config = CacheConfig(n_layers=n_layers, n_kv_heads=2, head_dim=2, capacity=draw(st.integers(3, 12)),
                         sizing=draw(st.sampled_from(list(CacheSizing))), layers=policies, v_head_dim=3)
    ops: list[tuple[Any, ...]] = []
    ids = st.sampled_from([0, 1, 5, 62])
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["step", "step", "step", "cp", "rm", "reset"]))
        if kind == "step":
            seq_ids = draw(st.lists(ids, min_size=1, max_size=4))
            gaps = draw(st.lists(st.integers(1, 3), min_size=len(seq_ids), max_size=len(seq_ids)))
            order = draw(st.permutations(range(n_layers)))
            served = n_layers if draw(st.booleans()) else draw(st.integers(0, n_layers))
            ops.append(("step", seq_ids, gaps, list(order[:served])))
        elif kind == "cp":
            ops.append(("cp", draw(ids), draw(ids), draw(st.one_of(st.none(), st.integers(0, 12)))))
        elif kind == "rm":
            p0 = draw(st.integers(0, 10))
            ops.append(("rm", draw(ids), p0, draw(st.one_of(st.none(), st.integers(p0, 12)))))
        else:
            ops.append(("reset",))
    return config, ops


def run_cells(config: CacheConfig, ops: list[tuple[Any, ...]]) -> None:
    assert config.v_head_dim is not None
    H, D, Dv = config.n_kv_heads, config.head_dim, config.v_head_dim
    cache = CellReferenceCache(config)
    model = CellModel(config.n_layers)
    uid = 0
    for op in ops:
        if op[0] == "step":
            _, seq_ids, gaps, order = op
            model.abandon()
            occupied = len({uid for held in model.seqs.values() for uid in held.values()})
            if len(seq_ids) > config.capacity - occupied:
                before = cache._state()
                with pytest.raises(ValueError, match="OP-CAP"):
                    cache.begin_step(seq_ids)
                assert cache._state() == before
                continue
            cache.begin_step(seq_ids)
            newest = {s: max(model.held(s), default=-1) for s in seq_ids}
            positions, step = [], []
            for s, gap in zip(seq_ids, gaps):
                newest[s] += gap
                positions.append(newest[s])
                step.append((s, newest[s], uid))
                uid += 1
            uids = [u for _, _, u in step]
            held_before = [(i, max(model.held(s))) for i, s in enumerate(seq_ids) if model.held(s)]
            for layer in order:
                if model.step is None and held_before:   # OP-POS: a position its sequence holds is refused
                    i, newest_held = held_before[0]
                    replaced = positions[:i] + [newest_held] + positions[i + 1:]
                    probe(lambda: cache.update_and_fetch(layer, *labelled(uids, layer, 1, H, D, Dv),
                                                         column(replaced)), cache._state, {"OP-POS"})
                for served in model.served:   # OP-STEP: a layer serves a step once
                    probe(lambda: cache.update_and_fetch(served, *labelled(uids, served, 1, H, D, Dv),
                                                         column(positions)), cache._state, {"OP-STEP"})
                if model.step is None:
                    model.step = step
                    for s, p, u in step:
                        model.seqs.setdefault(s, {})[p] = u
                model.served.add(layer)
                w = config.window(layer)
                expected = [[u for q, u in model.held(s).items() if q <= p and (w == 0 or q > p - w)]
                            for s, p in zip(seq_ids, positions)]
                k, v = labelled(uids, layer, 1, H, D, Dv)
                k_hist, v_hist, spec = cache.update_and_fetch(layer, k, v, column(positions))
                assert spec.kind is MaskKind.EXPLICIT
                got = attended_uids(k_hist, v_hist, spec, layer, 1, H, D, Dv)[0]
                assert [sorted(x) for x in got] == [sorted(x) for x in expected]
                assert np.asarray(k_hist).shape[2] == cache.used_end()
            if len(model.served) == config.n_layers:
                model.step, model.served = None, set()
        elif op[0] == "cp":
            _, src, dst, upto = op
            model.abandon()
            if src == dst or model.held(dst):
                before = cache._state()
                with pytest.raises(ValueError, match="OP-FORK"):
                    cache.seq_cp(src, dst, upto)
                assert cache._state() == before
                continue
            cache.seq_cp(src, dst, upto)
            model.seqs[dst] = {p: u for p, u in model.held(src).items() if upto is None or p < upto}
        elif op[0] == "rm":
            _, s, p0, p1 = op
            model.abandon()
            cache.seq_rm(s, p0, p1)
            model.seqs[s] = {p: u for p, u in model.held(s).items() if not (p0 <= p and (p1 is None or p < p1))}
        else:
            model.abandon()
            cache.reset()
            model.seqs = {}
        for s in (0, 1, 5, 62):
            assert cache.seq_len(s) == len(model.held(s))
        occupied = len({u for held in model.seqs.values() for u in held.values()})
        assert cache.free_cells() == config.capacity - occupied
        # OP-CAP: can_extend(n) answers what begin_step of n tokens would: the open step's cells count as free
        open_step = len(model.step) if model.step is not None else 0
        assert [cache.can_extend(n) for n in range(config.capacity + 2)] == \
            [n <= config.capacity - occupied + open_step for n in range(config.capacity + 2)]


@settings(max_examples=80)
@given(cell_programs())
def test_cell_programs_attend_exactly(program: tuple[CacheConfig, list[tuple[Any, ...]]]) -> None:
    """OP-ATTEND, OP-STEP, OP-FORK, OP-RM: random programs of steps (some left unfinished), forks, removals and
    resets keep every query's attended set exact: its own sequence, no removed token, each token once."""
    run_cells(*program)


def test_cell_fork_shares_and_step_rolls_back() -> None:
    """OP-FORK shares cells (no copy); OP-STEP: an unfinished step's tokens leave every layer."""
    config = CacheConfig(n_layers=2, n_kv_heads=1, head_dim=1, capacity=8)
    cache = CellReferenceCache(config)
    cache.begin_step([3, 3, 3])
    for layer in (0, 1):
        cache.update_and_fetch(layer, *labelled([0, 1, 2], layer, 1, 1, 1, 1), column([0, 1, 2]))
    cache.seq_cp(3, 4, upto=2)
    assert (cache.seq_len(4), cache.free_cells()) == (2, 5)
    cache.begin_step([4])
    cache.update_and_fetch(0, *labelled([7], 0, 1, 1, 1, 1), column([2]))
    assert (cache.seq_len(4), cache.free_cells(), cache.used_end()) == (3, 4, 4)
    cache.begin_step([4])   # abandons the unfinished step
    assert (cache.seq_len(4), cache.free_cells(), cache.used_end()) == (2, 5, 3)
    cache.update_and_fetch(0, *labelled([8], 0, 1, 1, 1, 1), column([2]))
    cache.seq_rm(3)          # abandons again, then removes 3: the shared cells stay with 4
    assert (cache.seq_len(3), cache.seq_len(4), cache.free_cells()) == (0, 2, 6)
    with pytest.raises(ValueError, match="OP-STEP"):
        cache.update_and_fetch(1, *labelled([8], 1, 1, 1, 1, 1), column([2]))


def test_can_extend_free_cells_and_begin_step_agree_mid_step() -> None:
    """OP-CAP: mid-step the open step's placed tokens hold cells (free_cells() counts them out, seq_len counts
    them in), yet begin_step abandons that step before it places anything, so its cells count as free for
    admission: can_extend(n) is exactly whether begin_step of n tokens is admitted - in the reference and in
    the model (spec/op_model.py), which give the same answers."""
    config = CacheConfig(n_layers=2, n_kv_heads=1, head_dim=1, capacity=4)
    op_config = op_model.make_config({"capacity": 4, "n_layers": 2, "layers": [{"kind": "flat", "window": 0}],
                                      "n_kv_heads": 1, "head_dim": 1, "batch_size": 1}, op_model.CELL)
    assert isinstance(op_config, op_model.OpConfig)
    model = op_model.OpModel(op_config)
    for n_seqs in (0, 1):   # a fresh cache, then one holding a token
        cache = CellReferenceCache(config)
        model.reset()
        if n_seqs:
            cache.begin_step([0])
            assert model.begin_step([0]) is None
            for layer in (0, 1):
                cache.update_and_fetch(layer, *labelled([0], layer, 1, 1, 1, 1), column([0]))
                model.fetch(layer, op_model.Shapes((1, 1, 1, 1), (1, 1, 1, 1), (1, 1), ("f", "f", "i")), [0], [0])
        cache.begin_step([1, 1])
        assert model.begin_step([1, 1]) is None
        cache.update_and_fetch(0, *labelled([1, 2], 0, 1, 1, 1, 1), column([0, 1]))   # layer 1 not yet served
        model.fetch(0, op_model.Shapes((1, 1, 2, 1), (1, 1, 2, 1), (2, 1), ("f", "f", "i")), [0, 1], [1, 2])
        free = 4 - n_seqs - 2
        assert (cache.free_cells(), model.free_cells(), cache.seq_len(1), model.seq_len(1)) == (free, free, 2, 2)
        for n in range(6):
            fits = n <= free + 2
            assert cache.can_extend(n) is fits and model.can_extend(n) is fits, n
        assert model.snapshot().begin_step([2] * (free + 2)) is None
        refused = model.snapshot().begin_step([2] * (free + 3))
        assert isinstance(refused, op_model.Rejected) and refused.rule == "OP-CAP"
        with pytest.raises(ValueError, match="OP-CAP"):
            cache.begin_step([2] * (free + 3))   # refused: nothing changed, the step is still open
        assert cache.free_cells() == free
        cache.begin_step([2] * (free + 2))        # admitted: the open step is abandoned, its cells freed
        assert (cache.free_cells(), cache.seq_len(1)) == (free + 2, 0)


# --- attend against a naive softmax --------------------------------------------------------------------

def naive_attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float) -> np.ndarray:
    B, Hq, q_len, _ = q.shape
    Hkv, rows, Dv = k.shape[1], k.shape[2], v.shape[3]
    out = np.zeros((B, Hq, q_len, Dv))
    for b in range(B):
        for h in range(Hq):
            g = h // (Hq // Hkv)
            for i in range(q_len):
                cols = [j for j in range(rows) if mask[i, j]]
                scores = [scale * sum(float(q[b, h, i, d]) * float(k[b, g, j, d]) for d in range(q.shape[3]))
                          for j in cols]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for j, w in zip(cols, weights):
                    out[b, h, i] += w / total * v[b, g, j].astype(np.float64)
    return out


@pytest.mark.parametrize("kind", list(MaskKind))
def test_attend_matches_a_naive_softmax(kind: MaskKind) -> None:
    """OP-MASK: attend applies NONE, CAUSAL and EXPLICIT as they are defined, with GQA head repetition."""
    rng = np.random.default_rng(7)
    B, Hq, Hkv, rows, D, Dv = 2, 4, 2, 5, 3, 2
    q_len = rows if kind is MaskKind.CAUSAL else 3
    q = rng.standard_normal((B, Hq, q_len, D)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, rows, D)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, rows, Dv)).astype(np.float32)
    if kind is MaskKind.NONE:
        spec, mask = AttendSpec(kind), np.ones((q_len, rows), dtype=bool)
    elif kind is MaskKind.CAUSAL:
        spec, mask = AttendSpec(kind), np.tril(np.ones((rows, rows), dtype=bool))
    else:
        mask = rng.random((q_len, rows)) < 0.5
        mask[:, 0] = True
        spec = AttendSpec(kind, mask)
    out = attend(q, k, v, spec, scale=0.7)
    assert out.shape == (B, Hq, q_len, Dv) and out.dtype == np.float32
    np.testing.assert_allclose(out, naive_attend(q, k, v, mask, 0.7), rtol=1e-5, atol=1e-6)
    default = attend(q, k, v, spec, out_dtype=np.float64)
    np.testing.assert_allclose(default, naive_attend(q, k, v, mask, 1 / math.sqrt(D)), rtol=1e-10)


def test_attend_refuses_a_non_square_causal_and_empty_rows() -> None:
    """OP-MASK: CAUSAL is upper-left (torch's is_causal): over a continuation it would hide the prior rows."""
    q = np.zeros((1, 1, 2, 2), np.float32)
    k = np.zeros((1, 1, 3, 2), np.float32)
    with pytest.raises(ValueError, match="OP-MASK"):
        attend(q, k, k, AttendSpec(MaskKind.CAUSAL))
    with pytest.raises(ValueError, match="OP-MASK"):
        attend(q, k, k, AttendSpec(MaskKind.EXPLICIT, np.array([[True, False, False], [False] * 3])))
    with pytest.raises(ValueError, match="OP-MASK"):
        attend(q, k, k, AttendSpec(MaskKind.EXPLICIT, np.ones((3, 3), dtype=bool)))
    with pytest.raises(ValueError, match="OP-ARGS"):
        attend(q, k, np.zeros((1, 1, 4, 2), np.float32), AttendSpec(MaskKind.NONE))
    with pytest.raises(ValueError, match="OP-ARGS"):
        attend(np.zeros((1, 3, 2, 2), np.float32), np.zeros((1, 2, 3, 2), np.float32),
               np.zeros((1, 2, 3, 2), np.float32), AttendSpec(MaskKind.NONE))
    with pytest.raises(TypeError, match="OP-ARGS"):
        attend(q, k, k, AttendSpec(MaskKind.NONE), scale=True)
    with pytest.raises(ValueError, match="OP-ARGS"):
        attend(q, k, k, AttendSpec(MaskKind.NONE), scale=math.nan)
    with pytest.raises(ValueError, match="OP-ARGS"):
        attend(q, k, k, AttendSpec(MaskKind.NONE), out_dtype=np.int64)
    with pytest.raises(TypeError, match="OP-ARGS"):
        attend(q, k.astype(np.int32), k, AttendSpec(MaskKind.NONE))
    np.testing.assert_allclose(attend(q, k, k, AttendSpec(MaskKind.NONE), scale=np.float32(0.5)), 0)
    with pytest.raises(TypeError, match="OP-MASK"):
        attend(q, k, k, "causal")  # type: ignore[arg-type]


def test_a_cache_and_attend_end_to_end() -> None:
    """OP-ATTEND through attend: each query's output is the softmax over exactly its own sequence's tokens."""
    config = CacheConfig(n_layers=1, n_kv_heads=1, head_dim=2, capacity=8, v_head_dim=1)
    cache = CellReferenceCache(config)
    k = np.array([[[[1, 0], [0, 1], [1, 1]]]], np.float32)
    v = np.array([[[[10], [20], [30]]]], np.float32)
    cache.begin_step([0, 0, 1])
    k_hist, v_hist, spec = cache.update_and_fetch(0, k, v, column([0, 1, 0]))
    q = np.array([[[[0, 0], [0, 0], [0, 0]]]], np.float32)   # uniform weights over what each query attends
    out = attend(q, k_hist, v_hist, spec)
    assert out[0, 0, :, 0].tolist() == [10.0, 15.0, 30.0]
