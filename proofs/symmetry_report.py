"""What the symmetry over sequence ids buys, per group of a cell profile: every configuration of the
group searched twice on one job, once per class of id renamings (docs/verification.md, "How the cell layout is verified") and once in full; states,
CPU seconds, states per CPU second and the reduction factor, summed per group.

    python -m kvcache_proofs.symmetry_report [--profile quick|pre-merge|deep] [--groups 0,2]
                                             [--max-capacity N] [--time-budget S]

A group is a line of the profile's `CellBounds.groups`; a configuration counts in the group that
governs it (`CellBounds.governing_group`). Both searches must hold (exit 1 otherwise). `--time-budget`
is a safety net per search: a search it cuts short makes its group's numbers lower bounds, marked
INCOMPLETE, and the exit code 3. The deep profile's capacity-6 group has no full search within reach
here (about 2 million states per layer kind); name the groups to run with `--groups`, and cut the
configurations with `--max-capacity` (a group's row then counts only those run).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence


@dataclass
class Search:
    """One kind of search over a group's configurations, summed."""

    states: int = 0
    cpu: float = 0.0
    complete: bool = True
    holds: bool = True

    def per_second(self) -> float:
        return self.states / self.cpu if self.cpu > 0 else 0.0


@dataclass
class GroupRow:
    index: int
    group: tuple[Any, ...]
    configs: int = 0
    reduced: Search = field(default_factory=Search)
    full: Search = field(default_factory=Search)

    def reduction(self) -> float:
        return self.full.states / self.reduced.states if self.reduced.states else 0.0

    def speed_up(self) -> float:
        return self.full.cpu / self.reduced.cpu if self.reduced.cpu > 0 else 0.0


def measure(profile: str, groups: Optional[Sequence[int]] = None, time_budget: float = 3600.0,
            max_capacity: Optional[int] = None) -> list[GroupRow]:
    """Each configuration of the chosen groups (up to `max_capacity` cells), reduced then full, in this
    process (CPU time of each)."""
    from kvcache_proofs import cell_model_checker as cmc
    from kvcache_proofs.model_checker import check_config

    bounds = cmc.PROFILES[profile]
    chosen = range(len(bounds.groups)) if groups is None else groups
    rows = {index: GroupRow(index, bounds.groups[index]) for index in chosen}
    layouts = {True: cmc.layout(bounds, symmetry=True), False: cmc.layout(bounds, symmetry=False)}
    for spec in bounds.configs():
        row = rows.get(bounds.governing_group(spec))
        if row is None or (max_capacity is not None and spec.capacity > max_capacity):
            continue
        row.configs += 1
        for symmetry, search in ((True, row.reduced), (False, row.full)):
            started = time.process_time()
            result = check_config(spec, None, time.monotonic() + time_budget, layouts[symmetry])
            search.cpu += time.process_time() - started
            search.states += result.states
            search.complete &= result.complete
            search.holds &= result.counterexample is None
    return [rows[index] for index in chosen]


def describe(bounds: Any, index: int) -> str:
    """Group `index` of `bounds` in words: `3 ids, capacity 4-6, flat|window 2|flat+window 2, positions < 3[, depth 4]`."""
    from kvcache_proofs.cell_model_checker import _capacities

    group = bounds.groups[index]
    capacities = _capacities(group)
    kinds = "|".join("+".join("flat" if w == 0 else f"window {w}" for w in windows) for windows in group[2])
    max_depth, max_position = bounds._bound(group)
    depth = "" if max_depth is None else f", depth {max_depth}"
    return (f"{group[0]} ids, capacity {capacities[0]}-{capacities[-1]}, {kinds}, positions < {max_position}"
            f"{depth}")


def table(profile: str, rows: Sequence[GroupRow]) -> str:
    from kvcache_proofs import cell_model_checker as cmc

    bounds = cmc.PROFILES[profile]
    lines = [f"symmetry over sequence ids, cell checker, profile {profile} (one job, CPU seconds)", ""]
    lines += [f"group {row.index}: {describe(bounds, row.index)}" for row in rows]
    lines += ["", f"{'group':<5} {'configs':>7} {'canonical':>10} {'CPU s':>8} {'states/s':>9} "
                  f"{'full':>10} {'CPU s':>8} {'states/s':>9} {'reduction':>9} {'CPU saved':>9}"]
    for row in rows:
        note = "" if row.reduced.complete and row.full.complete else "  INCOMPLETE (lower bounds)"
        if not (row.reduced.holds and row.full.holds):
            note += "  VIOLATION"
        lines.append(f"{row.index:<5} {row.configs:>7} {row.reduced.states:>10,} "
                     f"{row.reduced.cpu:>8.1f} {row.reduced.per_second():>9.0f} {row.full.states:>10,} "
                     f"{row.full.cpu:>8.1f} {row.full.per_second():>9.0f} {row.reduction():>8.2f}x "
                     f"{row.speed_up():>8.2f}x{note}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcache_proofs.symmetry_report",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--profile", choices=("quick", "pre-merge", "deep"), default="pre-merge")
    parser.add_argument("--groups", default=None, help="comma-separated group indices (default: every group)")
    parser.add_argument("--max-capacity", type=int, default=None,
                        help="only the configurations of at most this many cells (the full search grows ~5x per cell)")
    parser.add_argument("--time-budget", type=float, default=3600.0,
                        help="wall-clock seconds per search, a safety net (default 3600)")
    args = parser.parse_args(argv)
    from kvcache_spec._extras import exit_unless_installed

    exit_unless_installed("verify", "python -m kvcache_proofs.symmetry_report")
    from kvcache_proofs import cell_model_checker as cmc

    count = len(cmc.PROFILES[args.profile].groups)
    try:
        groups = None if args.groups is None else [int(g) for g in args.groups.split(",")]
    except ValueError:
        parser.error(f"--groups: comma-separated integers, not {args.groups!r}")
    if groups is not None and any(not 0 <= g < count for g in groups):
        parser.error(f"--groups: the {args.profile} profile has groups 0..{count - 1}")
    rows = measure(args.profile, groups, args.time_budget, args.max_capacity)
    print(table(args.profile, rows))
    if not all(row.reduced.holds and row.full.holds for row in rows):
        return 1
    return 0 if all(row.reduced.complete and row.full.complete for row in rows) else 3


if __name__ == "__main__":
    sys.exit(main())
