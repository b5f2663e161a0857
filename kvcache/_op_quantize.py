"""Quantizing the contiguous op cache mid-generation (OP-QUANTIZE): `quantize(bits)`.

mlx-lm turns a `KVCache` into a `QuantizedKVCache` mid-generation (`to_quantized(group_size, bits)`, as
`--quantized-kv-start` does) and keeps writing to it quantized. Here each row (one token's K or V on one layer,
batch row and head) is quantized affinely: its codes are round((x - low) / scale), ints in [0, 2^bits - 1], with
low = the row's minimum and scale = (max - min) / (2^bits - 1) (0 for a constant row, then every code is 0). A
code reads back as low + code * scale, so every element is within scale / 2 of what was written - the bound
OP-QUANTIZE states - plus the rounding of the cache's dtype. mlx-lm quantizes groups of group_size elements of a
row; a group's range is at most its row's, so the row's bound holds for any group size, and the op face takes
none. The pools keep the codes' read-back values (what every read answers): the codes themselves are an
encoding this reference need not keep a second time.
"""

from __future__ import annotations

from typing import Any, Optional

import icontract
import numpy as np
from numpy.typing import NDArray

from ._errors import ArgumentTypeError, ArgumentValueError, KVCacheError, StepError
from ._ints import is_int

QUANTIZE_BITS = range(2, 9)   # the bits quantize(bits) takes (mlx-lm's QuantizedKVCache: 2 to 8)


def bits_error(bits: Any, quantized_to: Optional[int]) -> Optional[KVCacheError]:
    """OP-QUANTIZE: the error of quantize(bits) on a cache quantized to `quantized_to` bits (None: not yet)."""
    if not is_int(bits):
        return ArgumentTypeError("OP-QUANTIZE", "bits", "must be an int (bool is not an int here)", value=bits,
                                 type=type(bits).__name__)
    if bits not in QUANTIZE_BITS:
        return ArgumentValueError("OP-QUANTIZE", "bits", f"must lie in [{QUANTIZE_BITS[0]}, {QUANTIZE_BITS[-1]}]",
                                  value=bits)
    if quantized_to is not None:
        return StepError("OP-QUANTIZE", "bits", "the cache is quantized already", bits=quantized_to)
    return None


def codes_of(values: NDArray[Any], bits: int) -> tuple[NDArray[np.uint8], NDArray[np.float64], NDArray[np.float64]]:
    """Each row of `values` (its last axis) as (codes, low, scale): codes uint8 in [0, 2^bits - 1]."""
    x = values.astype(np.float64)
    low = x.min(axis=-1, keepdims=True) if x.shape[-1] else np.zeros(x.shape[:-1] + (1,))
    high = x.max(axis=-1, keepdims=True) if x.shape[-1] else low
    scale = (high - low) / ((1 << bits) - 1)
    safe = np.where(scale > 0, scale, 1.0)
    codes = np.clip(np.rint((x - low) / safe), 0, (1 << bits) - 1).astype(np.uint8)
    return codes, low, scale


def within_bound(written: NDArray[Any], held: NDArray[Any], bits: int) -> bool:
    """OP-QUANTIZE: every element of `held` within (max - min) / (2 (2^bits - 1)) of `written`, row by row, plus
    the rounding of held's dtype (its spacing at the element)."""
    x, y = written.astype(np.float64), held.astype(np.float64)
    if not x.size:
        return x.shape == y.shape
    span = x.max(axis=-1, keepdims=True) - x.min(axis=-1, keepdims=True)
    rounding = np.spacing(np.abs(x).astype(held.dtype)).astype(np.float64) if np.issubdtype(held.dtype, np.floating) \
        else np.zeros_like(x)
    return x.shape == y.shape and bool(np.all(np.abs(y - x) <= span / (2 * ((1 << bits) - 1)) + rounding))


@icontract.ensure(lambda values, bits, result: result.dtype == values.dtype and within_bound(values, result, bits),
                  "OP-QUANTIZE: every element reads back within half a step of its row's range")
def quantized(values: NDArray[Any], bits: int) -> NDArray[Any]:
    """`values` as a layer quantized to `bits` reads them back: each row's codes, read as low + code * scale."""
    codes, low, scale = codes_of(values, bits)
    return (low + codes.astype(np.float64) * scale).astype(values.dtype)
