"""python: targets for tests/test_cpp_cell_upstream_shape.py: cell caches that serve one max_seqs only,
as upstream's (64 ids, fixed) - the Python side of the scope feature `max_seqs=64`.

`fixed_64` declares its scope and refuses any other max_seqs at creation (SCOPE-BORDER): CONFORMING
within the scope. `careless_64` declares the same scope but builds 64 ids whatever it is asked: a
Python factory is its own border (no driver stands in front of it), so it must be caught.
"""

from __future__ import annotations

from typing import Any

from kvcache import CellCache

MAX_SEQS = 64


def fixed_64(config: Any, max_seqs: int = MAX_SEQS) -> CellCache:
    if type(max_seqs) is not int or max_seqs != MAX_SEQS:
        raise ValueError(f"SCOPE-BORDER: this cache has {MAX_SEQS} ids, not {max_seqs!r}")
    return CellCache(config)


def careless_64(config: Any, max_seqs: int = MAX_SEQS) -> CellCache:
    return CellCache(config)   # max_seqs ignored: a config asking for 3 ids gets 64


for _factory in (fixed_64, careless_64):
    setattr(_factory, "kvcache_layout", "cell")
    setattr(_factory, "kvcache_scope", ("all", f"max_seqs={MAX_SEQS}"))
