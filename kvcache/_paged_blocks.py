"""Block arithmetic of the paged layout: which blocks hold which positions. Pure functions of ints, each
with the postcondition that defines it, so the CrossHair gate confirms them for every int (not a sample).

Position p lives in block index p // B at offset p % B (B = block_size).
"""

from __future__ import annotations

import icontract


@icontract.require(lambda positions, block_size: positions >= 0 and block_size >= 1)
@icontract.ensure(lambda positions, block_size, result: result * block_size >= positions
                  and (result - 1) * block_size < positions if positions > 0 else result == 0,
                  "PAGED-RESERVE: blocks_for(n) blocks are the fewest that hold positions 0 .. n-1")
def blocks_for(positions: int, block_size: int) -> int:
    return (positions + block_size - 1) // block_size


@icontract.require(lambda computed, window, block_size: computed >= 0 and window >= 1 and block_size >= 1)
@icontract.ensure(lambda computed, window, block_size, result:
                  result * block_size <= max(0, computed - window + 1) < (result + 1) * block_size,
                  "PAGED-WINDOW-RELEASE: the first needed block holds the oldest position the next query reads")
def first_needed_block(computed: int, window: int, block_size: int) -> int:
    """The index of the block holding position computed - W + 1 (0 at the start), the oldest one the query at
    `computed` reads: the blocks below it leave every window a live request still needs."""
    return max(0, computed - window + 1) // block_size


@icontract.require(lambda length, block_size: length >= 1 and block_size >= 1)
@icontract.ensure(lambda length, block_size, result: 0 <= result * block_size <= length - 1
                  < (result + 1) * block_size,
                  "PAGED-HIT: the most whole blocks a hit may take leave the last prompt token to compute")
def most_hit_blocks(length: int, block_size: int) -> int:
    """The most whole blocks of a prompt of `length` tokens a prefix hit may cover: the last token is always
    computed (its logits are needed), so the hit ends at or before position length - 1."""
    return (length - 1) // block_size
