"""SGLang's KV bookkeeping as a paged-face target (spec/conformance/libraries/sglang.py), checked by the data: this
test acts as the model runner - it writes, into the slot the target's table maps each newly reserved position to,
a value naming that position's whole prefix and keys - and after every call reads each live request's table back:
every computed position must hold its own value, available() + the slots live tables hold must be the pool, the
ref counts must be the live holders, and a refusal must change nothing. Hits are checked against what a request
may hit (identical tokens and keys, never the last prompt token).

Needs the `sglang` extra (bash .ci/install-serving.sh VENV). Without it the module is skipped with the reason;
under KVCACHE_NO_SKIPS=1 (CI's serving stage) that skip fails the run (tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
import random
from typing import Any, Optional

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed: bash .ci/install-serving.sh VENV", allow_module_level=True)

from kvcache_spec.conformance.libraries import sglang as adapter  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::Warning")

Value = tuple[tuple[str, ...], tuple[int, ...]]


def config(num_blocks: int, groups: int = 1, prefix_caching: bool = True, block_size: int = 1,
           max_model_len: int = 64) -> dict[str, Any]:
    return {"block_size": block_size, "num_blocks": num_blocks, "max_model_len": max_model_len,
            "groups": [{"kind": "full"}] * groups, "prefix_caching": prefix_caching}


class Runner:
    """The model runner and the judge: the KV memory is a dict (group, block, offset) -> the value written there."""

    def __init__(self, cache: Any, num_blocks: int, groups: int, block_size: int = 1) -> None:
        self.cache, self.num_blocks, self.groups, self.size = cache, num_blocks, groups, block_size
        self.memory: dict[tuple[int, int, int], Value] = {}
        self.live: dict[str, tuple[list[int], tuple[str, ...], int]] = {}     # tokens, keys, computed
        self.hits = self.refusals = self.evicting_admissions = 0

    def value(self, request: str, position: int) -> Value:
        tokens, keys, _ = self.live[request]
        return keys, tuple(tokens[:position + 1])

    def snapshot(self) -> tuple[int, dict[str, list[list[Optional[int]]]], dict[int, int]]:
        return (self.cache.available(), {name: self.cache.table(name) for name in self.live},
                self.cache.ref_counts())

    def write(self, request: str, start: int) -> None:
        tables = self.cache.table(request)
        for group in range(self.groups):
            for position in range(start, self.live[request][2]):
                block = tables[group][position // self.size]
                assert block is not None
                self.memory[(group, block, position % self.size)] = self.value(request, position)

    def check(self) -> None:
        available, tables, ref_counts = self.snapshot()
        holders: dict[int, int] = {}
        for request, (_, _, computed) in self.live.items():
            assert len(tables[request]) == self.groups
            blocks = -(-computed // self.size)
            for group, row in enumerate(tables[request]):
                assert len(row) >= blocks
                for position in range(computed):
                    block = row[position // self.size]
                    assert block is not None and (self.memory.get((group, block, position % self.size))
                                                  == self.value(request, position)), (
                        f"{request!r} position {position} group {group}: block {block} holds another value")
                for block in set(row[:blocks]):
                    assert block is not None
                    holders[block] = holders.get(block, 0) + 1
                shared_partial = [index for index in range(blocks) if (index + 1) * self.size > computed
                                  and any(row[index] in other[group] for name, other in tables.items()
                                          if name != request)]
                assert not shared_partial, f"{request!r}: a partial block shared"
        assert available + len(holders) == self.num_blocks, (
            f"available {available} + held {len(holders)} != {self.num_blocks} blocks")
        assert ref_counts == holders

    def admit(self, request: str, tokens: list[int], keys: tuple[str, ...], budget: int) -> Optional[int]:
        before = self.snapshot()
        free_before = before[0] - int(self.cache.tree.evictable_size()) // self.size
        hit = self.cache.admit(request, tokens, list(keys), budget)
        if hit is None:
            self.refusals += 1
            assert self.snapshot() == before, "a refused admission changed what the harness sees"
            return None
        assert 0 <= hit <= len(tokens) - 1
        assert hit <= self.longest_cached_prefix(tokens, keys) and hit % self.size == 0
        self.hits += hit > 0
        n = min(len(tokens) - hit, budget)
        self.evicting_admissions += -(-n // self.size) > free_before
        self.live[request] = (list(tokens), keys, hit + n)
        self.write(request, hit)
        self.check()
        return hit

    def extend(self, request: str, tokens: list[int], budget: int) -> Optional[int]:
        before = self.snapshot()
        n = self.cache.extend(request, tokens, budget)
        if n is None:
            self.refusals += 1
            assert self.snapshot() == before, "a refused extend changed what the harness sees"
            return None
        old, keys, computed = self.live[request]
        assert n == min(len(old) + len(tokens) - computed, budget)
        self.live[request] = (old + tokens, keys, computed + n)
        self.write(request, computed)
        self.check()
        return n

    def free(self, request: str) -> None:
        self.cache.free(request)
        del self.live[request]
        self.check()

    def longest_cached_prefix(self, tokens: list[int], keys: tuple[str, ...]) -> int:
        """The longest prefix whose every position's value is somewhere in memory (written by some request with
        these keys): a hit beyond it would be K/V nobody computed."""
        written = set(self.memory.values())
        length = 0
        while length < len(tokens) and (keys, tuple(tokens[:length + 1])) in written:
            length += 1
        return length


def random_program(runner: Runner, seed: int, steps: int) -> None:
    """Requests sharing and diverging prefixes (a few prompt stems, two key sets), chunked prompts, decode steps and
    frees, on a pool small enough that admissions evict."""
    rng = random.Random(seed)
    stems = [[rng.randrange(50) for _ in range(12)] for _ in range(3)]
    names = 0
    for _ in range(steps):
        live = sorted(runner.live)
        action = rng.random()
        if not live or action < 0.35:
            stem = rng.choice(stems)
            tokens = stem[:rng.randrange(1, len(stem) + 1)] + [rng.randrange(50) for _ in range(rng.randrange(4))]
            keys = rng.choice([(), ("lora-a",)])
            runner.admit(f"r{names}", tokens, keys, rng.choice([2, 4, 64]))
            names += 1
        elif action < 0.8:
            request = rng.choice(live)
            tokens, _, computed = runner.live[request]
            new = [] if computed < len(tokens) else [rng.randrange(50)]
            runner.extend(request, new, rng.choice([1, 3, 64]))
        else:
            runner.free(rng.choice(live))


@pytest.mark.parametrize("seed", range(9))
def test_random_programs_keep_every_live_position_its_own_value(seed: int) -> None:
    groups = 1
    block_size = (1, 2, 4)[seed // 3]
    num_blocks = 24 // block_size + 2
    runner = Runner(adapter.radix(config(num_blocks, groups, prefix_caching=seed % 2 == 0, block_size=block_size)),
                    num_blocks, groups, block_size)
    random_program(runner, seed, steps=120)
    for request in sorted(runner.live):
        runner.free(request)
    assert runner.cache.available() == num_blocks
    if seed % 2 == 0:   # with prefix caching on, these programs share and evict (the test exercises both)
        assert runner.hits > 0 and runner.evicting_admissions > 0, (runner.hits, runner.evicting_admissions)


def test_a_hit_needs_identical_tokens_and_keys_and_leaves_the_last_token_to_compute() -> None:
    runner = Runner(adapter.radix(config(32)), 32, 1)
    assert runner.admit("a", [1, 2, 3, 4, 5], (), 64) == 0
    assert runner.admit("b", [1, 2, 3, 4, 5], (), 64) == 4            # the whole prompt cached: the last recomputed
    assert runner.admit("c", [1, 2, 3, 9], (), 64) == 3
    assert runner.admit("d", [1, 2, 3, 4, 5], ("lora-a",), 64) == 0   # other keys: no hit
    assert runner.admit("e", [1, 2, 3, 4, 5], ("lora", "-a"), 64) == 0
    runner.free("a")
    assert runner.admit("f", [1, 2, 3, 4, 5, 6], (), 64) == 5        # a's computed prompt stays hittable


def test_a_request_that_does_not_fit_is_refused_and_fits_once_blocks_are_freed() -> None:
    runner = Runner(adapter.radix(config(8)), 8, 1)
    assert runner.admit("a", [1, 2, 3, 4, 5, 6], (), 64) == 0
    assert runner.admit("b", [7, 8, 9, 10], (), 64) is None            # 4 slots needed, 2 free, nothing evictable
    assert runner.extend("a", [11], 1) == 1
    runner.free("a")
    assert runner.admit("b", [7, 8, 9, 10], (), 64) == 0               # a's cached slots evicted for b
    assert runner.refusals == 1 and runner.evicting_admissions == 1


@pytest.mark.parametrize("groups", [[{"kind": "full"}, {"kind": "window", "window": 4}], [{"kind": "window", "window": 4}],
                                    [{"kind": "full"}, {"kind": "full"}]])
def test_a_configuration_outside_the_scope_is_refused_at_creation(groups: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match="groups"):
        adapter.radix({**config(8), "groups": groups})


def test_a_prompt_as_long_as_the_context_is_served_the_adapter_checks_nothing() -> None:
    """The spec admits a prompt of max_model_len tokens; SGLang's API layer would refuse it
    (managers/tokenizer_manager.py:1338), but the target declares trusted-args and checks nothing itself: the
    request reaches the cache, whose row holds max_model_len slots."""
    cache = adapter.radix(config(16, max_model_len=8))
    assert cache.admit("a", list(range(8)), [], 8) == 0
    assert [len(group) for group in cache.table("a")] == [8]


def test_pages_hit_whole_pages_only() -> None:
    runner = Runner(adapter.radix(config(16, block_size=4)), 16, 1, 4)
    assert runner.admit("a", list(range(1, 11)), (), 64) == 0          # 10 tokens: pages 0-1 full, page 2 partial
    assert runner.admit("b", list(range(1, 11)), (), 64) == 8          # the partial page is not on the tree
    assert runner.admit("c", list(range(1, 9)), (), 64) == 4           # 8 cached, the last token recomputed
    runner.free("a")
    assert runner.admit("d", list(range(1, 13)), (), 64) == 8


class UnlockedHit(adapter.SGLangRadix):
    """A stand-in: admission drops the lock on the matched prefix (the scheduler's req.lock never taken), so the
    tree may evict a live request's hit blocks and hand them to another request."""

    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        hit = super().admit(request, tokens, keys, budget)
        if hit is not None:
            req = self.live[request].req
            self.tree.unlock(req.lock)
            req.lock = None
        return hit


def test_the_checks_find_a_hit_prefix_left_unlocked() -> None:
    num_blocks = 10
    runner = Runner(UnlockedHit(config(num_blocks)), num_blocks, 1)
    with pytest.raises(AssertionError, match="available|holds another value"):
        # a's slots count as evictable while a holds them (conservation), and b's admission may evict them
        runner.admit("a", [1, 2, 3, 4, 5, 6], (), 64)
        runner.admit("b", [7, 8, 9, 10, 11, 12], (), 64)
