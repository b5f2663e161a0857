"""The op face's arrays: numpy by default, torch tensors accepted when torch is installed.

torch is never imported here: a value is a torch tensor only if the torch module the caller imported
(`sys.modules["torch"]`) says so, so `kvcache.op` works, and stays fast to import, without torch. A
result has the kind of the input it answers (torch in, torch out). Every check names the argument and
the rule, and runs before a cache changes anything (OP-ATOMIC).
"""

from __future__ import annotations

import sys
from typing import Any, Literal, Optional

import numpy as np
from numpy.typing import NDArray

from ._errors import ArgumentTypeError, ArgumentValueError, KVCacheError, LayerIndexError

ArrayKind = Literal["numpy", "torch"]

#: The largest position a token may take (OP-POS): 2**31 - 2, so no position is the -1 "free" marker
#: wrapped around and one past the newest still fits a C++ int.
MAX_POSITION = 2**31 - 2


def array_kind(value: Any) -> Optional[ArrayKind]:
    """"numpy" for a numpy array, "torch" for a torch tensor, None for anything else."""
    if isinstance(value, np.ndarray):
        return "numpy"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return "torch"
    return None


def to_numpy(value: Any) -> NDArray[Any]:
    """The values of a numpy array or torch tensor as a numpy array (a tensor is detached and moved to the
    CPU; torch's bfloat16 has no numpy dtype and is read as float32, which holds it exactly)."""
    if isinstance(value, np.ndarray):
        return value
    tensor = value.detach().cpu()
    if str(tensor.dtype) == "torch.bfloat16":
        tensor = tensor.float()
    result: NDArray[Any] = tensor.numpy()
    return result


def to_kind(values: NDArray[Any], kind: ArrayKind) -> Any:
    """`values` as the given kind: a numpy array (as is), or a torch tensor of the same dtype."""
    if kind == "numpy":
        return values
    torch = sys.modules["torch"]  # only reached for an input that was a torch tensor, so torch is imported
    return torch.from_numpy(np.ascontiguousarray(values))


def array_arg(argument: str, value: Any, rule: str) -> tuple[NDArray[Any], ArrayKind]:
    """An argument that must be a numpy array or torch tensor: its values and its kind."""
    kind = array_kind(value)
    if kind is None:
        raise ArgumentTypeError(rule, argument, "must be a numpy array or a torch tensor", type=type(value).__name__)
    return to_numpy(value), kind


def float_arg(argument: str, value: Any, ndim: int, rule: str) -> tuple[NDArray[Any], ArrayKind]:
    """An argument that must be a floating array of `ndim` dimensions."""
    values, kind = array_arg(argument, value, rule)
    if values.dtype.kind != "f":
        raise ArgumentTypeError(rule, argument, "must hold floating-point values", dtype=str(values.dtype))
    if values.ndim != ndim:
        raise ArgumentValueError(rule, argument, f"must have {ndim} dimensions", shape=tuple(values.shape))
    return values, kind


def positions_arg(value: Any, q_len: int) -> list[int]:
    """OP-ARGS, OP-POS: `position` is an integer array [q_len, 1] of positions in [0, MAX_POSITION]."""
    values, _ = array_arg("position", value, "OP-ARGS")
    if values.dtype.kind not in "iu":
        raise ArgumentTypeError("OP-ARGS", "position", "must hold integers", dtype=str(values.dtype))
    if values.shape != (q_len, 1):
        raise ArgumentValueError("OP-ARGS", "position", f"must have shape [q_len, 1] = [{q_len}, 1]",
                                 shape=tuple(values.shape))
    positions = [int(p) for p in values.reshape(-1).tolist()]
    for index, p in enumerate(positions):
        if not 0 <= p <= MAX_POSITION:
            raise ArgumentValueError("OP-POS", f"position[{index}]", f"must lie in [0, {MAX_POSITION}]", value=p)
    return positions


def step_args(k: Any, v: Any, position: Any, batch_size: int, n_kv_heads: int, head_dim: int,
              v_head_dim: int) -> tuple[NDArray[Any], NDArray[Any], list[int], ArrayKind]:
    """OP-ARGS, OP-POS: a step's k [B, Hkv, q_len, D], v [B, Hkv, q_len, Dv] (one kind, floating) and
    position [q_len, 1]; returns their values, the positions as ints and the kind the answer takes."""
    k_values, kind = float_arg("k", k, 4, "OP-ARGS")
    v_values, v_kind = float_arg("v", v, 4, "OP-ARGS")
    if v_kind != kind:
        raise ArgumentTypeError("OP-ARGS", "v", f"must be of k's kind ({kind})", kind=v_kind)
    q_len = k_values.shape[2]
    for name, values, width, width_name in (("k", k_values, head_dim, "head_dim"),
                                            ("v", v_values, v_head_dim, "v_head_dim")):
        expected = (batch_size, n_kv_heads, q_len, width)
        if values.shape != expected or q_len < 1:
            raise ArgumentValueError("OP-ARGS", name, f"must have shape [batch_size, n_kv_heads, q_len >= 1, "
                                                      f"{width_name}] = {list(expected)}",
                                     shape=tuple(values.shape))
    return k_values, v_values, positions_arg(position, q_len), kind


def layer_error(layer_id: Any, n_layers: int) -> Optional[ArgumentValueError | ArgumentTypeError]:
    """OP-ARGS: the error for a layer id that is not an int (bool is not) in [0, n_layers), else None."""
    if type(layer_id) is not int:
        return ArgumentTypeError("OP-ARGS", "layer_id", "must be an int (bool is not an int here)", value=layer_id,
                                 type=type(layer_id).__name__)
    if not 0 <= layer_id < n_layers:
        return LayerIndexError("OP-ARGS", "layer_id", "must lie in [0, n_layers)", value=layer_id, n_layers=n_layers)
    return None


def found(error: Optional[KVCacheError]) -> KVCacheError:
    """The error a failed precondition found (its condition is `..._error(...) is None`, so never None here)."""
    if error is None:
        raise RuntimeError("a precondition failed without naming its error")
    return error

