"""Z3 proofs, over unbounded integers, that the ring policy's bookkeeping is sound - by induction.

The state of one ring policy (window w, max_write m, S = w + m - 1 slots, capacity C) is the length
L, the retained mark R, and the data: `intact(q)`, "the slot of position q (q mod S) holds the
current-branch content of q". `intact` is an uninterpreted function: the proofs hold for every pool
content that satisfies the invariant, not for a sampled one. The invariant:

    Inv(L, R) :=  0 <= R <= L <= C,  L - R <= S,  R <= read_base(L),
                  every q in [R, L) is intact,   no q in [0, R) is intact   (R is exact)

with read_base(p) = max(0, p - w + 1). Ring physics: two positions share a slot iff they are
congruent mod S (`(a - b) % S == 0`, S symbolic); a step of T tokens at p writes [p, p + T) in
order, so a row q < p survives it iff no written position is congruent to it, and a new row q
survives iff no later position of the same step is.

Proved (each a Z3 query whose negation is unsat; a failing proof prints Z3's model - its
counterexample to induction):
  inv-initial, inv-commit, inv-rewind, inv-clear   Inv holds initially and every accepted operation
                                                   keeps it (commit: 1 <= T <= m, L + T <= C,
                                                   R := max(R, L + T - S); rewind to r <= L allowed
                                                   iff read_base(r) >= min(R, r), R := min(R, r))
  step-safe                 Inv => the next step reads only intact rows or rows it wrote and kept
  rewind-safe               after any accepted rewind, the next step, any admissible T, reads soundly
  rewind-rule-exact         a refused rewind has an admissible T whose step reads a dead row: the
                            closed-form rule is not over-strict (with rewind-safe: it is exactly
                            "sound for every admissible T")
  rewind-to-length-and-zero rewind(L) and rewind(0) are always accepted
  overwrite-window          a step at p overwrites, among [p - S, p), exactly [p - S, p + T - S)
  wrap-runs                 kvcache._policies.wrap_runs: runs inside [0, S), row i = (first + i) mod S
  plan-in-depth             RingPolicy.plan/FlatPolicy.plan: every physical index in [0, depth),
                            depth = min(C, S) (C for flat), write total T, read total p + T - base
Witnesses (Z3 finds them; the spec model, kvcache_spec.model, replays them on data):
  upstream-floor-unsound    m < w: upstream's floor max(0, L - w) accepts a rewind whose next step
                            reads an overwritten row
  upstream-floor-over-strict m > w: upstream refuses a rewind the spec accepts
  upstream-chain-unsound    m = w: two rewinds in a row; upstream recomputes its floor from the new
                            length and accepts a rewind to rows the ring lost before the first

  transcription             the Z3 definitions (S, read_base, retained_after_write, the runs, the
                            rewind rule) equal kvcache's, value for value, on small configurations

Scope. One ring policy: the cache keeps one mark per distinct policy, a step's T is bounded by the
smallest max_write (so T <= m holds for every ring), every policy's mark moves with the one shared
length, and a rewind is accepted iff every policy's rule accepts - so the per-policy proofs compose.
A flat policy never overwrites (R = 0, reads [0, p + T)); plan-in-depth covers its runs. Committing
the open step again changes nothing (the length does not move), so it is not an operation here.
Abandoned branches need no history: `intact` is arbitrary wherever Inv does not constrain it.
Every proof first checks that its hypotheses are satisfiable (a proof from contradictory premises
is reported as failing, "vacuous").

Broken variants (`run_proofs(variant=...)`) show the proofs can fail: "slots-minus-one" sizes the
ring w + m - 2, "upstream-floor" replaces the rewind rule by upstream's floor.

API: `run_proofs(variant="sound") -> list[ProofResult]` (name, statement, holds, seconds,
counterexample, witness), `PROOF_NAMES`, `report(results)`, `main(argv)`.
Run: `python -m kvcache_proofs.z3_induction [--variant NAME]` (exit 0 all hold, 1 a proof fails, 3 none
fails but Z3 left one unknown: its work bound `RLIMIT` or the safety-net timeout ran out).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

if __name__ == "__main__":   # before the imports that need the extra: one line instead of a traceback
    from kvcache_spec._extras import exit_unless_installed
    exit_unless_installed("verify", "python -m kvcache_proofs.z3_induction")

import z3  # type: ignore[import-untyped]

VARIANTS = ("sound", "slots-minus-one", "upstream-floor")
# Work, not time, decides a proof: every query gets RLIMIT units of Z3's deterministic resource counter;
# the wall-clock timeout is only a safety net. A query that runs out of either ends "unknown" - never a
# counterexample, never a proof. Measured: the sound proofs use at most 0.2 million units; finding the
# upstream-floor variant's rewind-rule-exact counterexample after the other proofs ran in the same
# process needs between 20 and 100 million (12 s), hence 500 million.
RLIMIT = 500_000_000
TIMEOUT_MS = 120_000

Expr = Any  # a Z3 expression (z3 is untyped)


@dataclass(frozen=True)
class ProofResult:
    name: str
    statement: str
    holds: bool
    seconds: float
    counterexample: str = ""   # Z3's model when the proof fails (or "unknown: ...")
    witness: str = ""          # for existence claims: the witness found, and its replay on the model

    @property
    def status(self) -> str:
        """"holds", "unknown" (Z3 gave no answer within its bounds) or "counterexample" (any other failure)."""
        if self.holds:
            return "holds"
        return "unknown" if self.counterexample.startswith("unknown") else "counterexample"


def _solver() -> Any:
    solver = z3.Solver()
    solver.set("rlimit", RLIMIT)
    solver.set("timeout", TIMEOUT_MS)
    return solver


# --- the symbolic ring ---------------------------------------------------------------------------

class Ring:
    """Symbols and definitions of one ring policy, for one variant of the implementation."""

    def __init__(self, variant: str = "sound") -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; one of {VARIANTS}")
        self.variant = variant
        self.C, self.w, self.m = z3.Ints("C w m")
        self.L, self.R, self.r, self.T, self.q = z3.Ints("L R r T q")
        self.S = self.w + self.m - (2 if variant == "slots-minus-one" else 1)
        self.intact = z3.Function("intact", z3.IntSort(), z3.BoolSort())

    def config(self) -> Expr:
        """A valid configuration (the broken ring size still needs at least one slot)."""
        return z3.And(self.C >= 1, self.w >= 1, self.m >= 1, self.S >= 1)

    def read_base(self, position: Expr) -> Expr:
        return z3.If(position - self.w + 1 > 0, position - self.w + 1, 0)

    def collide(self, a: Expr, b: Expr) -> Expr:
        """Two positions share a slot: congruent mod S."""
        return (a - b) % self.S == 0

    def survives_step(self, p: Expr, T: Expr, q: Expr, intact: Callable[[Expr], Expr],
                      only_overwriter: bool = False) -> Expr:
        """After a step writes [p, p + T): does the slot of q hold the current content of q?

        With `only_overwriter`, the only later write considered is position q + S (the next one in
        q's slot): a weaker "may survive", implied by the exact one - used where the proof needs
        "does NOT survive", so that Z3 need not find the overwriting position itself.
        """
        j = z3.FreshInt("j")

        def overwritten(low: Expr) -> Expr:
            if only_overwriter:
                return z3.And(low <= q + self.S, q + self.S < p + T)
            return z3.Exists([j], z3.And(low <= j, j < p + T, self.collide(j, q)))

        new_row = z3.Not(overwritten(q + 1))
        old_row = z3.And(intact(q), z3.Not(overwritten(p)))
        return z3.If(z3.And(p <= q, q < p + T), new_row, z3.And(q < p, old_row))

    def rule(self, L: Expr, R: Expr, r: Expr) -> Expr:
        """The rewind rule of the variant (r <= L is checked separately: REWIND-GROW)."""
        if self.variant == "upstream-floor":
            return r >= z3.If(L - self.w > 0, L - self.w, 0)
        return self.read_base(r) >= z3.If(R < r, R, r)

    def retained_after_write(self, R: Expr, end: Expr) -> Expr:
        return z3.If(R > end - self.S, R, end - self.S)

    def inv(self, L: Expr, R: Expr, intact: Callable[[Expr], Expr],
            may_be_intact: Optional[Callable[[Expr], Expr]] = None) -> Expr:
        """Inv(L, R). `may_be_intact`, implied by `intact`, may stand in for it in "no q below R is
        intact" (proving the weaker fact false proves the exact one false)."""
        x = z3.FreshInt("x")
        below = may_be_intact or intact
        return z3.And(
            0 <= R, R <= L, L <= self.C, L - R <= self.S, R <= self.read_base(L),
            z3.ForAll([x], z3.Implies(z3.And(R <= x, x < L), intact(x))),
            z3.ForAll([x], z3.Implies(z3.And(0 <= x, x < R), z3.Not(below(x)))),
        )

    def pool(self, q: Expr) -> Expr:
        return self.intact(q)

    def admissible(self, position: Expr, T: Expr) -> Expr:
        return z3.And(1 <= T, T <= self.m, position + T <= self.C)

    def reads_sound(self, position: Expr, T: Expr, intact: Callable[[Expr], Expr]) -> Expr:
        """Every row the step reads, [read_base(position), position + T), holds its current content."""
        x = z3.FreshInt("x")
        return z3.ForAll([x], z3.Implies(z3.And(self.read_base(position) <= x, x < position + T),
                                         self.survives_step(position, T, x, intact)))


# --- running a proof -----------------------------------------------------------------------------

def _model_text(model: Any) -> str:
    shown = []
    for decl in sorted(model.decls(), key=lambda d: d.name()):
        if decl.name().startswith(("j!", "x!", "k!", "div0", "mod0", "idiv0")):
            continue  # bound variables and Z3's division-by-zero helpers (S >= 1 is a premise)
        shown.append(f"{decl.name()} = {model[decl]}")
    return " ".join(", ".join(shown).split())  # one line: Z3 pretty-prints function graphs over several


def prove(name: str, statement: str, hypotheses: Sequence[Expr], goal: Expr) -> ProofResult:
    """Valid iff hypotheses and not(goal) is unsat; otherwise report Z3's model as the counterexample."""
    started = time.perf_counter()
    solver = _solver()
    solver.add(*hypotheses)
    # A proof from contradictory hypotheses proves nothing: they must have a model first.
    premises = solver.check()
    if premises == z3.unknown:
        return ProofResult(name, statement, False, time.perf_counter() - started,
                           f"unknown: the hypotheses alone ({solver.reason_unknown()})")
    if premises != z3.sat:
        return ProofResult(name, statement, False, time.perf_counter() - started,
                           f"vacuous: the hypotheses are {premises} on their own")
    solver.add(z3.Not(goal))
    verdict = solver.check()
    seconds = time.perf_counter() - started
    if verdict == z3.unsat:
        return ProofResult(name, statement, True, seconds)
    if verdict == z3.sat:
        model = solver.model()
        # A readable counterexample: ask again with every integer constant of the model kept small.
        small = [z3.And(-64 <= d(), d() <= 64) for d in model.decls()
                 if d.arity() == 0 and d.range() == z3.IntSort() and not d.name().startswith(("div0", "mod0"))]
        solver.add(*small)
        if solver.check() == z3.sat:
            model = solver.model()
        return ProofResult(name, statement, False, time.perf_counter() - started,
                           "counterexample: " + _model_text(model))
    return ProofResult(name, statement, False, seconds, f"unknown: {solver.reason_unknown()}")


def _rewound(ring: Ring, r: Expr) -> Callable[[Expr], Expr]:
    """The pool seen after a rewind to r: rows at and after r are no longer current."""
    return lambda x: z3.And(x < r, ring.pool(x))


def invariant_proofs(ring: Ring) -> list[ProofResult]:
    L, R, r, T = ring.L, ring.R, ring.r, ring.T
    pool = ring.pool
    results = [
        prove("inv-initial", "the empty cache (L = R = 0) satisfies Inv, whatever stale rows the pool holds",
              [ring.config()], ring.inv(z3.IntVal(0), z3.IntVal(0), pool)),
    ]
    end = L + T
    after_step: Callable[[Expr], Expr] = lambda x: ring.survives_step(L, T, x, pool)
    may_survive: Callable[[Expr], Expr] = lambda x: ring.survives_step(L, T, x, pool, only_overwriter=True)
    results.append(prove(
        "inv-commit", "Inv(L, R) and a new step (1 <= T <= m, L + T <= C) give Inv(L + T, max(R, L + T - S))",
        [ring.config(), ring.inv(L, R, pool), ring.admissible(L, T)],
        ring.inv(end, ring.retained_after_write(R, end), after_step, may_survive)))
    results.append(prove(
        "inv-rewind", "Inv(L, R) and an accepted rewind to r <= L give Inv(r, min(R, r))",
        [ring.config(), ring.inv(L, R, pool), 0 <= r, r <= L, ring.rule(L, R, r)],
        ring.inv(r, z3.If(R < r, R, r), _rewound(ring, r))))
    results.append(prove(
        "inv-clear", "clear() gives Inv(0, 0): no row is current",
        [ring.config(), ring.inv(L, R, pool)], ring.inv(z3.IntVal(0), z3.IntVal(0), lambda x: z3.BoolVal(False))))
    results.append(prove(
        "step-safe", "Inv(L, R) => a new step at L, any admissible T, reads only rows holding their current content",
        [ring.config(), ring.inv(L, R, pool), ring.admissible(L, T)], ring.reads_sound(L, T, pool)))
    results.append(prove(
        "rewind-safe", "Inv(L, R), an accepted rewind to r, then a step at r with any admissible T: every read is sound",
        [ring.config(), ring.inv(L, R, pool), 0 <= r, r <= L, ring.rule(L, R, r), ring.admissible(r, T)],
        ring.reads_sound(r, T, _rewound(ring, r))))
    # Not over-strict: the witness step is T = 1 and the witness row is min(R, r) - 1.
    witness_row = z3.If(R < r, R, r) - 1
    results.append(prove(
        "rewind-rule-exact",
        "Inv(L, R) and a refused rewind to r <= L: T = 1 is admissible at r and its step reads row "
        "min(R, r) - 1, which does not hold its current content",
        [ring.config(), ring.inv(L, R, pool), 0 <= r, r <= L, z3.Not(ring.rule(L, R, r))],
        z3.And(ring.admissible(r, z3.IntVal(1)), ring.read_base(r) <= witness_row, witness_row < r,
               z3.Not(ring.survives_step(r, z3.IntVal(1), witness_row, _rewound(ring, r))))))
    results.append(prove(
        "rewind-to-length-and-zero", "Inv(L, R) => rewind(L) and rewind(0) are accepted",
        [ring.config(), ring.inv(L, R, pool)], z3.And(ring.rule(L, R, L), ring.rule(L, R, z3.IntVal(0)))))
    return results


def _wrap(first: Expr, count: Expr, n_slots: Expr) -> tuple[Expr, Expr, Expr]:
    """kvcache._policies.wrap_runs, transcribed: (head, wraps, tail) - runs (first, head) and (0, tail)."""
    head = z3.If(count < n_slots - first, count, n_slots - first)
    return head, head != count, count - head


def _wrap_ok(first: Expr, count: Expr, n_slots: Expr, depth: Expr) -> Expr:
    """Both runs inside [0, depth), non-empty, lengths summing to count, second one only on a wrap."""
    head, wraps, tail = _wrap(first, count, n_slots)
    return z3.And(0 <= first, head >= 1, first + head <= depth, z3.Implies(wraps, z3.And(tail >= 1, tail <= depth)),
                  z3.If(wraps, head + tail, head) == count)


def arithmetic_proofs(ring: Ring) -> list[ProofResult]:
    S, C = ring.S, ring.C
    p, T, q, i, first, count = z3.Ints("p T q i first count")
    results = []
    j = z3.Int("j")  # free: the claim holds for every written position j
    results.append(prove(
        "overwrite-window", "a step of 1 <= T <= S tokens at p overwrites, among rows [p - S, p), exactly "
                            "[p - S, p + T - S): q + S is written iff q < p + T - S, and no written j shares "
                            "q's slot otherwise",
        [S >= 1, 1 <= T, T <= S, p - S <= q, q < p],
        z3.And(z3.Implies(q < p + T - S, z3.And(p <= q + S, q + S < p + T, ring.collide(q + S, q))),
               z3.Implies(z3.And(p <= j, j < p + T, ring.collide(j, q)), q < p + T - S))))
    head, wraps, tail = _wrap(first, count, S)
    slot_of_row = z3.If(i < head, first + i, i - head)
    results.append(prove(
        "wrap-runs", "wrap_runs(first, count, S), 0 <= first < S, 1 <= count <= S: runs inside [0, S) totalling "
                     "count, and the i-th row read in order is slot (first + i) mod S",
        [S >= 1, 0 <= first, first < S, 1 <= count, count <= S, 0 <= i, i < count],
        z3.And(_wrap_ok(first, count, S, S), slot_of_row == (first + i) % S)))
    depth = z3.If(C < S, C, S)
    base = ring.read_base(p)
    results.append(prove(
        "plan-in-depth", "RingPolicy.plan(p, T), 1 <= T <= m, p + T <= C: write and read runs lie in [0, min(C, S)), "
                         "write T rows, read p + T - read_base rows; FlatPolicy.plan's lie in [0, C)",
        [ring.config(), 0 <= p, ring.admissible(p, T)],
        z3.And(T <= S, p + T - base <= S,
               _wrap_ok(p % S, T, S, depth), _wrap_ok(base % S, p + T - base, S, depth),
               p + T <= C)))  # flat: write run (p, T) and read run (0, p + T) both end at p + T
    return results


# --- upstream's floor: witnesses, replayed on the spec model ---------------------------------------

def _find(constraints: Sequence[Expr], names: Sequence[Expr]) -> Optional[dict[str, int]]:
    solver = _solver()
    solver.add(*constraints)
    if solver.check() != z3.sat:
        return None
    model = solver.model()
    return {str(n): model.eval(n, model_completion=True).as_long() for n in names}


def _fresh_history(ring: Ring, L: Expr) -> tuple[Expr, Callable[[Expr], Expr]]:
    """A sequence grown from empty to L without rewinds: rows [max(0, L - S), L) are intact, no other."""
    R = z3.If(L - ring.S > 0, L - ring.S, 0)
    return R, (lambda x: z3.And(R <= x, x < L))


def _replay(w: int, m: int, capacity: int, grow_to: int, rewinds: Sequence[int], T: int) -> tuple[list[str], bool]:
    """On the spec model: grow to `grow_to`, apply rewinds as upstream would (accepting them), then run a
    step of T at the new length. Returns the model's DATA-SOUND problems and whether the model itself
    accepts the last rewind (every earlier one must be accepted by the model too, or this raises)."""
    # The spec model is the ground truth (DATA-SOUND on data); imported by name, it is typed Any here.
    M: Any = importlib.import_module("kvcache_spec.model")

    config = M.make_config(capacity, 1, [(M.RING, w, 1, 1)], 512, m)
    assert isinstance(config, M.Config), config
    state = M.initial(config)
    while state.length < grow_to:
        step = min(m, grow_to - state.length)
        state, problems = M.run_layer(config, state, 0, state.length, step)
        assert not problems, problems
        plan = M.plan(config, state, 0, state.length, step)
        assert isinstance(plan, M.Plan), plan
        committed = M.commit(config, state, plan)
        assert isinstance(committed, M.State), committed
        state = committed
    model_accepts = True
    for target in rewinds:
        if not model_accepts:
            raise AssertionError("the spec model refuses an earlier rewind of the chain: not a witness")
        outcome = M.rewind(config, state, target)
        assert not isinstance(outcome, M.Rejected), outcome
        model_accepts = outcome[0]
        # Upstream accepts: truncate the branch whatever the model says.
        state = replace(state, length=target, open_step=None, open_tag=None, truth=state.truth[:target])
    _, problems = M.run_layer(config, state, 0, state.length, T)
    return problems, model_accepts


def witness_proofs() -> list[ProofResult]:
    ring = Ring("sound")
    w, m, L, r, T = ring.w, ring.m, ring.L, ring.r, ring.T
    small = [w <= 8, m <= 8, L <= 30]

    def upstream_floor(length: Expr) -> Expr:
        return z3.If(length - w > 0, length - w, 0)

    results: list[ProofResult] = []

    # m < w: upstream accepts, and the step at r reads a row that is not intact.
    started = time.perf_counter()
    R, intact = _fresh_history(ring, L)
    bad = z3.Int("bad")
    found = _find([w >= 1, m >= 1, m < w, 0 <= r, r <= L, r >= upstream_floor(L), 1 <= T, T <= m,
                   ring.read_base(r) <= bad, bad < r, z3.Not(intact(bad))] + small, [w, m, L, r, T, bad])
    results.append(_witness_result(
        "upstream-floor-unsound", "m < w: upstream's floor accepts a rewind whose next step reads an overwritten row",
        started, found, lambda f: _replay(f["w"], f["m"], f["L"] + f["m"], f["L"], [f["r"]], f["T"]),
        expect_problems=True))

    # m > w: upstream refuses (r < L - w) a rewind the closed-form rule accepts (sound by rewind-safe).
    started = time.perf_counter()
    found = _find([w >= 1, m >= 1, m > w, 1 <= r, r <= L, r < upstream_floor(L), ring.rule(L, R, r)] + small,
                  [w, m, L, r])
    results.append(_witness_result(
        "upstream-floor-over-strict", "m > w: upstream's floor refuses a rewind that is sound for every admissible T",
        started, found, lambda f: _replay_all_T(f), expect_problems=False))

    # m = w, two rewinds: each accepted by upstream's floor from the length at that time.
    started = time.perf_counter()
    r1, bad = z3.Ints("r1 bad")
    found = _find([w >= 1, m == w, 0 <= r1, r1 <= L, r1 >= upstream_floor(L), ring.rule(L, R, r1),
                   0 <= r, r <= r1, r >= upstream_floor(r1), 1 <= T, T <= m,
                   ring.read_base(r) <= bad, bad < r, z3.Not(intact(bad))] + small, [w, m, L, r1, r, T, bad])
    results.append(_witness_result(
        "upstream-chain-unsound", "m = w: after one sound rewind, upstream's floor (recomputed from the new length) "
                                  "accepts a second rewind whose next step reads an overwritten row",
        started, found, lambda f: _replay(f["w"], f["m"], f["L"] + f["m"], f["L"], [f["r1"], f["r"]], f["T"]),
        expect_problems=True))
    return results


def _replay_all_T(found: dict[str, int]) -> tuple[list[str], bool]:
    problems: list[str] = []
    accepts = True
    for T in range(1, found["m"] + 1):
        step_problems, accepts = _replay(found["w"], found["m"], found["L"] + found["m"], found["L"], [found["r"]], T)
        problems += [f"T={T}: {p}" for p in step_problems]
    return problems, accepts


def _witness_result(name: str, statement: str, started: float, found: Optional[dict[str, int]],
                    replay: Callable[[dict[str, int]], tuple[list[str], bool]], expect_problems: bool) -> ProofResult:
    if found is None:
        return ProofResult(name, statement, False, time.perf_counter() - started, "no witness: Z3 found none")
    problems, model_accepts = replay(found)
    shown = ", ".join(f"{k}={v}" for k, v in found.items())
    if expect_problems:
        holds = bool(problems) and not model_accepts
        note = (f"witness {shown}; spec model: refuses this rewind, and the step upstream lets through reads "
                f"{problems[0] if problems else 'nothing wrong (witness NOT confirmed)'}")
    else:
        holds = not problems and model_accepts
        note = (f"witness {shown}; spec model: {'accepts' if model_accepts else 'REFUSES'} the rewind, and every "
                f"T in [1, m] reads soundly: {'yes' if not problems else problems[0]}")
    return ProofResult(name, statement, holds, time.perf_counter() - started,
                       "" if holds else "witness not confirmed by the spec model: " + note, note)


# --- the transcription: the Z3 definitions are the implementation's arithmetic ----------------------

def transcription_check(limit: int = 6, variant: str = "sound") -> ProofResult:
    """Evaluate the Z3 definitions on every small configuration and compare with kvcache's policies:
    read_base, retained_after_write, the slot count, wrap_runs, RingPolicy.plan's runs, depth, and
    SequenceCache's rewind rule (through its public rewind on a real cache). The proofs are about
    these definitions, so they must be the implementation's, value for value."""
    started = time.perf_counter()
    kv: Any = importlib.import_module("kvcache")
    policies: Any = importlib.import_module("kvcache._policies")
    ring = Ring(variant)
    mismatches: list[str] = []

    def value(expr: Expr, **env: int) -> int:
        subst = [(getattr(ring, k) if hasattr(ring, k) else z3.Int(k), z3.IntVal(v)) for k, v in env.items()]
        return int(z3.simplify(z3.substitute(expr, *subst)).as_long())

    for w in range(1, limit):
        for m in range(1, limit):
            policy = kv.RingPolicy(w, m)
            S = value(ring.S, w=w, m=m)
            if S != policy.n_slots:
                mismatches.append(f"S(w={w}, m={m}) = {S}, RingPolicy.n_slots = {policy.n_slots}")
                continue
            for p in range(0, 2 * S + 2):
                if value(ring.read_base(z3.Int("p")), w=w, p=p) != policy.read_base(p):
                    mismatches.append(f"read_base({p}) with w={w}")
                for R in range(0, p + 1):
                    if value(ring.retained_after_write(z3.Int("R0"), z3.Int("E")), w=w, m=m, R0=R, E=p) \
                            != policy.retained_after_write(R, p):
                        mismatches.append(f"retained_after_write({R}, {p}) with w={w}, m={m}")
                for T in range(1, m + 1):
                    plan = policy.plan(p, T)
                    base = value(ring.read_base(z3.Int("p")), w=w, p=p)
                    for runs, first, count in ((plan.write, p % S, T), (plan.read, base % S, p + T - base)):
                        head, wraps, tail = _wrap(z3.IntVal(first), z3.IntVal(count), z3.IntVal(S))
                        expected = [(first, value(head))] + ([(0, value(tail))] if z3.is_true(z3.simplify(wraps)) else [])
                        if [(run.start, run.len) for run in runs] != expected:
                            mismatches.append(f"plan({p}, {T}) with w={w}, m={m}: {runs} vs {expected}")
    # The rewind rule, through a real cache: grow a one-ring cache step by step, then try every target.
    for w in range(1, 4):
        for m in range(1, 4):
            for L in range(0, 10):
                for r in range(0, L + 1):
                    cache = kv.SequenceCache(kv.CacheConfig(40, 1, [kv.LayerConfig(kv.LayerPolicy.ring(w))], 512, m))
                    while cache.length() < L:
                        cache.commit(cache.plan(0, cache.length(), min(m, L - cache.length())))
                    R = cache.retained_from(0)
                    rule = z3.is_true(z3.simplify(z3.substitute(
                        ring.rule(z3.IntVal(L), z3.IntVal(R), z3.IntVal(r)), (ring.w, z3.IntVal(w)), (ring.m, z3.IntVal(m)))))
                    if rule != cache.rewind(r):
                        mismatches.append(f"rewind({r}) from L={L}, R={R}, w={w}, m={m}: Z3 rule {rule}")
    return ProofResult("transcription", "the Z3 definitions equal kvcache's arithmetic on every configuration with "
                       f"w, m < {limit} (and the rewind rule on real caches with w, m < 4, L < 10)",
                       not mismatches, time.perf_counter() - started, "; ".join(mismatches[:5]))


# --- entry points ----------------------------------------------------------------------------------

PROOF_NAMES = ("inv-initial", "inv-commit", "inv-rewind", "inv-clear", "step-safe", "rewind-safe",
               "rewind-rule-exact", "rewind-to-length-and-zero", "overwrite-window", "wrap-runs",
               "plan-in-depth", "upstream-floor-unsound", "upstream-floor-over-strict", "upstream-chain-unsound",
               "transcription")


def run_proofs(variant: str = "sound") -> list[ProofResult]:
    """Every proof, for the implementation (`sound`) or a deliberately broken variant."""
    ring = Ring(variant)
    results = invariant_proofs(ring) + arithmetic_proofs(ring) + witness_proofs()
    # The transcription is about the sound definitions only: a broken variant is not kvcache.
    return results + ([transcription_check()] if variant == "sound" else [])


def report(results: Sequence[ProofResult]) -> str:
    lines = []
    for result in results:
        mark = {"holds": "holds ", "unknown": "UNKNOWN", "counterexample": "FAILS "}[result.status]
        lines.append(f"{mark} {result.seconds:6.2f}s  {result.name}: {result.statement}")
        if result.witness:
            lines.append(f"         {result.witness}")
        if result.counterexample:
            lines.append(f"         {result.counterexample}")
    held = sum(r.holds for r in results)
    unknown = sum(r.status == "unknown" for r in results)
    lines.append(f"{held}/{len(results)} hold, {len(results) - held - unknown} fail, {unknown} unknown, "
                 f"{sum(r.seconds for r in results):.1f} s")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache_proofs.z3_induction", description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS, default="sound",
                        help="prove a deliberately broken variant (expected to fail with a counterexample)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    results = run_proofs(args.variant)
    print(report(results))
    if all(r.holds for r in results):
        return 0
    return 1 if any(r.status == "counterexample" for r in results) else 3


if __name__ == "__main__":
    sys.exit(main())
