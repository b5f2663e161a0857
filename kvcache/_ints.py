"""Small pure predicates shared by validation and contracts."""

from __future__ import annotations

from typing import Any, TypeGuard

#: Every integer the API takes must fit a C++ `int`, as upstream's fields and arguments do; a larger
#: one is an error, never a silent wrap-around in some other implementation.
INT_MAX = 2**31 - 1


def is_int(value: Any) -> TypeGuard[int]:
    """True for exactly a Python int (ARG-INT): bool is not an int here (True would silently mean 1), nor is
    any other subclass of int, whose comparisons, hash and arithmetic may lie between a check and its use."""
    return type(value) is int


def in_range(value: int, low: int, high: int = INT_MAX) -> bool:
    """low <= value <= high."""
    return low <= value <= high
