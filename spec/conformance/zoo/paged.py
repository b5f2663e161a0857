"""Paged caches the suite is tested against: a small correct block pool with prefix caching and window groups
(`PagedPool`), and one stand-in per rule it must catch - each a one-method change of the pool, as a serving
engine's bookkeeping goes wrong (tests/test_paged_conformance.py).

The pool: blocks 0 .. num_blocks - 1 shared by every group; a full block a request computed is indexed by
(group, keys, its whole token prefix); a freed block that is indexed stays hittable in an LRU queue until it is
handed out again; a window group releases the blocks that lie before every window its request still reads.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

Key = tuple[int, tuple[str, ...], tuple[int, ...]]   # (group, keys, a whole-block token prefix)


def _int(value: Any, low: int) -> bool:
    return type(value) is int and value >= low


@dataclass
class Request:
    tokens: list[int]
    keys: tuple[str, ...]
    computed: int
    tables: list[list[Optional[int]]]


class PagedPool:
    """A correct paged cache of the paged face (targets.FACE_METHODS["paged"])."""

    def __init__(self, config: dict[str, Any]) -> None:
        for key in ("block_size", "num_blocks", "max_model_len"):
            if not _int(config.get(key), 1):
                raise ValueError(f"PAGED-CONFIG: {key} must be an int >= 1")
        groups = config.get("groups")
        if not isinstance(groups, list) or not groups or not all(
                isinstance(g, dict) and (g == {"kind": "full"} or g.get("kind") == "window" and set(g) == {
                    "kind", "window"} and _int(g["window"], 1)) for g in groups):
            raise ValueError("PAGED-CONFIG: groups")
        if type(config.get("prefix_caching")) is not bool:
            raise ValueError("PAGED-CONFIG: prefix_caching must be a bool")
        if set(config) - {"block_size", "num_blocks", "max_model_len", "groups", "prefix_caching"}:
            raise ValueError("PAGED-CONFIG: unknown key")
        self.B: int = config["block_size"]
        self.N: int = config["num_blocks"]
        self.M: int = config["max_model_len"]
        self.windows: list[Optional[int]] = [g.get("window") for g in groups]
        self.caching: bool = config["prefix_caching"]
        self.never_used = list(range(self.N - 1, -1, -1))     # popped from the end: block 0 first
        self.evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced indexed blocks, oldest first
        self.ref: dict[int, int] = {}
        self.index: dict[Key, int] = {}
        self.key_of: dict[int, Key] = {}
        self.requests: dict[str, Request] = {}

    # --- the argument contract ----------------------------------------------------------------------
    def _tokens(self, tokens: Any, empty: bool) -> list[int]:
        if not isinstance(tokens, list) or not (empty or tokens) or not all(_int(t, 0) for t in tokens):
            raise ValueError("PAGED-ARGS: tokens must be a list of ints >= 0" + ("" if empty else ", not empty"))
        return tokens

    def _budget(self, budget: Any) -> int:
        if type(budget) is not int or budget < 1:
            raise ValueError("PAGED-ARGS: budget must be an int >= 1")
        return budget

    def _live(self, request: Any) -> Request:
        if not isinstance(request, str) or request not in self.requests:
            raise KeyError(f"PAGED-ARGS: request {request!r} is not live")
        return self.requests[request]

    # --- the pool -------------------------------------------------------------------------------------
    def available(self) -> int:
        return len(self.never_used) + len(self.evictable)

    def ref_counts(self) -> dict[int, int]:
        return {block: count for block, count in self.ref.items() if count > 0}

    def table(self, request: str) -> list[list[Optional[int]]]:
        return [list(row) for row in self._live(request).tables]

    def take(self) -> int:
        """A block for new K/V: a never used one, else the oldest evictable one, its index entry dropped."""
        if self.never_used:
            block = self.never_used.pop()
        else:
            block, _ = self.evictable.popitem(last=False)
            self.forget(block)
        self.ref[block] = 1
        return block

    def forget(self, block: int) -> None:
        key = self.key_of.pop(block, None)
        if key is not None and self.index.get(key) == block:
            del self.index[key]

    def reuse(self, block: int) -> None:
        """A hit on a block: one more reference (out of the evictable queue if it was there)."""
        self.evictable.pop(block, None)
        self.ref[block] = self.ref.get(block, 0) + 1

    def drop(self, block: int) -> None:
        """One reference less; an unreferenced block stays hittable if indexed, else is free."""
        self.ref[block] -= 1
        if self.ref[block] == 0:
            del self.ref[block]
            if block in self.key_of:
                self.evictable[block] = None
            else:
                self.never_used.append(block)

    def key(self, g: int, keys: tuple[str, ...], tokens: list[int], blocks: int) -> Key:
        return (g, keys, tuple(tokens[:blocks * self.B]))

    def floor(self, g: int, position: int) -> int:
        """The first block index the query at `position` reads in group g."""
        window = self.windows[g]
        return 0 if window is None else max(0, position - window + 1) // self.B

    def hit(self, tokens: list[int], keys: tuple[str, ...]) -> int:
        """Whole blocks indexed in every group, below the last token."""
        if not self.caching:
            return 0
        blocks = 0
        while (blocks + 1) * self.B <= len(tokens) - 1 and all(
                self.key(g, keys, tokens, blocks + 1) in self.index for g in range(len(self.windows))):
            blocks += 1
        return blocks * self.B

    def register(self, request: Request) -> None:
        """Index every full block the request computed that no block holds yet."""
        if not self.caching:
            return
        for g, row in enumerate(request.tables):
            for i in range(request.computed // self.B):
                block = row[i] if i < len(row) else None
                if block is None or block in self.key_of:
                    continue
                key = self.key(g, request.keys, request.tokens, i + 1)
                if key not in self.index:
                    self.index[key] = block
                    self.key_of[block] = key

    def plan(self, request: Request, start: int, end: int, hit: int) -> tuple[list[list[Optional[int]]], int, list[tuple[int, int]]]:
        """The tables after reserving start .. end - 1 (hit blocks taken by reference), the blocks it needs from
        the pool, and the (group, index) entries to release: nothing is changed yet."""
        tables = [list(row) for row in request.tables]
        need, releases = 0, []
        for g, row in enumerate(tables):
            low = self.floor(g, start)
            for i, block in enumerate(row):
                if block is not None and i < low:
                    releases.append((g, i))
            for i in range(len(row), -(-end // self.B)):
                if i < low:
                    row.append(None)
                elif i * self.B < hit:
                    cached = self.index[self.key(g, request.keys, request.tokens, i + 1)]
                    row.append(cached)
                    need += cached in self.evictable
                else:
                    row.append(-1)   # a new block, taken when the plan is applied
                    need += 1
        return tables, need, releases

    def apply(self, request: Request, tables: list[list[Optional[int]]], releases: list[tuple[int, int]],
              hit: int) -> None:
        """The plan applied: releases, then the hit blocks' references (before any block is handed out, so no
        hit block is evicted for this very request), then the new blocks."""
        for g, i in releases:
            block = request.tables[g][i]
            if block is not None:
                tables[g][i] = None
                self.drop(block)
        for g, row in enumerate(tables):
            for i, block in enumerate(row):
                if block is not None and block != -1 and i >= len(request.tables[g]) and i * self.B < hit:
                    self.reuse(block)
        for row in tables:
            for i, block in enumerate(row):
                if block == -1:
                    row[i] = self.take()
        request.tables = tables

    # --- the face ---------------------------------------------------------------------------------------
    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        if not isinstance(request, str) or request in self.requests:
            raise ValueError(f"PAGED-ARGS: request {request!r} is already live")
        tokens = self._tokens(tokens, empty=False)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise ValueError("PAGED-ARGS: keys must be a list of str")
        budget = self._budget(budget)
        if len(tokens) > self.M:
            raise ValueError("PAGED-ARGS: tokens longer than max_model_len")
        hit = self.hit(tokens, tuple(keys))
        entry = Request(list(tokens), tuple(keys), hit, [[] for _ in self.windows])
        end = hit + min(len(tokens) - hit, budget)
        tables, need, releases = self.plan(entry, hit, end, hit)
        if need > self.available():
            return None
        self.apply(entry, tables, releases, hit)
        entry.computed = end
        self.requests[request] = entry
        self.register(entry)
        return hit

    def extend(self, request: str, tokens: list[int], budget: int) -> Optional[int]:
        entry = self._live(request)
        tokens = self._tokens(tokens, empty=True)
        budget = self._budget(budget)
        total = entry.tokens + tokens
        if len(total) > self.M or len(total) == entry.computed:
            raise ValueError("PAGED-ARGS: too long for max_model_len, or nothing to compute")
        n = min(len(total) - entry.computed, budget)
        grown = Request(total, entry.keys, entry.computed, entry.tables)
        tables, need, releases = self.plan(grown, entry.computed, entry.computed + n, 0)
        if need > self.available():
            return None
        self.apply(entry, tables, releases, 0)
        entry.tokens, entry.computed = total, entry.computed + n
        self.register(entry)
        return n

    def free(self, request: str) -> None:
        entry = self._live(request)
        del self.requests[request]
        for row in entry.tables:
            for block in reversed(row):   # the tail first: it is evicted first
                if block is not None:
                    self.drop(block)


def paged_pool(config: dict[str, Any]) -> PagedPool:
    return PagedPool(config)


paged_pool.kvcache_layout = "paged"   # type: ignore[attr-defined]


class PoolWithoutCounts(PagedPool):
    """The correct pool without the optional ref_counts(): judged on everything else."""

    ref_counts = None   # type: ignore[assignment]


# --- stand-ins: one defect each -----------------------------------------------------------------------------

class WholePromptPool(PagedPool):
    """A correct pool that admits a request only when its whole prompt fits what is available now, as vLLM's
    scheduler reserves the full prompt of a chunked prefill: refusing a futile first chunk is allowed
    (PAGED-IDLE-FIT)."""

    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        if isinstance(tokens, list) and len(self.windows) * -(-len(tokens) // self.B) > self.available():
            if isinstance(request, str) and request not in self.requests and _int(budget, 1) and tokens and \
                    all(_int(t, 0) for t in tokens) and len(tokens) <= self.M and isinstance(keys, list) and \
                    all(isinstance(k, str) for k in keys):
                return None   # well-formed, but its whole prompt does not fit now
        return super().admit(request, tokens, keys, budget)


class ReleasesOnRefusal(PagedPool):
    """A correct pool that, as vLLM's allocate_slots, hands back the window blocks no needed window reads
    before it checks whether an extension fits - so a refused extension may grow available() (PAGED-ATOMIC)."""

    extra = 0   # window blocks released past those out of every window (0: exactly those)

    def extend(self, request: str, tokens: list[int], budget: int) -> Optional[int]:
        answer = super().extend(request, tokens, budget)
        if answer is None:
            entry = self.requests[request]
            for g, row in enumerate(entry.tables):
                if self.windows[g] is None:
                    continue
                for i in range(min(len(row), self.floor(g, entry.computed) + self.extra)):
                    block = row[i]
                    if block is not None:
                        self.drop(block)
                        row[i] = None
        return answer


class RefusalReleasesNeeded(ReleasesOnRefusal):
    """On a refused extension a window group releases one block too many: one the next query still reads."""

    extra = 1


class TrustingPool(PagedPool):
    """A pool that trusts its caller, as a serving engine's KV manager trusts its scheduler: a budget below 1 is
    served as it comes (PAGED-ARGS) - conforming only for a scope declaring trusted-args (SCOPE-TRUSTED-ARGS)."""

    def _budget(self, budget: Any) -> int:
        return budget if type(budget) is int else 1



class StaleHitAfterReuse(PagedPool):
    """A block handed out again keeps its index entry: a later hit maps to the new owner's K/V."""

    def forget(self, block: int) -> None:
        self.key_of.pop(block, None)


class InUseEvicted(PagedPool):
    """The evictable queue deletes lazily: a block hit again stays queued (available() skips it), and a block
    is handed out from the queue without looking whether it is referenced again: an in-use block evicted."""

    def reuse(self, block: int) -> None:
        self.ref[block] = self.ref.get(block, 0) + 1

    def available(self) -> int:
        return len(self.never_used) + sum(1 for block in self.evictable if block not in self.ref)

    def drop(self, block: int) -> None:
        self.evictable.pop(block, None)
        super().drop(block)

    def take(self) -> int:
        if self.never_used:
            block = self.never_used.pop()
        else:
            block, _ = self.evictable.popitem(last=False)
            self.forget(block)
        self.ref[block] = self.ref.get(block, 0) + 1
        return block


class WindowReleasedEarly(PagedPool):
    """A window group releases its blocks one position early: the oldest position the next query reads goes."""

    def floor(self, g: int, position: int) -> int:
        window = self.windows[g]
        return 0 if window is None else max(0, position - window + 2) // self.B


class RefusalKeepsHit(PagedPool):
    """A refused admission keeps the references its hit took."""

    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        answer = super().admit(request, tokens, keys, budget)
        if answer is None and _int(budget, 1):
            hit = self.hit(tokens, tuple(keys))
            for g in range(len(self.windows)):
                for i in range(hit // self.B):
                    self.reuse(self.index[self.key(g, tuple(keys), tokens, i + 1)])
        return answer


class DoubleFree(PagedPool):
    """free of a request already freed is accepted: its references are released again."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.gone: dict[str, Request] = {}

    def free(self, request: str) -> None:
        if request in self.gone and request not in self.requests:
            for row in self.gone[request].tables:
                for block in row:
                    if block is not None and block in self.ref:
                        self.drop(block)
            return
        self.gone[request] = self._live(request)
        super().free(request)


class SharedBlockRewritten(PagedPool):
    """A decode past a shared full block writes its first new position into that block again (no new block)."""

    def take_after(self, row: list[Optional[int]]) -> Optional[int]:
        last = row[-1] if row else None
        return last if last is not None and self.ref.get(last, 0) > 1 else None

    def plan(self, request: Request, start: int, end: int, hit: int) -> tuple[list[list[Optional[int]]], int, list[tuple[int, int]]]:
        tables, need, releases = super().plan(request, start, end, hit)
        for g, row in enumerate(tables):
            old = request.tables[g]
            if len(row) > len(old) and row[len(old)] == -1 and start > 0:
                again = self.take_after(old)
                if again is not None:
                    row[len(old)] = again
                    need -= 1
        return tables, need, releases


class HitAcrossKeys(PagedPool):
    """Blocks are indexed by their tokens alone: a request with other extra keys hits them."""

    def key(self, g: int, keys: tuple[str, ...], tokens: list[int], blocks: int) -> Key:
        return (g, (), tuple(tokens[:blocks * self.B]))


class PartialBlockShared(PagedPool):
    """A live request's partly filled last block is shared with a new request whose prompt continues the same
    prefix: both then write their next positions into it."""

    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        answer = super().admit(request, tokens, keys, budget)
        if answer is None or not self.caching:
            return answer
        mine = self.requests[request]
        for name, other in self.requests.items():
            i = answer // self.B
            if name == request or other.keys != mine.keys or other.computed % self.B == 0 \
                    or other.computed // self.B != i or other.tokens[:other.computed] != mine.tokens[:other.computed]:
                continue
            for g, row in enumerate(mine.tables):
                own = row[i] if i < len(row) else None
                theirs = other.tables[g][i] if i < len(other.tables[g]) else None
                if own is not None and theirs is not None:
                    self.drop(own)
                    row[i] = theirs
                    self.reuse(theirs)
            break
        return answer


def _factory(cls: type[PagedPool]) -> Any:
    def build(config: dict[str, Any]) -> PagedPool:
        return cls(config)
    build.kvcache_layout = "paged"   # type: ignore[attr-defined]
    build.__name__ = cls.__name__
    return build


pool_without_counts = _factory(PoolWithoutCounts)
stale_hit_after_reuse = _factory(StaleHitAfterReuse)
in_use_evicted = _factory(InUseEvicted)
window_released_early = _factory(WindowReleasedEarly)
refusal_keeps_hit = _factory(RefusalKeepsHit)
double_free = _factory(DoubleFree)
shared_block_rewritten = _factory(SharedBlockRewritten)
hit_across_keys = _factory(HitAcrossKeys)
partial_block_shared = _factory(PartialBlockShared)
trusting_pool = _factory(TrustingPool)
whole_prompt_pool = _factory(WholePromptPool)
releases_on_refusal = _factory(ReleasesOnRefusal)
refusal_releases_needed = _factory(RefusalReleasesNeeded)
trusting_pool_declared = _factory(TrustingPool)
trusting_pool_declared.kvcache_scope = ["trusted-args"]

# name -> (target, the class of finding, the rule it breaks)
PAGED_ZOO: dict[str, tuple[str, str, str]] = {
    "stale_hit_after_reuse": ("python:kvcache_spec.conformance.zoo.paged:stale_hit_after_reuse", "wrong", "PAGED-EVICT"),
    "in_use_evicted": ("python:kvcache_spec.conformance.zoo.paged:in_use_evicted", "wrong", "PAGED-EVICT"),
    "window_released_early": ("python:kvcache_spec.conformance.zoo.paged:window_released_early", "wrong",
                              "PAGED-WINDOW-RELEASE"),
    "refusal_keeps_hit": ("python:kvcache_spec.conformance.zoo.paged:refusal_keeps_hit", "wrong", "PAGED-ATOMIC"),
    "double_free": ("python:kvcache_spec.conformance.zoo.paged:double_free", "lenient", "PAGED-FREE"),
    "shared_block_rewritten": ("python:kvcache_spec.conformance.zoo.paged:shared_block_rewritten", "wrong",
                               "PAGED-NO-REWRITE"),
    "refusal_releases_needed": ("python:kvcache_spec.conformance.zoo.paged:refusal_releases_needed", "wrong",
                                "PAGED-ATOMIC"),
    "hit_across_keys": ("python:kvcache_spec.conformance.zoo.paged:hit_across_keys", "wrong", "PAGED-HIT"),
    "partial_block_shared": ("python:kvcache_spec.conformance.zoo.paged:partial_block_shared", "wrong",
                             "PAGED-SHARE-FULL"),
}



class WindowPoolCountedInFullPool:
    """Per-group pools whose available() reports one of the window pool's free blocks as the full pool's (a
    block the window pool leaks, in no table and never free again, that the full pool counts): the sum across
    pools is conserved, each pool's count is not (PAGED-CONSERVE, per pool). Not in PAGED_ZOO: it needs a scope
    with `pools`, and wraps the reference, whose own books stay right."""

    kvcache_layout = "paged"
    kvcache_scope = ("flat", "ring", "pools")

    def __init__(self, config: dict[str, Any]) -> None:
        from kvcache.paged import PagedCache   # the reference: this stand-in only miscounts its pools
        self.inner = PagedCache(config)
        self.num_blocks = self.inner.config.num_blocks

    def available(self) -> Any:
        counts = self.inner.available()
        if isinstance(counts, list) and len(counts) > 1 and counts[-1] > 0 and counts[0] < self.num_blocks:
            counts = [counts[0] + 1, *counts[1:-1], counts[-1] - 1]
        return counts

    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        answer: Optional[int] = self.inner.admit(request, tokens, keys, budget)
        return answer

    def extend(self, request: str, tokens: list[int], budget: int) -> Optional[int]:
        answer: Optional[int] = self.inner.extend(request, tokens, budget)
        return answer

    def free(self, request: str) -> None:
        self.inner.free(request)

    def table(self, request: str) -> list[list[Optional[int]]]:
        rows: list[list[Optional[int]]] = self.inner.table(request)
        return rows

    def faces(self) -> dict[str, bool]:
        return {"same_object": True}
