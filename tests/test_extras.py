"""A plain install (no extras) runs the conformance suite; verification commands name the extra they need.

CI also builds the wheel into a venv with no extras and runs tests/plain_install_check.py there, which
finds every command by itself. These tests hide the extra's packages inside one process instead
(sys.modules[name] = None makes both `import` and `find_spec` see them as absent), so they run everywhere.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvcache_spec._extras import EXTRAS, missing, missing_line

ROOT = Path(__file__).resolve().parent.parent
HIDE = "import sys\nfor name in {names!r}: sys.modules[name] = None\n"
COMMANDS = {   # what a user types -> how to run it in a child with the packages hidden
    "kvcache verify --profile quick":
        "from kvcache_spec.cli import main\nsys.exit(main(['verify', '--profile', 'quick']))",
    "python -m kvcache_proofs.model_checker":
        "import runpy\nsys.argv = ['x', '--profile', 'quick']\nrunpy.run_module('kvcache_proofs.model_checker', run_name='__main__')",
    "python -m kvcache_proofs.z3_induction":
        "import runpy\nsys.argv = ['x']\nrunpy.run_module('kvcache_proofs.z3_induction', run_name='__main__')",
    "python -m kvcache_proofs.z3_cells":
        "import runpy\nsys.argv = ['x']\nrunpy.run_module('kvcache_proofs.z3_cells', run_name='__main__')",
    "python -m kvcache_proofs.crosshair_gate":
        "from kvcache_proofs.crosshair_gate import main\nsys.exit(main([]))",
    "python -m kvcache_proofs.stress":
        "from kvcache_proofs.stress import main\nsys.exit(main(['--runs', '1']))",
}


def _run_hidden(body: str, hidden: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", HIDE.format(names=hidden) + body], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("hidden", [("hypothesis",), ("z3",), ("crosshair",)])
def test_a_verification_command_without_its_extra_exits_2_with_one_line_naming_it(command: str,
                                                                                   hidden: tuple[str, ...]) -> None:
    run = _run_hidden(COMMANDS[command], hidden)
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert "Traceback" not in run.stderr
    [line] = run.stderr.strip().splitlines()
    assert "pip install 'kvcache-spec[verify]'" in line and line.startswith(command.split(" --")[0]), line
    assert {"hypothesis": "hypothesis", "z3": "z3-solver", "crosshair": "crosshair-tool"}[hidden[0]] in line


def test_the_conformance_suite_needs_no_extra() -> None:
    """The main job on the reference, with every verification package hidden: it passes."""
    hidden = tuple(module for module, _ in EXTRAS["verify"])
    run = _run_hidden("from kvcache_spec.cli import main\nsys.exit(main(['conformance', '--profile', 'quick']))", hidden)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "CONFORMING" in run.stdout


def test_missing_names_the_distribution_not_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "z3", None)
    assert missing("verify") == ["z3-solver"]
    assert missing_line("verify", "kvcache verify") == (
        "kvcache verify needs the 'verify' extra (missing: z3-solver): pip install 'kvcache-spec[verify]'")


def test_the_verify_extra_in_pyproject_lists_what_the_code_checks_for() -> None:
    """EXTRAS (what the commands check) and pyproject's extra (what pip installs) name the same packages."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    declared = re.search(r"^verify = \[(.*)\]$", text, re.M)
    assert declared is not None
    names = {re.split(r"[<>=!~ ]", item.strip().strip('"'))[0] for item in declared.group(1).split(",")}
    assert names == {dist for _, dist in EXTRAS["verify"]}
    assert re.search(r'^test = \["kvcache-spec\[verify\]"', text, re.M), "the test extra installs the verify extra"
