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

from kvcache_spec._extras import ANY_VERSION, EXTRAS, WRITTEN_FOR, missing, missing_line, version_line

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


@pytest.mark.slow   # 2-7 s: the slow stage (the default run's time, README); its rule keeps a fast test beside it
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


# --- a shipped adapter on a version of its library it was not written for (issue 41, point 4) -------------------
def test_version_line_names_the_version_found_and_the_one_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ANY_VERSION, raising=False)
    for extra, (distribution, supported) in WRITTEN_FOR.items():
        line = version_line(extra, "the adapter", installed=lambda name: "0.0.1")
        assert f"found {distribution} 0.0.1" in line and f"{distribution}=={supported}" in line, line
        assert "\n" not in line and ANY_VERSION in line
        assert version_line(extra, "the adapter", installed=lambda name: supported) == ""
        assert version_line(extra, "the adapter", installed=lambda name: None) == ""   # the extra's check says it
    monkeypatch.setenv(ANY_VERSION, "1")
    assert version_line("hf", "the adapter", installed=lambda name: "0.0.1") == ""


def _fake_distribution(folder: Path, distribution: str, version: str) -> Path:
    """A dist-info folder that importlib.metadata finds before the installed one (PYTHONPATH comes first)."""
    info = folder / f"{distribution}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    return folder


def test_executorch_adapter_on_another_release_exits_2_naming_both(tmp_path: Path) -> None:
    """ExecuTorch's adapter loads without executorch (each creation names the import), so this runs anywhere:
    the fake release is found first, and the target does not load - one line, exit 2, not a run of every call
    reported over-strict. With ANY_VERSION=1 it loads."""
    import os

    env = {**os.environ, "PYTHONPATH": str(_fake_distribution(tmp_path, "executorch", "1.4.0"))}
    env.pop(ANY_VERSION, None)
    for path in ("op.upstream:contiguous", "libraries.executorch:cell"):
        done = subprocess.run([sys.executable, "-m", "kvcache_spec.cli", "conformance", "--target",
                               f"python:kvcache_spec.conformance.{path}"], capture_output=True, text=True,
                              timeout=300, env=env, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "found executorch 1.4.0" in lines[0] and "executorch==1.5.1" in lines[0], lines
        assert done.stdout == ""
    loads = subprocess.run([sys.executable, "-c", "import kvcache_spec.conformance.libraries.executorch"],
                           capture_output=True, text=True, timeout=300, env={**env, ANY_VERSION: "1"}, cwd=tmp_path)
    assert loads.returncode == 0, loads.stderr
