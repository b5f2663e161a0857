"""The op face on the conformance protocol: tensors and `update_and_fetch` answers as JSON values.

spec/PROTOCOL.md ("Op-face targets") is the normative text; this module is its one implementation,
used by both ends the project ships: the harness's `cmd:` target (targets.SubprocessTarget) encodes the
arguments and decodes the answers, the Python server (serve.py) the other way round.

A tensor is `{"dtype": "float32", "shape": [d0, d1, ...], "data": [...]}` with its elements flat in
row-major (C) order; `dtype` is one of DTYPES. Decoding is strict, because a lax decoder could hide a defect:
a float32 element must be a JSON number that float32 holds exactly (the harness's labels are integers
below 2^24, so an honest target echoes them exactly; a value that would round onto a label is a
corrupted row, not that label), an int64 element a JSON integer, a bool element `true` / `false`, and
no JSON boolean passes for a number (bool is not an int here). A value that breaks this is a protocol
error (`WireError`), reported as a crash: it is not a tensor at all. A well-formed tensor of the wrong
dtype or shape is a tensor, and the op engine judges it (OP-HIST, OP-MASK), as it judges an answer
`{"unreadable": why}`: what the Python server sends for a Python target's answer that has no wire form.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

# The harness sends float32 K/V and int64 positions; the other dtypes let an answer in a wrong dtype
# reach the op engine as what it is (OP-HIST judges it) instead of failing on the wire.
DTYPES: dict[str, Any] = {"float32": np.float32, "int64": np.int64, "bool": np.bool_, "float16": np.float16,
                          "float64": np.float64, "int32": np.int32}
# The op face's parameters that are tensors (targets.FACE_METHODS names them all).
TENSOR_PARAMS = ("k", "v", "position")
# Far more than any suite configuration needs (the largest answer is a few thousand elements), and a
# bound on what a hostile shape can make the harness allocate.
MAX_ELEMENTS = 1 << 20


class WireError(ValueError):
    """A JSON value that is not what spec/PROTOCOL.md says an op-face value is."""


@dataclass(frozen=True)
class AttendSpec:
    """An AttendSpec read off the wire: `kind` is "NONE", "CAUSAL" or "EXPLICIT"; `mask` with EXPLICIT."""

    kind: str
    mask: Optional[np.ndarray] = None


@dataclass(frozen=True)
class Unreadable:
    """An update_and_fetch answer its server could not put on the wire (`why`): the op engine fails it."""

    why: str


def to_wire(array: Any) -> dict[str, Any]:
    """A numpy array (or torch tensor) as a wire tensor; its dtype must be one of DTYPES."""
    if hasattr(array, "detach") and hasattr(array, "cpu"):   # torch, never imported here
        array = array.detach().cpu().numpy()
    value = np.asarray(array)
    for name, dtype in DTYPES.items():
        if value.dtype == dtype:
            return {"dtype": name, "shape": list(value.shape), "data": value.reshape(-1).tolist()}
    raise WireError(f"a {value.dtype} array has no wire form (dtypes: {', '.join(DTYPES)})")


def from_wire(value: Any, what: str) -> np.ndarray:
    """The numpy array a wire tensor stands for, or WireError naming `what` and the broken rule."""
    if not isinstance(value, dict):
        raise WireError(f"{what} is {_json_type(value)}, not a tensor object {{dtype, shape, data}}")
    dtype, shape, data = value.get("dtype"), value.get("shape"), value.get("data")
    if dtype not in DTYPES:
        raise WireError(f"{what}: dtype {_shown(dtype)} is not one of {list(DTYPES)}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise WireError(f"{what}: shape {_shown(shape)} is not a list of non-negative integers")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise WireError(f"{what}: shape {shape} holds {count} elements, more than {MAX_ELEMENTS}")
    if not isinstance(data, list) or len(data) != count:
        size = f"{len(data)} elements" if isinstance(data, list) else _json_type(data)
        raise WireError(f"{what}: data is {size}; shape {shape} needs a flat list of {count}")
    numpy_dtype = np.dtype(DTYPES[dtype])
    if numpy_dtype == np.bool_:
        bad = next((x for x in data if type(x) is not bool), None)
        if bad is not None:
            raise WireError(f"{what}: bool data holds {_shown(bad)}, not true or false")
        return np.array(data, dtype=np.bool_).reshape(shape)
    if numpy_dtype.kind == "i":
        low, high = int(np.iinfo(numpy_dtype).min), int(np.iinfo(numpy_dtype).max)
        bad = next((x for x in data if type(x) is not int or not low <= x <= high), None)
        if bad is not None:
            raise WireError(f"{what}: {dtype} data holds {_shown(bad)}, not an integer in {dtype}'s range")
        return np.array(data, dtype=numpy_dtype).reshape(shape)
    bad = next((x for x in data if type(x) not in (int, float)), None)
    if bad is not None:
        raise WireError(f"{what}: {dtype} data holds {_shown(bad)} ({_json_type(bad)}), not a number")
    try:
        wide = np.array(data, dtype=np.float64)
    except OverflowError:
        raise WireError(f"{what}: {dtype} data holds an integer too large for {dtype}") from None
    if not np.all(np.isfinite(wide)):
        raise WireError(f"{what}: {dtype} data holds {_shown(data[int(np.flatnonzero(~np.isfinite(wide))[0])])}: "
                        "JSON has no NaN or Infinity")
    with np.errstate(over="ignore"):
        narrow = wide.astype(numpy_dtype)
    inexact = np.flatnonzero(narrow.astype(np.float64) != wide)
    if inexact.size:
        raise WireError(f"{what}: {dtype} data holds {_shown(data[int(inexact[0])])} at element {int(inexact[0])}, "
                        f"which {dtype} does not hold exactly")
    return narrow.reshape(shape)


def args_to_wire(args: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments for the wire: each array as a wire tensor, a state's bytes as base64 (OP-STATE), every
    other value as it is."""
    return {name: to_wire(value) if isinstance(value, np.ndarray) else
            state_to_wire(value) if isinstance(value, (bytes, bytearray)) else value for name, value in args.items()}


def state_to_wire(data: bytes | bytearray) -> str:
    """A state's bytes (OP-STATE: state()'s answer, load_state's data) as a JSON string: standard base64."""
    return base64.b64encode(bytes(data)).decode("ascii")


def state_from_wire(value: Any, what: str) -> bytes:
    """The bytes a wire state stands for, or WireError: a string of standard base64 (padded, no other
    characters), nothing else."""
    if not isinstance(value, str):
        raise WireError(f"{what} is {_json_type(value)}, not a base64 string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise WireError(f"{what}: {_shown(value)} is not standard base64") from None


def answer_to_wire(answer: Any) -> dict[str, Any]:
    """An update_and_fetch answer (k_hist, v_hist, spec) as {"k_hist", "v_hist", "attend"}."""
    k_hist, v_hist, spec = answer
    kind = getattr(spec, "kind", None)
    name = getattr(kind, "name", None)
    kind_name = str(name if isinstance(name, str) else kind).upper()
    mask = getattr(spec, "mask", None)
    return {"k_hist": to_wire(k_hist), "v_hist": to_wire(v_hist),
            "attend": {"kind": kind_name, "mask": None if mask is None else to_wire(mask)}}


def answer_from_wire(value: Any) -> tuple[np.ndarray, np.ndarray, AttendSpec] | Unreadable:
    """(k_hist, v_hist, AttendSpec) from an update_and_fetch result, Unreadable, or WireError."""
    if isinstance(value, dict) and set(value) == {"unreadable"} and isinstance(value["unreadable"], str):
        return Unreadable(value["unreadable"])
    if not isinstance(value, dict):
        raise WireError(f"update_and_fetch answered {_json_type(value)}, not {{k_hist, v_hist, attend}}")
    attend = value.get("attend")
    if not isinstance(attend, dict) or not isinstance(attend.get("kind"), str):
        raise WireError(f"update_and_fetch: attend {_shown(attend)} is not {{kind, mask}} with a string kind")
    mask = attend.get("mask")
    return (from_wire(value.get("k_hist"), "k_hist"), from_wire(value.get("v_hist"), "v_hist"),
            AttendSpec(attend["kind"], None if mask is None else from_wire(mask, "attend.mask")))


def _shown(value: Any) -> str:
    """A value as the target wrote it: JSON (true, not True), bounded."""
    try:
        return json.dumps(value)[:80]
    except (TypeError, ValueError):
        return repr(value)[:80]


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)
