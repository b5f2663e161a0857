"""Blind-style stand-ins of upstream shapes, written from their descriptions (issue 18), not from
upstream code: targets on which the conformance suite must report what the defect leads to, not only
the lenient call that lets it in.

`LaxCellCache` keeps the table the way the description of upstream's cell cache does (per cell a
position, -1 when free, and an owner bit set; a live-id set; a declared step; answers instead of typed
errors): it serves a verb between `declare_step` and `place_step`, and a removed id still gets its cell
when the forward is placed. Two factories spoil it one way each:

- `leaks_reused_id`: `seq_rm` of a declared id mid-forward, then `place_step` gives the removed id a
  cell; `seq_new()` hands the id out again, owning a cell it never wrote.
- `leaks_reused_id_private_live`: the same, served as upstream's C++ cache is through the driver - no
  `live()` (upstream's live set is private) and 64 fixed ids.
- `next_pos_overflows`: a position INT_MAX is accepted (the spec stops at INT_MAX - 1), and
  `next_pos`, a 32-bit int as upstream's, wraps to INT_MIN; verbs mid-forward are refused here.

`FloorFromLength` is a sequence cache with upstream's rewind floor - `new_len >= length - window` on
every ring layer - which is unsound for max_write < window (one rewind) and blind to chains of
rewinds (two causes of REWIND-SOUND).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import kvcache
from kvcache_spec.conformance.zoo import Faithful

INT_MAX = 2**31 - 1


def _int32(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31


def _is_int(value: Any) -> bool:
    return type(value) is int


class _Step:
    def __init__(self, length: int, read_len: int, cells: tuple[int, ...], mask_bits: bytes) -> None:
        self.length, self.read_len, self.cells, self.mask_bits = length, read_len, cells, mask_bits


class LaxCellCache:
    kvcache_layout = "cell"
    mid_forward_verbs = True          # seq_new / seq_clone / seq_rm served while a forward is open
    max_position = INT_MAX - 1

    def __init__(self, config: kvcache.CacheConfig, max_seqs: int = 64) -> None:
        self.cap = config.capacity
        self.max_seqs = max_seqs
        self.n_layers = config.n_layers
        entries = list(config.layers) if len(config.layers) == config.n_layers else list(config.layers) * config.n_layers
        self.windows = [entry.policy.window if entry.policy.kind == kvcache.Kind.RING else 0 for entry in entries]
        self.clear()

    # --- faces
    def as_batch_control(self) -> "LaxCellCache":
        return self

    def as_cell_stepper(self) -> "LaxCellCache":
        return self

    # --- queries
    def capacity(self) -> int:
        return self.cap

    def _valid_id(self, seq_id: Any) -> bool:
        return _is_int(seq_id) and 0 <= seq_id < self.max_seqs

    def _owned(self, seq_id: int) -> list[int]:
        return [j for j in range(self.cap) if self.pos[j] >= 0 and self.owners[j] >> seq_id & 1]

    def free_cells(self) -> int:
        return sum(1 for p in self.pos if p < 0)

    def used_end(self) -> int:
        return max((j + 1 for j in range(self.cap) if self.pos[j] >= 0), default=0)

    def can_extend(self, n: Any = 1) -> bool:
        return _is_int(n) and 0 <= n <= self.free_cells()

    def live(self) -> list[int]:
        return sorted(self.live_ids)

    def seq_len(self, seq_id: Any) -> int:
        return len(self._owned(seq_id)) if self._valid_id(seq_id) else 0

    def next_pos(self, seq_id: Any) -> int:
        if not self._valid_id(seq_id):
            return 0
        owned = self._owned(seq_id)
        return _int32(max(self.pos[j] for j in owned) + 1) if owned else 0

    # --- verbs
    def _open(self) -> bool:
        return self.declared is not None

    def clear(self) -> None:
        self.pos = [-1] * self.cap
        self.owners = [0] * self.cap
        self.live_ids: set[int] = set()
        self.declared: Optional[list[int]] = None
        self.placed: Optional[list[int]] = None
        self.placed_positions: Optional[list[int]] = None
        self.served: set[int] = set()

    def _lowest_free_id(self) -> Optional[int]:
        return next((i for i in range(self.max_seqs) if i not in self.live_ids), None)

    def seq_new(self) -> Optional[int]:
        if self._open() and not self.mid_forward_verbs:
            return None
        seq_id = self._lowest_free_id()
        if seq_id is not None:
            self.live_ids.add(seq_id)
        return seq_id

    def seq_clone(self, src: Any, upto: Any = None) -> Optional[int]:
        if (self._open() and not self.mid_forward_verbs) or not self._valid_id(src) or not self._owned(src):
            return None
        seq_id = self._lowest_free_id()
        if seq_id is None:
            return None
        for j in self._owned(src):
            if upto is None or (_is_int(upto) and self.pos[j] < upto):
                self.owners[j] |= 1 << seq_id
        self.live_ids.add(seq_id)
        return seq_id

    def seq_rm(self, seq_id: Any, p0: Any, p1: Any = None) -> bool:
        if (self._open() and not self.mid_forward_verbs) or not self._valid_id(seq_id) or not _is_int(p0):
            return False
        end = INT_MAX + 1 if p1 is None else p1
        for j in self._owned(seq_id):
            if p0 <= self.pos[j] < end:
                self.owners[j] &= ~(1 << seq_id)
                if not self.owners[j]:
                    self.pos[j] = -1
        if not self._owned(seq_id):
            self.live_ids.discard(seq_id)   # the declared step still names it: its token gets a cell anyway
        return True

    def declare_step(self, seq_ids: Any) -> bool:
        if self._open() and not self.mid_forward_verbs:
            return False
        if (not isinstance(seq_ids, (list, tuple)) or not seq_ids or len(seq_ids) > self.free_cells()
                or any(s not in self.live_ids for s in seq_ids)):
            return False
        self.declared, self.placed, self.placed_positions, self.served = list(seq_ids), None, None, set()
        return True

    def place_step(self, layer: Any, positions: Sequence[Any]) -> Optional[_Step]:
        declared = self.declared
        if (declared is None or not _is_int(layer) or not 0 <= layer < self.n_layers or layer in self.served
                or not isinstance(positions, (list, tuple)) or len(positions) != len(declared)
                or any(not _is_int(q) or not 0 <= q <= self.max_position for q in positions)):
            return None
        if self.placed is None:
            newest = {s: max((self.pos[j] for j in self._owned(s)), default=-1) for s in declared}
            for s, q in zip(declared, positions):
                if q <= newest[s]:
                    return None
                newest[s] = q
            free = [j for j in range(self.cap) if self.pos[j] < 0]
            self.placed, self.placed_positions = free[:len(declared)], list(positions)
            for s, q, j in zip(declared, positions, self.placed):
                self.pos[j], self.owners[j] = q, 1 << s
        elif list(positions) != self.placed_positions:
            return None
        read_len = self.used_end()
        window = self.windows[layer]
        bits = bytearray()
        for s, q in zip(declared, positions):
            for j in range(read_len):
                p = self.pos[j]
                bits.append(int(p >= 0 and self.owners[j] >> s & 1 == 1 and p <= q
                                and (window == 0 or p >= q - window + 1)))
        step = _Step(len(declared), read_len, tuple(self.placed), bytes(bits))
        self.served.add(layer)
        if len(self.served) == self.n_layers:
            self.declared = None
        return step


class _LeaksReusedId(LaxCellCache):
    mid_forward_verbs = True


class _NextPosOverflows(LaxCellCache):
    mid_forward_verbs = False
    max_position = INT_MAX


leaks_reused_id = _LeaksReusedId
next_pos_overflows = _NextPosOverflows


class _LeaksReusedIdPrivateLive(_LeaksReusedId):
    live = None   # upstream's live set is private: no live() (the C++ driver announces none)


def leaks_reused_id_private_live(config: kvcache.CacheConfig, max_seqs: int = 64) -> _LeaksReusedIdPrivateLive:
    """`leaks_reused_id` as the C++ driver serves upstream's cell cache in its fixed-max_seqs form: no
    live(), 64 ids and no other (issue 26: only its lenient CELL-FORWARD was reported)."""
    if type(max_seqs) is not int or max_seqs != 64:
        raise ValueError(f"SCOPE-BORDER: this cache has 64 ids, not {max_seqs!r}")
    return _LeaksReusedIdPrivateLive(config, 64)


setattr(leaks_reused_id_private_live, "kvcache_layout", "cell")
setattr(leaks_reused_id_private_live, "kvcache_scope", ("all", "max_seqs=64"))


class FloorFromLength(Faithful):
    """Rewind allowed iff new_len >= length - window on every ring layer (upstream's floor)."""

    def rewind_safe(self, new_len: int) -> bool:
        return all(new_len >= self.len_ - window for window, _ in self.policies if window)
