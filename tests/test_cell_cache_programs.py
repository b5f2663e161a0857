"""The cell cache (kvcache.CellCache) on random programs, checked at the data level by definition (each
sequence reads exactly its own history), and the broken variants (kvcache_proofs._cell_broken) caught by
the contracts and, with the contracts off, by the data-level check. The cases by hand are in
tests/test_cell_cache.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcache import CellCache

from tests.test_cell_cache import FLAT, RING, cells


# --- random programs, checked at the data level by definition ----------------------------------------

OPS = st.lists(st.tuples(st.sampled_from(["new", "clone", "clone", "rm", "rm", "step", "step", "step", "clear"]),
                         st.integers(0, 3), st.integers(0, 6), st.one_of(st.none(), st.integers(0, 6)),
                         st.integers(1, 3)),
               min_size=4, max_size=30)


def require(condition: bool, what: str) -> None:
    """An assertion that survives python -O (the programs below also run there, contracts off)."""
    if not condition:
        raise AssertionError(what)


Program = list[tuple[str, int, int, Optional[int], int]]


class Truth:
    """Each live sequence's history as (position, content) pairs, and what each cell holds: the data-level
    meaning of the rules (CELL-DATA-SOUND), independent of owner bits and mask formulas."""

    def __init__(self) -> None:
        self.history: dict[int, list[tuple[int, int]]] = {}
        self.pools: dict[int, dict[int, int]] = {}  # per layer: cell -> the content written there last
        self.fresh = 0

    def check_forward(self, c: CellCache, seqs: list[int], positions: list[int]) -> None:
        """Run a declared forward on every layer (in a scrambled order); each token must read exactly the
        contents of its own sequence's history inside its window, its own step's earlier tokens included."""
        contents = list(range(self.fresh, self.fresh + len(seqs)))
        self.fresh += len(seqs)
        for s, q, content in zip(seqs, positions, contents):
            self.history[s].append((q, content))
        for layer in sorted(range(c.n_layers), key=lambda n: (n * 7) % 3):
            step = c.place_step(layer, positions)
            window = c.config.layer(layer).policy.window or None
            pool = self.pools.setdefault(layer, {})
            for cell, content in zip(step.cells, contents):
                pool[cell] = content                             # each layer writes its own pool
            for i, (s, q) in enumerate(zip(seqs, positions)):
                read = sorted(pool[j] for j in range(step.read_len) if step.attends(i, j))
                low = 0 if window is None else q - window + 1
                expected = sorted(content for p, content in self.history[s] if low <= p <= q)
                require(read == expected, f"layer {layer} token {i} (seq {s}, position {q}) read {read}, "
                                          f"its history in the window is {expected}")

    def agrees(self, c: CellCache) -> bool:
        return c.live() == set(self.history) and all(
            c.seq_len(s) == len(h) and c.next_pos(s) == 1 + max((p for p, _ in h), default=-1)
            for s, h in self.history.items())


def run_program(c: CellCache, ops: Program) -> None:
    """Random verbs and forwards on `c` (a prompt first), each answer and each read checked against Truth."""
    truth = Truth()
    for verb, s, p, q, k in [("new", 0, 0, None, 1), ("step", 0, 0, None, 2)] + ops:
        live = sorted(c.live())
        target = live[s % len(live)] if live else None
        if verb == "new":
            new = c.seq_new()
            if new is not None:
                truth.history[new] = []
        elif verb == "clone" and target is not None:
            fork = c.seq_clone(target, q)
            if fork is not None:
                truth.history[fork] = [(pos, x) for pos, x in truth.history[target] if q is None or pos < q]
        elif verb == "rm" and target is not None:
            p0, p1 = (p, None) if q is None else (min(p, q), max(p, q))
            require(c.seq_rm(target, p0, p1), "seq_rm answers True")
            truth.history[target] = [(pos, x) for pos, x in truth.history[target]
                                     if not (p0 <= pos and (p1 is None or pos < p1))]
            if not truth.history[target]:
                del truth.history[target]
        elif verb == "step" and live:
            seqs = [live[(s + i) % len(live)] for i in range(k)]
            if c.declare_step(seqs):
                following = {x: c.next_pos(x) + p % 2 for x in set(seqs)}   # sometimes a gap
                positions = []
                for x in seqs:
                    positions.append(following[x])
                    following[x] += 1 if q is None else 1 + q % 2
                truth.check_forward(c, seqs, positions)
            else:
                require(len(seqs) > c.free_cells(), "declare_step refuses only when the cells run out")
        elif verb == "clear":
            c.clear()
            truth.history.clear()
        require(truth.agrees(c), f"after {verb}: live ids, seq_len or next_pos disagree with the histories")


@settings(max_examples=150)
@given(ops=OPS, capacity=st.integers(2, 8))
def test_random_programs_read_exactly_each_sequences_history(ops: Program, capacity: int) -> None:
    """CELL-DATA-SOUND, CELL-FORK, CELL-RM, CELL-ID-REUSE, CELL-OWNERS, CELL-USED-END, CELL-MASK: random verbs
    and forwards (forks with cuts, removals anywhere, gaps in positions, id reuse, clears); every read
    is checked by definition against the histories, every contract on every call."""
    run_program(cells(capacity, FLAT, RING(2), RING(1), max_seqs=3), ops)


DATA_LEVEL_UNDER_O = """
import random
from kvcache import CacheConfig, CellCache, LayerConfig, LayerPolicy
from kvcache_proofs._cell_broken import BROKEN
from tests.test_cell_cache_programs import run_program
if __debug__:
    raise SystemExit("run me under python -O")
VERBS = ["new", "clone", "clone", "rm", "rm", "step", "step", "step", "clear"]
layers = [LayerConfig(LayerPolicy.flat()), LayerConfig(LayerPolicy.ring(2)), LayerConfig(LayerPolicy.ring(1))]
for name, factory in [("reference", CellCache)] + sorted(BROKEN.items()):
    caught = None
    for seed in range(400):
        rng = random.Random(seed)
        ops = [(rng.choice(VERBS), rng.randrange(4), rng.randrange(7), rng.choice([None] + list(range(7))),
                rng.randrange(1, 4)) for _ in range(rng.randrange(4, 31))]
        try:
            run_program(factory(CacheConfig(rng.randrange(2, 9), 3, layers), 3), ops)
        except AssertionError:
            caught = seed
            break
    print(name, caught)
"""


def test_the_data_level_check_finds_broken_variants_without_contracts() -> None:
    """The random programs' check is not vacuous: under -O (the reference's contracts off) it finds the
    broken variants by their reads and answers alone, and passes the reference, over 400 fixed seeds."""
    result = subprocess.run([sys.executable, "-O", "-c", DATA_LEVEL_UNDER_O], capture_output=True, text=True,
                            timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stderr
    first_failing = {name: seed for name, seed in (line.split() for line in result.stdout.splitlines())}
    assert first_failing.pop("reference") == "None"
    assert sorted(first_failing) == sorted(BROKEN_CASES)
    assert all(seed != "None" for seed in first_failing.values()), first_failing


# --- the broken variants (kvcache_proofs._cell_broken) are caught ------------------------------------

# name -> (the reference's answer to the variant's minimal program, by hand; the rule its contracts cite)
BROKEN_CASES: dict[str, tuple[object, str]] = {
    "stale_owner_bit": ("0011", "CELL-RM"),
    "fork_past_cut": ((1, "1001"), "CELL-FORK"),
    "rm_off_by_one": ((2, "1101"), "CELL-RM"),
    "stale_memo_mask": ("1111", "CELL-PLACE"),
    "id_reused_while_owned": ((1, "1000"), "CELL-RM"),
}


def test_every_broken_variant_has_a_program_and_a_case() -> None:
    from kvcache_proofs import _cell_broken

    assert set(_cell_broken.BROKEN) == set(_cell_broken.PROGRAMS) == set(BROKEN_CASES)
    for factory in _cell_broken.BROKEN.values():
        assert factory.__doc__ and ":" in factory.__doc__.splitlines()[0]   # "Bug class: what goes wrong"


@pytest.mark.parametrize("name", sorted(BROKEN_CASES))
def test_broken_variant_is_caught_by_the_contracts(name: str) -> None:
    """CELL-OWNERS, CELL-FORK, CELL-RM, CELL-MASK, CELL-ID-REUSE: the reference answers its program as
    the rules say; the variant trips a contract citing the rule it breaks."""
    import icontract

    from kvcache_proofs._cell_broken import BROKEN, PROGRAMS

    answer, rule = BROKEN_CASES[name]
    assert PROGRAMS[name](CellCache) == answer
    with pytest.raises(icontract.ViolationError) as caught:
        PROGRAMS[name](BROKEN[name])
    assert rule in str(caught.value).splitlines()[1]


BROKEN_UNDER_O = """
import json
from kvcache import CellCache
from kvcache_proofs._cell_broken import BROKEN, PROGRAMS
if __debug__:
    raise SystemExit("run me under python -O")
print(json.dumps({name: [PROGRAMS[name](CellCache), PROGRAMS[name](BROKEN[name])] for name in sorted(BROKEN)}))
"""


def test_broken_variants_answer_wrongly_without_contracts() -> None:
    """Under -O (contracts off) each variant's bug is real and observable in its program's answer: what a
    model-based checker must find by comparison."""
    import json

    result = subprocess.run([sys.executable, "-O", "-c", BROKEN_UNDER_O], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)
    for name, (expected, _) in BROKEN_CASES.items():
        right, wrong = answers[name]
        assert right == (list(expected) if isinstance(expected, tuple) else expected), name
        assert wrong != right, name
