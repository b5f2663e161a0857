"""The paged layout's engine: the suite acts as the model runner of a paged KV cache (spec/paged_model.py).

The harness owns the KV memory: a dict (group, block id, offset) -> value. After every admit or extend the
target served, it reads the request's tables back (`table(request)`) and "computes" each position the call
reserved: it writes `fingerprints(keys, tokens)[p]` - a value of the request's keys and whole prefix up to
p - into the slot the group's table maps p to. Then it judges by the data, never by block ids: every
position a live request attends maps through its table to a slot holding exactly that position's
fingerprint, whoever wrote it. Beside the data, bookkeeping read from the observed tables: a block in two
live tables is full for both (only full blocks are shared), available() plus the distinct block ids of the
live tables is num_blocks (conservation), ref_counts() (when offered) counts the (request, group) tables
holding each id, and a refused malformed call changes none of these, a refusal none but by window releases
(`paged_model.released_only`). The hit an admission answers is bounded by the model (`Admission.allows`);
extend's count is the model's; on an idle pool a request that fits whole is not refused (`must_fit`).

Cost, bounded by counts: a write is checked against a reverse map (group, block) -> the live readers of that
block, so a write into a slot another live request still needs, with another value, is caught when it
happens (a shared block rewritten, an in-use block handed out); a request's table is read after each of its
calls and only the positions it wrote, its hit and the block indexes whose ids changed are verified again;
every live table is read back and every needed position verified every max(FULL_CHECK_EVERY, 2 x live
requests) steps and at the end of the program (paged/cost.py measures what this costs).

Program steps (spec/conformance/paged/programs.py): {"op": "admit", "tokens": [...], "keys": [...],
"budget": b} (the harness names the request r<k>, its k-th admission; "request" overrides: a name, or
{"live": k} - the k-th live request in admission order, for a malformed admission of a live one),
{"op": "extend", "request": R, "tokens": [...], "budget": b}, {"op": "free", "request": R} with R a name,
{"live": k}, {"freed": k} (the k-th newest freed one) or {"unknown": 0} (a name never admitted),
{"op": "table", "request": R} (one request's tables read back now) and {"op": "check"} (every table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from ... import model
from ... import paged_model as pm
from ...model import _is_int
from ..configs import JsonConfig
from .. import scope as scopes
from ..engine import (CRASH, LENIENT, NOT_SENT, OVER_STRICT, WRONG, ConfigRejected, Drive, Engine, RunResult, Step,
                      Stop, Verdict, _show)
from ..targets import Outcome

# The rule each kind of check judges (spec/rules.py, SPEC.md part 7).
RULE = {
    "args": "PAGED-ARGS",              # a malformed call refused
    "hit": "PAGED-HIT",                # a hit: whole blocks of a prefix computed with identical tokens and keys
    "hit groups": "PAGED-HIT-GROUPS",  # one hit length: every group maps what the queries from the hit read
    "data": "PAGED-DATA-SOUND",        # the ground truth: every attended position holds its own fingerprint
    "reserve": "PAGED-RESERVE",        # the reserved positions have slots; extend answers the model's n
    "share": "PAGED-SHARE-FULL",       # only full blocks are shared, at one group and block index
    "rewrite": "PAGED-NO-REWRITE",     # a slot a live request must hold is never given to another position
    "evict": "PAGED-EVICT",            # only unheld blocks are handed out; never a stale hit after reuse
    "conserve": "PAGED-CONSERVE",      # available() + distinct held ids == num_blocks
    "refcount": "PAGED-REFCOUNT",      # ref_counts() == the live (request, group) holders
    "atomic": "PAGED-ATOMIC",          # a refusal changes nothing
    "free": "PAGED-FREE",              # free releases each reference once; a request not live is refused
    "window": "PAGED-WINDOW-RELEASE",  # a window group releases only blocks out of every needed window
    "idle": "PAGED-IDLE-FIT",          # on an idle pool a reservation that fits is not refused
}
ANSWER_TYPES: dict[str, tuple[type, ...]] = {"admit": (int,), "extend": (int,), "table": (list,),
                                             "available": (int, list), "ref_counts": (dict, list)}
# Steps between two full read-backs of every live table (and one at the end of every program): at least this
# many, and twice the live requests, so that a read-back's table calls cost at most one call per step on average.
FULL_CHECK_EVERY = 16
CHECK: Step = {"op": "check"}
Table = list[list[Optional[int]]]
Slot = tuple[int, int, int]   # (group index, block id, offset)




def paged_config(cfg: JsonConfig) -> tuple[pm.PagedConfig, Optional[model.Rejected]]:
    """The model's reading of a JSON config, and its rejection (with a stand-in config to run on)."""
    made = pm.configured(cfg)
    if isinstance(made, model.Rejected):
        return pm.PagedConfig(1, 1, 1, (pm.FullGroup(),), False), made
    return made, None


@dataclass
class Mirror:
    """What the harness last read of one live request's tables, and the values of its positions."""
    tables: Table
    fingerprints: list[int]
    incarnation: int


class PagedEngine(Engine):
    """One paged program on one target; a fresh cache per program."""

    answer_types = ANSWER_TYPES

    def __init__(self, target: Any, cfg: JsonConfig, exact: bool = False, light: bool = False,
                 scope: Any = None, row_budget: Optional[int] = None, drive: Optional[Drive] = None) -> None:
        super().__init__(target, cfg, exact, light, scope, row_budget, drive)
        self.pc, self.rejected_config = paged_config(cfg)
        self.state = pm.initial(self.pc)
        self.B = self.pc.block_size
        self.memory: dict[Slot, int] = {}
        self.writer: dict[Slot, tuple[int, int]] = {}              # slot -> (incarnation, position) written
        self.earlier_values: dict[Slot, set[int]] = {}             # slot -> the values it held before a rewrite
        self.incarnations: list[tuple[tuple[str, ...], tuple[int, ...]]] = []   # every admission's keys, tokens
        self.mirrors: dict[str, Mirror] = {}                       # the live requests, in admission order
        self.readers: dict[tuple[int, int], dict[str, set[int]]] = {}   # (group, id) -> request -> block indexes
        self.holders: dict[tuple[int, int], int] = {}   # (pool, id) -> (request, group) tables holding it
        self.freed: list[str] = []
        self.admitted = 0
        self.steps_since_full = 0
        self.has_ref_counts = False   # known once the cache is created (after_create)
        # SCOPE-TRUSTED-ARGS: a KV manager its scheduler alone calls is sent no malformed call, no invalid config
        self.trusted = scopes.TRUSTED_ARGS in (self.scope or self.target.scope).relaxations()

    # --- the failure path ------------------------------------------------------------------------------
    def _fail(self, kind: str, rule: str, message: str, detail: str = "") -> Stop:
        """A finding with the blocks the live tables held as the harness last read them (its picture, drawn by the
        HTML report): per block id, its holders (request, group, block index)."""
        stop = super()._fail(kind, rule, message, detail)
        number = {request: n for n, request in enumerate(self.mirrors)}
        held: dict[int, list[tuple[str, int, int]]] = {}
        for (g, block), readers in self.readers.items():
            for request, indexes in readers.items():
                held.setdefault(block, []).extend((request, g, index) for index in sorted(indexes))
        stop.finding.picture = {"cells": {"layout": "paged", "cells": [
            {"cell": block, "owners": sorted({number[r] for r, _, _ in places if r in number}),
             "held": [f"{r} g{g} #{i}" for r, g, i in sorted(places)]}
            for block, places in sorted(held.items())[:64]]}}
        return stop

    def _check_type(self, method: str, args: dict[str, Any], outcome: Outcome, rule: str) -> None:
        super()._check_type(method, args, outcome, rule)
        if method == "table" and outcome.ok and outcome.value is not None and \
                not _table_shape(outcome.value, len(self.pc.groups)):
            raise self._fail(CRASH, rule, f"table({_show(args)}): protocol: answered {_brief(outcome.value)}, "
                                          f"not one list of block ids (ints or null) per group")
        if method == "ref_counts" and outcome.ok and outcome.value is not None and not _per_pool(
                outcome.value, self.pc, lambda counts: isinstance(counts, dict) and all(
                    _block_key(k) is not None and type(v) is int for k, v in counts.items())):
            raise self._fail(CRASH, rule, f"ref_counts(): protocol: answered {_brief(outcome.value)}, not ints "
                                          f"to ints{' per group (PAGED-CONFIG)' if self.pc.per_group_pools else ''}")
        if method == "available" and outcome.ok and outcome.value is not None and not _per_pool(
                outcome.value, self.pc, lambda count: type(count) is int):
            raise self._fail(CRASH, rule, f"available(): protocol: answered {_brief(outcome.value)}, not "
                                          f"{'one int per group (PAGED-CONFIG)' if self.pc.per_group_pools else 'an int'}")

    def _ask(self, method: str, args: dict[str, Any], rule: str) -> Any:
        """A query the harness needs answered: its value (an error answer is a wrong finding); ref_counts' block
        ids as ints (over the protocol a JSON object's keys are decimal strings)."""
        got = self._call(method, args, rule)
        if not got.ok or got.value is None:
            raise self._fail(WRONG, rule, f"{method}({_show(args)}) answered {got.error or 'null'}")
        if method == "ref_counts":   # as (pool, id) -> count, like self.holders
            answered = got.value if self.pc.per_group_pools else [got.value]
            return {(pool, _block_key(block)): count for pool, counts in enumerate(answered)
                    for block, count in counts.items()}
        return got.value

    def expected_available(self) -> Any:
        """PAGED-CONSERVE: num_blocks less the distinct blocks live tables hold, per pool (PAGED-CONFIG: a list of
        one count per group when each group has its own pool, an int otherwise)."""
        counts = [self.pc.num_blocks - sum(1 for pool, _ in self.holders if pool == p) for p in range(self.pc.pools)]
        return counts if self.pc.per_group_pools else counts[0]

    # --- what the core asks of a layout -----------------------------------------------------------------
    def verdict(self, method: str, args: dict[str, Any]) -> Verdict:
        raise NotImplementedError("the paged engine judges its calls itself (run_step)")

    def observe(self, context: str, rule: str, lenient_rule: Optional[str] = None, retained: bool = True) -> None:
        self.unchanged(context, lenient_rule)

    def start(self) -> None:
        if self.rejected_config is not None and self.trusted:
            self.result.skipped.add(f"scope: invalid configurations not sent: the scope declares "
                                    f"'{scopes.TRUSTED_ARGS}'")
            raise ConfigRejected()
        super().start()

    def not_sent(self, verdict: Any) -> bool:
        """Whether the call the model rejects (a malformed one) is left out: under trusted-args its step, already
        recorded, is dropped and the run says so."""
        if not (self.trusted and isinstance(verdict, model.Rejected)):
            return False
        self.result.steps.pop()
        self.result.skipped.add(f"scope: malformed calls ({verdict.rule}) not sent: the target's scope declares "
                                f"'{scopes.TRUSTED_ARGS}'")
        return True

    def after_create(self) -> None:
        self.has_ref_counts = "ref_counts" in self.target.optional   # the optional method, as created
        available = self._ask("available", {}, RULE["conserve"])
        if available != self.expected_available():
            raise self._fail(WRONG, RULE["conserve"], f"after create: available() is {available!r}, not "
                                                      f"{self.expected_available()!r} (num_blocks per pool)")

    def run(self, program: list[Step]) -> RunResult:
        """The program, then a full read-back at its end (a step of its own, so a replay finds it too)."""
        return super().run(program + [CHECK])

    # --- reading the target -----------------------------------------------------------------------------
    def read_table(self, request: str, rule: str) -> Table:
        return [list(row) for row in self._ask("table", {"request": request}, rule)]

    def unchanged(self, context: str, lenient_rule: Optional[str] = None) -> None:
        """A rejected (malformed) call changed nothing the harness can see: available(), every live table and
        ref_counts() are what the harness last read and counted. A refusal (no `lenient_rule`) may also have
        released window blocks out of every needed window (PAGED-ATOMIC): those entries are taken as released,
        and available() must then have grown by exactly the blocks no live table holds any more."""
        kind, rule = (LENIENT, lenient_rule) if lenient_rule else (WRONG, RULE["atomic"])
        was = self.expected_available()
        for request, mirror in self.mirrors.items():
            table = self.read_table(request, RULE["atomic"])
            if table == mirror.tables:
                continue
            if lenient_rule or not pm.released_only(self.pc, self.computed(request), mirror.tables, table):
                raise self._fail(kind, rule, f"{context}: table({request!r}) changed: {_brief(mirror.tables)} -> "
                                             f"{_brief(table)}", detail="table")
            self.hold(request, table)   # released out of every window: allowed at any time
        available = self._ask("available", {}, RULE["atomic"])
        if available != self.expected_available():
            grown = "" if was == self.expected_available() else \
                f"; with the blocks its window releases gave back: {self.expected_available()!r}"
            raise self._fail(kind, rule, f"{context}: available() is {available!r}, it was {was}{grown}",
                             detail="available")
        if self.has_ref_counts:
            refs = self._ask("ref_counts", {}, RULE["atomic"])
            if refs != self.holders:
                raise self._fail(kind, rule, f"{context}: ref_counts() is {_brief(refs)}, the live tables hold "
                                             f"{_brief(self.holders)}", detail="ref_counts")

    # --- the mirror and the reverse map ------------------------------------------------------------------
    def hold(self, request: str, tables: Table) -> list[tuple[int, int]]:
        """Record `request`'s tables as read; the (group, block index) entries whose id changed."""
        mirror = self.mirrors[request]
        changed: list[tuple[int, int]] = []
        for g, (row, before) in enumerate(zip(tables, mirror.tables)):
            if row == before:
                continue
            for index in range(max(len(row), len(before))):
                was = before[index] if index < len(before) else None
                now = row[index] if index < len(row) else None
                if was == now:
                    continue
                changed.append((g, index))
                if was is not None:
                    self._unread(g, was, request, index)
                if now is not None:
                    indexes = self.readers.setdefault((g, now), {}).setdefault(request, set())
                    if not indexes:
                        self._held((self.pc.pool(g), now), +1)
                    indexes.add(index)
        mirror.tables = tables
        return changed

    def _held(self, block: tuple[int, int], delta: int) -> None:
        count = self.holders.get(block, 0) + delta
        if count:
            self.holders[block] = count
        else:
            self.holders.pop(block, None)

    def _unread(self, g: int, block: int, request: str, index: int) -> None:
        readers = self.readers.get((g, block), {})
        indexes = readers.get(request, set())
        indexes.discard(index)
        if not indexes and request in readers:
            del readers[request]
            self._held((self.pc.pool(g), block), -1)
        if not readers:
            self.readers.pop((g, block), None)

    def release(self, request: str) -> None:
        """A freed request reads nothing any more."""
        for g, row in enumerate(self.mirrors[request].tables):
            for index, block in enumerate(row):
                if block is not None:
                    self._unread(g, block, request, index)
        del self.mirrors[request]

    # --- the data ---------------------------------------------------------------------------------------
    def computed(self, request: str) -> int:
        return self.state.live[request].computed

    def slot(self, request: str, g: int, position: int) -> Optional[Slot]:
        row = self.mirrors[request].tables[g]
        index = position // self.B
        block = row[index] if index < len(row) else None
        return None if block is None else (g, block, position % self.B)

    def write(self, request: str, positions: range, held_before: dict[int, set[int]]) -> None:
        """Compute `positions` of `request`: write each one's fingerprint into its slot in every group,
        judging each write against the slot's other live readers first (PAGED-NO-REWRITE, PAGED-EVICT)."""
        mirror = self.mirrors[request]
        for g in range(len(self.pc.groups)):
            for p in positions:
                at = self.slot(request, g, p)
                if at is None:
                    raise self._fail(WRONG, RULE["reserve"], f"position {p} of {request!r} was reserved, but "
                                                             f"table({request!r}) maps it to no block in group {g}")
                value = mirror.fingerprints[p]
                held = self.memory.get(at)
                if held != value:
                    if held is not None:   # a reused slot: whoever still reads it is judged now
                        self.result.exercised.update((RULE["rewrite"], RULE["evict"]))
                        self.clobbered(request, g, p, at, value, held_before.get(g, set()))
                        self.earlier_values.setdefault(at, set()).add(held)
                    self.memory[at] = value
                    self.writer[at] = (mirror.incarnation, p)
        self._rows(len(positions) * len(self.pc.groups))

    def clobbered(self, writer: str, g: int, position: int, at: Slot, value: int, held_before: set[int]) -> None:
        """A write of another value into a slot: no live request may still need what it holds."""
        _, block, offset = at
        group = self.pc.groups[g]
        readers = self.readers.get((g, block), {})
        for reader in sorted(readers, key=lambda name: name == writer):   # another reader named first
            for index in sorted(readers[reader]):
                p = index * self.B + offset
                if reader == writer and p == position:
                    continue
                if p in pm.needed(group, self.computed(reader)) and p < len(self.mirrors[reader].fingerprints) \
                        and self.mirrors[reader].fingerprints[p] != value:
                    shared = block in held_before   # the writer held it before this step: a shared block
                    kind = "rewrite" if shared else "evict"
                    what = "a block it held before this step, shared with" if shared else "a block still held by"
                    raise self._fail(WRONG, RULE[kind], f"computing position {position} of {writer!r} writes into "
                                                        f"{what} {reader!r} (block {block} of group {g}, offset "
                                                        f"{offset}), whose position {p} is still needed",
                                     detail=kind)

    def verify(self, request: str, g: int, positions: Iterable[int], context: str, hit: int = 0) -> None:
        """Each position maps to a slot holding exactly its own fingerprint (PAGED-DATA-SOUND; within a hit
        PAGED-HIT, PAGED-HIT-GROUPS, or PAGED-EVICT for a stale block)."""
        mirror = self.mirrors[request]
        fps = mirror.fingerprints
        group = self.pc.groups[g]
        self.result.exercised.add(RULE["data"])
        if isinstance(group, pm.WindowGroup):
            self.result.exercised.add(RULE["window"])
        if hit:
            self.result.exercised.update((RULE["hit groups"], RULE["evict"]))
        for p in positions:
            at = self.slot(request, g, p)
            held = None if at is None else self.memory.get(at)
            if held == fps[p]:
                continue
            if at is None:
                kind = "hit groups" if p < hit else "window" if isinstance(group, pm.WindowGroup) else "data"
                raise self._fail(WRONG, RULE[kind], f"{context}: position {p} of {request!r} is read (computed "
                                                    f"{self.computed(request)}), but its group {g} table maps it to "
                                                    f"no block", detail=f"{kind} unmapped")
            where = f"block {at[1]} of group {g}, offset {at[2]}"
            if p < hit:
                kind, whose = self.hit_blame(mirror, p, at)
                raise self._fail(WRONG, RULE[kind], f"{context}: the hit of {hit} tokens maps position {p} to "
                                                    f"{where}, which holds {whose}", detail=f"hit {kind}")
            raise self._fail(WRONG, RULE["data"], f"{context}: position {p} of {request!r} maps to {where}, which "
                                                  f"holds {'nothing written' if held is None else 'another value'}, "
                                                  f"not its own K/V", detail="data")

    def hit_blame(self, mirror: Mirror, p: int, at: Slot) -> tuple[str, str]:
        """Why a hit position holds another value: the block held this prefix before it was reused (a stale
        hit, PAGED-EVICT), or it holds the same tokens under other keys, or another prefix (PAGED-HIT)."""
        if mirror.fingerprints[p] in self.earlier_values.get(at, set()):
            return "evict", "another prefix's K/V: it held this prefix once, and was reused since (a stale hit)"
        written = self.writer.get(at)
        if written is None:
            return "hit", "nothing written"
        keys, tokens = self.incarnations[written[0]]
        mine_keys, mine_tokens = self.incarnations[mirror.incarnation]
        if written[1] == p and tokens[:p + 1] == mine_tokens[:p + 1] and keys != mine_keys:
            return "hit", f"the same tokens' K/V under other keys ({list(keys)}, not {list(mine_keys)})"
        return "hit", f"position {written[1]} of another prefix"

    def check_shared(self, request: str, entries: list[tuple[int, int]], reserved_from: Optional[int] = None) -> None:
        """PAGED-SHARE-FULL: a block of `request` that another live table holds is at the same group and block
        index there, and full for both. A block reserved in this step (block index from `reserved_from` on, not
        a hit's) that another live request holds at another place was handed out in use: PAGED-EVICT."""
        for g, index in entries:
            row = self.mirrors[request].tables[g]
            block = row[index] if index < len(row) else None
            if block is None or self.holders.get((self.pc.pool(g), block), 0) < 2:
                continue
            self.result.exercised.add(RULE["share"])
            places = [(reader, gg, i) for (gg, b), readers in self._readers_of(g, block)
                      for reader, indexes in readers.items() for i in indexes]
            spots = {(gg, i) for _, gg, i in places}
            partial = [(who, i) for who, _, i in places if (i + 1) * self.B > self.computed(who)]
            if reserved_from is not None and index >= reserved_from and len(spots) > 1:
                other = next(place for place in sorted(places) if place != (request, g, index))
                raise self._fail(WRONG, RULE["evict"], f"block {block} of group {g}, reserved for {request!r} at "
                                                       f"block index {index}, is still held by {other[0]!r} (group "
                                                       f"{other[1]}, block index {other[2]})",
                                 detail="in use")
            if len(spots) > 1 or partial:
                why = (f"not full for {partial[0][0]!r} (block index {partial[0][1]}, computed "
                       f"{self.computed(partial[0][0])})" if partial else "at different places")
                raise self._fail(WRONG, RULE["share"], f"block {block} is held by {sorted(places)[:4]}, {why}")

    def _readers_of(self, group: int, block: int) -> list[tuple[tuple[int, int], dict[str, set[int]]]]:
        """Who reads `block` of `group`'s pool: in any group drawing on that pool (PAGED-CONFIG)."""
        return [((g, block), self.readers[(g, block)]) for g in range(len(self.pc.groups))
                if (g, block) in self.readers and self.pc.pool(g) == self.pc.pool(group)]

    def check_counts(self, context: str, ref_counts: bool = False) -> None:
        """PAGED-CONSERVE, and PAGED-REFCOUNT when offered (asked for at the full read-backs)."""
        available = self._ask("available", {}, RULE["conserve"])
        if available != self.expected_available():
            raise self._fail(WRONG, RULE["conserve"], f"{context}: available() is {available!r}, but the live "
                                                      f"tables leave {self.expected_available()!r} of "
                                                      f"{self.pc.num_blocks} blocks{' per pool' * self.pc.per_group_pools}")
        if ref_counts and self.has_ref_counts:
            refs = self._ask("ref_counts", {}, RULE["refcount"])
            if refs != self.holders:
                differ = sorted(b for b in set(refs) | set(self.holders) if refs.get(b) != self.holders.get(b))
                raise self._fail(WRONG, RULE["refcount"], f"{context}: ref_counts() differs from the live tables "
                                                          f"at blocks {differ[:4]}: "
                                                          f"{[(b, refs.get(b), self.holders.get(b)) for b in differ[:4]]}"
                                                          f" (answered, held)")

    def full_check(self, context: str) -> None:
        """Every live table read back; every position each live request must hold verified; the counts."""
        self.steps_since_full = 0
        for request in list(self.mirrors):
            changed = self.hold(request, self.read_table(request, RULE["data"]))
            self.check_shared(request, changed)
        for request in self.mirrors:
            for g, group in enumerate(self.pc.groups):
                row = self.mirrors[request].tables[g]
                if isinstance(group, pm.FullGroup) and any(b is None for b in row[:-(-self.computed(request) // self.B)]):
                    raise self._fail(WRONG, RULE["window"], f"{context}: the full group {g} of {request!r} released "
                                                            f"a block: {_brief(row)}")
                self.verify(request, g, pm.needed(group, self.computed(request)), context)
        self.check_counts(context, ref_counts=True)

    # --- arguments ------------------------------------------------------------------------------------
    def request(self, value: Any) -> Any:
        """A request argument: a name as it is; {"live": k} the k-th live one (in admission order, modulo their
        number), {"freed": k} the k-th newest freed one, {"unknown": 0} a name never admitted."""
        if not isinstance(value, dict):
            return value
        live = list(self.mirrors)
        if "live" in value:
            return live[value["live"] % len(live)] if live else "never-admitted"
        if "freed" in value:
            return self.freed[-1 - value["freed"] % len(self.freed)] if self.freed else "never-admitted"
        return "never-admitted"

    # --- the program ----------------------------------------------------------------------------------
    def run_step(self, step: Step) -> Optional[Step]:
        op = step["op"]
        if op == "admit":
            concrete = self.admit(step)
        elif op == "extend":
            concrete = self.extend(step)
        elif op == "free":
            concrete = self.free(step)
        elif op == "table":
            concrete = self.table_op(step)
        elif op == "check":
            self.result.steps.append(dict(CHECK))
            self.full_check("at a full read-back")
            concrete = self.result.steps.pop()
        else:
            raise ValueError(f"unknown paged step op {op!r}")
        self.steps_since_full += 1
        if self.steps_since_full >= max(FULL_CHECK_EVERY, 2 * len(self.mirrors)):
            self.full_check(f"at the full read-back after step {self.index}")
        return concrete

    def refusal(self, method: str, args: dict[str, Any], outcome: Outcome, verdict: Any) -> bool:
        """Judge a call the target refused (raised or answered None) or the model rejects; False when the
        call was served and the model serves it too."""
        shown = f"{method}({_show(args)})"
        served = outcome.ok and (method == "free" or outcome.value is not None)
        if isinstance(verdict, model.Rejected):
            if served:
                raise self._fail(LENIENT, verdict.rule, f"{shown} is a caller error ({verdict.rule}, "
                                                        f"{verdict.argument}) but the target accepted it: "
                                                        f"{outcome.value!r}", detail=verdict.argument)
            self.unchanged(f"after the rejected {shown}", verdict.rule)
            return True
        if verdict.must_fit:
            self.result.exercised.add(RULE["idle"])
        if served:
            return False
        if not outcome.ok:
            raise self._fail(OVER_STRICT, RULE["args"] if method != "free" else RULE["free"],
                             f"{shown} is valid but the target raised: {outcome.error}")
        if verdict.must_fit:
            raise self._fail(OVER_STRICT, RULE["idle"], f"{shown} fits the pool of {self.pc.num_blocks} blocks "
                                                        f"with no other request live, but the target refused it")
        self.unchanged(f"after the refused {shown}")
        return True

    def admit(self, step: Step) -> Step:
        name = self.request(step["request"]) if "request" in step else f"r{self.admitted}"
        args = {"request": name, "tokens": step.get("tokens"), "keys": step.get("keys", []),
                "budget": step.get("budget")}
        self.result.steps.append({"op": "admit", **args})
        verdict = pm.admit(self.state, name, args["tokens"], args["keys"], args["budget"])
        if self.not_sent(verdict):
            return NOT_SENT
        outcome = self._call("admit", args, verdict.rule if isinstance(verdict, model.Rejected) else RULE["hit"])
        self.judged = ("admit", args, outcome)
        if self.refusal("admit", args, outcome, verdict):
            return self.result.steps.pop()
        assert isinstance(verdict, pm.Admission)
        self.admitted += 1
        hit = outcome.value
        if not verdict.allows(hit):
            raise self._fail(WRONG, RULE["hit"], f"admit({_show(args)}) answered a hit of {hit!r} tokens; the spec "
                                                 f"allows at most {verdict.max_hit} here, in whole blocks of "
                                                 f"{self.B} (a prefix computed with identical tokens and keys, "
                                                 f"below the last token)", detail="bound")
        self.state = verdict.after(hit)
        self.incarnations.append((tuple(args["keys"]), tuple(args["tokens"])))
        self.mirrors[name] = Mirror([[] for _ in self.pc.groups], pm.fingerprints(args["keys"], args["tokens"]),
                                    len(self.incarnations) - 1)
        self.served(name, hit, hit, f"after admit({name!r}) with a hit of {hit}")
        return self.result.steps.pop()

    def extend(self, step: Step) -> Step:
        name = self.request(step["request"])
        args = {"request": name, "tokens": step.get("tokens"), "budget": step.get("budget")}
        self.result.steps.append({"op": "extend", **args})
        verdict = pm.extend(self.state, name, args["tokens"], args["budget"])
        if self.not_sent(verdict):
            return NOT_SENT
        outcome = self._call("extend", args, verdict.rule if isinstance(verdict, model.Rejected) else RULE["reserve"])
        self.judged = ("extend", args, outcome)
        if self.refusal("extend", args, outcome, verdict):
            return self.result.steps.pop()
        assert isinstance(verdict, pm.Extension)
        if not _is_int(outcome.value) or outcome.value != verdict.n:
            raise self._fail(WRONG, RULE["reserve"], f"extend({_show(args)}) answered {outcome.value!r}; the spec "
                                                     f"reserves {verdict.n}")
        start = self.computed(name)
        self.state = verdict.after
        live = self.state.live[name]
        mirror = self.mirrors[name]
        for token in live.tokens[len(mirror.fingerprints):]:   # the chain, one link per decoded token
            mirror.fingerprints.append(pm.fingerprint_next(mirror.fingerprints[-1], token))
        self.served(name, start, 0, f"after extend({name!r}) of {verdict.n}")
        return self.result.steps.pop()

    def served(self, name: str, start: int, hit: int, context: str) -> None:
        """After an admission or extension served (positions start .. computed - 1 reserved): read the tables,
        write the reserved positions, verify what the step's queries read whose block is new or changed."""
        end = self.computed(name)
        held_before = {g: {b for i, b in enumerate(row) if b is not None and i * self.B < start}
                       for g, row in enumerate(self.mirrors[name].tables)}
        changed = self.hold(name, self.read_table(name, RULE["reserve"]))
        self.write(name, range(start, end), held_before)   # first: a write that clobbers names the block's reader
        self.check_shared(name, changed, reserved_from=-(-max(start, hit) // self.B))
        for g, group in enumerate(self.pc.groups):
            reads = pm.step_reads(group, start, end)
            # what this step's queries read that no earlier check covers: the positions written now, a hit's, and
            # those of block indexes whose id changed (the others' data changes only by writes, judged on write)
            fresh = {index for gg, index in changed if gg == g}
            spans = [range(max(reads.start, start), end), range(reads.start, min(hit, end))] + [
                range(max(reads.start, index * self.B), min(end, (index + 1) * self.B)) for index in sorted(fresh)]
            self.verify(name, g, sorted({p for span in spans for p in span}), context, hit)
            row = self.mirrors[name].tables[g]
            if isinstance(group, pm.WindowGroup):
                continue
            released = [i for i in fresh if i < len(row) and row[i] is None and i * self.B < end]
            if released:
                raise self._fail(WRONG, RULE["window"], f"{context}: the full group {g} of {name!r} released "
                                                        f"block index {released[0]}")
        self.check_counts(context)

    def table_op(self, step: Step) -> Step:
        """table(request) asked alone: a request not live is refused (PAGED-ARGS), changing nothing; a live
        one's tables are read back and what it must hold verified."""
        name = self.request(step["request"])
        args = {"request": name}
        self.result.steps.append({"op": "table", **args})
        verdict = pm.lookup(self.state, name)
        if self.not_sent(verdict):
            return NOT_SENT
        if isinstance(verdict, model.Rejected):
            outcome = self._call("table", args, verdict.rule)
            self.judged = ("table", args, outcome)
            if outcome.ok and outcome.value is not None:
                raise self._fail(LENIENT, verdict.rule, f"table({name!r}) of a request not live is a caller error "
                                                        f"({verdict.rule}) but the target answered "
                                                        f"{_brief(outcome.value)}", detail="request")
            self.unchanged(f"after the rejected table({name!r})", verdict.rule)
            return self.result.steps.pop()
        changed = self.hold(name, self.read_table(name, RULE["data"]))
        self.check_shared(name, changed)
        for g, group in enumerate(self.pc.groups):
            self.verify(name, g, pm.needed(group, self.computed(name)), f"at table({name!r})")
        return self.result.steps.pop()

    def free(self, step: Step) -> Step:
        name = self.request(step["request"])
        args = {"request": name}
        self.result.steps.append({"op": "free", **args})
        verdict = pm.free(self.state, name)
        if self.not_sent(verdict):
            return NOT_SENT
        outcome = self._call("free", args, verdict.rule if isinstance(verdict, model.Rejected) else RULE["free"])
        self.judged = ("free", args, outcome)
        if isinstance(verdict, model.Rejected):
            self.refusal("free", args, outcome, verdict)
            return self.result.steps.pop()
        if not outcome.ok:
            raise self._fail(OVER_STRICT, RULE["free"], f"free({name!r}) of a live request raised: {outcome.error}")
        self.state = verdict
        self.release(name)
        self.freed.append(name)
        self.check_counts(f"after free({name!r})")
        return self.result.steps.pop()


def _block_key(key: Any) -> Optional[int]:
    """A ref_counts key as a block id: an int, or its decimal string (a JSON object's key); None otherwise."""
    if type(key) is int:
        return key
    if isinstance(key, str) and key.lstrip("-").isdigit():
        return int(key)
    return None


def _per_pool(value: Any, pc: pm.PagedConfig, one: Callable[[Any], bool]) -> bool:
    """PAGED-CONFIG: an answer for one pool, or with per-group pools a list of one per group."""
    if not pc.per_group_pools:
        return one(value)
    return isinstance(value, list) and len(value) == len(pc.groups) and all(one(entry) for entry in value)


def _table_shape(value: Any, groups: int) -> bool:
    return isinstance(value, list) and len(value) == groups and all(
        isinstance(row, list) and all(b is None or type(b) is int for b in row) for row in value)


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
