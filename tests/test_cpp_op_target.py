"""An op-face target in C++ (spec/cpp/example/serve_op_contiguous.cpp), compiled with g++ and judged over
the protocol: the op face's JSON tensors read and written by a non-Python encoder, as a C++ or Rust
`update_and_fetch` would be checked. Correct, it conforms strictly inside its declared scope; with its
window one too wide, the suite and the exhaustive checker catch it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kvcache_spec.conformance import cli
from kvcache_spec.conformance.op import checker as op_checker
from kvcache_spec.conformance.suite import CONFORMING, NOT_CONFORMING

SOURCE = Path(__file__).resolve().parent.parent / "spec" / "cpp" / "example" / "serve_op_contiguous.cpp"
GXX = shutil.which("g++")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(GXX is None, reason="no g++ on PATH: the C++ op target needs a C++17 compiler")]


def _build(tmp_path: Path, *defines: str) -> Path:
    binary = tmp_path / ("serve_op_contiguous" + "".join(d.lower() for d in defines))
    built = subprocess.run([str(GXX), "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", *(f"-D{d}" for d in defines),
                            "-I", str(SOURCE.parent.parent), "-o", str(binary), str(SOURCE)],
                           capture_output=True, text=True, timeout=180)
    assert built.returncode == 0, built.stderr
    return binary


def test_the_cpp_op_target_conforms_within_its_scope_and_its_broken_window_is_caught(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    correct, broken = _build(tmp_path), _build(tmp_path, "KVCACHE_EXAMPLE_WINDOW_OFF_BY_ONE")
    report = tmp_path / "report.json"
    assert cli.main(["--target", f"cmd:{correct}", "--strict", "--json", str(report)]) == 0
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict == "  CONFORMING (strict) within the scope flat,ring,mla only"
    judged = json.loads(report.read_text())
    assert judged["verdict"] == CONFORMING and not judged["coverage"]["incomplete"]
    assert {"OP-ATTEND", "OP-MASK", "OP-HIST", "OP-ARGS", "OP-CAP", "OP-ATOMIC"} <= set(judged["coverage"]["rules"]["exercised"])

    assert cli.main(["--target", f"cmd:{broken}", "--strict", "--json", str(report)]) == 1
    judged = json.loads(report.read_text())
    found = [f for f in judged["semantic"]["findings"] if (f["class"], f["rule"]) == ("wrong", "OP-ATTEND")]
    assert judged["verdict"] == NOT_CONFORMING and found and min(len(f["steps"]) for f in found) == 1
    capsys.readouterr()
    # the exhaustive checker: its shortest program over its alphabet is 5 steps (three tokens on the ring)
    assert op_checker.main(["--target", f"cmd:{broken}", "--depth", "5"]) == 1
    shortest = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["class"], f["rule"], len(f["steps"])) for f in shortest] == [("wrong", "OP-ATTEND", 5)]
    assert op_checker.main(["--target", f"cmd:{correct}", "--depth", "5"]) == 0
