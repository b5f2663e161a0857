"""The strict reference inside upstream's op (spec/examples/strict_op.py): a tiny exported attention model run
through `kvcache::update_and_attend` with the drop-in installed equals full recompute on prefill, chunked
prefill and decode; runner misuse that upstream's cache serves without an exception is refused with its rule.

Needs the `upstream` extra (torch, and executorch installed with --no-deps). Skipped without it, with the
reason - except where KVCACHE_REQUIRE_UPSTREAM=1 (CI's upstream stage): there a missing install fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from .upstream_install import import_or_skip

import_or_skip("executorch.extension.llm.cache.update_and_attend")

from kvcache_spec.examples import strict_op   # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::Warning")   # upstream's ExperimentalWarning on every config


def test_prefill_chunked_prefill_and_decode_through_upstreams_op_equal_full_recompute() -> None:
    errors = strict_op.served_right()
    for cache in ("contiguous DYNAMIC", "contiguous STATIC", "cell"):
        for schedule in ("prefill", "chunked prefill", "decode"):
            assert errors[f"{cache}, {schedule}"] <= 1e-4, (cache, schedule, errors)
    assert {"contiguous ring rows (max_write 3), chunked prefill", "contiguous ring rows (max_write 3), decode"} \
        <= set(errors)
    assert max(errors.values()) <= 1e-4, errors
    print(f"\nmax |op - full recompute| = {max(errors.values()):.2e} over {len(errors)} runs")


def test_installed_directly_the_projects_specs_are_misread_by_upstreams_attend() -> None:
    """Why the drop-in answers with upstream's AttendSpec: kvcache.op's own spec class is recognised by
    upstream's attend as neither CAUSAL nor EXPLICIT, so a windowed prefill attends every row."""
    import kvcache.op as op
    import torch

    model = strict_op.TinyAttention()
    x = torch.randn(1, 6, strict_op.HIDDEN)
    with torch.no_grad():
        direct = strict_op.run(op.ContiguousReferenceCache(strict_op.config(op)), strict_op.Exported(model),
                               [(x, 0)])[0]
        assert float((direct - model.recompute(x)).abs().max()) > 1e-2


EXPECTED_RULES = {
    "wrong position: a decode step skips position 4": "OP-POS",
    "wrong position: a decode step repeats position 3": "OP-POS",
    "forgotten reset: a new prompt at position 0 on the old history": "OP-POS",
    "a layer served twice in one forward: a block reused with its layer id": "OP-POS",
    "forgotten seq_rm: a sequence id reused for a new prompt": "OP-POS",
    "fork onto a sequence that still holds tokens": "OP-FORK",
}


def test_runner_misuse_upstream_serves_silently_is_refused_with_its_rule() -> None:
    cases: list[Any] = strict_op.misuse()
    assert {case.name: case.refused_by for case in cases} == EXPECTED_RULES
    for case in cases:
        # upstream's cache served it without an exception, and where the step has an output it is wrong
        assert case.upstream_error is None or case.upstream_error > 1e-2, case
        assert case.message.startswith(f"[{case.refused_by}]"), case
        print(f"\n{case.name}: {case.message}")
