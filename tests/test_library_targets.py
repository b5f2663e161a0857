"""transformers' and mlx-lm's caches judged by the op-face suite (spec/conformance/libraries/hf.py, hf_batch.py - its
row verbs, padding and recording - mlxlm.py, and mlxlm_batch.py - mlx-lm's batch caches as BatchGenerator drives
them): every target
at strict pre-merge gives the verdict and exactly the distinct causes docs/hf-findings.md and docs/mlxlm-findings.md
state (tests/library_verdicts.py holds them, each cause classed real or not); and each real defect's standalone repro
through the library's own model code (tests/library_repros.py) still shows it - a library that fixed one fails here,
so the pages are brought up to date.

Needs the `hf` and `mlx` extras, each test the one its name says (hf, mlx; else both). Without it the test is
skipped with the reason - except where KVCACHE_REQUIRE_LIBRARIES=1 (CI's library stage, which installs them):
there a missing install fails.
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
from .library_verdicts import EXPECTED, LIBRARY_MODULES, PROFILE, cause_key, page_line

INSTALL = "pip install -e '.[hf,mlx]'"
EXTRAS = {"hf": ("torch", "transformers", "optimum.quanto", "hqq"), "mlx": ("mlx.core", "mlx_lm")}
REQUIRED = os.environ.get("KVCACHE_REQUIRE_LIBRARIES") == "1"   # the library stage installed them


def _missing(extra: str) -> str:
    """What of the extra cannot be imported ('' when all of it can)."""
    try:
        for name in EXTRAS[extra]:
            importlib.import_module(name)
    except ImportError as missing:
        return str(missing)
    return ""


MISSING = {extra: _missing(extra) for extra in EXTRAS}
if all(MISSING.values()) and not REQUIRED:
    pytest.skip(f"the hf and mlx extras are not installed ({MISSING}): {INSTALL}", allow_module_level=True)

pytestmark = pytest.mark.filterwarnings("ignore::Warning")


@pytest.fixture(autouse=True)
def _extras_installed(request: pytest.FixtureRequest) -> None:
    """A test needs the extra its name says (hf, mlx), else both: one missing skips it - except where
    KVCACHE_REQUIRE_LIBRARIES=1, where a missing install is a failure, never a skip. Per test, so the mlx targets
    are judged where only the mlx extra is installed."""
    name = request.node.name
    needed = [extra for extra in EXTRAS if extra in name] or list(EXTRAS)
    missing = {extra: MISSING[extra] for extra in needed if MISSING[extra]}
    if missing and REQUIRED:
        pytest.fail(f"KVCACHE_REQUIRE_LIBRARIES=1 and not installed: {missing}")
    if missing:
        pytest.skip(f"not installed ({missing}): {INSTALL}")
ROOT = Path(__file__).resolve().parent.parent
PAGES = {"hf": ROOT / "docs" / "hf-findings.md", "hf_batch": ROOT / "docs" / "hf-findings.md",
         "mlxlm": ROOT / "docs" / "mlxlm-findings.md", "mlxlm_batch": ROOT / "docs" / "mlxlm-findings.md"}


def judged(target: str) -> tuple[dict[str, Any], float]:
    """The target's JSON report at strict PROFILE, and the seconds it took. KVCACHE_LIBRARY_REPORTS=DIR also writes
    each report there (what tests/library_verdicts.py's entries are classed from, and CI's matrix is built from)."""
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


def test_mlx_llama4_rollback_across_a_chunk_loses_the_chunks_front() -> None:
    out = repros.mlx_llama4_trim_across_chunk()
    slid, control = out["after_a_slide"], out["without_a_slide"]
    assert slid["trimmed"] == control["trimmed"] == 3 and slid["offsets"] == control["offsets"] == [2, 2, 2, 2], out
    assert slid["decode_logits_gap"] > 1e-2 and control["decode_logits_gap"] < 1e-4, out


def test_mlx_llama4_rollback_past_the_chunks_front_trims_part_of_it() -> None:
    out = repros.mlx_llama4_partial_trim()
    assert out["trimmed"] == 4 and out["offsets"] == [2, 2, 2, 1] and out["decode_logits_gap"] > 1e-2, out


def test_mlx_prompt_cache_file_with_a_changed_byte_loads_as_whole() -> None:
    """By design, not a defect (safetensors has no checksum, load_prompt_cache compares nothing): the page's
    `state_unchecked`, which a library that began to refuse it would change."""
    assert repros.mlx_prompt_cache_changed_byte() == {"offset": 2, "k_rows": [0.25, 1.0]}


def test_mlx_rotating_cache_refuses_a_trim_after_it_wrapped() -> None:
    """Read from the source as a defect, not one: RotatingKVCache is trimmable only while offset < max_size,
    so a ring that wrapped refuses (trim_prompt_cache answers 0 and trims nothing)."""
    assert repros.mlx_rotating_trim_after_wrap() == {"trimmable_after_wrap": False}


def test_mlx_to_quantized_reads_back_past_its_bits_half_step() -> None:
    out = repros.mlx_to_quantized_bound()
    assert all(entry["error"] > entry["bound"] for entry in out.values()), out


def test_mlx_to_quantized_refuses_7_bits() -> None:
    assert repros.mlx_to_quantized_bits7() == {1: "quantize: ValueError", 0: "update: ValueError"}


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


def _fresh(factory: Any) -> Any:
    """The target's cache for a small config inside its declared scope (a flat layer where it serves one, else a
    ring of 8 with the keep it declares), width 64 (the quantized backends' group)."""
    scope = factory.kvcache_scope
    keep = next((int(item.split("=")[1]) for item in scope if item.startswith("keep=")), 0)
    layer = {"kind": "flat", "window": 0} if "flat" in scope else {"kind": "ring", "window": 8, "keep": keep}
    return factory({"n_layers": 2, "n_kv_heads": 1, "head_dim": 64, "capacity": 8, "batch_size": 1,
                    "layers": [layer]})


# mlx-lm's batch caches say they are trimmable, but no code of the library trims one: BatchGenerator's verbs are
# held by test_the_batch_targets_declare_the_verbs_batchgenerator_calls instead.
BATCH_TARGETS = sorted(target for target in EXPECTED if target.startswith("mlxlm_batch:"))


@pytest.mark.parametrize("target", sorted(set(EXPECTED) - set(BATCH_TARGETS)))
def test_a_targets_trim_scope_is_the_librarys_own_word(target: str) -> None:
    """Issue 41: a shipped target declares every verb the library's own generation code calls on that cache.
    transformers' assisted decoding crops a cache whose `is_croppable` says True; mlx-lm's server and speculative
    decoding trim a prompt cache that `can_trim_prompt_cache` accepts. Read from the installed library."""
    library, name = target.split(":")
    factory = getattr(importlib.import_module(LIBRARY_MODULES[library]), name)
    cache = _fresh(factory)
    if library in ("hf", "hf_batch"):
        says = bool(cache.cache.is_croppable)
    else:
        says = bool(importlib.import_module("mlx_lm.models.cache").can_trim_prompt_cache(cache.caches))
    assert ("trim" in factory.kvcache_scope) == says, (target, "library says trimmable" if says else "library says not")
    assert callable(getattr(cache, "trim", None)) == says, target


def _cache_verbs(source: str) -> set[str]:
    """The methods generate.py's batch code calls on a batch's caches: `c.<verb>(` where c runs over a prompt_cache,
    and `ca.extend(`/`caches[0][i].merge(` in _extend_cache and _merge_caches."""
    import re

    return set(re.findall(r"\b(?:c|ca|caches\[0\]\[i\])\.(\w+)\(", source))


@pytest.mark.parametrize("target", BATCH_TARGETS)
def test_the_batch_targets_declare_the_verbs_batchgenerator_calls(target: str) -> None:
    """Issue 42: read from the installed mlx_lm/generate.py, the verbs BatchGenerator calls on its batch caches are
    merge, extend, extract, filter, prepare and finalize - select is filter; no reorder, repeat nor trim. A target
    declares `select` (not `batch-verbs`, which adds reorder and repeat) and no `trim`, and has a method for each
    declared verb; a release that starts calling another verb fails here."""
    source = Path(importlib.import_module("mlx_lm.generate").__file__ or "").read_text()
    source = source[source.index("def _merge_caches("):]   # the batch part (before it: one sequence's generate_step)
    assert _cache_verbs(source) == {"merge", "extend", "extract", "filter", "prepare", "finalize"}, _cache_verbs(source)
    factory = getattr(importlib.import_module(LIBRARY_MODULES["mlxlm_batch"]), target.split(":")[1])
    declared = set(factory.kvcache_scope)
    assert {"pad", "select"} <= declared and not {"batch-verbs", "trim"} & declared, declared
    cache = factory({"n_layers": 1, "n_kv_heads": 1, "head_dim": 2, "capacity": 8, "batch_size": 2,
                     "layers": [{"kind": "flat", "window": 0}]})
    assert callable(cache.pad) and callable(cache.select), target
    assert "merge" in declared and callable(cache.extend) and callable(cache.extract), target   # extend, extract
    assert not any(hasattr(cache, verb) for verb in ("reorder", "repeat", "trim")), target


def test_mlx_batch_filter_of_a_padded_empty_cache_breaks_it() -> None:
    assert repros.mlx_batch_filter_of_padded_empty_cache() == {"idx_after_filter": -2, "forward": "ValueError"}


def test_mlx_batch_rotating_mask_after_a_wrap_masks_a_real_token() -> None:
    assert repros.mlx_batch_rotating_mask_after_wrap()["first_query_logits_gap"] > 1e-2


def test_mlx_batch_extract_of_an_empty_batch_raises() -> None:
    assert repros.mlx_batch_extract_of_empty_cache() == {"BatchKVCache": "TypeError",
                                                         "BatchRotatingKVCache": "TypeError"}


def test_mlx_batch_extend_by_a_shorter_batch_right_justifies_it() -> None:
    out = repros.mlx_batch_extend_of_other_length()
    assert out["left_padding"] == [0, 2] and out["offset"] == [5, 3] and out["short_row_logits_gap"] < 1e-4, out


@pytest.mark.parametrize("target", BATCH_TARGETS)
def test_an_extracted_batch_row_is_the_requests_cache_merged_again_for_a_batch_verb(target: str) -> None:
    """extract(row) is the library's extract: a request's KVCache / RotatingKVCache of the row, pads stripped; a
    select of it merges it first, as BatchGenerator's insert(caches=...) does."""
    import numpy as np

    factory = getattr(importlib.import_module(LIBRARY_MODULES["mlxlm_batch"]), target.split(":")[1])
    cache = factory({"n_layers": 1, "n_kv_heads": 1, "head_dim": 2, "capacity": 8, "batch_size": 2,
                     "layers": [{"kind": "flat", "window": 0}]})
    cache.pad([1, 0])
    k = np.arange(8, dtype=np.float32).reshape(2, 1, 2, 2)
    cache.update_and_fetch(0, k, k, np.array([[0, 1], [0, 1]]))
    one = cache.extract(0)
    assert type(one.caches[0]).__name__ == "KVCache" and one.caches[0].offset == 1   # the row's real token only
    keys, _, spec = one.update_and_fetch(0, k[:1, :, :1], k[:1, :, :1], np.array([[2]]))
    assert keys.shape[-2] == 2 and spec.mask.all()
    one.select([0])
    assert type(one.caches[0]).__name__ == "BatchKVCache" and one.caches[0].offset.tolist() == [2]


def test_mlx_batchgenerator_left_padded_request_after_a_wrap_differs_from_alone() -> None:
    out = repros.mlx_batchgenerator_segments_after_wrap()
    assert out["padded_request_gap"] > 1e-2 and out["unpadded_request_gap"] < 1e-4, out


# hf_batch imports torch: where only the mlx extra is installed its targets are not collected (the mlx tests run)
HF_BATCH_TARGETS = (importlib.import_module("kvcache_spec.conformance.libraries.hf_batch").TARGETS
                    if REQUIRED or not MISSING["hf"] else ())


@pytest.mark.parametrize("name", HF_BATCH_TARGETS)
def test_an_hf_batch_targets_row_verbs_are_the_librarys_own(name: str) -> None:
    """Issue 42: an hf_batch target declares `batch-verbs` exactly where every layer of its cache has the three
    row verbs (reorder_cache, batch_select_indices, batch_repeat_interleave: StaticLayer lacks the last two), and
    `recording` exactly where a layer has activate_past_recording. Read from the installed library."""
    factory = getattr(importlib.import_module("kvcache_spec.conformance.libraries.hf_batch"), name)
    flat, ring = {"kind": "flat", "window": 0}, {"kind": "ring", "window": 4}
    cfg = {"n_layers": 2, "n_kv_heads": 1, "head_dim": 64, "capacity": 8, "batch_size": 1,
           "layers": [flat, ring] if "ring" in factory.kvcache_scope else [flat]}
    layers = factory(cfg).cache.layers
    verbs = all(callable(getattr(layer, verb, None)) for layer in layers
                for verb in ("reorder_cache", "batch_select_indices", "batch_repeat_interleave"))
    assert ("batch-verbs" in factory.kvcache_scope) == verbs, (name, verbs)
    records = any(callable(getattr(layer, "activate_past_recording", None)) for layer in layers)
    assert ("recording" in factory.kvcache_scope) == records, (name, records)
    assert "pad" in factory.kvcache_scope and "spec=4" in factory.kvcache_scope, name


def test_hf_row_verbs_after_a_crop_to_empty_raise_at_the_next_forward() -> None:
    out = repros.hf_rows_after_crop_to_empty()
    assert out == {"batch_repeat_interleave(2)": {"held": 0, "next forward of batch 2": "RuntimeError"},
                   "batch_select_indices([0])": {"held": 0, "next forward of batch 1": "RuntimeError"}}, out


def test_hf_quantized_cache_row_verbs_leave_the_quantized_states() -> None:
    out = repros.hf_quantized_rows()
    assert out == {backend: {"batch_select_indices([0])": "IndexError",
                             "forward of batch 2 after batch_repeat_interleave(2)": "RuntimeError"}
                   for backend in ("quanto", "hqq", "fp8")}, out


def test_hf_quantized_cache_says_croppable_and_its_crop_raises() -> None:
    out = repros.hf_quantized_crop()
    assert out == {backend: {"is_croppable": True, "crop(-1)": "IndexError", "held_after": 3}
                   for backend in ("quanto", "hqq", "fp8")}, out


@pytest.mark.parametrize("extra, path", [("hf", "libraries.hf:dynamic_full"), ("mlx", "op.mlxlm:kv"),
                                         ("mlx", "libraries.mlxlm_batch:batch")])
def test_an_adapter_on_another_library_version_exits_2_naming_both(tmp_path: Path, extra: str, path: str) -> None:
    """A fake newer release found first on the path: the target does not load, one line names what was found and
    what is supported (exit 2) - rather than a run reporting every call over-strict. ANY_VERSION=1 loads it."""
    import subprocess
    import sys

    from kvcache_spec._extras import ANY_VERSION, WRITTEN_FOR

    distribution, supported = WRITTEN_FOR[extra]
    info = tmp_path / f"{distribution.replace('-', '_')}-99.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 99.0\n")
    env = {key: value for key, value in os.environ.items() if key != ANY_VERSION}
    env["PYTHONPATH"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "kvcache_spec.cli", "conformance", "--target",
                           f"python:kvcache_spec.conformance.{path}"], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert f"found {distribution} 99.0" in lines[0] and f"{distribution}=={supported}" in lines[0], lines
    module = "kvcache_spec.conformance." + path.split(":")[0]
    loads = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=300,
                           env={**env, ANY_VERSION: "1"}, cwd=tmp_path)
    assert loads.returncode == 0, loads.stderr
