"""The executable spec model of the paged layout: small, pure, brute force (SPEC.md part 7).

Requests share a pool of `num_blocks` blocks of `block_size` (B) slots; each request has, per KV group, a table
of block ids (position p in block index p // B, offset p % B). Block ids, eviction order and everything else the
engine chooses are abstracted away: the model keeps only what the spec decides,
- the live requests: each one's tokens, extra keys and how many positions are computed;
- the prefixes that may be cached: every (keys, whole-block token prefix) some request ever computed. Which of
  them a target still holds is its policy (eviction), so this set only bounds a prefix hit (PAGED-HIT).
Everything a target shows (its tables, available(), ref counts, the values in the slots its tables map) is
judged against that by definition, in `table_problems` and `data_problems`: the value of position p is
`fingerprints(keys, tokens)[p]`, a hash chain over the keys and every token up to p, so a slot holding another
request's, another prefix's or a stale position's K/V can never look right (PAGED-DATA-SOUND).

Each verb is a function of the state. A malformed call returns `Rejected(rule, argument)` (the state unchanged,
PAGED-ATOMIC); a well-formed one returns what the target may answer: `Admission` (the largest hit it may take and
whether it may refuse), `Extension` (n, whether it may refuse) or the state after a free.

This module does not import `kvcache`: the model and the reference are independent.
"""

from __future__ import annotations

import hashlib
import json
import functools
from dataclasses import dataclass, replace
from typing import Any, Collection, Mapping, Optional, Sequence, Union

from .model import INT_MAX, Rejected, _is_int

CONFIG_KEYS = ("block_size", "num_blocks", "max_model_len", "groups", "prefix_caching")
POOLS = ("shared", "per-group")   # the optional key "pools": one pool for every group, or one pool per group

Table = Sequence[Sequence[Optional[int]]]       # per group (config order): block index -> block id, None = none
Slot = tuple[int, int, int]                     # (group index, block id, offset): where the runner writes
Problem = tuple[str, str]                       # (rule id, what is wrong)


@dataclass(frozen=True)
class FullGroup:
    """Full attention: the query at p reads every position 0 .. p."""


@dataclass(frozen=True)
class WindowGroup:
    """Sliding window: the query at p reads the `window` positions p - window + 1 .. p."""

    window: int


Group = Union[FullGroup, WindowGroup]


@dataclass(frozen=True)
class PagedConfig:
    block_size: int
    num_blocks: int          # usable blocks; an engine's null block is not one
    max_model_len: int
    groups: tuple[Group, ...]
    prefix_caching: bool
    per_group_pools: bool = False   # PAGED-CONFIG: each group's own pool of num_blocks blocks (ids per pool)

    def pool(self, group: int) -> int:
        """PAGED-CONFIG: the pool a group's blocks come from (a block is the pair (pool, id))."""
        return group if self.per_group_pools else 0

    @property
    def pools(self) -> int:
        return len(self.groups) if self.per_group_pools else 1


# --- configuration ----------------------------------------------------------------------------------

def _is_size(value: Any) -> bool:
    return _is_int(value) and 1 <= value <= INT_MAX


def _group(raw: Any, where: str) -> Union[Group, Rejected]:
    if not isinstance(raw, Mapping):
        return Rejected("PAGED-CONFIG", where)
    if raw.get("kind") == "full" and set(raw) == {"kind"}:
        return FullGroup()
    if raw.get("kind") == "window" and set(raw) == {"kind", "window"}:
        return WindowGroup(raw["window"]) if _is_size(raw["window"]) else Rejected("PAGED-CONFIG", f"{where}.window")
    return Rejected("PAGED-CONFIG", where)


def configured(cfg: Mapping[str, Any]) -> Union[PagedConfig, Rejected]:
    """PAGED-CONFIG: the configuration, or its refusal naming the key at fault."""
    if not isinstance(cfg, Mapping):
        return Rejected("PAGED-CONFIG", "config")
    for key in sorted(set(cfg) - set(CONFIG_KEYS) - {"pools"}, key=str):
        return Rejected("PAGED-CONFIG", str(key))
    for key in CONFIG_KEYS:
        if key not in cfg:
            return Rejected("PAGED-CONFIG", key)
    for key in ("block_size", "num_blocks", "max_model_len"):
        if not _is_size(cfg[key]):
            return Rejected("PAGED-CONFIG", key)
    if type(cfg["prefix_caching"]) is not bool:
        return Rejected("PAGED-CONFIG", "prefix_caching")
    raw_groups = cfg["groups"]
    if not isinstance(raw_groups, (list, tuple)) or not raw_groups:
        return Rejected("PAGED-CONFIG", "groups")
    groups: list[Group] = []
    for index, raw in enumerate(raw_groups):
        group = _group(raw, f"groups[{index}]")
        if isinstance(group, Rejected):
            return group
        groups.append(group)
    pools = cfg.get("pools", "shared")
    if not isinstance(pools, str) or pools not in POOLS:
        return Rejected("PAGED-CONFIG", "pools")
    return PagedConfig(cfg["block_size"], cfg["num_blocks"], cfg["max_model_len"], tuple(groups),
                       cfg["prefix_caching"], pools == "per-group")


# --- the ground truth --------------------------------------------------------------------------------

def fingerprint_seed(keys: Sequence[str]) -> int:
    """The chain's start: a function of the extra keys alone (their order and boundaries included)."""
    return _digest(b"keys" + json.dumps(list(keys)).encode())


def fingerprint_next(previous: int, token: int) -> int:
    """The next link: a function of everything before and this token."""
    return _digest(previous.to_bytes(8, "big") + token.to_bytes(8, "big"))


def _digest(data: bytes) -> int:
    # 63 bits: fits a signed 64-bit int in any language and in JSON; a collision needs ~2**31 distinct values
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1


def fingerprints(keys: Sequence[str], tokens: Sequence[int]) -> list[int]:
    """PAGED-DATA-SOUND: the value of each position, one per token; position p's depends on the keys and
    tokens[0 .. p], so equal values mean equal prefixes and keys (up to a 63-bit hash)."""
    out: list[int] = []
    value = fingerprint_seed(keys)
    for token in tokens:
        value = fingerprint_next(value, token)
        out.append(value)
    return out


@functools.lru_cache(maxsize=4096)
def _values(keys: tuple[str, ...], tokens: tuple[int, ...]) -> tuple[int, ...]:
    """fingerprints, remembered: the judges ask again after every call for requests that did not move."""
    return tuple(fingerprints(keys, tokens))


def _block_at(row: Sequence[Any], position: int, size: int) -> Optional[int]:
    """The block id a table row maps `position` to; None when it maps it to none (or to what is no block id,
    which `table_problems` names)."""
    block = row[position // size] if position // size < len(row) else None
    return block if _is_int(block) else None


def attended(group: Group, position: int) -> range:
    """What the query at `position` reads in this group (itself included)."""
    start = max(0, position - group.window + 1) if isinstance(group, WindowGroup) else 0
    return range(start, position + 1)


def needed(group: Group, computed: int) -> range:
    """PAGED-DATA-SOUND, PAGED-WINDOW-RELEASE: what a live request with `computed` positions must still hold in
    this group - what its next query (at `computed`) reads of the past."""
    return range(attended(group, computed).start, computed)


def step_reads(group: Group, start: int, end: int) -> range:
    """What the queries of a step computing positions start .. end - 1 read in this group (PAGED-HIT-GROUPS:
    after an admission with hit h, start is h)."""
    return range(attended(group, start).start, end)


# --- the state -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Live:
    tokens: tuple[int, ...]
    keys: tuple[str, ...]
    computed: int            # positions 0 .. computed - 1 computed (reserved, then written by the runner)


Prefix = tuple[tuple[str, ...], tuple[int, ...]]   # (keys, a whole-block token prefix)


@dataclass(frozen=True)
class PagedState:
    cfg: PagedConfig
    live: Mapping[str, Live]
    cached: frozenset[Prefix]          # every whole-block prefix some request computed: what a hit may cover

    def key(self) -> tuple[PagedConfig, tuple[tuple[str, Live], ...], frozenset[Prefix]]:
        """The state as a hashable value (an exhaustive checker's visited set)."""
        return self.cfg, tuple(sorted(self.live.items())), self.cached

    def __hash__(self) -> int:
        return hash(self.key())


def initial(cfg: PagedConfig) -> PagedState:
    return PagedState(cfg, {}, frozenset())


def _computed(cfg: PagedConfig, cached: frozenset[Prefix], request: Live) -> frozenset[Prefix]:
    """PAGED-HIT: the cache may hold every whole block a request computed (whether it does is its policy)."""
    blocks = request.computed // cfg.block_size
    return cached | {(request.keys, request.tokens[:k * cfg.block_size]) for k in range(1, blocks + 1)}


def _with(state: PagedState, request: str, entry: Live) -> PagedState:
    live = dict(state.live)
    live[request] = entry
    return PagedState(state.cfg, live, _computed(state.cfg, state.cached, entry))


def blocks_to_hold(cfg: PagedConfig, end: int) -> int:
    """PAGED-IDLE-FIT: the most blocks a request holding positions 0 .. end - 1 needs of one pool: whole blocks,
    every group drawing on it."""
    return (1 if cfg.per_group_pools else len(cfg.groups)) * -(-end // cfg.block_size)


def fits_idle(cfg: PagedConfig, end: int) -> bool:
    """PAGED-IDLE-FIT: whether a lone request holding 0 .. end - 1 fits the pool (each pool, PAGED-CONFIG)."""
    return blocks_to_hold(cfg, end) <= cfg.num_blocks


# --- the argument contract (PAGED-ARGS) ----------------------------------------------------------------

def _token_list(value: Any, allow_empty: bool) -> bool:
    return (isinstance(value, (list, tuple)) and (allow_empty or len(value) > 0)
            and all(_is_int(token) and 0 <= token <= INT_MAX for token in value))


def _is_str(value: Any) -> bool:
    """Exactly a str: a subclass could compare or hash as another request's id (as ARG-INT says of ints)."""
    return type(value) is str


def _budget_ok(budget: Any) -> bool:
    return _is_int(budget) and 1 <= budget <= INT_MAX


def lookup(state: PagedState, request: Any) -> Union[Live, Rejected]:
    """PAGED-ARGS: table(request) takes a live request."""
    if not _is_str(request) or request not in state.live:
        return Rejected("PAGED-ARGS", "request")
    return state.live[request]


# --- the verbs -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Admission:
    """What a target may answer to a well-formed admit: a hit h allowed by `allows` (then `after(h)` is the new
    state), or None - a refusal - unless `must_fit`."""

    state: PagedState
    request: str
    tokens: tuple[int, ...]
    keys: tuple[str, ...]
    budget: int
    max_hit: int             # PAGED-HIT: the largest hit the spec allows here
    must_fit: bool           # PAGED-IDLE-FIT: a refusal is wrong

    def allows(self, hit: Any) -> bool:
        """PAGED-HIT: whole blocks, within max_hit (which is already <= len(tokens) - 1 and of a cached prefix)."""
        return _is_int(hit) and 0 <= hit <= self.max_hit and hit % self.state.cfg.block_size == 0

    def n(self, hit: int) -> int:
        """PAGED-RESERVE: how many positions an admission with this hit reserves."""
        return min(len(self.tokens) - hit, self.budget)

    def after(self, hit: int) -> PagedState:
        if not self.allows(hit):
            raise ValueError(f"PAGED-HIT: a hit of {hit!r} is not allowed here (at most {self.max_hit}, whole blocks)")
        return _with(self.state, self.request, Live(self.tokens, self.keys, hit + self.n(hit)))


def max_hit(state: PagedState, tokens: Sequence[int], keys: Sequence[str]) -> int:
    """PAGED-HIT: the largest whole-block prefix of tokens, at most len(tokens) - 1, computed by some request with
    these keys; 0 without prefix caching. Brute force: the longest such prefix in `cached`."""
    if not state.cfg.prefix_caching:
        return 0
    size = state.cfg.block_size
    best = 0
    for k in range(1, (len(tokens) - 1) // size + 1):
        if (tuple(keys), tuple(tokens[:k * size])) in state.cached:
            best = k * size
    return best


def admit(state: PagedState, request: Any, tokens: Any, keys: Any, budget: Any) -> Union[Rejected, Admission]:
    """PAGED-ARGS, PAGED-HIT, PAGED-RESERVE, PAGED-IDLE-FIT: a new request."""
    if not _is_str(request) or request in state.live:
        return Rejected("PAGED-ARGS", "request")
    if not _token_list(tokens, allow_empty=False) or len(tokens) > state.cfg.max_model_len:
        return Rejected("PAGED-ARGS", "tokens")
    if not isinstance(keys, (list, tuple)) or not all(_is_str(key) for key in keys):
        return Rejected("PAGED-ARGS", "keys")
    if not _budget_ok(budget):
        return Rejected("PAGED-ARGS", "budget")
    hit = max_hit(state, tokens, keys)
    idle = not state.live and fits_idle(state.cfg, len(tokens))   # the whole prompt, not the budget's chunk
    return Admission(state, request, tuple(tokens), tuple(keys), budget, hit, idle)


@dataclass(frozen=True)
class Extension:
    """What a target answers to a well-formed extend: n (PAGED-RESERVE) and `after` the new state, or None - a
    refusal, the state unchanged - unless `must_fit`."""

    n: int
    after: PagedState
    must_fit: bool           # PAGED-IDLE-FIT


def extend(state: PagedState, request: Any, tokens: Any, budget: Any) -> Union[Rejected, Extension]:
    """PAGED-ARGS, PAGED-RESERVE, PAGED-IDLE-FIT: a live request's next step."""
    entry = lookup(state, request)
    if isinstance(entry, Rejected):
        return entry
    if not _token_list(tokens, allow_empty=True):
        return Rejected("PAGED-ARGS", "tokens")
    total = entry.tokens + tuple(tokens)
    if len(total) > state.cfg.max_model_len or len(total) == entry.computed:
        return Rejected("PAGED-ARGS", "tokens")    # too long, or nothing to compute
    if not _budget_ok(budget):
        return Rejected("PAGED-ARGS", "budget")
    n = min(len(total) - entry.computed, budget)
    alone = set(state.live) == {request}
    fits = alone and fits_idle(state.cfg, len(total))   # the whole request, as for an admission
    return Extension(n, _with(state, request, replace(entry, tokens=total, computed=entry.computed + n)), fits)


def free(state: PagedState, request: Any) -> Union[Rejected, PagedState]:
    """PAGED-FREE: the request ends; what it computed stays hittable until the target evicts it."""
    if not _is_str(request) or request not in state.live:
        return Rejected("PAGED-FREE", "request")
    return PagedState(state.cfg, {name: entry for name, entry in state.live.items() if name != request}, state.cached)


# --- judging what a target shows ---------------------------------------------------------------------------

def must_hold(state: PagedState, request: str, group: int, step_from: Optional[int] = None) -> range:
    """PAGED-DATA-SOUND: the positions `request`'s table of `group` must map to their values now: `needed`, or
    while a step computing from `step_from` is served, everything its queries read."""
    entry = state.live[request]
    kind = state.cfg.groups[group]
    return needed(kind, entry.computed) if step_from is None else step_reads(kind, step_from, entry.computed)


def writes(state: PagedState, request: str, table: Table, step_from: int) -> Union[list[tuple[Slot, int]], Problem]:
    """PAGED-RESERVE: the (slot, value) the runner writes after a step that computed positions step_from ..
    computed - 1 of `request`, every group; a problem when the table gives such a position no block."""
    entry = state.live[request]
    values = _values(entry.keys, entry.tokens[:entry.computed])
    size = state.cfg.block_size
    out: list[tuple[Slot, int]] = []
    for group in range(len(state.cfg.groups)):
        row = table[group] if group < len(table) else []
        for position in range(step_from, entry.computed):
            block = _block_at(row, position, size)
            if block is None:
                return ("PAGED-RESERVE", f"position {position} of group {group} has no block")
            out.append(((group, block, position % size), values[position]))
    return out


def data_problems(state: PagedState, tables: Mapping[str, Table], memory: Mapping[Slot, int],
                  stepped: Optional[tuple[str, int]] = None, only: Optional[Collection[str]] = None) -> list[Problem]:
    """PAGED-DATA-SOUND (and PAGED-WINDOW-RELEASE where a window group shows None): every position each live
    request must hold maps to a slot holding its value. `stepped` is (request, step_from) right after a step.
    A stale hit after a block was evicted and reused (PAGED-EVICT) shows here: the slot holds another value.
    `only`: judge these live requests alone (a runner that knows which tables a call can have touched)."""
    size = state.cfg.block_size
    problems: list[Problem] = []
    for request, entry in sorted(state.live.items()):
        if only is not None and request not in only:
            continue
        values = _values(entry.keys, entry.tokens[:entry.computed])
        step_from = stepped[1] if stepped is not None and stepped[0] == request else None
        table = tables.get(request, [])
        for group, kind in enumerate(state.cfg.groups):
            row = table[group] if group < len(table) else []
            for position in must_hold(state, request, group, step_from):
                block = _block_at(row, position, size)
                where = f"request {request!r}, group {group}, position {position}"
                if block is None:
                    rule = "PAGED-WINDOW-RELEASE" if isinstance(kind, WindowGroup) else "PAGED-DATA-SOUND"
                    problems.append((rule, f"{where}: no block"))
                elif memory.get((group, block, position % size)) != values[position]:
                    problems.append(("PAGED-DATA-SOUND", f"{where}: block {block} holds another value"))
    return problems


def released_only(cfg: PagedConfig, computed: int, before: Table, after: Table) -> bool:
    """PAGED-ATOMIC: whether a live request's tables after a refusal differ from those before only by window-group
    block indexes, all of whose positions lie before the window the request still needs, turned None - the
    releases PAGED-WINDOW-RELEASE allows at any time."""
    if len(after) != len(before):
        return False
    for group, old, new in zip(cfg.groups, before, after):
        first = needed(group, computed).start
        if len(old) != len(new) or any(
                was != now and not (isinstance(group, WindowGroup) and now is None
                                    and (index + 1) * cfg.block_size <= first)
                for index, (was, now) in enumerate(zip(old, new))):
            return False
    return True


def table_problems(state: PagedState, tables: Mapping[str, Table], available: Union[int, Sequence[int]],
                   ref_counts: Union[None, Mapping[int, int], Sequence[Mapping[int, int]]] = None) -> list[Problem]:
    """PAGED-SHARE-FULL, PAGED-CONSERVE, PAGED-REFCOUNT, PAGED-WINDOW-RELEASE: the bookkeeping computed from the
    live tables alone (ids compared only with themselves, within their pool: PAGED-CONFIG). With per-group pools
    `available` and `ref_counts` are one entry per group."""
    cfg = state.cfg
    size = cfg.block_size
    problems: list[Problem] = []
    holders: dict[tuple[int, int], list[tuple[str, int, int]]] = {}   # (pool, id) -> (request, group, index)
    for request, entry in sorted(state.live.items()):
        table = tables.get(request, [])
        if len(table) != len(cfg.groups):
            problems.append(("PAGED-DATA-SOUND", f"request {request!r}: {len(table)} group tables"))
        for group, row in enumerate(table):
            if isinstance(cfg.groups[group] if group < len(cfg.groups) else None, FullGroup):
                gaps = [index for index in range(-(-entry.computed // size))
                        if index >= len(row) or row[index] is None]
                if gaps:
                    problems.append(("PAGED-WINDOW-RELEASE", f"request {request!r}, full group {group}: "
                                                             f"block index {gaps[0]} released"))
            for index, block in enumerate(row):
                if _is_int(block):
                    holders.setdefault((cfg.pool(group), block), []).append((request, group, index))
                elif block is not None:
                    problems.append(("PAGED-DATA-SOUND", f"request {request!r}, group {group}: block index {index} "
                                                         f"holds {block!r}, not a block id (an int) or None"))
    for (pool, block), held in sorted(holders.items()):
        if len(held) < 2:
            continue
        places = {(group, index) for _, group, index in held}
        partial = [request for request, _, index in held if (index + 1) * size > state.live[request].computed]
        if len(places) > 1 or partial:
            problems.append(("PAGED-SHARE-FULL", f"block {block}{_of_pool(cfg, pool)} held at {sorted(held)}"))
    per_pool = [available] if _is_int(available) else list(available)   # type: ignore[arg-type]
    if len(per_pool) != cfg.pools or not all(_is_int(count) for count in per_pool):
        problems.append(("PAGED-CONSERVE", f"available {available!r}: not one count per pool ({cfg.pools})"))
    else:
        for pool, count in enumerate(per_pool):
            held_here = sum(1 for where in holders if where[0] == pool)
            if count + held_here != cfg.num_blocks:
                problems.append(("PAGED-CONSERVE", f"available {count} + held {held_here} != {cfg.num_blocks} "
                                                   f"blocks{_of_pool(cfg, pool)}"))
    if ref_counts is not None:
        answered = [ref_counts] if isinstance(ref_counts, Mapping) else list(ref_counts)
        shown = {(pool, block): count for pool, counts in enumerate(answered) for block, count in counts.items()}
        counts = {where: len({(request, group) for request, group, _ in held}) for where, held in holders.items()}
        wrong = sorted((where for where in set(counts) | set(shown) if shown.get(where) != counts.get(where)),
                       key=repr)
        if wrong or len(answered) != cfg.pools:
            shown_wrong = wrong[:5] if cfg.per_group_pools else [block for _, block in wrong[:5]]
            problems.append(("PAGED-REFCOUNT", f"{'(pool, block)' if cfg.per_group_pools else 'blocks'} "
                                               f"{shown_wrong}: counts differ from the live tables holding them"))
    return problems


def _of_pool(cfg: PagedConfig, pool: int) -> str:
    """Where a block is, in a message: its pool when each group has one (ids are per pool then)."""
    return f" of pool {pool}" if cfg.per_group_pools else ""


def rewrite_problems(state: PagedState, tables: Mapping[str, Table], planned: Sequence[tuple[Slot, int]],
                     stepped: tuple[str, int]) -> list[Problem]:
    """PAGED-NO-REWRITE: the runner's writes after a step of `stepped` = (request, step_from) land on no slot
    that a live request - another, or this one below step_from - must hold with another value."""
    size = state.cfg.block_size
    held: dict[Slot, tuple[str, int, int]] = {}                 # slot -> (request, position, its value)
    for request, entry in sorted(state.live.items()):
        values = _values(entry.keys, entry.tokens[:entry.computed])
        table = tables.get(request, [])
        for group in range(min(len(table), len(state.cfg.groups))):
            row = table[group]
            for position in must_hold(state, request, group, stepped[1] if request == stepped[0] else None):
                if request == stepped[0] and position >= stepped[1]:
                    continue                                    # what this step writes
                block = _block_at(row, position, size)
                if block is not None:
                    held[(group, block, position % size)] = (request, position, values[position])
    problems: list[Problem] = []
    for slot, value in planned:
        if slot in held and held[slot][2] != value:
            request, position, _ = held[slot]
            problems.append(("PAGED-NO-REWRITE", f"slot {slot} holds position {position} of {request!r}, "
                                                 f"still needed"))
    return problems
