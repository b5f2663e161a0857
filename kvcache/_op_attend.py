"""`attend`: softmax attention of a step's queries over a fetched history, as an `AttendSpec` says (OP-MASK).

The reference's mechanism, not a fast one: scores, mask, softmax and the weighted sum are computed in
float64 with numpy and cast to `out_dtype` at the end (upstream computes in float32 with torch's SDPA; the
two agree to float32 rounding). GQA: query head h reads K/V head h // (Hq // Hkv), as torch's
`repeat_interleave` lays them out.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Optional

import icontract
import numpy as np
from numpy.typing import NDArray

from ._errors import ArgumentTypeError, ArgumentValueError, KVCacheError
from ._op_arrays import float_arg, found, to_numpy
from ._op_types import FLOAT_DTYPES, AttendSpec, Mask, mask_of, numpy_dtype


def _out_dtype(q_values: NDArray[Any], out_dtype: Any, kind: str) -> np.dtype[Any]:
    """The numpy dtype the output is computed into: q's by default. torch's bfloat16 (for a torch q) has no
    numpy dtype: the output is then made in float32, which holds every bfloat16, and cast by torch."""
    if out_dtype is None:
        return q_values.dtype
    if kind == "torch" and str(out_dtype) == "torch.bfloat16":
        return np.dtype(np.float32)
    try:
        return numpy_dtype(out_dtype)
    except KVCacheError:
        raise ArgumentValueError("OP-ARGS", "out_dtype", f"must be None or one of {', '.join(FLOAT_DTYPES)} "
                                                         "(or torch.bfloat16 for torch tensors)",
                                 value=out_dtype) from None


def _attend_args(q: Any, k: Any, v: Any, spec: Any, scale: Any,
                 out_dtype: Any) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any], Mask, float, np.dtype[Any], str]:
    """OP-ARGS, OP-MASK: the checked arguments of `attend` (raises the typed error of the first bad one)."""
    q_values, kind = float_arg("q", q, 4, "OP-ARGS")
    k_values, k_kind = float_arg("k", k, 4, "OP-ARGS")
    v_values, v_kind = float_arg("v", v, 4, "OP-ARGS")
    if {k_kind, v_kind} != {kind}:
        raise ArgumentTypeError("OP-ARGS", "k", "q, k and v must be of one kind (numpy or torch)", q=kind,
                                k=k_kind, v=v_kind)
    b, hq, q_len, d = q_values.shape
    _, hkv, rows, _ = k_values.shape
    if k_values.shape != (b, hkv, rows, d) or hkv < 1 or rows < 1 or hq % hkv:
        raise ArgumentValueError("OP-ARGS", "k", "must be [B, Hkv, rows >= 1, D] with q's B and D and Hq a "
                                                 "multiple of Hkv", q=tuple(q_values.shape), k=tuple(k_values.shape))
    if v_values.shape[:3] != (b, hkv, rows) or v_values.shape[3] < 1:
        raise ArgumentValueError("OP-ARGS", "v", "must be [B, Hkv, rows, Dv] with k's B, Hkv and rows",
                                 k=tuple(k_values.shape), v=tuple(v_values.shape))
    if q_len < 1:
        raise ArgumentValueError("OP-ARGS", "q", "must hold at least one query", shape=tuple(q_values.shape))
    if not isinstance(spec, AttendSpec):
        raise ArgumentTypeError("OP-MASK", "spec", "must be an AttendSpec", type=type(spec).__name__)
    mask = mask_of(spec, q_len, rows, b)
    empty = np.flatnonzero(~mask.any(axis=-1).all(axis=0) if mask.ndim == 3 else ~mask.any(axis=1))
    if empty.size:
        raise ArgumentValueError("OP-MASK", "spec", "a query attends no row (its softmax is undefined)",
                                 query=int(empty[0]))
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError("OP-ARGS", "scale", "must be None or a real number (bool is not)", value=scale,
                                type=type(scale).__name__)
    elif not math.isfinite(scale):
        raise ArgumentValueError("OP-ARGS", "scale", "must be finite", value=scale)
    return q_values, k_values, v_values, mask, float(scale), _out_dtype(q_values, out_dtype, kind), kind


def _attend_error(q: Any, k: Any, v: Any, spec: Any, scale: Any, out_dtype: Any) -> Optional[KVCacheError]:
    try:
        _attend_args(q, k, v, spec, scale, out_dtype)
    except KVCacheError as error:
        return error
    return None


def _shape_holds(q: Any, v: Any, result: Any) -> bool:
    q_shape, v_shape = to_numpy(q).shape, to_numpy(v).shape
    return bool(to_numpy(result).shape == q_shape[:3] + v_shape[3:])


@icontract.require(lambda q, k, v, spec, scale, out_dtype: _attend_error(q, k, v, spec, scale, out_dtype) is None,
                   "OP-ARGS, OP-MASK: q [B, Hq, q_len, D], k [B, Hkv, rows, D], v [B, Hkv, rows, Dv], Hq a "
                   "multiple of Hkv, a spec meaning a [q_len, rows] mask with a row for every query",
                   error=lambda q, k, v, spec, scale, out_dtype: found(_attend_error(q, k, v, spec, scale, out_dtype)),
                   enabled=True)
@icontract.ensure(lambda q, v, result: _shape_holds(q, v, result),
                  "OP-ARGS: the output is [B, Hq, q_len, Dv]")
def attend(q: Any, k: Any, v: Any, spec: AttendSpec, scale: Optional[float] = None, out_dtype: Any = None) -> Any:
    """Softmax attention of q over a fetched history (k, v) with the mask `spec` means (OP-MASK). The
    parameters are named as upstream's `attend`'s; scale and out_dtype, which upstream requires, default here.

    q [B, Hq, q_len, D]; k [B, Hkv, rows, D]; v [B, Hkv, rows, Dv]; scale defaults to 1/sqrt(D), out_dtype to
    q's dtype. Returns [B, Hq, q_len, Dv], of q's kind (numpy array or torch tensor).

    :raises ArgumentValueError: CAUSAL with q_len != rows (torch's is_causal is upper-left aligned: a
        continuation needs an EXPLICIT mask), a mask of another shape, or a query that attends no row
    """
    q_values, k_values, v_values, mask, scale_value, dtype, kind = _attend_args(q, k, v, spec, scale, out_dtype)
    group = q_values.shape[1] // k_values.shape[1]
    keys = np.repeat(k_values.astype(np.float64), group, axis=1)
    values = np.repeat(v_values.astype(np.float64), group, axis=1)
    scores = np.einsum("bhqd,bhkd->bhqk", q_values.astype(np.float64), keys) * scale_value
    scores = np.where(mask[:, None] if mask.ndim == 3 else mask[None, None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    out = np.einsum("bhqk,bhkd->bhqd", weights, values)
    if kind == "numpy":
        return out.astype(dtype)
    torch = sys.modules["torch"]  # q is a torch tensor, so torch is imported
    target = q.dtype if out_dtype is None else out_dtype if type(out_dtype).__module__ == "torch" \
        else getattr(torch, dtype.name)
    return torch.from_numpy(out).to(dtype=target)
