"""ExecuTorch-style adapter: `Error` codes and `Result`, as in upstream's `cache_et.h`.

ET-MAP: a refused plan is `OutOfResources` and a caller error is `InvalidArgument`. Upstream maps a
bad layer to `OutOfResources` too; this project maps every caller error to `InvalidArgument`, on
purpose: "out of resources" tells a runner to evict or stop, a bad layer is a bug to fix.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Generic, Optional, TypeVar

import icontract

from ._errors import KVCacheError
from ._faces import SequenceControl, SequencePlanner
from ._types import SeqStepPlan

T_co = TypeVar("T_co", covariant=True)


class Error(enum.IntEnum):
    """ExecuTorch's error codes (runtime/core/error.h)."""

    Ok = 0x00
    Internal = 0x01
    InvalidState = 0x02
    NotSupported = 0x10
    NotImplemented = 0x11
    InvalidArgument = 0x12
    InvalidType = 0x13
    NotFound = 0x20
    MemoryAllocationFailed = 0x21
    OutOfResources = 0x25


@dataclass(frozen=True)
class Result(Generic[T_co]):
    """A value or an error, never both."""

    _value: Optional[T_co] = None
    _error: Error = Error.Ok

    def __post_init__(self) -> None:
        if (self._error is Error.Ok) == (self._value is None):
            raise ValueError("Result holds a value with Error.Ok, or no value with another error")

    def ok(self) -> bool:
        return self._error is Error.Ok

    def error(self) -> Error:
        return self._error

    def get(self) -> T_co:
        """The value; raises ValueError on an error result."""
        if self._value is None:
            raise ValueError(f"Result holds {self._error.name}, not a value")
        return self._value


@icontract.ensure(lambda result: result.error() in (Error.Ok, Error.OutOfResources, Error.InvalidArgument),
                  "ET-MAP: a plan, OutOfResources (refused) or InvalidArgument (caller error)")
def plan(planner: SequencePlanner, layer: int, position: int, T: int) -> Result[SeqStepPlan]:
    """`planner.plan` as a Result: a refusal is OutOfResources, a caller error InvalidArgument."""
    try:
        step = planner.plan(layer, position, T)
    except KVCacheError:
        return Result(_error=Error.InvalidArgument)
    if step is None:
        return Result(_error=Error.OutOfResources)
    return Result(step)


@icontract.ensure(lambda result: result in (Error.Ok, Error.InvalidArgument),
                  "ET-MAP: Ok, or InvalidArgument for a refusal or a caller error")
def rewind(control: SequenceControl, new_len: int) -> Error:
    """`control.rewind` as an Error: a refused rewind, or a caller error, is InvalidArgument."""
    try:
        return Error.Ok if control.rewind(new_len) else Error.InvalidArgument
    except KVCacheError:
        return Error.InvalidArgument
