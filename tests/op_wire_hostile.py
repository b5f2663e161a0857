"""An op-face protocol target that corrupts its update_and_fetch answers on the wire, one way per run.

    python -m tests.op_wire_hostile DEFECT

(and, as a python: target, the correct contiguous stand-in declaring a partial scope).

It serves tests/op_standin.py's correct contiguous cache through the project's Python server, then
rewrites each update_and_fetch result as DEFECT says, so the harness's decoder (spec/conformance/wire.py) meets
what a careless C++ or Rust encoder would send. Used by tests/test_op_wire.py.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from kvcache_spec.conformance.serve import Server, protocol_channel


def _first_k(result: dict[str, Any], value: Any) -> dict[str, Any]:
    if result["k_hist"]["data"]:
        result["k_hist"]["data"][0] = value
    return result


def _swap_newest_rows(result: dict[str, Any]) -> dict[str, Any]:
    """Well-formed on the wire, wrong in what it holds: the two newest rows of K trade places."""
    k = result["k_hist"]
    b, h, rows, d = k["shape"]
    if rows >= 2 and b * h == 1:
        data = k["data"]
        data[(rows - 2) * d:rows * d] = data[(rows - 1) * d:rows * d] + data[(rows - 2) * d:(rows - 1) * d]
    return result


def _mask_as_ints(result: dict[str, Any]) -> dict[str, Any]:
    """A bool mask whose elements are 1 and 0: JSON integers are not booleans."""
    mask = result["attend"]["mask"]
    if mask is not None:
        mask["data"] = [int(x) for x in mask["data"]]
    return result


DEFECTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "inexact": lambda r: _first_k(r, r["k_hist"]["data"][0] + 1e-9 if r["k_hist"]["data"] else 0),
    "bool-number": lambda r: _first_k(r, True),
    "short": lambda r: {**r, "k_hist": {**r["k_hist"], "data": r["k_hist"]["data"][:-1]}},
    "mask-ints": _mask_as_ints,
    "not-an-object": lambda r: [r["k_hist"], r["v_hist"], r["attend"]],
    "float64": lambda r: {**r, "k_hist": {**r["k_hist"], "dtype": "float64"}},
    "swap-rows": _swap_newest_rows,
    "unreadable": lambda r: {"unreadable": "a tuple of two"},
}


def contiguous_without_positions(cfg: dict[str, Any]) -> Any:
    """The correct contiguous stand-in, declaring a scope without `positions` (a python: target)."""
    from tests.op_standin import contiguous

    return contiguous(cfg)


contiguous_without_positions.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
contiguous_without_positions.kvcache_scope = ("flat", "ring", "max_write", "batch", "mla", "steps", "trim", "sinks")   # type: ignore[attr-defined]


def main() -> int:
    defect = DEFECTS[sys.argv[1]]
    server = Server("python:tests.op_standin:contiguous")
    channel = protocol_channel()
    for line in sys.stdin:
        request = json.loads(line)
        response = server.handle(request)
        if request.get("method") == "update_and_fetch" and response is not None and "result" in response:
            response["result"] = defect(response["result"])
        channel.write(json.dumps(response) + "\n")
        channel.flush()
        if request.get("method") == "bye":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
