"""C++ op-face targets through the shipped header's op driver (`kvcache_conformance::op::run_main`),
compiled with g++ and judged over the protocol, as a C++ `update_and_fetch` cache would be checked.

- spec/cpp/example/serve_op_contiguous.cpp: a contiguous cache shaped like upstream's Python reference
  (no positions, no steps), with attention sinks and the driver's optional trim; correct, it conforms
  strictly inside its scope, serving every trim (it keeps every row); with its window one too wide, the suite
  and the exhaustive checker catch it; with its ring losing the rows a ring of the least size drops, the
  trim it still serves there shows in the next answer (wrong OP-ATTEND); with left padding and the batch verbs
  through the driver's optional batch callable (spec 4), a reorder that leaves the pads behind is caught; with
  extend and extract through the driver's optional merge callables (spec 5, the side cache the driver's), an
  extend whose appended rows lose their pads is caught.
- spec/cpp/example/serve_mlx_shaped.cpp: a stand-in shaped like the MLX runtime's cache (batch-1 pools that
  grow from empty, max_write, positions read off the step) behind at most 30 lines of glue. Correct, it is
  CONFORMING (strict) within its declared scope - no INCOMPLETE from batch, no over-strict finding for its
  max_write refusal - and each of its broken variants (mlx_shaped_cache.h's -D switches) is found. Its glue is
  the previous release's, unchanged (`op::Scope::full()` less batch and mla, a policy read for kind and window):
  spec 1's whole face keeps its meaning, so the cache keeps its verdict (no `keep` is ever sent to it).
- tests/cpp/relaxed_hello.cpp: a hello announcing relaxations and spec 2 (`.with(...)`, `Scope::full(2)`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvcache_spec.conformance import cli
from kvcache_spec.conformance import scope as scopes
from kvcache_spec.conformance.op import checker as op_checker
from kvcache_spec.conformance.op import merge
from kvcache_spec.conformance.suite import CONFORMING, NOT_CONFORMING
from tests.cpp_builds import compile_all

EXAMPLES = Path(__file__).resolve().parent.parent / "spec" / "cpp" / "example"
CONTIGUOUS, MLX = EXAMPLES / "serve_op_contiguous.cpp", EXAMPLES / "serve_mlx_shaped.cpp"
RELAXED = Path(__file__).resolve().parent / "cpp" / "relaxed_hello.cpp"
GXX = shutil.which("g++")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(GXX is None, reason="no g++ on PATH: the C++ op targets need a C++17 compiler")]
# The MLX stand-in's broken variants: the rule of the wrong finding each must produce, and (for a bug
# that serves what the spec refuses) the lenient finding that explains it.
MLX_BUGS = {
    "MLXS_BUG_WINDOW_OFF_BY_ONE": ("OP-ATTEND", None),
    "MLXS_BUG_MAX_WRITE_UNCHECKED": ("OP-ATTEND", "OP-MAX-WRITE"),
    "MLXS_BUG_POSITIONS_IGNORED": ("OP-ATTEND", "OP-POS"),
    "MLXS_BUG_GROWTH_DROPS_ROWS": ("OP-ATTEND", None),
}
CRASHES = "MLXS_BUG_ABORTS_PAST_CAPACITY"   # an assert where a refusal belongs: the process dies
BUILDS = {"contiguous": (CONTIGUOUS, ()), "contiguous_window": (CONTIGUOUS, ("KVCACHE_EXAMPLE_WINDOW_OFF_BY_ONE",)),
          "contiguous_ring_loses_rows": (CONTIGUOUS, ("KVCACHE_EXAMPLE_RING_LOSES_ROWS",)),
          "contiguous_reorder_drops_pads": (CONTIGUOUS, ("KVCACHE_EXAMPLE_REORDER_DROPS_PADS",)),
          "contiguous_state_unchecked": (CONTIGUOUS, ("KVCACHE_EXAMPLE_STATE_UNCHECKED",)),
          "contiguous_extend_drops_pads": (CONTIGUOUS, ("KVCACHE_EXAMPLE_EXTEND_DROPS_PADS",)),
          "mlx": (MLX, ()), **{bug: (MLX, (bug,)) for bug in (*MLX_BUGS, CRASHES)}, "relaxed": (RELAXED, ())}


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every build, compiled in parallel, warnings as errors."""
    assert GXX is not None
    return compile_all(GXX, EXAMPLES.parent, tmp_path_factory.mktemp("cpp_op"), BUILDS)


def _judge(binary: Path, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    report = tmp_path / f"{binary.name}.json"
    code = cli.main(["--target", f"cmd:{binary}", "--strict", "--json", str(report), *extra])
    return code, json.loads(report.read_text())


def _session(binary: Path, requests: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    lines = [json.dumps({"id": 1, "method": "hello", "params": {"protocol": "kvcache-conformance", "versions": [1]}})]
    lines += [json.dumps({"id": k, "method": m, "params": p}) for k, (m, p) in enumerate(requests, 2)]
    done = subprocess.run([str(binary)], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=20)
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_cpp_op_target_conforms_within_its_scope_and_its_broken_window_is_caught(
        binaries: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    correct, broken = binaries["contiguous"], binaries["contiguous_window"]
    merged = dict(merge.MERGED)
    code, judged = _judge(correct, tmp_path)
    assert code == 0 and capsys.readouterr().out.strip().splitlines()[-1] == \
        "  CONFORMING (strict) within the scope flat,ring,batch,mla,trim,sinks,state,pad,batch-verbs,quantize,merge only"
    assert all(merge.MERGED[key] > merged[key] for key in merged), (merged, merge.MERGED)   # extends, extracts served
    assert judged["verdict"] == CONFORMING and not judged["coverage"]["incomplete"]
    assert {"OP-ATTEND", "OP-MASK", "OP-HIST", "OP-ARGS", "OP-CAP", "OP-ATOMIC", "OP-BATCH", "OP-TRIM", "OP-SINKS",
            "OP-STATE", "OP-PAD", "OP-ROWS", "OP-QUANTIZE"} <= set(judged["coverage"]["rules"]["exercised"])

    code, judged = _judge(broken, tmp_path)
    found = [f for f in judged["semantic"]["findings"] if (f["class"], f["rule"]) == ("wrong", "OP-ATTEND")]
    assert code == 1 and judged["verdict"] == NOT_CONFORMING and found and min(len(f["steps"]) for f in found) == 1
    capsys.readouterr()
    # the exhaustive checker: its shortest program over its alphabet is 5 steps (three tokens on the ring)
    assert op_checker.main(["--target", f"cmd:{broken}", "--depth", "5"]) == 1
    shortest = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["class"], f["rule"], len(f["steps"])) for f in shortest] == [("wrong", "OP-ATTEND", 5)]
    assert op_checker.main(["--target", f"cmd:{correct}", "--depth", "5"]) == 0


def test_a_cpp_trim_past_a_rings_floor_is_judged_by_the_rows_the_cache_kept(binaries: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    """OP-TRIM through the driver's optional trim: a trim a ring of the least size could not give back is the
    cache's choice. The example keeps every row and serves it (CONFORMING, strict: the test above); the variant
    whose ring really lost those rows serves it too, and its next answer is wrong (OP-ATTEND) - a 3-step
    program, found at quick and pre-merge, and without --strict."""
    broken = binaries["contiguous_ring_loses_rows"]
    for profile in ("quick", "pre-merge"):
        code, judged = _judge(broken, tmp_path, "--profile", profile)
        kinds = {(f["class"], f["rule"]) for f in judged["semantic"]["findings"]}
        assert code == 1 and kinds == {("wrong", "OP-ATTEND")}, kinds
        first = min(judged["semantic"]["findings"], key=lambda f: len(f["steps"]))
        assert [step["op"] for step in first["steps"]] == ["fetch", "trim", "fetch"], first["steps"]
    report = tmp_path / "plain.json"
    assert cli.main(["--target", f"cmd:{broken}", "--json", str(report)]) == 1


def test_a_cpp_state_loader_that_skips_its_checksum_is_found(binaries: dict[str, Path], tmp_path: Path) -> None:
    """OP-STATE through the driver's optional state verbs (base64 on the wire): the example's loader without its
    checksum check accepts a state with a byte flipped - lenient OP-STATE within 4 steps, and the rows it loaded
    are then wrong (the test above: the example itself is CONFORMING with `state` in its scope)."""
    code, judged = _judge(binaries["contiguous_state_unchecked"], tmp_path)
    lenient = [f for f in judged["semantic"]["findings"] if (f["class"], f["rule"]) == ("lenient", "OP-STATE")]
    assert code == 1 and judged["verdict"] == NOT_CONFORMING and lenient
    assert min(len(f["steps"]) for f in lenient) <= 4


def test_a_cpp_extend_that_drops_the_appended_rows_pads_is_found(binaries: dict[str, Path], tmp_path: Path) -> None:
    """OP-ROWS through the driver's optional merge callables (aside, swap, extend, extract on the side cache the
    driver holds): the example's extend that gives the appended rows no pads is wrong at the next read (OP-PAD)
    within 4 steps (the first test: the example itself is CONFORMING with `merge` in its scope)."""
    code, judged = _judge(binaries["contiguous_extend_drops_pads"], tmp_path)
    found = [f for f in judged["semantic"]["findings"] if (f["class"], f["rule"]) == ("wrong", "OP-PAD")]
    assert code == 1 and judged["verdict"] == NOT_CONFORMING and found
    first = min(found, key=lambda f: len(f["steps"]))
    assert len(first["steps"]) <= 4 and any(step["op"] == "extend" for step in first["steps"]), first["steps"]


def test_the_mlx_glue_is_at_most_30_lines() -> None:
    assert len(MLX.read_text().splitlines()) <= 30


@pytest.mark.parametrize("profile", ["quick", "pre-merge"])
def test_the_mlx_shaped_cache_is_conforming_strictly_within_its_scope(
        binaries: dict[str, Path], tmp_path: Path, profile: str) -> None:
    """Batch 1 only and max_write declared: no INCOMPLETE from OP-BATCH, no over-strict max_write refusal,
    every batch-2 (and MLA) configuration refused at creation by the driver (SCOPE-BORDER)."""
    code, judged = _judge(binaries["mlx"], tmp_path, "--profile", profile)
    assert code == 0 and judged["verdict"] == CONFORMING, judged["semantic"]["findings"][:1]
    assert not judged["coverage"]["incomplete"] and not judged["semantic"]["findings"]
    rules = judged["coverage"]["rules"]
    assert {"OP-MAX-WRITE", "OP-POS", "OP-STEP", "OP-ATTEND", "SCOPE-BORDER"} <= set(rules["exercised"])
    assert "'batch'" in rules["out_of_scope"]["OP-BATCH"] and not rules["not_exercised"]
    scope = judged["scope"]
    assert scope["features"] == ["flat", "ring", "max_write", "positions", "steps"] and not scope["full"]
    # no sinks: spec 1; flat+ring+max_write+batch is the batch verbs' config (three rows, a ring laid out as a ring)
    assert set(scope["unexercised"]["families"]) == {"flat+batch", "ring+batch", "flat+mla", "flat+ring+max_write+batch"}
    assert "'trim'" in rules["out_of_scope"]["OP-TRIM"] and "'sinks'" in rules["out_of_scope"]["OP-SINKS"]


def test_a_cpp_cache_of_the_previous_release_keeps_its_verdict(binaries: dict[str, Path], tmp_path: Path) -> None:
    """Issue 41 (4): the MLX-shaped glue as the previous release shipped it - `op::Scope::full()` less batch and
    mla, its policy read for kind and window only - is CONFORMING (strict) against today's header: full() is spec
    1's face, without sinks, so no configuration with a `keep` reaches the cache. (Before: full() had grown
    `sinks`, the driver handed the cache keeps it ignores, and it was NOT CONFORMING, wrong OP-ATTEND.)"""
    glue = MLX.read_text()
    assert 'op::Scope::full().without("batch").without("mla"),' in glue and "keep" not in glue
    code, judged = _judge(binaries["mlx"], tmp_path)
    assert code == 0 and judged["verdict"] == CONFORMING, judged["semantic"]["findings"][:1]
    assert judged["scope"]["spec_version"] == 1 and any("later spec version" in note for note in judged["skipped"])


def test_a_cpp_hello_announces_relaxations_and_its_version(binaries: dict[str, Path]) -> None:
    """The C++ op driver's hello announces what `.with(...)` declares and `spec=2` for Scope::full(2), read by the
    harness as relaxations and a version; a lazy-shapes cache is handed a config without sizes."""
    lazy = {"n_layers": 1, "capacity": 4, "layers": [{"kind": "ring", "window": 2}], "max_write": None}
    replies = _session(binaries["relaxed"], [("create", {"config": lazy}), ("used", {"layer_id": 0})])
    announced = replies[0]["result"]["scope"]
    assert announced == ["flat", "ring", "max_write", "mla", "positions", "steps", "sinks", "trusted-args",
                         "lazy-shapes", "lossy=0.25", "spec=2", "no-length"]   # no trim callable, no used()
    read = scopes.parse(announced, "hello")
    assert read.version == 2 and read.relaxations() == {"trusted-args", "lazy-shapes", "lossy", "no-length"}
    assert read.lossy == 0.25
    assert replies[1] == {"id": 2, "result": None}   # no size sent, none refused by the driver
    assert replies[2]["error"]["kind"] == "unsupported"   # no length of its own


@pytest.mark.parametrize("bug", sorted(MLX_BUGS))
def test_each_broken_mlx_variant_is_found(binaries: dict[str, Path], tmp_path: Path, bug: str) -> None:
    wrong_rule, lenient_rule = MLX_BUGS[bug]
    code, judged = _judge(binaries[bug], tmp_path)
    findings = judged["semantic"]["findings"]
    assert code == 1 and judged["verdict"] == NOT_CONFORMING
    assert any((f["class"], f["rule"]) == ("wrong", wrong_rule) for f in findings), findings
    if lenient_rule is not None:   # the served refusal is named, and the wrong answer it leads to says so
        assert any((f["class"], f["rule"]) == ("lenient", lenient_rule) for f in findings), findings
        assert any(lenient_rule in f["after"] for f in findings if f["class"] == "wrong")
    assert all(f["class"] != "over-strict" for f in findings)


def test_a_cache_that_aborts_is_a_crash_finding_and_the_run_goes_on(binaries: dict[str, Path], tmp_path: Path) -> None:
    """Crash recovery is the harness's: the driven process dies (SIGABRT), the finding names the signal and
    the step, the target is restarted and the run goes on (until the profile's restart cap)."""
    code, judged = _judge(binaries[CRASHES], tmp_path)
    crashes = [f for f in judged["semantic"]["findings"] if f["class"] == "crash"]
    assert code == 1 and judged["verdict"] == NOT_CONFORMING
    assert crashes and "SIGABRT" in crashes[0]["message"] and len(crashes[0]["steps"]) == 1
    assert judged["coverage"]["programs"]["run"] > judged["stats"]["first_counterexample_programs"] + 24


def test_a_cpp_reorder_that_leaves_the_pads_behind_is_caught(binaries: dict[str, Path], tmp_path: Path) -> None:
    """OP-PAD, OP-ROWS through the driver's optional batch callable: the variant whose verbs move K and V but not
    the pads is found (wrong) with a program of at most 4 steps; the driver refuses a row index that is no C++ int,
    and a driver given no batch callable answers the verbs `unsupported`."""
    code, judged = _judge(binaries["contiguous_reorder_drops_pads"], tmp_path)
    found = [f for f in judged["semantic"]["findings"] if f["class"] == "wrong" and f["rule"] in ("OP-PAD", "OP-ROWS")]
    assert code == 1 and found and min(len(f["steps"]) for f in found) <= 4, judged["semantic"]["findings"][:2]
    config = {"n_layers": 1, "n_kv_heads": 1, "head_dim": 1, "v_head_dim": 1, "batch_size": 2, "capacity": 4,
              "sizing": "dynamic", "layers": [{"kind": "flat", "window": 0}], "max_write": None}
    replies = _session(binaries["contiguous"], [("create", {"config": config}), ("select", {"rows": [True]}),
                                                ("pad", {"left_padding": [1, 0.0]}), ("reorder", {"rows": [1, 0]}),
                                                ("create", {"config": {**config, "record_past": False}})])
    assert {"pad", "batch-verbs", "merge", "spec=5"} <= set(replies[0]["result"]["scope"])
    assert [r["error"]["rule"] for r in replies[2:4]] == ["OP-ROWS", "OP-PAD"] and replies[4] == {"id": 5, "result": None}
    assert replies[5]["error"]["rule"] == "SCOPE-BORDER"   # spec 3's recording: no Config field carries it
    unsupported = _session(binaries["mlx"], [("create", {"config": {**config, "batch_size": 1}}), ("pad", {"left_padding": [0]})])
    assert unsupported[2]["error"]["kind"] == "unsupported" and "pad" not in unsupported[0]["result"]["scope"]


def test_the_op_driver_refuses_what_a_cpp_signature_cannot_receive_and_the_border(binaries: dict[str, Path]) -> None:
    config = {"n_layers": 1, "n_kv_heads": 1, "head_dim": 1, "v_head_dim": 1, "batch_size": 1, "capacity": 4,
              "sizing": "dynamic", "layers": [{"kind": "ring", "window": 2}], "max_write": None}
    k = {"dtype": "float32", "shape": [1, 1, 1, 1], "data": [7]}
    position = {"dtype": "int64", "shape": [1, 1], "data": [0]}
    replies = _session(binaries["mlx"], [
        ("create", {"config": {**config, "batch_size": 2}}),        # outside the scope: batch
        ("create", {"config": {**config, "v_head_dim": 2}}),        # outside the scope: mla
        ("create", {"config": {**config, "capacity": True}}),       # not a C++ int
        ("create", {"config": config}),
        ("update_and_fetch", {"layer_id": True, "k": k, "v": k, "position": position}),
        ("update_and_fetch", {"layer_id": 0, "k": k, "v": k, "position": position}),
        ("used", {"layer_id": 0}),
        ("trim", {"n": 1}),                                          # no trim given to run_main
        ("create", {"config": {**config, "layers": [{"kind": "ring", "window": 2, "keep": 1}]}}),   # no sinks
    ])
    hello = replies[0]["result"]
    assert hello["layout"] == "op-contiguous" and hello["scope"] == ["flat", "ring", "max_write", "positions", "steps"]
    assert [r["error"]["rule"] for r in replies[1:4]] == ["SCOPE-BORDER", "SCOPE-BORDER", "OP-CONFIG"]
    assert replies[4] == {"id": 5, "result": None}
    assert replies[5]["error"]["kind"] == "rejected" and replies[5]["error"]["rule"] == "OP-ARGS"
    answer = replies[6]["result"]
    assert answer["k_hist"] == {"dtype": "float32", "shape": [1, 1, 1, 1], "data": [7]} and \
        answer["attend"] == {"kind": "NONE", "mask": None}
    assert replies[7] == {"id": 8, "result": 1}
    assert replies[8]["error"]["kind"] == "unsupported" and replies[9]["error"]["rule"] == "SCOPE-BORDER"
    trims = _session(binaries["contiguous"], [("create", {"config": config}), ("trim", {"n": True}), ("trim", {"n": 0.0}),
                                              ("trim", {"n": -1}), ("trim", {"n": 0}), ("used", {"layer_id": 0})])
    assert "trim" in trims[0]["result"]["scope"] and trims[1] == {"id": 2, "result": None}
    assert [r["error"]["rule"] for r in trims[2:5]] == ["OP-TRIM"] * 3   # true and 0.0 by the driver, -1 the cache
    assert trims[5:] == [{"id": 6, "result": None}, {"id": 7, "result": 0}]
    vectors = subprocess.run([str(binaries["mlx"]), "--vectors", "x.json"], capture_output=True, text=True, timeout=20)
    assert vectors.returncode == 2 and "no golden vectors" in vectors.stderr
    # --help is usage, not a vectors file (issue 35: it exited 2 as `--vectors`)
    usage = subprocess.run([str(binaries["mlx"]), "--help"], capture_output=True, text=True, timeout=20)
    assert usage.returncode == 0 and "usage:" in usage.stdout and "cmd:" in usage.stdout
