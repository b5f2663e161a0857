"""Differential: `kvcache.op` against upstream's own eager reference (ExecuTorch's `reference_cache.py`) on
programs both accept - the same histories, bit for bit, the same mask kinds and masks, the same attention.

Upstream's module is not part of this repository: point `KVCACHE_UPSTREAM_CACHE_DIR` at the folder holding
its `reference_cache.py` (executorch's `extension/llm/cache`, e.g. unpacked from the executorch 1.5.1 wheel);
without it, or without torch, the test is skipped and says so. Where upstream is lax (re-placed positions,
forks onto live sequences) the programs here stay inside what both accept: the strict refusals are tested
in tests/test_op_bad_input.py.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import kvcache.op as op

UPSTREAM_DIR = os.environ.get("KVCACHE_UPSTREAM_CACHE_DIR", "")
if not (UPSTREAM_DIR and (Path(UPSTREAM_DIR) / "reference_cache.py").is_file()):
    pytest.skip("KVCACHE_UPSTREAM_CACHE_DIR does not name upstream's extension/llm/cache folder",
                allow_module_level=True)
torch = pytest.importorskip("torch", reason="upstream's reference needs torch, which is not installed")


def load_upstream() -> Any:
    """upstream's reference_cache.py, with its one executorch import (a no-op decorator) stubbed."""
    warnings = types.ModuleType("executorch.exir._warnings")
    warnings.experimental = lambda message: (lambda thing: thing)  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("executorch", "executorch.exir", "executorch.exir._warnings")}
    sys.modules.update({"executorch": types.ModuleType("executorch"),
                        "executorch.exir": types.ModuleType("executorch.exir"),
                        "executorch.exir._warnings": warnings})
    try:
        spec = importlib.util.spec_from_file_location("upstream_reference_cache",
                                                      Path(UPSTREAM_DIR) / "reference_cache.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["upstream_reference_cache"] = module   # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        for name, value in saved.items():
            if value is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value


up = load_upstream()
POLICIES = [("flat", 0), ("ring", 1), ("ring", 3)]


def configs(rng: random.Random, n_kv_heads: int, head_dim: int, capacity: int) -> tuple[Any, op.CacheConfig]:
    layers = [rng.choice(POLICIES) for _ in range(2)]
    def policies(module: Any) -> list[Any]:
        return [module.LayerPolicy.flat() if kind == "flat" else module.LayerPolicy.ring(w) for kind, w in layers]
    return (up.CacheConfig(2, n_kv_heads, head_dim, capacity, layers=policies(up)),
            op.CacheConfig(2, n_kv_heads, head_dim, capacity, dtype=torch.float32, layers=policies(op)))


def same_answer(theirs: Any, ours: Any) -> None:
    assert torch.equal(theirs[0], ours[0]) and torch.equal(theirs[1], ours[1])
    assert theirs[2].kind.name == ours[2].kind.name
    if ours[2].kind is op.MaskKind.EXPLICIT:
        assert torch.equal(theirs[2].mask, ours[2].mask)


def test_contiguous_agrees_with_upstream() -> None:
    rng = random.Random(1)
    for _ in range(30):
        up_config, our_config = configs(rng, 2, 4, 20)
        theirs, ours = up.ContiguousReferenceCache(up_config), op.ContiguousReferenceCache(our_config)
        position = 0
        while position + 4 <= 20:
            T = rng.randint(1, 4)
            for layer in range(2):
                k, v = torch.randn(1, 2, T, 4), torch.randn(1, 2, T, 4)
                where = torch.arange(position, position + T).reshape(-1, 1)
                a, b = theirs.update_and_fetch(layer, k, v, where), ours.update_and_fetch(layer, k, v, where)
                same_answer(a, b)
                q = torch.randn(1, 4, T, 4)
                torch.testing.assert_close(up.attend(q, *a, 0.5, torch.float32), op.attend(q, *b, 0.5, torch.float32))
            position += T
            assert theirs.used(0) == ours.used(0) == position


def test_cells_agree_with_upstream() -> None:
    rng = random.Random(2)
    for _ in range(30):
        up_config, our_config = configs(rng, 1, 2, 12)
        theirs, ours = up.CellReferenceCache(up_config), op.CellReferenceCache(our_config)
        next_position: dict[int, int] = {}
        for _ in range(10):
            roll = rng.random()
            if roll < 0.15:
                s, p0 = rng.choice([0, 1, 2]), rng.randint(0, 4)
                theirs.seq_rm(s, p0)
                ours.seq_rm(s, p0)
                next_position[s] = min(next_position.get(s, 0), p0)
            elif roll < 0.3:
                src, dst = rng.sample([0, 1, 2], 2)
                if ours.seq_len(dst) == 0:   # upstream merges into a live dst; ours refuses (OP-FORK)
                    theirs.seq_cp(src, dst)
                    ours.seq_cp(src, dst)
                    next_position[dst] = next_position.get(src, 0)
            else:
                seqs = [rng.choice([0, 1, 2]) for _ in range(rng.randint(1, 3))]
                if len(seqs) > ours.free_cells():
                    continue
                positions = []
                for s in seqs:
                    positions.append(next_position.get(s, 0))
                    next_position[s] = positions[-1] + 1
                theirs.begin_step(seqs)
                ours.begin_step(seqs)
                for layer in range(2):
                    k, v = torch.randn(1, 1, len(seqs), 2), torch.randn(1, 1, len(seqs), 2)
                    where = torch.tensor(positions).reshape(-1, 1)
                    same_answer(theirs.update_and_fetch(layer, k, v, where), ours.update_and_fetch(layer, k, v, where))
            assert theirs.free_cells() == ours.free_cells()
            assert [theirs.seq_len(s) for s in range(3)] == [ours.seq_len(s) for s in range(3)]
