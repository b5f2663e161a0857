"""CI runs every test: the README's test command first, then the slow tests it leaves out."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command_then_the_slow_tests() -> None:
    readme = (ROOT / "README.md").read_text()
    fresh = re.findall(r"pip install -e '\.\[test\]' && (python -m pytest[^\n]*)", readme)
    assert fresh == ["python -m pytest -q"], fresh
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python -m pytest")]
    assert ci == [fresh[0], "python -m pytest -q -m slow -n 2"], ci   # the slow ones on both cores (pytest-xdist)
    assert "python -m pytest -q -m slow" in readme   # the README says what it leaves out, and how to run it


def test_the_default_run_leaves_out_exactly_the_slow_marker() -> None:
    # read as text: tomllib is Python 3.11+, and the project supports 3.10
    addopts = re.findall(r"^addopts = (.*)$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert len(addopts) == 1 and '"-m", "not slow"' in addopts[0], addopts
