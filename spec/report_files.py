"""Report files (--json, --junit) of every command: the path checked before any work starts, the file
written atomically. Below the commands (the CLI, the conformance suite, `kvcache verify`), so that each
writes its reports one way without importing the others."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Optional, TextIO


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
