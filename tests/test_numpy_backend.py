"""The numpy backend, driven by the cache's plans, computes what a full recomputation computes.

A small random multi-layer attention model (float64, 4 query heads, GQA with 4, 2 or 1 K/V heads,
flat and ring layers) runs prefill, chunked prefill, decode, speculative decoding whose rejected
drafts are rolled back with rewind, rewind(0) and clear-and-reuse through a SequenceCache and the
numpy backend; every step's logits must equal those of recomputing the whole current sequence
without a cache (DATA-SOUND, PLAN-READ, REWIND-SOUND, CLEAR), to 1e-6. Then tampered plans and
pools, an upstream-style rewind floor and a skipped commit (PROTO-COMMIT) must be detected.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Optional

import pytest

np = pytest.importorskip("numpy", reason="the numpy backend needs the optional extra kvcache-spec[numpy]")

from kvcache import (CacheConfig, LayerConfig, LayerPolicy, SeqStepPlan, SequenceCache,  # noqa: E402
                     SequencePlanner, Run)
from kvcache.backends.numpy_backend import BackendError, NumpyBackend, rows_of  # noqa: E402

VOCAB, D_MODEL, N_HEADS, HEAD_DIM, D_FF = 11, 16, 4, 4, 24
TOLERANCE = 1e-6
DEVIATIONS: list[float] = []          # every step's largest |logit difference|, for the report
MASKS_SEEN: set[tuple[str, str]] = set()  # (config name, mask kind)


def flat(n_kv_heads: int = 2) -> LayerConfig:
    return LayerConfig(LayerPolicy.flat(), n_kv_heads, HEAD_DIM)


def ring(window: int, n_kv_heads: int = 2) -> LayerConfig:
    return LayerConfig(LayerPolicy.ring(window), n_kv_heads, HEAD_DIM)


CONFIGS: dict[str, CacheConfig] = {
    "flat": CacheConfig(40, 3, [flat(4), flat(2), flat(1)], initial_capacity=4),
    "ring": CacheConfig(40, 2, [ring(5, 2)]),                             # max_write = window: 9 slots
    "mixed": CacheConfig(48, 4, [flat(2), ring(4, 1), flat(4), ring(6, 2)], max_write=6, initial_capacity=2),
    "ring-wide-write": CacheConfig(40, 2, [ring(3, 1), flat(2)], max_write=8),  # multi-token steps > window
    "ring-narrow-write": CacheConfig(40, 2, [ring(6, 2), ring(2, 4)], max_write=2),
}


class TinyModel:
    """Embeddings + learned positions, then per layer attention (with GQA) and a tanh MLP, residual."""

    def __init__(self, config: CacheConfig, seed: int) -> None:
        rng = np.random.default_rng(seed)

        def weight(*shape: int) -> Any:
            return rng.normal(size=shape) / math.sqrt(shape[0])

        self.config = config
        self.embed = rng.normal(size=(VOCAB, D_MODEL))
        self.positions = 0.5 * rng.normal(size=(config.capacity, D_MODEL))
        self.layers = []
        for index in range(config.n_layers):
            n_kv = config.layer(index).n_kv_heads
            self.layers.append(dict(q=weight(D_MODEL, N_HEADS * HEAD_DIM), k=weight(D_MODEL, n_kv * HEAD_DIM),
                                    v=weight(D_MODEL, n_kv * HEAD_DIM), o=weight(N_HEADS * HEAD_DIM, D_MODEL),
                                    up=weight(D_MODEL, D_FF), down=weight(D_FF, D_MODEL)))
        self.unembed = weight(D_MODEL, VOCAB)

    def window(self, layer: int) -> Optional[int]:
        policy = self.config.layer(layer).policy
        return policy.window if policy.window else None

    def _qkv(self, layer: int, x: Any) -> tuple[Any, Any, Any]:
        w, T = self.layers[layer], len(x)
        return ((x @ w["q"]).reshape(T, N_HEADS, HEAD_DIM), (x @ w["k"]).reshape(T, -1, HEAD_DIM),
                (x @ w["v"]).reshape(T, -1, HEAD_DIM))

    def _finish(self, layer: int, x: Any, attended: Any) -> Any:
        w = self.layers[layer]
        x = x + attended.reshape(len(x), N_HEADS * HEAD_DIM) @ w["o"]
        return x + np.tanh(x @ w["up"]) @ w["down"]

    def step(self, backend: NumpyBackend, position: int, tokens: list[int]) -> Any:
        """Logits of the new tokens, computed through the cache and the backend."""
        x = self.embed[tokens] + self.positions[position:position + len(tokens)]
        for layer in range(self.config.n_layers):
            q, k, v = self._qkv(layer, x)
            x = self._finish(layer, x, backend.attend(layer, position, q, k, v))
        return x @ self.unembed

    def full(self, tokens: list[int]) -> Any:
        """Logits of every token, recomputed from scratch with no cache (the reference)."""
        x = self.embed[tokens] + self.positions[:len(tokens)]
        for layer in range(self.config.n_layers):
            q, k, v = self._qkv(layer, x)
            x = self._finish(layer, x, reference_attention(q, k, v, self.window(layer)))
        return x @ self.unembed


def reference_attention(q: Any, k: Any, v: Any, window: Optional[int]) -> Any:
    """Token t attends to keys [0, t] (flat) or [t - window + 1, t] (ring), one query at a time."""
    out = np.zeros_like(q)
    group = q.shape[1] // k.shape[1]
    for t in range(len(q)):
        keys = range(0 if window is None else max(0, t - window + 1), t + 1)
        for head in range(q.shape[1]):
            kv_head = head // group
            scores = np.array([q[t, head] @ k[j, kv_head] for j in keys]) / math.sqrt(q.shape[2])
            weights = np.exp(scores - scores.max())
            out[t, head] = (weights / weights.sum()) @ v[list(keys), kv_head]
    return out


class Runner:
    """A runner and its backend; every step is checked against a full recomputation."""

    def __init__(self, name: str, commit_per_layer: bool, seed: int = 0,
                 cache: Optional[SequenceCache] = None) -> None:
        self.name = name
        self.config = CONFIGS[name]
        self.model = TinyModel(self.config, seed)
        self.cache = cache if cache is not None else SequenceCache(self.config)
        self.control = self.cache.as_control()
        self.backend = NumpyBackend(self.cache.as_planner(), self.config, commit_per_layer=commit_per_layer)
        self.tokens: list[int] = []
        self.limit = self.cache._step_limit or self.config.capacity

    def run(self, new_tokens: list[int]) -> Any:
        position = self.control.length()
        assert position == len(self.tokens)
        assert self.control.can_extend(len(new_tokens)), "ADMIT: the runner admits before it steps"
        logits = self.model.step(self.backend, position, new_tokens)
        self.backend.finish_step()
        MASKS_SEEN.update((self.name, kind) for kind in self.backend.last_masks.values())
        self.tokens += new_tokens
        assert self.control.length() == len(self.tokens)
        expected = self.model.full(self.tokens)[position:]
        deviation = float(np.abs(logits - expected).max())
        DEVIATIONS.append(deviation)
        assert deviation < TOLERANCE, f"step ({position}, {len(new_tokens)}) deviates by {deviation}"
        return logits

    def prefill(self, prompt: list[int], chunks: list[int]) -> int:
        """Run the prompt in chunks (each at most the step limit); returns the next token (greedy)."""
        done = 0
        logits = None
        for size in chunks:
            size = min(size, self.limit, len(prompt) - done)
            if size == 0:
                break
            logits = self.run(prompt[done:done + size])
            done += size
        while done < len(prompt):
            size = min(self.limit, len(prompt) - done)
            logits = self.run(prompt[done:done + size])
            done += size
        assert logits is not None
        return int(np.argmax(logits[-1]))

    def rewind(self, new_len: int) -> None:
        assert self.control.rewind(new_len), f"REWIND-SOUND: rewind({new_len}) from {self.control.length()}"
        del self.tokens[new_len:]

    def greedy_continuation(self, pending: int, k: int) -> list[int]:
        """The k tokens the model would produce after `pending`, by recomputation (a perfect draft)."""
        sequence = self.tokens + [pending]
        for _ in range(k):
            sequence.append(int(np.argmax(self.model.full(sequence)[-1])))
        return sequence[len(self.tokens) + 1:]

    def speculate(self, pending: int, k: int, first_wrong: int) -> int:
        """Verify k drafts (correct before index `first_wrong`) in one step; roll back the rest."""
        drafts = self.greedy_continuation(pending, k)
        if first_wrong < k:
            drafts[first_wrong] = (drafts[first_wrong] + 1) % VOCAB
        start = self.control.length()
        predictions = [int(t) for t in np.argmax(self.run([pending] + drafts), axis=-1)]
        accepted = 0
        while accepted < k and drafts[accepted] == predictions[accepted]:
            accepted += 1
        assert accepted == first_wrong, "the cached logits make the same predictions as the full model"
        if accepted < k:
            self.rewind(start + 1 + accepted)  # drop the rejected drafts' rows
        return predictions[accepted]


def prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, size=n)]


@pytest.fixture(scope="module", autouse=True)
def report_deviation() -> Iterator[None]:
    yield
    if DEVIATIONS:
        print(f"\nnumpy backend: {len(DEVIATIONS)} steps, largest |logit deviation| vs recomputation "
              f"{max(DEVIATIONS):.3e}, masks seen {sorted({kind for _, kind in MASKS_SEEN})}")


@pytest.mark.parametrize("commit_per_layer", [True, False], ids=["commit-per-layer", "commit-once"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_steps_equal_recomputation(name: str, commit_per_layer: bool) -> None:
    """DATA-SOUND, PLAN-READ, COMMIT-ADVANCE: prefill, decode, speculative rollback, rewind(0), clear."""
    runner = Runner(name, commit_per_layer)
    pending = runner.prefill(prompt(1, 13), chunks=[13])            # one step when the limit allows
    for _ in range(4):                                                 # decode: T = 1, no mask
        pending = int(np.argmax(runner.run([pending])[-1]))
    k = max(1, min(runner.limit, 4) - 1)                              # verify step of k + 1 <= max_write
    for first_wrong in (0, k, 1 % (k + 1), 0, min(2, k)):              # REWIND-SOUND: rejected drafts
        pending = runner.speculate(pending, k, first_wrong)
    assert runner.control.length() <= runner.config.capacity
    runner.rewind(0)                                                   # REWIND-SOUND: always allowed
    runner.tokens.clear()
    pending = runner.prefill(prompt(2, 9), chunks=[3, 1, 2])           # chunked prefill
    pending = int(np.argmax(runner.run([pending])[-1]))
    runner.control.clear()                                             # CLEAR: reuse for a new sequence
    runner.tokens.clear()
    pending = runner.prefill(prompt(3, 11), chunks=[1, 4, 2])
    for _ in range(3):
        pending = runner.speculate(pending, k, first_wrong=1 % (k + 1))


def test_every_mask_kind_is_exercised() -> None:
    """The runs above used no mask (decode), causal and banded masks (a wide ring step)."""
    for name in CONFIGS:
        Runner(name, True).prefill(prompt(4, 8), chunks=[8])
    kinds = {kind for _, kind in MASKS_SEEN}
    assert {"causal", "banded"} <= kinds
    assert ("ring-wide-write", "banded") in MASKS_SEEN


def test_pools_never_exceed_depth_and_grow_from_initial_capacity() -> None:
    """DEPTH, PLAN-SHAPE: a pool starts at initial_capacity rows and never grows past depth(layer)."""
    runner = Runner("mixed", True)
    assert [len(pool.row_position) for pool in runner.backend.pools] == [2, 2, 2, 2]
    runner.prefill(prompt(5, 30), chunks=[6])
    for layer, pool in enumerate(runner.backend.pools):
        assert len(pool.row_position) <= runner.cache.depth(layer) == pool.depth
    ring_pool = runner.backend.pools[1]
    assert len(ring_pool.row_position) == runner.cache.depth(1) == 4 + 6 - 1  # wrapped: the whole ring


# --- what the backend detects ----------------------------------------------------------------------

class TamperingPlanner(SequencePlanner):
    """The cache's planner, with a function applied to every plan (for tests of the backend's checks)."""

    def __init__(self, cache: SequenceCache) -> None:
        self.cache = cache
        self.tamper: Optional[Any] = None

    def plan(self, layer: int, position: int, T: int) -> Optional[SeqStepPlan]:
        plan = self.cache.plan(layer, position, T)
        return plan if plan is None or self.tamper is None else self.tamper(plan)

    def commit(self, plan: SeqStepPlan) -> None:
        self.cache.commit(plan)

    def depth(self, layer: int) -> int:
        return self.cache.depth(layer)

    def retained_from(self, layer: int) -> int:
        return self.cache.retained_from(layer)


def _runs(rows: list[int]) -> tuple[Run, ...]:
    """Consecutive rows grouped into runs."""
    runs: list[Run] = []
    for row in rows:
        if runs and runs[-1].end == row:
            runs[-1] = Run(runs[-1].start, runs[-1].len + 1)
        else:
            runs.append(Run(row, 1))
    return tuple(runs)


def _shift(run: Run, by: int, n_slots: int) -> Run:
    return Run((run.start + by) % n_slots, run.len)


TAMPERS: dict[str, tuple[Any, str]] = {
    # a write one row off: the rows read as the new positions hold something else
    "write shifted": (lambda p: SeqStepPlan((_shift(p.write[0], 1, 9),) + p.write[1:], p.read, p.read_base_pos),
                      "DATA-SOUND"),
    # the read runs in the wrong order (or rotated by one): rows read as the wrong positions
    "read rotated": (lambda p: SeqStepPlan(p.write, p.read[::-1] if len(p.read) == 2
                                           else (_shift(p.read[0], 1, 9),), p.read_base_pos), "DATA-SOUND"),
    # a read span that misses the oldest key of the window
    "read base moved": (lambda p: SeqStepPlan(p.write, _runs(rows_of(p.read).tolist()[1:]), p.read_base_pos + 1),
                        "PLAN-READ"),
    # a write past the pool
    "write past depth": (lambda p: SeqStepPlan((Run(8, 2),), p.read, p.read_base_pos), "PLAN-SHAPE"),
    # one row too many written
    "write too long": (lambda p: SeqStepPlan((Run(p.write[0].start, p.write[0].len + 1),) if p.write[0].end < 9
                                             else (Run(0, 2),), p.read, p.read_base_pos), "PLAN-WRITE"),
}


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_a_tampered_plan_is_detected(tamper: str) -> None:
    """PLAN-SHAPE, PLAN-WRITE, PLAN-READ, DATA-SOUND: a plan that is not the cache's raises, never miscomputes."""
    config = CONFIGS["ring"]  # ring(5), 9 slots
    cache = SequenceCache(config)
    planner = TamperingPlanner(cache)
    backend = NumpyBackend(planner, config)
    model = TinyModel(config, 7)
    tokens = prompt(8, 12)
    for position in range(0, 12, 3):
        model.step(backend, position, tokens[position:position + 3])  # wraps the ring; all sound
    function, rule = TAMPERS[tamper]
    planner.tamper = function
    with pytest.raises(BackendError) as caught:
        model.step(backend, 12, [1, 2])
    assert caught.value.rule == rule, str(caught.value)


@pytest.mark.parametrize("how", ["rows swapped", "stale row copied"])
def test_a_tampered_pool_is_detected(how: str) -> None:
    """DATA-SOUND: rows moved inside a pool are read as the wrong positions and refused."""
    runner = Runner("ring", True)
    runner.prefill(prompt(9, 12), chunks=[5])
    pool = runner.backend.pools[0]
    if how == "rows swapped":
        a, b = 0, 1  # positions 9 and 10, both read by the step at 12 (it reads [8, 13))
        for array in (pool.keys, pool.values, pool.row_position, pool.row_stamp):
            array[[a, b]] = array[[b, a]]
    else:  # the row of position 11 replaced by an older write of position 11 (another branch)
        pool.row_stamp[11 % 9] -= 1
    with pytest.raises(BackendError) as caught:
        runner.model.step(runner.backend, 12, [0])
    assert caught.value.rule == "DATA-SOUND"


class UpstreamFloorCache(SequenceCache):
    """SequenceCache with upstream's rewind floor max(0, length - window) instead of REWIND-SOUND."""

    def _rewind_safe(self, new_len: int) -> bool:
        windows = [p.window for p in self._policies if hasattr(p, "window")]
        return all(new_len >= max(0, self._length - w) for w in windows)


def test_upstream_rewind_floor_reads_overwritten_rows() -> None:
    """REWIND-SOUND: with max_write < window, upstream's floor lets a rewind read rows the ring overwrote."""
    config = CacheConfig(40, 1, [ring(4)], max_write=1)  # a ring of 4 + 1 - 1 = 4 slots
    for cache, accepted in ((SequenceCache(config), False), (UpstreamFloorCache(config), True)):
        backend = NumpyBackend(cache.as_planner(), config)
        model = TinyModel(config, 11)
        tokens = prompt(12, 10)
        for position in range(10):
            model.step(backend, position, [tokens[position]])
        assert cache.as_control().rewind(6) is accepted  # 6 = max(0, 10 - 4), upstream's floor
        if accepted:
            with pytest.raises(BackendError) as caught:
                model.step(backend, 6, [tokens[6]])  # reads position 3 from slot 3, which holds 7
            assert caught.value.rule == "DATA-SOUND"
            assert "holds position 7" in str(caught.value)


def test_PROTO_COMMIT_a_step_run_but_not_committed() -> None:
    """PROTO-COMMIT: rewinding past an executed, uncommitted step; the backend refuses the next step,
    and without that check the data-level check catches the unsound read."""
    config = CacheConfig(40, 1, [ring(4)])  # 7 slots
    cache = SequenceCache(config)
    backend = NumpyBackend(cache.as_planner(), config, commit_per_layer=False)
    model = TinyModel(config, 13)
    tokens = prompt(14, 11)
    for position in range(0, 7):
        model.step(backend, position, [tokens[position]])
        backend.finish_step()
    model.step(backend, 7, tokens[7:11])          # writes positions 7..10 into slots 0..3; not committed
    assert cache.as_control().rewind(3)           # the cache cannot see those rows: it accepts
    with pytest.raises(BackendError) as caught:
        model.step(backend, 3, [tokens[3]])
    assert caught.value.rule == "PROTO-COMMIT"
    backend.pending = None                        # a backend without the protocol check
    with pytest.raises(BackendError) as caught:
        model.step(backend, 3, [tokens[3]])       # reads position 0 from slot 0, which holds 7
    assert caught.value.rule == "DATA-SOUND"


def test_admission_is_the_runners_job() -> None:
    """ADMIT: a step past capacity is refused by plan, and the backend says so instead of writing."""
    config = CacheConfig(4, 1, [flat()])
    cache = SequenceCache(config)
    backend = NumpyBackend(cache.as_planner(), config)
    model = TinyModel(config, 15)
    model.step(backend, 0, [1, 2, 3])
    assert not cache.can_extend(2)
    with pytest.raises(BackendError) as caught:
        model.step(backend, 3, [4, 5])
    assert caught.value.rule == "ADMIT"
    assert cache.length() == 3


def test_the_backend_is_independent_of_the_spec() -> None:
    """The backend uses the public kvcache API only: importing it loads no kvcache_spec module."""
    import subprocess
    import sys
    code = "import sys, kvcache.backends.numpy_backend; sys.exit('kvcache_spec' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --- the cell layout: a batch of sequences over one pool of cells ------------------------------------

from kvcache import CellCache, CellStep, CellStepper  # noqa: E402
from kvcache.backends.numpy_backend import NumpyCellBackend  # noqa: E402


class CellRunner:
    """A batched runner over a CellCache and the numpy cell backend. Every token's logits are checked
    against recomputing its own sequence's whole history without a cache (CELL-DATA-SOUND)."""

    def __init__(self, name: str = "mixed", seed: int = 0, stepper: Optional[CellStepper] = None) -> None:
        self.config = CONFIGS[name]
        self.model = TinyModel(self.config, seed)
        self.cache = CellCache(self.config)
        self.control = self.cache.as_batch_control()
        self.backend = NumpyCellBackend(stepper or self.cache.as_cell_stepper(), self.config)
        self.history: dict[int, list[int]] = {}   # live id -> its tokens; position = index
        self.record = True                          # add each deviation to the module's report

    def new(self) -> int:
        s = self.control.seq_new()
        assert s is not None and s not in self.history
        self.history[s] = []
        return s

    def clone(self, src: int, upto: Optional[int] = None) -> int:
        fork = self.control.seq_clone(src, upto)
        assert fork is not None
        self.history[fork] = self.history[src][:upto]
        return fork

    def rollback(self, s: int, position: int) -> None:
        """Drop s's tokens from `position` on (CELL-RM); a sequence left with nothing ends."""
        assert self.control.seq_rm(s, position)
        del self.history[s][position:]
        if not self.history[s]:
            del self.history[s]
        assert self.control.live() == set(self.history)

    def logits(self, batch: list[tuple[int, int]]) -> Any:
        """One forward of (seq id, token) pairs through the cache and the backend, layer by layer."""
        seqs, tokens = [s for s, _ in batch], [t for _, t in batch]
        assert self.control.declare_step(seqs), "CELL-DECLARE: the runner admits before it steps"
        following = {s: self.control.next_pos(s) for s in set(seqs)}
        assert all(following[s] == len(self.history[s]) for s in following), "CELL-OWNERS: next_pos"
        positions = []
        for s in seqs:                              # each sequence continues contiguously
            positions.append(following[s])
            following[s] += 1
        x = self.model.embed[tokens] + self.model.positions[positions]
        for layer in range(self.config.n_layers):
            q, k, v = self.model._qkv(layer, x)
            x = self.model._finish(layer, x, self.backend.attend(layer, positions, q, k, v))
        return x @ self.model.unembed, positions

    def run(self, batch: list[tuple[int, int]]) -> dict[int, int]:
        """A checked forward; returns each sequence's greedy next token (after its last token here)."""
        logits, positions = self.logits(batch)
        for (s, token), position in zip(batch, positions):
            assert position == len(self.history[s])
            self.history[s].append(token)
        nxt = {}
        for i, ((s, _), position) in enumerate(zip(batch, positions)):
            expected = self.model.full(self.history[s][:position + 1])[-1]
            deviation = float(np.abs(logits[i] - expected).max())
            if self.record:
                DEVIATIONS.append(deviation)
            assert deviation < TOLERANCE, f"seq {s} position {position} deviates by {deviation}"
            nxt[s] = int(np.argmax(logits[i]))
        return nxt


def test_cell_batches_with_forks_and_rollback_equal_recomputation() -> None:
    """CELL-DATA-SOUND, CELL-FORK, CELL-RM, CELL-ID-REUSE: a batch of sequences sharing prefixes, with
    speculative rollback, an ended sequence whose id is reused and a rollback into a shared prefix;
    every token's logits equal its own sequence's full recomputation (flat and ring layers)."""
    r = CellRunner("mixed", seed=21)
    a = r.new()
    pending = r.run([(a, t) for t in prompt(21, 7)])[a]             # prefill A: positions 0..6
    b, c = r.clone(a), r.clone(a, 4)                                # B shares all 7, C the first 4
    assert r.cache.free_cells() == r.config.capacity - 7            # shared, not copied
    nxt = r.run([(a, pending), (b, 3), (c, 5), (c, 8)])             # C writes two tokens in the batch
    for _ in range(3):                                              # batched greedy decode
        nxt = r.run([(s, nxt[s]) for s in (a, b, c)])
    # speculative decoding on A (3 drafts, 2 rejected) next to a decode of B in the same forward
    start = len(r.history[a])
    r.run([(a, nxt[a]), (a, 1), (a, 2), (a, 3), (b, nxt[b])])
    r.rollback(a, start + 2)                                        # keep the pending token and 1 draft
    nxt = r.run([(a, 4), (c, nxt[c])])                              # A's next token lands in a freed cell
    r.rollback(b, 0)                                                # B ends; its cells stay A's and C's
    d = r.new()
    assert d == b                                                   # the lowest id not live: reused
    nxt.update(r.run([(d, t) for t in prompt(22, 5)] + [(a, nxt[a])]))
    r.rollback(c, 2)                                                # into C's shared prefix
    for _ in range(4):
        nxt = r.run([(s, nxt.get(s, 0)) for s in sorted(r.history)])
    assert r.control.live() == set(r.history)
    assert all(r.control.seq_len(s) == r.control.next_pos(s) == len(h) for s, h in r.history.items())


def test_cell_backend_pools_grow_to_the_used_extent_only() -> None:
    r = CellRunner("mixed", seed=23)
    a = r.new()
    r.run([(a, t) for t in prompt(23, 5)])
    assert [len(pool.row_position) for pool in r.backend.pools] == [5, 5, 5, 5]   # initial_capacity 2, grown to fit
    assert all(len(pool.row_position) <= r.config.capacity for pool in r.backend.pools)


class TamperingStepper(CellStepper):
    """The cache's stepper, with a function applied to every step's mask rows (tests of the checks)."""

    def __init__(self, cache: CellCache, tamper: Any) -> None:
        self.cache, self.tamper = cache, tamper

    def place_step(self, layer: int, positions: Any) -> CellStep:
        step = self.cache.place_step(layer, positions)
        mask = bytearray(step.mask_bits)
        self.tamper(step, mask)
        return CellStep(step.length, step.read_len, step.cells, bytes(mask))


def _set(i: int, j: int, bit: int) -> Any:
    def tamper(step: CellStep, mask: bytearray) -> None:
        if i < step.length and j < step.read_len:
            mask[i * step.read_len + j] = bit
    return tamper


@pytest.mark.parametrize("how, rule", [("own cell dropped", "CELL-MASK"), ("future cell attended", "CELL-DATA-SOUND"),
                                       ("cell outside the window attended", "CELL-DATA-SOUND")])
def test_a_tampered_cell_mask_is_detected_by_the_backend(how: str, rule: str) -> None:
    """CELL-MASK, CELL-DATA-SOUND: what the backend's own tags can refute."""
    r = CellRunner("mixed", seed=25)                                 # layer 1 is a ring of window 4
    a, b = r.new(), r.new()
    r.run([(a, 1), (a, 2), (a, 3), (b, 3)])                          # A: cells 0..2 (positions 0..2); B: cell 3
    r.rollback(b, 0)                                                 # cell 3 is free again
    if how == "own cell dropped":
        r.backend.stepper = TamperingStepper(r.cache, _set(0, 3, 0))
        batch = [(a, 4)]                                             # position 3, in cell 3
    elif how == "future cell attended":
        batch = [(r.clone(a, 1), 5)]                                 # C holds position 0; writes 1 in cell 3
        r.backend.stepper = TamperingStepper(r.cache, _set(0, 2, 1))  # ... and must not see A's position 2
    else:
        r.run([(a, t) for t in (4, 5, 6)])                           # A: positions 0..5 in cells 0..5
        r.backend.stepper = TamperingStepper(r.cache, _set(0, 0, 1))  # position 6's window is [3, 6]
        batch = [(a, 7)]
    with pytest.raises(BackendError) as caught:
        r.logits(batch)
    assert caught.value.rule == rule, str(caught.value)


def test_attending_another_sequences_cell_changes_the_numbers() -> None:
    """CELL-DATA-SOUND: a mask that lets a token see another sequence's cell (inside its window, so the
    backend's tags cannot refute it) gives logits that differ from recomputation - the comparison fails."""
    r = CellRunner("mixed", seed=27)
    a, b = r.new(), r.new()
    r.run([(a, 1), (a, 2), (b, 3), (b, 4)])                          # A: cells 0, 1; B: cells 2, 3
    r.backend.stepper = TamperingStepper(r.cache, _set(0, 2, 1))     # A's token sees B's position 0
    r.record = False                                                 # a deliberate deviation: not in the report
    with pytest.raises(AssertionError, match="deviates"):
        r.run([(a, 5)])
