"""SGLang's hybrid sliding-window cache (spec/conformance/libraries/sglang_swa.py: UnifiedRadixCache, FULL + SWA,
over SWATokenToKVPoolAllocator) on per-group pools: a fast data-level smoke test (the engine writes each position's
value into the slot the table maps it to and reads every live table back after each call), and the scale program
on per-group pools served with no finding. Its strict pre-merge verdict and causes are held to docs/sglang.md by
tests/test_sglang_verdict.py.

Needs the `sglang` extra (bash .ci/install-serving.sh VENV): skipped with the reason without it, a failure under
KVCACHE_NO_SKIPS=1 (CI's serving stage).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed: bash .ci/install-serving.sh VENV", allow_module_level=True)

from kvcache_spec.conformance.paged import programs  # noqa: E402
from kvcache_spec.conformance.paged.consequences import drive_on  # noqa: E402
from kvcache_spec.conformance.paged.engine import PagedEngine  # noqa: E402
from kvcache_spec.conformance.targets import parse_target  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::Warning")
TARGET = "python:kvcache_spec.conformance.libraries.sglang_swa:hybrid_swa"
HYBRID = programs.paged_config(2, 8, 24, [programs.FULL, programs.window(3)], pools="per-group")


def _run(cfg: dict[str, Any], program: list[dict[str, Any]]) -> object:
    """The engine's finding (None: none) for one program on a fresh target."""
    target = parse_target(TARGET)
    try:
        return PagedEngine(target, cfg, drive=drive_on).run(program).finding
    finally:
        target.close()


def test_the_hybrid_cache_serves_the_edge_programs_by_the_data() -> None:
    named = programs.edge_paged_programs(HYBRID)
    assert len(named) >= 5
    for name, program in named:
        assert _run(HYBRID, program) is None, name


@pytest.mark.slow
def test_the_scale_program_on_per_group_pools_finds_nothing() -> None:
    cfg = {**programs.SCALE, "pools": "per-group"}
    program = dict(programs.edge_paged_programs(cfg))["many concurrent requests"]
    assert _run(cfg, program) is None
    assert cfg["num_blocks"] >= 1000
