"""The CrossHair gate's engines (crosshair_gate.py): CrossHair on one target in a worker process, the
work bounds that decide a row and the safety nets that stop a runaway, and the ways the analyses fan
out - worker processes forked from a warmed-up zygote here, or a batch per node on Ray."""

from __future__ import annotations

import importlib
import multiprocessing
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from kvcache_proofs._processes import default_sigterm, from_wall_clock, to_wall_clock

from .crosshair_obligations import (CACHE_CONDITION_TIMEOUT, DEFAULT_PACKAGE, SPLIT_CACHE_TARGETS, _is_cache_target,
                                    _is_cell_target)


# Statuses of one obligation. Only CONFIRMED passes.
CONFIRMED = "confirmed"
COUNTEREXAMPLE = "counterexample"
UNKNOWN = "unknown"              # CrossHair: "Not confirmed." (paths left unexplored)
PRE_UNSAT = "precondition-unmet"  # CrossHair: "Unable to meet precondition."
ERROR = "error"                  # CrossHair could not analyse (syntax, import, crash)
NOT_RUN = "not-run"              # inventoried but no CrossHair result (budget, or CrossHair skipped it)
#: A gate problem that means "did not finish" (the wall-clock safety net), not "failed".
BUDGET_PROBLEM = "budget exhausted"

# --- the work bounds (what decides a verdict) and the safety nets (what stops a runaway) -------------
#: Paths CrossHair may explore per condition (per layer shape for SPLIT_CACHE_TARGETS). A condition
#: that has not exhausted its paths by then is unknown, on every machine alike. Measured: the most any
#: condition of the pre-merge scope needs is 189 paths (SequenceCache.retained_from), so 5x room.
DEFAULT_MAX_ITERATIONS = 1000
#: Z3's resource limit per solver query (`rlimit`: a count of solver steps, deterministic), in place of
#: the wall-clock timeout CrossHair otherwise gives each query (half the per-path timeout). That
#: timeout was the flake: under load a RingPolicy.plan query missed its 2.2 s and the condition ended
#: "Not confirmed" after 20 s of CPU; with the wall clock out of the way it is confirmed in 22 paths
#: (2-3 s of CPU). 50 million units are about 7 s of solving here.
SMT_RLIMIT = 50_000_000
#: CPU seconds per condition: a safety net only (the worst in-scope condition takes 2.6 s); a path
#: gets half of it.
CONDITION_CPU_SAFETY = 60.0


# --- one worker: CrossHair on one target ---------------------------------------------------------------

@dataclass(frozen=True)
class ConditionResult:
    """CrossHair's verdict on one condition of one target (plain data: it crosses a process boundary)."""

    target: str
    line: int
    status: str
    seconds: float   # CPU seconds CrossHair spent (its timeouts are CPU time too)
    detail: str
    condition: str
    paths: int = 0   # paths CrossHair explored (its iterations; bounded by max_iterations)


def _classify(states: Sequence[str]) -> str:
    if not states:
        return UNKNOWN
    if any(s in ("post_fail", "post_err", "exec_err") for s in states):
        return COUNTEREXAMPLE
    if any(s in ("syntax_err", "import_err") for s in states):
        return ERROR
    if "pre_unsat" in states:
        return PRE_UNSAT
    if "cannot_confirm" in states:
        return UNKNOWN
    return CONFIRMED if all(s == "confirmed" for s in states) else UNKNOWN


def analyse_target(target: str, per_condition_timeout: float, per_path_timeout: float,
                   line: Optional[int] = None, known_lines: frozenset[int] = frozenset(),
                   shape: Optional[int] = None, max_iterations: int = 0) -> list[ConditionResult]:
    """What `crosshair check --analysis_kind=icontract --report_all TARGET` decides, one row per condition.

    With `line`, only the condition at that line is analysed; without, every condition whose line
    is not in `known_lines` (the conditions CrossHair adds beyond icontract's inventory). Runs in a
    worker process: it engages CrossHair's audit wall, as `crosshair check` does, and CrossHair
    leaves state behind (conditions analysed one after the other in one process also get slower).
    With `shape`, the SequenceCache creator builds only that layer shape (`_crosshair_plugin.SHAPES`);
    the detail of a verdict other than confirmed names it.

    The work is bounded by counts, the clocks are safety nets (DEFAULT_MAX_ITERATIONS, SMT_RLIMIT): at most
    `max_iterations` paths per condition (0: no bound), and every solver query within `SMT_RLIMIT`
    units of Z3's deterministic resource counter instead of its wall-clock timeout. An unknown verdict
    says which bound stopped it.
    """
    import collections

    import crosshair.statespace
    from crosshair.auditwall import engage_auditwall
    from crosshair.core_and_libs import analyze_any
    from crosshair.fnutil import load_files_or_qualnames
    from crosshair.options import AnalysisKind, AnalysisOptionSet

    shape_name = ""
    if shape is not None:
        from kvcache_proofs import _crosshair_plugin

        _crosshair_plugin.SHAPES = (_crosshair_plugin.SHAPES[shape],)
        shape_name = f"[{'+'.join(_crosshair_plugin.SHAPES[0])}] "
    # CrossHair reads this per solver it creates; the environment variable it is initialised from
    # (CROSSHAIR_SMT_RLIMIT) is read at import, in the zygote, so the gate sets the value itself.
    crosshair.statespace.CROSSHAIR_SMT_RLIMIT = SMT_RLIMIT  # type: ignore[attr-defined]
    stats: collections.Counter[str] = collections.Counter()
    options = AnalysisOptionSet(analysis_kind=[AnalysisKind.icontract], per_condition_timeout=per_condition_timeout,
                                per_path_timeout=per_path_timeout, report_all=True, stats=stats,
                                max_iterations=max_iterations or None)
    try:
        engage_auditwall()
        entities = list(load_files_or_qualnames([target]))
        # Materialise the checkables first, as `crosshair check` does: analysing while the
        # parser's generator is still open gives different (worse) results.
        checkables = [c for entity in entities for c in analyze_any(entity, options)]
    except BaseException as error:  # CrossHair's parser raises whatever icontract raises
        return [ConditionResult(target, 0, ERROR, 0.0, f"{type(error).__name__}: {error}", "")]
    if not checkables:
        return [ConditionResult(target, 0, ERROR, 0.0, "Targets found, but contain no checkable functions "
                                "(contracts compiled out by python -O?)", "")]
    results: list[ConditionResult] = []
    for checkable in checkables:
        inner = getattr(checkable, "checkable", checkable)
        conditions = getattr(inner, "conditions", None)
        post = conditions.post[0] if conditions is not None and conditions.post else None
        at = post.line if post is not None else 0
        if (line is not None and at != line) or (line is None and at in known_lines):
            continue
        source = (post.expr_source or "") if post is not None else ""
        if not source:
            source = "no exception on inputs that meet the preconditions"
        started, paths_before = time.process_time(), stats["num_paths"]
        try:
            messages = list(checkable.analyze())
        except BaseException as error:
            results.append(ConditionResult(target, at, ERROR, time.process_time() - started,
                                           f"{type(error).__name__}: {error}", source))
            continue
        seconds, paths = time.process_time() - started, stats["num_paths"] - paths_before
        states = [m.state.value for m in messages]
        status = _classify(states)
        detail = "; ".join(f"{shape_name}line {m.line}: {m.message}" for m in messages if m.state.value != "confirmed")
        if status == UNKNOWN:
            detail += " " + _why_unknown(paths, seconds, max_iterations, per_condition_timeout)
        results.append(ConditionResult(target, at, status, seconds, detail, source, paths))
    return results


def _why_unknown(paths: int, seconds: float, max_iterations: int, cpu_limit: float) -> str:
    """Which bound stopped an analysis that ended without a verdict."""
    if max_iterations and paths >= max_iterations:
        return f"(stopped by the work bound: {paths} paths, max_iterations {max_iterations})"
    if seconds >= cpu_limit:
        return f"(stopped by the CPU safety net: {seconds:.1f} s, limit {cpu_limit:.0f} s; {paths} paths)"
    return (f"({paths} paths; some path ended without a verdict: the solver's work bound (rlimit {SMT_RLIMIT}) "
            "or the per-path CPU safety net)")


def _warm_up() -> None:
    """Import Z3 and solve once in the parent, so forked workers start warm.

    Never CrossHair: importing `crosshair.core_and_libs` patches icontract in the importing process
    (measured: afterwards a SequenceCache.plan with a gap no longer raises StepError), so only the
    forked workers, which die after one condition, import it.
    """
    import z3  # type: ignore[import-untyped]

    solver = z3.Solver()
    x = z3.Int("x")
    solver.add(x * x == 4, x > 0)
    solver.check()


def _run_tasks(tasks: Sequence[tuple[str, int]], condition_timeout: float, path_timeout: float, workers: int,
               deadline: float, package: str = DEFAULT_PACKAGE, cache_timeout: float = CACHE_CONDITION_TIMEOUT,
               inventoried: Optional[dict[str, set[int]]] = None,
               max_iterations: int = 0, engine: str = "processes",
               ray_address: Optional[str] = None) -> tuple[list[ConditionResult], list[str]]:
    """Analyse each (target, condition line) in its own process, `workers` at a time, until `deadline`;
    plus, per target, one task for the conditions CrossHair adds beyond the inventory (`inventoried`:
    every inventoried line per target, in scope or not). SequenceCache targets are analysed from the
    plugin's symbolic state; SPLIT_CACHE_TARGETS once per layer shape, and the shapes' verdicts merge.

    The processes fork from one "zygote" child that has imported CrossHair once (importing it here
    would patch icontract in this process, see _warm_up); the zygote sends the results back.
    """
    if not tasks:
        return [], []
    known: dict[str, set[int]] = {}
    for target, line in tasks:
        known.setdefault(target, set()).add(line)
    for target in known:  # an excluded condition of an analysed target is no "other" condition
        known[target] |= (inventoried or {}).get(target, set())
    from kvcache_proofs import _crosshair_plugin as plugin  # imports no CrossHair: see its docstring

    def timeouts(target: str) -> tuple[float, float]:
        return (cache_timeout, cache_timeout / 2) if _is_cache_target(target, package) else (condition_timeout, path_timeout)

    def shapes(target: str) -> list[Optional[int]]:
        split = _is_cache_target(target, package) and target.rsplit(".", 1)[1] in SPLIT_CACHE_TARGETS
        return list(range(len(plugin.SHAPES))) if split else [None]

    def weight(target: str) -> int:  # heaviest first, so the tail is short
        if _is_cache_target(target, package):
            return 0 if target.rsplit(".", 1)[1] in SPLIT_CACHE_TARGETS else 2
        return 1 if target.endswith("RingPolicy.plan") else 3

    jobs: list[tuple[str, tuple[Any, ...]]] = []
    for target, line in sorted(tasks, key=lambda t: (weight(t[0]), t)):
        for shape in shapes(target):
            suffix = "" if shape is None else f" [{'+'.join(plugin.SHAPES[shape])}]"
            jobs.append((f"{target}:{line}{suffix}", (target, *timeouts(target), line, frozenset(), shape,
                                                      max_iterations)))
    for target in sorted(known):
        jobs.append((f"{target} (other conditions)",
                     (target, *timeouts(target), None, frozenset(known[target]), None, max_iterations)))
    needs_plugin = any(_is_cache_target(target, package) or _is_cell_target(target, package) for target in known)
    plugin = package if needs_plugin else None
    if engine == "ray":
        results, problems = _run_on_ray(jobs, deadline, plugin, ray_address)
    elif engine == "processes":
        results, problems = _run_in_a_zygote(jobs, workers, deadline, plugin)
    else:
        raise ValueError(f"engine is processes or ray, not {engine!r}")
    return _merge_shapes(list(results)), list(problems)


#: seconds past the deadline for a zygote to stop its workers and answer (it stops them at the deadline)
ZYGOTE_GRACE = 10.0


def _run_in_a_zygote(jobs: Sequence[tuple[str, tuple[Any, ...]]], workers: int, deadline: float,
                     plugin_package: Optional[str], own_group: bool = False) -> tuple[list[ConditionResult], list[str]]:
    """Every job in `_zygote`'s forked workers, `workers` at a time, until `deadline` (perf_counter).
    `own_group`: this process leads a process group of its own (a batch on Ray), which the zygote kills
    if this process dies."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    with default_sigterm():
        zygote = context.Process(target=_zygote, args=(jobs, workers, deadline, sender, plugin_package, own_group),
                                 name="crosshair-gate")
        zygote.start()
        sender.close()
        try:
            if receiver.poll(max(0.0, deadline - time.perf_counter()) + ZYGOTE_GRACE):
                results, problems = receiver.recv()
            else:
                results, problems = [], [f"{BUDGET_PROBLEM}: the CrossHair workers did not answer"]
        except EOFError:
            results, problems = [], [f"the CrossHair zygote died (exit code {zygote.exitcode})"]
        finally:
            if zygote.is_alive():
                zygote.kill()
            zygote.join()
            receiver.close()
    return list(results), list(problems)


def _merge_shapes(results: list[ConditionResult]) -> list[ConditionResult]:
    """One result per (target, line): a condition analysed per layer shape holds if it holds for all."""
    order = [COUNTEREXAMPLE, ERROR, PRE_UNSAT, UNKNOWN, NOT_RUN, CONFIRMED]  # the worst verdict wins
    merged: dict[tuple[str, int], ConditionResult] = {}
    for result in results:
        previous = merged.get((result.target, result.line))
        if previous is None:
            merged[(result.target, result.line)] = result
            continue
        worst = min(previous.status, result.status, key=order.index)
        detail = "; ".join(d for d in (previous.detail, result.detail) if d)
        merged[(result.target, result.line)] = ConditionResult(result.target, result.line, worst,
                                                               previous.seconds + result.seconds, detail,
                                                               previous.condition, previous.paths + result.paths)
    return list(merged.values())


def _run_a_batch(batch: Sequence[tuple[str, tuple[Any, ...]]], workers: int, wall_deadline: float,
                 plugin_package: Optional[str]) -> tuple[list[ConditionResult], list[str]]:
    """A Ray task: `batch` on this node, by the gate's own processes engine in a fresh Python process
    (a zygote imports CrossHair once and forks a worker per job; forking the Ray worker itself, which
    runs Ray's threads, would not be safe). The deadline travels as wall-clock time."""
    import os
    import pickle
    import subprocess

    order = pickle.dumps((list(batch), workers, wall_deadline, plugin_package))
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    wait = max(0.0, wall_deadline - time.time()) + 2 * ZYGOTE_GRACE
    try:
        done = subprocess.run([sys.executable, "-c", "import sys; from kvcache_proofs.crosshair_engines import "
                               "_batch_main; sys.exit(_batch_main())"],
                              input=order, capture_output=True, env=env, timeout=wait, check=False,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return [], [f"{BUDGET_PROBLEM}: the batch of {batch[0][0]} and {len(batch) - 1} more did not answer"]
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines() or ["(nothing on stderr)"]
        return [], [f"the batch of {batch[0][0]} and {len(batch) - 1} more failed (exit code {done.returncode}): "
                    f"{said[-1]}"]
    answer: tuple[list[ConditionResult], list[str]] = pickle.loads(done.stdout)
    return answer


def _kill_the_group_when_orphaned() -> None:
    """When this process's parent dies, SIGKILL its whole process group: a batch (`_run_a_batch` starts
    it in a session of its own) with its zygote and the zygote's workers. So a cancelled Ray task (its
    worker is killed: ray.cancel(force=True)) or a killed gate leaves no analysis running on to the
    deadline; whichever of the batch and the zygote outlives its parent does it (Ray may kill a worker's
    children, not their children)."""
    import os
    import signal
    import threading

    def watch(parent: int = os.getppid()) -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def _batch_main() -> int:
    """The child of `_run_a_batch`: read a batch from stdin, run it, write the answer to stdout (as
    `kvcache_proofs.crosshair_gate`, not `__main__`, so the answer unpickles in the task)."""
    import pickle

    _kill_the_group_when_orphaned()
    jobs, workers, wall_deadline, plugin_package = pickle.loads(sys.stdin.buffer.read())
    deadline = from_wall_clock(wall_deadline, time.perf_counter)
    assert deadline is not None
    answer = _run_in_a_zygote(jobs, workers, deadline, plugin_package, own_group=True)
    sys.stdout.buffer.write(pickle.dumps(answer))
    return 0


def _batches(jobs: Sequence[tuple[str, tuple[Any, ...]]], count: int) -> list[list[tuple[str, tuple[Any, ...]]]]:
    """`jobs` dealt round-robin into at most `count` non-empty batches (neighbouring jobs are of one
    target and alike in cost, so dealing spreads the cost evenly)."""
    dealt: list[list[tuple[str, tuple[Any, ...]]]] = [[] for _ in range(max(1, min(count, len(jobs))))]
    for index, job in enumerate(jobs):
        dealt[index % len(dealt)].append(job)
    return [batch for batch in dealt if batch]


def _run_on_ray(jobs: Sequence[tuple[str, tuple[Any, ...]]], deadline: float, plugin_package: Optional[str],
                address: Optional[str], batches: Optional[int] = None) -> tuple[list[ConditionResult], list[str]]:
    """`_run_in_a_zygote`'s work on Ray: one batch per node of the cluster, each a task holding as many
    CPUs as the smallest node has and running that many CrossHair workers; so CrossHair is imported
    once per node, not once per job (measured on this 2-core machine: with a task per job the quick
    profile's gate ran out of its 60 s net, INCOMPLETE; batched it passes in 12 s). A batch still
    running at `deadline` is reported as the zygote reports it. `batches` (default: one per node) is
    for tests."""
    from kvcache_proofs.ray_engine import cancel_unfinished, connect

    ray = connect(address)
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    cpus = max(1, int(min((node.get("Resources", {}).get("CPU", 1) for node in nodes), default=1)))
    run = ray.remote(_run_a_batch).options(num_cpus=cpus, max_retries=0)  # a batch that died is reported, not rerun
    wall_deadline = to_wall_clock(deadline, time.perf_counter)
    pending = [run.remote(batch, cpus, wall_deadline, plugin_package) for batch in _batches(jobs, batches or len(nodes))]
    results: list[ConditionResult] = []
    problems: list[str] = []
    answered: set[int] = set()
    try:
        for index, handle in enumerate(pending):
            try:
                found, trouble = ray.get(handle, timeout=max(0.0, deadline - time.perf_counter()) + 3 * ZYGOTE_GRACE)
                answered.add(index)
                results.extend(found)
                problems.extend(trouble)
            except ray.exceptions.GetTimeoutError:
                problems.append(f"{BUDGET_PROBLEM}: batch {index + 1} of {len(pending)} did not answer")
            except Exception as error:  # noqa: BLE001 - a worker that died
                problems.append(f"batch {index + 1} of {len(pending)} failed: {type(error).__name__}: {error}")
    finally:
        cancel_unfinished([handle for index, handle in enumerate(pending) if index not in answered])
    return results, problems


def _zygote(jobs: Sequence[tuple[str, tuple[Any, ...]]], workers: int, deadline: float, sender: Any,
            plugin_package: Optional[str] = None, own_group: bool = False) -> None:
    """Import CrossHair once (and register the SequenceCache creator of `plugin_package`), then fork one
    worker per job (`workers` at a time) and report (`own_group`: see `_run_in_a_zygote`)."""
    if own_group:
        _kill_the_group_when_orphaned()
    import crosshair.core_and_libs  # noqa: F401  (the workers inherit it)

    if plugin_package is not None:
        from kvcache_proofs import _crosshair_plugin

        _crosshair_plugin.register(plugin_package)

    _warm_up()
    context = multiprocessing.get_context("fork")
    results: list[ConditionResult] = []
    problems: list[str] = []
    pool = context.Pool(processes=max(1, workers), maxtasksperchild=1)
    overran = True
    try:
        pending = [(name, pool.apply_async(analyse_target, args)) for name, args in jobs]
        for name, handle in pending:
            remaining = deadline - time.perf_counter()
            try:
                results.extend(handle.get(timeout=max(0.0, remaining)))
            except multiprocessing.TimeoutError:
                problems.append(f"{BUDGET_PROBLEM} before {name} finished")
            except Exception as error:  # a worker that died
                problems.append(f"worker for {name} failed: {type(error).__name__}: {error}")
        overran = bool(problems)
    finally:
        if overran:
            pool.terminate()  # SIGTERM to the workers still running
        else:
            pool.close()
        pool.join()
        sender.send((results, problems))
        sender.close()
