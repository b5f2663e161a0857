"""The findings pages of the field's caches (docs/hf-findings.md, docs/mlxlm-findings.md) state what CI's library
stage holds: each target's verdict and its causes counted by kind (tests/library_verdicts.py, which
tests/test_library_targets.py holds every run to). Needs no extra: it reads the pages and the expectations."""

from __future__ import annotations

from pathlib import Path

from .library_verdicts import EXPECTED, KINDS, row

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"hf": ROOT / "docs" / "hf-findings.md", "mlxlm": ROOT / "docs" / "mlxlm-findings.md"}


def test_every_cause_is_of_a_named_kind() -> None:
    for target, expected in EXPECTED.items():
        assert set(expected["causes"].values()) <= set(KINDS), target


def test_the_pages_state_each_targets_verdict_and_counts() -> None:
    assert EXPECTED, "no target's verdict is held"
    for target in EXPECTED:
        assert row(target) in PAGES[target.split(":")[0]].read_text(), row(target)


def test_each_real_kind_names_a_repro_that_exists() -> None:
    from . import library_repros

    for kind, text in KINDS.items():
        if text.startswith("real") and "repro " in text:
            name = text.split("repro ")[1].rstrip(")")
            assert callable(getattr(library_repros, name, None)), (kind, name)
