"""The `kvcache` command: one entry point, one module per subcommand (imported only when used).

Exit codes, for every subcommand: 0 everything holds, 1 something fails, 2 usage or environment error;
`kvcache conformance` adds 3: INCOMPLETE (the run exercised less than its profile promises).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional, TextIO

# subcommand -> (module, function, one line of help). Each function takes argv and returns the exit code.
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "verify": ("kvcache_proofs.verify", "main", "stateful checks, CrossHair, Z3 and the model checker"),
    "conformance": ("kvcache_spec.conformance.cli", "main", "run the conformance suite against a target"),
    "vectors": ("kvcache_spec.conformance.vectors", "main", "regenerate or check the golden vectors"),
    "trace": ("kvcache_spec.trace", "main", "print the rule -> model, contracts, tests, vectors matrix"),
    "cpp": ("kvcache_spec.cpp", "main", "print where the installed C++ driver header is (--include, --cmakedir)"),
}


def report_path_problem(path: Optional[str], stdout_ok: bool = False) -> Optional[str]:
    """Why a report path (--json, --junit) cannot be written, checked before any work starts; None if
    it can. Its missing folders are created now (that is fine: the report goes there), and a probe
    file is created and removed in the folder - the only check that holds for root and odd mounts."""
    if path is None or (stdout_ok and path == "-"):
        return None
    if not path:
        return "an empty report path"
    target = Path(path)
    if target.is_dir():
        return "is a directory"
    blocking = next((folder for folder in target.parents if folder.exists() and not folder.is_dir()), None)
    if blocking is not None:
        return f"{blocking} is not a directory"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".probe")
        os.close(handle)
        os.unlink(probe)
        if target.exists() and not os.access(target, os.W_OK):
            return "is not writable"
    except OSError as error:
        return f"cannot be written: {error.strerror or error}"
    return None


@contextlib.contextmanager
def open_report(path: str) -> Iterator[TextIO]:
    """Write a report file (--json, --junit) atomically (a temporary file renamed over it on success),
    creating its folder: CI asks for reports/x.xml in a fresh clone."""
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{Path(path).name}.", suffix=".tmp")
    mask = os.umask(0)
    os.umask(mask)
    try:
        os.chmod(temporary, 0o666 & ~mask)   # mkstemp's 0600 would stick to the report
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            yield out
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _usage() -> str:
    lines = ["usage: kvcache SUBCOMMAND [options]", "", "subcommands:"]
    lines += [f"  {name:<12} {text}" for name, (_, _, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] not in SUBCOMMANDS:
        print(f"kvcache: unknown subcommand {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, function_name, _ = SUBCOMMANDS[args[0]]
    try:
        function: Callable[[list[str]], int] = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        print(f"kvcache {args[0]}: not available ({error})", file=sys.stderr)
        return 2
    return function(args[1:])


if __name__ == "__main__":
    sys.exit(main())
