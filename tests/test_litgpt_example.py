"""docs/your-library.md's trial, kept: litgpt 0.5.13's KVCache glued from the page (docs/examples/litgpt_glue.py) gets
the verdict the page's worked example states, and each cause's class holds through litgpt's own GPT
(docs/examples/litgpt_repro.py): the two real defects give logits far from a cache-free forward, the false alarm and
the control agree to float32 rounding. Needs the `litgpt` extra; skipped without it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from kvcache_spec.conformance.engine import LENIENT, WRONG
from kvcache_spec.conformance.suite import NOT_CONFORMING, run_suite
from kvcache_spec.conformance.targets import PythonTarget

pytestmark = pytest.mark.skipif(importlib.util.find_spec("litgpt") is None,
                                reason="litgpt is not installed: pip install 'kvcache-spec[litgpt]'")
EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"


@pytest.fixture()
def examples(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    for name in ("litgpt_glue", "litgpt_repro"):
        sys.modules.pop(name, None)


@pytest.mark.slow
@pytest.mark.usefixtures("examples")
@pytest.mark.parametrize("target, causes", [
    ("flat", {(LENIENT, "OP-CONFIG")}),
    ("sliding", {(LENIENT, "OP-CONFIG"), (WRONG, "OP-ATTEND")}),
])
def test_the_glue_gets_the_pages_verdict(target: str, causes: set[tuple[str, str]]) -> None:
    result = run_suite(PythonTarget(f"python:litgpt_glue:{target}"), "quick")
    assert set(result.findings) == causes and result.verdict(strict=True) == NOT_CONFORMING


@pytest.mark.slow
@pytest.mark.usefixtures("examples")
def test_each_cause_class_holds_through_litgpts_own_model() -> None:
    repro: Any = __import__("litgpt_repro")
    assert repro.control() < 1e-5 and repro.rollback_of_one_in_a_full_ring() < 1e-5
    assert repro.chunk_after_the_first_token() > 1e-2 and repro.rollback_after_the_ring_wrapped() > 1e-2
