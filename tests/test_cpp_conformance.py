"""The C++ driver (spec/cpp/kvcache_conformance.hpp): compiled once per session with g++, it serves
the protocol for a faithful port (conforms strictly) and an upstream-faithful lax cache (caught),
and replays the golden vectors without Python."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kvcache_spec.conformance import run_suite, vectors
from kvcache_spec.conformance.engine import CRASH, LENIENT, OVER_STRICT, WRONG
from kvcache_spec.conformance.targets import SubprocessTarget

CPP = Path(__file__).resolve().parent.parent / "spec" / "cpp"
EXAMPLES = {"port": "serve_reference_port.cpp", "lax": "serve_upstream_lax.cpp"}
GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="no g++ on PATH: the C++ driver tests need a C++17 compiler")


# A cache whose planner face is another object: the driver must answer same_object false (FACES).
SPLIT_FACES = """
#include "kvcache_conformance.hpp"
#include "example/reference_port.h"
struct SplitFaces : demo::ReferencePort {
  explicit SplitFaces(const demo::CacheConfig& c) : demo::ReferencePort(c), other(c) {}
  demo::SequencePlanner* as_planner() override { return &other; }
  demo::ReferencePort other;
};
int main(int argc, char** argv) {
  return kvcache_conformance::run_main<SplitFaces, demo::CacheConfig>(argc, argv, "split faces");
}
"""


@pytest.fixture(scope="session")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The examples (and two variants), compiled in parallel, warnings as errors."""
    assert GXX is not None
    out = tmp_path_factory.mktemp("kvcache_cpp")
    (out / "split_faces.cpp").write_text(SPLIT_FACES)
    flags = ["-std=c++17", "-O1", "-Wall", "-Wextra", "-Wpedantic", "-Werror", f"-I{CPP}"]
    sources = {name: ([], CPP / "example" / source) for name, source in EXAMPLES.items()}
    sources["port_nortti"] = (["-fno-rtti", "-DKVCACHE_CONFORMANCE_NO_RTTI"], CPP / "example" / EXAMPLES["port"])
    sources["split_faces"] = ([], out / "split_faces.cpp")
    jobs = {name: subprocess.Popen([GXX, *flags, *extra, "-o", str(out / name), str(source)],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for name, (extra, source) in sources.items()}
    for name, job in jobs.items():
        output, _ = job.communicate(timeout=120)
        assert job.returncode == 0, f"g++ failed for {name}:\n{output}"
    return {name: out / name for name in sources}


def test_the_faithful_port_replays_every_vector(binaries: dict[str, Path]) -> None:
    done = subprocess.run([binaries["port"], "--vectors", str(vectors.VECTORS_DIR / vectors.VECTORS_FILE)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{vectors.build()['numberOfTests']} passed, 0 failed" in done.stdout


def test_the_lax_cache_fails_the_vectors_naming_its_bugs(binaries: dict[str, Path]) -> None:
    """It fails the rewind and append vectors - and dies (SIGSEGV) on the last group's `layers: []`
    config, as upstream would: it indexes layers without checking their number (CFG-LAYERS)."""
    done = subprocess.run([binaries["lax"], "--vectors", str(vectors.VECTORS_DIR / vectors.VECTORS_FILE)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "REWIND-SOUND" in done.stderr and "STEP-APPEND" in done.stderr


def test_the_faithful_port_conforms_strictly_over_the_protocol(binaries: dict[str, Path]) -> None:
    target = SubprocessTarget(f"cmd:{binaries['port']}")
    try:
        result = run_suite(target, "quick", seed=0)
    finally:
        target.close()
    assert result.conforming(strict=True, exact_layout=True), sorted(result.findings)
    assert not result.skipped   # length, depth and retained_from were detected


def test_the_lax_cache_is_caught_over_the_protocol(binaries: dict[str, Path]) -> None:
    target = SubprocessTarget(f"cmd:{binaries['lax']}")
    try:
        result = run_suite(target, "quick", seed=0)
    finally:
        target.close()
    found = set(result.findings)
    assert {(WRONG, "REWIND-SOUND"), (OVER_STRICT, "REWIND-SOUND"), (LENIENT, "STEP-APPEND"),
            (LENIENT, "STEP-T"), (LENIENT, "COMMIT-ISSUED"), (LENIENT, "CFG-CAPACITY"),
            (CRASH, "CFG-LAYERS")} <= found, sorted(found)
    assert any("depth() absent" in note for note in result.skipped)   # detected as absent, and said so


def test_the_driver_answers_protocol_errors_on_bad_lines(binaries: dict[str, Path]) -> None:
    lines = ["not json", '{"id": 1}', '{"id": 2, "method": "plan", "params": {"layer": 0, "position": 0, "T": 1}}',
             '{"id": 3, "method": "hello", "params": {"protocol": "kvcache-conformance", "versions": [7]}}',
             '{"id": 4, "method": "bye", "params": {}}']
    done = subprocess.run([binaries["port"]], input="\n".join(lines) + "\n", capture_output=True, text=True,
                          timeout=10)
    replies = done.stdout.splitlines()
    assert done.returncode == 0 and len(replies) == 5
    assert all('"kind":"protocol"' in reply for reply in replies[:4])
    assert replies[4] == '{"id":4,"result":null}'


FACES_SESSION = "\n".join([
    '{"id": 1, "method": "hello", "params": {"protocol": "kvcache-conformance", "versions": [1]}}',
    '{"id": 2, "method": "create", "params": {"config": {"capacity": 4, "n_layers": 1, "layers": '
    '[{"kind": "flat", "window": 0, "n_kv_heads": 1, "head_dim": 1}], "max_write": null}}}',
    '{"id": 3, "method": "faces", "params": {}}']) + "\n"


@pytest.mark.parametrize("name, same", [("port", "true"), ("port_nortti", "true"), ("split_faces", "false")])
def test_the_driver_tells_one_object_from_two(binaries: dict[str, Path], name: str, same: str) -> None:
    done = subprocess.run([binaries[name]], input=FACES_SESSION, capture_output=True, text=True, timeout=10)
    assert done.stdout.splitlines()[-1] == '{"id":3,"result":{"same_object":%s}}' % same
