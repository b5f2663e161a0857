"""The paged harness's own cost, next to the target's: the scale program ("many concurrent requests",
programs.py) timed inside the target's calls and around them, per request cycle (admit .. free), in CPU time (the
process's: a loaded machine inflates wall time, not this much). A measurement to report, never a verdict
(verdicts are bounded by counts).

    python -m kvcache_spec.conformance.paged.cost [TARGET]     (default: the zoo's correct pool)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Optional

from ..targets import Outcome, TargetError, parse_target
from . import programs
from .consequences import drive_on
from .engine import PagedEngine


def harness_cost(spec: str = "python:kvcache_spec.conformance.zoo.paged:paged_pool", repeat: int = 3) -> dict[str, Any]:
    """Milliseconds per request cycle inside the target's calls and in the harness, best of `repeat`."""
    cfg = programs.SCALE
    program = dict(programs.edge_paged_programs(cfg))["many concurrent requests"]
    cycles = sum(step["op"] == "admit" for step in program)
    best: dict[str, Any] = {}
    for _ in range(repeat):
        target = parse_target(spec)
        inside = [0.0]
        call = target.call

        def timed(method: str, args: dict[str, Any]) -> Outcome:
            started = time.process_time()
            try:
                return call(method, args)
            finally:
                inside[0] += time.process_time() - started

        target.call = timed   # type: ignore[method-assign]
        started = time.process_time()
        result = PagedEngine(target, cfg, drive=drive_on).run(program)
        total = time.process_time() - started
        target.close()
        if result.finding is not None:
            return {"finding": result.finding.message}
        numbers = {"requests": cycles, "calls": result.calls, "target_ms_per_request": 1000 * inside[0] / cycles,
                   "harness_ms_per_request": 1000 * (total - inside[0]) / cycles, "total_cpu_s": total}
        if not best or numbers["total_cpu_s"] < best["total_cpu_s"]:
            best = numbers
    return best


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcache_spec.conformance.paged.cost",
                                     description="The paged harness's CPU cost per request cycle, beside the target's "
                                                 "(a measurement, never a verdict).")
    parser.add_argument("target", nargs="?", default="python:kvcache_spec.conformance.zoo.paged:paged_pool",
                        help="a paged target, python:MODULE:FACTORY or cmd:COMMAND (default: the zoo's correct pool)")
    args = parser.parse_args(argv)
    try:
        print(json.dumps(harness_cost(args.target), indent=1))
    except TargetError as error:   # an unknown target is a usage error: one line, exit 2
        parser.exit(2, f"{parser.prog}: {error}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
