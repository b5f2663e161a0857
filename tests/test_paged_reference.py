"""The paged reference (`kvcache.paged.PagedCache`) judged by its own invariants and by a brute-force data check.

Random programs of admit / extend / free over small pools (prompts built from a few shared stems, so prefixes
are shared, diverge inside and at block edges, and are re-admitted after eviction; pools small enough that
reservations evict and are refused) run with the reference's contracts on, and `paged_judge.Judge` acts as the
model runner: it writes each reserved position's exact content and reads every live request's tables back.
Then every malformed call: its typed error, the argument and rule it names, and nothing changed.
The stand-ins at the end show the judge alone (contracts bypassed) catches each kind of broken bookkeeping.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Callable, Optional

import icontract
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kvcache
from kvcache import _paged_cache, _paged_pool
from kvcache.paged import PagedCache
from tests.paged_judge import Judge, Wrong

STEMS = ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 9, 9, 9, 9], [5, 5, 5, 5, 5, 5, 5, 5])
GROUPS = ([{"kind": "full"}], [{"kind": "window", "window": 1}], [{"kind": "window", "window": 3}],
          [{"kind": "full"}, {"kind": "window", "window": 2}], [{"kind": "window", "window": 5}, {"kind": "full"}])


def config(block_size: int = 2, num_blocks: int = 8, groups: Optional[list[dict[str, Any]]] = None,
           prefix_caching: bool = True, max_model_len: int = 24) -> dict[str, Any]:
    return {"block_size": block_size, "num_blocks": num_blocks, "max_model_len": max_model_len,
            "groups": [{"kind": "full"}] if groups is None else groups, "prefix_caching": prefix_caching}


configs = st.builds(config, block_size=st.integers(1, 4), num_blocks=st.integers(1, 14),
                    groups=st.sampled_from(GROUPS), prefix_caching=st.booleans(), max_model_len=st.integers(4, 14))
prompts = st.builds(lambda stem, cut, tail: STEMS[stem][:cut] + tail, st.integers(0, len(STEMS) - 1),
                    st.integers(0, 8), st.lists(st.integers(0, 3), max_size=3))
ops = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.integers(0, 3), prompts, st.sampled_from([[], ["lora-a"]]), st.integers(1, 6)),
    st.tuples(st.just("extend"), st.integers(0, 3), st.lists(st.integers(0, 3), max_size=2), st.integers(1, 3)),
    st.tuples(st.just("free"), st.integers(0, 3))), max_size=30)


def run(judge: Judge, program: list[tuple[Any, ...]], max_model_len: int) -> None:
    """Play a program, skipping the calls that would be malformed (those are tested below)."""
    for op in program:
        name = f"r{op[1]}"
        if op[0] == "admit" and name not in judge.live and 1 <= len(op[2]) <= max_model_len:
            judge.admit(name, op[2], op[3], op[4])
        elif op[0] == "extend" and name in judge.live:
            request = judge.live[name]
            total = len(request.tokens) + len(op[2])
            if total <= max_model_len and total > request.computed:
                judge.extend(name, op[2], op[3])
        elif op[0] == "free" and name in judge.live:
            judge.free(name)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, program=ops)
def test_random_programs_keep_the_data_and_the_books(cfg: dict[str, Any], program: list[tuple[Any, ...]]) -> None:
    """PAGED-DATA-SOUND, PAGED-HIT, PAGED-RESERVE, PAGED-CONSERVE, PAGED-REFCOUNT, PAGED-SHARE-FULL, PAGED-ATOMIC,
    PAGED-FREE, PAGED-WINDOW-RELEASE, PAGED-NO-REWRITE, PAGED-IDLE-FIT: the reference (contracts on) and the judge
    agree on every step of a random program."""
    judge = Judge(PagedCache(cfg), cfg)
    run(judge, program, cfg["max_model_len"])
    judge.check()


def test_a_shared_prefix_is_hit_whole_blocks_and_the_last_token_is_computed() -> None:
    """PAGED-HIT, PAGED-REFCOUNT: as observed in vLLM with B = 4, a 12-token prefix is hit by a second request
    (three shared blocks, count 2), and a prompt equal to 12 cached tokens hits 8."""
    cfg = config(block_size=4, num_blocks=16, max_model_len=32)
    judge = Judge(PagedCache(cfg), cfg)
    prefix = list(range(12))
    assert judge.admit("a", prefix + [50, 51], [], 100) == 0
    assert judge.admit("b", prefix + [60], [], 100) == 12
    assert sorted(judge.cache.ref_counts().values()).count(2) == 3
    assert judge.admit("c", prefix, [], 100) == 8
    assert judge.admit("d", prefix + [60], ["other-adapter"], 100) == 0   # other keys: no hit


def test_evicted_blocks_are_never_hit_and_freed_ones_are_until_evicted() -> None:
    """PAGED-EVICT: a freed request's blocks stay hittable; once taken for another prompt they are not."""
    cfg = config(block_size=2, num_blocks=4)
    judge = Judge(PagedCache(cfg), cfg)
    judge.admit("a", [1, 2, 3, 4, 5], [], 10)
    judge.free("a")
    assert judge.admit("b", [1, 2, 3, 4, 9], [], 10) == 4
    judge.free("b")
    judge.admit("c", [7, 7, 7, 7, 7, 7, 7, 7], [], 10)   # takes every block: the cached prefix is evicted
    judge.free("c")
    assert judge.admit("d", [1, 2, 3, 4, 9], [], 10) == 0


def test_a_window_group_releases_blocks_as_they_leave_the_window() -> None:
    """PAGED-WINDOW-RELEASE, PAGED-HIT-GROUPS: window 3, B = 2: after computing 0 .. 6 the next query (at 7) reads
    5 .. 7, so block 0 (0, 1) and block 1 (2, 3) are released, block 2 (4, 5) is kept."""
    cfg = config(block_size=2, num_blocks=10, groups=[{"kind": "full"}, {"kind": "window", "window": 3}])
    judge = Judge(PagedCache(cfg), cfg)
    judge.admit("a", list(range(7)), [], 1)
    for _ in range(6):
        judge.extend("a", [], 1)
    assert judge.cache.table("a")[1][:2] == [None, None] and judge.cache.table("a")[1][2] is not None
    judge.extend("a", [9], 1)   # computes 7: its query still reads 5
    assert judge.cache.table("a")[1][2] is not None
    judge.extend("a", [1], 1)   # computes 8: its query reads 6 .. 8, block 2 leaves every window
    assert judge.cache.table("a")[1][:3] == [None, None, None] and None not in judge.cache.table("a")[0]
    # A second request hits 6 tokens: the window group holds only the blocks its first query reads (5 .. 6).
    assert judge.admit("b", list(range(7)) + [9], [], 10) == 6
    assert judge.cache.table("b")[1][:2] == [None, None]


def test_a_refusal_under_pressure_changes_nothing_and_an_idle_pool_serves() -> None:
    """PAGED-ATOMIC, PAGED-IDLE-FIT."""
    cfg = config(block_size=2, num_blocks=3)
    judge = Judge(PagedCache(cfg), cfg)
    assert judge.admit("a", [1, 2, 3, 4], [], 10) == 0
    assert judge.admit("b", [5, 6, 7], [], 10) is None     # two blocks, one free: refused, nothing changed
    assert "b" not in judge.cache._requests
    assert judge.extend("a", [5, 6, 7], 3) is None
    judge.free("a")
    assert judge.admit("b", [5, 6, 7, 8, 9, 1], [], 10) == 0


def test_hash_collisions_never_serve_another_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    """PAGED-HIT: with every digest equal, identity still compares the whole content, so only identical prefixes hit."""
    monkeypatch.setattr(_paged_pool, "chain_digest", lambda parent, block: b"same")
    monkeypatch.setattr(_paged_pool, "root_digest", lambda keys: b"same")
    cfg = config(block_size=2, num_blocks=12)
    judge = Judge(PagedCache(cfg), cfg)
    judge.admit("a", [1, 2, 3, 4, 5], [], 10)
    assert judge.admit("b", [1, 2, 8, 8, 5], [], 10) == 2
    assert judge.admit("c", [1, 2, 3, 4, 5], ["k"], 10) == 0
    assert judge.admit("d", [1, 2, 3, 4, 6], [], 10) == 4


# --- malformed calls: a typed error naming the argument and the rule, nothing changed -------------------

def _busy_judge() -> Judge:
    cfg = config(block_size=2, num_blocks=8, max_model_len=10, groups=[{"kind": "full"}, {"kind": "window", "window": 2}])
    judge = Judge(PagedCache(cfg), cfg)
    judge.admit("a", [1, 2, 3, 4, 5], ["k"], 10)
    judge.admit("b", [1, 2, 3, 4, 6, 7, 8], ["k"], 2)   # hits 4, computes 4 and 5, leaves 6
    return judge


MALFORMED: list[tuple[str, tuple[Any, ...], type[Exception], str, str]] = [
    ("admit", ("a", [1], [], 1), kvcache.ArgumentValueError, "PAGED-ARGS", "request"),
    ("admit", (7, [1], [], 1), kvcache.ArgumentTypeError, "PAGED-ARGS", "request"),
    ("admit", ("c", [], [], 1), kvcache.ArgumentValueError, "PAGED-ARGS", "tokens"),
    ("admit", ("c", (1, True), [], 1), kvcache.ArgumentTypeError, "PAGED-ARGS", "tokens[1]"),
    ("admit", ("c", [1, -1], [], 1), kvcache.ArgumentValueError, "PAGED-ARGS", "tokens[1]"),
    ("admit", ("c", [1, 2**31], [], 1), kvcache.ArgumentValueError, "PAGED-ARGS", "tokens[1]"),
    ("admit", ("c", [1.0], [], 1), kvcache.ArgumentTypeError, "PAGED-ARGS", "tokens[0]"),
    ("admit", ("c", "12", [], 1), kvcache.ArgumentTypeError, "PAGED-ARGS", "tokens"),
    ("admit", ("c", list(range(11)), [], 1), kvcache.ArgumentValueError, "PAGED-ARGS", "tokens"),
    ("admit", ("c", [1], "k", 1), kvcache.ArgumentTypeError, "PAGED-ARGS", "keys"),
    ("admit", ("c", [1], [b"k"], 1), kvcache.ArgumentTypeError, "PAGED-ARGS", "keys[0]"),
    ("admit", ("c", [1], [], 0), kvcache.ArgumentValueError, "PAGED-ARGS", "budget"),
    ("admit", ("c", [1], [], True), kvcache.ArgumentTypeError, "PAGED-ARGS", "budget"),
    ("extend", ("c", [1], 1), kvcache.ArgumentValueError, "PAGED-ARGS", "request"),
    ("extend", ("a", [], 1), kvcache.ArgumentValueError, "PAGED-ARGS", "tokens"),    # nothing to compute
    ("extend", ("a", [False], 1), kvcache.ArgumentTypeError, "PAGED-ARGS", "tokens[0]"),
    ("extend", ("a", [1] * 6, 1), kvcache.ArgumentValueError, "PAGED-ARGS", "tokens"),   # past max_model_len
    ("extend", ("b", [], -1), kvcache.ArgumentValueError, "PAGED-ARGS", "budget"),
    ("extend", ("b", [], 2.0), kvcache.ArgumentTypeError, "PAGED-ARGS", "budget"),
    ("free", ("c",), kvcache.ArgumentValueError, "PAGED-FREE", "request"),
    ("free", (None,), kvcache.ArgumentTypeError, "PAGED-FREE", "request"),
    ("table", ("c",), kvcache.ArgumentValueError, "PAGED-ARGS", "request"),
]


@pytest.mark.parametrize("method, args, error, rule, argument", MALFORMED,
                         ids=[f"{m}-{a}-{i}" for i, (m, _, _, _, a) in enumerate(MALFORMED)])
def test_malformed_calls_are_refused_naming_the_argument(method: str, args: tuple[Any, ...], error: type[Exception],
                                                         rule: str, argument: str) -> None:
    """PAGED-ARGS, PAGED-FREE, PAGED-ATOMIC."""
    judge = _busy_judge()
    snapshot = judge.cache._snapshot()
    raised = judge.refused(method, *args)
    assert type(raised) is error, raised
    assert isinstance(raised, kvcache.KVCacheError) and (raised.rule, raised.argument) == (rule, argument), raised
    assert judge.cache._snapshot() == snapshot


def test_a_double_free_is_refused_and_releases_nothing() -> None:
    """PAGED-FREE"""
    judge = _busy_judge()
    judge.free("a")
    assert isinstance(judge.refused("free", "a"), kvcache.ArgumentValueError)


BAD_CONFIGS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({**config(), "block_size": 0}, kvcache.ConfigError, "block_size"),
    ({**config(), "num_blocks": True}, kvcache.ConfigTypeError, "num_blocks"),
    ({**config(), "max_model_len": 2**31}, kvcache.ConfigError, "max_model_len"),
    ({**config(), "groups": []}, kvcache.ConfigError, "groups"),
    ({**config(), "groups": {"kind": "full"}}, kvcache.ConfigTypeError, "groups"),
    ({**config(), "groups": [{"kind": "window", "window": 0}]}, kvcache.ConfigError, "groups[0].window"),
    ({**config(), "groups": [{"kind": "window"}]}, kvcache.ConfigError, "groups[0]"),
    ({**config(), "groups": [{"kind": "full"}, {"kind": "local"}]}, kvcache.ConfigError, "groups[1].kind"),
    ({**config(), "prefix_caching": 1}, kvcache.ConfigTypeError, "prefix_caching"),
    ({**config(), "block_sise": 2}, kvcache.ConfigError, "config"),
    ({key: value for key, value in config().items() if key != "prefix_caching"}, kvcache.ConfigError, "config"),
]


@pytest.mark.parametrize("cfg, error, argument", BAD_CONFIGS, ids=[a for _, _, a in BAD_CONFIGS])
def test_bad_configs_are_refused_at_creation(cfg: dict[str, Any], error: type[Exception], argument: str) -> None:
    """PAGED-CONFIG"""
    with pytest.raises(error) as raised:
        PagedCache(cfg)
    assert type(raised.value) is error and raised.value.rule == "PAGED-CONFIG" and raised.value.argument == argument


# --- stand-ins: the judge alone (contracts bypassed) finds each broken bookkeeping ------------------------

def _stale_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    """An evicted block keeps its cached key: a stale hit after reuse."""
    def take(self: _paged_pool.BlockPool, count: int) -> list[int]:
        taken = [self.free.popitem(last=False)[0] for _ in range(count)]
        for block in taken:
            self.refs[block] = 1
        return taken
    monkeypatch.setattr(_paged_pool.BlockPool, "take", take)


def _in_use_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hit block is not taken out of the free queue: a later reservation takes (and rewrites) it in use."""
    monkeypatch.setattr(_paged_pool.BlockPool, "hold", lambda self, blocks: [
        self.refs.__setitem__(block, self.refs[block] + 1) for block in blocks])


def _window_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """The window group releases one block early."""
    monkeypatch.setattr(_paged_cache, "first_needed_block",
                        lambda computed, window, size: max(0, computed - window + 1) // size + 1
                        if computed >= size else 0)


def _double_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """free releases each reference twice."""
    release = _paged_pool.BlockPool.release
    monkeypatch.setattr(_paged_pool.BlockPool, "release", lambda self, blocks: release(self, blocks + [
        block for block in blocks if self.refs[block] >= 2]))


def _refusal_leaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused admission holds its hit blocks anyway."""
    admit = inspect.unwrap(PagedCache.admit)

    def leaky(self: PagedCache, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        result = admit(self, request, tokens, keys, budget)
        if result is None and self._pool.free:
            self._pool.hold([next(iter(self._pool.free))])
        return result
    monkeypatch.setattr(PagedCache, "admit", leaky)


def _cached_before_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block is made hittable as soon as its tokens are known, before its positions are all computed: in a chunked
    prefill another request hits it unwritten, and its owner then rewrites the shared block."""
    original = PagedCache._cache_full_blocks

    def early(self: PagedCache, live: Any) -> None:
        computed = live.computed
        live.computed = min(len(live.tokens), len(live.tables[0]) * self.config.block_size)
        try:
            original(self, live)
        finally:
            live.computed = computed
    monkeypatch.setattr(PagedCache, "_cache_full_blocks", early)


def _hashed_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block's identity is its own tokens, not chained over the prefix and the keys."""
    def alone(keys: tuple[str, ...], tokens: list[int], start: list[Any], blocks: int, size: int) -> list[Any]:
        chain = list(start)
        for index in range(len(chain), blocks):
            block = tuple(tokens[index * size:(index + 1) * size])
            chain.append(_paged_pool.PrefixKey(_paged_pool.chain_digest(b"", block), (), block))
        return chain
    monkeypatch.setattr(_paged_cache, "prefix_keys", alone)


Program = list[tuple[Any, ...]]
FULL = [{"kind": "full"}]
# Each stand-in, a configuration and a program of at most three requests the judge fails it on.
STANDINS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], dict[str, Any], Program]] = {
    "stale hit after reuse": (_stale_hit, config(block_size=2, num_blocks=4), [
        ("admit", 0, [1, 2, 3], [], 9), ("free", 0), ("admit", 1, [5, 6, 7, 8, 9, 9, 9], [], 9), ("free", 1),
        ("admit", 2, [1, 2, 3], [], 9)]),
    "in-use block evicted": (_in_use_evicted, config(block_size=2, num_blocks=4), [
        ("admit", 0, [1, 2, 3], [], 9), ("free", 0), ("admit", 1, [1, 2, 3, 4, 5], [], 9),
        ("admit", 2, [7, 7, 7], [], 9)]),
    "window block released one early": (_window_early, config(groups=[{"kind": "window", "window": 3}]), [
        ("admit", 0, [0, 1, 2, 3, 4, 5], [], 9), ("extend", 0, [9], 1)]),
    "double free": (_double_free, config(), [
        ("admit", 0, [1, 2, 3], [], 9), ("admit", 1, [1, 2, 3], [], 9), ("free", 0)]),
    "refusal that changes counts": (_refusal_leaks, config(num_blocks=3), [
        ("admit", 0, [1, 2, 3, 4], [], 9), ("admit", 1, [5, 6, 7], [], 9)]),
    "block cached before it is full": (_cached_before_full, config(block_size=4), [
        ("admit", 0, [1, 2, 3, 4, 5, 6, 7, 8, 9], [], 2), ("admit", 1, [1, 2, 3, 4, 5, 6, 7, 8, 9], [], 2)]),
    "block hashed alone": (_hashed_alone, config(groups=[{"kind": "window", "window": 2}]), [
        ("admit", 0, [1, 2, 3, 4, 5], [], 9), ("admit", 1, [9, 9, 3, 4, 5], [], 9)]),
}


def _judged_raw(monkeypatch: pytest.MonkeyPatch, cfg: dict[str, Any], program: Program) -> Optional[str]:
    """What the judge alone (every contract of the cache and its pool bypassed) finds wrong, or None."""
    for method in ("__init__", "hold", "take", "release", "cache"):
        monkeypatch.setattr(_paged_pool.BlockPool, method, inspect.unwrap(getattr(_paged_pool.BlockPool, method)))
    try:
        run(Judge(PagedCache(cfg), cfg, raw=True), copy.deepcopy(program), cfg["max_model_len"])
    except Wrong as error:
        return str(error)
    return None


@pytest.mark.parametrize("name", sorted(STANDINS))
def test_the_judge_alone_finds_each_stand_in(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Each program passes the reference and fails its stand-in (the judge names the broken rule)."""
    standin, cfg, program = STANDINS[name]
    assert _judged_raw(monkeypatch, cfg, program) is None
    standin(monkeypatch)
    assert _judged_raw(monkeypatch, cfg, program) is not None, f"the judge missed: {name}"


def test_the_contracts_alone_find_a_stale_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    """PAGED-EVICT: with the contracts on, the stale-hit stand-in is stopped by the postcondition that every cached
    block a live request holds is cached under that request's own prefix (the reused block holds another's)."""
    _stale_hit(monkeypatch)
    cfg = config(block_size=2, num_blocks=3)
    cache = PagedCache(cfg)
    cache.admit("a", [1, 2, 3], [], 10)
    cache.free("a")
    with pytest.raises(icontract.ViolationError, match="PAGED-HIT"):
        cache.admit("b", [5, 6, 7, 8, 9, 9], [], 10)
