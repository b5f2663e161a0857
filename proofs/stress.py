"""Stress: N consecutive `kvcache verify` runs beside one CPU-bound process per core.

Shows that the gate's verdict is a function of the code, not of the machine's load: every run must
end with the expected exit code (0 for the reference; `--expect-fail` for a broken target: 1, a
counterexample, every time), within `--limit` seconds, and with the same stage numbers (states,
configurations, confirmed obligations, machines run: everything but times and rates) as the first
run. Prints one line per run and a summary with the load averages seen.

    python -m kvcache_proofs.stress --runs 20
    python -m kvcache_proofs.stress --runs 20 --expect-fail --target python:kvcache_proofs._mc_broken:lenient_step
    python -m kvcache_proofs.stress --runs 0 --gate-repeats 5

`--gate-repeats K` first runs the CrossHair gate's pre-merge scope K times beside the same load and
prints, per obligation, the worst CPU seconds and paths against their bounds (the CPU safety net and
the work bound), and whether every repeat gave the same status and paths: the margin measurement that
decides what may stay in the pre-merge scope.

Exit 0 when every run met the expectation, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

from kvcache_spec._extras import missing_line

#: Stage numbers that measure speed, not work: left out of the run-to-run comparison.
_RATES = ("states/s",)


def _hog() -> None:  # pragma: no cover - runs in a child process until terminated
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def _work(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """What a run decided: each stage's verdict and numbers without its times and rates."""
    return [(stage["name"], stage["verdict"], {k: v for k, v in stage["numbers"].items() if k not in _RATES})
            for stage in report.get("stages", [])]


def gate_repeats(repeats: int) -> bool:
    """Run the gate's pre-merge scope `repeats` times; print each obligation's worst CPU and paths; True
    when every repeat passed with the same status and paths per obligation."""
    from kvcache_proofs import crosshair_gate as gate

    runs = [gate.run_gate() for _ in range(repeats)]
    worst: dict[str, tuple[float, int]] = {}
    outcomes: dict[str, set[tuple[str, int]]] = {}
    for result in runs:
        for row in result.rows:
            name = f"{row.obligation.target}:{row.obligation.line} {row.obligation.kind}"
            cpu, paths = worst.get(name, (0.0, 0))
            worst[name] = (max(cpu, row.seconds), max(paths, row.paths))
            outcomes.setdefault(name, set()).add((row.status, row.paths))
    for name, (cpu, paths) in sorted(worst.items(), key=lambda item: -item[1][0]):
        print(f"  {name:<70} worst {cpu:5.2f} s CPU of {gate.CONDITION_CPU_SAFETY:.0f}, {paths:4d} paths of "
              f"{gate.DEFAULT_MAX_ITERATIONS}{'' if len(outcomes[name]) == 1 else '  VARIES: ' + str(outcomes[name])}")
    same = all(len(seen) == 1 for seen in outcomes.values())
    print(f"gate x{repeats}: verdicts {[r.verdict for r in runs]}, wall {[round(r.seconds, 1) for r in runs]} s; "
          f"the same status and paths per obligation in every repeat: {'yes' if same else 'NO'}", flush=True)
    return same and all(r.passed for r in runs)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache_proofs.stress", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--profile", default="pre-merge")
    parser.add_argument("--target", default=None, help="python:MODULE:FACTORY (default: the reference)")
    parser.add_argument("--expect-fail", action="store_true", help="every run must exit 1 (a counterexample)")
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="CPU-bound processes (default: one per core)")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds a run may take")
    parser.add_argument("--gate-repeats", type=int, default=0, help="first run the CrossHair gate this many times")
    parser.add_argument("--stop-after", type=float, default=None, metavar="S",
                        help="start no run after S seconds (the summary says how many ran)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return 0 if exit_.code == 0 else 2
    needs = missing_line("verify", "python -m kvcache_proofs.stress")
    if needs:   # every run would fail alike, for want of a package: say so once
        print(needs, file=sys.stderr)
        return 2
    expected = 1 if args.expect_fail else 0
    command = [sys.executable, "-m", "kvcache_proofs.verify", "--profile", args.profile]
    if args.target:
        command += ["--target", args.target]
    context = multiprocessing.get_context("fork")
    hogs = [context.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    times: list[float] = []
    codes: list[int] = []
    loads: list[float] = []
    first: Optional[list[tuple[str, str, dict[str, Any]]]] = None
    same = True
    gate_ok = True
    try:
        if args.gate_repeats:
            print(f"CrossHair gate, pre-merge scope, {args.gate_repeats} repeats beside {args.hogs} CPU-bound "
                  f"process(es); load {os.getloadavg()[0]:.2f}", flush=True)
            gate_ok = gate_repeats(args.gate_repeats)
        print(f"{' '.join(command)}: {args.runs} runs beside {args.hogs} CPU-bound process(es), "
              f"{os.cpu_count()} cores", flush=True)
        with tempfile.TemporaryDirectory() as folder:
            begun = time.monotonic()
            for run in range(1, args.runs + 1):
                if args.stop_after is not None and time.monotonic() - begun > args.stop_after:
                    print(f"stopped after {run - 1} of {args.runs} runs (--stop-after {args.stop_after:.0f} s)")
                    break
                report_path = os.path.join(folder, f"run{run}.json")
                started = time.monotonic()
                done = subprocess.run(command + ["--json", report_path], capture_output=True, text=True)
                seconds = time.monotonic() - started
                load = os.getloadavg()[0]
                times.append(seconds)
                codes.append(done.returncode)
                loads.append(load)
                try:
                    with open(report_path, encoding="utf-8") as handle:
                        work = _work(json.load(handle))
                except (OSError, ValueError):
                    work = []
                if first is None:
                    first = work
                identical = work == first and bool(work)
                same &= identical
                stages = ", ".join(f"{name} {verdict}" for name, verdict, _ in work)
                print(f"run {run:3d}: exit {done.returncode}  {seconds:6.1f} s  load {load:5.2f}  "
                      f"{'same work' if identical else 'DIFFERENT WORK'}  {stages}", flush=True)
    finally:
        for hog in hogs:
            hog.terminate()
        for hog in hogs:
            hog.join()
    if not codes:
        return 0 if gate_ok else 1
    met = sum(code == expected for code in codes)
    slow = sum(seconds > args.limit for seconds in times)
    print(f"\n{met}/{len(codes)} runs exited {expected} as expected; {slow} over {args.limit:.0f} s; "
          f"seconds min {min(times):.1f} median {statistics.median(times):.1f} max {max(times):.1f}; "
          f"1-minute load average min {min(loads):.2f} max {max(loads):.2f}; "
          f"stage numbers identical in every run: {'yes' if same else 'NO'}")
    return 0 if met == len(codes) and not slow and same and gate_ok else 1


if __name__ == "__main__":
    sys.exit(main())
