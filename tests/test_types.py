"""The typing bar: `mypy --strict` is clean on kvcache/ and spec/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_strict_on_kvcache_and_spec() -> None:
    run = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "kvcache", "spec"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
