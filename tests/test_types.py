"""The typing bar: `mypy --strict` is clean on kvcache/ and spec/; kvcache's modules import one way."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_mypy_strict_on_kvcache_and_spec() -> None:
    run = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "kvcache", "spec"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


def _imports_within_kvcache() -> dict[str, set[str]]:
    """Each module of kvcache/ -> the kvcache modules it imports (relative imports, typing-only ones too)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "kvcache").glob("*.py")):
        tree = ast.parse(path.read_text())
        graph[path.stem] = {node.module.split(".")[0] for node in ast.walk(tree)
                            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}
    return graph


def test_kvcache_modules_import_each_other_one_way() -> None:
    """No import cycle inside kvcache (not even under TYPE_CHECKING), and neither layout imports the other:
    the faces and the shared checks sit below both (_types, _layers, _faces)."""
    graph = _imports_within_kvcache()
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"kvcache modules import each other in a circle: {cycle.args[1]}")
    layouts = {"_cache", "_cells"}
    for layout in layouts:
        assert not graph[layout] & layouts, f"{layout} imports another layout: {graph[layout] & layouts}"
    assert not graph["_faces"] & layouts, "a face module imports a layout"
