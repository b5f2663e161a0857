"""transformers' and mlx-lm's caches judged by the op-face suite (spec/conformance/libraries/hf.py, mlxlm.py): every target
at strict pre-merge gives the verdict and exactly the distinct causes docs/hf-findings.md and docs/mlxlm-findings.md
state (tests/library_verdicts.py holds them, each cause classed real or not); and each real defect's standalone repro
through the library's own model code (tests/library_repros.py) still shows it - a library that fixed one fails here,
so the pages are brought up to date.

Needs the `hf` and `mlx` extras. Without them the module is skipped with the reason - except where
KVCACHE_REQUIRE_LIBRARIES=1 (CI's library stage, which installs them): there a missing install fails.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kvcache_spec.conformance.suite import report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget

from . import library_repros as repros
from .library_verdicts import EXPECTED, PROFILE, cause_key, page_line

INSTALL = "pip install -e '.[hf,mlx]'"
try:
    for _name in ("torch", "transformers", "optimum.quanto", "hqq", "mlx.core", "mlx_lm"):
        importlib.import_module(_name)
except ImportError as missing:
    if os.environ.get("KVCACHE_REQUIRE_LIBRARIES") == "1":
        raise   # the library stage installed them: a missing module is a failure, never a skip
    pytest.skip(f"the hf and mlx extras are not installed ({missing}): {INSTALL}", allow_module_level=True)

pytestmark = pytest.mark.filterwarnings("ignore::Warning")
ROOT = Path(__file__).resolve().parent.parent
PAGES = {"hf": ROOT / "docs" / "hf-findings.md", "mlxlm": ROOT / "docs" / "mlxlm-findings.md"}


def judged(target: str) -> tuple[dict[str, Any], float]:
    """The target's JSON report at strict PROFILE, and the seconds it took. KVCACHE_LIBRARY_REPORTS=DIR also writes
    each report there (what tests/library_verdicts.py's entries are classed from)."""
    started = time.monotonic()
    report = report_json(run_suite(PythonTarget(f"python:kvcache_spec.conformance.libraries.{target}"), PROFILE), True, False)
    folder = os.environ.get("KVCACHE_LIBRARY_REPORTS")
    if folder:
        (Path(folder) / f"{target.replace(':', '_')}.json").write_text(json.dumps(report))
    return report, time.monotonic() - started


@pytest.mark.parametrize("target", sorted(EXPECTED))
def test_each_target_gives_its_documented_verdict_and_causes(target: str) -> None:
    report, seconds = judged(target)
    expected = EXPECTED[target]
    found = Counter(cause_key(finding) for finding in report["semantic"]["findings"])
    print(f"\n{target}: {report['verdict']} at strict {PROFILE}, {sum(found.values())} distinct causes, {seconds:.1f} s")
    assert report["verdict"] == expected["verdict"], (report["verdict"], sorted(found))
    page = PAGES[target.split(":")[0]].read_text()
    missing = [line for line in (page_line(target, finding) for finding in report["semantic"]["findings"])
               if line not in page]
    assert not missing, f"the findings page does not list (python -m tests.library_verdicts --page ...): {missing}"
    assert found == Counter(expected["causes"].keys()), {"new": sorted(set(found) - set(expected["causes"])),
                                                  "gone": sorted(set(expected["causes"]) - set(found)),
                                                  "twice": sorted(key for key, count in found.items() if count > 1)}


def test_hf_static_layer_overflow_is_not_atomic() -> None:
    out = repros.hf_static_overflow()
    assert out == {"held_before": 3, "overflow": "IndexError", "held_after_refusal": 5,
                   "fitting_step_after": "IndexError"}, out


def test_hf_static_cache_of_zero_length_is_accepted() -> None:
    assert repros.hf_static_zero_length() == {"built": True, "first_token": "RuntimeError"}


def test_hf_sliding_window_one_attends_the_whole_history() -> None:
    out = repros.hf_sliding_window_one()
    assert out["decode_logits_gap"] > 1e-2 and out["two_token_step"] == "RuntimeError", out


def test_hf_sliding_layer_crop_before_any_token_raises() -> None:
    assert repros.hf_sliding_crop_before_any_token() == {"crop(0) of a new cache": "AttributeError"}


def test_hf_static_sliding_past_max_cache_len_drops_window_tokens() -> None:
    assert repros.hf_static_sliding_past_max_cache_len()["decode_logits_gap"] > 1e-2


def test_mlx_prompt_cache_with_a_small_ring_loses_decoded_tokens() -> None:
    out = repros.mlx_prompt_cache_small_ring()
    assert out == {"keep": 4, "max_size": 4, "decoded_rows_stored": 0, "two_token_step": "ValueError"}, out


def test_mlx_prompt_cache_prefill_ignores_its_sinks() -> None:
    assert repros.mlx_prompt_cache_prefill_ignores_sinks()["last_logits_gap"] > 1e-2


def test_mlx_concatenate_trim_brings_trimmed_tokens_back() -> None:
    out = repros.mlx_concatenate_trim()
    assert out["trimmed"] == 2 and out["decode_logits_gap"] > 1e-2, out


def test_mlx_negative_trim_grows_the_cache() -> None:
    assert repros.mlx_negative_trim() == {"answered": -3, "offset": 5}


def test_mlx_chunked_cache_is_trimmable_after_its_front_slid() -> None:
    assert repros.mlx_chunked_trim_after_slide() == {"start_position": 1, "trimmable": True}


def test_mlx_rotating_cache_refuses_a_trim_after_it_wrapped() -> None:
    """Read from the source as a defect, not one: RotatingKVCache is trimmable only while offset < max_size,
    so a ring that wrapped refuses (trim_prompt_cache answers 0 and trims nothing)."""
    assert repros.mlx_rotating_trim_after_wrap() == {"trimmable_after_wrap": False}


def test_hf_targets_run_torch_on_one_thread() -> None:
    """spec/conformance/libraries/hf.py sets one intra-op thread: the thread pool's wake-ups on tensors of a few dozen
    elements made the quantized targets' strict pre-merge runs 2-4 times slower on a loaded 2-core machine."""
    torch = importlib.import_module("torch")
    importlib.import_module("kvcache_spec.conformance.libraries.hf")
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("old, new", [("op.hf", "libraries.hf"), ("op.mlxlm", "libraries.mlxlm"),
                                      ("op.upstream", "libraries.executorch")])
def test_todays_target_paths_load_the_same_factories(old: str, new: str) -> None:
    """The adapters live in kvcache_spec.conformance.libraries; the paths users typed before still load them."""
    module = importlib.import_module(f"kvcache_spec.conformance.{new}")
    assert module.TARGETS
    for name in module.TARGETS:
        target = PythonTarget(f"python:kvcache_spec.conformance.{old}:{name}")
        assert target.factory is getattr(module, name), name
