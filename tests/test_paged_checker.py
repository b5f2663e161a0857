"""The paged layout's exhaustive checker (kvcache_proofs.paged_checker): it holds on the reference within small
bounds, and finds a broken target with a short, replayable program."""

from __future__ import annotations

from typing import Any

from kvcache._paged_pool import BlockPool
from kvcache.paged import PagedCache
from kvcache_proofs import paged_checker as pc
from kvcache_proofs.model_search import check_config, replay

TINY = pc.PagedBounds(sizes=(2,), num_blocks=(3,), windows=(pc.BOTH,), max_len=3, depth=2)


def test_the_checker_holds_on_the_reference_within_small_bounds() -> None:
    """PAGED-DATA-SOUND, PAGED-CONSERVE: every state within depth 2 of a hybrid pool, every check and transition."""
    result = check_config(pc.PagedSpec(2, 3, pc.BOTH, True, 3), None, None, pc.layout(TINY))
    assert result.counterexample is None and result.complete
    assert result.states >= 30 and result.beyond > 0 and result.transitions > result.states < result.checks


class StalePool(BlockPool):
    """An evicted block keeps its cached key: a stale hit after reuse."""

    def take(self, count: int) -> list[int]:
        taken = [self.free.popitem(last=False)[0] for _ in range(count)]
        for block in taken:
            self.refs[block] = 1
        return taken


class StaleHit(PagedCache):
    """The reference over the stale pool."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._pool = StalePool(self.config.num_blocks, len(self.config.windows))


def test_the_checker_finds_a_stale_hit_with_a_short_program() -> None:
    """PAGED-EVICT: the shortest program (BFS) is a handful of calls, and it replays."""
    bounds = pc.PagedBounds(sizes=(1,), num_blocks=(2,), windows=(pc.FULL,), max_len=2, depth=4)
    spec = pc.PagedSpec(1, 2, pc.FULL, True, 2)
    result = check_config(spec, StaleHit, None, pc.layout(bounds))
    assert result.counterexample is not None
    ops = result.counterexample.ops
    assert 2 <= len(ops) <= 4, ops
    assert replay(spec, ops, StaleHit, pc.layout(bounds))
    assert not replay(spec, ops, None, pc.layout(bounds))


def test_the_crosshair_gate_confirms_the_block_arithmetic_and_covers_the_rest() -> None:
    """PAGED-RESERVE, PAGED-WINDOW-RELEASE, PAGED-HIT: CrossHair confirms the block arithmetic for every int; the
    cache's and the pool's contracts are excluded with this checker, the lockstep machine and the reference's
    tests as their cover."""
    from kvcache_proofs import crosshair_gate as gate

    result = gate.run_gate(select="kvcache._paged_*")
    confirmed = {row.obligation.target for row in result.rows if row.status == gate.CONFIRMED}
    assert {f"kvcache._paged_blocks.{name}" for name in ("blocks_for", "first_needed_block", "most_hit_blocks")} \
        <= confirmed
    paged = [row for row in result.excluded if row.obligation.target.startswith("kvcache._paged_")]
    assert paged and all(row.covered_by == ("tests:tests/test_paged_checker.py", "tests:tests/test_paged_lockstep.py",
                                            "tests:tests/test_paged_reference.py") and not row.frame_problems
                         for row in paged)
