"""Cell targets for tests/test_cell_hostile.py: defects the conformance suite must not hide.

`LenientThenStale` is lenient where upstream is (a table-changing verb between the layers of a forward
is served, not raised) and, separately, wrong: a clear() while a forward is open leaves the forward's
memo stale, so the first query token of the next forward attends nothing (not even its own cell). The
only edge programs that clear mid-forward also call verbs mid-forward first, so a suite that ends a
program at its first lenient finding reports this target lenient only.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import kvcache


class LenientThenStale:
    kvcache_layout = "cell"

    def __init__(self, config: kvcache.CacheConfig, max_seqs: int = kvcache.MAX_SEQS) -> None:
        self.inner = kvcache.CellCache(config, max_seqs)
        self.stale = False

    def __getattr__(self, name: str) -> Any:   # every other method is the reference's
        return getattr(self.inner, name)

    def as_batch_control(self) -> "LenientThenStale":
        return self

    def as_cell_stepper(self) -> "LenientThenStale":
        return self

    def _open(self) -> bool:
        return self.inner._declared is not None

    def seq_rm(self, seq_id: Any, p0: Any, p1: Any = None) -> bool:
        if self._open():
            return True      # lenient: upstream serves a verb mid-forward (here: it does nothing)
        return bool(self.inner.seq_rm(seq_id, p0, p1))

    def seq_new(self) -> Optional[int]:
        if self._open():
            return 0         # lenient, as seq_rm
        return self.inner.seq_new()

    def clear(self) -> None:
        self.stale = self._open()
        self.inner.clear()

    def place_step(self, layer: int, positions: Sequence[int]) -> kvcache.CellStep:
        step = self.inner.place_step(layer, positions)
        if not self.stale:
            return step
        self.stale = self._open()   # the stale memo lasts for the rest of this forward
        return kvcache.CellStep(step.length, step.read_len, step.cells, bytes(step.read_len) + step.mask_bits[step.read_len:])


class _Delegating:
    """The reference behind a cell target's faces; subclasses spoil one thing."""

    kvcache_layout = "cell"

    def __init__(self, config: kvcache.CacheConfig, max_seqs: int = kvcache.MAX_SEQS) -> None:
        self.inner = kvcache.CellCache(config, max_seqs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def as_batch_control(self) -> Any:
        return self

    def as_cell_stepper(self) -> Any:
        return self


class CrashesOnPlace(_Delegating):
    """Dies (the process exits) on the third forward's first layer."""

    forwards = 0

    def place_step(self, layer: int, positions: Sequence[int]) -> kvcache.CellStep:
        if layer == 0 and self.inner._positions is None:
            type(self).forwards += 1
            if type(self).forwards % 3 == 0:
                import os
                os._exit(3)
        return self.inner.place_step(layer, positions)


class HangsInSeqNew(_Delegating):
    """Never answers seq_new."""

    def seq_new(self) -> Optional[int]:
        import sys
        import time
        print("hanging in seq_new", file=sys.stderr, flush=True)   # for a test to know when
        while True:
            time.sleep(60)


class WrongTypes(_Delegating):
    """Answers seq_len as a str and live() as a set of str."""

    def seq_len(self, seq_id: int) -> Any:
        return str(self.inner.seq_len(seq_id))


class PrintsToStdout(_Delegating):
    """Prints on every forward (stdout belongs to the protocol when it is served out of process)."""

    def declare_step(self, seq_ids: Sequence[int]) -> bool:
        print("declare", list(seq_ids), flush=True)
        return bool(self.inner.declare_step(seq_ids))


class IgnoresSigterm(HangsInSeqNew):
    """Hangs, and ignores SIGTERM (only SIGKILL ends it)."""

    def __init__(self, config: kvcache.CacheConfig, max_seqs: int = kvcache.MAX_SEQS) -> None:
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        super().__init__(config, max_seqs)


class _ForgedStep(_Delegating):
    """Answers place_step with a duck-typed step (not a kvcache.CellStep) spoiled by `forge`."""

    def forge(self, step: kvcache.CellStep) -> dict[str, Any]:
        raise NotImplementedError

    def place_step(self, layer: int, positions: Sequence[int]) -> Any:
        from types import SimpleNamespace
        step = self.inner.place_step(layer, positions)
        fields = {"length": step.length, "read_len": step.read_len, "cells": step.cells, "mask_bits": step.mask_bits}
        return SimpleNamespace(**{**fields, **self.forge(step)})


class CellsOutOfRead(_ForgedStep):
    def forge(self, step: kvcache.CellStep) -> dict[str, Any]:
        return {"cells": [step.read_len + 5] * step.length}


class ShortMask(_ForgedStep):
    def forge(self, step: kvcache.CellStep) -> dict[str, Any]:
        return {"mask_bits": step.mask_bits[:-1]}


class MaskOfTwos(_ForgedStep):
    def forge(self, step: kvcache.CellStep) -> dict[str, Any]:
        return {"mask_bits": bytes(2 if b else 0 for b in step.mask_bits)}


class BoolLength(_ForgedStep):
    def forge(self, step: kvcache.CellStep) -> dict[str, Any]:
        return {"length": True}


class SameCellTwice(_ForgedStep):
    def forge(self, step: kvcache.CellStep) -> dict[str, Any]:
        return {"cells": [step.cells[0]] * step.length}


class HugeReadLen(_ForgedStep):
    def forge(self, step: kvcache.CellStep) -> dict[str, Any]:
        return {"read_len": 2**40}
