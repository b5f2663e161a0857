"""Exhaustive model checker: every reachable state of (spec model x implementation), breadth-first.

For every configuration within the bounds (flat, ring and mixed layers, with and without max_write)
the checker explores every state reachable by the operations a consumer may perform - every
admissible step with each commit pattern (plan every layer then commit the first / last / every
plan; or per layer, one layer at a time, so half-done steps are states too), re-running the open
step, rewinds to every target, clear - and at every state checks every rule: length, retained_from,
depth and can_extend(n) for every n; plan() for every layer and every current step plus admission
probes, gaps, overlaps, other Ts, T past max_write; and a representative set of bad calls (wrong
types, bools, negatives, ints past INT_MAX, layers out of range, forged, doctored and malformed plans),
each of which must raise the model's rule as a typed error and leave the implementation unchanged.
Every plan the implementation issues is executed on pools of our own and every read must be sound
(DATA-SOUND); the layout must also equal the canonical one. The comparisons are `Lockstep`'s
(`kvcache_spec.stateful`), shared with the Hypothesis machine.

States are deduplicated by `Lockstep.key()`: the model's state with each pool row reduced to its
position when it holds current content (tags only matter through that equality), the same for our
pools of the implementation's plans, a half-done per-layer step, and the implementation's attribute
fingerprint. A violation is reported with a SHORTEST path (BFS parents) within its configuration,
configurations being tried smallest first; `replay` re-runs it.

Usage: python -m kvcache_proofs.model_checker [--profile quick|pre-merge|deep] [--layout sequence|cell]
       [--jobs N] [--target python:MODULE:FACTORY] [--time-budget S] [--progress] [--json FILE]
       [--engine processes|ray] [--ray-address ADDRESS] [--no-symmetry]
Exit: 0 holds, 1 violation (a counterexample), 3 incomplete (the time safety net ran out), 2 usage.

The search is layout-independent (`Layout`): `--layout cell` checks the cell layout with the
transitions and checks of `kvcache_proofs.cell_model_checker`.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

if __name__ == "__main__":   # before the imports that need the extra: one line instead of a traceback
    from kvcache_spec._extras import exit_unless_installed
    exit_unless_installed("verify", "python -m kvcache_proofs.model_checker")

from kvcache_proofs._processes import default_sigterm, to_wall_clock
# The search and the sequence layout are model_search's; their names stay importable from here.
from kvcache_proofs.model_search import (SEQUENCE, CheckReport, ConfigResult, Layout, _worker, check_config,
                                         resolve_target)
from kvcache_proofs.model_search import (Counterexample, admit, checks, expand, fingerprint,  # noqa: F401
                                         invariant_problems, invariants_suspended, replay, root_state, transitions)
from kvcache_spec import model
from kvcache_spec.stateful import ConfigSpec
from kvcache_spec.stateful import Lockstep  # noqa: F401 - re-exported

INT_MAX = model.INT_MAX


@dataclass(frozen=True)
class Bounds:
    """Which configurations to check: every capacity in 1..max_capacity, 1..max_layers layers, each
    flat or a ring of window 1..max_window, max_write unset or 1..max_max_write (only with a ring)."""

    max_capacity: int
    max_layers: int
    max_window: int
    max_max_write: int

    def configs(self) -> list[ConfigSpec]:
        """Smallest first, so the first failing configuration is a small one."""
        specs = []
        for capacity in range(1, self.max_capacity + 1):
            for n_layers in range(1, self.max_layers + 1):
                for windows in itertools.product(range(self.max_window + 1), repeat=n_layers):
                    writes: list[Optional[int]] = [None]
                    if any(windows):  # max_write applies to ring layers only
                        writes += list(range(1, self.max_max_write + 1))
                    specs += [ConfigSpec(capacity, windows, m) for m in writes]
        return specs


#: The work is the bounds: every reachable state of every configuration they allow, so a verdict is
#: a function of the code. The time budget is a safety net: running out is INCOMPLETE, not a pass and
#: not a violation. pre-merge: every mix of two layers with windows <= 2 and max_write <= 2 (below,
#: equal to and above the window), capacity <= 4: 128 configurations, 1,815 states, 13.7 s of CPU
#: on a quiet machine (measured; windows and max_write <= 3 took 49 s of CPU, too much for 60 s on two
#: busy cores with the other stages; the deep profile's full bounds, 6104 configurations, take about
#: an hour). The pickled twins and reused fingerprints (stateful.twins_of, call_target) cut it by a
#: sixth: 20.9 -> 17.1 s of CPU (87 -> 106 states per CPU second) measured side by side at load 5;
#: two thirds of what is left is the reference's own icontract checking.
PROFILES: dict[str, Bounds] = {
    "quick": Bounds(max_capacity=3, max_layers=2, max_window=2, max_max_write=2),
    "pre-merge": Bounds(max_capacity=4, max_layers=2, max_window=2, max_max_write=2),
    "deep": Bounds(max_capacity=8, max_layers=3, max_window=4, max_max_write=4),
}
ENGINES = ("processes", "ray")
DEFAULT_BUDGET = {"quick": 60.0, "pre-merge": 180.0, "deep": 14400.0}  # deep measured: 3548 s on 2 cores


class _Progress:
    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total, self.started, self.last = enabled, total, time.monotonic(), 0.0

    def update(self, done: int, states: int, final: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not final and now - self.last < 0.5):
            return
        self.last = now
        elapsed = now - self.started
        rate = states / elapsed if elapsed > 0 else 0.0
        print(f"\rmodel checker: {done}/{self.total} configs, {states} states, {rate:.0f} states/s, "
              f"{elapsed:.0f} s", end="\n" if final else "", file=sys.stderr, flush=True)


def check_all(bounds: Any, factory: Optional[Callable[..., Any]] = None, time_budget: Optional[float] = None,
              *, jobs: int = 1, target: Optional[str] = None, progress: bool = False,
              configs: Optional[Sequence[Any]] = None, layout: Optional[Layout] = None,
              engine: str = "processes", ray_address: Optional[str] = None,
              ray_partition_from: Optional[int] = None) -> CheckReport:
    """Check every configuration of `bounds` (or `configs`). With jobs > 1 the configurations are spread
    over worker processes; the factory travels by name (`target`, python:MODULE:FACTORY, derived from a
    module-level factory; a local one is checked in this process). Stops at the first violation; the report's counterexample is the shortest found.

    `engine="ray"` runs on Ray instead (`kvcache_proofs.ray_engine`; Ray at `ray_address`, else a local
    one): each configuration one Ray task, and those of at least `ray_partition_from` cells searched
    over `jobs` Ray workers partitioned by fingerprint: the same verdict, states and shortest
    counterexample length."""
    if engine == "ray":
        from kvcache_proofs import ray_engine

        distributed: CheckReport = ray_engine.check_all_ray(bounds, factory, time_budget, workers=jobs, target=target,
                                                            address=ray_address, configs=configs, layout=layout,
                                                            partition_from=ray_partition_from)
        return distributed
    if engine != "processes":
        raise ValueError(f"engine is processes or ray, not {engine!r}")
    layout = layout or SEQUENCE
    factory = factory or layout.reference
    specs = list(configs) if configs is not None else bounds.configs()
    if target is None and factory is not layout.reference:
        target = f"python:{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', '?')}"
    name = target or "reference"
    if "<" in name:  # a local factory cannot be named in a worker process: check in this one
        jobs = 1
    report = CheckReport(bounds, name, len(specs), jobs=jobs)
    started = time.monotonic()
    deadline = None if time_budget is None else started + time_budget
    bar = _Progress(progress, len(specs))

    def absorb(result: ConfigResult) -> bool:
        go_on = report.add(result)
        bar.update(report.configs_checked, report.states)
        return go_on

    if jobs <= 1:
        for spec in specs:
            if not absorb(check_config(spec, factory, deadline, layout)):
                break
    else:
        wall_deadline = to_wall_clock(deadline)
        ctx = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
        with default_sigterm(), ctx.Pool(jobs) as pool:
            # One configuration at a time, smallest first: the largest come last and would serialise on
            # one worker in a chunk (the cell pre-merge's two largest, 5 s of CPU each, took one worker's
            # chunk of 4, so 2 jobs ran no faster than 1); singly they run side by side.
            for result in pool.imap_unordered(_worker, [(s, name, wall_deadline, layout) for s in specs], chunksize=1):
                if not absorb(result):
                    pool.terminate()
                    break
    report.complete &= report.configs_checked == len(specs) or report.counterexample is not None
    report.seconds = time.monotonic() - started
    bar.update(report.configs_checked, report.states, final=True)
    return report


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache-model-checker", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="pre-merge")
    parser.add_argument("--layout", choices=("sequence", "cell"), default="sequence",
                        help="the sequence cache (default) or the cell layout (kvcache_proofs.cell_model_checker)")
    parser.add_argument("--target", help="python:MODULE:FACTORY (default: the reference, kvcache.SequenceCache; "
                                         "kvcache.CellCache with --layout cell, a factory of (config, max_seqs))")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: every core)")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds (default: per profile)")
    parser.add_argument("--progress", action="store_true", help="progress on stderr even when not a tty")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--engine", choices=ENGINES, default="processes",
                        help="processes on this machine (default), or ray: each configuration a Ray task "
                             "(pip install 'kvcache-spec[cluster]')")
    parser.add_argument("--ray-address", default=None, help="a Ray cluster to join (default: a local Ray)")
    parser.add_argument("--ray-partition-from", type=int, default=None, metavar="CELLS",
                        help="with --engine ray: configurations of at least CELLS cells are each searched over "
                             "--jobs Ray workers, partitioned by fingerprint (default: none)")
    parser.add_argument("--no-symmetry", action="store_true",
                        help="--layout cell: the full search, no reduction over renamings of ids")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return 0 if exit_.code == 0 else 2
    try:
        factory = None if args.target is None else resolve_target(args.target)
    except (ValueError, ImportError, AttributeError) as error:
        print(f"model checker: bad --target: {error}", file=sys.stderr)
        return 2
    bounds: Any = PROFILES[args.profile]
    budget, layout = DEFAULT_BUDGET[args.profile], SEQUENCE
    if args.layout == "cell":
        # the cell layout builds on this module (its check_all): found by name, so neither imports the other
        cell_model_checker = importlib.import_module("kvcache_proofs.cell_model_checker")
        bounds, budget = cell_model_checker.PROFILES[args.profile], cell_model_checker.DEFAULT_BUDGET[args.profile]
        layout = cell_model_checker.layout(bounds, symmetry=not args.no_symmetry)
    try:
        report = check_all(bounds, factory, args.time_budget or budget, jobs=args.jobs or os.cpu_count() or 1,
                           target=args.target, progress=args.progress or sys.stderr.isatty(), layout=layout,
                           engine=args.engine, ray_address=args.ray_address,
                           ray_partition_from=args.ray_partition_from)
    except RuntimeError as error:  # the Ray engine without Ray
        print(f"model checker: {error}", file=sys.stderr)
        return 2
    print(report.summary())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report.to_json(), handle, indent=2)
    return 0 if report.ok else 1 if report.counterexample else 3


if __name__ == "__main__":
    sys.exit(main())
