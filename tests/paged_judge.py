"""A brute-force judge of a paged cache, independent of the model and of the reference: it acts as the model
runner. After every served admit / extend it writes, into the slot the request's table maps each newly reserved
position to, that position's exact content - the request's keys and every token up to it (no hash: two
different prefixes can never look alike) - and then reads every position each live request still needs back
through its table. It also recomputes the books from the tables it reads (conservation, reference counts,
only full blocks shared) and checks that a refusal or a refused call changed nothing.

`raw=True` calls the cache's methods without their contracts (icontract's wrapper unwrapped), so a deliberately
broken cache is judged by this data check alone, not stopped by its own postconditions first.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

Slot = tuple[int, int, int]                       # (group, block id, offset)
Content = tuple[tuple[str, ...], tuple[int, ...]]  # (keys, tokens 0 .. p): what the K/V of position p depends on


class Wrong(AssertionError):
    """The judge found a cache serving or reporting something wrong (the rule id leads the message)."""


@dataclass
class Request:
    tokens: list[int]
    keys: tuple[str, ...]
    computed: int


class Judge:
    """Drives `cache` (a paged cache object) with its config and judges every step."""

    def __init__(self, cache: Any, config: dict[str, Any], raw: bool = False) -> None:
        self.cache = cache
        self.size: int = config["block_size"]
        self.num_blocks: int = config["num_blocks"]
        self.windows: list[Optional[int]] = [group.get("window") for group in config["groups"]]
        self.prefix_caching: bool = config["prefix_caching"]
        self.raw = raw
        self.memory: dict[Slot, Content] = {}
        self.live: dict[str, Request] = {}
        self.computed_prefixes: set[Content] = set()   # every whole-block prefix any request computed
        self.steps = 0

    def _call(self, method: str, *args: Any) -> Any:
        function: Callable[..., Any] = getattr(type(self.cache), method)
        if self.raw:
            return inspect.unwrap(function)(self.cache, *args)
        return function(self.cache, *args)

    # --- what the cache shows -----------------------------------------------------------------------

    def shown(self) -> tuple[int, dict[str, list[list[Optional[int]]]], dict[int, int]]:
        return (self._call("available"), {name: self._call("table", name) for name in self.live},
                self._call("ref_counts"))

    def _needed(self, request: Request, group: int, step_from: Optional[int]) -> range:
        """What the request's table of `group` must map to its content now (while a step from `step_from` is
        served: everything its queries read)."""
        window = self.windows[group]
        start = request.computed if step_from is None else step_from
        first = 0 if window is None else max(0, start - window + 1)
        return range(first, request.computed)

    # --- the checks ---------------------------------------------------------------------------------

    def check(self, stepped: Optional[tuple[str, int]] = None) -> None:
        available, tables, refs = self.shown()
        holders: dict[int, list[tuple[str, int, int]]] = {}
        for name, request in self.live.items():
            table = tables[name]
            if len(table) != len(self.windows):
                raise Wrong(f"PAGED-RESERVE: {name} shows {len(table)} group tables")
            for group, row in enumerate(table):
                for index, block in enumerate(row):
                    if block is not None:
                        holders.setdefault(block, []).append((name, group, index))
                step_from = stepped[1] if stepped is not None and stepped[0] == name else None
                for position in self._needed(request, group, step_from):
                    index = position // self.size
                    block = row[index] if index < len(row) else None
                    if block is None:
                        raise Wrong(f"PAGED-DATA-SOUND: {name} group {group} position {position} has no block")
                    got = self.memory.get((group, block, position % self.size))
                    if got != (request.keys, tuple(request.tokens[:position + 1])):
                        raise Wrong(f"PAGED-DATA-SOUND: {name} group {group} position {position} reads block "
                                    f"{block} holding {got!r}")
        for block, held in holders.items():
            if len(held) > 1 and (len({(group, index) for _, group, index in held}) > 1 or any(
                    (index + 1) * self.size > self.live[name].computed for name, _, index in held)):
                raise Wrong(f"PAGED-SHARE-FULL: block {block} held at {held}")
        if available + len(holders) != self.num_blocks:
            raise Wrong(f"PAGED-CONSERVE: available {available} + held {len(holders)} != {self.num_blocks}")
        counts = {block: len(held) for block, held in holders.items()}
        if refs != counts:
            raise Wrong(f"PAGED-REFCOUNT: ref_counts {refs} != holders {counts}")

    def _write(self, name: str, step_from: int) -> None:
        """Write the positions the last call reserved; none may land on a slot a live request still needs."""
        request = self.live[name]
        table = self._call("table", name)
        needed: dict[Slot, Content] = {}
        for other, entry in self.live.items():
            other_table = table if other == name else self._call("table", other)
            for group, row in enumerate(other_table):
                for position in self._needed(entry, group, step_from if other == name else None):
                    if other == name and position >= step_from:
                        continue
                    index = position // self.size
                    if index < len(row) and row[index] is not None:
                        needed[(group, row[index], position % self.size)] = (entry.keys,
                                                                             tuple(entry.tokens[:position + 1]))
        for group, row in enumerate(table):
            for position in range(step_from, request.computed):
                index = position // self.size
                block = row[index] if index < len(row) else None
                if block is None:
                    raise Wrong(f"PAGED-RESERVE: {name} group {group} reserved position {position} has no block")
                slot = (group, block, position % self.size)
                content = (request.keys, tuple(request.tokens[:position + 1]))
                if slot in needed and needed[slot] != content:
                    raise Wrong(f"PAGED-NO-REWRITE: {name} position {position} overwrites slot {slot}")
                self.memory[slot] = content
        for end in range(self.size, request.computed + 1, self.size):
            self.computed_prefixes.add((request.keys, tuple(request.tokens[:end])))

    def _unchanged(self, before: Any, what: str) -> None:
        if self.shown() != before:
            raise Wrong(f"PAGED-ATOMIC: {what} changed the cache")

    # --- the verbs ----------------------------------------------------------------------------------

    def admit(self, name: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        before = self.shown()
        alone = not self.live
        hit = self._call("admit", name, tokens, keys, budget)
        self.steps += 1
        if hit is None:
            self._unchanged(before, f"the refused admit of {name}")
            blocks = len(self.windows) * -(-len(tokens) // self.size)
            if alone and blocks <= self.num_blocks and budget >= len(tokens):
                raise Wrong(f"PAGED-IDLE-FIT: admit of {name} refused on an idle pool it fits")
            return None
        best = max([k * self.size for k in range(1, (len(tokens) - 1) // self.size + 1)
                    if self.prefix_caching and (tuple(keys), tuple(tokens[:k * self.size])) in self.computed_prefixes],
                   default=0)
        if type(hit) is not int or hit % self.size or not 0 <= hit <= best:
            raise Wrong(f"PAGED-HIT: admit of {name} hit {hit!r}, allowed whole blocks up to {best}")
        self.live[name] = Request(list(tokens), tuple(keys), hit + min(len(tokens) - hit, budget))
        self._write(name, hit)
        self.check((name, hit))
        return int(hit)

    def extend(self, name: str, tokens: list[int], budget: int) -> Optional[int]:
        before = self.shown()
        request = self.live[name]
        count = self._call("extend", name, tokens, budget)
        self.steps += 1
        if count is None:
            self._unchanged(before, f"the refused extend of {name}")
            return None
        expected = min(len(request.tokens) + len(tokens) - request.computed, budget)
        if count != expected:
            raise Wrong(f"PAGED-RESERVE: extend of {name} reserved {count!r}, not {expected}")
        step_from = request.computed
        request.tokens += tokens
        request.computed += count
        self._write(name, step_from)
        self.check((name, step_from))
        return int(count)

    def free(self, name: str) -> None:
        self._call("free", name)
        self.steps += 1
        del self.live[name]
        self.check()

    def refused(self, method: str, *args: Any) -> BaseException:
        """A malformed call: it must raise and change nothing. Returns the error."""
        before = self.shown()
        try:
            self._call(method, *args)
        except Exception as error:   # the caller checks the type
            self._unchanged(before, f"the malformed {method}{args!r}")
            return error
        raise Wrong(f"PAGED-ARGS: {method}{args!r} was served")
