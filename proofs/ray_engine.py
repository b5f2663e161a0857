"""The model checkers' distributed engine, on Ray (`pip install 'kvcache-spec[cluster]'`).

The search is `model_checker`'s breadth-first search, partitioned by fingerprint as TLC's distributed
mode and parallel Murphi partition theirs: each of N workers (Ray actors) owns the states whose
fingerprint falls in its hash range (the first 8 bytes modulo N), keeps their parents and depths, and
explores its share of each level. A worker sends each successor it has not sent before to its owner
through Ray's object store (one batch per owner per level); the owner keeps the new ones (their invariants checked once,
`model_checker.admit`) as its share of the next level. Levels are synchronous, so a counterexample is
found at the same depth as the embedded engine finds it (the same shortest length), and a search that
holds explores exactly the same states, transitions and checks. A counterexample's path is rebuilt by
asking each state's owner for its parent.

`ray.init()` starts a local Ray, or joins a cluster with an address (`--ray-address`, or the
RAY_ADDRESS environment variable). Configurations fan out: each is one Ray task running the embedded
search (`model_checker.check_config`), as many at once as the cluster has CPUs, smallest first - the
many small and middle configurations of a profile need no partitioning, and a task per configuration
has no per-level synchronisation. Configurations of at least `partition_from` cells (`--ray-partition-from`)
are searched after them, one at a time, each partitioned over `workers` actors as above: the reach for
one configuration larger than a machine. Either way the results are the embedded engine's.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

from ._processes import from_wall_clock, to_wall_clock
from .model_search import (SEQUENCE, CheckReport, ConfigResult, Counterexample, Layout, admit, check_config, expand,
                           root_state)


def _owner(key: bytes, workers: int) -> int:
    return int.from_bytes(key[:8], "big") % workers


class _Partition:
    """One worker's share of the search (a Ray actor), kept from one configuration to the next."""

    def __init__(self, index: int, workers: int, layout: Layout, factory: Callable[..., Any]) -> None:
        self.index, self.workers, self.layout, self.factory = index, workers, layout, factory
        self.max_depth: Optional[int] = None
        self.parents: dict[bytes, tuple[Optional[bytes], Any, int]] = {}
        self.frontier: list[tuple[bytes, Any]] = []
        self.forwarded: set[bytes] = set()   # sent to their owners already: known there, never sent again

    def seed(self, spec: Any) -> tuple[bytes, list[str]]:
        """Start `spec`'s search: the initial state, kept by its owner (every worker builds it)."""
        self.max_depth = self.layout.max_depth(spec)
        self.parents, self.frontier, self.forwarded = {}, [], set()
        key, root, problems = root_state(self.layout, spec, self.factory)
        if _owner(key, self.workers) == self.index:
            self.parents[key] = (None, None, 0)
            self.frontier = [(key, root)]
        return key, problems

    def expand_level(self) -> tuple[Any, ...]:
        """Explore this worker's share of the level: (stats, violation), then one batch per owner."""
        batches: list[list[tuple[bytes, bytes, Any, Any, int]]] = [[] for _ in range(self.workers)]
        states = checks = transitions = 0
        violation = None
        for key, lock in self.frontier:
            states += 1
            found = expand(self.layout, key, lock)
            checks += found.checks
            transitions += found.transitions
            depth = self.parents[key][2]
            for child_key, op, child in found.children:
                if child_key in self.forwarded or child_key in self.parents:
                    continue  # its owner has it (the first to reach it stays its parent)
                self.forwarded.add(child_key)
                batches[_owner(child_key, self.workers)].append((child_key, key, op, child, depth + 1))
            if found.violation is not None:
                violation = (key, found.violation[0], found.violation[1])
                break
        self.frontier = []
        return ((states, checks, transitions), violation, *batches)

    def receive(self, *batches: list[tuple[bytes, bytes, Any, Any, int]]) -> tuple[int, int, Any]:
        """Keep the new successors among `batches` (in the senders' order): (kept, past the depth bound,
        the first violation: a new state whose invariants fail)."""
        kept = beyond = 0
        for batch in batches:
            for child_key, parent, op, child, depth in batch:
                if child_key in self.parents:
                    continue
                problems = admit(child)
                if problems:
                    return kept, beyond, (parent, op, problems)
                self.parents[child_key] = (parent, op, depth)
                if self.max_depth is not None and depth > self.max_depth:
                    beyond += 1
                else:
                    kept += 1
                    self.frontier.append((child_key, child))
        return kept, beyond, None

    def parent(self, key: bytes) -> tuple[Optional[bytes], Any]:
        parent, op, _ = self.parents[key]
        return parent, op


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise RuntimeError("the Ray engine needs Ray: pip install 'kvcache-spec[cluster]'") from error
    return ray


def connect(address: Optional[str] = None) -> Any:
    """The `ray` module, initialised once: a local Ray when `address` is None, else the cluster at
    `address` (an already initialised Ray is kept as it is)."""
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return ray


def start(workers: int, layout: Layout, factory: Callable[..., Any]) -> list[Any]:
    """`workers` Ray actors for a search of `factory`'s targets (Ray must be initialised; the factory
    travels by value, as Ray pickles it)."""
    ray = _import_ray()
    actor = ray.remote(_Partition)
    return [actor.remote(index, workers, layout, factory) for index in range(workers)]


def check_config_ray(spec: Any, partitions: list[Any], layout: Layout,
                     deadline: Optional[float] = None) -> ConfigResult:
    """`model_checker.check_config` over the actors of `start`."""
    ray = _import_ray()
    started = time.monotonic()
    workers = len(partitions)
    result = ConfigResult(spec, max_depth=layout.max_depth(spec))
    seeds = ray.get([p.seed.remote(spec) for p in partitions])
    root_key, root_problems = seeds[0]

    def path(key: bytes) -> list[Any]:
        ops: list[Any] = []
        while True:
            parent, op = ray.get(partitions[_owner(key, workers)].parent.remote(key))
            if parent is None:
                return ops[::-1]
            ops.append(op)
            key = parent

    def fail(key: bytes, op: Any, problems: list[str]) -> ConfigResult:
        result.counterexample = Counterexample(spec, path(key) + [op], problems,
                                               None if layout is SEQUENCE else layout)
        return result

    try:
        if root_problems:
            from kvcache_spec.stateful import Observe
            return fail(root_key, Observe(), root_problems)
        pending = 1
        while pending:
            if deadline is not None and time.monotonic() > deadline:
                result.complete = False
                break
            outputs = [p.expand_level.options(num_returns=workers + 2).remote() for p in partitions]
            received = [partitions[owner].receive.remote(*[out[owner + 2] for out in outputs])
                        for owner in range(workers)]
            violations = []
            for out in outputs:
                (states, checks, transitions), violation = ray.get(out[0]), ray.get(out[1])
                result.states += states
                result.checks += checks
                result.transitions += transitions
                if violation is not None:
                    violations.append(violation)
            pending = 0
            for kept, beyond, violation in ray.get(received):
                pending += kept
                result.beyond += beyond
                if violation is not None:
                    violations.append(violation)
            if violations:  # all of this level: the same length as the embedded engine's first
                return fail(*violations[0])
        return result
    finally:
        result.seconds = time.monotonic() - started


def _search_whole(spec: Any, factory: Callable[..., Any], wall_deadline: Optional[float], layout: Layout) -> ConfigResult:
    """One configuration's embedded search, in a Ray task (the deadline travels as wall-clock time)."""
    return check_config(spec, factory, from_wall_clock(wall_deadline), layout)


def _fan_out(specs: Sequence[Any], factory: Callable[..., Any], deadline: Optional[float], layout: Layout,
             report: CheckReport) -> bool:
    """Every configuration of `specs` as its own Ray task; False once one has a counterexample (the
    others are cancelled). Results are added smallest configuration first, as the embedded engine adds
    them, so the report's first counterexample is the same one."""
    ray = _import_ray()
    search = ray.remote(num_cpus=1)(_search_whole)
    wall_deadline = to_wall_clock(deadline)
    pending = [search.remote(spec, factory, wall_deadline, layout) for spec in specs]
    answered = 0
    try:
        for handle in pending:
            result = ray.get(handle)
            answered += 1
            if not report.add(result):
                return False
        return True
    finally:
        cancel_unfinished(pending[answered:])


def cancel_unfinished(handles: Sequence[Any]) -> None:
    """Cancel the tasks of `handles` that have not finished (cancelling a finished task trips an
    internal check of Ray 2.60, which aborts the driver at exit)."""
    if not handles:
        return
    ray = _import_ray()
    _, unfinished = ray.wait(list(handles), num_returns=len(handles), timeout=0)
    for handle in unfinished:
        ray.cancel(handle, force=True)


def check_all_ray(bounds: Any, factory: Optional[Callable[..., Any]] = None, time_budget: Optional[float] = None,
                  *, workers: int = 2, target: Optional[str] = None, address: Optional[str] = None,
                  configs: Optional[Sequence[Any]] = None, layout: Optional[Layout] = None,
                  partition_from: Optional[int] = None) -> CheckReport:
    """`model_checker.check_all` on Ray: the configurations of fewer than `partition_from` cells (all,
    when None) fanned out as one task each; then each larger one, smallest first, over `workers` actors."""
    ray = connect(address)
    layout = layout or SEQUENCE
    factory = factory or layout.reference
    if target is None and factory is not layout.reference:
        target = f"python:{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', '?')}"
    name = target or "reference"
    specs = list(configs) if configs is not None else bounds.configs()
    report = CheckReport(bounds, name, len(specs), jobs=workers)
    started = time.monotonic()
    deadline = None if time_budget is None else started + time_budget
    whole = [spec for spec in specs if partition_from is None or spec.capacity < partition_from]
    partitioned = [spec for spec in specs if spec not in whole]
    if _fan_out(whole, factory, deadline, layout, report) and partitioned:
        partitions = start(workers, layout, factory)
        try:
            for spec in partitioned:
                result = check_config_ray(spec, partitions, layout, deadline)
                if not report.add(result):
                    break
        finally:
            for partition in partitions:
                ray.kill(partition)
    report.complete &= report.configs_checked == len(specs) or report.counterexample is not None
    report.seconds = time.monotonic() - started
    return report

