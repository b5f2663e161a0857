"""Draw derandomized examples in a fresh process and print what was drawn, for tests/test_stateful.py.

`python constant_pool_probe.py KIND PIN MODULE...` first imports each MODULE (whatever else a user's
process happens to have loaded), then:
- KIND "verify": runs `kvcache verify`'s pre-merge state-machine stage and prints its numbers;
- KIND "given": draws 300 derandomized integers in [0, 10**6] and prints a digest of them,
with the constant pool pinned (PIN "pinned") or left to Hypothesis (PIN "free"; "verify" pins itself).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import sys

kind, pin, *extra_modules = sys.argv[1:]
for name in extra_modules:
    importlib.import_module(name)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvcache_spec.stateful import fixed_constant_pool  # noqa: E402

if kind == "verify":
    import kvcache
    from kvcache_proofs import verify

    print(json.dumps(verify.stage_stateful(verify.PROFILES["pre-merge"], kvcache.SequenceCache).numbers))
else:
    drawn: list[int] = []

    @settings(derandomize=True, database=None, deadline=None, max_examples=300)
    @given(st.integers(0, 10**6))
    def draw(value: int) -> None:
        drawn.append(value)

    with fixed_constant_pool() if pin == "pinned" else contextlib.nullcontext():
        draw()
    print(len(drawn), hashlib.sha256(repr(drawn).encode()).hexdigest()[:16])
