"""Compile C++ targets for the tests: every build at once, warnings as errors, against the driver header."""

from __future__ import annotations

import subprocess
from pathlib import Path

FLAGS = ("-std=c++17", "-O1", "-Wall", "-Wextra", "-Wpedantic", "-Werror")


def compile_all(gxx: str, include: Path, out: Path, builds: dict[str, tuple[Path, tuple[str, ...]]]) -> dict[str, Path]:
    """Each build (name -> source and its -D defines) compiled in parallel into `out`; a failed one fails the test
    with g++'s output."""
    jobs = {name: subprocess.Popen([gxx, *FLAGS, *(f"-D{d}" for d in defines), "-I", str(include), "-o",
                                    str(out / name), str(source)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
            for name, (source, defines) in builds.items()}
    for name, job in jobs.items():
        output, _ = job.communicate(timeout=300)
        assert job.returncode == 0, f"g++ failed for {name}:\n{output}"
    return {name: out / name for name in builds}
