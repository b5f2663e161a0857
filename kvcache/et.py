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

from ._errors import ArgumentTypeError, ArgumentValueError, KVCacheError
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
        if type(self._error) is not Error:  # a plain 0 would compare equal to Error.Ok
            raise ArgumentTypeError("ET-MAP", "_error", "must be an Error member", value=self._error,
                                    type=type(self._error).__name__)
        if (self._error is Error.Ok) == (self._value is None):
            raise ArgumentValueError("ET-MAP", "_value", "a Result holds a value with Error.Ok, or no value with "
                                     "another error", value=self._value, error=self._error)

    def ok(self) -> bool:
        return self._error is Error.Ok

    def error(self) -> Error:
        return self._error

    def get(self) -> T_co:
        """The value; raises ArgumentValueError (a ValueError) on an error result."""
        if self._value is None:
            raise ArgumentValueError("ET-MAP", "result", f"holds {self._error.name}, not a value", error=self._error)
        return self._value


def _planner_error(planner: object) -> ArgumentTypeError:
    return ArgumentTypeError("ARG-TYPE", "planner", "must be a SequencePlanner", value=planner,
                             type=type(planner).__name__)


def _control_error(control: object) -> ArgumentTypeError:
    return ArgumentTypeError("ARG-TYPE", "control", "must be a SequenceControl", value=control,
                             type=type(control).__name__)


@icontract.require(lambda planner: isinstance(planner, SequencePlanner), "ARG-TYPE: planner is a SequencePlanner",
                   error=_planner_error, enabled=True)
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


@icontract.require(lambda control: isinstance(control, SequenceControl), "ARG-TYPE: control is a SequenceControl",
                   error=_control_error, enabled=True)
@icontract.ensure(lambda result: result in (Error.Ok, Error.InvalidArgument),
                  "ET-MAP: Ok, or InvalidArgument for a refusal or a caller error")
def rewind(control: SequenceControl, new_len: int) -> Error:
    """`control.rewind` as an Error: a refused rewind, or a caller error, is InvalidArgument."""
    try:
        return Error.Ok if control.rewind(new_len) else Error.InvalidArgument
    except KVCacheError:
        return Error.InvalidArgument
