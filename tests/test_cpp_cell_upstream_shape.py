"""Real headers as they are: the C++ driver adapts a cell cache of upstream's shape (PR #21902:
`explicit CellCache(const CacheConfig&)`, the live set private, kMaxSeqs = 64 fixed) unchanged, and
`--vectors` survives a crashing vector.

The stand-in (spec/cpp/example/cell_cache_upstream_shape.h) has exactly that shape and this spec's
behaviour, so any finding against it would be the driver's adaptation, not the cache: it must be
CONFORMING (strict, exact layout) within its declared scope `max_seqs=64`, the suite configurations with
another max_seqs reported as outside the scope (checked refused at creation, SCOPE-BORDER), never as
findings and never as INCOMPLETE; max_seqs appears wherever a configuration is named. The shipped example
is the driver's one-line form: no factory, no scope, the class's public kMaxSeqs read as the fixed id count.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvcache_spec.conformance import cli, scope, vectors, zoo
from kvcache_spec.conformance.cell.programs import CELL_CONFIGS
from kvcache_spec.conformance.configs import describe
from kvcache_spec.conformance.coverage import family
from kvcache_spec.conformance.suite import CONFORMING, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget, SubprocessTarget

CPP = Path(__file__).resolve().parent.parent / "spec" / "cpp"
GXX = shutil.which("g++")
# slow: most of these compile the driver (tests/conftest.py, SLOW); CI runs them with -m slow.
pytestmark = [pytest.mark.skipif(GXX is None, reason="no g++ on PATH: the C++ driver tests need a C++17 compiler"),
              pytest.mark.slow]

# Variants of the stand-in, each through the driver unchanged. The static_asserts are the shape itself:
# had the stand-in a public live() or a (config, max_seqs) constructor, it would not test the adaptation.
VARIANTS = r"""
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>

#include "kvcache_conformance.hpp"
#include "example/cell_cache_upstream_shape.h"

using Shape = demo::CellCacheUpstreamShape;
using Config = demo::CacheConfig;
namespace kc = kvcache_conformance;
static_assert(!std::is_constructible_v<Shape, const Config&, int>, "upstream's constructor takes the config only");
static_assert(std::is_constructible_v<Shape, const Config&>);
static_assert(!kc::has_live<Shape>::value, "upstream's live set is private: detected as absent");
static_assert(kc::has_live<demo::CellCache>::value, "the faithful port's public live() is detected");
static_assert(kc::is_cell_cache<Shape>::value);

// The faithful port, except that one call kills the process: SIGSEGV on a fork cut at 2, abort() on a
// removal from 4 - as a cache with a wild pointer or a failed assert would on those vectors only.
struct Crashes : demo::CellCache {
  using demo::CellCache::CellCache;
  std::optional<int32_t> seq_clone(int32_t src, std::optional<int> upto) override {
    if (upto && *upto == 2) std::raise(SIGSEGV);
    return demo::CellCache::seq_clone(src, upto);
  }
  bool seq_rm(int32_t seq_id, int p0, std::optional<int> p1) override {
    if (p0 == 4) std::abort();
    return demo::CellCache::seq_rm(seq_id, p0, p1);
  }
};
// Built from the config alone, without a kMaxSeqs member to say which id count it serves.
struct NoConstant : demo::CellCache {
  explicit NoConstant(const Config& c) : demo::CellCache(c) {}
};
static_assert(!kc::has_k_max_seqs<NoConstant>::value && kc::has_k_max_seqs<Shape>::value);
// No constructor the driver could call by itself (it needs a name too): only a factory builds it.
struct Named : Shape {
  Named(const Config& c, const char* name) : Shape(c), name_(name) {}
  const char* name_;
};
static_assert(!std::is_constructible_v<Named, const Config&>);

// A cache that never answers one call (an endless loop): the test's time limit ends it.
struct Hangs : demo::CellCache {
  using demo::CellCache::CellCache;
  std::optional<int32_t> seq_clone(int32_t src, std::optional<int> upto) override {
    while (upto && *upto == 2) pause();
    return demo::CellCache::seq_clone(src, upto);
  }
};

int main(int argc, char** argv) {
  std::string variant = argc > 1 ? argv[1] : "";
  int rest = argc - 1;
  char** args = argv + 1;
  if (variant == "careless")   // a factory that ignores max_seqs: the driver keeps other values from it
    return kc::run_main<Shape, Config>(rest, args, "careless factory", kc::Scope::full().fixed_max_seqs(64),
                                       [](const Config& c, int) { return std::make_unique<Shape>(c); });
  if (variant == "default")    // no factory: constructed from the config alone, the scope fixes max_seqs
    return kc::run_main<Shape, Config>(rest, args, "no factory", kc::Scope::full().fixed_max_seqs(64));
  if (variant == "undeclared") // no factory, no fixed max_seqs, no kMaxSeqs: nothing could carry max_seqs to it
    return kc::run_main<NoConstant, Config>(rest, args, "undeclared");
  if (variant == "named")
    return kc::run_main<Named, Config>(rest, args, "named", kc::Scope::full().fixed_max_seqs(64),
                                       [](const Config& c, int) { return std::make_unique<Named>(c, "x"); });
  if (variant == "named-without-factory")
    return kc::run_main<Named, Config>(rest, args, "named", kc::Scope::full().fixed_max_seqs(64));
  if (variant == "crashes")
    return kc::run_main<Crashes, Config>(rest, args, "crashes on two vectors");
  if (variant == "hangs")
    return kc::run_main<Hangs, Config>(rest, args, "hangs on one vector");
  return 2;
}
"""


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shipped example and the variants, compiled in parallel, warnings as errors."""
    assert GXX is not None
    out = tmp_path_factory.mktemp("cell_upstream_shape")
    (out / "variants.cpp").write_text(VARIANTS)
    flags = ["-std=c++17", "-O1", "-Wall", "-Wextra", "-Wpedantic", "-Werror", f"-I{CPP}"]
    sources = {"shape": CPP / "example" / "serve_cell_cache_upstream_shape.cpp", "variants": out / "variants.cpp"}
    jobs = {name: subprocess.Popen([GXX, *flags, "-o", str(out / name), str(source)], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True) for name, source in sources.items()}
    for name, job in jobs.items():
        output, _ = job.communicate(timeout=240)
        assert job.returncode == 0, f"g++ failed for {name}:\n{output}"
    return {name: out / name for name in sources}


def _session(command: list[str], requests: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    lines = [json.dumps({"id": 1, "method": "hello", "params": {"protocol": "kvcache-conformance", "versions": [1]}})]
    lines += [json.dumps({"id": k, "method": method, "params": params}) for k, (method, params) in enumerate(requests, 2)]
    done = subprocess.run(command, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=20)
    return [json.loads(line) for line in done.stdout.splitlines()]


def _cfg(max_seqs: Any) -> dict[str, Any]:
    return {"capacity": 4, "n_layers": 1, "layers": [{"kind": "flat", "window": 0, "n_kv_heads": 1, "head_dim": 1}],
            "max_write": None, "max_seqs": max_seqs}


def test_the_hello_declares_max_seqs_64_and_no_live(binaries: dict[str, Path]) -> None:
    hello = _session([str(binaries["shape"])], [])[0]["result"]
    assert hello["layout"] == "cell" and hello["scope"] == ["flat", "ring", "max_write", "max_seqs=64"]
    assert "live" not in hello["methods"]
    replies = _session([str(binaries["shape"])], [("create", {"config": _cfg(64)}), ("live", {})])
    assert replies[1] == {"id": 2, "result": None}
    assert replies[2]["error"]["kind"] == "unsupported"   # not guessed from other calls


@pytest.mark.parametrize("variant", ["shape", "careless", "default"])
def test_other_max_seqs_never_reach_the_cache(binaries: dict[str, Path], variant: str) -> None:
    """SCOPE-BORDER at the driver: 3 is outside the declared scope; 0 and 65 are invalid (CELL-MAX-SEQS);
    a bool is not a C++ int - each refused before any factory runs, even one that ignores max_seqs."""
    command = [str(binaries["shape"])] if variant == "shape" else [str(binaries["variants"]), variant]
    replies = _session(command, [("create", {"config": _cfg(m)}) for m in (64, 3, 0, 65, True)]
                       + [("create", {"config": {k: v for k, v in _cfg(0).items() if k != "max_seqs"}})])
    assert replies[1] == {"id": 2, "result": None} and replies[6] == {"id": 7, "result": None}   # 64, and absent
    rules = [reply["error"]["rule"] for reply in replies[2:6]]
    assert rules == ["SCOPE-BORDER", "CELL-MAX-SEQS", "CELL-MAX-SEQS", "ARG-INT"], replies
    assert "outside this cache's scope (max_seqs=64)" in replies[2]["error"]["message"]


def test_a_config_only_cache_without_a_declared_max_seqs_is_refused_saying_why(binaries: dict[str, Path]) -> None:
    replies = _session([str(binaries["variants"]), "undeclared"], [("create", {"config": _cfg(64)})])
    assert replies[1]["error"]["kind"] == "rejected"
    assert "Scope::fixed_max_seqs" in replies[1]["error"]["message"]


def test_a_cache_only_a_factory_can_build_compiles_and_needs_the_factory(binaries: dict[str, Path]) -> None:
    with_factory = _session([str(binaries["variants"]), "named"], [("create", {"config": _cfg(64)}), ("seq_new", {})])
    assert with_factory[1:] == [{"id": 2, "result": None}, {"id": 3, "result": 0}]
    without = _session([str(binaries["variants"]), "named-without-factory"], [("create", {"config": _cfg(64)})])
    assert without[1]["error"]["kind"] == "rejected" and "no factory" in without[1]["error"]["message"]


@pytest.fixture(scope="module")
def shape_report(binaries: dict[str, Path]) -> dict[str, Any]:
    target = SubprocessTarget(f"cmd:{binaries['shape']}")
    try:
        result = run_suite(target, "quick", seed=0)
    finally:
        target.close()
    return report_json(result, strict=True, exact_layout=True)


def test_the_upstream_shape_is_conforming_within_max_seqs_64(shape_report: dict[str, Any]) -> None:
    """The done-condition of issue 18 part 3: no false finding, no INCOMPLETE, strictly."""
    report = shape_report
    assert report["verdict"] == CONFORMING, (report["semantic"]["findings"][:2], report["coverage"]["incomplete"])
    assert report["semantic"]["findings"] == [] and report["layout"]["canonical"]
    assert not report["coverage"]["rules"]["not_exercised"]
    # every suite configuration is driven with 64 ids (the twins of those with fewer), none with fewer
    outside = [cfg for cfg in CELL_CONFIGS if cfg["max_seqs"] != 64]
    assert outside and report["coverage"]["configurations"]["planned"] == len(CELL_CONFIGS)
    assert report["coverage"]["configurations"]["created"] == len(CELL_CONFIGS)
    assert len(report["coverage"]["families"]["exercised"]) == len({family(cfg) for cfg in CELL_CONFIGS})
    declared = report["scope"]
    assert declared["max_seqs"] == 64 and declared["configs_outside"] == len(outside)
    assert "SCOPE-BORDER" in report["coverage"]["rules"]["exercised"]   # the others were refused at create
    families = declared["unexercised"]["families"]
    assert all("max_seqs" in family for family in families), families
    assert any("live() absent" in note for note in report["skipped"])


def test_a_careless_factory_is_still_conforming(binaries: dict[str, Path]) -> None:
    target = SubprocessTarget(f"cmd:{binaries['variants']} careless")
    try:
        result = run_suite(target, "quick", seed=0)
    finally:
        target.close()
    assert result.verdict(strict=True, exact_layout=True) == CONFORMING, sorted(result.findings)


def test_the_text_summary_names_max_seqs(binaries: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--target", f"cmd:{binaries['shape']}", "--strict", "-v"]) == 0   # -v: each skipped note
    out = capsys.readouterr().out
    assert "CONFORMING (strict) within the scope flat,ring,max_write,max_seqs=64 only" in out
    assert "not exercised: cap 8, flat, max_seqs 3" in out


def test_every_config_name_carries_max_seqs() -> None:
    """Two cell configs differing only in max_seqs are two configs: their names differ (the report's
    config names, the vectors' configName, the scope notes all use describe)."""
    assert describe(CELL_CONFIGS[0]).endswith(", max_seqs 3")
    assert describe({**CELL_CONFIGS[0], "max_seqs": True}).endswith(", max_seqs True")
    assert len({describe(cfg) for cfg in CELL_CONFIGS}) == len(CELL_CONFIGS)
    document = json.loads((vectors.VECTORS_DIR / vectors.CELL_VECTORS_FILE).read_text())
    named = [group["configName"] for group in document["testGroups"] if group["config"] is not None]
    assert named and all(name.endswith(f", max_seqs {group['config']['max_seqs']}") for name, group in
                         zip(named, [g for g in document["testGroups"] if g["config"] is not None]))


def test_a_cell_finding_names_its_max_seqs_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The text summary, the JSON report, the pasteable test and the saved vector of a cell finding."""
    spec = zoo.CELL_ZOO["rm_off_by_one"][0]
    assert cli.main(["--target", spec, "--json", str(tmp_path / "r.json"), "--save-findings", str(tmp_path / "f")]) == 1
    finding = json.loads((tmp_path / "r.json").read_text())["semantic"]["findings"][0]
    name = f"max_seqs {finding['config']['max_seqs']}"
    assert finding["config_name"].endswith(name)
    assert f"config {finding['config_name']}; " in capsys.readouterr().out
    assert f"    # config {finding['config_name']}\n" in finding["pytest"]
    saved = json.loads(sorted((tmp_path / "f").glob("*.json"))[0].read_text())
    assert saved["testGroups"][0]["configName"].endswith(name)


def _inside_64(document: dict[str, Any]) -> tuple[int, int]:
    """(tests a max_seqs=64 replayer runs, tests it skips), counted from the document."""
    fixed = scope.Scope(frozenset(scope.FEATURES), max_seqs=64)
    runs = sum(1 for g in document["testGroups"] for t in g["tests"] if scope.applies(t["flags"], fixed, g["config"]))
    return runs, sum(len(g["tests"]) for g in document["testGroups"]) - runs


def test_the_shape_replays_the_cell_vectors_of_its_scope(binaries: dict[str, Path]) -> None:
    path = vectors.VECTORS_DIR / vectors.CELL_VECTORS_FILE
    runs, outside = _inside_64(json.loads(path.read_text()))
    assert runs > 20 and outside > 0
    done = subprocess.run([binaries["shape"], "--vectors", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"vectors: {runs} passed, 0 failed, {outside} tests outside the scope skipped" in done.stdout


def test_vectors_survive_a_crashing_vector(binaries: dict[str, Path]) -> None:
    """Each vector runs in its own process: the two that kill the cache are reported as crashed (SIGSEGV,
    SIGABRT), every other one still runs, and the replay ends with its summary and exit 1."""
    path = vectors.VECTORS_DIR / vectors.CELL_VECTORS_FILE
    document = json.loads(path.read_text())
    total = sum(len(g["tests"]) for g in document["testGroups"])
    done = subprocess.run([binaries["variants"], "crashes", "--vectors", str(path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    crashed = [line for line in done.stderr.splitlines() if ": crashed: killed by SIG" in line]
    assert any("SIGSEGV" in line for line in crashed) and any("SIGABRT" in line for line in crashed), done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert summary == (f"vectors: {total - len(crashed)} passed, {len(crashed)} failed ({len(crashed)} crashed), "
                       f"0 tests outside the scope skipped, 0 calls to absent optional methods skipped")


def test_vectors_survive_a_hanging_vector(binaries: dict[str, Path]) -> None:
    """A vector that never answers is ended by the test's time limit (here 1 s) and reported as a hang."""
    document = json.loads((vectors.VECTORS_DIR / vectors.CELL_VECTORS_FILE).read_text())
    one = {**document, "testGroups": [{**document["testGroups"][0],
                                       "tests": [t for t in document["testGroups"][0]["tests"]
                                                 if t["comment"].startswith(("forks:", "queries"))]}]}
    path = Path(str(binaries["variants"]) + "-hang.json")
    path.write_text(json.dumps(one))
    done = subprocess.run([binaries["variants"], "hangs", "--vectors", str(path)], capture_output=True, text=True,
                          timeout=60, env={"KVCACHE_CONFORMANCE_TEST_SECONDS": "1"})
    assert done.returncode == 1, done.stderr[-2000:]
    assert "(forks: whole, at every cut, of an empty source): crashed: killed by SIGALRM (no answer within 1 s: " \
           "a hang)" in done.stderr
    assert done.stdout.strip().endswith("vectors: 1 passed, 1 failed (1 crashed), 0 tests outside the scope "
                                        "skipped, 0 calls to absent optional methods skipped")


@pytest.mark.parametrize("name, conforming", [("fixed_64", True), ("careless_64", False)])
def test_a_python_cell_cache_declares_the_same_scope(name: str, conforming: bool) -> None:
    """The scope feature is the harness's, not the C++ driver's: a python: factory declaring max_seqs=64
    that refuses the others is CONFORMING; one that accepts them and serves 64 ids is caught at the
    border (SCOPE-BORDER: wrong), since nothing stands between it and the configs outside its scope."""
    target = PythonTarget(f"python:tests.cell_fixed_ids_targets:{name}")
    result = run_suite(target, "quick", seed=0)
    assert target.scope.max_seqs == 64
    if conforming:
        assert result.verdict(strict=True, exact_layout=True) == CONFORMING, (sorted(result.findings),
                                                                             result.incomplete())
    else:
        assert ("wrong", "SCOPE-BORDER") in result.findings, sorted(result.findings)
        assert "max_seqs" in result.findings[("wrong", "SCOPE-BORDER")].finding.message


# --- the scope feature itself (scope.py) ----------------------------------------------------------------

def test_a_fixed_max_seqs_is_parsed_and_judged_exactly() -> None:
    fixed = scope.parse(["all", "max_seqs=64"], "test")
    assert fixed.max_seqs == 64 and not fixed.full_for("cell") and fixed.names()[-1] == "max_seqs=64"
    assert fixed.covers({**CELL_CONFIGS[0], "max_seqs": 64}) and fixed.covers({"capacity": 1})   # absent: 64
    assert fixed.missing(CELL_CONFIGS[0]) == {"max_seqs"}
    assert not scope.parse(["all", "max_seqs=1"], "test").covers({**CELL_CONFIGS[0], "max_seqs": True})
    assert scope.parse(["all"], "test").full_for("cell") and scope.parse(["all"], "test").covers(CELL_CONFIGS[0])
    for bad in (["max_seqs=0"], ["max_seqs=65"], ["max_seqs=x"], ["max_seqs=-1"], ["max_seqs=3", "max_seqs=4"]):
        with pytest.raises(scope.ScopeError):
            scope.parse(bad, "test")
    # the twins: each config outside by its max_seqs alone, with 64 ids; none for the whole spec
    twins = scope.with_twins(CELL_CONFIGS, fixed)
    assert twins[:len(CELL_CONFIGS)] == CELL_CONFIGS and len(twins) == 2 * len(CELL_CONFIGS) - 1
    assert all(cfg["max_seqs"] == 64 for cfg in twins[len(CELL_CONFIGS):])
    assert scope.with_twins(CELL_CONFIGS, scope.FULL) == CELL_CONFIGS
    ring_only = scope.parse(["ring", "max_seqs=64"], "test")   # a flat config is outside by its kind too
    assert not any(cfg["layers"][0]["kind"] == "flat" and len(cfg["layers"]) == 1
                   for cfg in scope.with_twins(CELL_CONFIGS, ring_only)[len(CELL_CONFIGS):])
    # a saved SCOPE-BORDER finding on max_seqs is replayed only by a target whose scope fixes max_seqs
    assert not scope.applies(["WITHOUT-MAX-SEQS"], scope.FULL) and scope.applies(["WITHOUT-MAX-SEQS"], fixed)
