"""The paged-layout model (spec/paged_model.py), rule by rule, and its judges on a toy block pool.

The expected values are computed by hand from the rules' statements (the comments show how). `ToyPool` below is a
plain block pool with prefix caching and window groups, written for these tests only: driven at random, the
model's judges (`data_problems`, `table_problems`, `rewrite_problems`) find nothing wrong with it, and each of its
deliberately broken variants is found by the rule it breaks - so the judges can fail, and do not cry wolf.
"""

from __future__ import annotations

import random
from typing import Any, Optional

import pytest

from kvcache_spec import paged_model as pm
from kvcache_spec.model import INT_MAX, Rejected


def config(block_size: int = 4, num_blocks: int = 16, max_model_len: int = 64, windows: tuple[int, ...] = (0,),
           prefix_caching: bool = True) -> pm.PagedConfig:
    """windows: one group per entry, 0 = full attention, W = a window of W."""
    groups = [{"kind": "full"} if w == 0 else {"kind": "window", "window": w} for w in windows]
    made = pm.configured({"block_size": block_size, "num_blocks": num_blocks, "max_model_len": max_model_len,
                          "groups": groups, "prefix_caching": prefix_caching})
    assert isinstance(made, pm.PagedConfig), made
    return made


def admitted(state: pm.PagedState, request: str, tokens: list[int], hit: int = 0, budget: int = 1000,
             keys: tuple[str, ...] = ()) -> pm.PagedState:
    admission = pm.admit(state, request, tokens, list(keys), budget)
    assert isinstance(admission, pm.Admission), admission
    return admission.after(hit)


# --- a toy block pool (a target), and its broken variants ---------------------------------------------------

class ToyPool:
    """Blocks 0 .. N-1; per (group, keys, whole-block prefix) a cached block; ref counts; LRU eviction of
    unreferenced cached blocks; window groups release blocks out of the window before each step."""

    def __init__(self, cfg: pm.PagedConfig) -> None:
        self.cfg = cfg
        self.free_ids: list[int] = list(range(cfg.num_blocks))          # never cached, or evicted
        self.cache: dict[tuple[int, pm.Prefix], int] = {}               # (group, prefix) -> block
        self.prefix_of: dict[int, tuple[int, pm.Prefix]] = {}           # block -> its cache key
        self.refs: dict[int, int] = {}
        self.tables: dict[str, list[list[Optional[int]]]] = {}
        self.requests: dict[str, tuple[list[int], tuple[str, ...], int]] = {}   # tokens, keys, computed
        self.clock = 0
        self.used: dict[int, int] = {}                                   # block -> last time referenced

    # what the suite reads
    def available(self) -> int:
        return self.cfg.num_blocks - len(self.refs)

    def ref_counts(self) -> dict[int, int]:
        return dict(self.refs)

    def table(self, request: str) -> list[list[Optional[int]]]:
        return [list(row) for row in self.tables[request]]

    # the verbs
    def _hit(self, tokens: list[int], keys: tuple[str, ...]) -> int:
        if not self.cfg.prefix_caching:
            return 0
        size, k = self.cfg.block_size, 0
        while (k + 1) * size <= len(tokens) - 1 and all(
                (g, (keys, tuple(tokens[:(k + 1) * size]))) in self.cache for g in range(len(self.cfg.groups))):
            k += 1
        return k * size

    def _evictable(self) -> list[int]:
        return sorted((b for b in self.prefix_of if b not in self.refs), key=lambda b: self.used.get(b, 0))

    def _take(self, reused: set[int]) -> int:
        if self.free_ids:
            return self.free_ids.pop(0)
        victim = next(b for b in self._evictable() if b not in reused)
        del self.cache[self.prefix_of.pop(victim)]
        return victim

    def _reserve(self, request: str, start: int, end: int, reuse: list[list[int]]) -> bool:
        """Tables for positions start .. end - 1 (after `reuse` blocks of a hit); all or nothing."""
        size = self.cfg.block_size
        old = self.tables.get(request, [[] for _ in self.cfg.groups])
        rows = [list(row) or list(hit) for row, hit in zip(old, reuse)]
        wanted = sum(max(0, -(-end // size) - len(row)) for row in rows)
        reused = {b for hit in reuse for b in hit if b not in self.refs}
        if wanted > self.available() - len(reused):
            return False
        for row in rows:
            while len(row) < -(-end // size):
                row.append(self._take(reused))
        for row, before in zip(rows, old):
            for block in row[len(before):]:
                if block is not None:
                    self.refs[block] = self.refs.get(block, 0) + 1
        self.tables[request] = rows
        return True

    def _step_done(self, request: str) -> None:
        tokens, keys, computed = self.requests[request]
        self.clock += 1
        for g, row in enumerate(self.tables[request]):
            for index in range(computed // self.cfg.block_size):
                block = row[index]
                if block is not None:
                    self.used[block] = self.clock
                    key = (g, (keys, tuple(tokens[:(index + 1) * self.cfg.block_size])))
                    if self.cfg.prefix_caching and key not in self.cache and block not in self.prefix_of:
                        self.cache[key] = block
                        self.prefix_of[block] = key

    def _release_window(self, request: str) -> None:
        computed = self.requests[request][2]
        for g, kind in enumerate(self.cfg.groups):
            row = self.tables[request][g]
            for index in range(len(row)):
                if row[index] is not None and (index + 1) * self.cfg.block_size <= pm.needed(kind, computed).start:
                    self._unref(row[index])
                    row[index] = None

    def _unref(self, block: Optional[int]) -> None:
        if block is None:
            return
        self.refs[block] -= 1
        if self.refs[block] == 0:
            del self.refs[block]
            if block not in self.prefix_of:
                self.free_ids.append(block)

    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        hit = self._hit(tokens, tuple(keys))
        size = self.cfg.block_size
        reuse = [[self.cache[(g, (tuple(keys), tuple(tokens[:(k + 1) * size])))] for k in range(hit // size)]
                 for g in range(len(self.cfg.groups))]
        n = min(len(tokens) - hit, budget)
        if not self._reserve(request, hit, hit + n, reuse):
            return None
        self.requests[request] = (list(tokens), tuple(keys), hit + n)
        self._step_done(request)
        return hit

    def extend(self, request: str, tokens: list[int], budget: int) -> Optional[int]:
        old, keys, computed = self.requests[request]
        total = old + list(tokens)
        n = min(len(total) - computed, budget)
        if not self._reserve(request, computed, computed + n, [[] for _ in self.cfg.groups]):
            return None
        self._release_window(request)           # what the step reads is still held: needed(computed) is
        self.requests[request] = (total, keys, computed + n)
        self._step_done(request)
        return n

    def free(self, request: str) -> None:
        for row in self.tables.pop(request):
            for block in row:
                self._unref(block)
        del self.requests[request]


class Runner:
    """The suite's part: drives the pool and the model in step, writes the values, judges every observation."""

    def __init__(self, cfg: pm.PagedConfig, pool: Any) -> None:
        self.cfg, self.pool, self.state = cfg, pool, pm.initial(cfg)
        self.memory: dict[pm.Slot, int] = {}
        self.hits = self.refusals = 0                   # what a program exercised

    def tables(self) -> dict[str, pm.Table]:
        return {request: self.pool.table(request) for request in self.state.live}

    def judge(self, stepped: Optional[tuple[str, int]] = None) -> list[pm.Problem]:
        tables = self.tables()
        return (pm.table_problems(self.state, tables, self.pool.available(), self.pool.ref_counts())
                + pm.data_problems(self.state, tables, self.memory, stepped))

    def _write(self, request: str, step_from: int) -> list[pm.Problem]:
        tables = self.tables()
        planned = pm.writes(self.state, request, tables[request], step_from)
        if isinstance(planned, tuple):
            return [planned]
        problems = pm.rewrite_problems(self.state, tables, planned, (request, step_from))
        self.memory.update(planned)
        return problems + self.judge((request, step_from))

    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> list[pm.Problem]:
        admission = pm.admit(self.state, request, tokens, keys, budget)
        assert isinstance(admission, pm.Admission)
        before = (self.pool.available(), self.pool.ref_counts())
        hit = self.pool.admit(request, tokens, keys, budget)
        self.hits += bool(hit)
        if hit is None:
            self.refusals += 1
            changed = (self.pool.available(), self.pool.ref_counts()) != before
            return ([("PAGED-IDLE-FIT", request)] if admission.must_fit else []) + (
                [("PAGED-ATOMIC", request)] if changed else [])
        if not admission.allows(hit):
            return [("PAGED-HIT", f"{request}: {hit} > {admission.max_hit}")]
        self.state = admission.after(hit)
        return self._write(request, hit)

    def extend(self, request: str, tokens: list[int], budget: int) -> list[pm.Problem]:
        extension = pm.extend(self.state, request, tokens, budget)
        assert isinstance(extension, pm.Extension)
        step_from = self.state.live[request].computed
        n = self.pool.extend(request, tokens, budget)
        if n is None:
            return [("PAGED-IDLE-FIT", request)] if extension.must_fit else []
        if n != extension.n:
            return [("PAGED-RESERVE", f"{request}: n {n} != {extension.n}")]
        self.state = extension.after
        return self._write(request, step_from)

    def free(self, request: str) -> list[pm.Problem]:
        after = pm.free(self.state, request)
        assert isinstance(after, pm.PagedState)
        self.pool.free(request)
        self.state = after
        return self.judge()


def random_program(runner: Runner, rng: random.Random, calls: int = 60) -> list[pm.Problem]:
    """Requests sharing and diverging prefixes (three stems, two key sets), chunked prefill, decode, frees."""
    stems = [[rng.randrange(3) for _ in range(12)] for _ in range(3)]
    problems: list[pm.Problem] = []
    names = iter(f"r{i}" for i in range(10**6))
    for _ in range(calls):
        live = sorted(runner.state.live)
        roll = rng.random()
        if roll < 0.35 or not live:
            stem = rng.choice(stems)
            tokens = stem[:rng.randrange(1, len(stem) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(3))]
            problems += runner.admit(next(names), tokens[:runner.cfg.max_model_len], rng.choice([[], ["lora"]]),
                                     rng.randrange(1, 9))
        elif roll < 0.8:
            request = rng.choice(live)
            entry = runner.state.live[request]
            tokens = [] if entry.computed < len(entry.tokens) else [rng.randrange(3)]
            if len(entry.tokens) + len(tokens) <= runner.cfg.max_model_len:
                problems += runner.extend(request, tokens, rng.randrange(1, 6))
        else:
            problems += runner.free(rng.choice(live))
        if problems:
            return problems
    return problems


CONFIGS = [dict(block_size=2, num_blocks=12, windows=(0,)), dict(block_size=4, num_blocks=10, windows=(0, 5)),
           dict(block_size=1, num_blocks=9, windows=(3,)), dict(block_size=2, num_blocks=14, windows=(0, 2),
                                                               prefix_caching=False)]


@pytest.mark.parametrize("shape", CONFIGS, ids=lambda shape: str(shape["windows"]))
def test_PAGED_DATA_SOUND_the_judges_find_nothing_wrong_with_a_faithful_pool(shape: dict[str, Any]) -> None:
    """Forty random programs each, over pools small enough to evict: no problem from any judge (PAGED-DATA-SOUND,
    PAGED-CONSERVE, PAGED-REFCOUNT, PAGED-SHARE-FULL, PAGED-NO-REWRITE, PAGED-HIT, PAGED-IDLE-FIT)."""
    cfg = config(max_model_len=24, **shape)
    hits = refusals = 0
    for seed in range(40):
        runner = Runner(cfg, ToyPool(cfg))
        assert random_program(runner, random.Random(seed)) == [], seed
        hits, refusals = hits + runner.hits, refusals + runner.refusals
    assert (hits > 20) == cfg.prefix_caching and refusals > 20      # the programs hit, and press on the pool


# --- the broken pools: each found by its rule ---------------------------------------------------------------

class StaleHit(ToyPool):
    """Eviction forgets to drop the cache entry: a reused block is hit as the prefix it held before."""

    def _take(self, reused: set[int]) -> int:
        if self.free_ids:
            return self.free_ids.pop(0)
        victim = next(b for b in self._evictable() if b not in reused)
        del self.prefix_of[victim]                    # the cache entry stays
        return victim


class EvictsInUse(ToyPool):
    """Under pressure takes the oldest cached block even when a live table holds it."""

    def _take(self, reused: set[int]) -> int:
        if self.free_ids:
            return self.free_ids.pop(0)
        victim = min(self.prefix_of, key=lambda b: self.used.get(b, 0))
        del self.cache[self.prefix_of.pop(victim)]
        return victim


class ReleasesEarly(ToyPool):
    """The window group releases the block holding the oldest position the next query still reads."""

    def _release_window(self, request: str) -> None:
        computed = self.requests[request][2]
        for g, kind in enumerate(self.cfg.groups):
            row = self.tables[request][g]
            for index in range(len(row)):
                # the faithful pool's test is (index + 1) * B <= start: this one is a position early
                if isinstance(kind, pm.WindowGroup) and row[index] is not None \
                        and (index + 1) * self.cfg.block_size <= pm.needed(kind, computed).start + 1:
                    self._unref(row[index])
                    row[index] = None


class LeaksOnRefusal(ToyPool):
    """A refused reservation keeps the blocks it took before finding the pool short."""

    def _reserve(self, request: str, start: int, end: int, reuse: list[list[int]]) -> bool:
        if not super()._reserve(request, start, end, reuse):
            if self.free_ids:
                self.refs[self.free_ids.pop(0)] = 1
            return False
        return True


class DoubleFree(ToyPool):
    """free drops every reference twice (a shared block goes back while another request holds it)."""

    def _unref(self, block: Optional[int]) -> None:
        if block is not None and block in self.refs:
            self.refs[block] = max(1, self.refs[block] - 1)
            super()._unref(block)


class RefusesAll(ToyPool):
    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        return None


class HashesBlockAlone(ToyPool):
    """Caches a block under its own tokens only, ignoring what comes before it and the keys."""

    def _hit(self, tokens: list[int], keys: tuple[str, ...]) -> int:
        size, k = self.cfg.block_size, 0
        while (k + 1) * size <= len(tokens) - 1 and all(
                any(key[0] == g and key[1][1][-size:] == tuple(tokens[k * size:(k + 1) * size])
                    and len(key[1][1]) == (k + 1) * size for key in self.cache) for g in range(len(self.cfg.groups))):
            k += 1
        return k * size

    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        size = self.cfg.block_size
        hit = self._hit(tokens, tuple(keys))
        for k in range(hit // size):
            for g in range(len(self.cfg.groups)):
                key = next(key for key in self.cache if key[0] == g and len(key[1][1]) == (k + 1) * size
                           and key[1][1][-size:] == tuple(tokens[k * size:(k + 1) * size]))
                self.cache[(g, (tuple(keys), tuple(tokens[:(k + 1) * size])))] = self.cache[key]
        return super().admit(request, tokens, keys, budget)


def first_finding(pool_class: type[ToyPool], shape: dict[str, Any], seeds: int = 200) -> set[str]:
    """The rules the first failing random program names (empty when none fails in `seeds` programs)."""
    cfg = config(max_model_len=24, **shape)
    for seed in range(seeds):
        problems = random_program(Runner(cfg, pool_class(cfg)), random.Random(seed))
        if problems:
            return {rule for rule, _ in problems}
    return set()


def test_PAGED_EVICT_a_stale_hit_after_reuse_is_found_by_the_data() -> None:
    assert "PAGED-DATA-SOUND" in first_finding(StaleHit, dict(block_size=2, num_blocks=6, windows=(0,)))


def test_PAGED_EVICT_an_in_use_block_evicted_is_found() -> None:
    found = first_finding(EvictsInUse, dict(block_size=2, num_blocks=6, windows=(0,)))
    assert found & {"PAGED-NO-REWRITE", "PAGED-SHARE-FULL"}, found


def test_PAGED_WINDOW_RELEASE_a_block_released_one_early_is_found() -> None:
    assert first_finding(ReleasesEarly, dict(block_size=2, num_blocks=14, windows=(0, 3))) == {"PAGED-WINDOW-RELEASE"}


def test_PAGED_ATOMIC_a_refusal_that_keeps_a_block_is_found() -> None:
    assert "PAGED-ATOMIC" in first_finding(LeaksOnRefusal, dict(block_size=2, num_blocks=6, windows=(0,)))


def test_PAGED_FREE_a_double_release_is_found_by_the_counts() -> None:
    found = first_finding(DoubleFree, dict(block_size=2, num_blocks=12, windows=(0,)))
    assert found & {"PAGED-REFCOUNT", "PAGED-CONSERVE"}, found


def test_PAGED_IDLE_FIT_a_pool_that_refuses_everything_is_wrong() -> None:
    assert first_finding(RefusesAll, dict(block_size=2, num_blocks=12, windows=(0,))) == {"PAGED-IDLE-FIT"}


def test_PAGED_HIT_a_block_hashed_alone_serves_another_prefix() -> None:
    found = first_finding(HashesBlockAlone, dict(block_size=2, num_blocks=12, windows=(0,)))
    assert found & {"PAGED-HIT", "PAGED-DATA-SOUND"}, found


# --- configuration (PAGED-CONFIG) ---------------------------------------------------------------------------

GOOD = {"block_size": 4, "num_blocks": 8, "max_model_len": 32, "groups": [{"kind": "full"}], "prefix_caching": True}


@pytest.mark.parametrize("change, argument", [
    ({"block_size": 0}, "block_size"), ({"block_size": True}, "block_size"), ({"num_blocks": -1}, "num_blocks"),
    ({"num_blocks": INT_MAX + 1}, "num_blocks"), ({"max_model_len": 2.0}, "max_model_len"),
    ({"groups": []}, "groups"), ({"groups": {"kind": "full"}}, "groups"),
    ({"groups": [{"kind": "window", "window": 0}]}, "groups[0].window"),
    ({"groups": [{"kind": "full"}, {"kind": "window", "window": False}]}, "groups[1].window"),
    ({"groups": [{"kind": "ring", "window": 2}]}, "groups[0]"), ({"groups": [{"kind": "full", "window": 2}]}, "groups[0]"),
    ({"groups": ["full"]}, "groups[0]"), ({"prefix_caching": 1}, "prefix_caching"), ({"blocksize": 4}, "blocksize"),
])
def test_PAGED_CONFIG_a_bad_configuration_is_refused_naming_the_key(change: dict[str, Any], argument: str) -> None:
    assert pm.configured({**GOOD, **change}) == Rejected("PAGED-CONFIG", argument)


def test_PAGED_CONFIG_a_missing_key_and_a_good_configuration() -> None:
    assert pm.configured({k: v for k, v in GOOD.items() if k != "groups"}) == Rejected("PAGED-CONFIG", "groups")
    assert pm.configured([]) == Rejected("PAGED-CONFIG", "config")  # type: ignore[arg-type]
    made = pm.configured({**GOOD, "groups": [{"kind": "full"}, {"kind": "window", "window": 3}]})
    assert made == pm.PagedConfig(4, 8, 32, (pm.FullGroup(), pm.WindowGroup(3)), True)


# --- the argument contract (PAGED-ARGS) ---------------------------------------------------------------------

@pytest.mark.parametrize("request_id, tokens, keys, budget, argument", [
    (1, [1], [], 1, "request"), ("a", [1], [], 1, "request"),                      # "a" is live
    (type("Name", (str,), {})("b"), [1], [], 1, "request"), ("b", [1], [type("Key", (str,), {})("k")], 1, "keys"),
    ("b", [], [], 1, "tokens"), ("b", [True], [], 1, "tokens"), ("b", [-1], [], 1, "tokens"),
    ("b", [INT_MAX + 1], [], 1, "tokens"), ("b", ["1"], [], 1, "tokens"), ("b", "12", [], 1, "tokens"),
    ("b", [1.0], [], 1, "tokens"), ("b", [0] * 33, [], 1, "tokens"),               # longer than max_model_len 32
    ("b", [1], "k", 1, "keys"), ("b", [1], [1], 1, "keys"), ("b", [1], None, 1, "keys"),
    ("b", [1], [], 0, "budget"), ("b", [1], [], True, "budget"), ("b", [1], [], -3, "budget"),
    ("b", [1], [], INT_MAX + 1, "budget"), ("b", [1], [], 2.0, "budget"),
])
def test_PAGED_ARGS_a_malformed_admit_is_refused_naming_the_argument(request_id: Any, tokens: Any, keys: Any,
                                                                     budget: Any, argument: str) -> None:
    state = admitted(pm.initial(config(max_model_len=32)), "a", [1, 2])
    assert pm.admit(state, request_id, tokens, keys, budget) == Rejected("PAGED-ARGS", argument)


@pytest.mark.parametrize("request_id, tokens, budget, argument", [
    ("zz", [1], 1, "request"), (None, [1], 1, "request"), ("a", [True], 1, "tokens"), ("a", [-2], 1, "tokens"),
    ("a", (1, "x"), 1, "tokens"), ("a", [], 1, "tokens"),                          # nothing left to compute
    ("a", [0] * 31, 1, "tokens"),                                                  # 2 + 31 > 32
    ("a", [1], 0, "budget"), ("a", [1], False, "budget"), ("a", [1], INT_MAX + 1, "budget"),
])
def test_PAGED_ARGS_a_malformed_extend_is_refused_naming_the_argument(request_id: Any, tokens: Any, budget: Any,
                                                                      argument: str) -> None:
    state = admitted(pm.initial(config(max_model_len=32)), "a", [1, 2])
    assert pm.extend(state, request_id, tokens, budget) == Rejected("PAGED-ARGS", argument)
    assert pm.lookup(state, "zz") == Rejected("PAGED-ARGS", "request") and pm.lookup(state, "a") == state.live["a"]


def test_PAGED_ATOMIC_the_model_is_pure_a_rejected_call_leaves_the_state_as_it_was() -> None:
    state = admitted(pm.initial(config()), "a", [1, 2, 3])
    snapshot = (dict(state.live), state.cached)
    for call in (lambda: pm.admit(state, "a", [1], [], 1), lambda: pm.extend(state, "a", [True], 1),
                 lambda: pm.free(state, "b"), lambda: pm.admit(state, "b", [1, 2], [], 1)):
        call()
        assert (dict(state.live), state.cached) == snapshot


# --- reservations and hits ---------------------------------------------------------------------------------

def test_PAGED_RESERVE_n_is_the_budget_or_what_is_left() -> None:
    state = pm.initial(config())
    admission = pm.admit(state, "a", list(range(10)), [], 4)
    assert isinstance(admission, pm.Admission) and admission.n(0) == 4      # min(10 - 0, 4)
    state = admission.after(0)
    extension = pm.extend(state, "a", [], 100)
    assert isinstance(extension, pm.Extension) and extension.n == 6         # chunked prefill: the other 6
    extension = pm.extend(extension.after, "a", [7, 7], 1)
    assert isinstance(extension, pm.Extension) and extension.n == 1 and extension.after.live["a"].computed == 11
    assert extension.after.live["a"].tokens == tuple(range(10)) + (7, 7)


def test_PAGED_RESERVE_a_table_without_a_block_for_a_reserved_position_is_found() -> None:
    state = admitted(pm.initial(config()), "a", list(range(6)))
    assert pm.writes(state, "a", [[0]], 0) == ("PAGED-RESERVE", "position 4 of group 0 has no block")
    assert len(pm.writes(state, "a", [[0, 1]], 0)) == 6


def test_PAGED_HIT_identical_prefix_and_keys_only_whole_blocks_and_never_the_last_token() -> None:
    state = admitted(pm.initial(config(block_size=4)), "a", list(range(12)), keys=("lora",))
    def hit(tokens: list[int], keys: list[str]) -> int:
        admission = pm.admit(state, "b", tokens, keys, 1)
        assert isinstance(admission, pm.Admission)
        return admission.max_hit
    assert hit(list(range(12)), ["lora"]) == 8            # 12 cached, but the last token is computed: 8
    assert hit(list(range(13)), ["lora"]) == 12
    assert hit(list(range(13)), []) == 0                  # other keys
    assert hit(list(range(13)), ["lora", ""]) == 0
    assert hit([0, 1, 2, 3, 4, 9, 6, 7, 8], ["lora"]) == 4    # diverges inside block 1
    assert hit([5] + list(range(1, 13)), ["lora"]) == 0


def test_PAGED_HIT_only_computed_whole_blocks_are_hittable_and_they_outlive_their_request() -> None:
    state = pm.initial(config(block_size=4))
    admission = pm.admit(state, "a", list(range(12)), [], 6)    # chunked: positions 0..5 computed
    assert isinstance(admission, pm.Admission)
    state = admission.after(0)
    again = pm.admit(state, "b", list(range(12)), [], 1)
    assert isinstance(again, pm.Admission) and again.max_hit == 4       # block 1 is not full yet
    freed = pm.free(state, "a")
    assert isinstance(freed, pm.PagedState)
    again = pm.admit(freed, "b", list(range(12)), [], 1)
    assert isinstance(again, pm.Admission) and again.max_hit == 4
    assert again.allows(4) and again.allows(0) and not again.allows(2) and not again.allows(8)
    assert not again.allows(True)
    with pytest.raises(ValueError, match="PAGED-HIT"):
        again.after(8)
    off = admitted(pm.initial(config(prefix_caching=False)), "a", list(range(12)))
    admission = pm.admit(off, "b", list(range(12)), [], 1)
    assert isinstance(admission, pm.Admission) and admission.max_hit == 0


def test_PAGED_HIT_GROUPS_after_a_hit_every_group_holds_what_the_step_reads() -> None:
    """Window 3, blocks of 2: a hit h = 4 and a step computing 4..5 read positions 2..5 on the window group."""
    cfg = config(block_size=2, windows=(0, 3))
    assert pm.step_reads(cfg.groups[1], 4, 6) == range(2, 6) and pm.step_reads(cfg.groups[0], 4, 6) == range(0, 6)
    state = admitted(pm.initial(cfg), "a", [1, 2, 3, 4, 5])
    state = admitted(state, "b", [1, 2, 3, 4, 6, 6], hit=4)
    memory: dict[pm.Slot, int] = {}
    for request, table in (("a", [[0, 1, 2], [3, 4, 5]]), ("b", [[0, 1, 6], [None, 4, 7]])):
        planned = pm.writes(state, request, table, 0 if request == "a" else 4)
        assert isinstance(planned, list)
        memory.update(planned)
    tables = {"a": [[0, 1, 2], [3, 4, 5]], "b": [[0, 1, 6], [None, 4, 7]]}
    assert pm.data_problems(state, tables, memory, ("b", 4)) == []
    # the window group hit only block 2 (positions 4, 5): position 2, read by the query at 4, is missing
    tables["b"] = [[0, 1, 6], [None, None, 7]]
    assert pm.data_problems(state, tables, memory, ("b", 4)) == [
        ("PAGED-WINDOW-RELEASE", "request 'b', group 1, position 2: no block"),
        ("PAGED-WINDOW-RELEASE", "request 'b', group 1, position 3: no block")]


# --- the ground truth --------------------------------------------------------------------------------------

def test_PAGED_DATA_SOUND_fingerprints_depend_on_the_whole_prefix_and_the_keys() -> None:
    base = pm.fingerprints(["lora"], [1, 2, 3])
    assert len(base) == 3 and len(set(base)) == 3
    assert pm.fingerprints(["lora"], [1, 2, 3, 4])[:3] == base                 # a position sees only its prefix
    assert pm.fingerprints(["lora"], [9, 2, 3])[1:] != base[1:]               # an earlier token changes it
    assert all(a != b for a, b in zip(pm.fingerprints(["lorb"], [1, 2, 3]), base))
    assert pm.fingerprints(["a", "b"], [1]) != pm.fingerprints(["ab"], [1]) != pm.fingerprints([], [1])
    assert pm.fingerprints([], []) == [] and all(0 <= v < 2**63 for v in base)
    assert pm.fingerprint_next(pm.fingerprint_seed(["lora"]), 1) == base[0]


def test_PAGED_DATA_SOUND_attended_and_needed() -> None:
    full, window = pm.FullGroup(), pm.WindowGroup(3)
    assert pm.attended(full, 4) == range(0, 5) and pm.attended(window, 4) == range(2, 5)
    assert pm.attended(window, 1) == range(0, 2) and pm.attended(pm.WindowGroup(1), 4) == range(4, 5)
    assert pm.needed(full, 4) == range(0, 4) and pm.needed(window, 4) == range(2, 4) and pm.needed(window, 0) == range(0)


def test_PAGED_DATA_SOUND_another_value_in_a_slot_is_found() -> None:
    state = admitted(pm.initial(config(block_size=2)), "a", [1, 2, 3])
    planned = pm.writes(state, "a", [[0, 1]], 0)
    assert isinstance(planned, list)
    memory = dict(planned)
    assert pm.data_problems(state, {"a": [[0, 1]]}, memory) == []
    memory[(0, 1, 0)] = pm.fingerprints([], [1, 2, 4])[2]                   # a sibling prefix's K/V
    assert pm.data_problems(state, {"a": [[0, 1]]}, memory) == [
        ("PAGED-DATA-SOUND", "request 'a', group 0, position 2: block 1 holds another value")]
    assert pm.data_problems(state, {"a": [[0]]}, memory)[0][0] == "PAGED-DATA-SOUND"      # no block: full group


# --- bookkeeping -------------------------------------------------------------------------------------------

def two_sharing() -> pm.PagedState:
    """a and b share block 0 (positions 0, 1, full for both); b computed 3 positions, a 4."""
    state = admitted(pm.initial(config(block_size=2, num_blocks=6)), "a", [1, 2, 3, 4])
    return admitted(state, "b", [1, 2, 5], hit=2)


def test_PAGED_SHARE_FULL_only_full_blocks_at_one_index_are_shared() -> None:
    state = two_sharing()
    assert pm.table_problems(state, {"a": [[0, 1]], "b": [[0, 2]]}, 3) == []
    assert pm.table_problems(state, {"a": [[0, 1]], "b": [[0, 1]]}, 4)[0][0] == "PAGED-SHARE-FULL"   # b's block 1 partial
    assert pm.table_problems(state, {"a": [[0, 1]], "b": [[1, 2]]}, 3)[0][0] == "PAGED-SHARE-FULL"   # another index


def test_PAGED_DATA_SOUND_a_table_entry_that_is_no_block_id_maps_nowhere() -> None:
    state = two_sharing()
    memory = dict(pm.writes(state, "a", [[0, 1]], 0) + pm.writes(state, "b", [[0, 2]], 2))   # type: ignore[operator]
    odd: dict[str, pm.Table] = {"a": [[0, True]], "b": [[0, "2"]]}                         # type: ignore[list-item]
    assert pm.table_problems(state, odd, 5) == [
        ("PAGED-DATA-SOUND", "request 'a', group 0: block index 1 holds True, not a block id (an int) or None"),
        ("PAGED-DATA-SOUND", "request 'b', group 0: block index 1 holds '2', not a block id (an int) or None")]
    assert [rule for rule, _ in pm.data_problems(state, odd, memory)] == ["PAGED-DATA-SOUND"] * 3
    assert pm.data_problems(state, {"a": [[0, 1]], "b": [[0, 2]]}, memory) == []
    assert pm.data_problems(state, odd, memory, only={"b"}) == [
        ("PAGED-DATA-SOUND", "request 'b', group 0, position 2: no block")]


def test_PAGED_CONSERVE_available_plus_held_is_the_pool() -> None:
    state = two_sharing()
    assert pm.table_problems(state, {"a": [[0, 1]], "b": [[0, 2]]}, 4) == [
        ("PAGED-CONSERVE", "available 4 + held 3 != 6 blocks")]


def test_PAGED_REFCOUNT_counts_are_the_tables_holding_each_block() -> None:
    state = two_sharing()
    tables = {"a": [[0, 1]], "b": [[0, 2]]}
    assert pm.table_problems(state, tables, 3, {0: 2, 1: 1, 2: 1}) == []
    assert pm.table_problems(state, tables, 3, {0: 1, 1: 1, 2: 1}) == [
        ("PAGED-REFCOUNT", "blocks [0]: counts differ from the live tables holding them")]
    assert pm.table_problems(state, tables, 3, {0: 2, 1: 1, 2: 1, 5: 1})[0][0] == "PAGED-REFCOUNT"


def test_PAGED_NO_REWRITE_a_write_into_a_slot_another_request_holds_is_found() -> None:
    state = admitted(pm.initial(config(block_size=2, num_blocks=6)), "a", [1, 2, 3])
    state = admitted(state, "b", [7, 8])
    tables: dict[str, pm.Table] = {"a": [[0, 1]], "b": [[1]]}       # b given a's partly filled block 1
    planned = pm.writes(state, "b", tables["b"], 0)
    assert isinstance(planned, list)
    assert pm.rewrite_problems(state, tables, planned, ("b", 0)) == [
        ("PAGED-NO-REWRITE", "slot (0, 1, 0) holds position 2 of 'a', still needed")]
    assert pm.rewrite_problems(state, {"a": [[0, 1]], "b": [[2]]}, pm.writes(state, "b", [[2]], 0),
                               ("b", 0)) == []


def test_PAGED_WINDOW_RELEASE_only_blocks_before_the_window_and_nothing_on_a_full_group() -> None:
    cfg = config(block_size=2, num_blocks=12, windows=(0, 3))
    state = admitted(pm.initial(cfg), "a", [1, 2, 3, 4, 5, 6, 7])        # needed on the window group: 5, 6
    planned = pm.writes(state, "a", [[0, 1, 2, 3], [4, 5, 6, 7]], 0)
    assert isinstance(planned, list)
    memory = dict(planned)
    released = {"a": [[0, 1, 2, 3], [None, None, 6, 7]]}                # blocks 0, 1: positions 0..3 < 5
    assert pm.data_problems(state, released, memory) == []
    assert pm.table_problems(state, released, 6) == []
    early = {"a": [[0, 1, 2, 3], [None, None, None, 7]]}                 # block 2 holds position 5: still read
    assert pm.data_problems(state, early, memory) == [
        ("PAGED-WINDOW-RELEASE", "request 'a', group 1, position 5: no block")]
    on_full = {"a": [[None, 1, 2, 3], [None, None, 6, 7]]}
    assert pm.table_problems(state, on_full, 7)[0] == (
        "PAGED-WINDOW-RELEASE", "request 'a', full group 0: block index 0 released")


def test_PAGED_FREE_unknown_and_double_frees_are_refused_and_the_prefix_stays_hittable() -> None:
    state = admitted(pm.initial(config(block_size=2)), "a", [1, 2, 3])
    freed = pm.free(state, "a")
    assert isinstance(freed, pm.PagedState) and dict(freed.live) == {} and freed.cached == state.cached
    assert pm.free(freed, "a") == Rejected("PAGED-FREE", "request")
    assert pm.free(state, "never") == Rejected("PAGED-FREE", "request")
    assert pm.free(state, 7) == Rejected("PAGED-FREE", "request")


def test_PAGED_IDLE_FIT_a_refusal_is_wrong_only_on_an_idle_pool_that_fits() -> None:
    cfg = config(block_size=4, num_blocks=6, windows=(0, 8))          # two groups: 3 blocks of each at most
    state = pm.initial(cfg)
    fits = pm.admit(state, "a", list(range(12)), [], 100)              # 2 groups x 3 blocks = 6 <= 6
    too_big = pm.admit(state, "a", list(range(13)), [], 100)           # 2 x 4 = 8 > 6
    chunk = pm.admit(state, "a", list(range(20)), [], 12)              # the chunk fits, the whole prompt not
    first = pm.admit(state, "a", list(range(12)), [], 4)               # a first chunk of a prompt that fits
    assert isinstance(fits, pm.Admission) and fits.must_fit
    assert isinstance(too_big, pm.Admission) and not too_big.must_fit
    assert isinstance(chunk, pm.Admission) and not chunk.must_fit     # a futile chunked prefill: may be refused
    assert isinstance(first, pm.Admission) and first.must_fit
    busy = admitted(state, "b", [9])
    other = pm.admit(busy, "a", [1], [], 1)
    assert isinstance(other, pm.Admission) and not other.must_fit      # another request is live: policy
    alone = pm.extend(chunk.after(0), "a", [], 4)
    assert isinstance(alone, pm.Extension) and not alone.must_fit      # 16 positions: 2 x 4 blocks > 6
    assert pm.fits_idle(cfg, 12) and not pm.fits_idle(cfg, 13) and pm.blocks_to_hold(cfg, 13) == 8


def test_PAGED_ATOMIC_a_refusal_may_only_release_window_blocks_out_of_every_needed_window() -> None:
    cfg = config(block_size=2, num_blocks=8, windows=(0, 3))          # a full group and a window of 3
    before = [[0, 1, 2], [3, 4, 5]]                                   # 5 positions computed: the window needs 3, 4
    assert pm.released_only(cfg, 5, before, [[0, 1, 2], [None, 4, 5]])        # block index 0: positions 0, 1
    assert not pm.released_only(cfg, 5, before, [[0, 1, 2], [None, None, 5]])  # index 1 holds position 3
    assert not pm.released_only(cfg, 5, before, [[0, 1, None], [3, 4, 5]])     # a full group releases nothing
    assert not pm.released_only(cfg, 5, before, [[0, 1, 2], [6, 4, 5]])       # another block is no release
    assert not pm.released_only(cfg, 5, before, [[0, 1, 2], [3, 4]])          # nor a shorter table
    assert pm.released_only(cfg, 5, before, before)
