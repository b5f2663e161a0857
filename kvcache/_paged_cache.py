"""The paged layout's reference: requests with block tables per KV group over one shared block pool (or, with
"pools": "per-group", one pool per group), with prefix caching and sliding-window groups (the bookkeeping a
serving engine's KV manager does).

A request is admitted with its prompt and extra keys: the cache finds the longest prefix whose K/V it already
holds for exactly these tokens and keys (whole blocks, one hit length for every group, the last prompt token
left to compute), holds those blocks and reserves blocks for the next `budget` tokens. `extend` appends the
tokens decoded since and reserves the next ones; `free` releases the request's references once. The caller
(the model runner) writes every reserved position right after the call returns; a block is made hittable
(cached) once every position in it is reserved, so by the next call its K/V is there.

Contracts. Preconditions check the caller's input, raise a typed `KVCacheError` naming the argument and the rule
before the body runs (a malformed call changes nothing) and stay enabled under `python -O`. The body checks that
a reservation fits before it changes anything, so a refusal (None) changes nothing either. Postconditions (the
books every changing call leaves: the pool's free queue and cache maps consistent, conservation, reference counts
equal to the holders, only full blocks shared, tables covering the reserved positions, every cached block a live
request holds holding exactly that request's prefix; and per verb the hit's bounds, one hit length for every
group, no rewrite of a held block, no refusal of what fits an idle pool, a refusal changing nothing) check this
implementation and follow `__debug__`: they vanish under `python -O`, where the conformance suite (the data check)
still judges the cache from outside.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import icontract

from ._errors import ArgumentValueError
from ._paged_args import budget_fault, first_fault, found, keys_fault, length_fault, request_fault, tokens_fault
from ._paged_blocks import blocks_for as _checked_blocks_for
from ._paged_blocks import first_needed_block as _checked_first_needed_block
from ._paged_blocks import most_hit_blocks as _checked_most_hit_blocks
from ._paged_config import PagedConfig, paged_config
from ._paged_pool import BlockPool, PrefixKey, cache_maps_agree, prefix_keys, queue_is_the_unheld_blocks

Table = list[Optional[int]]

# The block arithmetic's postconditions are confirmed by the CrossHair gate for every int; the hot paths (and the
# contracts here, which call it per table) use the functions themselves, not icontract's re-check of a proof.
blocks_for = inspect.unwrap(_checked_blocks_for)
first_needed_block = inspect.unwrap(_checked_first_needed_block)
most_hit_blocks = inspect.unwrap(_checked_most_hit_blocks)


@dataclass
class _Request:
    tokens: list[int]
    keys: tuple[str, ...]
    computed: int                 # positions reserved so far (the runner writes them right after each call)
    tables: list[Table]           # per group: block index -> block id, None where a window group released it
    chain: list[PrefixKey] = field(default_factory=list)   # the keys of its full reserved blocks (prefix caching)


# --- the books, stated from the tables alone (postconditions) --------------------------------------------

def _holders(cache: PagedCache) -> dict[tuple[int, int], int]:
    """(pool, block id) -> the number of (request, group) tables holding it."""
    counts: dict[tuple[int, int], int] = {}
    for request in cache._requests.values():
        for group, table in enumerate(request.tables):
            for block in table:
                if block is not None:
                    where = (cache.config.pool(group), block)
                    counts[where] = counts.get(where, 0) + 1
    return counts


def _conserved(cache: PagedCache) -> bool:
    """PAGED-CONSERVE: per pool, available() + the distinct blocks in live tables == num_blocks."""
    holders = _holders(cache)
    return all(len(pool.free) + sum(1 for where in holders if where[0] == index) == cache.config.num_blocks
               for index, pool in enumerate(cache._pools))


def _refs_are_holders(cache: PagedCache) -> bool:
    """PAGED-REFCOUNT: a block's reference count is the number of live tables holding it (0: in no table)."""
    holders = _holders(cache)
    return all(count == holders.get((index, block), 0) for index, pool in enumerate(cache._pools)
               for block, count in enumerate(pool.refs))


def _tables_cover(cache: PagedCache) -> bool:
    """PAGED-RESERVE: every group's table has one entry per block of the reserved positions; a full group's are all
    blocks, a window group's are None exactly on a prefix that ends at or below its first needed block."""
    size = cache.config.block_size
    for request in cache._requests.values():
        for window, table in zip(cache.config.windows, request.tables):
            if len(table) != blocks_for(request.computed, size):
                return False
            released = sum(1 for block in table if block is None)
            if window is None and released or window is not None and (
                    any(block is None for block in table[released:])
                    or released > first_needed_block(request.computed, window, size)):
                return False
    return True


def _only_full_blocks_shared(cache: PagedCache) -> bool:
    """PAGED-SHARE-FULL: a block two tables hold sits in the same group at the same block index in each, and is full
    (every position in it reserved) for each holder."""
    size, holders = cache.config.block_size, _holders(cache)
    places: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for request in cache._requests.values():
        for group, table in enumerate(request.tables):
            for index, block in enumerate(table):
                if block is not None and holders[(cache.config.pool(group), block)] > 1:
                    if (index + 1) * size > request.computed:
                        return False
                    places.setdefault((cache.config.pool(group), block), set()).add((group, index))
    return all(len(where) == 1 for where in places.values())


def _cached_blocks_hold_their_holders_prefix(cache: PagedCache) -> bool:
    """PAGED-HIT: a cached block a live request holds at index j is cached, in that group, under exactly the
    request's keys and tokens 0 .. (j+1)B - 1 - so what a later hit on it serves is that prefix's K/V."""
    size = cache.config.block_size
    for request in cache._requests.values():
        for group, table in enumerate(request.tables):
            keys = cache._pools[cache.config.pool(group)].keys
            for index, block in enumerate(table):
                entry = None if block is None else keys[block]
                if entry is not None and (entry[0] != group or entry[1].keys != request.keys
                                          or entry[1].tokens != tuple(request.tokens[:(index + 1) * size])):
                    return False
    return True


def _pool_queue(cache: PagedCache) -> bool:
    return all(queue_is_the_unheld_blocks(pool) for pool in cache._pools)


def _pool_cache(cache: PagedCache) -> bool:
    return all(cache_maps_agree(pool) for pool in cache._pools)


def _held(cache: PagedCache) -> frozenset[tuple[int, int]]:
    """The (pool, block) pairs some live table holds."""
    return frozenset((index, block) for index, pool in enumerate(cache._pools)
                     for block, count in enumerate(pool.refs) if count)


def _written_blocks_were_free(cache: PagedCache, request: str, start: int, held_before: frozenset[tuple[int, int]],
                              tables_before: Sequence[Table] = ()) -> bool:
    """PAGED-NO-REWRITE: the blocks the runner writes for positions start .. computed - 1 of `request` were held by
    no table before the call - but the request's own partly written block, which it alone holds, and blocks this
    call released from its window tables (their positions left every window: reusing them rewrites nothing
    needed)."""
    live, size = cache._requests[request], cache.config.block_size
    own = start // size if start % size else None
    pool = cache.config.pool
    released = {(pool(group), block) for group, (before, after) in enumerate(zip(tables_before, live.tables))
                for block, now in zip(before, after) if block is not None and now is None}
    return all((pool(group), table[index]) not in held_before or (pool(group), table[index]) in released
               for group, table in enumerate(live.tables) for index in range(start // size, len(table))
               if index != own)


def _hit_serves_every_group(cache: PagedCache, request: str, hit: int) -> bool:
    """PAGED-HIT-GROUPS: after an admission with hit h, every group maps every position the queries from h read:
    a full group every block, a window group every block from the one holding h - W + 1."""
    size, live = cache.config.block_size, cache._requests[request]
    return all(block is not None for window, table in zip(cache.config.windows, live.tables)
               for block in table[0 if window is None else first_needed_block(hit, window, size):])


def _idle_refusal(cache: PagedCache, alone: bool, length: int) -> bool:
    """PAGED-IDLE-FIT: a refusal happens only with another request live or when every group holding every position
    of the request, in whole blocks, outgrows the pool."""
    drawing = 1 if cache.config.per_group_pools else len(cache.config.windows)   # groups sharing one pool
    return not alone or drawing * blocks_for(length, cache.config.block_size) > cache.config.num_blocks


def _keeps_the_books(function: Any) -> Any:
    """The postconditions every changing call leaves true (each states one rule)."""
    for condition, description in reversed((
            (_pool_queue, "PAGED-CONSERVE: the free queue is exactly the blocks no table holds, each count >= 0"),
            (_pool_cache, "PAGED-EVICT: a cached key names its block and the block names the key (an evicted block "
                          "leaves the cache)"),
            (_conserved, "PAGED-CONSERVE: available() + the distinct blocks in live tables == num_blocks"),
            (_refs_are_holders, "PAGED-REFCOUNT: each block's reference count is the number of live tables holding it"),
            (_tables_cover, "PAGED-RESERVE: the tables cover every reserved position; a window group releases only "
                            "blocks below every needed window"),
            (_only_full_blocks_shared, "PAGED-SHARE-FULL: a block in two tables is at one group and index, and full "
                                       "for each holder"),
            (_cached_blocks_hold_their_holders_prefix, "PAGED-HIT, PAGED-DATA-SOUND: a cached block a live request "
                                                       "holds is cached under exactly that request's keys and "
                                                       "prefix"))):
        function = icontract.ensure(_of_self(condition), description, error=_violated(description))(function)
    return function


def _of_self(condition: Callable[[PagedCache], bool]) -> Callable[[PagedCache], bool]:
    """`condition` as a contract of `self` alone (icontract resolves a condition's parameters by name)."""
    return lambda self: condition(self)


def _violated(description: str) -> Callable[[PagedCache], icontract.ViolationError]:
    """The error of a book-keeping postcondition made in a loop: icontract shows a failed condition by reading its
    decorator's source, which a loop has not got, so the error is built here (the description names the rule)."""
    return lambda self: icontract.ViolationError(description)


def _unchanged_if_refused(function: Any) -> Any:
    """PAGED-ATOMIC: a refusal (None) leaves every count, table and cached block as it was. The rule also allows
    releasing window blocks out of every needed window then; this pool, which checks the fit first, releases none."""
    return icontract.snapshot(lambda self: self._snapshot(), name="state")(
        icontract.ensure(lambda self, result, OLD: result is not None or self._snapshot() == OLD.state,
                         "PAGED-ATOMIC: a refusal (None) changes nothing")(function))


# --- the cache -------------------------------------------------------------------------------------------

def _admit_fault(self: PagedCache, request: Any, tokens: Any, keys: Any, budget: Any) -> Any:
    # The order of the checks (which argument is named when several are wrong) is the model's.
    return first_fault(lambda: request_fault(request, self._requests, must_be_live=False),
                       lambda: tokens_fault(tokens, allow_empty=False),
                       lambda: length_fault(len(tokens), self.config.max_model_len), lambda: keys_fault(keys),
                       lambda: budget_fault(budget))


def _extend_fault(self: PagedCache, request: Any, tokens: Any, budget: Any) -> Any:
    return first_fault(lambda: request_fault(request, self._requests, must_be_live=True),
                       lambda: tokens_fault(tokens, allow_empty=True),
                       lambda: length_fault(len(self._requests[request].tokens) + len(tokens),
                                            self.config.max_model_len),
                       lambda: _nothing_to_compute(self._requests[request], tokens), lambda: budget_fault(budget))


def _nothing_to_compute(request: _Request, tokens: Sequence[int]) -> Any:
    if len(request.tokens) + len(tokens) == request.computed:
        return lambda: ArgumentValueError("PAGED-ARGS", "tokens", "leave nothing to compute (every token of the "
                                          "request is reserved: pass the tokens decoded since)",
                                          computed=request.computed)
    return None


def _live_fault(self: PagedCache, request: Any) -> Any:
    return request_fault(request, self._requests, must_be_live=True)


def _free_fault(self: PagedCache, request: Any) -> Any:
    return request_fault(request, self._requests, must_be_live=True, rule="PAGED-FREE")


class PagedCache:
    """The paged layout's reference: `PagedCache(config)` with the JSON configuration (block_size, num_blocks,
    max_model_len, groups, prefix_caching). Not thread-safe, like the other layouts."""

    kvcache_layout = "paged"   # the conformance suite drives `python:kvcache:PagedCache` as a paged cache
    kvcache_scope = ("flat", "ring", "pools")   # the whole paged face, per-group pools included

    @_keeps_the_books
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config: PagedConfig = paged_config(config)
        # PAGED-CONFIG: one pool every group draws on, or one per group (block ids per pool)
        self._pools = [BlockPool(self.config.num_blocks, len(self.config.windows))
                       for _ in range(len(self.config.windows) if self.config.per_group_pools else 1)]
        self._requests: dict[str, _Request] = {}

    def _snapshot(self) -> tuple[Any, ...]:
        """Everything a call may change, as a value."""
        return (tuple((tuple(pool.free), tuple(pool.refs), tuple(pool.keys)) for pool in self._pools),
                tuple((name, tuple(r.tokens), r.keys, r.computed, tuple(map(tuple, r.tables)))
                      for name, r in self._requests.items()))

    # --- queries -------------------------------------------------------------------------------------

    @icontract.ensure(lambda self, result: result == self._per_pool(
        [self.config.num_blocks - sum(1 for where in _holders(self) if where[0] == index)
         for index in range(len(self._pools))]),
                      "PAGED-CONSERVE: available() is num_blocks less the distinct blocks in live tables (per pool)")
    def available(self) -> Union[int, list[int]]:
        """Blocks a new reservation could take now without touching a live request's blocks (PAGED-CONFIG: one
        count per group when each group has its own pool)."""
        counts: Union[int, list[int]] = self._per_pool([len(pool.free) for pool in self._pools])
        return counts

    @property
    def _pool(self) -> BlockPool:
        """The first pool: the only one when the groups share it (the tests' stand-ins replace or poke it)."""
        return self._pools[0]

    @_pool.setter
    def _pool(self, pool: BlockPool) -> None:
        self._pools = [pool, *self._pools[1:]]

    def _group_pools(self) -> list[BlockPool]:
        """Per group (config order), the pool its blocks come from (PAGED-CONFIG)."""
        return [self._pools[self.config.pool(group)] for group in range(len(self.config.windows))]

    def _fits(self, fresh: int, held: list[tuple[int, int]], freed: Sequence[tuple[int, int]] = ()) -> bool:
        """Whether every group can take `fresh` blocks now, pool by pool: each pool's free queue, less the
        (group, block) pairs `held` leaves it (unheld blocks a hit takes), plus those `freed` joins it."""
        for index, pool in enumerate(self._pools):
            drawing = sum(1 for group in range(len(self.config.windows)) if self.config.pool(group) == index)
            taken = sum(1 for group, _ in held if self.config.pool(group) == index)
            given = sum(1 for group, _ in freed if self.config.pool(group) == index)
            if fresh * drawing + taken > len(pool.free) + given:
                return False
        return True

    def _per_pool(self, answers: list[Any]) -> Any:
        """PAGED-CONFIG: the answer of the one shared pool, or the list of one per group."""
        return answers if self.config.per_group_pools else answers[0]

    @icontract.require(lambda self, request: _live_fault(self, request) is None, "PAGED-ARGS: request is live",
                       error=lambda self, request: found(_live_fault(self, request)), enabled=True)
    def table(self, request: str) -> list[list[Optional[int]]]:
        """Per group (config order), the block id of each block index of the request (None where released)."""
        return [list(table) for table in self._requests[request].tables]

    @icontract.ensure(lambda self, result: {(index, block): count for index, counts
                                            in enumerate(result if self.config.per_group_pools else [result])
                                            for block, count in counts.items()} == _holders(self),
                      "PAGED-REFCOUNT: ref_counts() is, per held block, the number of live tables holding it")
    def ref_counts(self) -> Union[dict[int, int], list[dict[int, int]]]:
        """Each block held by a live request -> its reference count (PAGED-CONFIG: one dict per group when each
        group has its own pool)."""
        counts: Union[dict[int, int], list[dict[int, int]]] = self._per_pool(
            [{block: count for block, count in enumerate(pool.refs) if count} for pool in self._pools])
        return counts

    def faces(self) -> dict[str, bool]:
        """The paged layout has one face: the object is its own."""
        return {"same_object": True}

    # --- admit ---------------------------------------------------------------------------------------

    def _hit(self, keys: tuple[str, ...], tokens: list[int]) -> tuple[int, list[PrefixKey]]:
        """PAGED-HIT, PAGED-HIT-GROUPS: the most whole blocks k whose K/V every group holds for exactly these keys
        and tokens - a full group blocks 0 .. k-1, a window group the blocks of the window the query at kB reads and
        always block k-1 (so the hit is a prefix some request computed, even where the window reads nothing of the
        past) - with kB <= len(tokens) - 1; and the keys of the first k blocks."""
        config = self.config
        cached = [pool.cached[group] for group, pool in enumerate(self._group_pools())]
        if not config.prefix_caching:
            return 0, []
        size = config.block_size
        chain = prefix_keys(keys, tokens, [], most_hit_blocks(len(tokens), size), size)
        most = len(chain)
        for group, window in enumerate(config.windows):
            if window is None:
                most = next((j for j in range(most) if chain[j] not in cached[group]), most)
        while most > 0 and not all(chain[j] in cached[group]
                                   for group, window in enumerate(config.windows) if window is not None
                                   for j in range(min(first_needed_block(most * size, window, size), most - 1),
                                                  most)):
            most -= 1
        return most, chain[:most]

    @icontract.require(lambda self, request, tokens, keys, budget:
                       _admit_fault(self, request, tokens, keys, budget) is None,
                       "PAGED-ARGS: admit takes a new request, a prompt of token ids within max_model_len, its extra "
                       "keys and a budget >= 1",
                       error=lambda self, request, tokens, keys, budget:
                       found(_admit_fault(self, request, tokens, keys, budget)), enabled=True)
    @icontract.ensure(lambda self, tokens, result: result is None or (
            0 <= result <= len(tokens) - 1 and result % self.config.block_size == 0
            and (self.config.prefix_caching or result == 0)),
                      "PAGED-HIT: a hit is whole blocks, leaves the last prompt token to compute, and is 0 "
                      "without prefix caching")
    @icontract.ensure(lambda self, request, tokens, budget, result: result is None or
                      self._requests[request].computed == result + min(len(tokens) - result, budget),
                      "PAGED-RESERVE: admit reserves min(len(tokens) - hit, budget) positions after the hit")
    @icontract.snapshot(lambda self: _held(self), name="held")
    @icontract.snapshot(lambda self: not self._requests, name="idle")
    @icontract.ensure(lambda self, request, result, OLD: result is None
                      or _written_blocks_were_free(self, request, result, OLD.held),
                      "PAGED-NO-REWRITE: the blocks reserved for the new positions were in no live table")
    @icontract.ensure(lambda self, request, result: result is None or _hit_serves_every_group(self, request, result),
                      "PAGED-HIT-GROUPS: one hit length: every group maps what the queries from the hit on read")
    @icontract.ensure(lambda self, tokens, result, OLD: result is not None or _idle_refusal(self, OLD.idle, len(tokens)),
                      "PAGED-IDLE-FIT: an admission is refused only beside other requests or past the whole pool")
    @_unchanged_if_refused
    @_keeps_the_books
    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        """Admit a new request: returns its prefix hit h and reserves the next min(len(tokens) - h, budget)
        positions; None (nothing changed) when that does not fit now."""
        config, pools, size = self.config, self._group_pools(), self.config.block_size
        prompt, extra = list(tokens), tuple(keys)
        hit, chain = self._hit(extra, prompt)
        end = hit * size + min(len(prompt) - hit * size, budget)
        tables: list[Table] = []
        for group, window in enumerate(config.windows):
            start = 0 if window is None else first_needed_block(hit * size, window, size)
            tables.append([None] * start + [pools[group].cached[group][chain[j]] for j in range(start, hit)])
        held = [(group, block) for group, table in enumerate(tables) for block in table if block is not None]
        fresh = blocks_for(end, size) - hit
        if not self._fits(fresh, [(group, block) for group, block in held if pools[group].refs[block] == 0]):
            return None
        for group, block in held:   # first: the blocks hit must not be the ones taken below
            pools[group].hold([block])
        for group, table in enumerate(tables):
            table.extend(pools[group].take(fresh))
        self._requests[request] = _Request(prompt, extra, end, tables, chain)
        self._cache_full_blocks(self._requests[request])
        return hit * size

    # --- extend --------------------------------------------------------------------------------------

    @icontract.require(lambda self, request, tokens, budget: _extend_fault(self, request, tokens, budget) is None,
                       "PAGED-ARGS: extend takes a live request, the token ids decoded since (within max_model_len, "
                       "leaving something to compute) and a budget >= 1",
                       error=lambda self, request, tokens, budget:
                       found(_extend_fault(self, request, tokens, budget)), enabled=True)
    @icontract.snapshot(lambda self, request: len(self._requests[request].tokens) - self._requests[request].computed,
                        name="pending")
    @icontract.ensure(lambda self, tokens, budget, result, OLD: result is None
                      or result == min(OLD.pending + len(tokens), budget),
                      "PAGED-RESERVE: extend reserves min(tokens not yet reserved, budget) positions")
    @icontract.snapshot(lambda self: _held(self), name="held")
    @icontract.snapshot(lambda self, request: self._requests[request].computed, name="computed")
    @icontract.snapshot(lambda self, request: set(self._requests) == {request}, name="alone")
    @icontract.snapshot(lambda self, request: [list(table) for table in self._requests[request].tables],
                        name="tables")
    @icontract.ensure(lambda self, request, result, OLD: result is None
                      or _written_blocks_were_free(self, request, OLD.computed, OLD.held, OLD.tables),
                      "PAGED-NO-REWRITE: the blocks reserved for the new positions were in no live table but the "
                      "request's own partly written one or blocks this call released from its windows")
    @icontract.ensure(lambda self, request, tokens, result, OLD: result is not None or _idle_refusal(
        self, OLD.alone, len(self._requests[request].tokens) + len(tokens)),
                      "PAGED-IDLE-FIT: an extension is refused only beside other requests or past the whole pool")
    @_unchanged_if_refused
    @_keeps_the_books
    def extend(self, request: str, tokens: list[int], budget: int) -> Optional[int]:
        """Append the tokens decoded since and reserve the next min(uncomputed, budget) positions; returns that
        count, or None (nothing changed) when it does not fit now."""
        config, pools, size = self.config, self._group_pools(), self.config.block_size
        live = self._requests[request]
        grown = live.tokens + list(tokens)
        count = min(len(grown) - live.computed, budget)
        end = live.computed + count
        # PAGED-WINDOW-RELEASE: the blocks below the window the next query (at `computed`) reads leave every window.
        leaving = [0 if window is None else first_needed_block(live.computed, window, size)
                   for window in config.windows]
        released = [(group, block) for group, (table, stop) in enumerate(zip(live.tables, leaving))
                    for block in table[:stop] if block is not None]
        fresh = blocks_for(end, size) - len(live.tables[0])
        if not self._fits(fresh, [], [(group, block) for group, block in released if pools[group].refs[block] == 1]):
            return None
        live.tokens = grown
        for table, stop in zip(live.tables, leaving):
            table[:stop] = [None] * stop
        for group, block in released:
            pools[group].release([block])
        for group, table in enumerate(live.tables):
            table.extend(pools[group].take(fresh))
        live.computed = end
        self._cache_full_blocks(live)
        return count

    def _cache_full_blocks(self, live: _Request) -> None:
        """Make the request's newly full blocks hittable (the runner writes them before the next call)."""
        config = self.config
        if not config.prefix_caching:
            return
        full = live.computed // config.block_size
        settled = len(live.chain)
        live.chain = prefix_keys(live.keys, live.tokens, live.chain, full, config.block_size)
        for group, table in enumerate(live.tables):
            self._group_pools()[group].cache(group, [(block, live.chain[index]) for index in range(settled, full)
                                     if (block := table[index]) is not None])

    # --- free ----------------------------------------------------------------------------------------

    @icontract.require(lambda self, request: _free_fault(self, request) is None,
                       "PAGED-FREE: free takes a live request (an unknown or already freed one is refused)",
                       error=lambda self, request: found(_free_fault(self, request)), enabled=True)
    @icontract.snapshot(lambda self: sum(sum(pool.refs) for pool in self._pools), name="references")
    @icontract.snapshot(lambda self, request: sum(block is not None for table in self._requests[request].tables
                                                  for block in table), name="held")
    @icontract.ensure(lambda self, request, OLD: request not in self._requests
                      and sum(sum(pool.refs) for pool in self._pools) == OLD.references - OLD.held,
                      "PAGED-FREE: free ends the request and releases each of its references exactly once")
    @_keeps_the_books
    def free(self, request: str) -> None:
        """End the request: release each of its references once (tail blocks first, so they are evicted first)."""
        live = self._requests.pop(request)
        for pool, table in zip(self._group_pools(), live.tables):
            pool.release([block for block in reversed(table) if block is not None])
