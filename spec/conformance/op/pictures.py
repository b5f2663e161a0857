"""What a report draws of a failing op-face answer (a finding's `picture`, drawn by spec/conformance/pages/):
the attend grid of the batch row and head it fails on - for each query of the step, each token the spec (or, past
a lenient or over-strict step, what safety owes) and the target let it attend - and, for a cell cache, the
answer's rows as its cells: the token each holds and that token's owners. JSON values only: the report carries it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np


def attend_picture(layer: int, batch: int, head: int, queries: Sequence[tuple[Any, Any]],
                   expected: Sequence[Optional[Sequence[int]]], k_uids: np.ndarray, v_uids: np.ndarray,
                   allowed: np.ndarray, position_of: Callable[[int], Any], owners_of: Callable[[int], list[int]],
                   failing: int, sequences: bool, expected_by: str = "spec") -> dict[str, Any]:
    """The grid of one answer at (layer, batch, head): `queries` are (position, sequence) per query,
    `expected[i]` the tokens query i must attend (None: not judged), the target's tokens read from the rows
    `allowed[i]` lets it attend (k_uids, v_uids: each row's token, -1 where K and V are not one token's).
    `sequences`: a cell cache's picture (queries and tokens labelled by sequence)."""
    target: list[list[int]] = []
    unreadable: list[list[int]] = []
    for i in range(len(queries)):
        rows = [int(row) for row in np.flatnonzero(allowed[i])]
        target.append(sorted(int(k_uids[row]) for row in rows
                             if k_uids[row] >= 0 and row < len(v_uids) and v_uids[row] == k_uids[row]))
        unreadable.append([row for row in rows if not (k_uids[row] >= 0 and row < len(v_uids) and
                                                       v_uids[row] == k_uids[row])])
    spec = [None if tokens is None else sorted(int(u) for u in tokens) for tokens in expected]
    seen = {u for tokens in target for u in tokens} | {u for tokens in spec if tokens for u in tokens}
    tokens = sorted(seen, key=lambda u: (_order(position_of(u)), u))
    return {"layer": layer, "batch": batch, "head": head, "query": failing, "expected_by": expected_by,
            "sequences": sequences,
            "queries": [{"position": _json(pos), "seq": _json(seq)} for pos, seq in queries],
            "tokens": [{"token": u, "position": _json(position_of(u)), "seqs": owners_of(u)} for u in tokens],
            "spec": spec, "target": target, "unreadable": unreadable}


def cells_picture(k_uids: np.ndarray, v_uids: np.ndarray, position_of: Callable[[int], Any],
                  owners_of: Callable[[int], list[int]]) -> dict[str, Any]:
    """An op-cell answer's rows as the cache's cells (its k_hist is its pool): per row, the token it holds
    (None: no one token's K and V) with its position and owners."""
    cells = []
    for row in range(len(k_uids)):
        uid = int(k_uids[row])
        held = uid >= 0 and row < len(v_uids) and int(v_uids[row]) == uid
        cells.append({"cell": row, "token": uid if held else None,
                      "position": _json(position_of(uid)) if held else None,
                      "owners": owners_of(uid) if held else []})
    return {"layout": "op-cell", "cells": cells}


def _order(position: Any) -> int:
    return position if type(position) is int else -(2**62)


def _json(value: Any) -> Any:
    """A value as JSON holds it: ints, strings and None as they are, anything else by its repr."""
    return value if value is None or type(value) in (int, str) else repr(value)
