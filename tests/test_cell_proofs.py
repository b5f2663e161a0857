"""Z3 proofs of the cell layout's arithmetic invariants (proofs/z3_cells.py), and that they can fail."""

from __future__ import annotations

import pytest

from kvcache_proofs import z3_cells


def test_CELL_MASK_CELL_WINDOW_POS_CELL_ID_REUSE_CELL_RM_proofs_hold() -> None:
    results = z3_cells.run_proofs()
    assert [r.name for r in results] == list(z3_cells.PROOF_NAMES)
    assert all(r.holds for r in results), z3_cells.report(results)


@pytest.mark.parametrize("variant, broken", [("window-off-by-one", "cell-window-formula"),
                                             ("rm-clears-all", "cell-rm-shared")])
def test_a_broken_variant_fails_its_proof_with_a_counterexample(variant: str, broken: str) -> None:
    results = {r.name: r for r in z3_cells.run_proofs(variant)}
    assert not results[broken].holds and results[broken].counterexample.startswith("counterexample:")
    assert all(r.holds for name, r in results.items() if name != broken)
