"""The cell checker's speed, side by side: the same search (face2b5's pre-merge cell bounds) under two
installations of this project, alternating, CPU seconds of one job each.

    python proofs/bench_cell_checker.py --python OLD/bin/python --python NEW/bin/python [--rounds 3]

Each run is a fresh process of that interpreter importing its own `kvcache_proofs` (this file is run
as a script, so it works with a checkout as old as face2b5, whose `cell_model_checker` has the same
`CellBounds`, `layout` and `check_all`). Printed per run: CPU seconds, states explored (canonical ones
where that version reduces by symmetry), verdict; then each round's ratio of the first to the others.
Alternating rounds on the same machine keep the load alike for both.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any, Optional

#: face2b5's pre-merge cell bounds (groups of (max_seqs, max_capacity, layer sets[, max_depth, max_position])).
BOUNDS = dict(groups=((2, 3, ((2,),)), (3, 2, ((2,),)), (2, 2, ((0, 2),)), (3, (6, 6), ((0,), (2,), (0, 2)), 4, 6)),
              max_tokens=2, max_position=3)


def run_once() -> dict[str, Any]:
    import time

    from kvcache_proofs import cell_model_checker as cmc
    from kvcache_proofs.model_checker import check_all

    bounds = cmc.CellBounds(**BOUNDS)  # type: ignore[arg-type]
    started = time.process_time()
    report = check_all(bounds, None, 600.0, jobs=1, layout=cmc.layout(bounds))
    return {"cpu": round(time.process_time() - started, 2), "states": report.states, "ok": report.ok,
            "complete": report.complete, "configs": report.configs_checked}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", default=[], help="an interpreter (at least two; the first is the baseline)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)  # the child's side
    args = parser.parse_args(argv)
    if args.once:  # the child: an install as old as face2b5 has no `_extras`
        print(json.dumps(run_once()))
        return 0
    from kvcache_spec._extras import exit_unless_installed

    exit_unless_installed("verify", "python proofs/bench_cell_checker.py")
    if len(args.python) < 2:
        parser.error("give --python twice or more")
    for round_ in range(1, args.rounds + 1):
        runs = []
        for python in args.python:
            done = subprocess.run([python, __file__, "--once"], capture_output=True, text=True, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {round_}: {python}: {runs[-1]}", flush=True)
        ratios = ", ".join(f"{runs[0]['cpu'] / run['cpu']:.2f}x" for run in runs[1:])
        print(f"round {round_}: CPU of the first / the others: {ratios}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
