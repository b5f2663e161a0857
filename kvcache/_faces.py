"""The faces of a cache: one object, seen by the runner and by the backend.

Upstream recovers each face from `CacheBase` without RTTI: every `as_*` face has a default that
returns null, and a cache returns itself from the faces it implements. Here too: the sequence cache
answers `as_control()` / `as_planner()`, the cell cache `as_batch_control()` / `as_cell_stepper()`,
and each returns None from the other layout's faces.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Optional, Sequence, TypeVar

import icontract

# The faces name the value types they hand over, never a layout: the layouts import this module.
from ._types import CellStep, SeqStepPlan


_Face = TypeVar("_Face", bound=Callable[..., Any])


def is_the_cache(self: object, result: object) -> bool:
    """FACES: the face an `as_*` method returns is the cache itself (one object seen through each face)."""
    return result is self


def returns_self(face: str) -> Callable[[_Face], _Face]:
    """FACES, stated once for every layout: the decorated `as_*` method returns the cache itself, `face`
    naming what it is (e.g. "the cell runner's"). The condition is a named function, not a lambda:
    icontract and CrossHair read a lambda's text from the decorator line it is written on."""
    return icontract.ensure(is_the_cache, f"FACES: {face} face is this cache")


class CacheControl(abc.ABC):
    """What every runner face has: admission, capacity, forgetting everything."""

    @abc.abstractmethod
    def can_extend(self, n: int = 1) -> bool:
        """True when `n` more tokens fit."""

    @abc.abstractmethod
    def capacity(self) -> int:
        """The most tokens the cache may hold."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Forget every token."""


class SequenceControl(CacheControl):
    """The sequence cache's runner face: admission, length, rollback."""

    @abc.abstractmethod
    def length(self) -> int:
        """The committed logical length of the sequence, shared by every layer."""

    @abc.abstractmethod
    def rewind(self, new_len: int) -> bool:
        """Roll the sequence back to `new_len`; False (and no change) when that is unsafe or growth."""


class SequencePlanner(abc.ABC):
    """The backend's face: per-layer row plans for each step."""

    @abc.abstractmethod
    def plan(self, layer: int, position: int, T: int) -> Optional[SeqStepPlan]:
        """The rows layer `layer` writes and reads for T new tokens at `position`; None if they do not fit."""

    @abc.abstractmethod
    def commit(self, plan: SeqStepPlan) -> None:
        """Record that the step `plan` belongs to has been executed (idempotent within the step)."""

    @abc.abstractmethod
    def depth(self, layer: int) -> int:
        """Rows the backend allocates for layer `layer`'s K/V pool."""

    @abc.abstractmethod
    def retained_from(self, layer: int) -> int:
        """The oldest logical position whose row layer `layer` still holds intact."""


class BatchControl(CacheControl):
    """The cell cache's runner face: the sequence verbs, called between forwards."""

    @abc.abstractmethod
    def declare_step(self, seq_ids: Sequence[int]) -> bool:
        """Open a forward whose token i belongs to seq_ids[i]; False (no change) when they do not fit."""

    @abc.abstractmethod
    def seq_new(self) -> Optional[int]:
        """A new live sequence with an empty history (the lowest id not live); None when none is left."""

    @abc.abstractmethod
    def seq_clone(self, src: int, upto: Optional[int] = None) -> Optional[int]:
        """A new live sequence sharing src's cells below position `upto`; None when no id is left."""

    @abc.abstractmethod
    def seq_rm(self, seq_id: int, p0: int, p1: Optional[int] = None) -> bool:
        """Drop seq_id's cells with position in [p0, p1) (p1 None: to the end)."""

    @abc.abstractmethod
    def seq_len(self, seq_id: int) -> int:
        """The number of cells the sequence owns."""

    @abc.abstractmethod
    def next_pos(self, seq_id: int) -> int:
        """One past the sequence's newest position (0 when it owns none)."""

    @abc.abstractmethod
    def free_cells(self) -> int:
        """Cells no sequence owns."""

    @abc.abstractmethod
    def used_end(self) -> int:
        """One past the highest occupied cell (0 when none)."""

    @abc.abstractmethod
    def live(self) -> frozenset[int]:
        """The live sequence ids."""


class CellStepper(abc.ABC):
    """The cell cache's backend face: one placement per forward, one step per layer."""

    @abc.abstractmethod
    def place_step(self, layer: int, positions: Sequence[int]) -> CellStep:
        """The cells and the mask layer `layer` uses for the declared tokens at `positions`."""


class CacheBase(abc.ABC):
    """What a registry holds: a cache seen through the faces it implements (None from the others)."""

    def as_control(self) -> Optional[SequenceControl]:
        """The sequence runner's face of this cache, or None."""
        return None

    def as_planner(self) -> Optional[SequencePlanner]:
        """The sequence backend's face of this cache, or None."""
        return None

    def as_batch_control(self) -> Optional[BatchControl]:
        """The cell runner's face of this cache, or None."""
        return None

    def as_cell_stepper(self) -> Optional[CellStepper]:
        """The cell backend's face of this cache, or None."""
        return None
