"""The layout registry: what differs between a sequence cache, a cell cache and the op face, as data.

The suite, the reports, coverage, shrinking, the CLI, the vectors and the protocol are shared; a
`Layout` names the few parts that are layout specific: the configurations, the invalid configurations
a target must refuse, the edge and random programs, the engine that runs one program (with its
consequences), and the golden vectors, if the layout has them. Each layout lives in its own subpackage
(`PACKAGES`), whose `LAYOUTS` describes it; this registry is the one door through which the shared
machinery reaches a layout: it imports the subpackages by name, on first use, so no shared module
imports a layout and no layout imports another (pyproject.toml's import-linter contracts).

A target says which layout it implements: a python: factory's `kvcache_layout` attribute, a cmd:
target's hello (spec/PROTOCOL.md); `--layout` overrides both.
"""

from __future__ import annotations

import functools
import importlib
import random
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .configs import JsonConfig
from .scope import Scope
from .engine import RunResult, Step
from .targets import FACE_METHODS, FEATURE_METHODS, OPTIONAL_METHODS, PythonTarget, Target, TargetCrash

RunProgram = Callable[..., RunResult]

# The subpackage of each layout (two op layouts share the op face's package), in report order.
PACKAGES = {"sequence": "sequence", "cell": "cell", "op-contiguous": "op", "op-cell": "op", "cell-recompute": "cell",
            "paged": "paged"}


@dataclass(frozen=True)
class Golden:
    """A layout's golden vectors (vectors.py): the file, its builder, and how a finding is recorded as a
    vector - the model as a recording target, the run that sends a program's calls, the model's reading
    of a config, and a test's flags."""
    file: str
    build: Callable[[], dict[str, Any]]
    recorder: Callable[[], Any]                                     # a vectors.Recorder of this layout's model
    record: Callable[[Target, JsonConfig, list[Step]], RunResult]   # the engine's run (exact, with the answers)
    configured: Callable[[JsonConfig], Any]                         # the model's config, or its Rejected
    flags: Callable[[list[dict[str, Any]], set[str], JsonConfig, list[str]], list[str]]


@dataclass(frozen=True)
class Layout:
    name: str
    configs: tuple[JsonConfig, ...]
    bad_configs: Callable[[bool], list[JsonConfig]]                # validates_configs -> invalid configs
    edge_programs: Callable[[JsonConfig], list[tuple[str, list[Step]]]]
    random_program: Callable[[JsonConfig, random.Random, int], list[Step]]
    run_program: RunProgram
    golden: Optional[Callable[[], Golden]] = None                  # imported on first use
    # edge programs of a later spec version, run after every other edge program (suite/plan.py, `interleaved`):
    # adding them leaves the earlier programs' order, and so what each run finds first and shrinks, as it was
    later_edge_programs: Optional[Callable[[JsonConfig], list[tuple[str, list[Step]]]]] = None
    latest_edge_programs: Optional[Callable[[JsonConfig], list[tuple[str, list[Step]]]]] = None   # after those
    # and the edge programs of still later versions, each a diagonal of its own after those (OP-ROWS' merges)
    newer_edge_programs: tuple[Callable[[JsonConfig], list[tuple[str, list[Step]]]], ...] = ()
    # the program as a target of this scope is sent it (steps of a verb it lacks left out up front): the program a
    # finding is stored, shrunk and compared with (--against) is the one its step index counts in
    sent: Optional[Callable[[list[Step], Scope], list[Step]]] = None


@functools.cache
def registry() -> dict[str, Layout]:
    """Every layout, by name, in report order."""
    found: dict[str, Layout] = {}
    for package in dict.fromkeys(PACKAGES.values()):
        for layout in importlib.import_module(f"{__package__}.{package}").LAYOUTS:
            found[layout.name] = layout
    return {name: found[name] for name in PACKAGES}


def get(name: str) -> Layout:
    return registry()[name]


def of(target: Target, override: Optional[str] = None) -> Layout:
    """The layout a run drives: the override (--layout), else the target's declared one."""
    return get(override or target.layout)


def goldens() -> list[Golden]:
    """The golden vectors of every layout that has them, in report order."""
    return [layout.golden() for layout in registry().values() if layout.golden is not None]


def run_any(target: Target, cfg: JsonConfig, steps: list[Step], exact: bool = False, **extra: Any) -> RunResult:
    """One program on a target, with the engine of the target's layout (a cmd: target is started
    first: its hello says the layout)."""
    try:
        target.declared_scope()
    except TargetCrash:
        pass   # the engine's create starts it again and reports the crash as a finding
    return of(target).run_program(target, cfg, steps, exact, **extra)


# The methods that tell each layout's objects apart, named in the hint.
SIGNATURE = {"sequence": ("plan", "commit"), "cell": ("declare_step", "place_step"),
             "op-contiguous": ("update_and_fetch", "used"), "op-cell": ("update_and_fetch", "begin_step"),
             "cell-recompute": ("decode", "recompute"), "paged": ("admit", "table")}


def _faces(cache: Any) -> list[str]:
    """The layouts whose every method (but the optional ones) `cache` has."""
    return [name for name, methods in FACE_METHODS.items()
            if all(callable(getattr(cache, method, None)) for method in methods
                   if method not in OPTIONAL_METHODS and method not in FEATURE_METHODS and method != "faces")]


def layout_hint(target: Target) -> Optional[str]:
    """One line for a python: target whose factory builds, for the layout just run, no object with that
    layout's methods, but for another layout one with that layout's: it is judged as the wrong layout (a
    factory without `kvcache_layout` runs the sequence suite). None when nothing says so, or for a target
    out of process (its hello declares its layout). The factory is called once per layout, with the
    layout's first configuration."""
    if not isinstance(target, PythonTarget):
        return None
    built: dict[str, list[str]] = {}
    for name, layout in registry().items():
        probe = PythonTarget(target.name)
        probe.layout = name
        try:
            built[name] = _faces(probe.cache) if probe.create(layout.configs[0]).ok else []
        except TargetCrash:   # a BaseException out of the factory: no object, no hint from it
            built[name] = []
    if target.layout in built[target.layout]:
        return None
    others = [name for name in registry() if name != target.layout and name in built[name]]
    if not others:
        return None
    return (f"it builds {others[0]} caches ({', '.join(SIGNATURE[others[0]])}), not {target.layout} ones: "
            f"kvcache_layout = \"{others[0]}\" on the factory")


def add_layout_hint(report: dict[str, Any], interrupted: str, target: Target) -> None:
    """The report's `hint` (layout_hint), looked for when the run is not CONFORMING and ran to its end."""
    hint = None if report["conforming"] or interrupted else layout_hint(target)
    if hint:
        report["hint"] = hint
