"""Every command of a plain install (no extras) works, or says in one line which extra it needs.

    python tests/plain_install_check.py        (run by the venv's python; CI: a venv with the bare wheel)

It finds the commands itself, so a command added later is checked too: the `kvcache` subcommands
(kvcache_spec.cli.SUBCOMMANDS) and every installed module with a `__main__` block or a `__main__.py`.
Each runs with --help; the commands that do the work of the `verify` extra also run for real. A command
passes when it exits 0, or exits 2 with no traceback; one that needs an extra must exit 2 with exactly
one line naming `kvcache-spec[EXTRA]`. The light main job, `kvcache conformance`, must pass here.
Exit 0 when every command passes, 1 otherwise (each failure printed).
"""

from __future__ import annotations

import importlib.util
import os
import pkgutil
import subprocess
import sys
import tempfile
from typing import Optional

PACKAGES = ("kvcache", "kvcache_spec", "kvcache_proofs")
# The work of the verify extra, run for real (not only --help): each must name the extra when it is missing.
NEEDS_VERIFY = (
    ["-m", "kvcache_spec.cli", "verify", "--profile", "quick"],
    ["-m", "kvcache_proofs.verify", "--profile", "quick"],
    ["-m", "kvcache_proofs.model_checker", "--profile", "quick"],
    ["-m", "kvcache_proofs.z3_induction"],
    ["-m", "kvcache_proofs.z3_cells"],
    ["-m", "kvcache_proofs.crosshair_gate"],
    ["-m", "kvcache_proofs.stress", "--runs", "1"],
)
MUST_PASS = (["-m", "kvcache_spec.cli", "conformance", "--profile", "quick"],)


def runnable_modules() -> list[str]:
    """Every installed module of ours that `python -m` runs: a __main__ block, or a package's __main__."""
    found = []
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations is not None, package
        for info in pkgutil.walk_packages(list(spec.submodule_search_locations), prefix=package + "."):
            module_spec = importlib.util.find_spec(info.name)
            origin = module_spec.origin if module_spec else None
            if not origin or not origin.endswith(".py"):
                continue
            with open(origin, encoding="utf-8") as source:
                text = source.read()
            if info.name.endswith(".__main__"):
                found.append(info.name.rsplit(".", 1)[0])
            elif 'if __name__ == "__main__"' in text:
                found.append(info.name)
    return sorted(set(found))


def verdict(argv: list[str], expect: str) -> Optional[str]:
    """Why this command fails its expectation, or None when it meets it. expect: "pass" (exit 0),
    "usage" (exit 0, or 2 for a usage error), or an extra's name (exit 2, one line naming it)."""
    with tempfile.TemporaryDirectory() as folder:   # a command that writes reports writes them here
        run = subprocess.run([sys.executable, *argv], cwd=folder, stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=600, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    err = run.stderr.strip()
    last = err.splitlines()[-1] if err else run.stdout[-200:]
    if "Traceback (most recent call last)" in run.stderr:
        return f"a traceback (exit {run.returncode}): {last}"
    if expect == "pass":
        return None if run.returncode == 0 else f"exit {run.returncode}: {last}"
    if expect == "usage":
        return None if run.returncode in (0, 2) else f"exit {run.returncode}: {last}"
    lines = err.splitlines()
    if run.returncode != 2 or len(lines) != 1 or f"kvcache-spec[{expect}]" not in lines[0]:
        return f"exit {run.returncode}, stderr {err!r}: not one line naming kvcache-spec[{expect}]"
    return None


def main() -> int:
    from kvcache_spec.cli import SUBCOMMANDS

    verify_missing = any(importlib.util.find_spec(m) is None for m in ("hypothesis", "crosshair", "z3"))
    checks: list[tuple[list[str], str]] = [(["-m", "kvcache_spec.cli", name, "--help"], "usage") for name in SUBCOMMANDS]
    checks += [(["-m", module, "--help"], "usage") for module in runnable_modules()]
    if verify_missing:   # with the extra installed these are verification runs of their own (minutes)
        checks += [(list(argv), "verify") for argv in NEEDS_VERIFY]
    checks += [(list(argv), "pass") for argv in MUST_PASS]
    failures = 0
    for argv, expect in checks:
        problem = verdict(argv, expect)
        print(f"{'FAIL' if problem else 'ok  '} python {' '.join(argv)}" + (f"\n     {problem}" if problem else ""))
        failures += problem is not None
    print(f"{len(checks) - failures}/{len(checks)} commands behave"
          + ("" if verify_missing else " (the verify extra is installed: its work was not run)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
