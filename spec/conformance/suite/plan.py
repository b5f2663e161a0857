"""The suite's plan: the profiles (the work a run promises, as counts), the verdicts, the limits on
what is kept and shrunk, and the order the programs run in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .. import layouts
from .. import scope as scopes
from ..configs import JsonConfig
from ..engine import Step
from ..targets import PythonTarget, Target, TargetCrash

REPORT_FORMAT = "kvcache-conformance-report/2"
CONFORMING, NOT_CONFORMING, INCOMPLETE = "CONFORMING", "NOT CONFORMING", "INCOMPLETE"

@dataclass(frozen=True)
class Profile:
    """The work a profile promises, as counts; `safety_seconds` only stops a run gone wrong (INCOMPLETE).

    Each request is bounded by the per-request timeout (cmd: targets), each run by these counts."""

    random_programs: int
    largest: int                 # steps of the largest random program
    shrink_budget: int           # programs run to shrink one finding
    safety_seconds: float        # wall-clock safety net: hitting it makes the run INCOMPLETE
    restart_cap: int             # target restarts after crashes and hangs before the run stops
    row_budget: int              # the harness's own work on its pools (rows allocated and copied)


PROFILES: dict[str, Profile] = {
    # The reference needs 22 thousand pool rows in quick, 112 thousand in pre-merge: the row budgets
    # leave a margin of several hundred, and stop a target announcing millions of rows per layer.
    "quick": Profile(150, 24, 300, 600.0, 24, 1 << 23),
    "pre-merge": Profile(1500, 40, 600, 3600.0, 64, 1 << 26),
    "deep": Profile(15000, 60, 2000, 6 * 3600.0, 256, 1 << 29),
}
# No cap hides a cause: every distinct cause is kept (the JSON report lists all). The caps bound work only:
MAX_SHRINKS = 64        # findings shrunk per (class, rule), or of all crashes; past it a new cause is kept unshrunk
MAX_CRASHES = 5         # distinct crashes shrunk (each costs fresh processes); past it one is kept unshrunk
MAX_CAUSES = 3          # causes printed in full per (class, rule) in the summary; --all-causes prints every one
UNSHRUNK = ("not shrunk: the shrink cap of its class and rule (MAX_SHRINKS, MAX_CRASHES in suite/plan.py) was "
            "reached; the steps are the whole program up to the finding")
CRASH_SHRINK_BUDGET = 12
# Programs in a row that crash the same way (how, and in which method) before the run stops. The
# programs interleave configurations and kinds of steps, so a streak this long means the target crashes
# that way whatever it is given: the rest would repeat it, each hang at the cost of a timeout (a target
# that hung on every plan took 532 s to reach its verdict in pre-merge, 65 timeouts to the restart cap).
SAME_CRASH_IN_A_ROW = 8


@dataclass(frozen=True)
class Options:
    """The caller's choices for one run (run_suite's arguments)."""
    stop_after_first: bool
    crash_shrink_budget: int
    continue_past_lenient: bool
    restart_cap: int
    # --baseline (an earlier run's report of the same target, profile and seed): the numbers of the programs that
    # failed there (None: no baseline), its causes (their cause_key) and their programs (config and steps, as JSON)
    known_failing: Optional[frozenset[int]] = None
    known_causes: frozenset[str] = frozenset()
    known_programs: frozenset[str] = frozenset()


def interleaved(configs: tuple[JsonConfig, ...], layout: layouts.Layout) -> list[tuple[JsonConfig, list[Step]]]:
    """Every edge program of every configuration once, on a diagonal: in round r, configuration c runs
    its program number (r + c) mod K. The first programs already touch every configuration (and
    family), so a run stopped early has still exercised each of them; and programs next to each other
    differ in configuration and in kind, so programs that crash alike in a row (SAME_CRASH_IN_A_ROW)
    are different programs, not one kind of program that happens to come first everywhere. The layout's
    later edge programs (a later spec version's) follow, on a diagonal of their own."""
    out = _diagonal(configs, layout.edge_programs)
    for later in (layout.later_edge_programs, layout.latest_edge_programs, *layout.newer_edge_programs):
        out += _diagonal(configs, later) if later else []   # each a diagonal of its own
    return out


def _diagonal(configs: tuple[JsonConfig, ...], programs_of: Callable[[JsonConfig], list[tuple[str, list[Step]]]]
              ) -> list[tuple[JsonConfig, list[Step]]]:
    per = [programs_of(cfg) for cfg in configs]
    kinds = max((len(p) for p in per), default=0)
    return [(cfg, programs[(r + c) % kinds][1]) for r in range(kinds)
            for c, (cfg, programs) in enumerate(zip(configs, per)) if (r + c) % kinds < len(programs)]


def without_missing_verbs(target: Target, scope: scopes.Scope, configs: tuple[JsonConfig, ...]) -> scopes.Scope:
    """The scope less the verbs a python: target's caches do not have: a contiguous op cache without a `trim`
    method is not judged on trim, one without `state` and `load_state` methods not on state (OP-STATE), nor one
    without `quantize` on quantize (OP-QUANTIZE), nor one without `extend` and `extract` on merge (OP-ROWS), whatever
    its scope says (as the C++ op driver leaves them out of its hello without their callables). The factory is
    called once, on the first configuration inside the scope; a refused one leaves the scope as declared."""
    verbs = {"trim": ("trim",), "state": ("state", "load_state"), "quantize": ("quantize",),
             "merge": ("extend", "extract")}
    if not isinstance(target, PythonTarget) or target.layout != "op-contiguous" or \
            not any(feature in scope.features for feature in verbs):
        return scope
    inside = [cfg for cfg in configs if scope.covers(cfg) and scope.speaks(cfg)]
    if not inside:
        return scope
    sent = scopes.without_sizes(inside[0]) if scope.relaxes(scopes.LAZY_SHAPES) else dict(inside[0])   # as the engine
    try:
        probe = target.factory(sent)   # another cache than the run's (an op factory takes the JSON config)
    except Exception:
        return scope
    for feature, methods in verbs.items():
        if feature in scope.features and not all(callable(getattr(probe, method, None)) for method in methods):
            scope = scope.without(feature, f"its cache has no {' and '.join(methods)} method"
                                           f"{'s' if len(methods) > 1 else ''}: not judged on {feature}")
    return scope


def declared_scope(target: Target) -> scopes.Scope:
    """The target's declared scope (the whole spec when its handshake fails)."""
    try:
        return target.declared_scope()
    except TargetCrash:
        # No scope was declared: the whole spec is assumed. Each create restarts the target, so its
        # handshake crash is reported as a crash at create, and the restart cap bounds the run.
        return scopes.Scope(scopes.FULL.features, source="the handshake failed: the whole spec assumed")

