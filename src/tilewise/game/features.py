"""Features printed in the prompt, computed from the settled board (row bitmasks, row 0 at the top).

- heights: per column, rows from the floor up to and including its topmost settled cell (0 when empty);
- holes: empty cells below each column's topmost settled cell, summed over the columns;
- drop: rows the falling piece can still fall before it rests.
"""

from __future__ import annotations

import functools

from tilewise.game.pieces import BOARD_HEIGHT, BOARD_WIDTH

FULL_ROW = (1 << BOARD_WIDTH) - 1


@functools.lru_cache(maxsize=1024)
def _row_masks(cells: tuple[tuple[int, int], ...]) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """A piece state as (lowest dx, highest dx, ((dy, bitmask of its cells in that row, bit 0 at the lowest dx),
    ...)): one AND per row instead of one test per cell (the expert's search calls `fits` tens of thousands of times
    a game, and every prompt computes a drop)."""
    lo, hi = min(dx for dx, _ in cells), max(dx for dx, _ in cells)
    rows: dict[int, int] = {}
    for dx, dy in cells:
        rows[dy] = rows.get(dy, 0) | 1 << (dx - lo)
    return lo, hi, tuple(sorted(rows.items()))


def fits(board: list[int], cells: tuple[tuple[int, int], ...], x: int, y: int) -> bool:
    """True when the piece offsets `cells` with pivot at (x, y) lie on the board and on empty cells."""
    lo, hi, rows = _row_masks(cells)
    if x + lo < 0 or x + hi >= BOARD_WIDTH:
        return False
    for dy, mask in rows:
        r = y + dy
        if r < 0 or r >= BOARD_HEIGHT or board[r] & (mask << (x + lo)):
            return False
    return True


def drop_distance(board: list[int], cells: tuple[tuple[int, int], ...], x: int, y: int) -> int:
    """Rows the piece can still fall before it rests (0 when it rests already)."""
    lo, hi, rows = _row_masks(cells)
    if x + lo < 0 or x + hi >= BOARD_WIDTH:
        return 0
    shifted = [(y + dy + 1, mask << (x + lo)) for dy, mask in rows]  # each row one step down
    d = 0
    while True:
        for r0, mask in shifted:
            r = r0 + d
            if r < 0 or r >= BOARD_HEIGHT or board[r] & mask:
                return d
        d += 1


def column_heights(board: list[int]) -> list[int]:
    """Height of each column: rows from the floor up to and including its topmost settled cell (0 if empty)."""
    heights = [0] * BOARD_WIDTH
    seen = 0
    for r, row in enumerate(board):
        new = row & ~seen
        while new:
            low = new & -new
            heights[low.bit_length() - 1] = BOARD_HEIGHT - r
            new ^= low
        seen |= row
        if seen == FULL_ROW:
            break
    return heights


def count_holes(board: list[int]) -> int:
    """Empty cells below each column's topmost settled cell, summed over the columns."""
    cover = 0
    holes = 0
    for row in board:
        holes += (cover & ~row).bit_count()
        cover |= row
    return holes
