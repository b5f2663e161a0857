"""The cell checker's symmetry over sequence ids (docs/verification.md, "How the cell layout is verified") and its contracts once per state, against
the full search: the reduced search explores one state per class of renamings and must reach the same
classes, give the same verdicts and the same shortest counterexample lengths."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Optional

import pytest

import kvcache
from kvcache_proofs import _cell_broken
from kvcache_proofs import cell_model_checker as cmc
from kvcache_proofs.model_checker import (ConfigResult, check_config, fingerprint, invariant_problems,
                                          invariants_suspended, replay)
from kvcache_spec.cell_stateful import Call, CellConfigSpec, CellLockstep

from . import cell_model_target

KINDS = (cmc.FLAT, cmc.WINDOW, cmc.BOTH)
BOUNDS = cmc.CellBounds(groups=((2, 3, KINDS), (3, 2, KINDS)), max_tokens=2, max_position=3)
#: The broken variants' search (both ways, smallest configuration first): every one is found within it.
#: Not a flat and a windowed layer at capacity 1: stale_memo_mask's memo is an insertion-ordered dict,
#: so its fingerprint tells apart every order the steps were memoized in, and that space explodes.
BROKEN_BOUNDS = cmc.CellBounds(groups=((2, 3, (cmc.FLAT, cmc.WINDOW)),), max_tokens=2, max_position=3)

#: Small configurations, each exhaustive both ways: 2 and 3 ids, flat, windowed and mixed layers.
SMALL = [CellConfigSpec(2, (0,), 2), CellConfigSpec(3, (2,), 2), CellConfigSpec(2, (0, 2), 3),
         CellConfigSpec(2, (2,), 3)]


def _full(spec: CellConfigSpec, factory: Optional[Callable[..., Any]] = None) -> tuple[ConfigResult, set[bytes]]:
    """The full search (no reduction), and the canonical form of every state it reached."""
    classes: set[bytes] = set()

    def record(lock: CellLockstep) -> None:
        classes.add(fingerprint(cmc.canonical_key(lock)))

    layout = dataclasses.replace(cmc.layout(BOUNDS, symmetry=False), settle=record)
    return check_config(spec, factory, layout=layout), classes


def _reduced(spec: CellConfigSpec, factory: Optional[Callable[..., Any]] = None) -> tuple[ConfigResult, set[bytes]]:
    seen: set[bytes] = set()
    return check_config(spec, factory, layout=cmc.layout(BOUNDS), seen=seen), seen


@pytest.mark.slow
@pytest.mark.parametrize("spec", SMALL, ids=repr)
def test_the_reduced_search_reaches_every_class_the_full_search_reaches(spec: CellConfigSpec) -> None:
    """The reference: the same verdict (holds) and exactly the same set of reachable canonical states;
    the reduction explores fewer states (one per class)."""
    full, full_classes = _full(spec)
    reduced, reduced_classes = _reduced(spec)
    assert full.complete and reduced.complete and full.counterexample is None and reduced.counterexample is None
    assert reduced_classes == full_classes
    assert reduced.states == len(reduced_classes) < full.states


def _addressless(problems: list[str]) -> list[str]:
    """A contract's violation message names the object's address, which differs between runs."""
    return [re.sub(r" at 0x[0-9a-f]+", "", problem) for problem in problems]


BROKEN_TARGETS: dict[str, Callable[..., Any]] = {
    **_cell_broken.BROKEN,
    **{name: getattr(cell_model_target, name) for name in ("fork_past_cut", "rm_off_by_one", "window_in_tokens")},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BROKEN_TARGETS))
def test_every_broken_variant_is_found_alike_reduced_and_full(name: str) -> None:
    """Each broken variant (the reference's subclasses, renamed like it, and model-based targets, which
    are never renamed): the first configuration that fails is the same, with a shortest counterexample
    of the same length breaking the same rule, and the reduced one replays."""
    factory = BROKEN_TARGETS[name]
    for spec in BROKEN_BOUNDS.configs():
        full, _ = _full(spec, factory)
        reduced, _ = _reduced(spec, factory)
        assert (full.counterexample is None) == (reduced.counterexample is None), spec
        if full.counterexample and reduced.counterexample:
            assert len(full.counterexample.ops) == len(reduced.counterexample.ops)
            assert full.counterexample.problems[0].split(":")[0] == reduced.counterexample.problems[0].split(":")[0]
            replayed = replay(spec, reduced.counterexample.ops, factory, cmc.layout(BOUNDS))
            assert _addressless(replayed) == _addressless(reduced.counterexample.problems)
            return
    pytest.fail(f"{name} was not found within {BROKEN_BOUNDS}")


def test_renaming_ids_keeps_the_free_ids_in_order() -> None:
    """Two states alike up to a renaming that keeps the free ids' order are one class: seq 0 removed
    after seq 1 was made (live {1}) is seq 0 alone (live {0}) with the same cells; but the class keeps
    what the allocator sees, so the next seq_new of each is renamed alike (1 -> 0, 0 -> 1)."""
    spec = CellConfigSpec(3, (0,), 3)

    def run(*ops: Any) -> CellLockstep:
        lock = cmc._cell_harness(spec, cmc.cell_reference_factory)
        for op in ops:
            assert lock.apply(op) == []
        return lock

    forward = (Call("declare_step", ([0],)), Call("place_step", (0, [0])))
    alone = run(Call("seq_new"), *forward)                                        # 0 holds cell 0
    hole = run(Call("seq_new"), Call("seq_new"), Call("seq_rm", (0, 0)),
               Call("declare_step", ([1],)), Call("place_step", (0, [0])))         # 1 holds cell 0, 0 free
    assert cmc.canonical_key(alone) == cmc.canonical_key(hole)
    assert cmc.canonical_key(run(Call("seq_new"), Call("seq_new"))) != cmc.canonical_key(alone)
    for lock in (alone, hole):
        assert lock.apply(Call("seq_new")) == []
    assert cmc.canonical_key(alone) == cmc.canonical_key(hole)


def test_a_transition_is_made_once_per_orbit_of_the_states_automorphisms() -> None:
    """Two empty sequences are alike: swapping them maps the state onto itself, so of each pair of
    transitions that the swap exchanges (seq_rm of 0 or of 1, declare_step([0]) or ([1]), [0, 1] or
    [1, 0]) one is made; a state whose ids differ has the identity alone and keeps every transition."""
    spec = CellConfigSpec(2, (0,), 3)
    lock = cmc._cell_harness(spec, cmc.cell_reference_factory)
    for op in (Call("seq_new"), Call("seq_new")):
        assert lock.apply(op) == []
    assert cmc.automorphisms(lock) == [{0: 0, 1: 1}, {0: 1, 1: 0}]
    every = list(cmc.transitions(lock, 2, 3))
    made = list(cmc.layout(BOUNDS).transitions(lock))
    assert [call for call in every if call not in made] == [
        Call("seq_clone", (1, None)), Call("seq_rm", (1, 0, None)), Call("declare_step", ([1],)),
        Call("declare_step", ([1, 0],)), Call("declare_step", ([1, 1],))]
    assert lock.apply(Call("declare_step", ([0],))) == [] and lock.apply(Call("place_step", (0, [0]))) == []
    assert cmc.automorphisms(lock) == [{0: 0, 1: 1}]
    assert list(cmc.layout(BOUNDS).transitions(lock)) == list(cmc.transitions(lock, 2, 3))


def test_a_target_that_is_not_the_reference_is_never_renamed() -> None:
    """A model-based target (its own tables) keeps its own fingerprint: the canonical form is its key."""
    lock = CellLockstep(CellConfigSpec(2, (0,), 2), cell_model_target.fork_past_cut)
    assert lock.apply(Call("seq_new")) == []
    key, order = cmc.canonical(lock)
    assert key == ("as-is", lock.key()) and order == [0]


class _OccupiedDrift(kvcache.CellCache):
    """Breaks an invariant only (the occupied count drifts on a removal); no postcondition sees it."""

    def _trim(self) -> None:
        super()._trim()
        self._occupied += 1


def _occupied_drift(config: kvcache.CacheConfig, max_seqs: int = 64) -> kvcache.CellCache:
    return _OccupiedDrift(config, max_seqs)


def test_invariants_are_suspended_in_calls_and_checked_once_per_state() -> None:
    """A target breaking only an invariant is caught on the call that broke it (the state it reaches is
    checked once), as when every call checked the invariants; the replay shows the same problem."""
    cache = _OccupiedDrift(CellConfigSpec(2, (0,), 2).cache_config(), 2)
    seq = cache.seq_new()
    assert seq == 0 and invariant_problems(cache) == []
    with invariants_suspended(cache) as suspended:
        assert suspended and cache.seq_rm(seq, 0) is True        # no invariant raised inside the call
    assert any(p.startswith("CELL-USED-END") for p in invariant_problems(cache))
    spec = CellConfigSpec(2, (0,), 2)
    result, _ = _reduced(spec, _occupied_drift)
    cx = result.counterexample
    assert cx is not None and len(cx.ops) == 2 and cx.ops[-1].verb == "seq_rm", cx
    assert cx.problems[0].startswith("CELL-USED-END")
    assert replay(spec, cx.ops, _occupied_drift, cmc.layout(BOUNDS)) == cx.problems


@pytest.mark.slow
def test_the_symmetry_report_sums_each_governed_configuration_into_its_group(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m kvcache_proofs.symmetry_report`: every configuration counted once, in the group that
    governs it, reduced and in full; the reduced search never has more states, and both hold."""
    from kvcache_proofs import symmetry_report

    bounds = cmc.PROFILES["quick"]
    rows = symmetry_report.measure("quick")
    assert [row.index for row in rows] == list(range(len(bounds.groups)))
    assert sum(row.configs for row in rows) == len(bounds.configs())
    for row in rows:
        expected = [spec for spec in bounds.configs() if bounds.governing_group(spec) == row.index]
        assert row.configs == len(expected) > 0
        assert row.full.states == sum(check_config(spec, None, None, cmc.layout(bounds, symmetry=False)).states
                                      for spec in expected)
        assert 0 < row.reduced.states < row.full.states and row.reduction() > 1
        assert row.reduced.holds and row.full.holds and row.reduced.complete and row.full.complete
    assert symmetry_report.main(["--profile", "quick", "--groups", "1"]) == 0
    assert re.search(r"^1 +1 +19 ", capsys.readouterr().out, re.M)
    with pytest.raises(SystemExit) as usage:
        symmetry_report.main(["--profile", "quick", "--groups", "7"])
    assert usage.value.code == 2


def test_a_configuration_in_several_groups_is_governed_by_the_first_exhaustive_one() -> None:
    bounds = cmc.CellBounds(groups=((3, 6, ((0,),), 4, 6), (3, 4, ((0,),)), (3, 5, ((0,),), 2)), max_tokens=2,
                            max_position=3)
    governed = {spec.capacity: bounds.governing_group(spec) for spec in bounds.configs()}
    assert governed == {1: 1, 2: 1, 3: 1, 4: 1, 5: 0, 6: 0}   # exhaustive first, else the deepest bound
    assert bounds.governing(CellConfigSpec(5, (0,), 3)) == (4, 6)
    assert bounds.governing(CellConfigSpec(2, (0,), 3)) == (None, 3)
