"""Exhaustive model checker for the paged layout: every reachable state of (paged model x implementation).

The search is `model_search`'s (breadth-first, deduplicated by the harness's key, shortest counterexample, worker
processes or Ray, one wall-clock budget); this module gives it the paged layout's `Layout`: the lockstep harness
`PagedLockstep` (also the Hypothesis machine's, tests/test_paged_lockstep.py), the transitions and the checks.

The harness acts as the model runner and judges by the data, never by block ids (spec/paged_model.py): after
each served admit / extend it writes `fingerprints(keys, tokens)[p]` into the slot the target's table maps each
newly reserved position p to, and then the model's `rewrite_problems` (the writes land on no slot a live request
still needs), `data_problems` (every needed position reads back its own value), `table_problems` (only full
blocks shared, conservation, reference counts) must be empty; an admission's hit must be one the model allows,
an extension's n the model's; a refusal (None) must be allowed (PAGED-IDLE-FIT) and change nothing; a call the
model rejects must raise a `KVCacheError` naming the model's rule and argument, and change nothing.

Transitions, from every state within the bounds: admit of every free request id with every prompt over the
alphabet of every length 1 .. max_len, each key list and budget; extend of every live request with no token or
one of each token, each budget (when well-formed); free of every live request. Request ids are interchangeable
(nothing in the model or the face depends on the name), so a new request takes the lowest free id. Checks at every state (each must
change nothing): the tables, available() and ref_counts(); bad calls of every verb (an id live or not, an empty
prompt, a bool token, a negative token, a prompt past max_model_len, a zero budget, nothing to compute, a double
free).

Bounds (`PagedBounds`, `PROFILES`): small pools (3 blocks; 2-4 in deep), block sizes 1-2, a full group, a window group and
both, prefix caching on and off, two request ids, a two-token alphabet; to a depth bound per profile (every state
reachable in at most D calls gets every check and every transition; the report counts the states past it). The
space is not small: the model remembers every prefix ever computed and the memory every slot ever written, so
the profiles bound the depth, not the state count.

Usage: python -m kvcache_proofs.paged_checker [--profile quick|pre-merge|deep] [--jobs N] [--engine processes|ray]
       [--ray-address ADDRESS] [--ray-partition-from BLOCKS] [--time-budget S]
Exit: 0 holds, 1 violation (its program printed, replayable), 3 incomplete, 2 usage.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import pickle
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence, Union

if __name__ == "__main__":   # before the imports that need the extra: one line instead of a traceback
    from kvcache_spec._extras import exit_unless_installed
    exit_unless_installed("verify", "python -m kvcache_proofs.paged_checker")

from kvcache_proofs.model_search import Layout
from kvcache_spec import paged_model as pm
from kvcache_spec.model import Rejected

Factory = Callable[[dict[str, Any]], Any]


def reference_factory(config: dict[str, Any]) -> Any:
    """The reference (`kvcache.paged.PagedCache`), imported here so the model's modules never import kvcache."""
    from kvcache.paged import PagedCache
    return PagedCache(config)


@dataclass(frozen=True)
class PagedSpec:
    """One configuration: block size, usable blocks, groups (None = full, W = window W), prefix caching, and the
    longest request."""

    block_size: int
    num_blocks: int
    windows: tuple[Optional[int], ...]
    prefix_caching: bool
    max_model_len: int

    @property
    def capacity(self) -> int:   # the Ray engine orders and partitions configurations by `capacity`
        return self.num_blocks

    def config(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "num_blocks": self.num_blocks, "max_model_len": self.max_model_len,
                "groups": [{"kind": "full"} if w is None else {"kind": "window", "window": w} for w in self.windows],
                "prefix_caching": self.prefix_caching}


# --- the calls -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    """One call of the paged face: verb and its arguments in the face's order (PROTOCOL's names)."""

    verb: str                 # admit, extend, free, table
    args: tuple[Any, ...]

    def __repr__(self) -> str:
        return f"Call({self.verb!r}, {self.args!r})"


Shown = tuple[int, tuple[tuple[str, tuple[tuple[Optional[int], ...], ...]], ...], tuple[tuple[int, int], ...]]


class PagedLockstep:
    """The model and a target driven together; `apply(call)` returns the problems found (empty: none)."""

    def __init__(self, spec: PagedSpec, factory: Optional[Factory] = None, thorough: bool = False) -> None:
        self.spec = spec
        self.thorough = thorough
        self.setup_problems: list[str] = []
        cfg = pm.configured(spec.config())
        if isinstance(cfg, Rejected):
            raise ValueError(f"not a paged configuration: {spec} ({cfg})")
        self.state = pm.initial(cfg)
        self.target = (factory or reference_factory)(spec.config())
        self.memory: dict[pm.Slot, int] = {}
        self.ref_counts = callable(getattr(self.target, "ref_counts", None))
        self._shown: Optional[Shown] = None

    def clone(self) -> PagedLockstep:
        return copy.deepcopy(self)

    def twins(self) -> Callable[[], PagedLockstep]:
        """Copies of this harness, the state serialised once (the search makes one per transition)."""
        frozen = pickle.dumps(self, pickle.HIGHEST_PROTOCOL)
        return lambda: pickle.loads(frozen)

    # --- what the target shows ----------------------------------------------------------------------

    def tables(self) -> dict[str, list[list[Optional[int]]]]:
        return {name: self.target.table(name) for name in sorted(self.state.live)}

    def shown(self) -> Shown:
        """available(), every live table and ref_counts(), asked once per state (a served call forgets them)."""
        if self._shown is None:
            tables = tuple((name, tuple(map(tuple, table))) for name, table in self.tables().items())
            refs = tuple(sorted(self.target.ref_counts().items())) if self.ref_counts else ()
            self._shown = (self.target.available(), tables, refs)
        return self._shown

    def _mark(self) -> Any:
        """What must not change across a call that is refused or rejected: the target's whole state when it
        shows one (the reference's `_snapshot`, stronger than what the face shows), else what it shows."""
        if hasattr(self.target, "_snapshot"):
            return self.target._snapshot()
        self._shown = None
        return self.shown()

    def key(self) -> Any:
        """The state's identity: the model's state, what the target shows and its own state (its ids decide its
        future), and the memory's slots that a table maps."""
        live = tuple(sorted((name, entry.tokens, entry.keys, entry.computed) for name, entry in self.state.live.items()))
        inner = self.target._snapshot() if hasattr(self.target, "_snapshot") else ()
        return live, tuple(sorted(self.state.cached)), self.shown(), inner, tuple(sorted(self.memory.items()))

    # --- one call ------------------------------------------------------------------------------------

    def apply(self, call: Call) -> list[str]:
        before = self._mark()
        if call.verb == "admit":
            expected: Any = pm.admit(self.state, *call.args)
        elif call.verb == "extend":
            expected = pm.extend(self.state, *call.args)
        elif call.verb == "free":
            expected = pm.free(self.state, *call.args)
        elif call.verb == "table":
            expected = pm.lookup(self.state, *call.args)
        else:
            return [f"HARNESS: unknown verb {call.verb}"]
        try:
            got = getattr(self.target, call.verb)(*call.args)
        except Exception as error:   # judged below: only a rejection the model makes may raise
            return self._raised(call, expected, error, before)
        if isinstance(expected, Rejected):
            return [f"{expected.rule}: {call!r} was served ({got!r}); the model rejects it ({expected.argument})"]
        if call.verb == "table":
            return [] if self._mark() == before else [f"PAGED-ATOMIC: {call!r} changed the target"]
        self._shown = None   # a served call: what the target shows is asked again
        if call.verb == "free":
            self.state = expected
            return self._judge(None)
        if got is None:
            return self._refused(call, expected, before)
        if call.verb == "admit":
            if not expected.allows(got) or type(got) is not int:
                return [f"PAGED-HIT: {call!r} hit {got!r}; the model allows whole blocks up to {expected.max_hit}"]
            step_from = got
            self.state = expected.after(got)
        else:
            if got != expected.n or type(got) is not int:
                return [f"PAGED-RESERVE: {call!r} reserved {got!r}, not {expected.n}"]
            step_from = self.state.live[call.args[0]].computed
            self.state = expected.after
        return self._judge((call.args[0], step_from))

    def _raised(self, call: Call, expected: Any, error: Exception, before: Any) -> list[str]:
        if not isinstance(expected, Rejected):
            return [f"{call!r} raised {type(error).__name__}: {error}; the model serves it"]
        problems = []
        rule, argument = getattr(error, "rule", None), getattr(error, "argument", None)
        if rule != expected.rule or not isinstance(argument, str) or argument.split("[")[0] != expected.argument:
            problems.append(f"{expected.rule}: {call!r} raised [{rule}] {argument}, not [{expected.rule}] "
                            f"{expected.argument}")
        if self._mark() != before:
            problems.append(f"PAGED-ATOMIC: the rejected {call!r} changed the target")
        return problems

    def _refused(self, call: Call, expected: Any, before: Any) -> list[str]:
        problems = []
        if expected.must_fit:
            problems.append(f"PAGED-IDLE-FIT: {call!r} refused, though it fits the idle pool")
        if self._mark() != before:
            problems.append(f"PAGED-ATOMIC: the refused {call!r} changed the target")
        return problems

    def _judge(self, stepped: Optional[tuple[str, int]]) -> list[str]:
        """Write what the step computed, then read every live request back and recount the books."""
        available, shown_tables, shown_refs = self.shown()
        tables = {name: [list(row) for row in table] for name, table in shown_tables}
        problems: list[pm.Problem] = []
        if stepped is not None:
            request, step_from = stepped
            planned = pm.writes(self.state, request, tables[request], step_from)
            if isinstance(planned, tuple):
                return [f"{planned[0]}: {planned[1]}"]
            problems += pm.rewrite_problems(self.state, tables, planned, stepped)
            self.memory.update(planned)
        problems += pm.data_problems(self.state, tables, self.memory, stepped)
        refs = dict(shown_refs) if self.ref_counts else None
        problems += pm.table_problems(self.state, tables, available, refs)
        return [f"{rule}: {what}" for rule, what in problems]


# --- the transitions and the checks -------------------------------------------------------------------

@dataclass(frozen=True)
class PagedBounds:
    """Configurations: each of `sizes` x `num_blocks` x `windows` x prefix caching on and off; requests named
    r0 .. r{requests-1}; prompts over `alphabet` of 1 .. max_len tokens; budgets 1 .. max_budget; keys [] or
    also ["k"]; every configuration to `max_depth` calls (None: exhaustive)."""

    sizes: tuple[int, ...]
    num_blocks: tuple[int, ...]
    windows: tuple[tuple[Optional[int], ...], ...]
    max_len: int
    requests: int = 2
    alphabet: tuple[int, ...] = (0, 1)
    max_budget: int = 2
    keys: tuple[tuple[str, ...], ...] = ((),)
    depth: Optional[int] = None

    def configs(self) -> list[PagedSpec]:
        return [PagedSpec(size, blocks, windows, caching, self.max_len)
                for blocks in self.num_blocks for size in self.sizes for windows in self.windows
                for caching in (True, False)]

    def max_depth(self, spec: PagedSpec) -> Optional[int]:
        return self.depth


FULL, WINDOW, BOTH = (None,), (2,), (None, 2)
#: The reference runs with every contract on, and each state gets ~20 checks and ~13-30 transitions, each judged by
#: the model; the space grows with the depth (the model remembers every prefix computed, the memory every slot
#: written), so the profiles bound the depth. Measured on this 2-core machine at load 9-10 (other jobs running):
#: quick 4 configurations, 1,476 states, 10-15 s on 1-2 jobs (96-146 states/s); pre-merge 12 configurations,
#: 12,644 states, 203 s on 2 jobs (62 states/s); the same bounds with 2 and 3 blocks (24 configurations) 19,394
#: states, 307 s on 1 job (63 states/s). deep has not been run end to end.
PROFILES: dict[str, PagedBounds] = {
    "quick": PagedBounds(sizes=(2,), num_blocks=(3,), windows=(FULL, BOTH), max_len=3, depth=2),
    "pre-merge": PagedBounds(sizes=(1, 2), num_blocks=(3,), windows=(FULL, WINDOW, BOTH), max_len=3, depth=3),
    "deep": PagedBounds(sizes=(1, 2), num_blocks=(2, 3, 4), windows=(FULL, WINDOW, BOTH, (1,)), max_len=4,
                        keys=((), ("k",)), depth=4),
}
DEFAULT_BUDGET = {"quick": 60.0, "pre-merge": 600.0, "deep": 14400.0}


def _names(bounds: PagedBounds) -> list[str]:
    return [f"r{index}" for index in range(bounds.requests)]


@dataclass(frozen=True)
class Transitions:
    """Every well-formed call a scheduler may make now, within `bounds` (picklable: travels to workers)."""

    bounds: PagedBounds

    def __call__(self, lock: PagedLockstep) -> Iterator[Call]:
        bounds, state = self.bounds, lock.state
        budgets = range(1, bounds.max_budget + 1)
        admitted = False
        for name in _names(bounds):
            entry = state.live.get(name)
            if entry is None:
                if admitted:   # request ids are interchangeable: a new request takes the lowest free one
                    continue
                admitted = True
                for length in range(1, bounds.max_len + 1):
                    for prompt in itertools.product(bounds.alphabet, repeat=length):
                        for keys in bounds.keys:
                            for budget in budgets:
                                yield Call("admit", (name, list(prompt), list(keys), budget))
                continue
            pending = len(entry.tokens) - entry.computed
            grow: list[list[int]] = ([[]] if pending else []) + (
                [[token] for token in bounds.alphabet] if len(entry.tokens) < bounds.max_len else [])
            for tokens in grow:
                for budget in budgets:
                    yield Call("extend", (name, tokens, budget))
            yield Call("free", (name,))


@dataclass(frozen=True)
class Checks:
    """Calls that must change nothing: the queries and the malformed calls."""

    bounds: PagedBounds

    def __call__(self, lock: PagedLockstep) -> Iterator[Call]:
        live = sorted(lock.state.live)
        dead = [name for name in _names(self.bounds) if name not in live] + ["nobody"]
        too_long = [0] * (lock.spec.max_model_len + 1)
        for name in live:
            yield Call("table", (name,))
            yield Call("admit", (name, [0], [], 1))                          # already live
            yield Call("extend", (name, [0], 0))                             # zero budget
            yield Call("extend", (name, [True], 1))                          # bool token
            entry = lock.state.live[name]
            if len(entry.tokens) == entry.computed:
                yield Call("extend", (name, [], 1))                          # nothing to compute
            yield Call("extend", (name, too_long, 1))                        # past max_model_len
        for name in dead[:1] + ["nobody"]:
            yield Call("table", (name,))
            yield Call("free", (name,))                                      # unknown or already freed
            yield Call("extend", (name, [0], 1))
        yield Call("admit", (dead[0], [], [], 1))                            # empty prompt
        yield Call("admit", (dead[0], [0, -1], [], 1))                       # negative token
        yield Call("admit", (dead[0], too_long, [], 1))                      # past max_model_len
        yield Call("admit", (dead[0], [0], [1], 1))                          # a key not a str
        yield Call("admit", (dead[0], [0], [], False))                       # bool budget
        yield Call("admit", (3, [0], [], 1))                                 # request not a str


def _harness(spec: PagedSpec, factory: Factory) -> PagedLockstep:
    return PagedLockstep(spec, factory, thorough=False)


def layout(bounds: PagedBounds) -> Layout:
    return Layout("paged", "kvcache_proofs.paged_checker", _harness, "PagedLockstep", reference_factory,
                  Transitions(bounds), Checks(bounds), max_depth=bounds.max_depth, key=PagedLockstep.key)


def check_paged(profile: str = "quick", factory: Optional[Factory] = None, time_budget: Optional[float] = None,
                *, jobs: int = 1, engine: str = "processes", ray_address: Optional[str] = None,
                configs: Optional[Sequence[PagedSpec]] = None, ray_partition_from: Optional[int] = None) -> Any:
    """Check the profile's configurations. On Ray, those of at least `ray_partition_from` blocks are each searched
    by `jobs` Ray workers partitioned by state fingerprint (one configuration past one machine), the others as
    one task each."""
    from kvcache_proofs.model_checker import check_all
    bounds = PROFILES[profile]
    return check_all(bounds, factory, DEFAULT_BUDGET[profile] if time_budget is None else time_budget, jobs=jobs,
                     layout=layout(bounds), engine=engine, ray_address=ray_address, configs=configs,
                     ray_partition_from=ray_partition_from)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcache_proofs.paged_checker",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--engine", choices=("processes", "ray"), default="processes")
    parser.add_argument("--ray-address", default=None)
    parser.add_argument("--ray-partition-from", type=int, default=None,
                        help="on Ray, search each configuration of at least this many blocks over --jobs workers")
    parser.add_argument("--time-budget", type=float, default=None)
    args = parser.parse_args(argv)
    started = time.monotonic()
    report = check_paged(args.profile, None, args.time_budget, jobs=args.jobs, engine=args.engine,
                         ray_address=args.ray_address, ray_partition_from=args.ray_partition_from)
    seconds = time.monotonic() - started
    print(f"paged checker, profile {args.profile}: {report.configs_checked}/{report.configs_total} configurations, "
          f"{report.states} states, {seconds:.1f} s, {report.states / max(seconds, 1e-9):.0f} states/s")
    if report.counterexample is not None:
        print("VIOLATION:", *report.counterexample.problems, sep="\n  ")
        print(report.counterexample.program())
        return 1
    if not report.complete:
        print("INCOMPLETE: the time budget ran out")
        return 3
    print("holds")
    return 0


if __name__ == "__main__":   # run as the imported module, so workers (processes, Ray) find its classes by name
    from kvcache_proofs import paged_checker
    sys.exit(paged_checker.main())
