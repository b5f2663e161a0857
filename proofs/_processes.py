"""Forking worker processes safely from a host that may have its own SIGTERM handler."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


@contextlib.contextmanager
def default_sigterm() -> Iterator[None]:
    """Workers are forked copies of this process: if the host installed a Python SIGTERM handler (a
    CLI that unwinds with sys.exit, say - `kvcache conformance` does), a worker terminated at a budget,
    or by `Pool.terminate`, would run the host's code instead of dying (measured: a model checker pool
    worker survived its SIGTERM blocked on the task queue's lock, and `terminate` waited for it forever).
    Fork them with the default action, and restore the host's handler afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
