"""Which call breaks which documented precondition (the scope relaxation `requires=`, scope.PRECONDITIONS;
SPEC.md 6.1): a target declaring one is never sent a call that breaks it, on every face with the cell verbs
(the op face's cell cache, op/engine.py; a cell cache seen through its outputs, cell/recompute.py).

A precondition is the library's word on its caller (llama.cpp asserts every id in range, and a whole-sequence
copy between two streams): a call breaking it is a caller error the library need not refuse. Keeping the
call back judges the library on what its callers may do; the spec's refusals of those calls are not owed.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from .. import op_model as om

# The arguments of each cell verb that name a sequence (a decode's and a declaration's: every id of a list)
ID_ARGS: dict[str, tuple[str, ...]] = {"seq_cp": ("src", "dst"), "seq_rm": ("seq",), "seq_keep": ("seq",),
                                       "seq_add": ("seq",), "next_pos": ("seq",), "decode": ("seq_ids",),
                                       "begin_step": ("seq_ids",)}


def _is_int(value: Any) -> bool:
    return type(value) is int   # bool is not an int


def _ids(method: str, args: Mapping[str, Any]) -> list[Any]:
    out: list[Any] = []
    for name in ID_ARGS.get(method, ()):
        value = args.get(name)
        out += list(value) if name == "seq_ids" and isinstance(value, (list, tuple)) else [value]
    return out


def _ordered(p0: Any, p1: Any) -> bool:
    return _is_int(p0) and p0 >= 0 and (p1 is None or _is_int(p1) and p1 >= p0)


def breaks(name: str, method: str, args: Mapping[str, Any], held: Mapping[int, Mapping[int, int]]) -> bool:
    """Whether the call `method(**args)` breaks the precondition `name`, on a cache holding `held` (the spec's
    table: seq -> {token uid: position})."""
    if name == "ids-in-range":
        return any(not (_is_int(seq) and 0 <= seq < om.MAX_SEQS) for seq in _ids(method, args))
    if method != "seq_cp" and name in ("empty-destination", "whole-copies"):
        return False
    if name == "empty-destination":
        src: Any = args.get("src")
        dst: Any = args.get("dst")
        return _is_int(dst) and (src == dst or bool(held.get(dst, {})))
    if name == "whole-copies":
        return args.get("upto") is not None
    if name == "ordered-ranges":
        if method in ("seq_rm", "seq_add"):
            return not _ordered(args.get("p0"), args.get("p1"))
        if method == "seq_cp":
            upto = args.get("upto")
            return not (upto is None or _is_int(upto) and upto >= 0)
        return False
    raise ValueError(f"no precondition {name!r}")


def broken(required: frozenset[str], method: str, args: Mapping[str, Any],
           held: Mapping[int, Mapping[int, int]]) -> Optional[str]:
    """The first of the declared preconditions the call breaks, in name order (None: it breaks none)."""
    return next((name for name in sorted(required) if breaks(name, method, args, held)), None)


def not_sent_note(name: str) -> str:
    """The report's line for the calls a declared precondition kept back."""
    return f"scope: calls breaking the declared precondition {name!r} not sent (requires=, SPEC.md 6.1)"
