"""The paged layout's consequences: past a lenient or over-strict step (a double free accepted, a valid
admission refused on an idle pool), the program goes on with the spec's state - a rejected call changed
nothing, a refused one admitted nothing - and only what must hold whatever the caller did is judged: the
data every live request reads (SAFE-PAGED-DATA) and the pool's bookkeeping, read back from the target."""

from __future__ import annotations

from typing import Any

from ..consequences import Consequences
from ..engine import CRASH, WRONG, Finding, Step, Stop
from .engine import PagedEngine

SAFETY_ID = "SAFE-PAGED-DATA"


class PagedConsequences(Consequences):
    """Drives the rest of the program on the engine itself (its harness memory and mirror of the tables): a
    wrong answer there is the entry's consequence."""

    atomic_rule = "PAGED-ATOMIC"

    def __init__(self, engine: PagedEngine, entry: Finding) -> None:
        super().__init__(engine, entry)
        self.paged = engine

    def after_entry(self) -> None:
        """The entry's effect is the target's alone: the harness's tables stay as the spec left them, and the
        next read-back shows what it changed."""
        self.check_table("right after the entry step")

    def run_step(self, step: Step) -> None:
        self._judged(lambda: self._step(step))

    def _step(self, step: Step) -> None:
        concrete = self.paged.run_step(step)
        if concrete is not None:
            self.steps.append(concrete)

    def check_table(self, context: str) -> None:
        self._judged(lambda: self.paged.full_check(context))

    def _judged(self, run: Any) -> None:
        """A wrong finding of the lockstep is a broken safety property under its own rule; a crash stays a
        crash; another lenient or over-strict step ends the drive (it is a finding of its own)."""
        try:
            run()
        except Stop as stop:
            found = stop.finding
            if found.kind == WRONG:
                raise self._broken(SAFETY_ID, found.message, rule=found.rule) from None
            if found.kind == CRASH:
                raise
            raise _Ended() from None


class _Ended(ValueError):
    """The drive met another lenient or over-strict step: said in the report's skipped notes (Consequences.drive)."""


def drive_on(engine: Any, program: list[Step], entry: Finding) -> None:
    """The engine's drive past a lenient or over-strict entry (engine.Drive)."""
    PagedConsequences(engine, entry).drive(Consequences.rest(program, entry))
