"""The faces of a cache: one object, seen by the runner and by the backend.

Upstream recovers each face from `CacheBase` without RTTI; here `as_control()` and `as_planner()`
return the same object typed as the face.
"""

from __future__ import annotations

import abc
from typing import Optional

from ._types import SeqStepPlan


class SequenceControl(abc.ABC):
    """The runner's face: admission, length, rollback."""

    @abc.abstractmethod
    def can_extend(self, n: int = 1) -> bool:
        """True when `n` more tokens fit: length + n <= capacity."""

    @abc.abstractmethod
    def capacity(self) -> int:
        """The most tokens the sequence may hold."""

    @abc.abstractmethod
    def length(self) -> int:
        """The committed logical length of the sequence, shared by every layer."""

    @abc.abstractmethod
    def rewind(self, new_len: int) -> bool:
        """Roll the sequence back to `new_len`; False (and no change) when that is unsafe or growth."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Forget every token."""


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


class CacheBase(abc.ABC):
    """What a registry holds: a cache that can be seen through either face."""

    @abc.abstractmethod
    def as_control(self) -> SequenceControl:
        """The runner's face of this cache."""

    @abc.abstractmethod
    def as_planner(self) -> SequencePlanner:
        """The backend's face of this cache."""
