"""The cell layout: many sequences over one pool of per-token cells (upstream PR #21902's `CellCache`).

`CellStep` is the integer-only handoff of one forward to the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._errors import ArgumentTypeError, ArgumentValueError, StepError
from ._ints import INT_MAX, in_range, is_int


def _shape_error(field: str, what: str, value: Any) -> StepError:
    return StepError("CELL-STEP-SHAPE", f"CellStep.{field}", what, value=value)


@dataclass(frozen=True)
class CellStep:
    """The cells and the mask of one forward, for every layer of one window.

    `cells[i]` is the cell query token i writes; the layer reads cells [0, read_len); `mask_bits` holds
    `length * read_len` bytes, row-major: byte `i * read_len + j` is 1 iff token i attends cell j.
    Validated on creation (CELL-STEP-SHAPE), so a forged step cannot be built.
    """

    length: int
    read_len: int
    cells: tuple[int, ...]
    mask_bits: bytes

    def __post_init__(self) -> None:
        for name, low in (("length", 1), ("read_len", 1)):
            value = getattr(self, name)
            if not is_int(value) or not in_range(value, low):
                raise _shape_error(name, f"must be an int in [{low}, {INT_MAX}]", value)
        if not isinstance(self.cells, tuple) or len(self.cells) != self.length:
            raise _shape_error("cells", "must be a tuple of one cell per token", self.cells)
        if not all(is_int(c) and 0 <= c < self.read_len for c in self.cells) or len(set(self.cells)) != self.length:
            raise _shape_error("cells", "must be distinct ints in [0, read_len)", self.cells)
        if not isinstance(self.mask_bits, bytes) or len(self.mask_bits) != self.length * self.read_len:
            raise _shape_error("mask_bits", "must be bytes of length * read_len", type(self.mask_bits).__name__)
        if self.mask_bits.translate(None, b"\x00\x01"):  # what is left is neither 0 nor 1
            raise _shape_error("mask_bits", "every byte must be 0 or 1", self.mask_bits)

    def attends(self, i: int, j: int) -> bool:
        """True iff query token i attends cell j.

        :raises ArgumentTypeError: i or j is not an int (ARG-INT)
        :raises ArgumentValueError: i not in [0, length) or j not in [0, read_len) (ARG-RANGE)
        """
        for name, value, end in (("i", i, self.length), ("j", j, self.read_len)):
            if not is_int(value):
                raise ArgumentTypeError("ARG-INT", name, "must be an int (bool is not an int here)",
                                        value=value, type=type(value).__name__)
            if not 0 <= value < end:
                raise ArgumentValueError("ARG-RANGE", name, f"must lie in [0, {end})", value=value)
        return self.mask_bits[i * self.read_len + j] == 1

    def row(self, i: int) -> bytes:
        """Token i's mask row: read_len bytes, 1 = attend."""
        self.attends(i, 0)  # validates i
        return self.mask_bits[i * self.read_len:(i + 1) * self.read_len]
