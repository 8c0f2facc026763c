"""Features printed in the prompt, computed from the settled board (row bitmasks, row 0 at the top).

- heights: per column, rows from the floor up to and including its topmost settled cell (0 when empty);
- holes: empty cells below each column's topmost settled cell, summed over the columns;
- drop: rows the falling piece can still fall before it rests.
"""

from __future__ import annotations

from tilewise.game.pieces import BOARD_HEIGHT, BOARD_WIDTH

FULL_ROW = (1 << BOARD_WIDTH) - 1


def fits(board: list[int], cells: tuple[tuple[int, int], ...], x: int, y: int) -> bool:
    """True when the piece offsets `cells` with pivot at (x, y) lie on the board and on empty cells."""
    for dx, dy in cells:
        c = x + dx
        r = y + dy
        if c < 0 or c >= BOARD_WIDTH or r < 0 or r >= BOARD_HEIGHT or (board[r] >> c) & 1:
            return False
    return True


def drop_distance(board: list[int], cells: tuple[tuple[int, int], ...], x: int, y: int) -> int:
    """Rows the piece can still fall before it rests (0 when it rests already)."""
    d = 0
    while fits(board, cells, x, y + d + 1):
        d += 1
    return d


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
