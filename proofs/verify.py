"""`kvcache verify`: every verification stage, one verdict.

Stages, in order: the Hypothesis state machine (target in lockstep with the spec model), the
CrossHair gate (the reference's icontract obligations over all paths), the Z3 proofs (induction on
the closed forms), and the exhaustive model checker; then the cell layout's state machine, model
checker and Z3 proofs (kvcache.CellCache against spec/cell_model.py). Each reports pass / FAIL / ERROR (environment:
a stage that cannot run) with its time and numbers; `--json` and `--junit` write the same results.

Exit: 0 every stage holds; 1 some stage fails; 2 usage or environment error (a stage that could not
run, e.g. a missing module), when nothing failed.

Profiles: quick (seconds; the pre-commit hook), pre-merge (the CI profile, <= 60 s on two cores),
deep (every core, the model checker's full bounds, minutes).
`--target python:MODULE:FACTORY` runs the state machine and the model checker against another
implementation (a callable taking a kvcache.CacheConfig); CrossHair and Z3 are about the
reference's own code and still run on it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from kvcache_spec.cli import open_report

STAGES = ("stateful", "crosshair", "z3", "model-checker")
PASS, FAIL, ERROR = "pass", "FAIL", "ERROR"


@dataclass(frozen=True)
class Profile:
    stateful_examples: int
    stateful_steps: int
    crosshair_budget: float
    crosshair_cache_scope: str  # crosshair_gate's sequence_cache scope: none, fast or full
    mc_bounds: str             # a model_checker.PROFILES key
    mc_budget: float
    jobs: Optional[int]        # None: every core


PROFILES: dict[str, Profile] = {
    # The budgets are ceilings: a stage that runs out of its budget fails (incomplete is no pass), so they
    # leave room for a slow machine. Measured pre-merge on this 2-core machine: 36 s in all on a normal day
    # (CrossHair ~9 s, model checker ~15 s); on a day when everything ran 2.5x slower, CrossHair took 27 s
    # and the model checker needed more than 30 s for its bounds - hence 60 s and 75 s, not the stage times.
    "quick": Profile(stateful_examples=30, stateful_steps=25, crosshair_budget=25.0, crosshair_cache_scope="fast",
                     mc_bounds="quick",
                     mc_budget=15.0, jobs=None),
    "pre-merge": Profile(stateful_examples=300, stateful_steps=50, crosshair_budget=60.0,
                         crosshair_cache_scope="fast", mc_bounds="pre-merge", mc_budget=75.0, jobs=None),
    "deep": Profile(stateful_examples=2000, stateful_steps=80, crosshair_budget=1800.0,  # full scope: ~690 s measured
                    crosshair_cache_scope="full", mc_bounds="deep",
                    mc_budget=7200.0, jobs=None),  # measured ~3550 s on 2 busy cores
}


@dataclass
class StageResult:
    name: str
    verdict: str
    seconds: float
    numbers: dict[str, Any] = field(default_factory=dict)
    detail: str = ""

    def numbers_text(self) -> str:
        return ", ".join(f"{key} {value}" for key, value in self.numbers.items())


class EnvironmentProblem(Exception):
    """A stage cannot run here (a module missing, a tool not installed)."""


def _optional_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise EnvironmentProblem(f"cannot import {name}: {error}") from error


# --- the stages ---------------------------------------------------------------------------------

def stage_stateful(profile: Profile, factory: Callable[..., Any]) -> StageResult:
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from kvcache_spec.stateful import make_machine, stateful_settings

    runs = {"machines": 0}

    def counted(config: Any) -> Any:
        runs["machines"] += 1
        return factory(config)

    machine = make_machine(counted, name="KVCacheMachine")
    chosen = settings(stateful_settings("ci"), max_examples=profile.stateful_examples,
                      stateful_step_count=profile.stateful_steps, report_multiple_bugs=False)
    started = time.monotonic()
    numbers: dict[str, Any] = {"max examples": profile.stateful_examples, "steps": profile.stateful_steps}
    try:
        run_state_machine_as_test(machine, settings=chosen)
    except AssertionError as error:
        numbers["machines run"] = runs["machines"]
        program = "\n".join(getattr(error, "__notes__", []))
        return StageResult("stateful", FAIL, time.monotonic() - started, numbers,
                           f"{str(error).splitlines()[0]}\n{program}")
    numbers["machines run"] = runs["machines"]
    return StageResult("stateful", PASS, time.monotonic() - started, numbers)


# CrossHair runs in a child process: analysing contracts in-process leaves icontract's checkers
# altered (measured: after run_gate, SequenceCache.plan no longer raises on a gap), which would
# falsify every later stage of this process and of the model checker's forked workers.
_CROSSHAIR_CHILD = """
import json, sys
try:
    from kvcache_proofs import crosshair_gate
    result = crosshair_gate.run_gate(budget_seconds=float(sys.argv[1]), sequence_cache=sys.argv[2])
except ImportError as error:
    print(json.dumps({"import_error": str(error)}))
    sys.exit(0)
print(json.dumps({"passed": result.passed, "confirmed": result.confirmed, "rows": len(result.rows),
                  "excluded": len(result.excluded), "table": result.table()}))
"""


def stage_crosshair(profile: Profile, factory: Callable[..., Any]) -> StageResult:
    started = time.monotonic()
    child = subprocess.run([sys.executable, "-c", _CROSSHAIR_CHILD, str(profile.crosshair_budget),
                            profile.crosshair_cache_scope],
                           capture_output=True, text=True, timeout=profile.crosshair_budget * 4 + 120)
    try:
        outcome = json.loads(child.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return StageResult("crosshair", FAIL, time.monotonic() - started,
                           detail=f"the gate's process ended with {child.returncode}:\n{child.stderr[-4000:]}")
    if "import_error" in outcome:
        raise EnvironmentProblem(f"the CrossHair gate cannot run: {outcome['import_error']}")
    numbers = {"confirmed": f"{outcome['confirmed']}/{outcome['rows']}", "out of scope": outcome["excluded"],
               "budget s": profile.crosshair_budget, "SequenceCache scope": profile.crosshair_cache_scope}
    return StageResult("crosshair", PASS if outcome["passed"] else FAIL, time.monotonic() - started, numbers,
                       "" if outcome["passed"] else outcome["table"])


def stage_z3(profile: Profile, factory: Callable[..., Any]) -> StageResult:
    proofs = _optional_module("kvcache_proofs.z3_induction")
    started = time.monotonic()
    try:
        results = proofs.run_proofs()
    except ImportError as error:  # z3 itself missing
        raise EnvironmentProblem(f"z3 not available: {error}") from error
    held = sum(bool(r.holds) for r in results)
    ok = bool(results) and held == len(results)
    return StageResult("z3", PASS if ok else FAIL, time.monotonic() - started,
                       {"proofs": f"{held}/{len(results)}"}, "" if ok else proofs.report(results))


def stage_model_checker(profile: Profile, factory: Callable[..., Any], target: Optional[str] = None,
                        progress: bool = False) -> StageResult:
    from kvcache_proofs import model_checker

    jobs = profile.jobs or os.cpu_count() or 1
    report = model_checker.check_all(model_checker.PROFILES[profile.mc_bounds], factory, profile.mc_budget,
                                     jobs=jobs, target=target, progress=progress)
    numbers = {"states": report.states, "configs": f"{report.configs_checked}/{report.configs_total}",
               "states/s": round(report.states_per_second), "jobs": report.jobs}
    if report.counterexample:
        numbers["counterexample ops"] = len(report.counterexample.ops)
    return StageResult("model-checker", PASS if report.ok else FAIL, report.seconds, numbers,
                       "" if report.ok else report.summary())


# --- the cell layout: its own lockstep machine and model checker, against kvcache.CellCache ---------
# (Kept in one block: the stages above are the sequence cache's. `--target` names a sequence target;
# the cell stages always check the reference cell cache - `python -m kvcache_proofs.model_checker
# --layout cell --target` checks another one.)

CELL_STAGES = ("cell-stateful", "cell-checker", "cell-z3")
STAGES = STAGES + CELL_STAGES


@dataclass(frozen=True)
class CellProfile:
    stateful_examples: int
    mc_bounds: str             # a cell_model_checker.PROFILES key
    mc_budget: float           # a ceiling with room for a slow machine, as the sequence checker's


# Measured pre-merge on this 2-core machine with other work running (load ~6): cell-stateful 18 s (100
# examples), cell-checker 36 s on two jobs (2,333 states, 7 configurations), cell-z3 0.4 s; 55 s in all.
CELL_PROFILES: dict[str, CellProfile] = {
    "quick": CellProfile(stateful_examples=20, mc_bounds="quick", mc_budget=30.0),
    "pre-merge": CellProfile(stateful_examples=100, mc_bounds="pre-merge", mc_budget=120.0),
    "deep": CellProfile(stateful_examples=1000, mc_bounds="deep", mc_budget=7200.0),
}


def stage_cell(name: str, profile_name: str, jobs: Optional[int], progress: bool = False) -> StageResult:
    """The cell layout's stages, against the reference kvcache.CellCache."""
    cell = CELL_PROFILES[profile_name]
    started = time.monotonic()
    if name == "cell-z3":
        from kvcache_proofs import z3_cells

        results = z3_cells.run_proofs()
        held = sum(r.holds for r in results)
        ok = held == len(results) == len(z3_cells.PROOF_NAMES)
        return StageResult(name, PASS if ok else FAIL, time.monotonic() - started, {"proofs": f"{held}/{len(results)}"},
                           "" if ok else z3_cells.report(results))
    if name == "cell-checker":
        from kvcache_proofs import cell_model_checker

        report = cell_model_checker.check_cells(cell.mc_bounds, None, cell.mc_budget,
                                                jobs=jobs or os.cpu_count() or 1, progress=progress)
        numbers = {"states": report.states, "configs": f"{report.configs_checked}/{report.configs_total}",
                   "states/s": round(report.states_per_second), "jobs": report.jobs}
        return StageResult(name, PASS if report.ok else FAIL, report.seconds, numbers,
                           "" if report.ok else report.summary())
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from kvcache_spec.cell_stateful import make_cell_machine
    from kvcache_spec.stateful import stateful_settings

    numbers: dict[str, Any] = {"max examples": cell.stateful_examples}
    chosen = settings(stateful_settings("ci"), max_examples=cell.stateful_examples, report_multiple_bugs=False)
    try:
        run_state_machine_as_test(make_cell_machine(name="CellMachine"), settings=chosen)
    except AssertionError as error:
        program = "\n".join(getattr(error, "__notes__", []))
        return StageResult(name, FAIL, time.monotonic() - started, numbers, f"{str(error).splitlines()[0]}\n{program}")
    return StageResult(name, PASS, time.monotonic() - started, numbers)


# --- reports ------------------------------------------------------------------------------------

def table(results: list[StageResult], profile: str, seconds: float) -> str:
    lines = [f"kvcache verify --profile {profile}", "",
             f"{'stage':<15} {'verdict':<8} {'seconds':>8}  numbers"]
    lines += [f"{r.name:<15} {r.verdict:<8} {r.seconds:8.1f}  {r.numbers_text()}" for r in results]
    lines.append(f"{'total':<15} {overall(results):<8} {seconds:8.1f}")
    for r in results:
        if r.detail and r.verdict != PASS:
            lines += ["", f"--- {r.name}: {r.verdict}", r.detail]
    return "\n".join(lines)


def overall(results: list[StageResult]) -> str:
    if any(r.verdict == FAIL for r in results):
        return FAIL
    if any(r.verdict == ERROR for r in results):
        return ERROR
    return PASS


def write_json(path: str, results: list[StageResult], profile: str, seconds: float) -> None:
    data = {"profile": profile, "verdict": overall(results), "seconds": round(seconds, 3),
            "stages": [{"name": r.name, "verdict": r.verdict, "seconds": round(r.seconds, 3),
                        "numbers": r.numbers, "detail": r.detail} for r in results]}
    with open_report(path) as handle:
        json.dump(data, handle, indent=2, default=str)


def write_junit(path: str, results: list[StageResult], profile: str, seconds: float) -> None:
    suite = ET.Element("testsuite", name=f"kvcache verify {profile}", tests=str(len(results)),
                       failures=str(sum(r.verdict == FAIL for r in results)),
                       errors=str(sum(r.verdict == ERROR for r in results)), time=f"{seconds:.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname="kvcache.verify", name=r.name, time=f"{r.seconds:.3f}")
        ET.SubElement(case, "system-out").text = r.numbers_text()
        if r.verdict == FAIL:
            ET.SubElement(case, "failure", message=r.detail.splitlines()[0] if r.detail else "failed").text = r.detail
        elif r.verdict == ERROR:
            ET.SubElement(case, "error", message=r.detail.splitlines()[0] if r.detail else "error").text = r.detail
    root = ET.Element("testsuites")
    root.append(suite)
    with open_report(path) as handle:
        ET.ElementTree(root).write(handle, encoding="unicode", xml_declaration=True)


# --- the command --------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvcache verify", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=list(PROFILES), default="pre-merge")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--junit", metavar="FILE", help="write the results as JUnit XML")
    parser.add_argument("--target", metavar="python:MODULE:FACTORY",
                        help="the implementation under check (default: the reference, kvcache.SequenceCache)")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help=f"comma-separated subset of {','.join(STAGES)} (default: all)")
    parser.add_argument("--progress", action="store_true", help="model checker progress on stderr")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return 0 if exit_.code == 0 else 2
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        print(f"kvcache verify: unknown stage(s) {unknown}; choose from {', '.join(STAGES)}", file=sys.stderr)
        return 2
    from kvcache_proofs.model_checker import resolve_target
    from kvcache_spec.stateful import reference_factory

    try:
        factory = reference_factory if args.target is None else resolve_target(args.target)
    except (ValueError, ImportError, AttributeError) as error:
        print(f"kvcache verify: bad --target: {error}", file=sys.stderr)
        return 2
    profile = PROFILES[args.profile]
    started = time.monotonic()
    results: list[StageResult] = []
    for name in STAGES:
        if name not in stages:
            continue
        stage_started = time.monotonic()
        try:
            if name in CELL_STAGES:
                result = stage_cell(name, args.profile, profile.jobs, progress=args.progress or sys.stderr.isatty())
            elif name == "stateful":
                result = stage_stateful(profile, factory)
            elif name == "crosshair":
                result = stage_crosshair(profile, factory)
            elif name == "z3":
                result = stage_z3(profile, factory)
            else:
                result = stage_model_checker(profile, factory, args.target,
                                             progress=args.progress or sys.stderr.isatty())
        except EnvironmentProblem as problem:
            result = StageResult(name, ERROR, time.monotonic() - stage_started, detail=str(problem))
        except Exception:  # noqa: BLE001 - a crashing stage is a failure to report, not a crash of verify
            result = StageResult(name, FAIL, time.monotonic() - stage_started,
                                 detail="the stage crashed:\n" + traceback.format_exc())
        results.append(result)
        print(f"{result.name}: {result.verdict} ({result.seconds:.1f} s) {result.numbers_text()}",
              file=sys.stderr, flush=True)
    seconds = time.monotonic() - started
    print(table(results, args.profile, seconds))
    if args.json:
        write_json(args.json, results, args.profile, seconds)
    if args.junit:
        write_junit(args.junit, results, args.profile, seconds)
    return {PASS: 0, FAIL: 1, ERROR: 2}[overall(results)]


if __name__ == "__main__":
    sys.exit(main())
