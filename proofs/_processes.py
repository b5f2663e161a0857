"""Worker processes: forking them safely from a host that may have its own SIGTERM handler, and carrying
a deadline to them."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable, Iterator, Optional


def to_wall_clock(deadline: Optional[float], clock: Callable[[], float] = time.monotonic) -> Optional[float]:
    """A deadline on this process's `clock` (monotonic, or perf_counter) as wall-clock time: how it travels
    to another process or machine (those clocks are not shared), turned back there by `from_wall_clock`."""
    return None if deadline is None else time.time() + (deadline - clock())


def from_wall_clock(wall_deadline: Optional[float], clock: Callable[[], float] = time.monotonic) -> Optional[float]:
    """`to_wall_clock`'s inverse, on the receiving process's `clock`."""
    return None if wall_deadline is None else clock() + (wall_deadline - time.time())


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
