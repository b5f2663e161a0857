"""The findings pages of the field's caches (docs/hf-findings.md, docs/mlxlm-findings.md) and the README state what
CI's library stage holds: each target's verdict and its causes counted by class, each kind of cause with its class
and the library's evidence (tests/library_verdicts.py, which tests/test_library_targets.py holds every run to).
Needs no extra: it reads the pages and the expectations."""

from __future__ import annotations

import re
from pathlib import Path

from .library_verdicts import CLASSES, EXPECTED, KINDS, kind_heading, readme_cell, row

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"hf": ROOT / "docs" / "hf-findings.md", "hf_batch": ROOT / "docs" / "hf-findings.md",
         "mlxlm": ROOT / "docs" / "mlxlm-findings.md", "mlxlm_batch": ROOT / "docs" / "mlxlm-findings.md"}


def test_every_cause_is_of_a_named_kind() -> None:
    for target, expected in EXPECTED.items():
        assert set(expected["causes"].values()) <= set(KINDS), target


def test_the_pages_state_each_targets_verdict_and_counts() -> None:
    assert EXPECTED, "no target's verdict is held"
    for target in EXPECTED:
        assert row(target) in PAGES[target.split(":")[0]].read_text(), row(target)


def test_each_kind_is_classed_with_the_librarys_evidence() -> None:
    """A cause without a class, or a class without the library's word for it, fails here (issue 41): a defect
    names its standalone repro; every kind quotes the installed package's file and line."""
    from . import library_repros

    for kind, entry in KINDS.items():
        assert entry.cls in CLASSES, (kind, entry.cls)
        assert re.search(r"[\w/]+\.py:\d+", entry.evidence), (kind, "no file:line of the installed package")
        if entry.cls == "defect":
            assert entry.repro, (kind, "a defect names its repro")
        if entry.repro:
            assert callable(getattr(library_repros, entry.repro, None)), (kind, entry.repro)


def test_the_pages_state_each_kinds_class_and_evidence() -> None:
    """The pages' lists of causes are generated (python -m tests.library_verdicts --page ...): each kind a target
    has is headed by its class and evidence, as generated."""
    for target, expected in EXPECTED.items():
        page = PAGES[target.split(":")[0]].read_text()
        for kind in set(expected["causes"].values()):
            assert kind_heading(kind) in page, (target, kind_heading(kind))


def test_the_readme_counts_real_as_the_librarys_defects_only() -> None:
    """Every shipped op-face target has one cell pair in the README's table (target, then its verdict cell), and
    the cell counts as the page does: real only for a defect of the library."""
    readme = (ROOT / "README.md").read_text()
    for target in EXPECTED:
        cells = re.findall(rf"\| `{re.escape(target)}` \| ([^|]+) \|", readme)
        assert cells == [readme_cell(target)], (target, cells, readme_cell(target))


def test_the_repros_own_entry_runs_without_site_packages() -> None:
    """`python -m tests.library_repros` (and the file run as a script) runs every repro whose library is installed
    and names the others. With -S no library is found, so each must be named - the script died on
    `importlib.util`, which `import importlib` does not load (site and runpy happened to load it elsewhere)."""
    import subprocess
    import sys

    for command in (["-S", "-m", "tests.library_repros"], ["-S", "tests/library_repros.py"]):
        done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (command, done.stderr)
        assert [line.split(" (")[0] for line in done.stdout.splitlines()] == \
            ["transformers: not installed", "mlx_lm: not installed"], (command, done.stdout)


def test_the_repros_entry_runs_every_named_repro() -> None:
    from . import library_repros

    named = {entry.repro for entry in KINDS.values() if entry.repro}
    entry = {repro.__name__ for repro in (*library_repros.HF.values(), *library_repros.MLX.values())}
    assert named <= entry, sorted(named - entry)
