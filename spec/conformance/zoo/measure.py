"""Numbers for the suite itself: kill rate over the zoo, time to the first counterexample,
counterexample lengths, and subprocess throughput next to a bare pipe round trip.

    python -m kvcache_spec.conformance.zoo.measure [--seeds N] [--cmd CMD ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any, Optional

from ..suite import run_suite
from ..targets import PythonTarget, SubprocessTarget
from . import ZOO


def zoo_numbers(seeds: int, edges: bool) -> dict[str, Any]:
    """Per mutant: caught (expected class and rule found), seconds and programs to the first finding."""
    per: dict[str, Any] = {}
    for name, (_, kind, rule) in sorted(ZOO.items()):
        times, programs, lengths, caught = [], [], [], 0
        for seed in range(seeds):
            target = PythonTarget(f"python:kvcache_spec.conformance.zoo:{name}")
            result = run_suite(target, "quick", seed=seed, edges=edges)
            caught += (kind, rule) in result.findings
            if result.first_counterexample is not None:
                times.append(result.first_counterexample)
                programs.append(result.first_counterexample_programs or 0)
            lengths += [len(r.steps) for r in result.findings.values()]
        per[name] = {"expected": f"{kind} {rule}", "caught": f"{caught}/{seeds}",
                     "median_seconds_to_first": round(statistics.median(times), 4) if times else None,
                     "median_programs_to_first": statistics.median(programs) if programs else None,
                     "max_steps": max(lengths) if lengths else None,
                     "median_steps": statistics.median(lengths) if lengths else None}
    killed = sum(1 for v in per.values() if v["caught"].startswith(str(seeds)))
    all_times = [v["median_seconds_to_first"] for v in per.values() if v["median_seconds_to_first"] is not None]
    return {"kill_rate": f"{killed}/{len(per)}", "median_seconds_to_first": statistics.median(all_times),
            "mutants": per}


def pipe_round_trips(n: int = 20000) -> float:
    """Round trips per second through `cat` with the harness's own transport (no JSON, no cache)."""
    target = SubprocessTarget("cmd:cat")
    target.process = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True, bufsize=0)
    import os
    assert target.process.stdout is not None and target.process.stdin is not None
    os.set_blocking(target.process.stdout.fileno(), False)
    os.set_blocking(target.process.stdin.fileno(), False)
    line = b'{"id": 1, "method": "capacity", "params": {}}\n'
    started = time.monotonic()
    for _ in range(n):
        target._write(line, time.monotonic() + 5)
        target._read_line(time.monotonic() + 5)
    elapsed = time.monotonic() - started
    target.close()
    return n / elapsed


def protocol_throughput(command: str, n: int = 20000) -> float:
    """Requests per second of one simple call (capacity) against a cmd: target."""
    target = SubprocessTarget(f"cmd:{command}")
    try:
        from ..configs import SUITE_CONFIGS
        target.create(SUITE_CONFIGS[0])
        started = time.monotonic()
        for _ in range(n):
            target.call("capacity", {})
        return n / (time.monotonic() - started)
    finally:
        target.close()


def suite_throughput(command: str) -> Optional[float]:
    target = SubprocessTarget(f"cmd:{command}")
    try:
        return run_suite(target, "quick", seed=0).requests_per_second
    finally:
        target.close()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcache_spec.conformance.zoo.measure")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--cmd", action="append", default=[], help="cmd: targets to time (the command only)")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"zoo": zoo_numbers(args.seeds, edges=True),
                           "zoo_random_only": zoo_numbers(args.seeds, edges=False)}
    # Best of three: on a shared machine the slow runs measure the neighbours, not the pipe.
    out["pipe_round_trips_per_second"] = round(max(pipe_round_trips() for _ in range(3)))
    for command in [f"{sys.executable} -m kvcache_spec.conformance.serve"] + args.cmd:
        out[f"capacity() requests/s: {command}"] = round(max(protocol_throughput(command) for _ in range(3)))
        out[f"suite requests/s: {command}"] = round(max(suite_throughput(command) or 0 for _ in range(3)))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
