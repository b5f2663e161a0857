"""Small pure predicates shared by validation and contracts."""

from __future__ import annotations

from typing import Any, TypeGuard

#: Every integer the API takes must fit a C++ `int`, as upstream's fields and arguments do; a larger
#: one is an error, never a silent wrap-around in some other implementation.
INT_MAX = 2**31 - 1


def is_int(value: Any) -> TypeGuard[int]:
    """True for a Python int; bool is not an int here (True would silently mean 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def in_range(value: int, low: int, high: int = INT_MAX) -> bool:
    """low <= value <= high."""
    return low <= value <= high
