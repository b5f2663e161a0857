"""Z3 proofs for the cell layout, where its invariants are arithmetic: for every size, not sampled.

  cell-window-formula   CELL-MASK's window test (p <= q and, windowed, p >= q - w + 1; no clamp) equals the
                        model's window (CELL-WINDOW-POS: positions [max(0, q - w + 1), q]; [0, q] flat) for
                        every position p >= 0, query position q >= 0 and window w >= 1: the formula caches
                        compute and the definition the model checks agree on every size.
  cell-id-reuse         on 64-bit owner words (upstream's kMaxSeqs = 64 bits): CELL-ID-REUSE's invariant
                        (no owner bit outside the live word) and an id s that is not live imply that no cell
                        carries s's bit, so a reused id owns nothing; seq_new (live | 1 << s) keeps the
                        invariant.
  cell-rm-shared        dropping s's bit from a cell (owners & ~(1 << s)) keeps every other owner's bit, and
                        frees the cell (word 0) iff s was its only owner (CELL-RM, a shared cell survives).

Each is `z3_induction.prove`: the hypotheses are checked satisfiable first (no vacuous proof); a
failing proof prints Z3's counterexample. `run_proofs(variant)`: "sound", or the broken variants
"window-off-by-one" (p > q - w + 1) and "rm-clears-all" (dropping s clears the whole word) whose
proofs must fail.
"""

from __future__ import annotations

from typing import Sequence

if __name__ == "__main__":   # before the imports that need the extra: one line instead of a traceback
    from kvcache_spec._extras import exit_unless_installed
    exit_unless_installed("verify", "python -m kvcache_proofs.z3_cells")

import z3

from .z3_induction import ProofResult, prove

PROOF_NAMES = ("cell-window-formula", "cell-id-reuse", "cell-rm-shared")
VARIANTS = ("sound", "window-off-by-one", "rm-clears-all")
WORD = 64  # CELL-MAX-SEQS: owner sets are one 64-bit word


def _window_formula(p: z3.ArithRef, q: z3.ArithRef, w: z3.ArithRef, windowed: z3.BoolRef,
                    variant: str) -> z3.BoolRef:
    low = p > q - w + 1 if variant == "window-off-by-one" else p >= q - w + 1
    return z3.And(p <= q, z3.Or(z3.Not(windowed), low))


def window_proof(variant: str = "sound") -> ProofResult:
    p, q, w = z3.Ints("p q w")
    windowed = z3.Bool("windowed")
    start = z3.If(windowed, z3.If(q - w + 1 > 0, q - w + 1, 0), 0)
    return prove("cell-window-formula", "CELL-MASK's window test equals CELL-WINDOW-POS's window, every size",
                 [p >= 0, q >= 0, w >= 1],
                 _window_formula(p, q, w, windowed, variant) == z3.And(start <= p, p <= q))


def id_reuse_proof() -> ProofResult:
    owners, live, s = z3.BitVecs("owners live s", WORD)
    bit = z3.BitVecVal(1, WORD) << s
    invariant = owners & ~live == 0
    new_live = live | bit
    return prove("cell-id-reuse", "a non-live id carries no owner bit; seq_new keeps no-bit-outside-live",
                 [z3.ULT(s, WORD), invariant, live & bit == 0],
                 z3.And(owners & bit == 0, owners & ~new_live == 0))


def rm_shared_proof(variant: str = "sound") -> ProofResult:
    owners, s, t = z3.BitVecs("owners s t", WORD)
    one = z3.BitVecVal(1, WORD)
    dropped = z3.BitVecVal(0, WORD) if variant == "rm-clears-all" else owners & ~(one << s)
    others_kept = z3.Implies(t != s, (dropped >> t) & one == (owners >> t) & one)
    freed_iff_only = (dropped == 0) == (owners & ~(one << s) == 0)
    return prove("cell-rm-shared", "dropping one owner keeps the others; the cell is free iff it was the only one",
                 [z3.ULT(s, WORD), z3.ULT(t, WORD), owners & (one << s) != 0, (owners >> t) & one == 1],
                 z3.And(others_kept, freed_iff_only))


def run_proofs(variant: str = "sound") -> list[ProofResult]:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")
    return [window_proof(variant), id_reuse_proof(), rm_shared_proof(variant)]


def report(results: Sequence[ProofResult]) -> str:
    return "\n".join(f"{'holds' if r.holds else 'FAILS'} {r.name}: {r.statement}"
                     + (f"\n      {r.counterexample}" if r.counterexample else "") for r in results)


if __name__ == "__main__":
    print(report(run_proofs()))
