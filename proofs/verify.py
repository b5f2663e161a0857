"""`kvcache verify`: every verification stage, one verdict.

Stages, in order: the Hypothesis state machine (target in lockstep with the spec model), the
CrossHair gate (the reference's icontract obligations over all paths), the Z3 proofs (induction on
the closed forms), and the exhaustive model checker; then the cell layout's state machine, model
checker and Z3 proofs (kvcache.CellCache against spec/cell_model.py). Each reports pass, FAIL (a
counterexample: a real violation), INCOMPLETE (the analysis did not finish: a work bound or a clock
safety net stopped it before a verdict - "unknown", never a counterexample) or ERROR (environment: a
stage that cannot run), with its time and numbers; `--json` and `--junit` write the same results.

Exit: 0 every stage holds; 1 some stage fails; 3 nothing fails but some stage is INCOMPLETE; 2 usage
or environment error (a stage that could not run, e.g. a missing module), when nothing failed or was
incomplete. The same in every profile: an unknown never passes and never counts as a counterexample.

A verdict is a function of the code, not of the machine's load: every stage's work is bounded by
counts - the state machine by a fixed number of derandomized examples and steps, CrossHair by paths
per condition and Z3 by its deterministic resource limit (rlimit), the model checker by its
configuration bounds (every reachable state of each). The seconds in a profile are safety nets that
end a runaway stage INCOMPLETE; they are far above the measured times (proofs/MEASUREMENTS.md: the stress measurement).

Processes: with more than one core (`--jobs`, default every core), CrossHair and the two model checkers
fan out to a worker per core, and the one-process stages (the two state machines, the Z3 proofs) run
meanwhile in a side process: each stage's work is the same as with `--jobs 1`, which runs the stages
one by one. SIGTERM, SIGINT or SIGHUP stops verify: the unfinished stages are INCOMPLETE, the reports
are written, exit 3, and no process verify started outlives it.

Profiles: quick (seconds; the pre-commit hook), pre-merge (the CI profile, <= 60 s on two busy cores),
deep (every core, the model checker's full bounds, the full CrossHair scope, an hour).
`--target python:MODULE:FACTORY` runs the state machine and the model checker against another
sequence-cache implementation (a callable taking a kvcache.CacheConfig; MODULE is found from the current
directory too, as `kvcache conformance` finds it), judged by the Python target contract
(`kvcache_spec.target_contract`, the one `kvcache conformance --target` uses); only those two stages
run: CrossHair and Z3 are about the reference's own code and the cell stages check the reference
CellCache, so they say nothing about the target - they are skipped and named as skipped. A
cell-layout target (`kvcache_layout = "cell"`) is refused, exit 2: the cell lockstep holds a target to the
reference's typed errors, not to that contract, and `kvcache conformance --target` judges it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

from kvcache_spec._extras import missing_line
from kvcache_spec.report_files import open_report, report_path_problem
from kvcache_spec.conformance.targets import die_with_parent

STAGES = ("stateful", "crosshair", "z3", "model-checker")
PASS, FAIL, INCOMPLETE, ERROR = "pass", "FAIL", "INCOMPLETE", "ERROR"
EXIT_CODES = {PASS: 0, FAIL: 1, ERROR: 2, INCOMPLETE: 3}


@dataclass(frozen=True)
class Profile:
    stateful_examples: int     # the work bounds ...
    stateful_steps: int
    crosshair_cache_scope: str  # crosshair_gate's sequence_cache scope: none, fast or full
    crosshair_cell_scope: str   # crosshair_gate's cell_cache scope: none, fast or full
    crosshair_max_iterations: int  # paths per CrossHair condition
    mc_bounds: str             # a model_checker.PROFILES key
    crosshair_budget: float    # ... and the safety nets (wall seconds; running out is INCOMPLETE)
    mc_budget: float
    jobs: Optional[int]        # None: every core
    engine: str = "processes"  # the model checkers' engine: processes here, or ray (kvcache_proofs.ray_engine)
    ray_address: Optional[str] = None  # with ray: a cluster to join (None: a local Ray)


PROFILES: dict[str, Profile] = {
    # pre-merge's counts are sized for 60 s on two cores each running another CPU-bound process
    # (proofs/MEASUREMENTS.md, the stress measurement): both layouts, about 45 s of CPU in all, measured quiet.
    # CellCache's CrossHair obligations are left to deep: the one decided with a wide margin (free_cells'
    # postcondition) cost 5.6 s of CPU, a quarter of the gate, for one obligation that the cell checker
    # and state machine of the same profile cover (tests/test_proofs.py still runs CrossHair over
    # CellCache in CI). The deep profile keeps the large counts (full scopes, the checkers' full bounds).
    "quick": Profile(stateful_examples=30, stateful_steps=25, crosshair_cache_scope="fast",
                     crosshair_cell_scope="none", crosshair_max_iterations=1000, mc_bounds="quick",
                     crosshair_budget=60.0, mc_budget=60.0, jobs=None),
    "pre-merge": Profile(stateful_examples=100, stateful_steps=50, crosshair_cache_scope="fast",
                         crosshair_cell_scope="none",
                         crosshair_max_iterations=1000, mc_bounds="pre-merge", crosshair_budget=120.0,
                         mc_budget=180.0, jobs=None),
    "deep": Profile(stateful_examples=2000, stateful_steps=80, crosshair_cache_scope="full",
                    crosshair_cell_scope="full",
                    crosshair_max_iterations=20000, mc_bounds="deep",
                    # full scopes: SequenceCache ~690 s (measured with wall-clock solver timeouts), CellCache
                    # 739 s of CPU (251 obligations, one worker: 13.5 min wall under load)
                    crosshair_budget=3600.0,
                    mc_budget=14400.0, jobs=None),  # measured ~3550 s on 2 busy cores
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

    from kvcache_spec.stateful import fixed_constant_pool, make_machine, stateful_settings

    runs = {"machines": 0}

    def counted(config: Any) -> Any:
        runs["machines"] += 1
        return factory(config)

    machine = make_machine(counted, name="KVCacheMachine")
    # A fixed count of derandomized examples, no example database and no deadline: the same examples
    # on every run and machine (the "ci" profile says so too; stated here so verify does not depend on it).
    chosen = settings(stateful_settings("ci"), max_examples=profile.stateful_examples,
                      stateful_step_count=profile.stateful_steps, report_multiple_bugs=False,
                      derandomize=True, database=None, deadline=None)
    started = time.monotonic()
    numbers: dict[str, Any] = {"max examples": profile.stateful_examples, "steps": profile.stateful_steps}
    try:
        with fixed_constant_pool():
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
    result = crosshair_gate.run_gate(budget_seconds=float(sys.argv[1]), sequence_cache=sys.argv[2],
                                     max_iterations=int(sys.argv[3]), workers=int(sys.argv[4]),
                                     cell_cache=sys.argv[5], engine=sys.argv[6],
                                     ray_address=sys.argv[7] or None)
except ImportError as error:
    print(json.dumps({"import_error": str(error)}))
    sys.exit(0)
print(json.dumps({"verdict": result.verdict, "summary": result.summary(), "excluded": len(result.excluded),
                  "table": result.table()}))
"""
_GATE_VERDICTS = {"PASS": PASS, "FAIL": FAIL, "INCOMPLETE": INCOMPLETE}


def stage_crosshair(profile: Profile, factory: Callable[..., Any]) -> StageResult:
    started = time.monotonic()
    # A fixed hash seed: the analysis should not depend on the process's string-hash order either.
    # Its own process group (the gate forks a pool of workers), killed whole if verify stops early.
    with subprocess.Popen([sys.executable, "-c", _CROSSHAIR_CHILD, str(profile.crosshair_budget),
                           profile.crosshair_cache_scope, str(profile.crosshair_max_iterations),
                           str(profile.jobs or os.cpu_count() or 1), profile.crosshair_cell_scope, profile.engine,
                           profile.ray_address or ""],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          preexec_fn=die_with_parent, env={**os.environ, "PYTHONHASHSEED": "0"}) as process:
        try:
            stdout, stderr = process.communicate(timeout=profile.crosshair_budget * 4 + 120)
        except subprocess.TimeoutExpired:   # the clock safety net: unknown, not a counterexample
            return StageResult("crosshair", INCOMPLETE, time.monotonic() - started,
                               detail="the gate's process outlived its safety net and was killed")
        finally:
            if process.returncode is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    child = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    try:
        outcome = json.loads(child.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return StageResult("crosshair", FAIL, time.monotonic() - started,
                           detail=f"the gate's process ended with {child.returncode}:\n{child.stderr[-4000:]}")
    if "import_error" in outcome:
        raise EnvironmentProblem(f"the CrossHair gate cannot run: {outcome['import_error']}")
    summary = outcome["summary"]
    numbers = {"confirmed": f"{summary['confirmed']}/{summary['rows']}", "counterexample": summary["counterexample"],
               "unknown": summary["unknown"], "out of scope": outcome["excluded"],
               "max paths": profile.crosshair_max_iterations, "SequenceCache scope": profile.crosshair_cache_scope,
               "CellCache scope": profile.crosshair_cell_scope}
    verdict = _GATE_VERDICTS[outcome["verdict"]]
    return StageResult("crosshair", verdict, time.monotonic() - started, numbers,
                       "" if verdict == PASS else outcome["table"])


def stage_z3(profile: Profile, factory: Callable[..., Any]) -> StageResult:
    proofs = _optional_module("kvcache_proofs.z3_induction")
    started = time.monotonic()
    try:
        results = proofs.run_proofs()
    except ImportError as error:  # z3 itself missing
        raise EnvironmentProblem(f"z3 not available: {error}") from error
    held = sum(bool(r.holds) for r in results)
    unknown = sum(r.status == "unknown" for r in results)
    failed = len(results) - held - unknown
    verdict = FAIL if failed or not results else INCOMPLETE if unknown else PASS
    return StageResult("z3", verdict, time.monotonic() - started,
                       {"proofs": f"{held}/{len(results)}", "counterexample": failed, "unknown": unknown},
                       "" if verdict == PASS else proofs.report(results))


def stage_model_checker(profile: Profile, factory: Callable[..., Any], target: Optional[str] = None,
                        progress: bool = False) -> StageResult:
    from kvcache_proofs import model_checker

    jobs = profile.jobs or os.cpu_count() or 1
    report = model_checker.check_all(model_checker.PROFILES[profile.mc_bounds], factory, profile.mc_budget,
                                     jobs=jobs, target=target, progress=progress, engine=profile.engine,
                                     ray_address=profile.ray_address)
    numbers = {"states": report.states, "configs": f"{report.configs_checked}/{report.configs_total}",
               "states/s": round(report.states_per_second), "jobs": report.jobs, "engine": profile.engine,
               "counterexample": int(report.counterexample is not None),
               "unknown configs": report.configs_total - report.configs_checked if report.counterexample is None else 0}
    if report.counterexample:
        numbers["counterexample ops"] = len(report.counterexample.ops)
    verdict = PASS if report.ok else FAIL if report.counterexample else INCOMPLETE
    return StageResult("model-checker", verdict, report.seconds, numbers, "" if report.ok else report.summary())


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


# Measured pre-merge on this quiet 2-core machine, beside the sequence stages: cell-stateful 8.3 s (100
# examples), cell-z3 0.1 s; cell-checker (with capacity 5 and 2 ids exhaustive since) 12.5 s on two jobs
# at load 3 (6,150 canonical states, 11 configurations, 13.9 s of CPU on one job).
CELL_PROFILES: dict[str, CellProfile] = {
    "quick": CellProfile(stateful_examples=20, mc_bounds="quick", mc_budget=30.0),
    "pre-merge": CellProfile(stateful_examples=100, mc_bounds="pre-merge", mc_budget=120.0),
    "deep": CellProfile(stateful_examples=1000, mc_bounds="deep", mc_budget=14400.0),
}


def stage_cell(name: str, profile_name: str, jobs: Optional[int], progress: bool = False,
               engine: str = "processes", ray_address: Optional[str] = None) -> StageResult:
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
                                                jobs=jobs or os.cpu_count() or 1, progress=progress,
                                                engine=engine, ray_address=ray_address)
        numbers = {"states": report.states, "configs": f"{report.configs_checked}/{report.configs_total}",
                   "states/s": round(report.states_per_second), "jobs": report.jobs, "engine": engine}
        verdict = PASS if report.ok else FAIL if report.counterexample else INCOMPLETE
        return StageResult(name, verdict, report.seconds, numbers, "" if report.ok else report.summary())
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from kvcache_spec.cell_stateful import make_cell_machine
    from kvcache_spec.stateful import fixed_constant_pool, stateful_settings

    numbers: dict[str, Any] = {"max examples": cell.stateful_examples}
    chosen = settings(stateful_settings("ci"), max_examples=cell.stateful_examples, report_multiple_bugs=False)
    try:
        with fixed_constant_pool():
            run_state_machine_as_test(make_cell_machine(name="CellMachine"), settings=chosen)
    except AssertionError as error:
        program = "\n".join(getattr(error, "__notes__", []))
        return StageResult(name, FAIL, time.monotonic() - started, numbers, f"{str(error).splitlines()[0]}\n{program}")
    return StageResult(name, PASS, time.monotonic() - started, numbers)


# --- reports ------------------------------------------------------------------------------------

def table(results: list[StageResult], profile: str, seconds: float, skipped: Sequence[str] = ()) -> str:
    lines = [f"kvcache verify --profile {profile}", "",
             f"{'stage':<15} {'verdict':<10} {'seconds':>8}  numbers"]
    lines += [f"{r.name:<15} {r.verdict:<10} {r.seconds:8.1f}  {r.numbers_text()}" for r in results]
    lines += [f"{name:<15} {'skipped':<10} {'':>8}  checks the reference, not the --target" for name in skipped]
    lines.append(f"{'total':<15} {overall(results):<10} {seconds:8.1f}")
    for r in results:
        if r.detail and r.verdict != PASS:
            lines += ["", f"--- {r.name}: {r.verdict}", r.detail]
    return "\n".join(lines)


def overall(results: list[StageResult]) -> str:
    """FAIL if any stage found a violation; else INCOMPLETE if any did not finish; else ERROR if any
    could not run; else pass."""
    for verdict in (FAIL, INCOMPLETE, ERROR):
        if any(r.verdict == verdict for r in results):
            return verdict
    return PASS


def write_json(path: str, results: list[StageResult], profile: str, seconds: float,
               skipped: Sequence[str] = ()) -> None:
    data = {"profile": profile, "verdict": overall(results), "seconds": round(seconds, 3), "skipped": list(skipped),
            "stages": [{"name": r.name, "verdict": r.verdict, "seconds": round(r.seconds, 3),
                        "numbers": r.numbers, "detail": r.detail} for r in results]}
    with open_report(path) as handle:
        json.dump(data, handle, indent=2, default=str)


def write_junit(path: str, results: list[StageResult], profile: str, seconds: float) -> None:
    # JUnit has two ways to not pass: <failure> is a counterexample (type "counterexample"); <error> is
    # a stage that did not finish (type "incomplete": unknown) or could not run (type "environment").
    suite = ET.Element("testsuite", name=f"kvcache verify {profile}", tests=str(len(results)),
                       failures=str(sum(r.verdict == FAIL for r in results)),
                       errors=str(sum(r.verdict in (ERROR, INCOMPLETE) for r in results)), time=f"{seconds:.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname="kvcache.verify", name=r.name, time=f"{r.seconds:.3f}")
        properties = ET.SubElement(case, "properties")
        ET.SubElement(properties, "property", name="verdict", value=r.verdict)
        for key, value in r.numbers.items():
            ET.SubElement(properties, "property", name=key, value=str(value))
        ET.SubElement(case, "system-out").text = r.numbers_text()
        first = r.detail.splitlines()[0] if r.detail else r.verdict
        if r.verdict == FAIL:
            ET.SubElement(case, "failure", type="counterexample", message=first).text = r.detail
        elif r.verdict == INCOMPLETE:
            ET.SubElement(case, "error", type="incomplete", message="unknown: " + first).text = r.detail
        elif r.verdict == ERROR:
            ET.SubElement(case, "error", type="environment", message=first).text = r.detail
    root = ET.Element("testsuites")
    root.append(suite)
    with open_report(path) as handle:
        ET.ElementTree(root).write(handle, encoding="unicode", xml_declaration=True)


# --- running the stages -------------------------------------------------------------------------

#: Stages that run in one process; the others (CrossHair, the two model checkers) fan out to a worker
#: per core. With more than one core, verify runs the serial stages in a side process while the fanned
#: out ones run: the work of every stage is unchanged (its counts, its examples, its verdict), only
#: the cores are kept busy - on this quiet 2-core machine pre-merge takes 25 s of wall time for 49 s of
#: CPU, against 58 s with --jobs 1 (proofs/MEASUREMENTS.md, "kvcache verify --profile pre-merge").
SERIAL_STAGES = ("stateful", "z3", "cell-stateful", "cell-z3")
#: The stages that judge a --target (they drive its factory); the others check the project's own
#: reference and proofs, which say nothing about a target, so `--target` skips them and says so.
TARGET_STAGES = ("stateful", "model-checker")


def run_stage(name: str, profile: Profile, profile_name: str, factory: Callable[..., Any], target: Optional[str],
              progress: bool) -> StageResult:
    """One stage's result; a stage that cannot run here is ERROR, one that crashes is FAIL."""
    started = time.monotonic()
    try:
        if name in CELL_STAGES:
            return stage_cell(name, profile_name, profile.jobs, progress=progress, engine=profile.engine,
                              ray_address=profile.ray_address)
        if name == "stateful":
            return stage_stateful(profile, factory)
        if name == "crosshair":
            return stage_crosshair(profile, factory)
        if name == "z3":
            return stage_z3(profile, factory)
        return stage_model_checker(profile, factory, target, progress=progress)
    except EnvironmentProblem as problem:
        return StageResult(name, ERROR, time.monotonic() - started, detail=str(problem))
    except Exception:  # noqa: BLE001 - a crashing stage is a failure to report, not a crash of verify
        return StageResult(name, FAIL, time.monotonic() - started,
                           detail="the stage crashed:\n" + traceback.format_exc())


class SideLane:
    """Runs `stages` one after another in a forked child process and hands back their results.

    The child is forked before any stage runs in the parent (so it inherits no CrossHair, pool or
    Hypothesis state from them), with the default SIGTERM action and PR_SET_PDEATHSIG, so it never
    outlives verify. A child that dies makes its unreported stages FAIL, with its exit code."""

    def __init__(self, stages: list[str], run: Callable[[str], StageResult]) -> None:
        import multiprocessing

        from kvcache_proofs._processes import default_sigterm

        self.stages = stages
        context = multiprocessing.get_context("fork")
        self._receiver, sender = context.Pipe(duplex=False)
        with default_sigterm():
            self._process = context.Process(target=self._main, args=(stages, run, sender), daemon=True)
            self._process.start()
        sender.close()

    @staticmethod
    def _main(stages: list[str], run: Callable[[str], StageResult], sender: Any) -> None:  # pragma: no cover - child
        import signal

        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):   # verify's handlers are the parent's
            signal.signal(number, signal.SIG_DFL)
        die_with_parent()
        for name in stages:
            sender.send(run(name))
        sender.close()

    def results(self) -> dict[str, StageResult]:
        received: dict[str, StageResult] = {}
        started = time.monotonic()
        while len(received) < len(self.stages):
            try:
                result = self._receiver.recv()
            except EOFError:
                break
            received[result.name] = result
        self._process.join()
        for name in self.stages:
            if name not in received:
                received[name] = StageResult(name, FAIL, time.monotonic() - started,
                                             detail=f"the process running the stage ended with {self._process.exitcode}")
        return received

    def results_so_far(self) -> dict[str, StageResult]:
        """The results the lane has already sent, without waiting for the others."""
        received: dict[str, StageResult] = {}
        while self._receiver.poll():
            try:
                result = self._receiver.recv()
            except EOFError:
                break
            received[result.name] = result
        return received

    def stop(self) -> None:
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._receiver.close()


# --- the command --------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvcache verify", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=list(PROFILES), default="pre-merge")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--junit", metavar="FILE", help="write the results as JUnit XML")
    parser.add_argument("--target", metavar="python:MODULE:FACTORY",
                        help="the sequence cache under check (default: the reference, kvcache.SequenceCache); "
                             "only the stages that judge it run (stateful, model-checker), the others are "
                             "named as skipped; a cell-layout target is refused: kvcache conformance judges it")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help=f"comma-separated subset of {','.join(STAGES)} (default: all)")
    parser.add_argument("--jobs", type=_positive_int, default=None,
                        help="processes to use (default: the profile's, every core); 1 runs the stages one by one")
    parser.add_argument("--progress", action="store_true", help="model checker progress on stderr")
    parser.add_argument("--engine", choices=("processes", "ray"), default="processes",
                        help="where the model checkers and the CrossHair gate run: processes on this machine "
                             "(default), or ray - each configuration a Ray task, the CrossHair analyses a batch per node "
                             "(pip install 'kvcache-spec[cluster]')")
    parser.add_argument("--ray-address", default=None, help="with --engine ray: a cluster to join (default: a local Ray)")
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv: Optional[list[str]] = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return 0 if exit_.code == 0 else 2
    needs = missing_line("verify", "kvcache verify")
    if needs:
        print(needs, file=sys.stderr)
        return 2
    for option, path in (("--json", args.json), ("--junit", args.junit)):
        problem = report_path_problem(path)   # before the stages run, not after
        if problem:
            print(f"kvcache verify: {option} {path}: {problem}", file=sys.stderr)
            return 2
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
    layout = getattr(factory, "kvcache_layout", "sequence")
    if layout != "sequence":   # its stages would drive a cell cache through the sequence faces
        print(f"kvcache verify: {args.target} is a {layout!r}-layout target (kvcache_layout); --target takes a "
              f"sequence cache: judge it with kvcache conformance --target {args.target}", file=sys.stderr)
        return 2
    profile = PROFILES[args.profile]
    if args.jobs is not None:
        profile = replace(profile, jobs=args.jobs)
    if args.engine == "ray":
        if importlib.util.find_spec("ray") is None:
            print("kvcache verify: --engine ray needs Ray: pip install 'kvcache-spec[cluster]'", file=sys.stderr)
            return 2
        profile = replace(profile, engine="ray", ray_address=args.ray_address)
    progress = args.progress or sys.stderr.isatty()

    def run(name: str) -> StageResult:
        result = run_stage(name, profile, args.profile, factory, args.target, progress)
        print(f"{result.name}: {result.verdict} ({result.seconds:.1f} s) {result.numbers_text()}",
              file=sys.stderr, flush=True)
        return result

    from kvcache_spec.conformance.targets import HarnessInterrupted, stop_on_signals

    started = time.monotonic()
    chosen = [name for name in STAGES if name in stages]
    skipped = [name for name in chosen if args.target is not None and name not in TARGET_STAGES]
    chosen = [name for name in chosen if name not in skipped]
    if not chosen:
        print(f"kvcache verify: none of the stages {', '.join(skipped)} judges a --target (those that do: "
              f"{', '.join(TARGET_STAGES)})", file=sys.stderr)
        return 2
    if skipped:
        print(f"kvcache verify: skipped {', '.join(skipped)}: they check the reference and the proofs, not "
              f"{args.target}", file=sys.stderr, flush=True)
    side = [name for name in chosen if name in SERIAL_STAGES] if (profile.jobs or os.cpu_count() or 1) > 1 else []
    if len(side) == len(chosen):
        side = []   # nothing to overlap them with
    by_name: dict[str, StageResult] = {}
    lane: Optional[SideLane] = None
    # SIGTERM, SIGINT or SIGHUP stops verify: the stages not finished are INCOMPLETE, every process it
    # started is killed, and the reports are still written (exit 3, as for any unfinished analysis).
    with stop_on_signals():
        try:
            lane = SideLane(side, run) if side else None
            for name in chosen:
                if name not in side:
                    by_name[name] = run(name)
            if lane is not None:
                by_name.update(lane.results())
        except HarnessInterrupted as stop:
            if lane is not None:
                by_name.update(lane.results_so_far())
            for name in chosen:
                if name not in by_name:
                    by_name[name] = StageResult(name, INCOMPLETE, time.monotonic() - started,
                                                detail=f"verify was interrupted by {stop.signal_name}")
        finally:
            if lane is not None:
                lane.stop()
    results = [by_name[name] for name in chosen]
    seconds = time.monotonic() - started
    print(table(results, args.profile, seconds, skipped))
    if args.json:
        write_json(args.json, results, args.profile, seconds, skipped)
    if args.junit:
        write_junit(args.junit, results, args.profile, seconds)
    return EXIT_CODES[overall(results)]


if __name__ == "__main__":
    sys.exit(main())
