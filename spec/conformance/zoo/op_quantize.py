"""Broken op-face caches for a quantize mid-generation (OP-QUANTIZE): each is the reference
(`kvcache.op.ContiguousReferenceCache`) changed in one thing, the way a real conversion goes wrong, and each must be
found with a short program (tests/test_op_quantize.py). Use one as a target:
`--target python:kvcache_spec.conformance.zoo.op_quantize:bits_truthy`.

- `bits_truthy`: a bits check by isinstance(bits, (int, float)) that serves True (as its least bits, 2) and 4.0 as
  4: lenient.
- `drops_a_row`: a conversion that copies all but the oldest row of every layer into the quantized layer (a
  slice one off, as `keys[..., 1:offset, :]` does): the length one short, wrong.
- `coarse_steps`: a quantizer with a scale over 2^bits steps instead of 2^bits - 1, the top code clipped: the
  largest element of each row reads back a whole step low, past the bound: wrong.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvcache import op

from .op_state import _factory   # a stand-in class as a python: factory of the whole spec's scope


class _BitsTruthy(op.ContiguousReferenceCache):
    """Takes any bits a number stands for: True as 1 (then quantized to 2 bits, its least), 4.0 as 4."""

    def quantize(self, bits: Any) -> None:
        if isinstance(bits, (int, float)) and not isinstance(bits, bool) and bits == int(bits):
            bits = int(bits)
        elif isinstance(bits, bool):
            bits = 2
        super().quantize(bits)


class _DropsARow(op.ContiguousReferenceCache):
    """The conversion leaves the oldest token behind: every layer holds one token fewer after it."""

    def quantize(self, bits: int) -> None:
        super().quantize(bits)
        if self._step is None and self._layout.length() and not any(self._pads):
            self._layout.rewind(self._layout.length() - 1)   # the length one short; the rows of the rest stay put


class _CoarseSteps(op.ContiguousReferenceCache):
    """Quantizes with scale (max - min) / 2^bits: the top code 2^bits is clipped to 2^bits - 1."""

    def quantize(self, bits: int) -> None:
        written = [(k.copy(), v.copy()) for k, v in zip(self._pools.k, self._pools.v)]
        super().quantize(bits)
        self._pools.k = [_coarse(k, bits) for k, _ in written]
        self._pools.v = [_coarse(v, bits) for _, v in written]

    def _held_as(self, values: Any, bits: int) -> Any:
        return _coarse(np.asarray(values).astype(np.float32), bits)


def _coarse(values: np.ndarray, bits: int) -> np.ndarray:
    x = values.astype(np.float64)
    if not x.shape[-1]:
        return np.asarray(values)
    low, high = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    scale = (high - low) / (1 << bits)
    codes = np.clip(np.rint((x - low) / np.where(scale > 0, scale, 1.0)), 0, (1 << bits) - 1)
    out: np.ndarray = (low + codes * scale).astype(values.dtype)
    return out


bits_truthy = _factory(_BitsTruthy, "quantize(True) and quantize(4.0) served: lenient.")
drops_a_row = _factory(_DropsARow, "A conversion that leaves the oldest token behind: wrong.")
coarse_steps = _factory(_CoarseSteps, "A quantizer rounding over 2^bits steps, the top one clipped: wrong.")

# (class, rule) each stand-in is found as; tests/test_op_quantize.py holds each to it, within 4 steps
FOUND_AS: dict[str, tuple[str, str]] = {
    "bits_truthy": ("lenient", "OP-QUANTIZE"),
    "drops_a_row": ("wrong", "OP-QUANTIZE"),
    "coarse_steps": ("wrong", "OP-QUANTIZE"),
}
