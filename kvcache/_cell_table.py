"""The cell table as values, and the pure formulas CellCache's contracts restate the cell rules with.

`CellCache` (_cells.py) keeps per cell a position (FREE = -1) and an owner bitset; its contracts read
its table through these helpers, each a rule restated from the table alone - never through the code
that computes the answers.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ._ints import INT_MAX
from ._types import CellStep

#: Upstream's kMaxSeqs: one bit of a 64-bit owner set per sequence id.
MAX_SEQS = 64

#: The position of a free cell (upstream's -1); also the newest position of a sequence owning nothing.
FREE = -1

#: CELL-POS: the largest position a token may take, so next_pos (one past the newest) fits an int.
MAX_POSITION = INT_MAX - 1

# The state as values, for snapshots. The table: (cell positions, cell owner bitsets, per-id cell
# count, per-id newest position, live bitset, occupied cells). The forward: (declared ids, placed
# positions, placed cells, served layers, memoized steps by window).
_Table = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], int, int]
_Forward = tuple[Optional[tuple[int, ...]], Optional[tuple[int, ...]], Optional[tuple[int, ...]], frozenset[int],
                 tuple[tuple[Optional[int], CellStep], ...]]
_State = tuple[_Table, _Forward]


# --- small pure helpers for the contracts (each restates a rule from the table alone) -----------------

def mask_by_formula(cell_pos: Sequence[int], cell_owners: Sequence[int], token_seqs: Sequence[int],
                    token_positions: Sequence[int], window: Optional[int], read_len: int) -> bytes:
    """CELL-MASK written out cell by cell (the cache builds its masks another way, per sequence).

    Bit (i, j) is 1 iff cell j is occupied, owned by token i's sequence s, and its position p satisfies
    p <= q_i and, on a windowed layer, p >= q_i - window + 1. Cells past the table are free.
    """
    bits = bytearray()
    for s, q in zip(token_seqs, token_positions):
        for j in range(read_len):
            p = cell_pos[j] if j < len(cell_pos) else FREE
            attends = (p != FREE and cell_owners[j] >> s & 1 == 1 and p <= q
                       and (window is None or p >= q - window + 1))
            bits.append(1 if attends else 0)
    return bytes(bits)


def lowest_free_by_formula(cell_pos: Sequence[int], k: int) -> tuple[int, ...]:
    """CELL-LAYOUT-CANON: the k lowest free cells of a table (the cells past its end are free)."""
    free = [j for j, p in enumerate(cell_pos) if p == FREE]
    return tuple((free + list(range(len(cell_pos), len(cell_pos) + k)))[:k])


def owned_cells(table: _Table, s: int) -> dict[int, int]:
    """cell -> position, for every cell sequence s owns in a table."""
    return {j: p for j, (p, o) in enumerate(zip(table[0], table[1])) if p != FREE and o >> s & 1}


def others_view(table: _Table, s: int) -> dict[int, tuple[int, int]]:
    """cell -> (position, owners without s), for every cell some sequence other than s owns."""
    keep = ~(1 << s)
    return {j: (p, o & keep) for j, (p, o) in enumerate(zip(table[0], table[1])) if o & keep}


def placed_only_free_cells(old: _Table, new: _Table, seq_ids: Sequence[int], positions: Sequence[int],
                           cells: Sequence[int]) -> bool:
    """CELL-PLACE: token i's cell was free in `old` and holds (positions[i], {seq_ids[i]}) in `new`; every
    other cell is as it was."""
    def entry(table: _Table, j: int) -> tuple[int, int]:
        return (table[0][j], table[1][j]) if j < len(table[0]) else (FREE, 0)

    placed = {c: (q, 1 << s) for s, q, c in zip(seq_ids, positions, cells)}
    return (len(placed) == len(cells) and all(entry(old, c) == (FREE, 0) for c in placed)
            and all(entry(new, j) == placed.get(j, entry(old, j)) for j in range(max(len(old[0]), len(new[0])))))


def declared_in(state: _State) -> tuple[int, ...]:
    """The seq ids the forward of a state declared (none when no forward is open)."""
    declared = state[1][0]
    return () if declared is None else declared


def _positions_unique_per_seq(cell_pos: Sequence[int], cell_owners: Sequence[int]) -> bool:
    """CELL-OWNERS: no sequence owns two cells of one position.

    By sorting each sequence's positions rather than hashing them: hashing would realise the symbolic
    positions of the CrossHair gate's cell state (one path per value), a comparison does not.
    """
    by_seq: dict[int, list[int]] = {}
    for p, owners in zip(cell_pos, cell_owners):
        for s in range(owners.bit_length()):
            if owners >> s & 1:
                by_seq.setdefault(s, []).append(p)
    ordered = [sorted(positions) for positions in by_seq.values()]
    return all(a < b for positions in ordered for a, b in zip(positions, positions[1:]))
