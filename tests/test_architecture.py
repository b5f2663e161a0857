"""The layering of ARCHITECTURE.md holds: pyproject.toml's import-linter contracts are kept by the code,
and they break when a layout of the conformance suite imports another, when a shared module of the suite
imports a layout, or when a lower layer imports a higher one (checked on a copy with that import planted)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"


def lint(where: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the packages found from `where` (its pyproject.toml's contracts; no cache left behind)."""
    return subprocess.run([sys.executable, "-c", LINT], cwd=where, capture_output=True, text=True, timeout=300)


def test_the_code_keeps_every_contract() -> None:
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 kept, 0 broken" in done.stdout, done.stdout


# (file of the copy, the import planted at its end, the contract that must break)
PLANTED = [
    ("kvcache_spec/conformance/sequence/programs.py", "from ..cell import engine as _planted",
     "no layout of the conformance suite imports another"),
    ("kvcache_spec/conformance/suite/plan.py", "from ..op import programs as _planted",
     "the suite's shared machinery reaches a layout only through the registry"),
    ("kvcache_spec/model.py", "from .conformance import engine as _planted",
     "rules -> models -> reference -> lockstep and conformance -> proofs, the CLI on top"),
    ("kvcache/_cache.py", "from kvcache_spec import rules as _planted",
     "the reference is written independently of the spec"),
    ("kvcache_spec/conformance/op/engine.py", "from ..libraries import executorch as _planted",
     "the suite reaches a judged library's adapter only by a target's name"),
]


@pytest.mark.parametrize("path, planted, contract", PLANTED, ids=[row[2].split(":")[0][:40] for row in PLANTED])
def test_a_planted_import_breaks_its_contract(tmp_path: Path, path: str, planted: str, contract: str) -> None:
    """The packages copied under their import names (the checkout's spec/ is kvcache_spec): the copy is
    found first (lint-imports puts its folder first on sys.path), so the planted import is what it reads."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder, name in (("kvcache", "kvcache"), ("spec", "kvcache_spec"), ("proofs", "kvcache_proofs")):
        shutil.copytree(ROOT / folder, tmp_path / name, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    assert lint(tmp_path).returncode == 0   # the copy as it is keeps them all
    with (tmp_path / path).open("a") as source:
        source.write(f"\n{planted}  # planted by tests/test_architecture.py\n")
    done = lint(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    broken = [line for line in done.stdout.splitlines() if "BROKEN" in line or contract[:60] in line]
    assert any(contract[:60] in line for line in broken) and "1 broken" in done.stdout, done.stdout
