"""A verdict is a function of the code: two processes judging one target with one seed send the same programs and
report the same causes, whatever the process (hash randomisation, object addresses). The op face's trims were once
drawn from a seed that hashed None - an address - so upstream's contiguous cache gave 19 causes in one process and
20 in the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Found with trims among its programs: a cache whose trim only lowers its length (tests/op_trim_standins.py).
TARGET = "python:tests.op_trim_standins:trim_lowers_length_only"


def _judged(tmp_path: Path, hash_seed: str) -> dict[str, Any]:
    out = tmp_path / f"report_{hash_seed}.json"
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    run = subprocess.run([sys.executable, "-m", "kvcache_spec.cli", "conformance", "--target", TARGET, "--profile", "quick",
                          "--strict", "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    return json.loads(out.read_text())


def _evidence(report: dict[str, Any]) -> dict[str, Any]:
    """What a run sent and found, without its clock readings."""
    findings = [{key: value for key, value in finding.items() if key != "found_after"}
                for finding in report["semantic"]["findings"]]
    coverage = report["semantic"].get("coverage", {})
    return {"findings": findings, "programs": coverage.get("programs"), "calls": report["semantic"].get("calls")}


@pytest.mark.slow
def test_two_processes_send_the_same_programs_and_report_the_same_causes(tmp_path: Path) -> None:
    first, second = _judged(tmp_path, "1"), _judged(tmp_path, "2")
    assert _evidence(first)["findings"], "the target's defect was not found: the comparison would prove nothing"
    assert _evidence(first) == _evidence(second)
