"""The paged layout's block pool: reference counts, the free queue and the prefix cache.

Blocks are the ints 0 .. num_blocks - 1 (the reference's own ids: the spec leaves ids to the engine). A
block is either held (its reference count, one per (request, group) table holding it, is >= 1) or in the
free queue (count 0). The free queue is in eviction order: a block taken for a new reservation is the
queue's first; a freed block that holds a cached prefix joins the back (it stays hittable the longest),
one that holds nothing reusable joins the front.

The prefix cache maps, per KV group, the identity of a full block's content - a `PrefixKey` - to the block
holding it. A block keeps its key while it sits in the free queue, so a new request can still hit it; the
key goes when the block is taken for another reservation (evicted), never before. Identity is exact: a
`PrefixKey` holds the request's extra keys and every token up to the block's end and compares them all; the
chained sha256 digest only spreads the keys over the dict's buckets and short-cuts unequal ones, so two
different prefixes whose digests collide are two different keys (no hash collision serves wrong K/V).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import Iterable, Optional

import icontract


def chain_digest(parent: bytes, block: tuple[int, ...]) -> bytes:
    """The digest of a block's content chained over its parent's: sha256(parent digest, the block's tokens)."""
    return hashlib.sha256(parent + array("q", block).tobytes()).digest()


def root_digest(keys: tuple[str, ...]) -> bytes:
    """The digest a request's chain starts from: its extra keys (length-prefixed, so no two lists agree)."""
    return hashlib.sha256(b"".join(len(key.encode()).to_bytes(8, "little") + key.encode() for key in keys)).digest()


class PrefixKey:
    """The identity of the K/V a full block holds: the request's extra keys and its tokens 0 .. end - 1."""

    __slots__ = ("digest", "keys", "tokens", "_hash")

    def __init__(self, digest: bytes, keys: tuple[str, ...], tokens: tuple[int, ...]) -> None:
        self.digest = digest
        self.keys = keys
        self.tokens = tokens
        self._hash = int.from_bytes(digest[:8], "little")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        # The digest decides fast when it differs; equal digests still compare the whole content.
        return (isinstance(other, PrefixKey) and self.digest == other.digest and self.tokens == other.tokens
                and self.keys == other.keys)

    def __repr__(self) -> str:
        return f"PrefixKey(keys={self.keys!r}, tokens={len(self.tokens)}, digest={self.digest[:4].hex()})"


def prefix_keys(keys: tuple[str, ...], tokens: list[int], start: list[PrefixKey], blocks: int,
                block_size: int) -> list[PrefixKey]:
    """`start` (the keys of the first len(start) full blocks) extended to the keys of the first `blocks` ones."""
    chain = list(start)
    digest = chain[-1].digest if chain else root_digest(keys)
    for index in range(len(chain), blocks):
        end = (index + 1) * block_size
        digest = chain_digest(digest, tuple(tokens[end - block_size:end]))
        chain.append(PrefixKey(digest, keys, tuple(tokens[:end])))
    return chain


def _queue_is_the_unheld_blocks(pool: BlockPool) -> bool:
    return all((pool.refs[block] == 0) == (block in pool.free) for block in range(pool.num_blocks))


def _cache_maps_agree(pool: BlockPool) -> bool:
    """Each cached (group, key) -> block entry is that block's key, and each block's key is cached to it."""
    entries = sum(len(cached) for cached in pool.cached)
    return (entries == sum(key is not None for key in pool.keys)
            and all(pool.keys[block] == (group, key) for group, cached in enumerate(pool.cached)
                    for key, block in cached.items()))


@icontract.invariant(lambda self: len(self.refs) == len(self.keys) == self.num_blocks and min(self.refs) >= 0,
                     "PAGED-CONSERVE: one reference count per block, never negative")
@icontract.invariant(lambda self: _queue_is_the_unheld_blocks(self),
                     "PAGED-CONSERVE: the free queue is exactly the blocks no table holds")
@icontract.invariant(lambda self: _cache_maps_agree(self),
                     "PAGED-EVICT: a cached key names its block and the block names the key (an evicted block "
                     "leaves the cache)")
class BlockPool:
    """num_blocks blocks, their reference counts, the free queue and the per-group prefix cache.

    Each method does one whole step of a call (take, hold, release, cache) after the caller has checked that it
    fits: the pool never refuses half-way. Readers use the attributes (a public method would re-check the
    invariants, O(num_blocks), on every look-up)."""

    def __init__(self, num_blocks: int, groups: int) -> None:
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        self.keys: list[Optional[tuple[int, PrefixKey]]] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: list[dict[PrefixKey, int]] = [{} for _ in range(groups)]

    def hold(self, blocks: list[int]) -> None:
        """One more reference to each block (a prefix hit): a block in the free queue leaves it."""
        for block in blocks:
            if self.refs[block] == 0:
                del self.free[block]
            self.refs[block] += 1

    def take(self, count: int) -> list[int]:
        """`count` blocks from the front of the free queue, each evicted (its cached key dropped) and held once."""
        taken = []
        for _ in range(count):
            block, _none = self.free.popitem(last=False)
            cached = self.keys[block]
            if cached is not None:
                del self.cached[cached[0]][cached[1]]
                self.keys[block] = None
            self.refs[block] = 1
            taken.append(block)
        return taken

    def release(self, blocks: list[int]) -> None:
        """One reference less to each block, in order; a block no table holds any more joins the free queue:
        at the back when it holds a cached prefix (evicted last), at the front otherwise (reused first)."""
        for block in blocks:
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free[block] = None
                if self.keys[block] is None:
                    self.free.move_to_end(block, last=False)

    def cache(self, group: int, block: int, key: PrefixKey) -> None:
        """Make a full block hittable under `key` in `group`, unless another block already holds that content
        (the first one stays: a hit never depends on which duplicate was computed last)."""
        if key not in self.cached[group] and self.keys[block] is None:
            self.cached[group][key] = block
            self.keys[block] = (group, key)
